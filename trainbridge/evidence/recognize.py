"""Recognise optimization patterns from a kernel's ATen ops and the source lines it covers.

The ATen op set (post-grad nodes of the kernel) is the strong evidence; the source text is
corroboration (or the only evidence where Inductor decomposed an op beyond recognition).
Each recogniser also names its *signature ops* - the ops whose lines are the ones to
change - so intents point at the norm's `rsqrt` line, not at every line the kernel fused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .codeparse import short_op

NORM_OPS = {"pow", "mean", "rsqrt", "mul", "add"}


@dataclass
class Match:
    pattern: str
    signature_ops: set[str]
    strength: float  # 0-1: how unambiguous the op evidence is
    notes: list[str] = field(default_factory=list)


def _has(ops: set[str], *names: str) -> bool:
    return all(n in ops for n in names)


def _any(ops: set[str], *names: str) -> bool:
    return any(n in ops for n in names)


_SQUARE_RE = re.compile(r"\.square\(\)|\*\*\s*2\b|\.pow\(2\)|torch\.square")
_RELU_RE = re.compile(r"relu")
_GELU_TANH_RE = re.compile(r"0\.044715|gelu", re.I)
_SOFTCAP_RE = re.compile(r"tanh")


def recognize(ops_full: list[str] | set[str], text: str, phase: str, kind: str,
              tensor_adds: int = 0) -> list[Match]:
    """Patterns present in one kernel (forward ops; backward kernels get theirs from lines)."""
    ops = {short_op(o) for o in ops_full}
    low = text.lower()
    out: list[Match] = []
    if phase == "optimizer":
        return [Match("optimizer_update", set(ops), 0.9)]
    if kind == "attention":
        return [Match("attention", ops or {"scaled_dot_product_attention"}, 0.9,
                      ["already a fused attention library call"])]
    # ---- norms
    is_ln = "native_layer_norm" in ops or _any(ops, "var_mean", "var") or (
        _has(ops, "mean", "sub") and _any(ops, "rsqrt", "sqrt") and _any(ops, "pow", "mul"))
    if "native_layer_norm" in ops or "layer_norm" in low or is_ln:
        if is_ln:
            out.append(Match("layer_norm", {"native_layer_norm", "var_mean", "var", "sub", "rsqrt", "sqrt", "mean"},
                             0.85 if "native_layer_norm" in ops or "var_mean" in ops else 0.7))
    elif _has(ops, "mean", "rsqrt") and _any(ops, "pow", "mul"):
        sig = {"rsqrt", "mean", "pow"}
        if tensor_adds > 0 and "embedding" not in ops:
            out.append(Match("add_rms_norm", sig | {"add2"}, 0.6, ["residual add fused with the norm"]))
        out.append(Match("rms_norm", sig, 0.9 if "rsqrt" in low or "rms" in low or "norm" in low else 0.75))
    elif "rms_norm" in low and _any(ops, "rsqrt", "mean"):
        out.append(Match("rms_norm", {"rsqrt", "mean", "pow"}, 0.7))
    # ---- rotary
    halves = _any(ops, "slice", "split", "split_with_sizes", "chunk", "unbind")
    rot_text = re.search(r"rotary|rope|\bcos\b|\bsin\b|rotate", low)
    if halves and "mul" in ops and _any(ops, "add", "sub") and (_any(ops, "cat", "neg", "sub") or rot_text):
        # Inductor often lowers the cat into stores into halves of one buffer: no cat node then
        strength = 0.9 if rot_text and _any(ops, "cat", "neg", "sub") else 0.6 if rot_text or "cat" in ops else 0.4
        if strength >= 0.6 or "cat" in ops:
            out.append(Match("rotary", {"cat", "neg", "slice", "sub", "split", "mul"}, strength))
    elif _any(ops, "view_as_complex", "_conj") and "mul" in ops and re.search(r"rotary|rope|freqs", low):
        out.append(Match("rotary", {"view_as_complex", "view_as_real", "mul"}, 0.7))
    # ---- attention core (scores -> mask -> softmax)
    has_softmax = _any(ops, "_softmax", "softmax", "prepare_softmax_online") or (_has(ops, "amax", "exp", "sum") and "log" not in ops)
    if has_softmax and not _any(ops, "_log_softmax", "log_softmax", "nll_loss_forward", "gather", "log"):
        if _any(ops, "masked_fill", "where", "bitwise_not", "tril", "triu") or re.search(r"att|score|mask", low):
            out.append(Match("attention", {"_softmax", "softmax", "prepare_softmax_online", "masked_fill", "where",
                                           "bitwise_not", "amax", "exp"}, 0.85))
    # ---- activations
    if "relu" in ops and (_any(ops, "pow", "square") or (_SQUARE_RE.search(text) and "mul" in ops)):
        out.append(Match("relu2", {"relu", "pow", "square"}, 0.9))
    if (_any(ops, "silu", "sigmoid") and "mul" in ops) or "swiglu" in low:
        strength = 0.85 if "silu" in ops and (_any(ops, "split", "chunk", "slice") or "chunk" in low or "*" in text) else 0.6
        out.append(Match("swiglu", {"silu", "sigmoid", "mul"}, strength))
    if "gelu" in ops or (_any(ops, "erf") and "mul" in ops) or ("tanh" in ops and "pow" in ops and _GELU_TANH_RE.search(text)):
        out.append(Match("gelu", {"gelu", "erf", "tanh", "pow"}, 0.85 if "gelu" in ops else 0.7))
    # ---- loss
    has_ce = _any(ops, "_log_softmax", "log_softmax", "nll_loss_forward", "nll_loss2d_forward", "cross_entropy") or (
        "prepare_softmax_online" in ops and "cross_entropy" in low) or (
        _has(ops, "amax", "exp", "log") and (_any(ops, "gather", "nll_loss_forward") or "cross_entropy" in low))
    has_cap = "tanh" in ops and _any(ops, "div", "mul") and not any(m.pattern == "gelu" for m in out)
    if has_cap and (has_ce or "softcap" in low or _SOFTCAP_RE.search(low)):
        out.append(Match("softcap_cross_entropy" if has_ce else "softcap_cross_entropy",
                         {"tanh", "div", "_log_softmax", "nll_loss_forward", "prepare_softmax_online"},
                         0.85 if has_ce else 0.6, [] if has_ce else ["softcap kernel (cross-entropy in another kernel)"]))
    elif has_ce:
        out.append(Match("cross_entropy", {"_log_softmax", "nll_loss_forward", "prepare_softmax_online"}, 0.8))
    if any(m.pattern == "rotary" for m in out):  # rotary's own tensor adds are not a residual
        out = [m for m in out if m.pattern != "add_rms_norm"]
    return out


def recognize_backward(ops_full: list[str] | set[str]) -> list[str]:
    """Weak op-only hints for backward kernels (their lines decide; this breaks ties)."""
    ops = {short_op(o) for o in ops_full}
    out = []
    if _any(ops, "_log_softmax_backward_data", "nll_loss_backward"):
        out.append("cross_entropy")
    if "tanh_backward" in ops or ("tanh" in ops and "nll_loss_backward" in ops):
        out.append("softcap_cross_entropy")
    if "_softmax_backward_data" in ops:
        out.append("attention")
    if "threshold_backward" in ops or ("le" in ops and "relu" in ops):
        out.append("relu2")
    if "native_layer_norm_backward" in ops:
        out.append("layer_norm")
    if "gelu_backward" in ops:
        out.append("gelu")
    if "silu_backward" in ops:
        out.append("swiglu")
    return out
