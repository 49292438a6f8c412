"""Helpers for the recipe tests: load program sources into namespaces, compare them, fake torch_npu.

`standin_torch_npu()` is this test suite's own plain-PyTorch stand-in for the torch_npu
operators the recipes emit, written from the documented signatures and return tuples
(docs/npu.md): npu_rms_norm -> (y, rstd), npu_rotary_mul (4-D,
rotate_half = cat(-x2, x1)), npu_fusion_attention -> 7 values (atten_mask True = masked;
sparse_mode 0 full mask, 2 = top-left causal with the compressed 2048x2048 mask),
npu_cross_entropy_loss -> 4 values (loss first, shaped [1]) and NpuFused optimizers whose
zero_grad(set_to_none=True) raises. The recipes are also checked against the project's
official references (trainbridge.npu_reference) where those exist.

The programs it reads live in tests/fixtures/programs/. The last section holds the helpers the
per-recipe test files (tests/recipes/) share.
"""

from __future__ import annotations

import contextlib
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from tests.kits.paths import FIXTURES, WORKLOADS

PROGRAMS = FIXTURES / "programs"
NANOGPT = WORKLOADS / "nanogpt" / "train_gpt.py"
MINIGPT = FIXTURES / "loop" / "minigpt" / "train.py"


def read(name: str) -> str:
    """A program from tests/fixtures/programs/."""
    return (PROGRAMS / name).read_text()


_LOADS = [0]


def load(src: str, name: str = "tb_prog") -> dict:
    """Execute a program's module level (not its __main__ block) into a fresh module namespace.

    The module is registered in sys.modules under a unique name while it runs (dataclasses look
    their module up there)."""
    _LOADS[0] += 1
    modname = f"{name}_{_LOADS[0]}"
    mod = types.ModuleType(modname)
    mod.__file__ = str(PROGRAMS / f"{name}.py")
    sys.modules[modname] = mod
    try:
        exec(compile(src, f"<{name}>", "exec"), mod.__dict__)
    finally:
        sys.modules.pop(modname, None)
    return mod.__dict__


# ------------------------------------------------------------------ recipes ----

_APPLIED: dict = {}


def apply(name: str, src: str, target: str, site=None, file: str = "p.py", protected=None):
    """RECIPES[name].apply on a one-file program, memoised across tests (recipes are pure), checked to parse."""
    from trainbridge.agent.rewriters.recipes import RECIPES, RewriteProposal

    key = (name, file, src, target, site, repr(protected))
    if key not in _APPLIED:
        out = RECIPES[name].apply({file: src}, target, site, protected=protected)
        if isinstance(out, RewriteProposal):
            compile(out.files[file], file, "exec")  # still parses
        _APPLIED[key] = out
    return _APPLIED[key]


# ------------------------------------------------------------------ comparison ----

def proj(y: torch.Tensor, seed: int = 7) -> torch.Tensor:
    """A scalar with an informative gradient: a fixed random projection of y.

    (sum(y**2) of a normalized y is constant, so its gradient is rounding noise.)"""
    g = torch.Generator().manual_seed(seed)
    return (y.float() * torch.randn(y.shape, generator=g)).sum()


def grads_of(module_or_tensors):
    if isinstance(module_or_tensors, torch.nn.Module):
        return [p.grad for p in module_or_tensors.parameters()]
    return [t.grad for t in module_or_tensors]


def assert_close_and_aligned(a, b, atol=1e-5, rtol=1e-4, cos_min=0.9999):
    """Forward within tolerance; gradients within tolerance and cosine > cos_min (lab rule)."""
    for x, y in zip(a, b):
        if x is None and y is None:
            continue
        assert x is not None and y is not None, "a gradient exists on one side only"
        torch.testing.assert_close(y.float(), x.float(), atol=atol, rtol=rtol)
        if x.numel() > 1 and x.float().norm() > 0:
            cos = F.cosine_similarity(x.float().flatten(), y.float().flatten(), dim=0)
            assert cos > cos_min, cos


# ------------------------------------------------------------- torch_npu stand-in ----

class _FusedMixin:
    def zero_grad(self, set_to_none: bool = False):
        if set_to_none:
            raise ValueError("NpuFused optimizers do not support zero_grad(set_to_none=True)")
        return super().zero_grad(set_to_none=False)


def standin_torch_npu() -> types.ModuleType:
    mod = types.ModuleType("torch_npu")
    mod.__trainbridge_test_standin__ = True

    def npu_rms_norm(input, gamma, epsilon=1e-6):
        if gamma.dtype != input.dtype:
            raise TypeError("npu_rms_norm: gamma must have the input's dtype")
        x = input.float()
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + epsilon)
        return (x * rstd * gamma.float()).to(input.dtype), rstd

    def npu_rotary_mul(input, r1, r2, rotary_mode="half"):
        if input.dim() != 4 or input.shape[-1] % 2:
            raise ValueError("npu_rotary_mul: 4-D input with an even last dim")
        if r1.shape[-1] != input.shape[-1] or r2.shape[-1] != input.shape[-1]:
            raise ValueError("npu_rotary_mul: r1/r2 must be full width")
        if not (r1.dtype == r2.dtype == input.dtype):
            raise TypeError("npu_rotary_mul: r1/r2 must have the input's dtype")
        if rotary_mode == "interleave":  # pairs (x[2j], x[2j+1]) -> (-x[2j+1], x[2j])
            pairs = input.unflatten(-1, (-1, 2))
            rot = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
        else:
            x1, x2 = input.chunk(2, dim=-1)
            rot = torch.cat([-x2, x1], dim=-1)
        return input * r1 + rot * r2

    def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                             atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                             next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                             actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
        assert input_layout == "BNSD" and query.dim() == 4 and query.size(1) == head_num
        s = (query.float() @ key.float().transpose(-2, -1)) * scale
        sq, sk = s.shape[-2:]
        if sparse_mode == 0 and atten_mask is not None:
            assert atten_mask.dtype == torch.bool
            s = s.masked_fill(atten_mask, float("-inf"))
        elif sparse_mode == 2:
            assert atten_mask is not None and tuple(atten_mask.shape) == (2048, 2048)
            s = s.masked_fill(atten_mask[:sq, :sk], float("-inf"))
        elif sparse_mode != 0:
            raise NotImplementedError(sparse_mode)
        out = (torch.softmax(s, dim=-1) @ value.float()).to(query.dtype)
        z = torch.zeros(())
        return out, z, z, z, 0, 0, 0

    def npu_cross_entropy_loss(input, target, weight=None, reduction="mean", ignore_index=-100,
                               label_smoothing=0.0, lse_square_scale_for_zloss=0.0, return_zloss=False):
        assert input.dim() == 2 and target.dtype == torch.int64
        loss = F.cross_entropy(input.float(), target, weight=weight, reduction=reduction,
                               ignore_index=ignore_index, label_smoothing=label_smoothing)
        if reduction != "none":
            loss = loss.reshape(1)
        e = input.new_empty(0)
        return loss, torch.log_softmax(input.float(), -1), e, e

    def npu_gelu(input, approximate="none"):
        if approximate not in ("none", "tanh"):
            raise ValueError("npu_gelu: approximate is 'none' or 'tanh'")
        return F.gelu(input, approximate=approximate)

    def npu_swiglu(input, dim=-1):
        a, b = input.chunk(2, dim=dim)
        return F.silu(a) * b

    def npu_geglu(input, dim=-1, approximate=1, activate_left=False):
        a, b = input.chunk(2, dim=dim)
        gated, linear = (a, b) if activate_left else (b, a)
        g = F.gelu(gated, approximate="tanh" if approximate == 1 else "none")
        return g * linear, g

    optim = types.ModuleType("torch_npu.optim")
    optim.NpuFusedAdamW = type("NpuFusedAdamW", (_FusedMixin, torch.optim.AdamW), {})
    optim.NpuFusedAdam = type("NpuFusedAdam", (_FusedMixin, torch.optim.Adam), {})
    optim.NpuFusedSGD = type("NpuFusedSGD", (_FusedMixin, torch.optim.SGD), {})
    for f in (npu_rms_norm, npu_rotary_mul, npu_fusion_attention, npu_cross_entropy_loss, npu_gelu, npu_swiglu,
              npu_geglu):
        setattr(mod, f.__name__, f)
    mod.optim = optim
    return mod


@contextlib.contextmanager
def fake_npu(kind: str):
    """`kind` 'standin' (this suite's) or 'reference' (trainbridge.npu_reference, when present)."""
    if kind == "reference":
        from trainbridge.npu_reference import fake_torch_npu

        with fake_torch_npu.installed() as mod:
            yield mod
        return
    mod = standin_torch_npu()
    saved = {k: sys.modules.get(k) for k in ("torch_npu", "torch_npu.optim")}
    sys.modules["torch_npu"], sys.modules["torch_npu.optim"] = mod, mod.optim
    try:
        yield mod
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def has_reference() -> bool:
    try:
        from trainbridge.npu_reference import fake_torch_npu  # noqa: F401
    except Exception:
        return False
    return True


NPU_KINDS = ["standin"] + (["reference"] if has_reference() else [])


@contextlib.contextmanager
def eager_compile():
    """torch.compile -> Dynamo with the eager backend and fullgraph=True.

    Checks that a compiled region traces as one graph (no graph breaks) and computes the same,
    without paying Inductor's code generation in unit tests.
    """
    real = torch.compile

    def fake(fn=None, **kw):
        kw = {k: v for k, v in kw.items() if k in ("dynamic",)}
        if fn is None:
            return lambda f: real(f, backend="eager", fullgraph=True, **kw)
        return real(fn, backend="eager", fullgraph=True, **kw)

    torch.compile = fake
    try:
        yield
    finally:
        torch.compile = real
        torch._dynamo.reset()


# ------------------------------------------------------------------ nanogpt ----

def nanogpt_source() -> str | None:
    return NANOGPT.read_text() if NANOGPT.exists() else None


def tiny_nanogpt(ns: dict):
    """A tiny GPT from a nanogpt namespace (keyword arguments filtered by its signature)."""
    import inspect

    GPT = ns["GPT"]
    params = inspect.signature(GPT.__init__).parameters
    want = dict(vocab_size=64, n_layer=2, n_head=2, n_embd=32, max_seq_len=16, logit_softcap=15.0)
    if "args" in params:  # an older signature: GPT(args)
        args = ns["Hyperparameters"]()
        for k, v in dict(vocab_size=64, n_layer=2, n_head=2, n_embd=32, seq_len=16).items():
            setattr(args, k, v)
        return GPT(args)
    return GPT(**{k: v for k, v in want.items() if k in params})


def nanogpt_loss_and_grads(src: str, seed: int = 0, npu: str | None = None, dtype=None):
    """(loss, grads) of a tiny nanogpt built from `src`, on fixed data; same weights per seed."""
    ctx = fake_npu(npu) if npu else contextlib.nullcontext()
    with ctx:
        ns = load(src, "tb_nanogpt")
        torch.manual_seed(seed)
        model = tiny_nanogpt(ns)
        # the records zero-init projections and the head: give every weight a value so grads are informative
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2 and p.abs().sum() == 0:
                    p.normal_(0, 0.05)
        g = torch.Generator().manual_seed(seed + 1)
        idx = torch.randint(0, 64, (2, 16), generator=g)
        tgt = torch.randint(0, 64, (2, 16), generator=g)
        loss = model(idx, tgt)
        loss.backward()
        return loss.detach(), [p.grad for p in model.parameters()]


# ----------------------------------------------------- shared by tests/recipes/ ----

needs_nanogpt = pytest.mark.skipif(nanogpt_source() is None, reason="workloads/nanogpt/train_gpt.py not present")


def applied(name: str, src: str, target: str, file: str = "p.py"):
    """(new text of `file`, proposal) of RECIPES[name] on a one-file program; it must apply."""
    from trainbridge.agent.rewriters.recipes import RewriteProposal

    out = apply(name, src, target, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


def applied_at(name: str, src: str, target: str, site=None, file: str = "p.py"):
    """`applied` at one site (per-site recipes such as compile_region)."""
    from trainbridge.agent.rewriters.recipes import RewriteProposal

    out = apply(name, src, target, site, file=file)
    assert isinstance(out, RewriteProposal), out
    return out.files[file], out


def exec_ns(src: str) -> dict:
    """A program's module level executed into a plain dict (no module registration)."""
    ns = {}
    exec(compile(src, "<prog>", "exec"), ns)
    return ns


def output_and_grads(fn, *args):
    """[fn(*args), gradients of proj(output) w.r.t. the tensor arguments that require grad]."""
    y = fn(*args)
    grads = torch.autograd.grad(proj(y), [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad])
    return [y, *grads]


def params_of(model):
    """Detached copies of a model's parameters."""
    return [p.detach().clone() for p in model.parameters()]
