"""What one source text contains, in the form the guard's rules compare.

Rules never look at a tree: they compare the facts of the original with those of the
candidate (calls, bindings, handlers, loops, imports, ...), normalised so that formatting,
comments and parentheses never count as a change. Normalised text and line numbers are
computed lazily, only for what a rule actually compares or reports.
"""

from __future__ import annotations

import ast
import textwrap
from collections import Counter
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ...pysource.syntax import code


def _norm(text: str) -> str:
    """Formatting-, comment- and parenthesis-independent form of a statement or expression."""
    try:
        return ast.dump(ast.parse(textwrap.dedent(text)))
    except SyntaxError:
        try:
            return ast.dump(ast.parse(f"({text})", mode="eval"))
        except SyntaxError:
            return " ".join(text.split())


# Not pysource.shapes.dotted: this one also names calls (`f()`) and subscripts (`os.environ[]`).
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
    reflection: Counter = field(default_factory=Counter)  # interpreter attribute reached (sys.modules, f_back) -> n
    reflection_lines: dict = field(default_factory=dict)
    name_aliases: dict = field(default_factory=dict)  # name -> dotted value of a plain `name = a.b` assignment


def _new(counter_b: Counter, counter_a: Counter):
    return [(k, n - counter_b.get(k, 0)) for k, n in counter_a.items() if n > counter_b.get(k, 0)]
