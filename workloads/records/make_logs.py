"""Write the shipped series' logs in the Modded-NanoGPT record layout and formats.

    python workloads/records/make_logs.py [--steps 20]

For each program in programs/, a short CPU run of its TrainBridge port (scaled with the
same override `trainbridge records run` uses), and a log at
logs/<record folder>/tb-cpu.txt that embeds the program's own source exactly as the
records' logs do: records 4-13 between two lines of 100 `=`, record 14 on from line 1 to
the first such line. The timings in these logs are from this CPU, not from a GPU; the
README table's GPU times come from known_records.tsv. Nothing is downloaded: the shards
are nanogpt's byte-level ones.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from trainbridge.records.logs import SEPARATOR
from trainbridge.records.scale import CPU_DEFAULTS, scale_script
from trainbridge.targets.port_source import port_source

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# program -> the record folder it mirrors (its name in the Modded-NanoGPT repository)
SERIES = {
    "r02_adamw_rotary.py": "2024-06-06_AdamW",
    "r04_muon.py": "2024-10-10_Muon",
    "r05_modern_arch.py": "2024-10-14_ModernArch",
    "r08_untied_head.py": "2024-11-03_UntieEmbed",
    "r09_shortcuts.py": "2024-11-06_ShortcutsTweaks",
    "r10_bf16_acts.py": "2024-11-08_CastBf16",
    "r11_unet.py": "2024-11-10_UNetDoubleLr",
    "r12_sliding_window.py": "2024-11-19_FlexAttention",
    "r14_value_embeds.py": "2024-12-04_ValueEmbed",
    "r20_merged_qkv.py": "2025-01-16_Sub3Min",
}


def record_number(folder: str) -> int:
    from trainbridge.records.extract import match_known

    known = match_known(folder)
    assert known is not None, folder
    return known.num


def compose_log(code: str, output: str, num: int) -> str:
    """The records' layout: where the code sits depends on the record number."""
    code = code.rstrip("\n") + "\n"
    if num <= 13:
        return f"{SEPARATOR}\n{code}{SEPARATOR}\n{output}"
    return f"{code}{SEPARATOR}\n{output}"


def run_program(program: Path, shards: Path, steps: int, work: Path) -> str:
    knobs = {**CPU_DEFAULTS, "steps": steps, "val_every": steps // 2, "timing_skip_steps": 3,
             "train_files": str(shards / "train_*.bin"), "val_files": str(shards / "val_*.bin")}
    scaled = scale_script(program.read_text(), knobs).source
    ported, _ = port_source(scaled, program.name, "cpu")
    script = work / program.name
    script.write_text(ported)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{program.name} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=HERE / "logs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shards = work / "data"
        subprocess.run([sys.executable, str(ROOT / "workloads" / "nanogpt" / "data" / "make_shards.py"),
                        "--out-dir", str(shards), "--train-tokens", "600000", "--val-tokens", "40000"],
                       check=True, stdout=subprocess.DEVNULL)
        for name, folder in SERIES.items():
            program = HERE / "programs" / name
            output = run_program(program, shards, args.steps, work)
            dest = args.out / folder / "tb-cpu.txt"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(compose_log(program.read_text(), output, record_number(folder)))
            print(f"{name} -> {dest.relative_to(HERE)}", flush=True)


if __name__ == "__main__":
    main()
