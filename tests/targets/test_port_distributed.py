"""torchrun / DDP programs run as one rank: the port's distributed rewrites and the harness as torchrun.

The program is ours, written the way the Modded-NanoGPT record scripts are: it cannot start
without torchrun (`os.environ["RANK"]`), asserts a GPU, opens an NCCL group with a device_id,
shards its optimizer with reduce_scatter / all_gather futures (into a `(world_size, n)` buffer,
as records 19 on do) and wraps the model in DDP.
"""

import math
import re
import shutil
from pathlib import Path

from trainbridge.harness.crash import crash_site
from trainbridge.harness.runner import run_workload
from trainbridge.harness.torchrun_env import requires_torchrun, torchrun_env
from trainbridge.targets.port_source import port_program
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES, WORKLOADS

FORMS = FIXTURES / "records_forms"
NANOGPT = WORKLOADS / "nanogpt" / "train_gpt.py"

MANIFEST = """name = "torchrun-gpt"
entry = "train_gpt.py"
editable = ["train_gpt.py"]
native_device = "cuda"
[steps]
warmup = 1
measured = 3
[work]
unit = "tokens"
per_step = 512
[limits]
timeout_s = 300
memory_limit_mb = 4000
"""


def _workload(tmp_path: Path) -> Path:
    tmp_path.mkdir(parents=True)
    shutil.copy(FORMS / "torchrun_gpt.py", tmp_path / "train_gpt.py")
    (tmp_path / "trainbridge.toml").write_text(MANIFEST)
    return tmp_path


def test_the_port_rewrites_what_one_cpu_rank_cannot_do():
    src = (FORMS / "torchrun_gpt.py").read_text()
    r = port_program({"train_gpt.py": src}, "cpu")
    out = "\n".join(line for line in r.files["train_gpt.py"].splitlines() if not line.startswith("#"))
    assert not r.blockers
    assert "assert torch.cuda.is_available()" not in out            # needs-a-GPU assert dropped
    assert 'assert 8 % world_size == 0' in out                      # holds for one rank: kept
    assert 'backend="gloo"' in out and "device_id" not in out       # composite backend, no device_id
    assert "DDP(model)" in out and "device_ids" not in out
    assert "_tb_collectives.reduce_scatter_tensor(" in out and "import _tb_collectives" in out
    # gloo wants the gather's rank dimension flat; NCCL takes the (world_size, n) buffer
    assert "_tb_collectives.all_gather_into_tensor(" in out
    assert "_tb_collectives.py" in r.files
    assert "enable_math_sdp(False)" not in out and "enable_cudnn_sdp" not in out.split("import")[-1]
    assert "coordinate_descent_tuning" not in out and "cache_size_limit" not in out
    assert "subprocess.CompletedProcess(" in out and '["nvidia-smi"], stdout' not in out
    assert "torch.get_num_threads()" in out
    kinds = {c.kind for c in r.changes}
    assert {"assert_dropped", "distributed", "backend", "compiler_config", "world_size", "shim_added"} <= kinds
    per_rank = {c.before.split("=")[0].strip() for c in r.changes if c.kind == "world_size"}
    assert {"local_batch", "grad_accum_steps"} <= per_rank and "world_size" not in per_rank


def test_an_assert_on_eight_ranks_goes_and_says_so():
    src = "import torch.distributed as dist\nworld_size = dist.get_world_size()\nassert world_size == 8 # 8xH100\n"
    r = port_program({"a.py": src}, "cpu")
    assert "assert world_size == 8" not in r.files["a.py"]
    (c,) = [c for c in r.changes if c.kind == "assert_dropped"]
    assert c.semantic_change and "one rank" in c.note


def test_the_harness_plays_torchrun_only_for_programs_that_need_it():
    assert requires_torchrun({"t.py": (FORMS / "torchrun_gpt.py").read_text()})
    assert not requires_torchrun({"t.py": NANOGPT.read_text()})  # `"RANK" in os.environ`: runs single-process
    env = torchrun_env({"WORLD_SIZE": "2"})
    assert env["RANK"] == "0" and "WORLD_SIZE" not in env and 1024 <= int(env["MASTER_PORT"]) < 65536


def test_the_ported_program_trains_on_a_real_one_rank_gloo_group(tmp_path):
    wl = load_workload(_workload(tmp_path / "w"))
    r = run_workload(wl, "cpu", out_dir=tmp_path / "out", label="t")
    assert r.status == "ok", r.error
    losses = [s.loss for s in r.steps]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    assert all(s.work_items == 512 for s in r.steps)
    assert "nvidia-smi: no NVIDIA GPU on the cpu target" in (r.stdout_tail or "")


def test_a_crash_names_the_programs_line(tmp_path):
    w = _workload(tmp_path / "w")
    text = (w / "train_gpt.py").read_text().replace("opt.step()\n", "opt.step()\n    raise_here = {}['x']\n", 1)
    (w / "train_gpt.py").write_text(text)
    r = run_workload(load_workload(w), "cpu", out_dir=tmp_path / "out", label="t")
    assert r.status == "crashed"
    ported = port_program({"train_gpt.py": text}, "cpu").files
    site = crash_site(r.error, ported)  # lines of the program as it ran: the port's
    line = next(i for i, s in enumerate(ported["train_gpt.py"].splitlines(), 1) if "raise_here" in s)
    assert (site.file, site.line) == ("train_gpt.py", line)
    assert "raise_here = {}['x']" in site.code and site.exception == "KeyError: 'x'"
    assert re.match(r"train_gpt.py:\d+ `raise_here", str(site))


def test_a_run_whose_port_adds_replacement_files_reaches_its_report(tmp_path):
    """The port adds `_tb_collectives.py`, which the original program does not have: the final
    report diffs the final program against the original and must take the file as new."""
    import json
    import subprocess
    import sys

    wl = _workload(tmp_path / "w")
    proc = subprocess.run([sys.executable, "-m", "trainbridge.cli", "run", str(wl), "--budget", "0", "--pairs", "1",
                           "--baseline-runs", "4", "--skip-collect", "--allow-no-evidence", "--no-compile-compare",
                           "--runs-root", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = next((tmp_path / "runs").iterdir())
    assert (run / "port" / "_tb_collectives.py").is_file()
    diff = (run / "final" / "vs_original.diff").read_text()
    assert "+++ final/_tb_collectives.py" in diff and "--- original/_tb_collectives.py" in diff
    done = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert any(e["event"] == "run_finished" for e in done), [e["event"] for e in done]
