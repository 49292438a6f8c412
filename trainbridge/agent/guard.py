"""Static checks on a candidate program, before anything runs.

Each rule refuses, at the source, one attack from docs/measurement_integrity.md (a candidate
that seizes what the harness owns, skips work structurally, or hides a fallback to the
original path), in the manner of KernelBench's static checker: a registry of named rules,
a stated rationale above each, two tiers (`error` refuses the candidate, `warning` is
recorded). Rules compare candidate against original, so a pattern the program already had
(its own seed call, its own try/except, its own `.detach()`) is never held against it.

Public API: `check_candidate(original, candidate, protected, editable, target) -> GuardVerdict`
and `RULES` (rule id -> rationale).
"""

from __future__ import annotations

import ast
import fnmatch
import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Literal

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider
from pydantic import BaseModel

from ..pysource.cstutil import call_name, code, target_names
from ..workload import ProtectedRegion

Severity = Literal["error", "warning"]


class Violation(BaseModel):
    rule: str
    file: str
    line: int
    message: str
    severity: Severity = "error"


class GuardVerdict(BaseModel):
    passed: bool
    violations: list[Violation]

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]


# --------------------------------------------------------------- vocabulary ----

# Loss operators, and the fused operators accepted as doing the same loss's job.
LOSS_CALLS = {"cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
              "l1_loss", "smooth_l1_loss", "kl_div", "huber_loss", "npu_cross_entropy_loss",
              "CrossEntropyLoss", "NLLLoss", "MSELoss", "BCEWithLogitsLoss", "BCELoss", "L1Loss", "SmoothL1Loss"}
LOSS_EQUIVALENT = {"npu_cross_entropy_loss": "cross_entropy", "CrossEntropyLoss": "cross_entropy",
                   "NLLLoss": "nll_loss", "MSELoss": "mse_loss"}
LOSS_DEFAULTS = {"reduction": "'mean'", "ignore_index": "-100", "label_smoothing": "0.0", "weight": "None"}
SEED_CALLS = {"manual_seed", "manual_seed_all", "seed", "seed_all", "set_rng_state", "set_seed",
              "use_deterministic_algorithms", "initial_seed", "fork_rng"}
EXIT_CALLS = {"_exit", "exit", "quit", "abort", "kill", "killpg"}
CONCURRENCY_CALLS = {"Thread", "Process", "Pool", "ThreadPoolExecutor", "ProcessPoolExecutor", "start_new_thread",
                     "fork", "spawn", "Popen", "run", "Timer", "start_processes"}
CONCURRENCY_MODULES = {"threading", "_thread", "multiprocessing", "concurrent", "subprocess", "signal",
                       "torch.multiprocessing", "asyncio"}
STREAM_CALLS = {"Stream", "stream", "ExternalStream", "set_stream"}
GRAD_OFF_CALLS = {"no_grad", "inference_mode", "set_grad_enabled", "requires_grad_"}
LAYER_CONTAINERS = {"blocks", "layers", "h", "layer", "encoder_layers", "decoder_layers", "transformer", "resblocks"}
LAYER_CONSTRUCTORS = {"ModuleList", "Sequential", "ModuleDict"}
FORWARD_NAMES = {"forward", "__call__", "_forward", "forward_features"}
HARNESS_ENV = {"PYTHONHASHSEED", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
               "ASCEND_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}
# Attribute assignments rooted at a library that are settings, not patches (L0 knobs).
KNOB_PREFIXES = ("torch.backends.", "torch.npu.matmul.", "torch.npu.conv.", "torch_npu.npu.config.",
                 "torch.npu.config.", "torch._inductor.config.", "torch._dynamo.config.", "torch.set_float32_matmul")
PATCH_ROOTS = {"torch", "time", "os", "sys", "builtins", "trainbridge", "random", "numpy", "np", "math", "gc",
               "torch_npu", "F", "nn", "dist", "functools", "datetime", "timeit"}


@dataclass
class Rule:
    id: str
    severity: Severity
    rationale: str


RULES: dict[str, Rule] = {r.id: r for r in [
    Rule("not_editable", "error", "Only files the manifest lets an agent edit may change; a candidate that edits the "
         "data loader, a config or the harness changes the workload (and new or deleted files escape review)."),
    Rule("parse", "error", "A candidate that does not parse cannot be reviewed, let alone run."),
    Rule("protected_file", "error", "A whole protected file (data, config) belongs to the harness."),
    Rule("protected_symbol", "error", "Protected functions/classes (data loading, hyperparameters, step count, "
         "batch size) must stay textually as they were, defined once, and not be rebound: otherwise the workload "
         "changes under the measurement."),
    Rule("protected_symbol_format", "warning", "Only comments or formatting of a protected symbol changed."),
    Rule("protected_name", "error", "Module-level names the harness relies on (seed, batch_size, seq_len, ...) keep "
         "exactly their assignments; a later `batch_size = 4` anywhere is a smaller workload."),
    Rule("protected_field", "error", "Fields of a protected config class may not be overwritten after "
         "construction (`args.batch_size = 2`, `setattr(args, 'batch_size', 2)`, `replace(args, ...)`)."),
    Rule("protected_call", "error", "Calls to protected functions keep their arguments: "
         "`loader(batch_size // 2)` changes the data without touching the loader."),
    Rule("seed", "error", "Seeds belong to the harness: a new or changed seed call changes the data order and the "
         "initialisation the baseline used."),
    Rule("argv", "error", "The harness passes the program's arguments; reading or rewriting sys.argv anew can "
         "change hyperparameters behind its back."),
    Rule("monkeypatch", "error", "Assigning to library or timing functions (time.perf_counter, "
         "torch.cuda.synchronize, torch.Tensor.backward, F.cross_entropy) fools the timer or the loss reading "
         "(KernelBench's static checker refuses the same); settings under torch.backends / *.config are knobs."),
    Rule("harness_env", "error", "Environment variables the harness sets (seeds, visible devices, ranks) are "
         "not the candidate's."),
    Rule("process_control", "error", "Exiting, forking or starting threads/processes can end a run early, or run "
         "work outside the timed step where the clock does not see it."),
    Rule("side_stream", "error", "Work on a side stream is not covered by the harness's synchronize at the step "
         "boundary: timings would exclude it."),
    Rule("step_loop", "error", "The training loop's header and exits belong to the harness: a new break/return in "
         "it, or a changed iteration range, runs fewer steps."),
    Rule("silent_fallback", "error", "try/except (or contextlib.suppress) added around a rewritten op can fall back "
         "to the original path, so the 'optimized' code never runs and the gain measured is noise."),
    Rule("loss_removed", "error", "The loss the original computed must still be computed, with the same reduction, "
         "ignore_index, label smoothing and weights (a fused equivalent such as npu_cross_entropy_loss is fine)."),
    Rule("work_removed", "error", "backward(), optimizer step() and zero_grad() calls may not disappear: fewer of "
         "them is less work per step."),
    Rule("early_return", "error", "A return added to a forward function skips the layers after it."),
    Rule("layer_skip", "error", "Slicing or re-ranging the layer list, or changing how it is built, drops layers."),
    Rule("layer_build_changed", "warning", "The construction of a layer list changed (count or kind of layers): "
         "the FLOP/work-conservation check decides; a rewrite recipe never touches it."),
    Rule("grad_disabled", "error", "Turning gradients off (no_grad, inference_mode, requires_grad_(False)) for part of "
         "the model skips backward work."),
    Rule("default_dtype", "error", "torch.set_default_dtype silently lowers the precision of every new tensor."),
    Rule("target_api", "error", "A candidate for cpu/cuda may not call torch_npu; one for cpu may not move "
         "tensors to cuda: it would not run, or run elsewhere, on the target."),
    Rule("precision_change", "warning", "The candidate changes math precision (autocast, HF32/TF32, half casts): "
         "the low-precision loss tolerance applies and the change must be a declared precision recipe."),
    Rule("stale_cache", "warning", "Caching keyed by a storage address (data_ptr) can return stale results when "
         "memory is reused."),
    Rule("detach_in_forward", "warning", "A new .detach() in a forward function cuts gradients to what precedes it."),
]}


def _norm(text: str) -> str:
    """Formatting-, comment- and parenthesis-independent form of a statement or expression."""
    try:
        return ast.dump(ast.parse(textwrap.dedent(text)))
    except SyntaxError:
        try:
            return ast.dump(ast.parse(f"({text})", mode="eval"))
        except SyntaxError:
            return " ".join(text.split())


def _dotted(node) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    if isinstance(node, cst.Call):
        head = _dotted(node.func)
        return f"{head}()" if head else None
    if isinstance(node, cst.Subscript):
        head = _dotted(node.value)
        return f"{head}[]" if head else None
    return None


# -------------------------------------------------------------------- facts ----

class _Call:
    """One call site; its normalised text is computed only when a rule compares it."""

    __slots__ = ("name", "dotted", "node", "line", "scope", "in_step_loop", "_text")

    def __init__(self, name, dotted, node, line, scope, in_step_loop):
        self.name, self.dotted, self.node, self.line = name, dotted, node, line
        self.scope, self.in_step_loop, self._text = scope, in_step_loop, None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = _norm(code(self.node))
        return self._text


class _Binding(tuple):
    """(normalised statement, line), normalised lazily: iterate/unpack like a pair."""

    def __new__(cls, node, line):
        obj = super().__new__(cls, (node, line))
        obj._t = None
        return obj

    def __iter__(self):
        yield self.text
        yield tuple.__getitem__(self, 1)

    def __getitem__(self, i):
        return self.text if i == 0 else tuple.__getitem__(self, 1)

    @property
    def text(self) -> str:
        if self._t is None:
            self._t = _norm(code(tuple.__getitem__(self, 0)))
        return self._t


@dataclass
class _Facts:
    symbols: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    bindings: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # name -> (normalised stmt, line)
    calls: list[_Call] = field(default_factory=list)
    attr_assigns: list[tuple[str, str, int]] = field(default_factory=list)  # (target dotted, attr name, line)
    env_writes: list[tuple[str, int]] = field(default_factory=list)
    handlers: Counter = field(default_factory=Counter)  # (scope, normalised handler) -> n
    handler_lines: dict = field(default_factory=dict)
    returns: Counter = field(default_factory=Counter)  # forward qualname -> returns
    return_lines: dict = field(default_factory=dict)
    loop_returns: Counter = field(default_factory=Counter)
    step_loop_headers: Counter = field(default_factory=Counter)
    step_loop_exits: Counter = field(default_factory=Counter)  # (scope, kind) -> n
    exit_lines: dict = field(default_factory=dict)
    layer_slices: Counter = field(default_factory=Counter)
    slice_lines: dict = field(default_factory=dict)
    layer_loops: Counter = field(default_factory=Counter)
    layer_loop_lines: dict = field(default_factory=dict)
    containers: set = field(default_factory=set)
    imports: set = field(default_factory=set)
    import_aliases: dict = field(default_factory=dict)
    import_lines: dict = field(default_factory=dict)
    class_fields: dict = field(default_factory=dict)  # class name -> field names
    called_by: dict = field(default_factory=dict)  # scope -> set of called simple names
    loss_sigs: dict = field(default_factory=dict)  # scope -> Counter of loss signatures
    argv: int = 0
    argv_line: object = 0
    module: object = None
    _lines: object = None

    def line_of(self, x) -> int:
        """A line number for a recorded node (positions computed on first use)."""
        if isinstance(x, int) or x is None:
            return x or 0
        if self._lines is None:
            self._lines = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(PositionProvider)
        p = self._lines.get(x)
        return p.start.line if p else 0
    raises_exit: Counter = field(default_factory=Counter)
    forward_detach: Counter = field(default_factory=Counter)


class _HasBackward(cst.CSTVisitor):
    def __init__(self):
        super().__init__()
        self.found = False

    def visit_Call(self, node):
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward":
            self.found = True
        return not self.found


class _Collector(cst.CSTVisitor):
    """One pass over a module. Lines are kept as nodes and resolved only for violations."""

    def __init__(self):
        super().__init__()
        self.f = _Facts()
        self._backward: dict[int, bool] = {}
        self._scope: list[str] = []
        self._classes: list[str] = []
        self._fn_depth = 0
        self._step_loops = 0
        self._loops_in_forward = 0

    # -- helpers ---------------------------------------------------------------
    def _line(self, node):
        return node  # resolved lazily by _Facts.line_of

    def _trains(self, body) -> bool:
        key = id(body)
        if key not in self._backward:
            v = _HasBackward()
            body.visit(v)
            self._backward[key] = v.found
        return self._backward[key]

    @property
    def scope(self) -> str:
        return ".".join(self._scope) or "<module>"

    def _in_forward(self) -> bool:
        return bool(self._scope) and self._scope[-1] in FORWARD_NAMES

    def _bind(self, name: str, node) -> None:
        self.f.bindings.setdefault(name, []).append(_Binding(node, self._line(node)))

    # -- definitions -------------------------------------------------------------
    def visit_ClassDef(self, node):
        self._scope.append(node.name.value)
        self._classes.append(node.name.value)
        self.f.symbols.setdefault(self.scope, []).append((code(node), self._line(node)))
        fields_ = set()
        if isinstance(node.body, cst.IndentedBlock):
            for s in node.body.body:
                if isinstance(s, cst.SimpleStatementLine):
                    for small in s.body:
                        if isinstance(small, cst.AnnAssign):
                            fields_.update(target_names(small.target))
                        elif isinstance(small, cst.Assign):
                            for t in small.targets:
                                fields_.update(target_names(t.target))
        self.f.class_fields[self.scope] = fields_
        if self._fn_depth == 0 and len(self._scope) == 1:
            self._bind(node.name.value, node.name)

    def leave_ClassDef(self, node):
        self._scope.pop()
        self._classes.pop()

    def visit_FunctionDef(self, node):
        if len(self._scope) == 0:
            self._bind(node.name.value, node.name)
        self._scope.append(node.name.value)
        self._fn_depth += 1
        self.f.symbols.setdefault(self.scope, []).append((code(node), self._line(node)))

    def leave_FunctionDef(self, node):
        self._scope.pop()
        self._fn_depth -= 1

    # -- bindings ------------------------------------------------------------------
    def visit_Assign(self, node):
        for t in node.targets:
            for name in target_names(t.target):
                self._bind(name, node)
            self._attr_target(t.target, node)
            self._env_target(t.target, node)

    def visit_AugAssign(self, node):
        for name in target_names(node.target):
            self._bind(name, node)
        self._attr_target(node.target, node)

    def visit_AnnAssign(self, node):
        if self._scope and self._scope[-1] in self._classes and self._fn_depth == 0:
            return  # a class field is part of its class's symbol text
        for name in target_names(node.target):
            self._bind(name, node)
        self._attr_target(node.target, node)

    def visit_NamedExpr(self, node):
        for name in target_names(node.target):
            self._bind(name, node)

    def visit_For(self, node):
        for name in target_names(node.target):
            self._bind(name, node.target)
        it = node.iter
        text = code(it)
        if _mentions_container(text, self.f.containers | LAYER_CONTAINERS):
            key = (self.scope, _norm(text))
            self.f.layer_loops[key] += 1
            self.f.layer_loop_lines.setdefault(key, self._line(node))
        if self._trains(node.body):
            self._step_loops += 1
            self.f.step_loop_headers[(self.scope, _norm(text))] += 1
        if self._in_forward():
            self._loops_in_forward += 1

    def leave_For(self, node):
        if self._trains(node.body):
            self._step_loops -= 1
        if self._in_forward():
            self._loops_in_forward -= 1

    def visit_While(self, node):
        if self._trains(node.body):
            self._step_loops += 1
            self.f.step_loop_headers[(self.scope, _norm(code(node.test)))] += 1

    def leave_While(self, node):
        if self._trains(node.body):
            self._step_loops -= 1

    def visit_WithItem(self, node):
        if node.asname is not None:
            for name in target_names(node.asname.name):
                self._bind(name, node)

    def visit_Global(self, node):
        for n in node.names:
            self._bind(n.name.value, node)

    def visit_Del(self, node):
        for name in target_names(node.target):
            self._bind(name, node)
        self._attr_target(node.target, node)

    def visit_Import(self, node):
        for a in node.names:
            full = code(a.name)
            bound = code(a.asname.name) if a.asname else full.split(".")[0]
            self.f.imports.add(full)
            self.f.import_lines.setdefault(full, self._line(node))
            self.f.import_aliases[bound] = full if a.asname else full.split(".")[0]
            self._bind(bound, node)

    def visit_ImportFrom(self, node):
        mod = code(node.module) if node.module else ""
        if isinstance(node.names, cst.ImportStar):
            self.f.imports.add(mod)
            return
        for a in node.names:
            name = code(a.name)
            bound = code(a.asname.name) if a.asname else name
            self.f.imports.add(f"{mod}.{name}")
            self.f.import_lines.setdefault(f"{mod}.{name}", self._line(node))
            self.f.import_aliases[bound] = f"{mod}.{name}"
            self._bind(bound, node)

    def _attr_target(self, target, node):
        if isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._attr_target(el.value, node)
            return
        if isinstance(target, cst.Attribute):
            d = _dotted(target) or code(target)
            self.f.attr_assigns.append((d, target.attr.value, self._line(node)))
            value = getattr(node, "value", None)
            if isinstance(value, cst.Call) and call_name(value) in LAYER_CONSTRUCTORS:
                self.f.containers.add(target.attr.value)

    def _env_target(self, target, node):
        if isinstance(target, cst.Subscript) and (_dotted(target.value) or "").endswith("environ"):
            key = target.slice[0].slice.value if isinstance(target.slice[0].slice, cst.Index) else None
            if isinstance(key, cst.SimpleString):
                self.f.env_writes.append((key.evaluated_value, self._line(node)))
        if isinstance(target, cst.Subscript) and m.matches(target.value, m.Call(func=m.Name("globals") | m.Name("vars"))):
            self.f.attr_assigns.append(("globals()[]", "globals", self._line(node)))

    # -- calls -----------------------------------------------------------------------
    def visit_Call(self, node):
        name = call_name(node)
        if not name:
            return
        d = _dotted(node.func) or name
        self.f.calls.append(_Call(name, d, node, self._line(node), self.scope, self._step_loops > 0))
        self.f.called_by.setdefault(self.scope, set()).add(name)
        if name in LOSS_CALLS or name.endswith(("_loss", "Loss")) or name in ("criterion", "loss_fn"):
            self.f.loss_sigs.setdefault(self.scope, Counter())[_loss_sig(node, name)] += 1
        if name in ("setdefault", "update", "putenv") and (d.startswith("os.environ") or d == "os.putenv"):
            if node.args and isinstance(node.args[0].value, cst.SimpleString):
                self.f.env_writes.append((node.args[0].value.evaluated_value, self._line(node)))
        if name == "setattr" and node.args:
            self.f.attr_assigns.append((f"setattr({code(node.args[0].value)})", _setattr_field(node), self._line(node)))
        if name == "detach" and self._in_forward():
            self.f.forward_detach[self.scope] += 1

    def visit_Attribute(self, node):
        if _dotted(node) == "sys.argv":
            self.f.argv += 1
            self.f.argv_line = self.f.argv_line or self._line(node)

    def visit_Subscript(self, node):
        v = node.value
        attr = v.attr.value if isinstance(v, cst.Attribute) else v.value if isinstance(v, cst.Name) else None
        if attr in (self.f.containers | LAYER_CONTAINERS) and any(isinstance(e.slice, cst.Slice) for e in node.slice):
            key = (self.scope, _norm(code(node)))
            self.f.layer_slices[key] += 1
            self.f.slice_lines.setdefault(key, self._line(node))

    # -- control flow --------------------------------------------------------------
    def visit_Try(self, node):
        for h in node.handlers:
            body = h.body.body if isinstance(h.body, cst.IndentedBlock) else []
            reraise = len(body) == 1 and m.matches(body[0], m.SimpleStatementLine(body=[m.Raise(exc=None)]))
            key = (self.scope, _norm(code(h)), reraise)
            self.f.handlers[key] += 1
            self.f.handler_lines.setdefault(key, self._line(h))

    def visit_With(self, node):
        for item in node.items:
            if isinstance(item.item, cst.Call) and call_name(item.item) == "suppress":
                key = (self.scope, _norm(code(item.item)), False)
                self.f.handlers[key] += 1
                self.f.handler_lines.setdefault(key, self._line(node))

    def visit_Return(self, node):
        if self._in_forward():
            self.f.returns[self.scope] += 1
            self.f.return_lines.setdefault(self.scope, self._line(node))
            if self._loops_in_forward:
                self.f.loop_returns[self.scope] += 1
        if self._step_loops:
            self.f.step_loop_exits[(self.scope, "return")] += 1
            self.f.exit_lines.setdefault((self.scope, "return"), self._line(node))

    def visit_Break(self, node):
        if self._step_loops:
            self.f.step_loop_exits[(self.scope, "break")] += 1
            self.f.exit_lines.setdefault((self.scope, "break"), self._line(node))
        if self._in_forward() and self._loops_in_forward:
            self.f.loop_returns[self.scope] += 1
            self.f.return_lines.setdefault(self.scope, self._line(node))

    def visit_Raise(self, node):
        if node.exc is not None:
            t = code(node.exc)
            for exc in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
                if t.startswith(exc):
                    self.f.raises_exit[exc] += 1
                    self.f.exit_lines.setdefault(exc, self._line(node))


def _mentions_container(text: str, names) -> bool:
    return any(text == c or re.search(rf"\.{re.escape(c)}\b", text) for c in names)


def _setattr_field(node: cst.Call) -> str:
    if len(node.args) > 1 and isinstance(node.args[1].value, cst.SimpleString):
        return node.args[1].value.evaluated_value
    return "?"


def _loss_sig(node: cst.Call, name: str) -> tuple:
    kws = {a.keyword.value: _norm(code(a.value)) for a in node.args if a.keyword is not None}
    sig = [LOSS_EQUIVALENT.get(name, name)]
    for k, default in LOSS_DEFAULTS.items():
        sig.append((k, kws.get(k, _norm(default))))
    return tuple(sig)


_FACTS: dict[str, _Facts] = {}


def _facts(text: str) -> _Facts:
    """Facts of one source text (cached: the original is checked against many candidates)."""
    got = _FACTS.get(text)
    if got is None:
        c = _Collector()
        module = cst.parse_module(text)
        module.visit(c)
        c.f.module = module
        if len(_FACTS) >= 32:
            _FACTS.pop(next(iter(_FACTS)))
        got = _FACTS[text] = c.f
    return got


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


# -------------------------------------------------------------------- check ----

def check_candidate(original: dict[str, str], candidate: dict[str, str], protected: list[ProtectedRegion],
                    editable: list[str], target: str) -> GuardVerdict:
    """Every rule of RULES, for every file the candidate changed."""
    v: list[Violation] = []

    def add(rule: str, file: str, line: int, message: str):
        v.append(Violation(rule=rule, file=file, line=line, message=message, severity=RULES[rule].severity))

    for rel in sorted(set(original) | set(candidate)):
        before, after = original.get(rel), candidate.get(rel)
        if before == after:
            continue
        if before is None or after is None:
            add("not_editable", rel, 0, "file " + ("added" if before is None else "removed") +
                ": a candidate rewrites existing editable files only")
            continue
        if not any(fnmatch.fnmatch(rel, g) for g in editable):
            add("not_editable", rel, 0, "file is not editable under the manifest")
            continue
        regions = [p for p in protected if p.file == rel]
        if any(p.whole_file for p in regions):
            add("protected_file", rel, 0, "protected file edited (" + "; ".join(p.reason for p in regions if p.reason) + ")")
            continue
        if not rel.endswith(".py"):
            continue
        try:
            fb = _facts(before)
        except cst.ParserSyntaxError:
            continue  # the original itself does not parse: nothing to compare against
        try:
            fa = _facts(after)
        except cst.ParserSyntaxError as e:
            add("parse", rel, e.raw_line, str(e).splitlines()[0])
            continue
        for rule in _FILE_RULES:
            for r, line, msg in rule(fb, fa, regions, target):
                add(r, rel, fa.line_of(line), msg)
    return GuardVerdict(passed=not any(x.severity == "error" for x in v), violations=v)


Finding = tuple[str, int, str]
FileRule = Callable[[_Facts, _Facts, list[ProtectedRegion], str], Iterable[Finding]]


def _new(counter_b: Counter, counter_a: Counter):
    return [(k, n - counter_b.get(k, 0)) for k, n in counter_a.items() if n > counter_b.get(k, 0)]


def _rule_protected(fb: _Facts, fa: _Facts, regions, target):
    for region in regions:
        why = f" ({region.reason})" if region.reason else ""
        for sym in region.symbols:
            if sym not in fb.symbols:
                continue
            (b_text, _), = fb.symbols[sym][:1]
            got = fa.symbols.get(sym)
            if not got:
                yield "protected_symbol", 0, f"protected {sym} removed{why}"
                continue
            if len(got) > len(fb.symbols[sym]):
                yield "protected_symbol", got[-1][1], f"protected {sym} is defined again (shadowed){why}"
            a_text, a_line = got[0]
            if a_text != b_text:
                if _norm(a_text) == _norm(b_text):
                    yield "protected_symbol_format", a_line, f"protected {sym}: only comments/formatting changed"
                else:
                    yield "protected_symbol", a_line, f"protected {sym} changed{why}"
            top = sym.split(".")[0]
            if "." not in sym:
                nb, na = fb.bindings.get(top, []), fa.bindings.get(top, [])
                if Counter(t for t, _ in na) - Counter(t for t, _ in nb):
                    line = next((ln for t, ln in na if t not in {x for x, _ in nb}), 0)
                    yield "protected_symbol", line, f"protected {sym} is rebound{why}"
            # its fields may not be overwritten afterwards
            for field_ in fb.class_fields.get(sym, set()):
                nb = Counter((d, f) for d, f, _ in fb.attr_assigns if f == field_)
                for d, f_, line in fa.attr_assigns:
                    if f_ == field_ and nb[(d, f_)] <= 0:
                        yield "protected_field", line, f"{d} overwrites field {field_!r} of protected {sym}{why}"
                    elif f_ == field_:
                        nb[(d, f_)] -= 1
            fields_ = fb.class_fields.get(sym, set())
            if fields_:
                cb = Counter(c.text for c in fb.calls if c.name in ("replace", sym.split(".")[-1]))
                for c in fa.calls:
                    if c.name in ("replace", sym.split(".")[-1]) and cb[c.text] <= 0 and \
                            any(f"keyword='{f_}'" in c.text for f_ in fields_):
                        yield "protected_field", c.line, f"{c.name}(...) sets fields of protected {sym}{why}"
                    elif c.name in ("replace", sym.split(".")[-1]):
                        cb[c.text] -= 1
            # calls to it keep their arguments
            short = sym.split(".")[-1]
            cb = Counter(c.text for c in fb.calls if c.name == short)
            ca = Counter(c.text for c in fa.calls if c.name == short)
            for text, _n in _new(cb, ca):
                line = next(c.line for c in fa.calls if c.name == short and c.text == text)
                yield "protected_call", line, f"a call to protected {sym} has new arguments{why}"
        for name in region.names:
            nb = Counter(t for t, _ in fb.bindings.get(name, []))
            na = Counter(t for t, _ in fa.bindings.get(name, []))
            if nb != na:
                added = na - nb
                line = next((ln for t, ln in fa.bindings.get(name, []) if t in added), 0)
                what = "new or changed assignment" if added else "assignment removed"
                yield "protected_name", line, f"{what} to protected name {name!r}{why}"
            if any(d.endswith(f".{name}") or f == name for d, f, _ in fa.attr_assigns
                   if (d, f) not in {(x, y) for x, y, _ in fb.attr_assigns} and (d.startswith(("setattr(", "globals")))):
                yield "protected_name", 0, f"protected name {name!r} written through setattr/globals(){why}"


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
        if root == "torch_npu" and target in ("cpu", "cuda"):
            yield "target_api", fa.import_lines.get(mod, 0), f"imports torch_npu in a candidate for {target}"


def _rule_patching(fb: _Facts, fa: _Facts, regions, target):
    before = Counter((d, f) for d, f, _ in fb.attr_assigns)
    roots = PATCH_ROOTS | set(fa.import_aliases)
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


_FILE_RULES: list[FileRule] = [_rule_protected, _rule_calls, _rule_imports, _rule_patching, _rule_fallback,
                               _rule_loss, _rule_structure]
