"""A single-assignment view of a block of statements, so split statements match like chained ones.

A matcher *follows* a local name to the expression it was assigned
(`var = x.pow(2).mean(-1, keepdim=True)`), and two expressions written at different
statements are compared by what they compute (`Scope.same`), not by their text. Re-emitting
an expression at another statement is refused when it would repeat a call with effects,
which is why the set of pure calls lives here too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from .names import assigned_names, load_name_nodes
from .shapes import call_name, strip_parens
from .syntax import _walk, canon, parens

ITEM = "__tb_item__"  # synthetic call: ITEM(value, i) stands for element i of a tuple unpack


@dataclass
class Def:
    index: int
    value: cst.BaseExpression | None  # None: bound in a way we do not follow (opaque)


@dataclass(frozen=True)
class Ref:
    """An expression as it is written at statement `at` of a scope."""

    node: cst.BaseExpression
    scope: "Scope"
    at: int

    def with_node(self, node) -> "Ref":
        return Ref(node, self.scope, self.at)


class Scope:
    """Single-assignment view of one block of statements (a function body or a nested block).

    `defs[name]` lists where the block assigns `name` and to what. A name read at
    statement i means its last assignment before i in this block; when the block has none,
    the enclosing block's meaning at the compound statement holding this block, unless the
    name is a `barrier` (bound elsewhere in that compound statement, e.g. inside a loop,
    where the back edge makes the textual order meaningless): then it is opaque.
    """

    def __init__(self, stmts: Sequence[cst.BaseStatement], parent: "Scope | None" = None,
                 parent_at: int = 0, barrier: set[str] | None = None, params: Iterable[str] = (),
                 loop: bool = False):
        self.stmts = list(stmts)
        self.loop = loop
        self.parent, self.parent_at = parent, parent_at
        self.barrier = set(barrier or ())
        self.params = set(params)
        self.defs: dict[str, list[Def]] = {}
        for i, s in enumerate(self.stmts):
            self._collect(i, s)

    def _add(self, name, index, value):
        self.defs.setdefault(name, []).append(Def(index, value))

    def _collect(self, i: int, s: cst.BaseStatement) -> None:
        if isinstance(s, cst.SimpleStatementLine):
            for small in s.body:
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    t, v = small.targets[0].target, small.value
                    if isinstance(t, cst.Name):
                        self._add(t.value, i, v)
                        continue
                    if isinstance(t, (cst.Tuple, cst.List)) and all(isinstance(e.value, cst.Name) for e in t.elements):
                        vv = strip_parens(v)
                        if isinstance(vv, (cst.Tuple, cst.List)) and len(vv.elements) == len(t.elements) and \
                                not any(isinstance(e, cst.StarredElement) for e in vv.elements):
                            for el, ve in zip(t.elements, vv.elements):
                                self._add(el.value.value, i, ve.value)
                        else:
                            for k, el in enumerate(t.elements):
                                self._add(el.value.value, i, cst.Call(func=cst.Name(ITEM), args=[
                                    cst.Arg(v), cst.Arg(cst.Integer(str(k)))]))
                        continue
                for name in assigned_names(small):
                    self._add(name, i, None)
        else:
            for name in assigned_names(s):
                self._add(name, i, None)

    def lookup(self, name: str, at: int) -> tuple[Def, "Scope"] | None:
        best = None
        for d in self.defs.get(name, []):
            if d.index < at:
                best = d
        if best is not None:
            return best, self
        if name in self.barrier or name in self.params:
            return None
        if self.parent is not None:
            return self.parent.lookup(name, self.parent_at)
        return None

    # -- following names ----------------------------------------------------
    def follow(self, ref: Ref, used: set | None = None, *, max_depth: int = 16) -> Ref:
        """The expression a local name stands for (through chains of names); else ref."""
        for _ in range(max_depth):
            node = strip_parens(ref.node)
            if not isinstance(node, cst.Name):
                return ref.with_node(node)
            hit = ref.scope.lookup(node.value, ref.at)
            if hit is None or hit[0].value is None:
                return ref.with_node(node)
            d, scope = hit
            if used is not None:
                used.add((id(scope), d.index))
            ref = Ref(d.value, scope, d.index)
        return ref

    def resolve(self, ref: Ref, depth: int = 0) -> cst.BaseExpression:
        """The expression with every followable local name replaced by its value."""
        if depth > 12:
            return ref.node
        targets = {}
        for n in load_name_nodes(ref.node):
            hit = ref.scope.lookup(n.value, ref.at)
            if hit is not None and hit[0].value is not None:
                d, scope = hit
                targets[id(n)] = parens(self.resolve(Ref(d.value, scope, d.index), depth + 1))
        if not targets:
            return ref.node
        return ref.node.visit(_ReplaceIds(targets))

    def canon(self, ref: Ref) -> str:
        return canon(self.resolve(ref))

    def same(self, a: Ref, b: Ref) -> bool:
        return self.canon(a) == self.canon(b)

    def emit(self, ref: Ref, at: Ref) -> cst.BaseExpression | None:
        """`ref`'s expression written so that it means the same at statement `at`.

        None when that would repeat, at `at`, a call with effects (a module call such as
        `self.up(x)`) that another statement already evaluates: the caller must not match.
        """
        if ref.scope is at.scope and ref.at == at.at:
            return ref.node
        if _has_effects(ref.node):
            return None
        here = Ref(ref.node, at.scope, at.at)
        if self.canon(here) == self.canon(ref):
            return ref.node
        return parens(self.resolve(ref))


class _ReplaceIds(cst.CSTTransformer):
    def __init__(self, targets: dict[int, cst.CSTNode]):
        super().__init__()
        self.targets = targets

    def on_leave(self, original, updated):
        rep = self.targets.get(id(original))
        return rep if rep is not None else updated


_PURE_CALLS = {"pow", "square", "mean", "sum", "rsqrt", "sqrt", "size", "float", "type_as", "to", "view",
               "reshape", "transpose", "chunk", "split", "unbind", "cat", "stack", "softmax", "masked_fill",
               "matmul", "bmm", "tanh", "relu", "neg", "contiguous", "add", "mul", "div", "sub", "bfloat16",
               "half", "triu", "tril", "ones", "zeros", "ones_like", "zeros_like", "outer", "cos", "sin",
               "exp", "log", "clamp", "abs", "expand", "unsqueeze", "squeeze", "permute", "roll", "flip",
               ITEM, "float32", "type", "masked_fill_", "where", "baddbmm", "empty", "empty_like", "full",
               "full_like", "finfo", "einsum", "view_as_complex", "view_as_real", "flatten", "sigmoid", "silu",
               "gelu", "erf"}


def _has_effects(node) -> bool:
    """Calls other than the pure tensor operations a matched pattern consists of."""
    for sub in _walk(node):
        if isinstance(sub, cst.Call) and call_name(sub) not in _PURE_CALLS:
            return True
    return False
