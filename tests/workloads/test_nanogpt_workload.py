"""The nanogpt workload: shard format, data maker, manifest, and a CPU copy of the program.

`train_gpt.py` is written for CUDA and is never edited here: the tests import a temporary
copy with this file's own small cuda->cpu mapping (`_cpu_source`), independent of
TrainBridge's port, and with autocast disabled so everything runs fp32.
"""

from __future__ import annotations

import ast
import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch

from trainbridge.workload import load_workload

from tests.kits.paths import WORKLOADS

WORKLOAD = WORKLOADS / "nanogpt"
SCRIPT = WORKLOAD / "train_gpt.py"

# The record log formats (shared/reference/modded_nanogpt.md).
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) train_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")

TINY = dict(n_layer=2, n_head=2, n_embd=64, vocab_size=256, seq_len=32, batch_size=4)


def _cpu_source(text: str) -> str:
    """What a person would sed: device strings, torch.cuda calls, pinned memory, autocast off."""
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
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tg(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nanogpt_cpu")
    (folder / "train_gpt.py").write_text(_cpu_source(SCRIPT.read_text()))
    module = _import(folder / "train_gpt.py", "_nanogpt_train_gpt_cpu")
    yield module
    sys.modules.pop("_nanogpt_train_gpt_cpu", None)


@pytest.fixture(scope="module")
def mk():
    module = _import(WORKLOAD / "data" / "make_shards.py", "_nanogpt_make_shards")
    yield module
    sys.modules.pop("_nanogpt_make_shards", None)


def _shard(path: Path, magic=20240520, version=1, count=None, tokens=(1, 2, 3)) -> Path:
    header = torch.zeros(256, dtype=torch.int32)
    header[:3] = torch.tensor([magic, version, len(tokens) if count is None else count])
    path.write_bytes(header.numpy().tobytes() + torch.tensor(tokens, dtype=torch.int32).to(torch.uint16).numpy().tobytes())
    return path


# ------------------------------------------------------------------------ data ----

def test_shard_round_trip_writer_to_reader(tmp_path, tg, mk):
    ids = [0, 1, 255, 256, 12345, 65535]
    assert mk.write_shard(tmp_path / "a.bin", ids) is True
    tokens = tg._load_data_shard(tmp_path / "a.bin")
    assert tokens.dtype == torch.uint16 and tokens.tolist() == ids
    assert mk.write_shard(tmp_path / "a.bin", ids) is False  # identical content: left alone
    mk.write_shard(tmp_path / "b.bin", b"hello\x00\xff")
    assert tg._load_data_shard(tmp_path / "b.bin").tolist() == list(b"hello\x00\xff")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(magic=12345), "bad magic number 12345"),
        (dict(version=2), "shard version 2"),
        (dict(count=10), "header says 10 tokens"),
    ],
)
def test_bad_shards_fail_with_a_clear_error(tmp_path, tg, kwargs, message):
    path = _shard(tmp_path / "bad.bin", **kwargs)
    with pytest.raises(ValueError, match=message) as e:
        tg._load_data_shard(path)
    assert "bad.bin" in str(e.value)


def test_file_shorter_than_header_is_rejected(tmp_path, tg):
    (tmp_path / "short.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(ValueError, match="shorter than the 1024-byte shard header"):
        tg._load_data_shard(tmp_path / "short.bin")


def test_generator_shifts_targets_slices_ranks_and_cycles(tmp_path, tg, mk):
    mk.write_shard(tmp_path / "t_000.bin", [i % 1000 for i in range(40)])
    pattern = str(tmp_path / "t_*.bin")  # absolute: taken as it is
    batches = [tg.distributed_data_generator(pattern, 2, 4, rank, 2) for rank in (0, 1)]
    x0, y0 = next(batches[0])
    x1, y1 = next(batches[1])
    assert x0.dtype == torch.int64 and x0.shape == (2, 4) and y0.shape == (2, 4)
    assert x0.flatten().tolist() == list(range(0, 8)) and y0.flatten().tolist() == list(range(1, 9))
    assert x1.flatten().tolist() == list(range(8, 16)) and y1.flatten().tolist() == list(range(9, 17))
    # 40 tokens hold 2 steps of 16 (+1 target); the third step starts the shard again
    next(batches[0])
    x0, _ = next(batches[0])
    assert x0.flatten().tolist() == list(range(0, 8))


def test_generator_errors_name_the_problem(tmp_path, tg, mk):
    with pytest.raises(FileNotFoundError, match="make_shards"):
        next(tg.distributed_data_generator(str(tmp_path / "none_*.bin"), 2, 4, 0, 1))
    mk.write_shard(tmp_path / "small.bin", [1, 2, 3])
    with pytest.raises(ValueError, match="fewer than one step needs"):
        next(tg.distributed_data_generator(str(tmp_path / "small.bin"), 2, 4, 0, 1))


def test_make_shards_is_deterministic_idempotent_and_byte_level(tmp_path, mk, capsys):
    argv = ["--train-tokens", "6000", "--val-tokens", "1500", "--out-dir", str(tmp_path)]
    mk.main(argv)
    first = {p.name: p.read_bytes() for p in tmp_path.glob("*.bin")}
    assert sorted(first) == ["train_000000.bin", "val_000000.bin"]
    mk.main(argv)
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.bin")} == first
    for name, n in (("train_000000.bin", 6000), ("val_000000.bin", 1500)):
        tokens = torch.frombuffer(bytearray(first[name][1024:]), dtype=torch.int16)
        assert tokens.numel() == n and int(tokens.min()) >= 0 and int(tokens.max()) < 256
    # the two shards are consecutive, disjoint pieces of the same text
    assert mk.stdlib_text(7500) == first["val_000000.bin"][1024::2] + first["train_000000.bin"][1024::2]


# -------------------------------------------------------------------- manifest ----

def test_manifest_loads_and_its_args_are_valid_overrides(tg):
    wl = load_workload(WORKLOAD)
    m = wl.manifest
    assert m.entry == "train_gpt.py" and m.native_device == "cuda" and m.limits.timeout_s == 600
    args = tg.parse_overrides(m.args)
    assert m.work.unit == "tokens" and m.work.per_step == args.batch_size * args.seq_len
    assert args.vocab_size >= 256 and args.vocab_size % 64 == 0  # byte tokens
    assert args.val_loss_every == 0  # no validation inside a short measured run
    assert args.num_iterations > 5 * (m.steps.warmup + m.steps.measured)
    assert m.prepare.creates == ["data/train_000000.bin", "data/val_000000.bin"]
    # every protected symbol and name exists at module level
    tree = ast.parse(SCRIPT.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for region in m.protected:
        assert set(region.symbols) <= defined, set(region.symbols) - defined
        assert set(region.names) <= assigned, set(region.names) - assigned


def test_the_program_does_nothing_on_import():
    tree = ast.parse(SCRIPT.read_text())
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.Expr)
    for node in tree.body:
        if isinstance(node, ast.If):  # only the `if __name__ == "__main__":` guard
            assert ast.unparse(node.test) == "__name__ == '__main__'"
        else:
            assert isinstance(node, allowed), ast.unparse(node)


def test_overrides_are_typed_and_unknown_keys_fail(tg):
    args = tg.parse_overrides(["n_layer=3", "cooldown_frac=0.5", "train_files=x/*.bin"])
    assert (args.n_layer, args.cooldown_frac, args.train_files) == (3, 0.5, "x/*.bin")
    assert tg.parse_overrides([]) == tg.Hyperparameters()
    assert tg.Hyperparameters().n_layer == 12 and tg.Hyperparameters().vocab_size == 50304
    with pytest.raises(SystemExit, match="unknown hyperparameter 'n_layers'"):
        tg.parse_overrides(["n_layers=3"])
    with pytest.raises(SystemExit, match="not key=value"):
        tg.parse_overrides(["n_layer"])
    with pytest.raises(SystemExit, match="expected int"):
        tg.parse_overrides(["n_layer=3.5"])


def test_lr_schedule_warmup_constant_cooldown(tg):
    args = tg.Hyperparameters(num_iterations=100, warmup_frac=0.1, cooldown_frac=0.2)
    lr = [tg.lr_multiplier(s, args) for s in range(101)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == 1.0 and lr[50] == 1.0 and lr[79] == 1.0
    assert lr[90] == pytest.approx(0.5) and lr[100] == 0.0


# ----------------------------------------------------------------------- model ----

@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (256, 1024)])
def test_newton_schulz_is_approximately_orthogonal(tg, shape):
    g = torch.Generator().manual_seed(0)
    G = torch.randn(shape, generator=g)
    X = tg.zeropower_via_newtonschulz5(G, steps=5)
    assert X.shape == G.shape and X.dtype == torch.bfloat16
    s = torch.linalg.svdvals(X.float())
    assert 0.65 < float(s.min()) and float(s.max()) < 1.2, s
    # same singular vectors: X ~ U V^T of G
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    assert torch.nn.functional.cosine_similarity(X.float().flatten(), (U @ Vh).flatten(), dim=0) > 0.97


def test_attention_is_causal_and_rotary_is_a_rotation(tg):
    torch.manual_seed(0)
    attn = tg.CausalSelfAttention(32, 4, 16)
    attn.c_proj.weight.data.normal_()  # zero-init would hide everything
    x = torch.randn(2, 16, 32)
    y, _ = attn(x, None)
    x2 = x.clone()
    x2[:, 10:] = torch.randn(2, 6, 32)
    y2, _ = attn(x2, None)
    assert torch.allclose(y[:, :10], y2[:, :10], atol=1e-6) and not torch.allclose(y[:, 10:], y2[:, 10:])
    q = torch.randn(2, 16, 4, 8)
    cos, sin = attn.rotary(16)
    r = tg.apply_rotary_emb(q, cos, sin)
    pair_norm = lambda t: t[..., :4] ** 2 + t[..., 4:] ** 2  # noqa: E731
    assert torch.allclose(pair_norm(r), pair_norm(q), atol=1e-5)
    assert torch.allclose(r[:, 0], q[:, 0])  # position 0 is not rotated


def test_tiny_model_learns_with_both_optimizers(tg):
    torch.manual_seed(0)
    args = tg.Hyperparameters(**TINY)
    model = tg.GPT(args.vocab_size, args.n_layer, args.n_head, args.n_embd, args.seq_len, args.logit_softcap)
    optimizers = tg.build_optimizers(model, args)
    assert [type(o).__name__ for o in optimizers] == ["AdamW", "Muon"]
    n_adam = sum(p.numel() for g in optimizers[0].param_groups for p in g["params"])
    n_muon = sum(p.numel() for g in optimizers[1].param_groups for p in g["params"])
    assert n_adam + n_muon == sum(p.numel() for p in model.parameters())
    text = torch.tensor(list(b"def norm(x): return x * torch.rsqrt(x.pow(2).mean(-1)) ") * 4)
    starts = torch.arange(4) * 7
    x = torch.stack([text[s:s + 32] for s in starts])
    y = torch.stack([text[s + 1:s + 33] for s in starts])
    losses = []
    for _ in range(20):
        loss = model(x, y)
        loss.backward()
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(256), abs=1e-4)  # zero-init head: uniform logits
    assert losses[-1] < 0.5 * losses[0], losses


def test_main_trains_and_prints_the_record_lines(tmp_path, tg, mk, capsys):
    mk.write_shard(tmp_path / "train_000000.bin", bytes(range(256)) * 40)
    mk.write_shard(tmp_path / "val_000000.bin", bytes(range(256)) * 4)
    overrides = {**TINY, "num_iterations": 12, "val_loss_every": 5, "val_tokens": 256,
                 "timing_skip_steps": 2, "muon_momentum_warmup_steps": 4,
                 "train_files": str(tmp_path / "train_*.bin"), "val_files": str(tmp_path / "val_*.bin")}
    tg.main([f"{k}={v}" for k, v in overrides.items()])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Running PyTorch {torch.__version__}"
    assert re.fullmatch(r"peak memory allocated: \d+ MiB reserved: \d+ MiB", lines[-1])
    val = [VAL_LINE.match(s) for s in lines if VAL_LINE.match(s)]
    train = [TRAIN_LINE.match(s) for s in lines if TRAIN_LINE.match(s)]
    assert [int(m[1]) for m in val] == [0, 5, 10, 12] and all(int(m[2]) == 12 for m in val)
    assert [int(m[1]) for m in train] == list(range(1, 13))
    assert [m[5] for m in train[:2]] == ["nan", "nan"] and all(m[5] != "nan" for m in train[2:])
    assert float(val[-1][3]) < float(val[0][3])  # the counting pattern is learnable
