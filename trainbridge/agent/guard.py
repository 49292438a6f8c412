"""Static checks on a candidate program, before anything runs.

Each rule names an attack from measurement_integrity.md and refuses it at the source: a
candidate may not touch what the harness owns (seeds, data, step count, batch size,
timing, loss reading), may not skip work structurally, and may not hide a fallback to the
original path. Rules compare candidate against original, so a pattern already present in
the program (its own seed call, its own try/except) is not held against the candidate.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from typing import Literal

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider
from pydantic import BaseModel

from ..workload import ProtectedRegion

# Fused operators accepted as doing a loss's job (the loss must still be computed).
LOSS_CALLS = {"cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
              "l1_loss", "smooth_l1_loss", "kl_div", "npu_cross_entropy_loss"}
SEED_CALLS = {"manual_seed", "seed", "manual_seed_all", "set_rng_state", "use_deterministic_algorithms"}
EXIT_CALLS = {"_exit", "exit", "abort", "kill"}
CONCURRENCY = {"Thread", "Process", "Pool", "ThreadPoolExecutor", "ProcessPoolExecutor", "start_new_thread"}
LAYER_CONTAINERS = {"blocks", "layers", "h", "layer", "encoder_layers", "decoder_layers", "transformer"}


class Violation(BaseModel):
    rule: str
    file: str
    line: int
    message: str
    severity: Literal["error", "warning"] = "error"


class GuardVerdict(BaseModel):
    passed: bool
    violations: list[Violation]


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


class _Facts(cst.CSTVisitor):
    """What the rules compare, gathered in one pass over a module."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self):
        self.symbols: dict[str, str] = {}
        self.assigns: dict[str, list[str]] = {}
        self.calls: Counter[str] = Counter()
        self.call_lines: dict[str, int] = {}
        self.attr_assigns: list[tuple[str, int]] = []
        self.tries: list[int] = []
        self.forward_returns: Counter[str] = Counter()
        self.layer_slices: list[tuple[str, int]] = []
        self._scope: list[str] = []

    def _line(self, node) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def visit_ClassDef(self, node):
        self._scope.append(node.name.value)
        self.symbols[".".join(self._scope)] = _code(node)

    def leave_ClassDef(self, node):
        self._scope.pop()

    def visit_FunctionDef(self, node):
        self._scope.append(node.name.value)
        self.symbols[".".join(self._scope)] = _code(node)

    def leave_FunctionDef(self, node):
        self._scope.pop()

    def visit_Return(self, node):
        if self._scope and self._scope[-1] == "forward":
            self.forward_returns[".".join(self._scope)] += 1

    def _target_names(self, target) -> list[str]:
        if isinstance(target, cst.Name):
            return [target.value]
        if isinstance(target, (cst.Tuple, cst.List)):
            return [n for el in target.elements for n in self._target_names(el.value)]
        return []

    def visit_Assign(self, node):
        for t in node.targets:
            for name in self._target_names(t.target):
                self.assigns.setdefault(name, []).append(_code(node))
            if isinstance(t.target, cst.Attribute):
                self.attr_assigns.append((_code(t.target), self._line(node)))

    def visit_AugAssign(self, node):
        for name in self._target_names(node.target):
            self.assigns.setdefault(name, []).append(_code(node))

    def visit_AnnAssign(self, node):
        for name in self._target_names(node.target):
            self.assigns.setdefault(name, []).append(_code(node))

    def visit_Call(self, node):
        f = node.func
        name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else None
        if name:
            self.calls[name] += 1
            self.call_lines.setdefault(name, self._line(node))

    def visit_Try(self, node):
        self.tries.append(self._line(node))

    def visit_Subscript(self, node):
        v = node.value
        attr = v.attr.value if isinstance(v, cst.Attribute) else v.value if isinstance(v, cst.Name) else None
        if attr in LAYER_CONTAINERS and any(isinstance(e.slice, cst.Slice) for e in node.slice):
            self.layer_slices.append((_code(node), self._line(node)))


def _facts(text: str) -> _Facts:
    f = _Facts()
    MetadataWrapper(cst.parse_module(text)).visit(f)
    return f


def check_candidate(original: dict[str, str], candidate: dict[str, str], protected: list[ProtectedRegion],
                    editable: list[str], target: str) -> GuardVerdict:
    v: list[Violation] = []
    for rel in sorted(set(original) | set(candidate)):
        before, after = original.get(rel), candidate.get(rel)
        if before == after:
            continue
        # Rationale: only files the manifest lets an agent edit may change; a candidate that
        # edits the data loader or a config file changes the workload.
        if not any(fnmatch.fnmatch(rel, g) for g in editable) or before is None or after is None:
            v.append(Violation(rule="not_editable", file=rel, line=0,
                               message="file is not editable (or was added/removed) under the manifest"))
            continue
        if not rel.endswith(".py"):
            continue
        try:
            fb, fa = _facts(before), _facts(after)
        except cst.ParserSyntaxError as e:
            v.append(Violation(rule="parse", file=rel, line=e.raw_line, message=str(e).splitlines()[0]))
            continue
        for region in (p for p in protected if p.file == rel):
            # Rationale: the harness owns data, step count, batch size and seeds (integrity doc).
            if region.whole_file:
                v.append(Violation(rule="protected_file", file=rel, line=0, message=f"protected file edited ({region.reason})"))
            for sym in region.symbols:
                if sym in fb.symbols and fa.symbols.get(sym) != fb.symbols[sym]:
                    v.append(Violation(rule="protected_symbol", file=rel, line=0,
                                       message=f"protected {sym} changed or removed ({region.reason})"))
            for name in region.names:
                if fa.assigns.get(name, []) != fb.assigns.get(name, []):
                    v.append(Violation(rule="protected_name", file=rel, line=0,
                                       message=f"assignments to protected name {name!r} changed ({region.reason})"))
        # Rationale: reseeding changes the data order and initialisation the baseline used.
        for call in SEED_CALLS:
            if fa.calls[call] > fb.calls[call]:
                v.append(Violation(rule="seed_call", file=rel, line=fa.call_lines.get(call, 0),
                                   message=f"adds a {call}() call: seeds belong to the harness"))
        # Rationale: exiting or forking can end a run early or hide work from the clock.
        for call in EXIT_CALLS | CONCURRENCY:
            if fa.calls[call] > fb.calls[call]:
                v.append(Violation(rule="process_control", file=rel, line=fa.call_lines.get(call, 0),
                                   message=f"adds {call}(): exits and threads/processes are not allowed in a candidate"))
        # Rationale: patching torch / time / the clock fools the timer (KernelBench's static checker).
        new_attr = set(fa.attr_assigns) - set(fb.attr_assigns)
        for text, line in sorted(new_attr):
            root = text.split(".")[0]
            if root in ("torch", "time", "os", "sys", "builtins", "trainbridge") or text.endswith((".backward", ".step")):
                v.append(Violation(rule="monkeypatch", file=rel, line=line,
                                   message=f"assigns {text}: patching library or timing functions is not allowed"))
        # Rationale: try/except around a rewritten op can silently fall back to the original path.
        if len(fa.tries) > len(fb.tries):
            v.append(Violation(rule="silent_fallback", file=rel, line=fa.tries[-1],
                               message="adds try/except: a fallback would hide whether the new path runs"))
        # Rationale: the loss must still be computed (a fused equivalent is fine).
        if sum(fa.calls[c] for c in LOSS_CALLS) < sum(fb.calls[c] for c in LOSS_CALLS):
            v.append(Violation(rule="loss_removed", file=rel, line=0, message="a loss computation was removed"))
        # Rationale: an extra return in forward() can skip layers; slicing the layer list drops them.
        for fn, n in fa.forward_returns.items():
            if n > fb.forward_returns.get(fn, 0):
                v.append(Violation(rule="early_return", file=rel, line=0, message=f"{fn} gains a return statement"))
        for text, line in set(fa.layer_slices) - set(fb.layer_slices):
            v.append(Violation(rule="layer_slice", file=rel, line=line, message=f"{text} slices the layer list"))
    return GuardVerdict(passed=not any(x.severity == "error" for x in v), violations=v)
