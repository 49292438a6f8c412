"""The llama workload: manifest, data maker, and a CPU copy of the program.

`train_llama.py` is written for CUDA and is never edited here: the tests import a temporary
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

WORKLOAD = WORKLOADS / "llama"
SCRIPT = WORKLOAD / "train_llama.py"

TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) train_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms "
                        r"lr:([\d.e+-]+) grad_norm:([\d.]+)$")
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")

TINY = dict(n_layer=2, n_head=4, n_kv_head=2, n_embd=64, multiple_of=32, vocab_size=256, seq_len=32, batch_size=4)


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
def tl(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama_cpu")
    source = _cpu_source(SCRIPT.read_text())
    (folder / "train_llama.py").write_text(source)
    module = _import(folder / "train_llama.py", "_llama_train_cpu")
    yield module
    sys.modules.pop("_llama_train_cpu", None)


@pytest.fixture(scope="module")
def mk():
    module = _import(WORKLOAD / "data" / "make_shards.py", "_llama_make_shards")
    yield module
    sys.modules.pop("_llama_make_shards", None)


# ------------------------------------------------------------------------ data ----

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
    assert mk.stdlib_text(7500) == first["val_000000.bin"][1024::2] + first["train_000000.bin"][1024::2]


def test_shards_round_trip_and_bad_shards_fail(tmp_path, tl, mk):
    ids = [0, 1, 255, 256, 12345, 65535]
    mk.write_shard(tmp_path / "a.bin", ids)
    tokens = tl._load_data_shard(tmp_path / "a.bin")
    assert tokens.dtype == torch.uint16 and tokens.tolist() == ids
    bad = bytearray((tmp_path / "a.bin").read_bytes())
    bad[0] = 0  # magic number broken
    (tmp_path / "bad.bin").write_bytes(bytes(bad))
    with pytest.raises(ValueError, match="bad magic number") as e:
        tl._load_data_shard(tmp_path / "bad.bin")
    assert "bad.bin" in str(e.value)


def test_generator_shifts_targets_and_cycles(tmp_path, tl, mk):
    mk.write_shard(tmp_path / "t_000.bin", list(range(20)))
    batches = tl.data_generator(str(tmp_path / "t_*.bin"), 2, 4)  # absolute glob: taken as it is
    x, y = next(batches)
    assert x.dtype == torch.int64 and x.shape == (2, 4) and y.shape == (2, 4)
    assert x.flatten().tolist() == list(range(0, 8)) and y.flatten().tolist() == list(range(1, 9))
    x, _ = next(batches)
    assert x.flatten().tolist() == list(range(8, 16))
    x, _ = next(batches)  # 20 tokens hold 2 steps of 8 (+1 target): back to the start
    assert x.flatten().tolist() == list(range(0, 8))
    with pytest.raises(FileNotFoundError, match="make_shards"):
        next(tl.data_generator(str(tmp_path / "none_*.bin"), 2, 4))


# -------------------------------------------------------------------- manifest ----

def test_manifest_loads_and_its_args_are_valid_overrides(tl):
    m = load_workload(WORKLOAD).manifest
    assert m.name == "llama" and m.entry == "train_llama.py" and m.native_device == "cuda"
    assert (m.steps.warmup, m.steps.measured, m.correctness.steps) == (3, 25, 8)
    args = tl.parse_overrides(m.args)
    assert m.work.unit == "tokens" and m.work.per_step == args.batch_size * args.seq_len
    assert args.vocab_size >= 256 and args.n_kv_head < args.n_head and args.n_head % args.n_kv_head == 0
    assert args.val_loss_every == 0  # no validation inside a short measured run
    assert args.num_iterations > 5 * (m.steps.warmup + m.steps.measured)
    assert m.prepare.command == ["python", "data/make_shards.py"]
    assert m.prepare.creates == ["data/train_000000.bin", "data/val_000000.bin"]
    tree = ast.parse(SCRIPT.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert m.protected
    for region in m.protected:
        assert set(region.symbols) <= defined, set(region.symbols) - defined
        assert set(region.names) <= assigned, set(region.names) - assigned


def test_the_program_is_gpu_style_and_does_nothing_on_import():
    text = SCRIPT.read_text()
    for idiom in ('.cuda()', 'torch.cuda.synchronize()', 'device_type="cuda", dtype=torch.bfloat16',
                  'clip_grad_norm_', 'LambdaLR', 'loss.backward()', 'optimizer.step()', 'loss.item()'):
        assert idiom in text, idiom
    assert "nanogpt" not in text.lower().replace("modded-nanogpt", "")  # self-contained
    tree = ast.parse(text)
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.Expr)
    for node in tree.body:
        if isinstance(node, ast.If):
            assert ast.unparse(node.test) == "__name__ == '__main__'"
        else:
            assert isinstance(node, allowed), ast.unparse(node)


def test_overrides_are_typed_and_unknown_keys_fail(tl):
    args = tl.parse_overrides(["n_kv_head=1", "learning_rate=1e-3", "train_files=x/*.bin"])
    assert (args.n_kv_head, args.learning_rate, args.train_files) == (1, 1e-3, "x/*.bin")
    assert tl.parse_overrides([]) == tl.Hyperparameters()
    with pytest.raises(SystemExit, match="unknown hyperparameter 'n_layers'"):
        tl.parse_overrides(["n_layers=3"])
    with pytest.raises(SystemExit, match="not key=value"):
        tl.parse_overrides(["n_layer"])
    with pytest.raises(SystemExit, match="expected int"):
        tl.parse_overrides(["n_layer=3.5"])


def test_lr_schedule_warmup_then_cosine(tl):
    args = tl.Hyperparameters(num_iterations=110, warmup_steps=10, min_lr_ratio=0.1)
    lr = [tl.lr_multiplier(s, args) for s in range(111)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0) and lr[10] == pytest.approx(1.0)
    assert lr[60] == pytest.approx(0.55) and lr[110] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lr[9:], lr[10:]))


# ----------------------------------------------------------------------- model ----

def test_rmsnorm_matches_the_formula_and_keeps_dtype(tl):
    norm = tl.RMSNorm(16, eps=1e-5)
    norm.weight.data.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 16)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    assert torch.allclose(norm(x), want, atol=1e-6)
    assert norm(x.bfloat16()).dtype == torch.float32  # bf16 normed value times the fp32 weight, as in Meta's


def test_gqa_shapes_causality_and_rotary(tl):
    torch.manual_seed(0)
    attn = tl.Attention(64, n_head=8, n_kv_head=2, max_seq_len=16)
    assert attn.wq.weight.shape == (64, 64) and attn.wk.weight.shape == (16, 64) and attn.wv.weight.shape == (16, 64)
    kv = torch.randn(2, 16, 2, 8)
    rep = tl.repeat_kv(kv, 4)
    assert rep.shape == (2, 16, 8, 8)
    assert torch.equal(rep, kv.repeat_interleave(4, dim=2))  # query heads 0-3 share kv head 0
    freqs_cis = tl.precompute_freqs_cis(8, 16)
    x = torch.randn(2, 16, 64)
    y = attn(x, freqs_cis)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, 10:] = torch.randn(2, 6, 64)
    y2 = attn(x2, freqs_cis)
    assert torch.allclose(y[:, :10], y2[:, :10], atol=1e-6) and not torch.allclose(y[:, 10:], y2[:, 10:])
    q, k = torch.randn(2, 16, 8, 8), torch.randn(2, 16, 2, 8)
    rq, rk = tl.apply_rotary_emb(q, k, freqs_cis)
    assert rq.shape == q.shape and rk.shape == k.shape
    pair_norm = lambda t: t[..., 0::2] ** 2 + t[..., 1::2] ** 2  # noqa: E731  interleaved pairs
    assert torch.allclose(pair_norm(rq), pair_norm(q), atol=1e-5)
    assert torch.allclose(rq[:, 0], q[:, 0])  # position 0 is not rotated


def test_swiglu_hidden_size_follows_metas_rule(tl):
    ff = tl.FeedForward(256, 4 * 256, multiple_of=256, ffn_dim_multiplier=1.0)
    assert ff.w1.weight.shape == (768, 256) and ff.w3.weight.shape == (768, 256) and ff.w2.weight.shape == (256, 768)
    x = torch.randn(2, 3, 256)
    assert torch.allclose(ff(x), ff.w2(torch.nn.functional.silu(ff.w1(x)) * ff.w3(x)))


def test_optimizer_decays_only_matrices(tl):
    args = tl.Hyperparameters(**TINY)
    model = tl.Transformer(args)
    opt = tl.build_optimizer(model, args)
    assert type(opt) is torch.optim.AdamW and opt.defaults["betas"] == (0.9, 0.95)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == args.weight_decay > 0 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert model.output.weight is not model.tok_embeddings.weight  # untied


def test_main_trains_30_steps_with_finite_falling_loss(tmp_path, tl, mk, capsys):
    mk.write_shard(tmp_path / "train_000000.bin", bytes(range(256)) * 40)
    mk.write_shard(tmp_path / "val_000000.bin", bytes(range(256)) * 4)
    overrides = {**TINY, "num_iterations": 30, "warmup_steps": 3, "learning_rate": 3e-3,
                 "val_loss_every": 15, "val_tokens": 256, "timing_skip_steps": 2,
                 "train_files": str(tmp_path / "train_*.bin"), "val_files": str(tmp_path / "val_*.bin")}
    tl.main([f"{k}={v}" for k, v in overrides.items()])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Running PyTorch {torch.__version__}"
    assert re.fullmatch(r"peak memory allocated: \d+ MiB reserved: \d+ MiB", lines[-1])
    train = [TRAIN_LINE.match(s) for s in lines if TRAIN_LINE.match(s)]
    val = [VAL_LINE.match(s) for s in lines if VAL_LINE.match(s)]
    assert [int(m[1]) for m in train] == list(range(1, 31)) and all(int(m[2]) == 30 for m in train)
    assert [int(m[1]) for m in val] == [0, 15, 30]
    assert [m[5] for m in train[:2]] == ["nan", "nan"] and all(m[5] != "nan" for m in train[2:])
    losses = [float(m[3]) for m in train]
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] == pytest.approx(math.log(256), abs=0.1)  # small init: near-uniform logits
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses  # about 5.5 -> 3.0
    assert float(val[-1][3]) < float(val[0][3])
    assert all(float(m[7]) > 0 for m in train)  # clip_grad_norm_ reports the norm
