"""One pass over a module that records the guard's facts.

A single libcst visitor fills `facts._Facts` (definitions, bindings, calls, attribute and
environment writes, handlers, loop exits, layer slicing, imports, loss signatures); the
result is cached per source text, since the original is checked against many candidates.
"""

from __future__ import annotations

import re
from collections import Counter

import libcst as cst
import libcst.matchers as m

from ...pysource.names import target_names
from ...pysource.shapes import call_name
from ...pysource.syntax import code
from .facts import _Binding, _Call, _dotted, _Facts, _norm
from .vocabulary import (
    FORWARD_NAMES,
    LAYER_CONSTRUCTORS,
    LAYER_CONTAINERS,
    LOSS_CALLS,
    LOSS_DEFAULTS,
    LOSS_EQUIVALENT,
    REFLECTION_ATTRIBUTES,
)


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
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and \
                isinstance(node.value, (cst.Name, cst.Attribute)) and (value := _dotted(node.value)):
            self.f.name_aliases[node.targets[0].target.value] = value
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
        d = _dotted(node)
        if d == "sys.argv":
            self.f.argv += 1
            self.f.argv_line = self.f.argv_line or self._line(node)
        what = d if d in REFLECTION_ATTRIBUTES else node.attr.value if node.attr.value in REFLECTION_ATTRIBUTES \
            else None
        if what:
            self._reflect(what, node)

    def visit_Name(self, node):
        if node.value == "__builtins__":
            self._reflect(node.value, node)

    def _reflect(self, what: str, node) -> None:
        self.f.reflection[what] += 1
        self.f.reflection_lines.setdefault(what, self._line(node))

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
