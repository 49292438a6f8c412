"""The rules on what a candidate calls, imports or patches.

New seed, exit, thread/process, side-stream, grad-off and precision calls; imports of
concurrency modules or harness internals; assignments that patch library or timing
functions; reads of sys.argv and writes to harness-owned environment variables; calls to
another target's API.
"""

from __future__ import annotations

from collections import Counter

from .facts import _Facts, _new
from .vocabulary import (
    CONCURRENCY_CALLS,
    CONCURRENCY_MODULES,
    EXIT_CALLS,
    GRAD_OFF_CALLS,
    HARNESS_ENV,
    KNOB_PREFIXES,
    PATCH_ROOTS,
    REFLECTION_CALLS,
    REFLECTION_MODULES,
    SEED_CALLS,
    STREAM_CALLS,
)


def _rule_calls(fb: _Facts, fa: _Facts, regions, target):
    def new_calls(pred):
        cb = Counter(c.text for c in fb.calls if pred(c))
        for c in fa.calls:
            if not pred(c):
                continue
            if cb[c.text] > 0:
                cb[c.text] -= 1
            else:
                yield c

    # Rationale (seed): the harness seeds; the program's own seeding must stay as it was.
    seed_roots = {"torch", "random", "np", "numpy", "torch_npu", "transformers", "lightning", "pl"}
    for c in new_calls(lambda c: c.name in SEED_CALLS and (c.dotted.split(".")[0] in seed_roots or c.name in (
            "manual_seed", "manual_seed_all", "set_seed", "seed_all"))):
        yield "seed", c.line, f"new or changed seed call {c.dotted}(): seeds belong to the harness"
    sb = Counter(c.text for c in fb.calls if c.name in SEED_CALLS)
    sa = Counter(c.text for c in fa.calls if c.name in SEED_CALLS)
    if sb - sa:
        yield "seed", 0, "a seed call of the original was removed or changed"
    # Rationale (process_control): exits and concurrency.
    for c in new_calls(lambda c: c.name in EXIT_CALLS and c.dotted.split(".")[0] in ("os", "sys", "exit", "quit", "signal")
                       or c.dotted in ("exit", "quit")):
        yield "process_control", c.line, f"adds {c.dotted}(): exiting belongs to the harness"
    for c in new_calls(lambda c: c.name in CONCURRENCY_CALLS and (
            c.dotted.split(".")[0] in ("threading", "multiprocessing", "mp", "subprocess", "os", "concurrent", "_thread")
            or c.name in ("Thread", "ThreadPoolExecutor", "ProcessPoolExecutor", "Pool", "Process", "Popen"))):
        yield "process_control", c.line, f"adds {c.dotted}(): threads/processes run work the clock does not see"
    for exc, n in _new(fb.raises_exit, fa.raises_exit):
        yield "process_control", fa.exit_lines.get(exc, 0), f"adds raise {exc}"
    # Rationale (side_stream)
    for c in new_calls(lambda c: c.name in STREAM_CALLS and (".cuda." in f".{c.dotted}" or ".npu." in f".{c.dotted}"
                                                              or c.dotted.startswith(("torch.Stream", "torch.stream")))):
        yield "side_stream", c.line, f"adds {c.dotted}(): work on a side stream escapes the step's synchronize"
    # Rationale (grad_disabled)
    for c in new_calls(lambda c: c.name in GRAD_OFF_CALLS):
        if c.name == "set_grad_enabled" and "True" in c.text and "False" not in c.text:
            continue
        if c.name == "requires_grad_" and "False" not in c.text:
            continue
        yield "grad_disabled", c.line, f"adds {c.dotted}(): gradients off skips backward work"
    # Rationale (default_dtype)
    for c in new_calls(lambda c: c.name in ("set_default_dtype", "set_default_tensor_type")):
        yield "default_dtype", c.line, f"adds {c.dotted}()"
    # Rationale (work_removed)
    for name in ("backward", "step", "zero_grad"):
        nb = sum(1 for c in fb.calls if c.name == name)
        na = sum(1 for c in fa.calls if c.name == name)
        if na < nb:
            yield "work_removed", 0, f".{name}() calls fell from {nb} to {na}"
    # Rationale (backward_added): the recorded loss is the tensor backward() ran on.
    nb, na = (sum(1 for c in f.calls if c.name == "backward") for f in (fb, fa))
    if na > nb:
        line = next((c.line for c in new_calls(lambda c: c.name == "backward")), 0)
        yield "backward_added", line, f".backward() calls rose from {nb} to {na}"
    # Rationale (reflection)
    for c in new_calls(lambda c: c.dotted in REFLECTION_CALLS):
        yield "reflection", c.line, f"adds {c.dotted}(): code that writes code or reaches into the interpreter"
    for what, n in _new(fb.reflection, fa.reflection):
        yield "reflection", fa.reflection_lines.get(what, 0), f"reaches {what}: the interpreter's internals"
    # Rationale (precision_change)
    for c in new_calls(lambda c: c.name in ("autocast", "half", "bfloat16") or "allow_hf32" in c.dotted):
        yield "precision_change", c.line, f"adds {c.dotted}(): precision changes"
    # Rationale (stale_cache)
    for c in new_calls(lambda c: c.name == "data_ptr"):
        yield "stale_cache", c.line, "keys something on a storage address (data_ptr)"
    # Rationale (target_api)
    if target in ("cpu", "cuda"):
        for c in new_calls(lambda c: c.dotted.startswith("torch_npu")):
            yield "target_api", c.line, f"calls {c.dotted}() in a candidate for {target}"
    if target == "cpu":
        for c in new_calls(lambda c: c.dotted.startswith("torch.cuda.") and c.name not in ("is_available",)
                           or (c.name == "cuda" and c.dotted.endswith(".cuda") and not c.dotted.startswith("torch."))):
            yield "target_api", c.line, f"calls {c.dotted}() in a candidate for cpu"


def _rule_imports(fb: _Facts, fa: _Facts, regions, target):
    for mod in sorted(fa.imports - fb.imports):
        root = mod.split(".")[0]
        if any(mod == c or mod.startswith(c + ".") for c in CONCURRENCY_MODULES) or root == "trainbridge":
            yield "process_control", fa.import_lines.get(mod, 0), f"imports {mod}: concurrency or harness internals"
        if root in REFLECTION_MODULES:
            yield "reflection", fa.import_lines.get(mod, 0), f"imports {mod}: the interpreter's internals"
        if root == "torch_npu" and target in ("cpu", "cuda"):
            yield "target_api", fa.import_lines.get(mod, 0), f"imports torch_npu in a candidate for {target}"


def _rule_patching(fb: _Facts, fa: _Facts, regions, target):
    before = Counter((d, f) for d, f, _ in fb.attr_assigns)
    roots = PATCH_ROOTS | set(fa.import_aliases)
    # `t = time` then `t.perf_counter = ...`: a name bound to a library object patches that library
    roots |= {name for name, value in fa.name_aliases.items() if value.split(".")[0] in roots}
    for d, f_, line in fa.attr_assigns:
        if before[(d, f_)] > 0:
            before[(d, f_)] -= 1
            continue
        full = d
        head = d.split(".")[0]
        if head in fa.import_aliases:
            full = fa.import_aliases[head] + d[len(head):]
        if d.startswith("setattr("):
            inner = d[len("setattr("):-1].split(".")[0]
            if inner in roots:
                yield "monkeypatch", line, f"{d} patches a library object"
            continue
        if d.startswith("globals"):
            yield "monkeypatch", line, "writes through globals()"
            continue
        if head in roots or full.split(".")[0] in PATCH_ROOTS:
            if full.startswith(KNOB_PREFIXES) or d.startswith(KNOB_PREFIXES):
                if "hf32" in d or "tf32" in d:
                    yield "precision_change", line, f"sets {d}: matmul precision changes"
                continue
            yield "monkeypatch", line, f"assigns {d}: patching library or timing functions is not allowed"
        elif d.endswith((".backward", ".step", ".zero_grad", ".forward", ".__call__", ".synchronize")) and \
                not d.startswith("self."):
            yield "monkeypatch", line, f"assigns {d}: patching the step, loss or clock"
    # names imported from a library (from time import perf_counter) rebound later
    def plain(binds):
        return [(t, ln) for t, ln in binds if "Import(" not in t and "ImportFrom(" not in t]

    for name, binds in fa.bindings.items():
        root = fa.import_aliases.get(name, "").split(".")[0]
        if root in PATCH_ROOTS and len(plain(binds)) > len(plain(fb.bindings.get(name, []))):
            yield "monkeypatch", plain(binds)[-1][1], f"rebinds imported {name} ({fa.import_aliases[name]})"
    if fa.argv > fb.argv:
        yield "argv", fa.argv_line, "new use of sys.argv: the harness passes the program's arguments"
    envb = Counter(k for k, _ in fb.env_writes)
    for k, line in fa.env_writes:
        if envb[k] > 0:
            envb[k] -= 1
        elif k in HARNESS_ENV or k.startswith("TRAINBRIDGE"):
            yield "harness_env", line, f"writes {k}: the harness owns it"
