"""One batch of node replacements, deletions and insertions, applied in a single pass.

Edits are keyed by the original nodes a matcher found, so many recipes' changes to one tree
compose without re-parsing. `dead_statements` then finds the assignments a match used up and
nothing reads any more, so they can be removed with it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import libcst as cst

from .names import assigned_names, load_names
from .scope import _has_effects


@dataclass
class Edits:
    """Replacements and deletions keyed by original nodes, applied in one pass."""

    replace: dict[int, cst.CSTNode] = field(default_factory=dict)
    delete: set[int] = field(default_factory=set)
    before: dict[int, list[cst.BaseStatement]] = field(default_factory=dict)
    keep: list = field(default_factory=list)  # keeps keyed nodes alive (ids stay unique)

    def sub(self, original: cst.CSTNode, new: cst.CSTNode) -> None:
        self.keep.append(original)
        self.replace[id(original)] = new

    def drop(self, original: cst.CSTNode) -> None:
        self.keep.append(original)
        self.delete.add(id(original))

    def insert_before(self, original: cst.BaseStatement, new: list[cst.BaseStatement]) -> None:
        self.keep.append(original)
        self.before.setdefault(id(original), []).extend(new)

    def touched(self, node: cst.CSTNode) -> bool:
        return id(node) in self.replace or id(node) in self.delete

    def __bool__(self) -> bool:
        return bool(self.replace or self.delete or self.before)

    def apply(self, module: cst.Module) -> cst.Module:
        return module.visit(_Apply(self))


class _Apply(cst.CSTTransformer):
    def __init__(self, edits: Edits):
        super().__init__()
        self.e = edits

    def on_leave(self, original, updated):
        key = id(original)
        if key in self.e.delete:
            return cst.RemoveFromParent()
        out = self.e.replace.get(key, updated)
        pre = self.e.before.get(key)
        if pre:
            return cst.FlattenSentinel([*pre, out])
        return out


def dead_statements(function: cst.FunctionDef, candidates: Iterable[tuple], edits: Edits,
                    effects_ok: set[int] = frozenset()) -> list:
    """Which candidate assignments (statement, scope, index) nothing reads any more.

    Def-aware within the candidate's block: an assignment of `n` at index i is read by the
    statements from i+1 up to and including the next assignment of `n` (which may read the
    old value, as in `att = att.softmax(-1)`), outside deleted statements and replaced nodes
    (a replacement's own names count). In a loop body every statement of the block counts
    (the back edge), and for a nested block every later statement of the enclosing blocks
    counts. Iterates, since deleting one assignment can free the ones it read. An assignment
    whose value has effects (a call) stays, unless its id is in `effects_ok` (the replacement
    took the effect over).
    """
    cands = []
    for c, scope, i in candidates:
        if isinstance(c, cst.SimpleStatementLine) and len(c.body) == 1 and isinstance(c.body[0], cst.Assign) \
                and (id(c) in effects_ok or not _has_effects(c.body[0].value)) and (c, scope, i) not in cands:
            cands.append((c, scope, i))
    dead: list = []
    while True:
        changed = False
        gone = {id(x) for x in dead} | edits.delete
        for c, scope, i in cands:
            if c in dead:
                continue
            live = False
            for n in assigned_names(c):
                nxt = next((d.index for d in scope.defs.get(n, []) if d.index > i), len(scope.stmts) - 1)
                region = list(scope.stmts[i + 1: nxt + 1])
                if scope.loop:
                    region += scope.stmts[: i]
                p, at = scope.parent, scope.parent_at
                while p is not None:
                    region += p.stmts[at + 1:] if not p.loop else p.stmts
                    p, at = p.parent, p.parent_at
                reads = Counter()
                for stmt_ in region:
                    if stmt_ is not c:
                        _count_reads(stmt_, gone, edits, reads)
                if reads[n]:
                    live = True
                    break
            if not live:
                dead.append(c)
                changed = True
        if not changed:
            return dead


def _count_reads(node, gone: set[int], edits: Edits, reads: Counter) -> None:
    if id(node) in gone:
        return
    if id(node) in edits.replace:
        reads.update(load_names(edits.replace[id(node)]))
        return
    if isinstance(node, cst.Name):
        reads[node.value] += 1
        return
    if isinstance(node, cst.Attribute):
        _count_reads(node.value, gone, edits, reads)
        return
    if isinstance(node, cst.Arg):
        _count_reads(node.value, gone, edits, reads)
        return
    if isinstance(node, cst.AssignTarget):
        # a target is a write; its subscripts/attributes' bases are reads
        t = node.target
        if not isinstance(t, (cst.Name, cst.Tuple, cst.List)):
            _count_reads(t, gone, edits, reads)
        return
    for child in node.children:
        _count_reads(child, gone, edits, reads)
