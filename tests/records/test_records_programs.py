"""The record-style program series in workloads/records/programs/.

Each program is written for device "cuda"; the tests run a CPU copy made with this file's
own small cuda->cpu mapping (`_cpu_source`, the same sed as tests/workloads/test_nanogpt_workload.py),
autocast disabled, on tiny shards written here, in this process (one torch import), and
check the record log lines. They also check that each program adds its technique.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from tests.kits.paths import WORKLOADS

PROGRAMS = WORKLOADS / "records" / "programs"
SERIES = [
    "r02_adamw_rotary",
    "r04_muon",
    "r05_modern_arch",
    "r08_untied_head",
    "r09_shortcuts",
    "r10_bf16_acts",
    "r11_unet",
    "r12_sliding_window",
    "r14_value_embeds",
    "r20_merged_qkv",
]

VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) train_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
MEMORY_LINE = re.compile(r"^peak memory allocated: \d+ MiB reserved: \d+ MiB$")

TINY = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=256, seq_len=32, batch_size=4, num_iterations=6,
            val_tokens=256, val_loss_every=3, timing_skip_steps=1)
# only for the programs that have these fields (record 12 on): a window shorter than seq_len
TINY_WINDOW = dict(window_start=8, window_end=24, window_block=8)


def _cpu_source(text: str, keep_bf16: bool = False) -> str:
    """What a person would sed: device strings, torch.cuda calls, pinned memory, autocast off.

    Also `.bfloat16()` -> `.float()`: without native bf16 a CPU runs bf16 matmuls (Muon's
    Newton-Schulz, record 10's bf16 activations) about 100 times slower than fp32, so the
    copy runs fp32 throughout, as autocast-off does for the forward.
    """
    if not keep_bf16:
        text = text.replace(".bfloat16()", ".float()")
    for old, new in [
        ('device_type="cuda"', 'device_type="cpu", enabled=False'),
        ("pin_memory=True", "pin_memory=False"),
        ("torch.cuda.max_memory_allocated()", "0"),
        ("torch.cuda.max_memory_reserved()", "0"),
        ("torch.cuda.synchronize()", "torch.cpu.synchronize()"),
        (".cuda()", ".cpu()"),
        ('"cuda"', '"cpu"'),
    ]:
        text = text.replace(old, new)
    return text


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _shard(path: Path, tokens: torch.Tensor) -> Path:
    header = torch.zeros(256, dtype=torch.int32)
    header[:3] = torch.tensor([20240520, 1, len(tokens)])
    path.write_bytes(header.numpy().tobytes() + tokens.to(torch.int32).to(torch.uint16).numpy().tobytes())
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one thread is as fast, and far faster when other work shares the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """A folder with data/train_000000.bin and data/val_000000.bin of learnable byte tokens."""
    folder = tmp_path_factory.mktemp("records_cpu")
    (folder / "data").mkdir()
    g = torch.Generator().manual_seed(0)
    pattern = torch.randint(0, 256, (97,), generator=g)  # a repeating pattern: the loss can fall
    train = pattern.repeat(200)[:16_000]
    val = pattern.repeat(40)[3:3_003]
    _shard(folder / "data" / "train_000000.bin", train)
    _shard(folder / "data" / "val_000000.bin", val)
    return folder


def _run(name: str, folder: Path, capsys, monkeypatch) -> list[str]:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    path = folder / f"{name}.py"
    path.write_text(_cpu_source((PROGRAMS / f"{name}.py").read_text()))
    module_name = f"_records_{name}_cpu"
    module = _import(path, module_name)
    try:
        known = {f.name for f in fields(module.Hyperparameters)}
        overrides = dict(TINY)
        overrides.update({k: v for k, v in TINY_WINDOW.items() if k in known})
        torch.manual_seed(0)
        capsys.readouterr()
        module.main([f"{k}={v}" for k, v in overrides.items()])
    finally:
        sys.modules.pop(module_name, None)
    return capsys.readouterr().out.splitlines()


def _source(name: str) -> str:
    return (PROGRAMS / f"{name}.py").read_text()


# ------------------------------------------------------------------- running ----

@pytest.mark.parametrize("name", SERIES)
def test_program_runs_on_cpu_and_logs_record_lines(name, shard_dir, capsys, monkeypatch):
    lines = _run(name, shard_dir, capsys, monkeypatch)
    assert lines[0].startswith(f"Running PyTorch {torch.__version__}")
    vals = [VAL_LINE.match(line) for line in lines if " val_loss:" in line]
    trains = [TRAIN_LINE.match(line) for line in lines if " train_loss:" in line]
    assert all(vals) and all(trains), lines
    assert [int(m.group(1)) for m in vals] == [0, 3, 6]
    assert [int(m.group(1)) for m in trains] == [1, 2, 3, 4, 5, 6]
    assert all(int(m.group(2)) == 6 for m in vals + trains)
    final = float(vals[-1].group(3))
    assert math.isfinite(final) and final < float(vals[0].group(3)) + 0.5
    assert all(math.isfinite(float(m.group(3))) for m in trains)
    assert float(vals[-1].group(5)) > 0  # timed steps 2..6
    assert MEMORY_LINE.match(lines[-1]), lines[-1]
    print(f"{name}: final val_loss {final:.4f} step_avg {vals[-1].group(5)}ms")


@pytest.mark.parametrize("name", ["r10_bf16_acts", "r14_value_embeds", "r20_merged_qkv"])
def test_bf16_activations_really_flow_in_bf16(name, tmp_path):
    """Record 10 on: with the bf16 casts kept, the residual stream is bf16, linear weights stay fp32."""
    path = tmp_path / f"{name}_bf16.py"
    path.write_text(_cpu_source(_source(name), keep_bf16=True))
    module_name = f"_records_{name}_bf16"
    module = _import(path, module_name)
    try:
        torch.manual_seed(0)
        args = module.parse_overrides([f"{k}={v}" for k, v in TINY.items()])
        model = module.GPT(args.vocab_size, args.n_layer, args.n_head, args.n_embd, args.seq_len)
        for m in model.modules():  # what main() does after .cuda()
            if isinstance(m, torch.nn.Embedding):
                m.bfloat16()
        seen = []
        model.blocks[0].register_forward_hook(lambda mod, inp, out: seen.append(out[0].dtype))
        idx = torch.randint(0, 256, (2, 16))
        extra = [8] if any(f.name == "window_start" for f in fields(module.Hyperparameters)) else []  # window
        loss = model(idx, idx.roll(-1, 1), *extra)
        loss.backward()
    finally:
        sys.modules.pop(module_name, None)
    assert seen == [torch.bfloat16]
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())
    assert model.wte.weight.dtype == torch.bfloat16
    linears = [m for m in model.modules() if isinstance(m, module.CastedLinear)]
    assert linears and all(m.weight.dtype == torch.float32 and m.weight.grad.dtype == torch.float32 for m in linears)


# --------------------------------------------------------------- the series ----

@pytest.mark.parametrize("name", SERIES)
def test_program_conventions(name):
    text = _source(name)
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    number = int(name[1:3])  # r12_... mirrors record 12
    assert doc and re.match(rf"Records? {number}\b", doc), "the docstring starts with the record it mirrors"
    assert "=" * 100 not in doc.splitlines()
    assert "torch.compile" not in text and "flex_attention" not in text.lower()
    for needle in ['device="cuda"', "torch.cuda.synchronize()", 'device_type="cuda"', "torch.bfloat16",
                   'backend="nccl"', "HERE = Path(__file__).resolve().parent", "def parse_overrides",
                   "class Hyperparameters", "def _load_data_shard", "Running PyTorch",
                   "peak memory allocated:", "DistributedDataParallel"]:
        assert needle in text, needle
    names = {n.target.id for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for field in ["train_files", "val_files", "val_tokens", "vocab_size", "n_layer", "n_head", "n_embd",
                  "seq_len", "batch_size", "num_iterations", "val_loss_every", "timing_skip_steps", "seed"]:
        assert field in names, field


def test_readme_lists_the_series():
    readme = (PROGRAMS / "README.md").read_text()
    for name in SERIES:
        assert f"{name}.py" in readme
    assert sorted(p.stem for p in PROGRAMS.glob("*.py")) == sorted(SERIES)


def test_each_program_adds_its_technique():
    src = {name: _source(name) for name in SERIES}
    for a, b in zip(SERIES, SERIES[1:]):
        assert src[a] != src[b], (a, b)

    def has(name, *needles):
        return all(n in src[name] for n in needles)

    # record 2: AdamW only, GELU, tied head, hand-written attention with a causal mask
    assert has("r02_adamw_rotary", "F.gelu(", "self.wte.weight = self.lm_head.weight", "masked_fill", "apply_rotary_emb")
    assert "Muon" not in src["r02_adamw_rotary"]
    # record 4: Muon with quintic Newton-Schulz in bf16
    assert has("r04_muon", "class Muon", "zeropower_via_newtonschulz5", "3.4445", "nesterov", ".bfloat16()")
    assert "relu(" not in src["r04_muon"]
    # record 5: padded vocab, ReLU^2, zero-init projections, QK-norm
    assert has("r05_modern_arch", "50304", "F.relu(x).square()", ".zero_()", "q, k = norm(q), norm(k)")
    assert "F.gelu(" not in src["r05_modern_arch"] and "50304" not in src["r04_muon"]
    # record 8: untied head
    assert "self.wte.weight = self.lm_head.weight" in src["r05_modern_arch"]
    assert "self.wte.weight = self.lm_head.weight" not in src["r08_untied_head"]
    assert has("r08_untied_head", "head_lr")
    # record 9: value residual, embedding skip, momentum warm-up, tanh softcap
    assert has("r09_shortcuts", "self.lamb", "x0", "muon_momentum_warmup_steps", "torch.tanh(logits / c)")
    assert "torch.tanh" not in src["r08_untied_head"]
    # record 10: bf16 activations (embeddings in bf16, fp32 linear weights cast in forward)
    assert has("r10_bf16_acts", "class CastedLinear", ".bfloat16()")
    assert "CastedLinear" not in src["r09_shortcuts"]
    # record 11: U-net skips with learned weights, doubled lrs
    assert has("r11_unet", "skip_weights", "skip_connections")
    assert "skip_weights" not in src["r10_bf16_acts"]
    # records 12-13: sliding-window causal attention built as a mask, window warm-up
    assert has("r12_sliding_window", "window_start", "window_end", "def window_size")
    assert "window" not in src["r11_unet"].lower()
    # record 14: value embeddings
    assert has("r14_value_embeds", "self.value_embeds = nn.ModuleList([nn.Embedding(vocab_size, n_embd)", "ve_lamb")
    assert "value_embeds" not in src["r12_sliding_window"]
    # record 20: one qkv Linear, attention scale 0.12, lower Adam eps
    assert has("r20_merged_qkv", "self.c_qkv = CastedLinear(dim, 3 * dim)", "0.12", "eps=1e-10")
    assert "self.c_q =" not in src["r20_merged_qkv"] and "self.c_v =" not in src["r20_merged_qkv"]
    assert "self.c_q =" in src["r14_value_embeds"] and "eps=1e-10" not in src["r14_value_embeds"]
