"""The rules on work skipped structurally: fallbacks, lost losses, early exits, skipped layers.

A candidate can do less per step without calling anything forbidden: a try/except that falls
back to the original path, a loss no longer computed (or computed with other arguments), a
new return or break in a forward or in the training loop, a sliced layer list.
"""

from __future__ import annotations

from collections import Counter

from .facts import _Facts, _new
from .vocabulary import LAYER_CONSTRUCTORS


def _loss_reach(f: _Facts, scope: str, seen=None) -> Counter:
    """Loss signatures computed by `scope` or by module functions/methods it calls."""
    seen = seen or set()
    if scope in seen:
        return Counter()
    seen.add(scope)
    out = Counter(f.loss_sigs.get(scope, Counter()))
    cls = scope.rsplit(".", 1)[0] if "." in scope else None
    for name in f.called_by.get(scope, set()):
        for target in (name, f"{cls}.{name}" if cls else None):
            if target and target in f.symbols:
                out |= _loss_reach(f, target, seen)
    return out


def _rule_fallback(fb: _Facts, fa: _Facts, regions, target):
    for key, n in _new(fb.handlers, fa.handlers):
        scope, _, reraise = key
        if reraise:
            continue
        yield "silent_fallback", fa.handler_lines.get(key, 0), \
            f"adds an exception handler in {scope}: a fallback would hide whether the new path runs"


def _rule_loss(fb: _Facts, fa: _Facts, regions, target):
    for scope in fb.loss_sigs:
        want = _loss_reach(fb, scope)
        got = _loss_reach(fa, scope) if scope in fa.symbols or scope == "<module>" else Counter()
        missing = want - got
        if missing:
            sig = next(iter(missing))
            yield "loss_removed", 0, (f"{scope} no longer computes {sig[0]} with the original's reduction, "
                                      "ignore_index, label_smoothing and weight")
    total_b = sum(sum(c.values()) for c in fb.loss_sigs.values())
    total_a = sum(sum(c.values()) for c in fa.loss_sigs.values())
    if total_a < total_b:
        yield "loss_removed", 0, f"loss computations fell from {total_b} to {total_a}"


def _rule_structure(fb: _Facts, fa: _Facts, regions, target):
    # functions the candidate adds (a recipe's helper) have no original to skip layers of
    for fn, n in _new(fb.returns, fa.returns):
        if fn in fb.symbols:
            yield "early_return", fa.return_lines.get(fn, 0), f"{fn} gains a return statement"
    for fn, n in _new(fb.loop_returns, fa.loop_returns):
        if fn not in fb.symbols:
            continue
        yield "early_return", fa.return_lines.get(fn, 0), f"{fn} gains a return/break inside a loop"
    for key, n in _new(fb.layer_slices, fa.layer_slices):
        yield "layer_skip", fa.slice_lines.get(key, 0), f"{key[0]} slices the layer list"
    for key, n in _new(fb.layer_loops, fa.layer_loops):
        yield "layer_skip", fa.layer_loop_lines.get(key, 0), f"{key[0]} iterates the layer list differently"
    cb = Counter(c.text for c in fb.calls if c.name in LAYER_CONSTRUCTORS)
    ca = Counter(c.text for c in fa.calls if c.name in LAYER_CONSTRUCTORS)
    if cb != ca:
        line = next((c.line for c in fa.calls if c.name in LAYER_CONSTRUCTORS and c.text not in cb), 0)
        yield "layer_build_changed", line, "the construction of a layer list changed"
    for key, n in _new(fb.step_loop_exits, fa.step_loop_exits):
        yield "step_loop", fa.exit_lines.get(key, 0), f"adds a {key[1]} inside the training loop of {key[0]}"
    if fb.step_loop_headers and fa.step_loop_headers != fb.step_loop_headers:
        yield "step_loop", 0, "the training loop's iteration range changed"
    for fn, n in _new(fb.forward_detach, fa.forward_detach):
        if fn not in fb.symbols:
            continue
        yield "detach_in_forward", 0, f"{fn} gains .detach()"
