"""Source text to libcst nodes and back, and comparison by meaning rather than by text.

Every other pysource module builds on these: `code`/`expr`/`stmt` convert between text and
nodes, `canon` keys an expression by Python's own `ast.dump` (so redundant parentheses and
formatting never matter), `parens` keeps operator precedence when a node is substituted into
another, `walk` visits a tree outermost first, and `parses` tells whether a candidate text is
valid Python at all.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import libcst as cst

_EMPTY = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node).strip()


def expr(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


def stmt(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text if text.endswith("\n") else text + "\n")


def canon(node: cst.CSTNode) -> str:
    """A formatting- and parenthesis-independent key for an expression."""
    text = code(node)
    try:
        return ast.dump(ast.parse(f"({text})", mode="eval"))
    except SyntaxError:  # synthetic nodes are always valid; be safe anyway
        return text


def parens(node: cst.BaseExpression) -> cst.BaseExpression:
    """The node wrapped in parentheses (when its type supports them and it has none)."""
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer, cst.Float,
                         cst.SimpleString)):
        return node
    if hasattr(node, "lpar") and not node.lpar:
        return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return node


def _walk(node) -> Iterator[cst.CSTNode]:
    yield node
    for c in node.children:
        yield from _walk(c)


def walk(node) -> Iterator[cst.CSTNode]:
    """Pre-order traversal (outermost first)."""
    return _walk(node)


def parses(text: str) -> str | None:
    try:
        compile(text, "<candidate>", "exec")
    except SyntaxError as e:
        return f"line {e.lineno}: {e.msg}"
    return None
