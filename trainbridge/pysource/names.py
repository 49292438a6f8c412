"""Which names a piece of code reads and which it binds.

Following a local name to its value (`scope.Scope`), deciding whether an assignment is
still read (`edits.dead_statements`) and checking that a helper name is free all need the
same two answers, given here once: the names an expression or statement loads, and the
names a statement or block binds (outside nested scopes).
"""

from __future__ import annotations

from collections import Counter

import libcst as cst

from .syntax import code


class _Loads(cst.CSTVisitor):
    """Names read by an expression or statement (not attribute names, keywords, params)."""

    def __init__(self):
        self.nodes: list[cst.Name] = []

    def visit_Name(self, node):
        self.nodes.append(node)

    def visit_Attribute(self, node):
        node.value.visit(self)
        return False

    def visit_Arg(self, node):
        node.value.visit(self)
        return False

    def visit_Param(self, node):
        if node.default is not None:
            node.default.visit(self)
        return False

    def visit_ImportAlias(self, node):
        return False

    def visit_FunctionDef(self, node):
        # a nested function's body reads its own names; count them all (conservative)
        for d in node.decorators:
            d.visit(self)
        node.body.visit(self)
        return False


def load_name_nodes(node: cst.CSTNode) -> list[cst.Name]:
    v = _Loads()
    node.visit(v)
    return v.nodes


def load_names(node: cst.CSTNode) -> Counter[str]:
    return Counter(n.value for n in load_name_nodes(node))


def target_names(target) -> list[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


class _Assigned(cst.CSTVisitor):
    """Every local name a statement (or block) binds, at any depth except nested scopes."""

    def __init__(self):
        self.names: set[str] = set()

    def visit_AssignTarget(self, node):
        self.names.update(target_names(node.target))

    def visit_AugAssign(self, node):
        self.names.update(target_names(node.target))

    def visit_AnnAssign(self, node):
        self.names.update(target_names(node.target))

    def visit_For(self, node):
        self.names.update(target_names(node.target))

    def visit_WithItem(self, node):
        if node.asname is not None:
            self.names.update(target_names(node.asname.name))

    def visit_NamedExpr(self, node):
        self.names.update(target_names(node.target))

    def visit_ExceptHandler(self, node):
        if node.name is not None:
            self.names.update(target_names(node.name.name))

    def visit_ImportAlias(self, node):
        bound = node.asname.name if node.asname else node.name
        if isinstance(bound, cst.Name):
            self.names.add(bound.value)
        elif isinstance(bound, cst.Attribute):
            self.names.add(code(bound).split(".")[0])

    def visit_FunctionDef(self, node):
        self.names.add(node.name.value)
        return False

    def visit_ClassDef(self, node):
        self.names.add(node.name.value)
        return False

    def visit_Lambda(self, node):
        return False


def assigned_names(node: cst.CSTNode) -> set[str]:
    v = _Assigned()
    node.visit(v)
    return v.names
