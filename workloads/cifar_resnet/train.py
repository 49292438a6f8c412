"""A GPU training program in the style of the airbench CIFAR-10 speedruns (airbench94).

Model: a frozen 2x2 patch-whitening conv (weights from the eigenvectors of the training
patches' covariance, +/- pairs), then three conv groups (conv3x3 -> max-pool 2 -> BatchNorm2d
-> GELU -> conv3x3 -> BatchNorm2d -> GELU), a global 3x3 max-pool, a bias-free linear head
and a fixed output scale. Loss: label-smoothed cross-entropy. Optimizer: SGD with Nesterov
momentum and decoupled-looking weight decay (torch's L2 form), a triangular lr schedule
(linear warm-up, then linear decay). Precision: bf16 autocast around the forward, model and
inputs in channels_last. Data: the whole image set lives on the device; random flips and
random translations (reflect-pad + crop) are done there with tensor ops, batch by batch.

It is written for device "cuda" and does not run on a machine without one: TrainBridge
ports it (device strings, `torch.cuda.*`, pinned memory) to the target.

    python train.py [key=value ...]

Every field of `Hyperparameters` can be overridden by a `key=value` argument, converted
with the field's type (int, float, str, bool as true/false/1/0); an unknown key or an
argument without `=` is an error. For example a small run:

    python train.py batch_size=128 width1=32 width2=64 width3=64 whiten_samples=256 num_steps=40

The data is made by `python data/make_data.py` (nothing is downloaded).
"""

import json
import math
import os
import sys
import time
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent  # data_dir is relative to this script's folder
NUM_CLASSES = 10

# -----------------------------------------------------------------------------
# hyperparameters: GPU-sized defaults (one A100/H100, like airbench94)


@dataclass
class Hyperparameters:
    # data
    data_dir: str = "data"  # folder with {train,test}_{images,labels}.npy, relative to this script's folder
    flip: bool = True  # random left-right flips of training images
    translate: int = 2  # random translation of training images, up to this many pixels (reflect-padded)
    # model
    width1: int = 64  # channels of the first conv group
    width2: int = 256  # channels of the second conv group
    width3: int = 256  # channels of the third conv group
    whiten_width: int = 24  # channels of the 2x2 whitening conv: 2 x (3 x 2 x 2) eigenvectors, +/-
    whiten_samples: int = 5000  # training images whose patches estimate the whitening covariance
    output_scale: float = 1 / 9  # logits = scale * head(features), as in airbench
    bn_momentum: float = 0.6  # BatchNorm running-stat momentum (torch convention: weight of the new batch)
    # batch
    batch_size: int = 1024  # images per step
    # schedule
    num_steps: int = 480  # optimizer steps in the whole run (about 10 epochs of 50,000 images)
    warmup_frac: float = 0.23  # fraction of num_steps with linear lr warm-up from warmup_start
    warmup_start: float = 0.2  # lr multiplier at step 0
    final_lr: float = 0.07  # lr multiplier at num_steps (linear decay after the warm-up)
    # optimizer (lr for the mean loss over the batch)
    lr: float = 2.0  # SGD lr at multiplier 1
    momentum: float = 0.85  # Nesterov momentum (dimensionless)
    weight_decay: float = 5e-4  # L2 on conv and linear weights (BatchNorm and biases excluded)
    label_smoothing: float = 0.2  # cross-entropy label smoothing
    # evaluation and logging
    eval_every: int = 0  # steps between test-set evaluations; 0 = only at the last step
    timing_skip_steps: int = 3  # first steps (warm-up) left out of train_time/step_avg
    seed: int = 0  # torch.manual_seed for the weights, the shuffling and the augmentation


def _convert(text: str, kind: type):
    if kind is bool:
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(f"{text!r} is not a bool (true/false/1/0)")
    return kind(text)


def parse_overrides(argv: list[str]) -> Hyperparameters:
    """Hyperparameters with `key=value` overrides applied, each converted with its field's type."""
    hints = typing.get_type_hints(Hyperparameters)
    known = [f.name for f in fields(Hyperparameters)]
    values = {}
    for item in argv:
        key, sep, text = item.partition("=")
        if not sep:
            raise SystemExit(f"argument {item!r} is not key=value; known keys: {', '.join(known)}")
        if key not in known:
            raise SystemExit(f"unknown hyperparameter {key!r}; known keys: {', '.join(known)}")
        try:
            values[key] = _convert(text, hints[key])
        except ValueError as e:
            raise SystemExit(f"{key}={text}: expected {hints[key].__name__} ({e})") from None
    return Hyperparameters(**values)


# -----------------------------------------------------------------------------
# data: the whole set on the device, augmented there


def load_cifar(data_dir: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 (N, 32, 32, 3), labels int64 (N,)) of one split, on the device."""
    folder = Path(HERE, data_dir)
    paths = [folder / f"{split}_images.npy", folder / f"{split}_labels.npy"]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run `python data/make_data.py` first")
    images = torch.from_numpy(np.load(paths[0])).pin_memory()
    labels = torch.from_numpy(np.load(paths[1])).pin_memory()
    if images.dtype != torch.uint8 or images.ndim != 4 or tuple(images.shape[1:]) != (32, 32, 3):
        raise ValueError(f"{paths[0]}: expected uint8 (N, 32, 32, 3), got {images.dtype} {tuple(images.shape)}")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"{paths[1]}: {tuple(labels.shape)} labels for {images.shape[0]} images")
    images = images.to(device="cuda", non_blocking=True)
    labels = labels.to(device="cuda", dtype=torch.int64, non_blocking=True)
    return images, labels


def batch_flip_lr(x: torch.Tensor) -> torch.Tensor:
    """Flip each image of x (B, C, H, W) left-right with probability 1/2."""
    mask = torch.rand(x.shape[0], device=x.device) < 0.5
    return torch.where(mask.view(-1, 1, 1, 1), x.flip(-1), x)


def batch_translate(x: torch.Tensor, r: int) -> torch.Tensor:
    """Shift each image of x (B, C, H, W) by its own random (dy, dx) in [-r, r], reflect-padded."""
    B, C, H, W = x.shape
    padded = F.pad(x, (r, r, r, r), mode="reflect")
    dy = torch.randint(0, 2 * r + 1, (B, 1), device=x.device)
    dx = torch.randint(0, 2 * r + 1, (B, 1), device=x.device)
    rows = torch.arange(H, device=x.device).view(1, H) + dy  # (B, H)
    cols = torch.arange(W, device=x.device).view(1, W) + dx  # (B, W)
    b = torch.arange(B, device=x.device).view(B, 1, 1)
    out = padded[b, :, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C): advanced dims first
    return out.permute(0, 3, 1, 2)  # (B, C, H, W), channels_last in memory


class CifarLoader:
    """Normalised float (B, 3, 32, 32) channels_last images and int64 labels, on the device.

    Training: a fresh random permutation every epoch, only full batches, flips and
    translations per batch; iterating never ends. Test: one pass in order, no augmentation,
    the last batch may be smaller.
    """

    def __init__(self, data_dir: str, split: str, batch_size: int, train: bool,
                 flip: bool = False, translate: int = 0, mean=None, std=None):
        self.images, self.labels = load_cifar(data_dir, split)
        self.batch_size, self.train, self.flip, self.translate = batch_size, train, flip, translate
        if len(self.images) < batch_size and train:
            raise ValueError(f"{split}: {len(self.images)} images, fewer than one batch ({batch_size})")
        if mean is None:  # per-channel statistics of this split, in 0-1 units
            pixels = self.images.float().div(255).view(-1, 3)
            mean, std = pixels.mean(0), pixels.std(0)
        self.mean, self.std = mean, std
        self.epoch = 0

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        x = images.float().div(255).permute(0, 3, 1, 2)  # NHWC -> NCHW view: channels_last memory
        return (x - self.mean.view(1, 3, 1, 1)) / self.std.view(1, 3, 1, 1)

    def __iter__(self):
        n, bs = len(self.images), self.batch_size
        while True:
            order = torch.randperm(n, device=self.images.device) if self.train else torch.arange(n, device=self.images.device)
            stop = n - bs + 1 if self.train else n
            for i in range(0, stop, bs):
                idx = order[i:i + bs]
                x = self.normalize(self.images[idx])
                if self.flip:
                    x = batch_flip_lr(x)
                if self.translate > 0:
                    x = batch_translate(x, self.translate)
                yield x.contiguous(memory_format=torch.channels_last), self.labels[idx]
            self.epoch += 1
            if not self.train:
                return


# -----------------------------------------------------------------------------
# the model


def get_patches(x: torch.Tensor, patch_shape: tuple[int, int]) -> torch.Tensor:
    """Every (C, h, w) patch of x (B, C, H, W), stride 1, as (B * n_patches, C, h, w)."""
    c, (h, w) = x.shape[1], patch_shape
    return x.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()


@torch.no_grad()
def init_whitening_conv(layer: nn.Conv2d, images: torch.Tensor, eps: float = 5e-4) -> None:
    """Set the conv's filters to the patch covariance's eigenvectors / sqrt(eigenvalue), +/-."""
    patches = get_patches(images, patch_shape=layer.weight.shape[2:])
    n, c, h, w = patches.shape
    flat = patches.view(n, -1)
    covariance = (flat.T @ flat) / n
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance, UPLO="U")
    scaled = eigenvectors.T.reshape(-1, c, h, w) / torch.sqrt(eigenvalues.view(-1, 1, 1, 1) + eps)
    layer.weight.copy_(torch.cat((scaled, -scaled)))


class ConvGroup(nn.Module):
    """conv3x3 -> max-pool 2 -> BN -> GELU -> conv3x3 -> BN -> GELU (airbench's block)."""

    def __init__(self, c_in: int, c_out: int, bn_momentum: float):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = nn.BatchNorm2d(c_out, momentum=bn_momentum, eps=1e-12)
        self.conv2 = nn.Conv2d(c_out, c_out, kernel_size=3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(c_out, momentum=bn_momentum, eps=1e-12)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        x = self.activ(self.norm2(self.conv2(x)))
        return x


class CifarNet(nn.Module):
    """Whitening conv (2x2, no padding: 32 -> 31), three conv groups (31 -> 15 -> 7 -> 3), 3x3 max-pool, head."""

    def __init__(self, widths: tuple[int, int, int], whiten_width: int = 24, output_scale: float = 1 / 9,
                 bn_momentum: float = 0.6):
        super().__init__()
        self.output_scale = output_scale
        self.whiten = nn.Conv2d(3, whiten_width, kernel_size=2, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)  # set from the data, then frozen
        self.activ = nn.GELU()
        self.layers = nn.Sequential(
            ConvGroup(whiten_width, widths[0], bn_momentum),
            ConvGroup(widths[0], widths[1], bn_momentum),
            ConvGroup(widths[1], widths[2], bn_momentum),
        )
        self.pool = nn.MaxPool2d(3)
        self.head = nn.Linear(widths[2], NUM_CLASSES, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, 10) of normalised images x (B, 3, 32, 32)."""
        x = self.activ(self.whiten(x))
        x = self.layers(x)
        x = self.pool(x).flatten(1)
        return self.output_scale * self.head(x)


def build_optimizer(model: CifarNet, args: Hyperparameters) -> torch.optim.SGD:
    """SGD + Nesterov; weight decay on conv/linear weights only, none on BN and biases."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trainable if p.ndim >= 2]
    no_decay = [p for p in trainable if p.ndim < 2]
    return torch.optim.SGD(
        [dict(params=decay, weight_decay=args.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=args.lr, momentum=args.momentum, nesterov=True,
    )


def lr_multiplier(step: int, args: Hyperparameters) -> float:
    """Triangular schedule: warmup_start -> 1 over warmup_frac, then linearly to final_lr at num_steps."""
    warmup = max(1, round(args.warmup_frac * args.num_steps))
    if step < warmup:
        return args.warmup_start + (1 - args.warmup_start) * step / warmup
    frac = min(1.0, (step - warmup) / max(1, args.num_steps - warmup))
    return 1 + (args.final_lr - 1) * frac


@torch.no_grad()
def evaluate(model: nn.Module, loader: CifarLoader) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over the whole test split."""
    model.eval()
    loss_sum = torch.zeros((), device=loader.images.device)
    correct = torch.zeros((), device=loader.images.device)
    for x, y in loader:
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(1) == y).sum()
    model.train()
    n = len(loader.images)
    return loss_sum.item() / n, correct.item() / n  # .item(): host-device sync, once per evaluation


# -----------------------------------------------------------------------------
# training


def main(argv: list[str] | None = None) -> None:
    args = parse_overrides(sys.argv[1:] if argv is None else argv)
    device = "cuda"
    torch.backends.cudnn.benchmark = True
    print(f"Running PyTorch {torch.__version__}", flush=True)
    print(f"hyperparameters: {json.dumps(asdict(args))}", flush=True)

    # ---- data
    torch.manual_seed(args.seed)
    train_loader = CifarLoader(args.data_dir, "train", args.batch_size, train=True,
                               flip=args.flip, translate=args.translate)
    test_loader = CifarLoader(args.data_dir, "test", args.batch_size, train=False,
                              mean=train_loader.mean, std=train_loader.std)
    steps_per_epoch = len(train_loader.images) // args.batch_size
    print(f"data: {len(train_loader.images)} train images, {len(test_loader.images)} test images, "
          f"{steps_per_epoch} steps/epoch", flush=True)

    # ---- model and optimizer
    model = CifarNet((args.width1, args.width2, args.width3), args.whiten_width, args.output_scale,
                     args.bn_momentum)
    model = model.cuda().to(memory_format=torch.channels_last)
    whiten_images = train_loader.normalize(train_loader.images[:args.whiten_samples])
    init_whitening_conv(model.whiten, whiten_images)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"model: {n_params / 1e6:.3f}M trainable parameters", flush=True)
    optimizer = build_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, args))

    # ---- training loop
    model.train()
    train_iter = iter(train_loader)
    training_time_ms = 0.0  # milliseconds of training, evaluation excluded
    torch.cuda.synchronize()  # host-device sync: start the clock with the device idle
    t0 = time.perf_counter()
    for step in range(args.num_steps + 1):
        last_step = step == args.num_steps
        if step == args.timing_skip_steps:  # the first steps (cudnn autotuning, allocator) are not timed
            training_time_ms, t0 = 0.0, time.perf_counter()
        timed_steps = step - args.timing_skip_steps  # timed steps completed before this one

        # -- evaluation: every eval_every steps and at the end, off the clock
        if last_step or (args.eval_every > 0 and step > 0 and step % args.eval_every == 0):
            torch.cuda.synchronize()  # host-device sync: stop the clock
            training_time_ms += 1000 * (time.perf_counter() - t0)
            test_loss, test_acc = evaluate(model, test_loader)
            step_avg = training_time_ms / timed_steps if timed_steps > 0 else float("nan")
            print(f"step:{step}/{args.num_steps} test_loss:{test_loss:.4f} test_acc:{test_acc:.4f} "
                  f"train_time:{training_time_ms:.0f}ms step_avg:{step_avg:.2f}ms", flush=True)
            torch.cuda.synchronize()  # host-device sync: restart the clock
            t0 = time.perf_counter()
        if last_step:
            break

        # -- one training step
        inputs, labels = next(train_iter)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(inputs)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=args.label_smoothing)
        loss.backward()
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)

        # -- log: loss.item() is a host-device sync, every step
        train_loss = loss.item()
        approx_time_ms = training_time_ms + 1000 * (time.perf_counter() - t0)
        step_avg = approx_time_ms / (timed_steps + 1) if timed_steps >= 0 else float("nan")
        print(f"step:{step + 1}/{args.num_steps} epoch:{train_loader.epoch} train_loss:{train_loss:.4f} "
              f"lr:{scheduler.get_last_lr()[0]:.4f} train_time:{approx_time_ms:.0f}ms step_avg:{step_avg:.2f}ms",
              flush=True)

    print(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB "
          f"reserved: {torch.cuda.max_memory_reserved() // 1024 // 1024} MiB", flush=True)


if __name__ == "__main__":
    main()
