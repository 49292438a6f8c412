"""A GPU training program for contrastive image-text pre-training, in the style of CLIP.

Model: a ViT image tower (conv patch embedding, class token, learned position embedding,
pre-LN blocks with nn.LayerNorm, GELU MLP, multi-head attention written out as
`q @ k^T * scale`, softmax, `@ v`, final LayerNorm on the class token) and a causal text
transformer (token + position embeddings, the same blocks with an additive causal mask,
features taken at the <eot> token found by `argmax`, as in CLIP). Linear projections map
both to a joint space; features are L2-normalised. Loss: InfoNCE, the symmetric
cross-entropy of the image-text similarity matrix scaled by a learned temperature
(`logit_scale`, initialised to log(1/0.07), clamped to [0, log 100] after each step).
Optimizer: AdamW (no weight decay on gains, biases, embeddings and logit_scale), linear
warm-up then cosine decay. Precision: bf16 autocast around the forward.

It is written for device "cuda" and does not run on a machine without one: TrainBridge
ports it (device strings, `torch.cuda.*`, pinned memory) to the target.

    python train.py [key=value ...]

Every field of `Hyperparameters` can be overridden by a `key=value` argument, converted
with the field's type (int, float, str, bool as true/false/1/0); an unknown key or an
argument without `=` is an error. For example a small run:

    python train.py batch_size=64 vision_width=128 vision_layers=3 text_width=128 text_layers=3 num_steps=40

The data is made by `python data/make_data.py` (nothing is downloaded).
"""

import json
import math
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

# -----------------------------------------------------------------------------
# hyperparameters: GPU-sized defaults (one GPU)


@dataclass
class Hyperparameters:
    # data
    data_dir: str = "data"  # folder with {train,val}_{images,tokens}.npy and vocab.json, relative to this script
    # model: image tower
    image_size: int = 32  # input images are image_size x image_size RGB
    patch_size: int = 4  # pixels per patch side: (32 / 4)^2 = 64 patches + a class token
    vision_width: int = 384  # channels of the ViT
    vision_layers: int = 6  # ViT blocks
    vision_heads: int = 6  # attention heads per ViT block
    # model: text tower
    text_width: int = 256  # channels of the text transformer
    text_layers: int = 4  # text blocks
    text_heads: int = 4  # attention heads per text block
    context_length: int = 16  # caption tokens (must match the data)
    # model: joint space
    embed_dim: int = 256  # joint embedding width
    mlp_ratio: int = 4  # MLP hidden width / model width
    # batch
    batch_size: int = 512  # image-caption pairs per step (the contrastive negatives are the rest of the batch)
    # schedule
    num_steps: int = 2000  # optimizer steps in the whole run
    warmup_steps: int = 100  # linear lr warm-up from 0, in steps; cosine decay to 0 at num_steps after it
    # optimizer
    lr: float = 5e-4  # AdamW peak lr
    weight_decay: float = 0.2  # AdamW decoupled weight decay on matrices
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    init_temperature: float = 0.07  # logit_scale starts at log(1 / init_temperature)
    max_logit_scale: float = 100.0  # exp(logit_scale) is clamped to at most this
    # evaluation and logging
    eval_every: int = 0  # steps between validations; 0 = only at the last step
    timing_skip_steps: int = 3  # first steps (warm-up) left out of train_time/step_avg
    seed: int = 0  # torch.manual_seed for the weights and the shuffling


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
# data: image-caption pairs, the whole set on the device

IMAGE_MEAN = (0.5, 0.5, 0.5)  # pixel normalisation, 0-1 units
IMAGE_STD = (0.25, 0.25, 0.25)


def load_pairs(data_dir: str, split: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(images uint8 (N, H, W, 3), tokens int64 (N, L), vocabulary) of one split, on the device."""
    folder = Path(HERE, data_dir)
    paths = [folder / f"{split}_images.npy", folder / f"{split}_tokens.npy", folder / "vocab.json"]
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run `python data/make_data.py` first")
    images = torch.from_numpy(np.load(paths[0])).pin_memory()
    tokens = torch.from_numpy(np.load(paths[1])).pin_memory()
    vocab = json.loads(paths[2].read_text())["tokens"]
    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(f"{paths[0]}: expected uint8 (N, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    if tokens.ndim != 2 or tokens.shape[0] != images.shape[0]:
        raise ValueError(f"{paths[1]}: {tuple(tokens.shape)} tokens for {images.shape[0]} images")
    if int(tokens.max()) >= len(vocab):
        raise ValueError(f"{paths[1]}: token id {int(tokens.max())} outside the {len(vocab)}-word vocabulary")
    images = images.to(device="cuda", non_blocking=True)
    tokens = tokens.to(device="cuda", dtype=torch.int64, non_blocking=True)
    return images, tokens, vocab


def normalize_images(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W), normalised with IMAGE_MEAN / IMAGE_STD."""
    x = images.permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(IMAGE_MEAN, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD, device=x.device).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous()


def pair_batches(images: torch.Tensor, tokens: torch.Tensor, batch_size: int, train: bool):
    """Yield (images float (B, 3, H, W), tokens int64 (B, L)) on the device.

    Training: a fresh random permutation each epoch, only full batches, forever.
    Validation: one pass in order, the last batch may be smaller.
    """
    n = len(images)
    if train and n < batch_size:
        raise ValueError(f"{n} pairs, fewer than one batch ({batch_size})")
    while True:
        order = torch.randperm(n, device=images.device) if train else torch.arange(n, device=images.device)
        stop = n - batch_size + 1 if train else n
        for i in range(0, stop, batch_size):
            idx = order[i:i + batch_size]
            yield normalize_images(images[idx]), tokens[idx]
        if not train:
            return


# -----------------------------------------------------------------------------
# the model


class Attention(nn.Module):
    """Multi-head self-attention, written out; an optional additive mask (T, T)."""

    def __init__(self, dim: int, n_head: int):
        super().__init__()
        assert dim % n_head == 0
        self.n_head, self.head_dim = n_head, dim // n_head
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, T, T)
        if mask is not None:
            att = att + mask
        att = att.softmax(dim=-1)
        y = att @ v  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.gelu = nn.GELU()
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, n_head: int, mlp_ratio: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, n_head)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        x = x + self.mlp(self.ln_2(x))
        return x


class VisionTransformer(nn.Module):
    def __init__(self, image_size: int, patch_size: int, width: int, layers: int, heads: int,
                 mlp_ratio: int, embed_dim: int):
        super().__init__()
        assert image_size % patch_size == 0
        n_patches = (image_size // patch_size) ** 2
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        scale = width ** -0.5
        self.class_embedding = nn.Parameter(scale * torch.randn(width))
        self.positional_embedding = nn.Parameter(scale * torch.randn(n_patches + 1, width))
        self.ln_pre = nn.LayerNorm(width)
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio) for _ in range(layers)])
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(scale * torch.randn(width, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Image features (B, embed_dim) of images x (B, 3, H, W)."""
        x = self.conv1(x)  # (B, width, H / p, W / p)
        x = x.flatten(2).transpose(1, 2)  # (B, n_patches, width)
        cls = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls, x], dim=1) + self.positional_embedding.to(x.dtype)
        x = self.ln_pre(x)
        for block in self.blocks:
            x = block(x)
        x = self.ln_post(x[:, 0])  # the class token
        return x @ self.proj


class TextTransformer(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, width: int, layers: int, heads: int,
                 mlp_ratio: int, embed_dim: int):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(context_length, width))
        self.blocks = nn.ModuleList([Block(width, heads, mlp_ratio) for _ in range(layers)])
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(width ** -0.5 * torch.randn(width, embed_dim))
        mask = torch.full((context_length, context_length), float("-inf")).triu(1)  # additive causal mask
        self.register_buffer("attn_mask", mask, persistent=False)

    def forward(self, text: torch.Tensor) -> torch.Tensor:
        """Text features (B, embed_dim) of token ids (B, L): the features at each caption's <eot>."""
        T = text.shape[1]
        x = self.token_embedding(text) + self.positional_embedding[:T]
        mask = self.attn_mask[:T, :T]
        for block in self.blocks:
            x = block(x, mask)
        x = self.ln_final(x)
        eot = text.argmax(dim=-1)  # <eot> has the largest id
        x = x[torch.arange(x.shape[0], device=x.device), eot]
        return x @ self.text_projection


class CLIP(nn.Module):
    def __init__(self, args: "Hyperparameters", vocab_size: int):
        super().__init__()
        self.visual = VisionTransformer(args.image_size, args.patch_size, args.vision_width, args.vision_layers,
                                        args.vision_heads, args.mlp_ratio, args.embed_dim)
        self.text = TextTransformer(vocab_size, args.context_length, args.text_width, args.text_layers,
                                    args.text_heads, args.mlp_ratio, args.embed_dim)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / args.init_temperature)))

    def forward(self, image: torch.Tensor, text: torch.Tensor):
        """(normalised image features, normalised text features, exp(logit_scale))."""
        image_features = F.normalize(self.visual(image), dim=-1)
        text_features = F.normalize(self.text(text), dim=-1)
        return image_features, text_features, self.logit_scale.exp()


def clip_loss(image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """InfoNCE: mean of the image->text and text->image cross-entropies; pair i matches pair i."""
    logits_per_image = logit_scale * image_features.float() @ text_features.float().T
    labels = torch.arange(logits_per_image.shape[0], device=logits_per_image.device)
    return (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_image.T, labels)) / 2


def build_optimizer(model: CLIP, args: Hyperparameters) -> torch.optim.AdamW:
    """AdamW; weight decay on 2-D+ weights only (not on gains, biases, embeddings, logit_scale)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        exclude = p.ndim < 2 or "embedding" in name or "logit_scale" in name
        (no_decay if exclude else decay).append(p)
    return torch.optim.AdamW(
        [dict(params=decay, weight_decay=args.weight_decay), dict(params=no_decay, weight_decay=0.0)],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
    )


def lr_multiplier(step: int, args: Hyperparameters) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to 0 at num_steps."""
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    frac = min(1.0, (step - args.warmup_steps) / max(1, args.num_steps - args.warmup_steps))
    return 0.5 * (1 + math.cos(math.pi * frac))


@torch.no_grad()
def evaluate(model: CLIP, images: torch.Tensor, tokens: torch.Tensor, batch_size: int) -> tuple[float, float]:
    """(contrastive loss, image->text top-1 accuracy) on the validation pairs, batch by batch."""
    model.eval()
    loss_sum = torch.zeros((), device=images.device)
    correct = torch.zeros((), device=images.device)
    for x, t in pair_batches(images, tokens, batch_size, train=False):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            image_features, text_features, logit_scale = model(x, t)
        loss_sum += clip_loss(image_features, text_features, logit_scale) * len(x)
        similarity = image_features.float() @ text_features.float().T
        # a caption identical to the right one counts as right (captions repeat)
        picked = similarity.argmax(dim=1)
        correct += (t[picked] == t).all(dim=1).sum()
    model.train()
    n = len(images)
    return loss_sum.item() / n, correct.item() / n  # .item(): host-device sync, once per evaluation


# -----------------------------------------------------------------------------
# training


def main(argv: list[str] | None = None) -> None:
    args = parse_overrides(sys.argv[1:] if argv is None else argv)
    device = "cuda"
    print(f"Running PyTorch {torch.__version__}", flush=True)
    print(f"hyperparameters: {json.dumps(asdict(args))}", flush=True)

    # ---- data
    torch.manual_seed(args.seed)
    train_images, train_tokens, vocab = load_pairs(args.data_dir, "train")
    val_images, val_tokens, _ = load_pairs(args.data_dir, "val")
    if train_tokens.shape[1] != args.context_length or train_images.shape[1] != args.image_size:
        raise SystemExit(f"data has {train_tokens.shape[1]}-token captions and {train_images.shape[1]}px images; "
                         f"context_length={args.context_length}, image_size={args.image_size}")
    train_loader = pair_batches(train_images, train_tokens, args.batch_size, train=True)
    print(f"data: {len(train_images)} train pairs, {len(val_images)} val pairs, vocabulary {len(vocab)}, "
          f"{len(train_images) // args.batch_size} steps/epoch", flush=True)

    # ---- model and optimizer
    model = CLIP(args, len(vocab)).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.3f}M parameters", flush=True)
    optimizer = build_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, args))

    # ---- training loop
    model.train()
    training_time_ms = 0.0  # milliseconds of training, evaluation excluded
    torch.cuda.synchronize()  # host-device sync: start the clock with the device idle
    t0 = time.perf_counter()
    for step in range(args.num_steps + 1):
        last_step = step == args.num_steps
        if step == args.timing_skip_steps:  # the first steps (allocator, caches) are not timed
            training_time_ms, t0 = 0.0, time.perf_counter()
        timed_steps = step - args.timing_skip_steps  # timed steps completed before this one

        # -- evaluation: every eval_every steps and at the end, off the clock
        if last_step or (args.eval_every > 0 and step > 0 and step % args.eval_every == 0):
            torch.cuda.synchronize()  # host-device sync: stop the clock
            training_time_ms += 1000 * (time.perf_counter() - t0)
            val_loss, val_acc = evaluate(model, val_images, val_tokens, args.batch_size)
            step_avg = training_time_ms / timed_steps if timed_steps > 0 else float("nan")
            print(f"step:{step}/{args.num_steps} val_loss:{val_loss:.4f} val_i2t_acc:{val_acc:.4f} "
                  f"train_time:{training_time_ms:.0f}ms step_avg:{step_avg:.2f}ms", flush=True)
            torch.cuda.synchronize()  # host-device sync: restart the clock
            t0 = time.perf_counter()
        if last_step:
            break

        # -- one training step
        images, tokens = next(train_loader)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            image_features, text_features, logit_scale = model(images, tokens)
        loss = clip_loss(image_features, text_features, logit_scale)
        loss.backward()
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)
        with torch.no_grad():  # CLIP: temperature kept in [1/100, 1]
            model.logit_scale.clamp_(0, math.log(args.max_logit_scale))

        # -- log: loss.item() is a host-device sync, every step
        train_loss = loss.item()
        approx_time_ms = training_time_ms + 1000 * (time.perf_counter() - t0)
        step_avg = approx_time_ms / (timed_steps + 1) if timed_steps >= 0 else float("nan")
        print(f"step:{step + 1}/{args.num_steps} train_loss:{train_loss:.4f} "
              f"logit_scale:{logit_scale.item():.2f} lr:{scheduler.get_last_lr()[0]:.2e} "
              f"train_time:{approx_time_ms:.0f}ms step_avg:{step_avg:.2f}ms", flush=True)

    print(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB "
          f"reserved: {torch.cuda.max_memory_reserved() // 1024 // 1024} MiB", flush=True)


if __name__ == "__main__":
    main()
