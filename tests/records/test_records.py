"""`trainbridge records`: log formats, checkout layouts, the scale override, the shipped
series, and `records run` end to end on one record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainbridge.records.extract import extract, match_known, parse_record_folder
from trainbridge.records.logs import FILE_RULE, SEPARATOR, parse_log
from trainbridge.records.scale import scale_script

from tests.kits.paths import ROOT

SERIES_LOGS = ROOT / "workloads" / "records" / "logs"
PROGRAMS = ROOT / "workloads" / "records" / "programs"

CODE = "import torch\n\n\ndef main():\n    print('hi')\n"
OUT_4_13 = ("Running PyTorch 2.5.0 compiled for CUDA 12.4\n"
            "step:0/3000 val_loss:10.8258 train_time:0ms step_avg:nanms\n"
            "step:1/3000 train_loss:10.8258 train_time:1234ms step_avg:nanms\n"
            "step:3000/3000 val_loss:3.2785 train_time:1339067ms step_avg:446.80ms\n"
            "peak memory allocated: 22518 MiB reserved: 25020 MiB\n")
OUT_15 = ("step:0/1770 val_loss:10.8258 train_time:0ms step_avg:0.04ms\n"
          "step:1/1770 train_time:52ms step_avg:52.40ms\n"
          "step:1770/1770 val_loss:3.2770 train_time:188512ms step_avg:106.51ms\n")


def test_records_4_to_13_code_between_separators():
    log = parse_log(f"{SEPARATOR}\n{CODE}{SEPARATOR}\n{OUT_4_13}")
    assert log.format == "code_between_separators" and log.script == CODE and log.script_parses
    assert (log.final_val_loss, log.final_train_time_ms, log.final_step_avg_ms) == (3.2785, 1339067, 446.80)
    assert log.torch_version == "2.5.0" and log.peak_memory_mib == 22518
    assert [s.step for s in log.steps] == [0, 1, 3000] and log.steps[1].train_loss == 10.8258
    assert log.steps[0].step_avg_ms is None  # "nan" in the log


def test_record_14_on_code_first_and_time_only_lines():
    log = parse_log(f"{CODE}{SEPARATOR}\n{OUT_15}")
    assert log.format == "code_first" and log.script == CODE
    assert log.final_val_loss == 3.2770 and log.final_train_time_ms == 188512
    assert log.steps[1].train_loss is None and log.steps[1].train_time_ms == 52


def test_record_61_on_extra_files_are_split_off():
    extra = f"{FILE_RULE}\n# triton_kernels.py\n{FILE_RULE}\ndef kernel():\n    pass\n"
    extra += f"{FILE_RULE}\n# other.py\n{FILE_RULE}\nX = 1\n"
    log = parse_log(f"{CODE}{extra}{SEPARATOR}\n{OUT_15}")
    assert log.script == CODE
    assert log.extra_files == {"triton_kernels.py": "def kernel():\n    pass\n", "other.py": "X = 1\n"}


def test_llmc_log_has_no_script_but_a_loss():
    log = parse_log("s:0 trl:10.9871\ns:250 tel:4.5012\ns:500 trl:3.9\ns:9536 tel:3.2722\n")
    assert log.format == "no_code" and log.script is None and log.final_val_loss == 3.2722


def test_broken_script_is_flagged_not_fatal():
    log = parse_log(f"{SEPARATOR}\ndef broken(:\n{SEPARATOR}\n{OUT_4_13}")
    assert log.script is not None and log.script_parses is False


def test_record_folder_names_and_table_match():
    assert parse_record_folder("2024-10-14_ModernArch") == ("2024-10-14", "ModernArch")
    assert parse_record_folder("101424_ModernArch") == ("2024-10-14", "ModernArch")
    assert parse_record_folder("logs") is None
    assert match_known("2024-10-14_ModernArch").num == 5
    assert match_known("101424_ModernArch").num == 5  # the pre-Oct-2025 layout
    assert match_known("2030-01-01_Unknown") is None


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_extract_a_checkout_layout(tmp_path):
    rec = tmp_path / "records"
    _write(rec / "track_1_short" / "2024-10-14_ModernArch" / "a.txt", f"{SEPARATOR}\n{CODE}{SEPARATOR}\n{OUT_4_13}")
    _write(rec / "track_1_short" / "2024-10-14_ModernArch" / "b.txt",
           f"{SEPARATOR}\n{CODE}{SEPARATOR}\n" + OUT_4_13.replace("1339067ms", "1339000ms"))
    _write(rec / "track_1_short" / "2024-10-14_ModernArch" / "baseline" / "c.txt", f"{CODE}{SEPARATOR}\n{OUT_15}")
    _write(rec / "101024_Muon" / "x.txt", f"{SEPARATOR}\n{CODE}{SEPARATOR}\n{OUT_4_13}")
    _write(rec / "track_1_short" / "2024-10-13_llmc" / "main.log", "s:0 trl:10.9\ns:9536 tel:3.2722\n")
    _write(rec / "track_1_short" / "2025-01-13_Fp8LmHead" / "r.txt", f"{CODE}{SEPARATOR}\n{OUT_15}")
    _write(rec / "track_1_short" / "2024-10-14_ModernArch" / "README.md", "notes")
    index = extract(tmp_path)
    by = {r.num: r for r in index.records}
    assert [r.num for r in index.records] == sorted(by)  # record order
    assert len(by[5].logs) == 2, "two seeds; the baseline/ run is not the record"
    assert by[5].reference_train_time_ms == pytest.approx((1339067 + 1339000) / 2)
    assert by[5].script == CODE and by[5].readme_time == "15.2 minutes"
    assert by[4].script == CODE  # old MMDDYY_Name layout
    assert by[1].script is None and "llm.c" in by[1].no_script_reason and by[1].reference_val_loss == 3.2722
    assert by[19].reference_step_avg_ms == 106.51
    for missing in (3, 66, 86):  # no log in the repository at all
        assert by[missing].script is None and "no log" in by[missing].no_script_reason


def test_extract_rejects_a_folder_without_logs(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    with pytest.raises(ValueError, match="no record logs"):
        extract(tmp_path)


REAL_STYLE = '''
from dataclasses import dataclass

@dataclass
class Hyperparameters:
    input_bin : str = 'data/fineweb10B/fineweb_train_*.bin'
    batch_size : int = 8*64
    device_batch_size : int = 64
    sequence_length : int = 1024
    num_iterations : int = 3200

args = Hyperparameters()
num_vocab = 50304
model = GPT(GPTConfig(vocab_size=num_vocab, n_layer=12, n_head=6, n_embd=768))
other = GPT(vocab_size=50304, num_layers=12, model_dim=768, seq_len=args.sequence_length)
def f(batch_size: int = 3):
    return batch_size
'''


def test_scale_overrides_hyperparameters_and_constructor_literals():
    r = scale_script(REAL_STYLE, {"layers": 2, "width": 64, "batch": 4, "seq": 128, "steps": 10,
                                  "train_files": "/d/train_*.bin", "heads": 2, "lr_never_there": 1.0})
    src = r.source
    assert "input_bin : str = '/d/train_*.bin'" in src and "batch_size : int = 4" in src
    assert "device_batch_size : int = 4" in src and "sequence_length : int = 128" in src
    assert "n_layer=2, n_head=2, n_embd=64" in src and "num_layers=2, model_dim=64" in src
    assert "vocab_size=num_vocab" in src, "a keyword passing a variable is left alone"
    assert "seq_len=args.sequence_length" in src
    assert "def f(batch_size: int = 3)" in src, "function defaults are not hyperparameters"
    assert r.unmatched == ["lr_never_there"]
    compile(src, "scaled", "exec")


def test_shipped_series_extracts_in_record_order_with_current_sources():
    index = extract(SERIES_LOGS)
    recs = [r for r in index.records if r.script]
    assert len(recs) >= 8
    nums = [r.num for r in recs]
    assert nums == sorted(nums) and len(set(nums)) == len(nums) and nums[0] == 2
    programs = {p.read_text() for p in PROGRAMS.glob("r*.py")}
    for r in recs:
        assert r.script in programs, f"{r.key}: log is stale, run workloads/records/make_logs.py"
        assert r.reference_step_avg_ms and r.reference_val_loss, r.key
        fmt = r.logs[0].format
        assert fmt == ("code_between_separators" if r.num <= 13 else "code_first"), (r.num, fmt)


def test_records_run_end_to_end_on_one_record(tmp_path):
    out = tmp_path / "out"  # given relative, as a user types it: the shards' path must still resolve
    proc = subprocess.run(
        [sys.executable, "-m", "trainbridge.cli", "records", "run", str(SERIES_LOGS), "--only", "5",
         "--set", "layers=2", "--set", "width=64", "--set", "heads=2", "--set", "seq=64", "--set", "batch=4",
         "--budget", "1", "--minutes", "1", "--pairs", "2", "--looks", "1", "--baseline-runs", "4",
         "--min-run-s", "0.5",
         "--out", "out"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((out / "records_results.json").read_text())
    assert [r["num"] for r in rows] == [5]
    row = rows[0]
    assert row["status"] == "measured", row
    assert row["scaled"]["n_layer"] == ["Hyperparameters.n_layer"]
    assert row["port_step_ms"] > 0 and row["ci_low"] <= row["speedup"] <= row["ci_high"]
    assert row["reference_step_avg_ms"] is not None and row["readme_time"] == "15.2 minutes"
    table = (out / "records_table.md").read_text()
    assert "| 5 | ModernArch | 15.2 minutes | 42.18 -> 22.61 min (1.87x) |" in table  # the authors' NPU pair
    assert row["port_check"]["loss_falling"] and row["port_check"]["run_status"] == "ok"
    assert (out / "records_speedup.png").stat().st_size > 1000
    workload = out / "workloads" / "2024-10-14_ModernArch"
    assert "n_layer: int = 2" in (workload / "train_gpt.py").read_text()
    # the port check's steps sized the timing runs: >= 8 steps, as many as half a second needs
    manifest = (workload / "trainbridge.toml").read_text()
    assert row["measured_steps"] >= 8 and f"measured = {row['measured_steps']}  # sized by the port check" in manifest
