"""The clip workload: data maker, manifest, and a CPU copy of the program.

`train.py` is written for CUDA and is never edited here: the tests import a temporary copy
with this file's own small cuda->cpu mapping (`_cpu_source`), independent of TrainBridge's
port, and with autocast disabled so everything runs fp32.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainbridge.workload import load_workload

from tests.kits.paths import WORKLOADS

WORKLOAD = WORKLOADS / "clip"
SCRIPT = WORKLOAD / "train.py"

TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) train_loss:([\d.]+) logit_scale:([\d.]+) lr:(\S+) "
                        r"train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:([\d.]+) val_i2t_acc:([\d.]+) train_time:(\d+)ms "
                      r"step_avg:([\d.]+|nan)ms$")
TINY = dict(batch_size=16, vision_width=32, vision_layers=1, vision_heads=2, text_width=32, text_layers=1,
            text_heads=2, embed_dim=32)


def _cpu_source(text: str) -> str:
    """What a person would sed: device strings, torch.cuda calls, pinned memory, autocast off."""
    for old, new in [
        ('device_type="cuda"', 'device_type="cpu", enabled=False'),
        (".pin_memory()", ""),
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
def tr(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip_cpu")
    (folder / "train.py").write_text(_cpu_source(SCRIPT.read_text()))
    module = _import(folder / "train.py", "_clip_train_cpu")
    yield module
    sys.modules.pop("_clip_train_cpu", None)


@pytest.fixture(scope="module")
def mk():
    module = _import(WORKLOAD / "data" / "make_data.py", "_clip_make_data")
    yield module
    sys.modules.pop("_clip_make_data", None)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, mk):
    out = tmp_path_factory.mktemp("clip_data")
    mk.main(["--train", "160", "--val", "40", "--out-dir", str(out)])
    return out


# ------------------------------------------------------------------------ data ----

def test_make_data_is_deterministic_idempotent_and_writes_what_prepare_says(tmp_path, mk, capsys):
    argv = ["--train", "30", "--val", "10", "--out-dir", str(tmp_path)]
    mk.main(argv)
    first = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert sorted(first) == sorted(mk.FILES)
    creates = load_workload(WORKLOAD).manifest.prepare.creates
    assert sorted(Path(p).name for p in creates) == sorted(mk.FILES)
    mk.main(argv)
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == first
    images, tokens = np.load(tmp_path / "train_images.npy"), np.load(tmp_path / "train_tokens.npy")
    assert images.dtype == np.uint8 and images.shape == (30, 32, 32, 3)
    assert tokens.dtype == np.int64 and tokens.shape == (30, 16)
    vocab = json.loads(first["vocab.json"])["tokens"]
    assert vocab[0] == "<pad>" and vocab[-1] == "<eot>" and int(tokens.max()) == len(vocab) - 1
    mk.main(argv[:-1] + [str(tmp_path / "other")])  # same seed, another folder: the same bytes
    assert (tmp_path / "other" / "train_images.npy").read_bytes() == first["train_images.npy"]


def test_captions_describe_the_images(mk):
    ids = mk.tokenize(mk.caption("big", "red", "square", "top left"), 16)
    words = [mk.VOCAB[i] for i in ids if i != 0]
    assert words == ["<sot>", "a", "big", "red", "square", "in", "the", "top", "left", "<eot>"]
    images, tokens = mk.make_split(50, 16, np.random.default_rng(0))
    for image, toks in zip(images, tokens):
        words = [mk.VOCAB[i] for i in toks]
        colour = np.array(mk.COLOURS[words[3]], dtype=float)
        # the pixel nearest the caption's colour lies in the caption's quadrant (or the centre)
        dist = ((image.astype(float) - colour) ** 2).sum(-1)
        r, c = np.unravel_index(dist.argmin(), dist.shape)
        where = " ".join(words[7:toks.tolist().index(len(mk.VOCAB) - 1)])
        cy, cx = mk.POSITIONS[where]
        assert abs(r - cy) <= 9 and abs(c - cx) <= 9, (words, r, c)


# -------------------------------------------------------------------- manifest ----

def test_manifest_loads_and_its_args_are_valid_overrides(tr):
    m = load_workload(WORKLOAD).manifest
    assert m.entry == "train.py" and m.native_device == "cuda"
    args = tr.parse_overrides(m.args)
    assert m.work.unit == "samples" and m.work.per_step == args.batch_size
    assert args.eval_every == 0 and args.num_steps > 5 * (m.steps.warmup + m.steps.measured)
    assert args.vision_width % args.vision_heads == 0 and args.text_width % args.text_heads == 0
    assert m.steps.warmup == 3 and m.correctness.steps <= m.steps.warmup + m.steps.measured
    tree = ast.parse(SCRIPT.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for region in m.protected:
        assert set(region.symbols) <= defined, set(region.symbols) - defined
        assert set(region.names) <= assigned, set(region.names) - assigned


def test_the_program_does_nothing_on_import_and_is_written_for_cuda():
    text = SCRIPT.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.If):
            assert ast.unparse(node.test) == "__name__ == '__main__'"
        else:
            assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
                                     ast.Expr)), ast.unparse(node)
    for idiom in ('.cuda()', 'device_type="cuda", dtype=torch.bfloat16', "torch.cuda.synchronize()",
                  "pin_memory()", "q @ k.transpose(-2, -1)", "nn.LayerNorm", "torch.optim.AdamW"):
        assert idiom in text, idiom


def test_overrides_are_typed_and_unknown_keys_fail(tr):
    args = tr.parse_overrides(["vision_layers=2", "lr=3e-4", "data_dir=x"])
    assert (args.vision_layers, args.lr, args.data_dir) == (2, 3e-4, "x")
    assert tr.parse_overrides([]) == tr.Hyperparameters()
    with pytest.raises(SystemExit, match="unknown hyperparameter 'layers'"):
        tr.parse_overrides(["layers=3"])
    with pytest.raises(SystemExit, match="not key=value"):
        tr.parse_overrides(["lr"])
    with pytest.raises(SystemExit, match="expected int"):
        tr.parse_overrides(["batch_size=1.5"])


def test_lr_schedule_warmup_cosine(tr):
    args = tr.Hyperparameters(num_steps=110, warmup_steps=10)
    lr = [tr.lr_multiplier(s, args) for s in range(111)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0) and lr[10] == pytest.approx(1.0)
    assert lr[60] == pytest.approx(0.5) and lr[110] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))


# ----------------------------------------------------------------------- model ----

def test_text_attention_is_causal_and_pools_at_eot(tr):
    torch.manual_seed(0)
    text = tr.TextTransformer(vocab_size=10, context_length=8, width=16, layers=2, heads=2, mlp_ratio=2,
                              embed_dim=8)
    t = torch.tensor([[9, 1, 2, 3, 0, 0, 0, 0], [9, 1, 2, 3, 4, 0, 0, 0]])
    t = t.clone()
    t[0, 3], t[1, 4] = 9, 9  # <eot> (the largest id) ends each caption
    t[0, 0] = t[1, 0] = 1
    out = text(t)
    t2 = t.clone()
    t2[:, 6:] = 5  # tokens after every <eot>: the pooled features must not change
    assert torch.allclose(out, text(t2), atol=1e-6)
    t3 = t.clone()
    t3[0, 1] = 4  # a token before <eot> does change them
    assert not torch.allclose(out[0], text(t3)[0])


def test_clip_loss_is_symmetric_infonce(tr):
    torch.manual_seed(0)
    f = torch.nn.functional.normalize(torch.randn(8, 4), dim=-1)
    g = torch.nn.functional.normalize(torch.randn(8, 4), dim=-1)
    scale = torch.tensor(10.0)
    logits = scale * f @ g.T
    labels = torch.arange(8)
    expected = (torch.nn.functional.cross_entropy(logits, labels)
                + torch.nn.functional.cross_entropy(logits.T, labels)) / 2
    assert torch.allclose(tr.clip_loss(f, g, scale), expected)
    assert tr.clip_loss(f, g, scale) == pytest.approx(tr.clip_loss(g, f, scale).item(), abs=1e-6)
    assert tr.clip_loss(f, f, torch.tensor(100.0)) < 0.01  # matched pairs: near zero


def test_tiny_model_learns(tr, small_data):
    torch.manual_seed(0)
    args = tr.Hyperparameters(**TINY, num_steps=25, warmup_steps=3, lr=3e-3)
    images, tokens, vocab = tr.load_pairs(str(small_data), "train")
    model = tr.CLIP(args, len(vocab))
    optimizer = tr.build_optimizer(model, args)
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert id(model.logit_scale) not in decayed and id(model.text.token_embedding.weight) not in decayed
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: tr.lr_multiplier(s, args))
    x, t = next(tr.pair_batches(images, tokens, args.batch_size, train=True))  # one batch, memorised
    losses = []
    for _ in range(args.num_steps):
        loss = tr.clip_loss(*model(x, t))
        loss.backward()
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(args.max_logit_scale))
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    assert losses[0] == pytest.approx(math.log(args.batch_size), abs=0.5)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5]), losses
    assert model.logit_scale.item() <= math.log(100) + 1e-6


def test_main_trains_and_prints_its_lines(tr, small_data, capsys):
    overrides = {**TINY, "num_steps": 6, "warmup_steps": 2, "eval_every": 4, "timing_skip_steps": 2,
                 "data_dir": str(small_data)}
    tr.main([f"{k}={v}" for k, v in overrides.items()])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Running PyTorch {torch.__version__}"
    assert re.fullmatch(r"peak memory allocated: \d+ MiB reserved: \d+ MiB", lines[-1])
    train = [TRAIN_LINE.match(s) for s in lines if TRAIN_LINE.match(s)]
    val = [VAL_LINE.match(s) for s in lines if VAL_LINE.match(s)]
    assert [int(m[1]) for m in train] == list(range(1, 7)) and all(int(m[2]) == 6 for m in train)
    assert all(np.isfinite(float(m[3])) for m in train)
    assert [m[7] for m in train[:2]] == ["nan", "nan"] and all(m[7] != "nan" for m in train[2:])
    assert [int(m[1]) for m in val] == [4, 6] and all(0 <= float(m[4]) <= 1 for m in val)
    with pytest.raises(SystemExit, match="context_length"):
        tr.main([f"{k}={v}" for k, v in overrides.items()] + ["context_length=8"])
