"""Elementwise work per step: the arithmetic a FLOP count leaves out.

torch's FLOP counter sees matrix products only, so a candidate that deletes a softcap, a
norm or a scale does the same FLOPs as the baseline. This counter adds up, for one training
step, the elements every arithmetic op writes and every reduction reads
(`aten_ops.ELEMENTWISE_ARITHMETIC`, `aten_ops.REDUCTIONS`). Fusion must not look like
deleted work, so a fused or composite op is counted as what it does, not as one op: it is
decomposed with torch's own decompositions, run on meta tensors (shapes only, no arithmetic,
and the real op still computes the step's values), down to those arithmetic ops. The few
fused kernels torch cannot decompose (attention backwards) have a formula: the count of the
eager spelling they replace. An op with neither is *opaque* and listed by name, so work
conservation can tell "less work" from "work it cannot see" (a vendor kernel on an NPU).

The optimizer's update is left out (the counter pauses between an optimizer's step pre- and
post-hooks): a fused optimizer is one opaque kernel where the eager loop is dozens of ops,
and skipped optimizer work shows in the loss check anyway.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..aten_ops import DATA_MOVEMENT, ELEMENTWISE_ARITHMETIC, MATRIX_ENGINE, REDUCTIONS

_MAX_DEPTH = 8


def _bare(func) -> str:
    """`aten.add_.Tensor` -> `add`."""
    name = func.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


def _elements_out(out) -> int:
    return sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))


def _elements_in(args) -> int:
    first = next((t for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor)), None)
    return first.numel() if first is not None else 0


def _as_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _bound(func, args, kwargs) -> dict:
    names = [a.name for a in func._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def _attention_elements(func, args, kwargs) -> tuple[int, bool]:
    """Score elements (batch x heads x queries x keys) and whether a mask applies."""
    b = _bound(func, args, kwargs)
    q, k = b["query"], b["key"]
    masked = bool(b.get("is_causal")) or b.get("attn_mask") is not None or b.get("attn_bias") is not None
    return q.numel() // q.shape[-1] * k.shape[-2], masked


def _attention_forward(func, args, kwargs) -> dict[str, int]:
    """Eager attention's passes over the scores: scale, mask, softmax (max, subtract, exp, sum,
    divide)."""
    n, masked = _attention_elements(func, args, kwargs)
    return {"mul": n, "masked_fill": n * masked, "amax": n, "sub": n, "exp": n, "sum": n, "div": n}


def _attention_backward(func, args, kwargs) -> dict[str, int]:
    """Eager attention's backward passes over the scores: the probabilities' gradient times the
    probabilities, its row sum, the subtraction and product of the softmax backward, the scale,
    and the mask."""
    n, masked = _attention_elements(func, args, kwargs)
    return {"mul": 3 * n, "sum": n, "sub": n, "masked_fill": n * masked}


FORMULAS = {
    "_scaled_dot_product_flash_attention_for_cpu_backward": _attention_backward,
    "_scaled_dot_product_flash_attention_backward": _attention_backward,
    "_scaled_dot_product_efficient_attention_backward": _attention_backward,
    "_scaled_dot_product_cudnn_attention_backward": _attention_backward,
    "_scaled_dot_product_flash_attention_for_cpu": _attention_forward,
    "_scaled_dot_product_flash_attention": _attention_forward,
    "_scaled_dot_product_efficient_attention": _attention_forward,
    "_scaled_dot_product_cudnn_attention": _attention_forward,
}
"""Fused attention kernels, counted as the eager spelling they replace (torch decomposes some
forwards, into a spelling with extra NaN guards that would count a third more than eager)."""

_NOT_COUNTED = DATA_MOVEMENT | MATRIX_ENGINE - FORMULAS.keys()


class ElementwiseCounter(TorchDispatchMode):
    """Counts the elementwise work of the ops that reach the dispatcher while it is active."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter[str] = Counter()
        self.opaque: Counter[str] = Counter()
        self.calls = 0
        self.paused = 0  # > 0 inside an optimizer's step

    @property
    def total(self) -> int:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.paused:
            self.count(func, args, kwargs, out, 0)
        return out

    def count(self, func, args, kwargs, out, depth: int) -> None:
        name = _bare(func)
        if name in ELEMENTWISE_ARITHMETIC:
            self.by_op[name] += _elements_out(out)
            self.calls += 1
        elif name in REDUCTIONS:
            self.by_op[name] += _elements_in(args)
            self.calls += 1
        elif name in FORMULAS:
            passes = {k: v for k, v in FORMULAS[name](func, args, kwargs).items() if v}
            self.by_op.update(passes)
            self.calls += len(passes)
        elif name in _NOT_COUNTED or func.namespace in ("prims", "profiler"):
            return
        elif depth < _MAX_DEPTH and self._decompose(func, args, kwargs, depth):
            return
        elif torch.Tag.pointwise in func.tags:
            self.by_op[name] += _elements_out(out)
            self.calls += 1
        else:
            self.opaque[str(func.overloadpacket)] += 1

    def _decompose(self, func, args, kwargs, depth: int) -> bool:
        """Count `func` as the ops torch decomposes it into, run on meta tensors."""
        if func in decomposition_table:
            run = decomposition_table[func]
        elif torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            run = func.decompose
        else:
            return False
        margs, mkwargs = tree_map(_as_meta, args), tree_map(_as_meta, kwargs)
        before = self.by_op.copy(), self.opaque.copy(), self.calls
        try:
            with _Decomposing(self, depth + 1):
                result = run(*margs, **mkwargs)
        except Exception:  # noqa: BLE001 - a decomposition that does not apply to these inputs
            result = NotImplemented
        if result is NotImplemented:  # undo what a partial decomposition counted
            self.by_op, self.opaque, self.calls = before
            return False
        return True


class _Decomposing(TorchDispatchMode):
    """Routes the ops of one decomposition (on meta tensors) back to the counter."""

    def __init__(self, counter: ElementwiseCounter, depth: int):
        super().__init__()
        self.counter, self.depth = counter, depth

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.counter.count(func, args, kwargs, out, self.depth)
        return out
