"""The cifar_resnet workload: data maker, manifest, and a CPU copy of the program.

`train.py` is written for CUDA and is never edited here: the tests import a temporary copy
with this file's own small cuda->cpu mapping (`_cpu_source`), independent of TrainBridge's
port, and with autocast disabled so everything runs fp32.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainbridge.workload import load_workload

from tests.kits.paths import WORKLOADS

WORKLOAD = WORKLOADS / "cifar_resnet"
SCRIPT = WORKLOAD / "train.py"

TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) epoch:(\d+) train_loss:([\d.]+) lr:([\d.]+) "
                        r"train_time:(\d+)ms step_avg:([\d.]+|nan)ms$")
EVAL_LINE = re.compile(r"^step:(\d+)/(\d+) test_loss:([\d.]+) test_acc:([\d.]+) train_time:(\d+)ms "
                       r"step_avg:([\d.]+|nan)ms$")
TINY = dict(batch_size=32, width1=8, width2=16, width3=16, whiten_samples=32)


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
    folder = tmp_path_factory.mktemp("cifar_cpu")
    (folder / "train.py").write_text(_cpu_source(SCRIPT.read_text()))
    module = _import(folder / "train.py", "_cifar_train_cpu")
    yield module
    sys.modules.pop("_cifar_train_cpu", None)


@pytest.fixture(scope="module")
def mk():
    module = _import(WORKLOAD / "data" / "make_data.py", "_cifar_make_data")
    yield module
    sys.modules.pop("_cifar_make_data", None)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory, mk):
    out = tmp_path_factory.mktemp("cifar_data")
    mk.main(["--train", "320", "--test", "64", "--out-dir", str(out)])
    return out


# ------------------------------------------------------------------------ data ----

def test_make_data_is_deterministic_idempotent_and_cifar_shaped(tmp_path, mk, capsys):
    argv = ["--train", "60", "--test", "20", "--out-dir", str(tmp_path)]
    mk.main(argv)
    first = {p.name: p.read_bytes() for p in tmp_path.glob("*.npy")}
    assert sorted(first) == sorted(mk.FILES)
    mk.main(argv)
    assert "up to date" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.npy")} == first
    images, labels = np.load(tmp_path / "train_images.npy"), np.load(tmp_path / "train_labels.npy")
    assert images.dtype == np.uint8 and images.shape == (60, 32, 32, 3)
    assert labels.dtype == np.int64 and np.bincount(labels).tolist() == [6] * 10
    assert np.load(tmp_path / "test_images.npy").shape == (20, 32, 32, 3)
    mk.main(argv[:-1] + [str(tmp_path / "other")])  # same seed, another folder: the same bytes
    assert (tmp_path / "other" / "train_images.npy").read_bytes() == first["train_images.npy"]


def test_classes_are_separable_by_their_templates(mk):
    rng = np.random.default_rng(0)
    templates = mk.class_templates(rng)
    images, labels = mk.make_split(200, templates, rng, max_shift=0, noise=0.05)
    x = images.reshape(200, -1) / 255.0
    t = templates.reshape(10, -1)
    nearest = ((x[:, None] - t[None]) ** 2).sum(-1).argmin(1)
    assert (nearest == labels).mean() > 0.6  # learnable (a nearest-template rule already works unshifted)


# -------------------------------------------------------------------- manifest ----

def test_manifest_loads_and_its_args_are_valid_overrides(tr):
    wl = load_workload(WORKLOAD)
    m = wl.manifest
    assert m.entry == "train.py" and m.native_device == "cuda"
    args = tr.parse_overrides(m.args)
    assert m.work.unit == "samples" and m.work.per_step == args.batch_size
    assert args.eval_every == 0 and args.num_steps > 5 * (m.steps.warmup + m.steps.measured)
    assert m.steps.warmup == 3 and m.correctness.steps <= m.steps.warmup + m.steps.measured
    assert m.prepare.command == ["python", "data/make_data.py"]
    assert sorted(Path(p).name for p in m.prepare.creates) == sorted(_import_files())
    tree = ast.parse(SCRIPT.read_text())
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    for region in m.protected:
        assert set(region.symbols) <= defined, set(region.symbols) - defined
        assert set(region.names) <= assigned, set(region.names) - assigned


def _import_files():
    return ast.literal_eval(next(
        n.value for n in ast.parse((WORKLOAD / "data" / "make_data.py").read_text()).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FILES"))


def test_the_program_does_nothing_on_import_and_is_written_for_cuda():
    text = SCRIPT.read_text()
    tree = ast.parse(text)
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.Expr)
    for node in tree.body:
        if isinstance(node, ast.If):
            assert ast.unparse(node.test) == "__name__ == '__main__'"
        else:
            assert isinstance(node, allowed), ast.unparse(node)
    for idiom in ('.cuda()', 'device_type="cuda", dtype=torch.bfloat16', "torch.cuda.synchronize()",
                  "channels_last", "pin_memory()", "nesterov=True", "label_smoothing"):
        assert idiom in text, idiom


def test_overrides_are_typed_and_unknown_keys_fail(tr):
    args = tr.parse_overrides(["width1=8", "lr=0.5", "flip=false"])
    assert (args.width1, args.lr, args.flip) == (8, 0.5, False)
    assert tr.parse_overrides([]) == tr.Hyperparameters()
    with pytest.raises(SystemExit, match="unknown hyperparameter 'widht1'"):
        tr.parse_overrides(["widht1=3"])
    with pytest.raises(SystemExit, match="not key=value"):
        tr.parse_overrides(["width1"])
    with pytest.raises(SystemExit, match="expected int"):
        tr.parse_overrides(["batch_size=3.5"])


def test_lr_schedule_is_triangular(tr):
    args = tr.Hyperparameters(num_steps=100, warmup_frac=0.2, warmup_start=0.2, final_lr=0.1)
    lr = [tr.lr_multiplier(s, args) for s in range(101)]
    assert lr[0] == pytest.approx(0.2) and lr[20] == pytest.approx(1.0)
    assert lr[60] == pytest.approx(0.55) and lr[100] == pytest.approx(0.1)
    assert max(lr) == pytest.approx(1.0)


# ------------------------------------------------------------------ data path ----

def test_augmentation_flips_and_translates_per_image(tr):
    torch.manual_seed(0)
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    y = tr.batch_translate(x, 2)
    assert y.shape == x.shape
    xp = torch.nn.functional.pad(x, (2, 2, 2, 2), mode="reflect")
    for i in range(2):  # each output is some 8x8 window of its reflect-padded input
        windows = [xp[i, :, a:a + 8, b:b + 8] for a in range(5) for b in range(5)]
        assert any(torch.equal(y[i], w) for w in windows)
    assert torch.equal(tr.batch_translate(x, 0), x)
    flipped = tr.batch_flip_lr(x.repeat(16, 1, 1, 1))
    same = [torch.equal(f, x[i % 2]) for i, f in enumerate(flipped)]
    mirrored = [torch.equal(f, x[i % 2].flip(-1)) for i, f in enumerate(flipped)]
    assert all(s or m for s, m in zip(same, mirrored)) and any(same) and any(mirrored)


def test_loader_batches_are_normalised_channels_last_and_cycle(tr, small_data):
    torch.manual_seed(0)
    loader = tr.CifarLoader(str(small_data), "train", 64, train=True, flip=True, translate=2)
    it = iter(loader)
    x, y = next(it)
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert x.is_contiguous(memory_format=torch.channels_last)
    for _ in range(5):  # 320 / 64 = 5 batches an epoch
        next(it)
    assert loader.epoch == 1
    test = tr.CifarLoader(str(small_data), "test", 48, train=False, mean=loader.mean, std=loader.std)
    sizes = [len(b[0]) for b in test]
    assert sizes == [48, 16]
    with pytest.raises(FileNotFoundError, match="make_data.py"):
        tr.load_cifar(str(small_data / "nowhere"), "train")


# ----------------------------------------------------------------------- model ----

def test_whitening_conv_whitens_patches(tr, small_data):
    loader = tr.CifarLoader(str(small_data), "train", 64, train=True)
    images = loader.normalize(loader.images[:64])
    conv = torch.nn.Conv2d(3, 24, kernel_size=2, bias=False)
    tr.init_whitening_conv(conv, images, eps=0.0)
    out = conv(images)[:, :12].permute(0, 2, 3, 1).reshape(-1, 12)  # the + half
    cov = out.T @ out / len(out)
    assert torch.allclose(cov, torch.eye(12), atol=2e-2)


def test_tiny_model_learns(tr, small_data):
    torch.manual_seed(0)
    args = tr.Hyperparameters(**TINY, num_steps=25, lr=1.0)
    loader = tr.CifarLoader(str(small_data), "train", args.batch_size, train=True, flip=True, translate=2)
    model = tr.CifarNet((args.width1, args.width2, args.width3)).to(memory_format=torch.channels_last)
    tr.init_whitening_conv(model.whiten, loader.normalize(loader.images[:args.whiten_samples]))
    assert model.whiten.weight.requires_grad is False
    optimizer = tr.build_optimizer(model, args)
    n_opt = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    assert n_opt == sum(p.numel() for p in model.parameters() if p.requires_grad)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: tr.lr_multiplier(s, args))
    losses, it = [], iter(loader)
    for _ in range(args.num_steps):
        x, y = next(it)
        loss = torch.nn.functional.cross_entropy(model(x), y, label_smoothing=args.label_smoothing)
        loss.backward()
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(np.isfinite(losses))
    assert losses[0] == pytest.approx(np.log(10), abs=0.1)  # output_scale 1/9: near-uniform logits
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses


def test_main_trains_and_prints_its_lines(tmp_path, tr, small_data, capsys):
    overrides = {**TINY, "num_steps": 6, "eval_every": 4, "timing_skip_steps": 2, "data_dir": str(small_data)}
    tr.main([f"{k}={v}" for k, v in overrides.items()])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"Running PyTorch {torch.__version__}"
    assert re.fullmatch(r"peak memory allocated: \d+ MiB reserved: \d+ MiB", lines[-1])
    train = [TRAIN_LINE.match(s) for s in lines if TRAIN_LINE.match(s)]
    evals = [EVAL_LINE.match(s) for s in lines if EVAL_LINE.match(s)]
    assert [int(m[1]) for m in train] == list(range(1, 7)) and all(int(m[2]) == 6 for m in train)
    assert all(np.isfinite(float(m[4])) for m in train)
    assert [m[7] for m in train[:2]] == ["nan", "nan"] and all(m[7] != "nan" for m in train[2:])
    assert [int(m[1]) for m in evals] == [4, 6] and all(0 <= float(m[4]) <= 1 for m in evals)
