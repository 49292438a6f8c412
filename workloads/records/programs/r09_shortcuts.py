"""Record 9 of the Modded-NanoGPT speedrun ("value and embedding skip connections, momentum
warmup, logit softcap").

Adds to r08_untied_head.py: a value residual (every layer mixes the first layer's values
into its own with a learned weight `lamb`), an embedding skip (each block's input is a
learned mix of the residual stream and the normalised embedding x0, gates `lambdas`), a
Muon momentum warm-up (0.85 -> 0.95 over the first steps) and a tanh logit softcap
(logits = 30 tanh(logits / 30)). The scalar gates get their own AdamW group.

Model otherwise as in r08: hand-written RMSNorm (`norm`), rotary embeddings, QK-norm,
hand-written causal attention (matmul, scale, masked_fill, softmax, matmul), ReLU² MLP,
zero-initialised output projections, padded vocabulary, untied head; Muon (Nesterov
momentum + quintic Newton-Schulz in bf16) for the hidden matrices, AdamW for the
embedding, the head and the scalars. Precision: bf16 autocast around the forward. Data:
token shards in the records' `.bin` format. Log: the records' `step:N/M ...` lines.

It is written for device "cuda", like the originals, and does not run on a machine without
one. Run it (one process, or `torchrun --nproc_per_node=8 r09_shortcuts.py` for NCCL data
parallel):

    python r09_shortcuts.py [key=value ...]

Every field of `Hyperparameters` can be overridden by a `key=value` argument, converted
with the field's type (int, float, str, bool as true/false/1/0); an unknown key or an
argument without `=` is an error. The shard globs are relative to this script's folder.
"""

import glob
import json
import os
import sys
import time
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HERE = Path(__file__).resolve().parent  # data globs are relative to this script's folder

# -----------------------------------------------------------------------------
# hyperparameters: GPU-sized defaults (one 8xH100 node, like the records)


@dataclass
class Hyperparameters:
    # data
    train_files: str = "data/train_*.bin"  # glob of training shards, relative to this script's folder
    val_files: str = "data/val_*.bin"  # glob of validation shards, relative to this script's folder
    val_tokens: int = 10_485_760  # tokens per validation pass, all ranks together (records: 10,485,760)
    # model
    vocab_size: int = 50304  # token ids; GPT-2's 50,257 padded up to a multiple of 128 (record 5)
    n_layer: int = 12  # transformer blocks
    n_head: int = 6  # attention heads per block
    n_embd: int = 768  # model width in channels; head dim = n_embd / n_head = 128
    logit_softcap: float = 30.0  # logits = c * tanh(logits / c), c in logit units (record 9)
    # batch
    batch_size: int = 64  # sequences per step per process (8 processes x 64 = 512 in the records)
    seq_len: int = 1024  # tokens per sequence (and the longest the model handles)
    # schedule
    num_iterations: int = 3200  # optimizer steps in the whole run
    warmup_frac: float = 0.0  # fraction of num_iterations with linear lr warm-up from 0
    cooldown_frac: float = 0.3  # final fraction of num_iterations with linear lr decay to 0
    # optimizers (lr in units of parameter change per step, at schedule multiplier 1)
    embed_lr: float = 0.3  # AdamW, token embedding
    head_lr: float = 0.004  # AdamW, lm_head (untied from the embedding, record 8)
    scalar_lr: float = 0.02  # AdamW, the per-block skip gates (record 9)
    muon_lr: float = 0.025  # Muon, hidden 2-D matrices
    muon_momentum: float = 0.95  # Muon momentum once warmed up (dimensionless)
    muon_momentum_start: float = 0.85  # Muon momentum at step 0 (record 9's momentum warm-up)
    muon_momentum_warmup_steps: int = 300  # steps to go from muon_momentum_start to muon_momentum
    # evaluation and logging
    val_loss_every: int = 125  # steps between validations (also at step 0); 0 = only at the last step
    timing_skip_steps: int = 10  # first steps (warm-up) left out of train_time/step_avg, like the records
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


def distributed_data_generator(filename_pattern: str, batch_size: int, seq_len: int, rank: int, world_size: int):
    """Yield (inputs, targets), each int64 (batch_size, seq_len) on the device, forever.

    The shards matching the glob (relative to this script's folder) are read in sorted order
    and cycled. Each step consumes world_size * batch_size * seq_len consecutive tokens;
    rank r takes the r-th slice of them, and targets are the inputs shifted by one token.
    """
    files = sorted(glob.glob(os.path.join(HERE, filename_pattern)))
    if not files:
        raise FileNotFoundError(f"no shards match {os.path.join(HERE, filename_pattern)}: "
                                f"run `python data/make_shards.py` first")
    local_tokens = batch_size * seq_len  # tokens one rank uses per step
    step_tokens = world_size * local_tokens  # tokens all ranks use per step
    while True:
        for file in files:
            tokens = _load_data_shard(file)
            if len(tokens) < step_tokens + 1:
                raise ValueError(f"{file}: {len(tokens)} tokens, fewer than one step needs ({step_tokens + 1})")
            for pos in range(0, len(tokens) - step_tokens, step_tokens):
                buf = tokens[pos + rank * local_tokens:][: local_tokens + 1]
                # non_blocking: copies from pinned memory overlap with the device's work
                inputs = buf[:-1].to(device="cuda", dtype=torch.int64, non_blocking=True)
                targets = buf[1:].to(device="cuda", dtype=torch.int64, non_blocking=True)
                yield inputs.view(batch_size, seq_len), targets.view(batch_size, seq_len)


# -----------------------------------------------------------------------------
# Muon: momentum, then the update orthogonalized by Newton-Schulz (hidden 2-D matrices)


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximately U V^T for G = U S V^T, by a quintic Newton-Schulz iteration in bf16.

    The coefficients make small singular values grow fast; they end up in roughly
    [0.7, 1.2] rather than exactly 1, which Muon does not mind.
    """
    assert G.ndim == 2, "Newton-Schulz orthogonalizes matrices"
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.bfloat16()
    tall = G.size(0) > G.size(1)
    if tall:  # iterate on the wide orientation: X @ X.T is then the smaller Gram matrix
        X = X.T
    X = X / (X.norm() + 1e-7)  # Frobenius norm 1, so the spectral norm is at most 1
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if tall:
        X = X.T
    return X


class Muon(torch.optim.Optimizer):
    """SGD with (Nesterov) momentum whose update is replaced by its orthogonalization.

    With several processes, rank r orthogonalizes parameters r, r + world_size, ... of each
    group into one flat bf16 buffer, and an all-reduce gives every rank every update
    (record 6: the Newton-Schulz work is shared instead of repeated).
    """

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5, rank=0, world_size=1):
        self.rank, self.world_size = rank, world_size
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = group["params"]
            momentum = group["momentum"]
            updates_flat = torch.zeros(sum(p.numel() for p in params), device="cuda", dtype=torch.bfloat16)
            offset = 0
            for i, p in enumerate(params):
                if i % self.world_size == self.rank and p.grad is not None:
                    g = p.grad
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(g)
                    buf = state["momentum_buffer"]
                    buf.mul_(momentum).add_(g)
                    g = g.add(buf, alpha=momentum) if group["nesterov"] else buf
                    g = zeropower_via_newtonschulz5(g, steps=group["ns_steps"])
                    g = g * max(1, g.size(0) / g.size(1)) ** 0.5  # same rms update for tall matrices
                    updates_flat[offset:offset + p.numel()] = g.flatten()
                offset += p.numel()
            if self.world_size > 1:
                dist.all_reduce(updates_flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                update = updates_flat[offset:offset + p.numel()].view_as(p).type_as(p)
                p.add_(update, alpha=-group["lr"])
                offset += p.numel()


# -----------------------------------------------------------------------------
# the model


def norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension, without a weight, written out by hand."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Rotary(nn.Module):
    """cos/sin tables of the rotary embedding, computed once for max_seq_len positions."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.outer(torch.arange(max_seq_len).float(), inv_freq)  # (T, head_dim / 2)
        self.register_buffer("cos", freqs.cos()[None, :, None, :], persistent=False)  # (1, T, 1, D/2)
        self.register_buffer("sin", freqs.sin()[None, :, None, :], persistent=False)

    def forward(self, T: int):
        return self.cos[:, :T], self.sin[:, :T]


def apply_rotary_emb(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x1[i], x2[i]) of the head dimension's two halves; x is (B, T, H, D)."""
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    y1 = x1 * cos + x2 * sin
    y2 = x1 * (-sin) + x2 * cos
    return torch.cat([y1, y2], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, n_head: int, max_seq_len: int):
        super().__init__()
        assert dim % n_head == 0
        self.n_head, self.head_dim = n_head, dim // n_head
        self.c_q = nn.Linear(dim, dim, bias=False)
        self.c_k = nn.Linear(dim, dim, bias=False)
        self.c_v = nn.Linear(dim, dim, bias=False)
        self.c_proj = nn.Linear(dim, dim, bias=False)
        self.c_proj.weight.data.zero_()  # zero-init output projection (record 5)
        self.rotary = Rotary(self.head_dim, max_seq_len)
        self.lamb = nn.Parameter(torch.tensor(0.5))  # mix of this layer's values and the first layer's (record 9)
        # True above the diagonal: the future positions a query may not see; built once
        mask = torch.triu(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, x: torch.Tensor, v1: torch.Tensor | None):
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_head, self.head_dim)
        if v1 is None:
            v1 = v  # the first layer's values, handed to every later layer
        v = (1 - self.lamb) * v + self.lamb * v1.view_as(v)  # value residual (record 9)
        q, k = norm(q), norm(k)  # QK-norm (record 5)
        cos, sin = self.rotary(T)
        q, k = apply_rotary_emb(q, cos, sin), apply_rotary_emb(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        att = (q @ k.transpose(-2, -1)) * (1.0 / self.head_dim ** 0.5)
        att = att.masked_fill(self.causal_mask[:T, :T], float("-inf"))
        att = att.softmax(dim=-1)
        y = att @ v  # (B, H, T, D)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y), v1


class MLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim, bias=False)
        self.c_proj = nn.Linear(4 * dim, dim, bias=False)
        self.c_proj.weight.data.zero_()  # zero-init output projection (record 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.c_fc(x)
        x = F.relu(x).square()  # ReLU^2 (record 5)
        return self.c_proj(x)


class Block(nn.Module):
    def __init__(self, dim: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.attn = CausalSelfAttention(dim, n_head, max_seq_len)
        self.mlp = MLP(dim)
        self.lambdas = nn.Parameter(torch.tensor([1.0, 0.0]))  # residual and embedding-skip gates (record 9)

    def forward(self, x: torch.Tensor, v1: torch.Tensor | None, x0: torch.Tensor):
        x = self.lambdas[0] * x + self.lambdas[1] * x0  # embedding skip (record 9)
        y, v1 = self.attn(norm(x), v1)
        x = x + y
        x = x + self.mlp(norm(x))
        return x, v1


class GPT(nn.Module):
    def __init__(self, vocab_size: int, n_layer: int, n_head: int, n_embd: int, max_seq_len: int,
                 logit_softcap: float = 30.0):
        super().__init__()
        self.logit_softcap = logit_softcap
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.blocks = nn.ModuleList([Block(n_embd, n_head, max_seq_len) for _ in range(n_layer)])
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)  # untied from wte (record 8)
        self.lm_head.weight.data.zero_()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of idx (B, T) against targets (B, T)."""
        x = norm(self.wte(idx))
        x0, v1 = x, None
        for block in self.blocks:
            x, v1 = block(x, v1, x0)
        x = norm(x)
        logits = self.lm_head(x)
        c = self.logit_softcap
        logits = c * torch.tanh(logits / c)  # tanh logit softcap (record 9)
        logits = logits.float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build_optimizers(model: GPT, args: Hyperparameters, rank: int = 0, world_size: int = 1):
    """AdamW for the embedding, the head and the scalar gates; Muon for the hidden matrices."""
    matrices = [p for p in model.blocks.parameters() if p.ndim == 2]
    scalars = [p for p in model.blocks.parameters() if p.ndim < 2]
    adamw = torch.optim.AdamW(
        [
            dict(params=[model.wte.weight], lr=args.embed_lr),
            dict(params=[model.lm_head.weight], lr=args.head_lr),
            dict(params=scalars, lr=args.scalar_lr),
        ],
        betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
    )
    muon = Muon(matrices, lr=args.muon_lr, momentum=args.muon_momentum, rank=rank, world_size=world_size)
    return [adamw, muon]


def lr_multiplier(step: int, args: Hyperparameters) -> float:
    """Schedule: linear warm-up, constant, then linear cool-down to 0 at num_iterations."""
    warmup = round(args.warmup_frac * args.num_iterations)
    cooldown = round(args.cooldown_frac * args.num_iterations)
    if step < warmup:
        return (step + 1) / warmup
    if step < args.num_iterations - cooldown:
        return 1.0
    return max(0.0, (args.num_iterations - step) / cooldown)


# -----------------------------------------------------------------------------
# training


def main(argv: list[str] | None = None) -> None:
    args = parse_overrides(sys.argv[1:] if argv is None else argv)

    # ---- processes and device: NCCL data parallel under torchrun, else one process
    ddp = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if ddp:
        dist.init_process_group(backend="nccl")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    else:
        rank, world_size = 0, 1
        device = "cuda"
    master_process = rank == 0

    def print0(s: str) -> None:
        if master_process:
            print(s, flush=True)

    print0(f"Running PyTorch {torch.__version__}")
    print0(f"hyperparameters: {json.dumps(asdict(args))}")

    # ---- data
    train_loader = distributed_data_generator(args.train_files, args.batch_size, args.seq_len, rank, world_size)

    # ---- model and optimizers
    torch.manual_seed(args.seed)
    raw_model = GPT(args.vocab_size, args.n_layer, args.n_head, args.n_embd, args.seq_len, args.logit_softcap)
    raw_model = raw_model.cuda()
    model = DDP(raw_model, device_ids=[local_rank]) if ddp else raw_model
    optimizers = build_optimizers(raw_model, args, rank, world_size)
    adamw, muon = optimizers
    schedulers = [torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_multiplier(step, args)) for opt in optimizers]

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
            val_steps = max(1, args.val_tokens // (world_size * args.batch_size * args.seq_len))
            val_loader = distributed_data_generator(args.val_files, args.batch_size, args.seq_len, rank, world_size)
            val_loss = torch.zeros((), device=device)
            with torch.no_grad():
                for _ in range(val_steps):
                    x_val, y_val = next(val_loader)
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                        val_loss += model(x_val, y_val)
            val_loss /= val_steps
            if ddp:
                dist.all_reduce(val_loss, op=dist.ReduceOp.AVG)
            model.train()
            step_avg = training_time_ms / timed_steps if timed_steps > 0 else float("nan")
            # val_loss.item(): host-device sync, once per validation
            print0(f"step:{step}/{args.num_iterations} val_loss:{val_loss.item():.4f} "
                   f"train_time:{training_time_ms:.0f}ms step_avg:{step_avg:.2f}ms")
            torch.cuda.synchronize()  # host-device sync: restart the clock
            t0 = time.perf_counter()
        if last_step:
            break

        # -- one training step
        x, y = next(train_loader)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        frac = min(step / args.muon_momentum_warmup_steps, 1.0) if args.muon_momentum_warmup_steps > 0 else 1.0
        muon.param_groups[0]["momentum"] = (1 - frac) * args.muon_momentum_start + frac * args.muon_momentum
        for opt, sched in zip(optimizers, schedulers):
            opt.step()
            sched.step()
        model.zero_grad(set_to_none=True)

        # -- log: loss.item() is a host-device sync, every step (as in the records)
        train_loss = loss.item()
        approx_time_ms = training_time_ms + 1000 * (time.perf_counter() - t0)
        step_avg = approx_time_ms / (timed_steps + 1) if timed_steps >= 0 else float("nan")
        print0(f"step:{step + 1}/{args.num_iterations} train_loss:{train_loss:.4f} "
               f"train_time:{approx_time_ms:.0f}ms step_avg:{step_avg:.2f}ms")

    print0(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB "
           f"reserved: {torch.cuda.max_memory_reserved() // 1024 // 1024} MiB")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
