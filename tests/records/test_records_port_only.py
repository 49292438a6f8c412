"""`records run --port-only` and `--resume`: every record ported and trained a few real steps,
and a Ctrl-C in the middle loses nothing.

Runs on the shipped record-style series (our own programs in the records' forms).
"""

import json

import pytest

from trainbridge.records.compare import RecordsRunOptions, run_records
from trainbridge.records.extract import extract
from trainbridge.records.port_check import CHECK_STEPS, loss_falls
from trainbridge.records.report import table_md
from trainbridge.records.results import RecordResult

from tests.kits.paths import WORKLOADS

SERIES_LOGS = WORKLOADS / "records" / "logs"
SMALL = {"layers": 2, "width": 64, "heads": 2, "seq": 64, "batch": 4}


def test_loss_falls_needs_finite_falling_losses():
    assert loss_falls([5.0, 4.8, 4.5])[0]
    assert not loss_falls([5.0, 5.1, 5.2])[0]
    assert not loss_falls([5.0, float("nan"), 4.0])[0]
    assert not loss_falls([5.0, None, 4.0])[0] and not loss_falls([])[0]


@pytest.mark.slow
def test_port_only_then_resume_after_an_interrupt(tmp_path):
    index = extract(SERIES_LOGS)
    opts = RecordsRunOptions(target="cpu", source=str(SERIES_LOGS), overrides=SMALL, only=[2, 5], port_only=True)
    seen = []

    def interrupt_on_second(entry):
        seen.append(entry.num)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_records(index, tmp_path, opts, on_record=interrupt_on_second)
    rows = json.loads((tmp_path / "records_results.json").read_text())
    assert [r["num"] for r in rows] == [2, 5]
    first = RecordResult.model_validate(rows[0])
    assert first.status == "port_ok", first.reason
    check = first.port_check
    assert check.ported and check.run_status == "ok" and check.loss_falling and len(check.losses) == CHECK_STEPS == 10
    assert check.changes_by_kind.get("device") and check.median_step_ms > 0
    assert json.loads((tmp_path / "records_run.json").read_text())["port_only"] is True

    again = []
    results = run_records(index, tmp_path, opts, on_record=lambda e: again.append(e.num), resume=True)
    assert again == [5], "the finished record was run again"
    assert [r.status for r in results] == ["port_ok", "port_ok"]
    table = table_md(results)
    assert "runs (port only)" in table and "Records that run on this target: 2 of 2" in table

    # an answer that was a failure (say, before an update of TrainBridge): --retry-failed redoes it
    rows = json.loads((tmp_path / "records_results.json").read_text())
    rows[0]["status"], rows[0]["reason"] = "port_failed", "crashed before the update"
    (tmp_path / "records_results.json").write_text(json.dumps(rows))
    kept = []
    run_records(index, tmp_path, opts, on_record=lambda e: kept.append(e.num), resume=True)
    assert kept == [], "a failure is an answer: --resume alone keeps it"
    retried = []
    results = run_records(index, tmp_path, opts, on_record=lambda e: retried.append(e.num), resume=True,
                          retry_failed=True)
    assert retried == [2] and [r.status for r in results] == ["port_ok", "port_ok"]


def test_a_record_the_port_cannot_run_says_which_construct(tmp_path):
    """A program with a Triton kernel nobody can replace: not ported, with the kernel named."""
    from trainbridge.records.port_check import check_port

    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "train_gpt.py").write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def my_strange_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    i = tl.arange(0, BLOCK)\n    tl.store(x_ptr + i, tl.load(x_ptr + i) * 3 + 1)\n\n\n"
        "def strange(x):\n    my_strange_kernel[(1,)](x, x.numel(), BLOCK=16)\n    return x\n\n\n"
        "print(strange(torch.zeros(16, device='cuda')))\n")
    (tmp_path / "w" / "trainbridge.toml").write_text(
        'name = "x"\nentry = "train_gpt.py"\neditable = ["train_gpt.py"]\nnative_device = "cuda"\n[work]\nunit = "tokens"\nper_step = 1\n')
    check = check_port(tmp_path / "w", "cpu", tmp_path / "out")
    assert not check.ported and check.run_status is None
    assert "my_strange_kernel" in check.reason or "triton" in check.reason.lower(), check.reason


# records 15-22 in miniature: the loader globs its pattern from the working folder
# (`Path.cwd().glob` refuses an absolute pattern) and the log goes to a `logs/` it never makes
RELATIVE_IO = '''
import uuid
from dataclasses import dataclass
from pathlib import Path
import numpy as np
import torch
import torch.nn as nn

@dataclass
class Hyperparameters:
    train_files : str = "data/fineweb10B/fineweb_train_*.bin"
    val_files : str = "data/fineweb10B/fineweb_val_*.bin"
    sequence_length : int = 64
    num_iterations : int = 50
    run_id: str = f"final/{uuid.uuid4()}"

args = Hyperparameters()
files = sorted(Path.cwd().glob(args.train_files))
file_iter = iter(files)
first, preloaded = next(file_iter), next(file_iter)  # the 2026 records preload the next shard
tokens = torch.from_numpy(np.fromfile(first, dtype=np.uint16, offset=256 * 4).astype(np.int64)) % 256
logfile = f"logs/{args.run_id}.txt"  # logs/final/ exists on the authors' machines, not in the repository
with open(logfile, "w") as f:
    print("start", file=f)
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(256, 32), nn.Linear(32, 256)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
T = args.sequence_length
for step in range(args.num_iterations):
    x = tokens[step * T:(step + 1) * T].cuda()
    y = tokens[step * T + 1:(step + 1) * T + 1].cuda()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    with open(logfile, "a") as f:
        print(step, loss.item(), file=f)
'''


def test_a_record_reads_shards_and_writes_logs_relative_to_its_folder(tmp_path):
    from trainbridge.records.compare import write_workload
    from trainbridge.records.models import RecordEntry
    from trainbridge.records.port_check import check_port
    from trainbridge.records.shards import make_record_shards

    shards = make_record_shards(tmp_path / "shards", train_tokens=20_000, val_tokens=4096)
    entry = RecordEntry(key="relative-io", num=99, name="RelativeIO", script=RELATIVE_IO)
    dest = tmp_path / "workload"
    scaled = write_workload(entry, dest, {"seq": 64}, shards)
    assert "train_files : str = 'data/train_*.bin'" in scaled.source  # relative: the script globs it from cwd
    assert (dest / "data").is_dir() and len(list((dest / "data").glob("train_*.bin"))) >= 2
    assert (dest / "logs" / "final").is_dir()
    check = check_port(dest, "cpu", tmp_path / "out")
    assert check.run_status == "ok", check.reason
    assert check.loss_falling, check.losses


AUTOCAST_MIXED = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 32)
        self.w = nn.Parameter(torch.randn(256, 32) / 32 ** 0.5)
    def forward(self, x, y):
        return F.cross_entropy(F.linear(self.embed(x), self.w).float(), y)

torch.manual_seed(0)
model = Net().cuda()
for m in model.modules():
    if isinstance(m, nn.Embedding):
        m.bfloat16()          # record 24's form: bf16 embeddings, fp32 weights, autocast between them
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
data = torch.randint(0, 256, (4096,))
for step in range(50):
    x = data[step * 64:(step + 1) * 64].cuda()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        loss = model(x, (x * 3 + 1) % 256)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
'''


def test_a_program_that_needs_its_autocast_is_ported_with_it_kept(tmp_path):
    from trainbridge.records.compare import write_workload
    from trainbridge.records.models import RecordEntry
    from trainbridge.records.port_check import check_port
    from trainbridge.records.shards import make_record_shards
    from trainbridge.workload import load_workload

    shards = make_record_shards(tmp_path / "shards", train_tokens=20_000, val_tokens=4096)
    dest = tmp_path / "workload"
    write_workload(RecordEntry(key="mixed", num=24, name="Mixed", script=AUTOCAST_MIXED), dest, {}, shards)
    assert load_workload(dest).manifest.port.autocast == "inert"
    check = check_port(dest, "cpu", tmp_path / "out")
    assert check.ok, check.reason
    assert check.changes_by_kind.get("precision") and not check.changes_by_kind.get("precision_lost")
    assert load_workload(dest).manifest.port.autocast == "keep", "the loop must port it the same way"
    from trainbridge.harness.runner import port_workload
    src = port_workload(load_workload(dest), "cpu").files["train_gpt.py"]
    assert 'torch.autocast(device_type="cpu", dtype=torch.bfloat16)' in src
