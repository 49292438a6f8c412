"""The engine behind the recipes that replace one computation by another inside functions.

For every statement of every function (nested blocks included), the recipe's matcher is
offered each expression, outermost first; a match names the node to replace, its
replacement, the local assignments it *used up* (followed through names), imports, module
helpers and statements to insert before the statement. The engine then deletes the used-up
assignments that nothing else reads, adds the imports/helpers once, and reports each match
as a `Site` with its original line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from ...pysource.edits import Edits, dead_statements
from ...pysource.imports import ensure_imports, functional_alias, insert_after_imports
from ...pysource.names import assigned_names
from ...pysource.scope import Ref, Scope
from ...pysource.sites import positions, StatementSite, iter_functions, iter_statements
from ...pysource.syntax import code, stmt
from .recipe_base import Recipe, Site, shorten


@dataclass
class Match:
    node: cst.CSTNode  # the original node to replace
    new: cst.CSTNode | None  # its replacement (None: leave it, e.g. a whole-statement edit elsewhere)
    used: set = field(default_factory=set)  # (id(scope), index) of assignments followed
    imports: list[str] = field(default_factory=list)
    helpers: list[tuple[str, str]] = field(default_factory=list)  # (name, module-level source)
    pre: list[cst.BaseStatement] = field(default_factory=list)  # statements inserted before the statement
    notes: list[str] = field(default_factory=list)
    detail: dict[str, str] = field(default_factory=dict)
    stmt_edits: list[tuple[cst.CSTNode, cst.CSTNode | None]] = field(default_factory=list)  # extra (node, new|None=drop)
    # used assignments whose call's effect the replacement takes over (a dropout's random draw,
    # now inside the fused call): deleted when dead although a call has effects
    effects_spent: set = field(default_factory=set)


@dataclass
class Env:
    """What a matcher knows besides the expression: where it is and how the module spells things."""

    site: StatementSite
    target: str
    F: str  # torch.nn.functional's local name
    module: cst.Module
    rel: str

    @property
    def scope(self) -> Scope:
        return self.site.scope

    def ref(self, node) -> Ref:
        return Ref(node, self.site.scope, self.site.at)


def _header_nodes(s: cst.BaseStatement) -> list[cst.CSTNode]:
    if isinstance(s, cst.SimpleStatementLine):
        return list(s.body)
    if isinstance(s, cst.If) or isinstance(s, cst.While):
        return [s.test]
    if isinstance(s, cst.For):
        return [s.iter]
    if isinstance(s, cst.With):
        return [i.item for i in s.items]
    return []


class ExprRecipe(Recipe):
    """A recipe whose matcher is `match(node, env) -> Match | None`."""

    def match(self, node: cst.CSTNode, env: Env) -> Match | None:
        raise NotImplementedError

    def skip_function(self, qualname: str, fn: cst.FunctionDef) -> bool:
        return False

    # ------------------------------------------------------------------------
    def _matches(self, rel: str, text: str, target: str):
        # find() and apply() both need the matches of the same text: computed once
        key = (rel, text, target)
        memo = self.__dict__.setdefault("_memo", {})
        if key not in memo:
            if len(memo) >= 16:
                memo.pop(next(iter(memo)))
            memo[key] = self._compute_matches(rel, text, target)
        return memo[key]

    def _compute_matches(self, rel: str, text: str, target: str):
        pos = positions(text)
        F = functional_alias(pos.module)
        out: list[tuple[Site, Match, StatementSite]] = []
        for fi in iter_functions(pos.module):
            if self.skip_function(fi.qualname, fi.node):
                continue
            for ss in iter_statements(fi.node, fi.qualname, fi.class_def):
                env = Env(ss, target, F, pos.module, rel)
                for root in _header_nodes(ss.stmt):
                    for mt in self._scan(root, env):
                        node = mt.node
                        site = Site(file=rel, qualname=fi.qualname, line=pos.line(node), end_line=pos.end_line(node),
                                    text=shorten(code(node)), detail=mt.detail)
                        out.append((site, mt, ss))
        return pos, out

    def _scan(self, node, env: Env):
        if isinstance(node, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
            return
        mt = self.match(node, env) if isinstance(node, (cst.BaseExpression, cst.BaseSmallStatement)) else None
        if mt is not None:
            yield mt
            return
        for child in node.children:
            yield from self._scan(child, env)

    def _find_file(self, rel, text, target):
        _, found = self._matches(rel, text, target)
        return [s for s, _, _ in found]

    def _rewrite_file(self, rel, text, target, sites):
        pos, found = self._matches(rel, text, target)
        want = {(s.qualname, s.line) for s in sites}
        edits = Edits()
        done, notes, imports, helpers = [], [], [], []
        per_function: dict[int, tuple[cst.FunctionDef, list]] = {}
        spent: set[int] = set()
        for site, mt, ss in found:
            if (site.qualname, site.line) not in want:
                continue
            if any(edits.touched(n) for n in _ancestors_in(mt.node, edits)):
                continue
            if mt.new is not None:
                edits.sub(mt.node, mt.new)
            for node, new in mt.stmt_edits:
                if new is None:
                    edits.drop(node)
                else:
                    edits.sub(node, new)
            if mt.pre:
                edits.insert_before(ss.stmt, mt.pre)
            fn_stmts = _statements_by_key(ss)
            used_stmts = [fn_stmts[k] for k in mt.used if k in fn_stmts]
            spent |= {id(fn_stmts[k][0]) for k in mt.effects_spent if k in fn_stmts}
            per_function.setdefault(id(ss.function), (ss.function, []))[1].extend(used_stmts)
            done.append(site)
            notes.extend(n for n in mt.notes if n not in notes)
            imports.extend(i for i in mt.imports if i not in imports)
            helpers.extend(h for h in mt.helpers if h not in helpers)
        if not done:
            return text, [], []
        for fn, used in per_function.values():
            for dead in dead_statements(fn, used, edits, effects_ok=spent):
                edits.drop(dead)
        module = edits.apply(pos.module)
        module = ensure_imports(module, imports)
        have = assigned_names(module)
        new_helpers = [stmt(src) if "\n" not in src.strip() else cst.parse_module(src).body
                       for name, src in helpers if name not in have]
        flat = []
        for h in new_helpers:
            flat.extend(h if isinstance(h, (list, tuple)) else [h])
        if flat:
            module = insert_after_imports(module, flat)
        return module.code, done, notes


def _ancestors_in(node, edits: Edits):
    return [node]


def _statements_by_key(ss: StatementSite) -> dict:
    """(id(scope), index) -> statement, for the scope chain of a statement site."""
    out = {}
    scope = ss.scope
    while scope is not None:
        for i, s in enumerate(scope.stmts):
            out[(id(scope), i)] = (s, scope, i)
        scope = scope.parent
    return out
