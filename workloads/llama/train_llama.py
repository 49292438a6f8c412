"""A GPU pretraining program for a Llama-style decoder, written like Meta's reference model.

Model (Meta's `llama/model.py`, Llama 2 / Llama 3): pre-norm blocks with `RMSNorm` modules
(learned weight; the norm computed in fp32 and cast back), rotary embeddings in Meta's
complex style (`precompute_freqs_cis`, `torch.polar`, `view_as_complex`: interleaved pairs),
grouped-query attention (n_kv_head < n_head, k/v repeated by `repeat_kv`), attention written
out (q @ k^T * scale, causal mask, softmax, @ v), SwiGLU feed-forward w2(silu(w1 x) * w3 x)
with Meta's hidden-size rule, untied embedding and output head, no biases.
Training: AdamW (betas 0.9/0.95, weight decay on 2-D parameters only), linear warm-up then
cosine decay to min_lr_ratio (LambdaLR), gradient clipping by global norm, bf16 autocast
around the forward. Data: token shards in the Modded-NanoGPT records' `.bin` format.
Log: `step:N/M train_loss:... train_time:...ms step_avg:...ms lr:... grad_norm:...` lines.

It is written for device "cuda" and does not run on a machine without one: TrainBridge
ports it (device strings, `torch.cuda.*`, pinned memory) to the target.

    python train_llama.py [key=value ...]

Every field of `Hyperparameters` can be overridden by a `key=value` argument, converted
with the field's type (int, float, str, bool as true/false/1/0); an unknown key or an
argument without `=` is an error. For example a small run:

    python train_llama.py n_layer=4 n_embd=256 n_head=8 n_kv_head=2 vocab_size=256 seq_len=256 num_iterations=40

The shards are made by `python data/make_shards.py` (nothing is downloaded).
"""

import glob
import json
import math
import os
import sys
import time
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent  # data globs are relative to this script's folder

# -----------------------------------------------------------------------------
# hyperparameters: GPU-sized defaults (~0.85B parameters; Llama 3.2 1B's layers, width, heads)


@dataclass
class Hyperparameters:
    # data
    train_files: str = "data/train_*.bin"  # glob of training shards, relative to this script's folder
    val_files: str = "data/val_*.bin"  # glob of validation shards, relative to this script's folder
    val_tokens: int = 1_048_576  # tokens per validation pass
    # model
    vocab_size: int = 32000  # token ids (Llama 2's SentencePiece vocabulary)
    n_layer: int = 16  # transformer blocks
    n_head: int = 32  # query heads per block
    n_kv_head: int = 8  # key/value heads per block (grouped-query attention); divides n_head
    n_embd: int = 2048  # model width in channels; head dim = n_embd / n_head = 64
    multiple_of: int = 256  # SwiGLU hidden size is rounded up to a multiple of this
    ffn_dim_multiplier: float = 1.0  # scales Meta's 2/3 * 4 * n_embd hidden size before rounding
    norm_eps: float = 1e-5  # RMSNorm epsilon, in squared activation units
    rope_theta: float = 10000.0  # rotary base (Llama 2; Llama 3 uses 500000)
    # batch
    batch_size: int = 8  # sequences per step
    seq_len: int = 2048  # tokens per sequence (and the longest the model handles)
    # schedule
    num_iterations: int = 20000  # optimizer steps in the whole run
    warmup_steps: int = 2000  # steps of linear lr warm-up from lr / warmup_steps to lr
    min_lr_ratio: float = 0.1  # cosine decay ends at this fraction of learning_rate
    # optimizer
    learning_rate: float = 3e-4  # AdamW peak lr (parameter change per step at multiplier 1)
    weight_decay: float = 0.1  # decoupled weight decay on 2-D parameters (matrices, embeddings)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    # evaluation and logging
    val_loss_every: int = 500  # steps between validations (also at step 0); 0 = only at the last step
    timing_skip_steps: int = 10  # first steps (warm-up) left out of train_time/step_avg
    seed: int = 0  # torch.manual_seed for the weights


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
# data: Modded-NanoGPT token shards

SHARD_MAGIC = 20240520  # first header int32 of every shard
SHARD_VERSION = 1  # second header int32
SHARD_HEADER_INTS = 256  # header length in int32 (1024 bytes); the third is the token count


def _load_data_shard(path) -> torch.Tensor:
    """One shard's tokens as a uint16 tensor in pinned host memory.

    Layout: 256 int32 (magic 20240520, version 1, token count, zeros), then the tokens as
    little-endian uint16. A file that does not match raises ValueError naming it.
    """
    path = Path(path)
    header_bytes = SHARD_HEADER_INTS * 4
    size = path.stat().st_size
    if size < header_bytes:
        raise ValueError(f"{path}: {size} bytes, shorter than the {header_bytes}-byte shard header")
    with path.open("rb", buffering=0) as f:
        header = torch.frombuffer(bytearray(f.read(header_bytes)), dtype=torch.int32)
        magic, version, num_tokens = (int(v) for v in header[:3])
        if magic != SHARD_MAGIC:
            raise ValueError(f"{path}: bad magic number {magic}, expected {SHARD_MAGIC}: not a token shard")
        if version != SHARD_VERSION:
            raise ValueError(f"{path}: shard version {version}, this reader knows version {SHARD_VERSION}")
        if size != header_bytes + 2 * num_tokens:
            raise ValueError(f"{path}: header says {num_tokens} tokens ({header_bytes + 2 * num_tokens} "
                             f"bytes with the header) but the file has {size} bytes")
        tokens = torch.empty(num_tokens, dtype=torch.uint16, pin_memory=True)  # pinned: async copies
        nbytes = f.readinto(tokens.numpy())
    if nbytes != 2 * num_tokens:
        raise ValueError(f"{path}: read {nbytes} bytes of tokens, expected {2 * num_tokens}")
    return tokens


def data_generator(filename_pattern: str, batch_size: int, seq_len: int):
    """Yield (inputs, targets), each int64 (batch_size, seq_len) on the device, forever.

    The shards matching the glob (relative to this script's folder) are read in sorted order
    and cycled. Each step consumes batch_size * seq_len consecutive tokens (+1 for the last
    target); targets are the inputs shifted by one token.
    """
    files = sorted(glob.glob(os.path.join(HERE, filename_pattern)))
    if not files:
        raise FileNotFoundError(f"no shards match {os.path.join(HERE, filename_pattern)}: "
                                f"run `python data/make_shards.py` first")
    step_tokens = batch_size * seq_len
    while True:
        for file in files:
            tokens = _load_data_shard(file)
            if len(tokens) < step_tokens + 1:
                raise ValueError(f"{file}: {len(tokens)} tokens, fewer than one step needs ({step_tokens + 1})")
            for pos in range(0, len(tokens) - step_tokens, step_tokens):
                buf = tokens[pos:pos + step_tokens + 1]
                # non_blocking: copies from pinned memory overlap with the device's work
                inputs = buf[:-1].to(device="cuda", dtype=torch.int64, non_blocking=True)
                targets = buf[1:].to(device="cuda", dtype=torch.int64, non_blocking=True)
                yield inputs.view(batch_size, seq_len), targets.view(batch_size, seq_len)


# -----------------------------------------------------------------------------
# the model (Meta's reference Llama, training-only: no KV cache)


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension; the norm is taken in fp32 (as Meta's)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = self._norm(x.float()).type_as(x)
        return output * self.weight


def precompute_freqs_cis(head_dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """Complex rotations e^{i t f_j} for positions t < end, frequencies f_j = theta^(-2j/head_dim)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, dtype=torch.float32)
    freqs = torch.outer(t, freqs)  # (end, head_dim / 2)
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """freqs_cis (T, D/2) viewed as (1, T, 1, D/2) to broadcast against x (B, T, H, D/2)."""
    assert freqs_cis.shape == (x.shape[1], x.shape[-1])
    shape = [d if i == 1 or i == x.ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """Rotate interleaved pairs (x[..., 2j], x[..., 2j+1]) of q and k (B, T, H, D) as complex numbers."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, T, n_kv_head, D) -> (B, T, n_kv_head * n_rep, D): each kv head serves n_rep query heads."""
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        x[:, :, :, None, :]
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    """Causal grouped-query self-attention, written out."""

    def __init__(self, dim: int, n_head: int, n_kv_head: int, max_seq_len: int):
        super().__init__()
        assert dim % n_head == 0, "n_embd must be a multiple of n_head"
        assert n_head % n_kv_head == 0, "n_head must be a multiple of n_kv_head"
        self.n_head, self.n_kv_head = n_head, n_kv_head
        self.n_rep = n_head // n_kv_head
        self.head_dim = dim // n_head
        self.wq = nn.Linear(dim, n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(n_head * self.head_dim, dim, bias=False)
        # 0 on and below the diagonal, -inf above: added to the scores, built once
        mask = torch.full((max_seq_len, max_seq_len), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_head, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_head, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_head, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys = repeat_kv(xk, self.n_rep)  # (B, T, n_head, D)
        values = repeat_kv(xv, self.n_rep)
        xq, keys, values = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)  # (B, H, T, D)
        scores = torch.matmul(xq, keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + self.mask[:seqlen, :seqlen]
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(scores, values)  # (B, H, T, D)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: Hyperparameters):
        super().__init__()
        self.attention = Attention(args.n_embd, args.n_head, args.n_kv_head, args.seq_len)
        self.feed_forward = FeedForward(args.n_embd, 4 * args.n_embd, args.multiple_of, args.ffn_dim_multiplier)
        self.attention_norm = RMSNorm(args.n_embd, eps=args.norm_eps)
        self.ffn_norm = RMSNorm(args.n_embd, eps=args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: Hyperparameters):
        super().__init__()
        self.n_layer = args.n_layer
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.n_embd)
        self.layers = nn.ModuleList([TransformerBlock(args) for _ in range(args.n_layer)])
        self.norm = RMSNorm(args.n_embd, eps=args.norm_eps)
        self.output = nn.Linear(args.n_embd, args.vocab_size, bias=False)  # untied from tok_embeddings
        freqs_cis = precompute_freqs_cis(args.n_embd // args.n_head, args.seq_len, args.rope_theta)
        self.register_buffer("freqs_cis", freqs_cis, persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, 0.02) for every matrix; residual output projections scaled by 1/sqrt(2 n_layer)."""
        for name, p in self.named_parameters():
            if p.ndim == 2:
                std = 0.02 / math.sqrt(2 * self.n_layer) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of tokens (B, T) against targets (B, T)."""
        _, seqlen = tokens.shape
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[:seqlen]
        for layer in self.layers:
            h = layer(h, freqs_cis)
        h = self.norm(h)
        logits = self.output(h).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build_optimizer(model: nn.Module, args: Hyperparameters) -> torch.optim.AdamW:
    """AdamW; weight decay on the 2-D parameters (matrices, embedding), none on the norm weights."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return torch.optim.AdamW(
        [
            dict(params=decay, weight_decay=args.weight_decay),
            dict(params=no_decay, weight_decay=0.0),
        ],
        lr=args.learning_rate, betas=(args.beta1, args.beta2), eps=1e-8,
    )


def lr_multiplier(step: int, args: Hyperparameters) -> float:
    """Linear warm-up to 1 over warmup_steps, then cosine decay to min_lr_ratio at num_iterations."""
    if step < args.warmup_steps:
        return (step + 1) / args.warmup_steps
    decay_steps = max(1, args.num_iterations - args.warmup_steps)
    progress = min(1.0, (step - args.warmup_steps) / decay_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cosine


# -----------------------------------------------------------------------------
# training


def main(argv: list[str] | None = None) -> None:
    args = parse_overrides(sys.argv[1:] if argv is None else argv)
    device = "cuda"
    print(f"Running PyTorch {torch.__version__}", flush=True)
    print(f"hyperparameters: {json.dumps(asdict(args))}", flush=True)

    # ---- data
    train_loader = data_generator(args.train_files, args.batch_size, args.seq_len)

    # ---- model, optimizer, schedule
    torch.manual_seed(args.seed)
    model = Transformer(args).cuda()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params:,}", flush=True)
    optimizer = build_optimizer(model, args)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_multiplier(step, args))

    # ---- training loop
    model.train()
    training_time_ms = 0.0  # milliseconds of training, validation excluded
    torch.cuda.synchronize()  # host-device sync: start the clock with the device idle
    t0 = time.perf_counter()
    for step in range(args.num_iterations + 1):
        last_step = step == args.num_iterations
        if step == args.timing_skip_steps:  # the first steps (allocator, caches) are not timed
            training_time_ms, t0 = 0.0, time.perf_counter()
        timed_steps = step - args.timing_skip_steps  # timed steps completed before this one

        # -- validation: every val_loss_every steps and at the end, off the clock
        if last_step or (args.val_loss_every > 0 and step % args.val_loss_every == 0):
            torch.cuda.synchronize()  # host-device sync: stop the clock
            training_time_ms += 1000 * (time.perf_counter() - t0)
            model.eval()
            val_steps = max(1, args.val_tokens // (args.batch_size * args.seq_len))
            val_loader = data_generator(args.val_files, args.batch_size, args.seq_len)
            val_loss = torch.zeros((), device=device)
            with torch.no_grad():
                for _ in range(val_steps):
                    x_val, y_val = next(val_loader)
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                        val_loss += model(x_val, y_val)
            val_loss /= val_steps
            model.train()
            step_avg = training_time_ms / timed_steps if timed_steps > 0 else float("nan")
            print(f"step:{step}/{args.num_iterations} val_loss:{val_loss.item():.4f} "
                  f"train_time:{training_time_ms:.0f}ms step_avg:{step_avg:.2f}ms", flush=True)
            torch.cuda.synchronize()  # host-device sync: restart the clock
            t0 = time.perf_counter()
        if last_step:
            break

        # -- one training step
        x, y = next(train_loader)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        if args.grad_clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        else:
            grad_norm = torch.zeros((), device=device)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # -- log: loss.item() is a host-device sync, every step
        train_loss = loss.item()
        approx_time_ms = training_time_ms + 1000 * (time.perf_counter() - t0)
        step_avg = approx_time_ms / (timed_steps + 1) if timed_steps >= 0 else float("nan")
        print(f"step:{step + 1}/{args.num_iterations} train_loss:{train_loss:.4f} "
              f"train_time:{approx_time_ms:.0f}ms step_avg:{step_avg:.2f}ms "
              f"lr:{lr:.3e} grad_norm:{grad_norm.item():.4f}", flush=True)

    print(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB "
          f"reserved: {torch.cuda.max_memory_reserved() // 1024 // 1024} MiB", flush=True)


if __name__ == "__main__":
    main()
