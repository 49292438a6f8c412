"""A GPU training program in the style of Modded-NanoGPT records 5-10.

Hand-written RMSNorm, rotary embeddings, QK-norm, ReLU^2 MLP, untied head, tanh logit
softcap, Muon (Newton-Schulz) for hidden matrices + AdamW for embeddings and head, bf16
autocast, token shards in the Modded-NanoGPT `.bin` format, and the records' log lines.
Written for device "cuda" like the originals; TrainBridge's harness ports it.

Hyperparameters are overridden from the command line as `key=value` pairs whose types
come from the dataclass fields, e.g.

    python train_gpt.py n_layer=4 n_embd=256 num_iterations=40

Unknown keys are an error. Data: `python data/make_shards.py` (nothing downloaded).
"""

import glob
import math
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent

# -----------------------------------------------------------------------------
# hyperparameters


@dataclass
class Hyperparameters:
    # data
    train_files: str = "data/train_*.bin"  # glob, relative to this script's folder
    val_files: str = "data/val_*.bin"
    val_tokens: int = 10_485_760  # tokens used per validation pass
    # model
    vocab_size: int = 50304  # GPT-2 vocabulary padded to a multiple of 128
    n_layer: int = 12
    n_head: int = 6
    n_embd: int = 768  # head dim = n_embd / n_head = 128
    logit_softcap: float = 30.0  # logits = c * tanh(logits / c)
    # optimization
    batch_size: int = 8  # sequences per step (per process)
    seq_len: int = 1024  # tokens per sequence
    num_iterations: int = 3200  # optimizer steps
    warmup_iters: int = 0  # linear lr warm-up steps
    cooldown_frac: float = 0.4  # final fraction of steps with linearly decaying lr
    adam_lr: float = 0.008  # embeddings and head
    muon_lr: float = 0.05  # hidden matrices
    muon_momentum: float = 0.95
    # evaluation and logging
    val_loss_every: int = 125  # steps between validations; 0 = only at the end
    seed: int = 0


def parse_overrides(argv: list[str]) -> Hyperparameters:
    """`key=value` overrides, typed by the dataclass fields."""
    args = Hyperparameters()
    types = {f.name: f.type for f in fields(Hyperparameters)}
    for item in argv:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise SystemExit(f"unknown override {item!r}; known: {', '.join(types)}")
        cast = {"int": int, "float": float, "str": str}[types[key] if isinstance(types[key], str) else types[key].__name__]
        setattr(args, key, cast(value))
    return args


# -----------------------------------------------------------------------------
# data: Modded-NanoGPT token shards

SHARD_MAGIC, SHARD_VERSION, HEADER_INTS = 20240520, 1, 256


def _load_data_shard(path: str | Path) -> torch.Tensor:
    """Read one shard: 256 int32 header (magic, version, token count), then uint16 tokens."""
    header = torch.from_file(str(path), False, HEADER_INTS, dtype=torch.int32)
    if int(header[0]) != SHARD_MAGIC:
        raise ValueError(f"{path}: bad magic {int(header[0])}, expected {SHARD_MAGIC}")
    if int(header[1]) != SHARD_VERSION:
        raise ValueError(f"{path}: unsupported shard version {int(header[1])}")
    num_tokens = int(header[2])
    with open(path, "rb", buffering=0) as f:
        tokens = torch.empty(num_tokens, dtype=torch.uint16, pin_memory=torch.cuda.is_available())
        f.seek(HEADER_INTS * 4)
        nbytes = f.readinto(tokens.numpy())
    if nbytes != 2 * num_tokens:
        raise ValueError(f"{path}: header says {num_tokens} tokens, file holds {nbytes // 2}")
    return tokens


def distributed_data_generator(filename_pattern: str, batch_size: int, seq_len: int, rank: int, world_size: int):
    """Yield (inputs, targets) int64 batches, cycling over the shards; each rank its own slice."""
    files = sorted(glob.glob(str(HERE / filename_pattern)))
    if not files:
        raise FileNotFoundError(f"no shards match {HERE / filename_pattern}: run data/make_shards.py")
    span = world_size * batch_size * seq_len
    while True:
        for file in files:
            tokens, pos = _load_data_shard(file), 0
            while pos + span + 1 <= len(tokens):
                buf = tokens[pos + rank * batch_size * seq_len:][: batch_size * seq_len + 1]
                buf = buf.to(device="cuda", dtype=torch.int32, non_blocking=True).long()
                yield buf[:-1].view(batch_size, seq_len), buf[1:].view(batch_size, seq_len)
                pos += span


# -----------------------------------------------------------------------------
# Muon: momentum + Newton-Schulz orthogonalization for 2-D hidden matrices


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Quintic Newton-Schulz iteration towards the nearest semi-orthogonal matrix, in bf16."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)  # spectral norm <= 1
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class Muon(torch.optim.Optimizer):
    """SGD-momentum (Nesterov) whose update is orthogonalized by Newton-Schulz."""

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.lerp_(g, 1 - group["momentum"])
                g = g.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                g = zeropower_via_newtonschulz5(g, steps=group["ns_steps"])
                scale = max(1, p.size(0) / p.size(1)) ** 0.5
                p.add_(g.type_as(p), alpha=-group["lr"] * scale)


# -----------------------------------------------------------------------------
# the model


def norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm without a weight, written out as the records did before F.rms_norm."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Rotary(nn.Module):
    """cos/sin tables for rotary embeddings, computed once for the longest sequence."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        t = torch.arange(max_seq_len).float()
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos", freqs.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", freqs.sin()[None, :, None, :], persistent=False)

    def forward(self, T: int):
        return self.cos[:, :T], self.sin[:, :T]


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x1, x2) of the two halves of the head dimension; x is (B, T, H, D)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, dim // n_head
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.proj.weight.data.zero_()  # zero-init output projection (records 5+)
        self.rotary = Rotary(self.head_dim, max_seq_len)
        mask = torch.triu(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.head_dim)
        k = self.k(x).view(B, T, self.n_head, self.head_dim)
        v = self.v(x).view(B, T, self.n_head, self.head_dim)
        q, k = norm(q), norm(k)  # QK-norm
        cos, sin = self.rotary(T)
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
        att = att.softmax(dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim, bias=False)
        self.proj = nn.Linear(4 * dim, dim, bias=False)
        self.proj.weight.data.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.relu(self.fc(x)).square())  # ReLU^2 (record 4+)


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.attn = CausalSelfAttention(dim, n_head, max_seq_len)
        self.mlp = MLP(dim)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))  # value/embedding skip (record 9)

    def forward(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        x = self.lambdas[0] * x + self.lambdas[1] * x0
        x = x + self.attn(norm(x))
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self, args: Hyperparameters):
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.n_embd)
        self.blocks = nn.ModuleList([Block(args.n_embd, args.n_head, args.seq_len) for _ in range(args.n_layer)])
        self.lm_head = nn.Linear(args.n_embd, args.vocab_size, bias=False)  # untied (record 8)
        self.lm_head.weight.data.zero_()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = x0 = norm(self.embed(idx))
        for block in self.blocks:
            x = block(x, x0)
        x = norm(x)
        logits = self.lm_head(x)
        c = self.args.logit_softcap
        logits = c * torch.tanh(logits / c)  # tanh softcap (record 9)
        logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# -----------------------------------------------------------------------------
# training


def main() -> None:
    args = parse_overrides(sys.argv[1:])
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if ddp:
        dist.init_process_group(backend="nccl")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    else:
        rank, world_size = 0, 1
    master = rank == 0
    device = "cuda"

    def print0(s: str) -> None:
        if master:
            print(s, flush=True)

    print0(f"Running PyTorch {torch.__version__}")
    torch.manual_seed(args.seed)

    model = GPT(args).to(device)
    if ddp:
        for p in model.parameters():
            dist.broadcast(p.detach(), 0)
    hidden = [p for n, p in model.blocks.named_parameters() if p.ndim == 2]
    scalars = [p for n, p in model.blocks.named_parameters() if p.ndim < 2]
    adam = torch.optim.AdamW(
        [dict(params=[model.embed.weight, *scalars], lr=args.adam_lr), dict(params=[model.lm_head.weight], lr=args.adam_lr / 2)],
        betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0,
    )
    muon = Muon(hidden, lr=args.muon_lr, momentum=args.muon_momentum)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]

    def lr_scale(step: int) -> float:
        """Warm-up, constant, then linear cool-down to zero."""
        if step < args.warmup_iters:
            return (step + 1) / args.warmup_iters
        cooldown_start = int(args.num_iterations * (1 - args.cooldown_frac))
        if step < cooldown_start:
            return 1.0
        return max(0.0, (args.num_iterations - step) / (args.num_iterations - cooldown_start))

    train_loader = distributed_data_generator(args.train_files, args.batch_size, args.seq_len, rank, world_size)

    def validate() -> float:
        model.eval()
        steps = max(1, args.val_tokens // (args.batch_size * args.seq_len * world_size))
        val_loader = distributed_data_generator(args.val_files, args.batch_size, args.seq_len, rank, world_size)
        total = torch.zeros((), device=device)
        with torch.no_grad():
            for _ in range(steps):
                x, y = next(val_loader)
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    total += model(x, y)
        if ddp:
            dist.all_reduce(total, op=dist.ReduceOp.AVG)
        model.train()
        return (total / steps).item()  # host sync: validation only

    training_time_ms = 0.0
    torch.cuda.synchronize()  # host sync: start the clock on an idle device
    t0 = time.perf_counter()
    for step in range(args.num_iterations + 1):
        last = step == args.num_iterations
        if step == 10:  # like the records: the first steps (compilation, warm-up) are not timed
            training_time_ms, t0 = 0.0, time.perf_counter()
        timed_steps = max(1, step - 10) if step > 10 else float("nan")

        if last or (args.val_loss_every > 0 and step % args.val_loss_every == 0 and step > 0):
            torch.cuda.synchronize()  # host sync: stop the clock for validation
            training_time_ms += 1000 * (time.perf_counter() - t0)
            val_loss = validate()
            print0(f"step:{step}/{args.num_iterations} val_loss:{val_loss:.4f} "
                   f"train_time:{training_time_ms:.0f}ms step_avg:{training_time_ms / timed_steps:.2f}ms")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        if last:
            break

        x, y = next(train_loader)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        if ddp:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_scale(step)
        for opt in optimizers:
            opt.step()
        model.zero_grad(set_to_none=True)
        train_loss = loss.item()  # host sync: every step, for the log line
        elapsed = training_time_ms + 1000 * (time.perf_counter() - t0)
        print0(f"step:{step + 1}/{args.num_iterations} train_loss:{train_loss:.4f} "
               f"train_time:{elapsed:.0f}ms step_avg:{elapsed / timed_steps:.2f}ms")

    print0(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
           f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
