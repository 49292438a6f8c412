"""Finding the functions, methods and statements of a module, and their line numbers.

Recipes look for sites function by function: `iter_functions` yields every function with its
dotted qualname, `iter_statements` every statement of one (nested blocks included) with the
`Scope` that resolves names there, and `Positions` maps nodes and lines back to the source
(parsed once per text and cached, since every recipe's find and apply read the same text).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from .names import assigned_names, target_names
from .scope import Ref, Scope
from .shapes import call_name


def function_params(fn: cst.FunctionDef) -> list[str]:
    p = fn.params
    out = [x.name.value for x in [*p.posonly_params, *p.params, *p.kwonly_params]]
    for star in (p.star_arg, p.star_kwarg):
        if isinstance(star, cst.Param):
            out.append(star.name.value)
    return out


@dataclass
class StatementSite:
    """One statement of a function, with the scope that resolves names at it."""

    stmt: cst.BaseStatement
    scope: Scope
    at: int
    function: cst.FunctionDef
    qualname: str
    class_def: cst.ClassDef | None
    in_loop: bool = False


def _blocks_of(s: cst.BaseStatement) -> list[tuple[Sequence[cst.BaseStatement], bool, cst.CSTNode]]:
    """Nested statement blocks of a compound statement: (statements, is_loop, owner)."""
    out = []
    loop = isinstance(s, (cst.For, cst.While))

    def add(body, owner=s):
        if isinstance(body, cst.IndentedBlock):
            out.append((body.body, loop, owner))

    if isinstance(s, (cst.If,)):
        add(s.body)
        orelse = s.orelse
        while orelse is not None:
            add(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
    elif isinstance(s, (cst.For, cst.While)):
        add(s.body)
        if s.orelse is not None:
            add(s.orelse.body)
    elif isinstance(s, cst.With):
        add(s.body)
    elif isinstance(s, cst.Try):
        add(s.body)
        for h in s.handlers:
            add(h.body)
        if s.orelse is not None:
            add(s.orelse.body)
        if s.finalbody is not None:
            add(s.finalbody.body)
    return out


def iter_statements(fn: cst.FunctionDef, qualname: str, class_def: cst.ClassDef | None) -> Iterator[StatementSite]:
    """Every statement of a function (nested blocks included, nested functions excluded)."""
    if not isinstance(fn.body, cst.IndentedBlock):
        return
    root = Scope(fn.body.body, params=function_params(fn))

    def walk(scope: Scope, in_loop: bool):
        for i, s in enumerate(scope.stmts):
            yield StatementSite(s, scope, i, fn, qualname, class_def, in_loop)
            for body, is_loop, owner in _blocks_of(s):
                barrier = assigned_names(owner) if is_loop else set()
                if isinstance(owner, cst.With):
                    barrier |= {n for item in owner.items if item.asname for n in target_names(item.asname.name)}
                if isinstance(owner, cst.For):
                    barrier |= set(target_names(owner.target))
                yield from walk(Scope(body, parent=scope, parent_at=i, barrier=barrier, loop=is_loop), in_loop or is_loop)

    yield from walk(root, False)


@dataclass
class FunctionInfo:
    node: cst.FunctionDef
    qualname: str
    class_def: cst.ClassDef | None
    parent_function: cst.FunctionDef | None


def iter_functions(module: cst.Module) -> Iterator[FunctionInfo]:
    """Every function and method with its dotted qualname (`GPT.forward`, `main.inner`)."""

    def walk(body, prefix: list[str], cls, parent_fn):
        for s in body:
            if isinstance(s, cst.FunctionDef):
                q = ".".join([*prefix, s.name.value])
                yield FunctionInfo(s, q, cls, parent_fn)
                if isinstance(s.body, cst.IndentedBlock):
                    yield from walk(_flat(s.body.body), [*prefix, s.name.value], None, s)
            elif isinstance(s, cst.ClassDef):
                if isinstance(s.body, cst.IndentedBlock):
                    yield from walk(s.body.body, [*prefix, s.name.value], s, parent_fn)
            else:
                for blk, _, _ in _blocks_of(s):
                    yield from walk(blk, prefix, cls, parent_fn)

    def _flat(stmts):
        out = []
        for s in stmts:
            out.append(s)
            if not isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                for blk, _, _ in _blocks_of(s):
                    out.extend(_flat(blk))
        return [s for s in out if isinstance(s, (cst.FunctionDef, cst.ClassDef))]

    yield from walk(module.body, [], None, None)


def class_init(class_def: cst.ClassDef | None) -> cst.FunctionDef | None:
    if class_def is None or not isinstance(class_def.body, cst.IndentedBlock):
        return None
    for s in class_def.body.body:
        if isinstance(s, cst.FunctionDef) and s.name.value == "__init__":
            return s
    return None


def self_attribute_value(class_def: cst.ClassDef | None, attr: str) -> Ref | None:
    """What `self.<attr>` was set to in the class's __init__ (assignment or register_buffer)."""
    init = class_init(class_def)
    if init is None:
        return None
    found = None
    for site in iter_statements(init, "__init__", class_def):
        s = site.stmt
        if not isinstance(s, cst.SimpleStatementLine):
            continue
        for small in s.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1 and \
                    m.matches(small.targets[0].target, m.Attribute(value=m.Name("self"), attr=m.Name(attr))):
                found = Ref(small.value, site.scope, site.at)
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) and \
                    call_name(small.value) == "register_buffer" and len(small.value.args) >= 2:
                name = small.value.args[0].value
                if isinstance(name, cst.SimpleString) and name.evaluated_value == attr:
                    found = Ref(small.value.args[1].value, site.scope, site.at)
    return found


class Positions:
    """Line numbers of nodes of one parsed module (metadata computed once).

    Instances are cached per source text (`positions()`): libcst trees are immutable and every
    edit builds a new tree, so one parse serves every recipe's find and apply on that text.
    """

    def __init__(self, text: str):
        self.wrapper = MetadataWrapper(cst.parse_module(text), unsafe_skip_copy=True)
        self.module = self.wrapper.module
        self._pos = self.wrapper.resolve(PositionProvider)
        self._quals: dict[int, str] | None = None

    def qualnames(self) -> dict[int, str]:
        """line -> innermost function qualname covering it."""
        if self._quals is None:
            out: dict[int, str] = {}
            for fi in sorted(iter_functions(self.module), key=lambda f: self.line(f.node)):
                for ln in range(self.line(fi.node), self.end_line(fi.node) + 1):
                    out[ln] = fi.qualname
            self._quals = out
        return self._quals

    def line(self, node) -> int:
        p = self._pos.get(node)
        return p.start.line if p else 0

    def end_line(self, node) -> int:
        p = self._pos.get(node)
        return p.end.line if p else 0


_POSITIONS: dict[str, Positions] = {}


def positions(text: str) -> Positions:
    """The cached parse of `text` (at most 32 texts kept)."""
    got = _POSITIONS.get(text)
    if got is None:
        if len(_POSITIONS) >= 32:
            _POSITIONS.pop(next(iter(_POSITIONS)))
        got = _POSITIONS[text] = Positions(text)
    return got
