"""Where a record script defines its hyperparameters, and how to rewrite one value in place.

The records hold their configuration in five forms (docs/records.md, "the scale override"):

- fields of a class named `...Hyperparameters` or `...Config`: annotated dataclass fields
  (`num_iterations: int = 1750`) or plain class attributes (`num_iterations = 1390`);
- literal keyword arguments of any call: the model constructor
  (`GPT(vocab_size=50257, num_layers=12, ...)`) and schedule entries
  (`TrainingStage(batch_size=8 * 2048 * 8, train_max_seq_len=896, ...)`);
- module-level constants (`grad_accum_steps = 8 // world_size`, `NORMUON_NOISE_WARMUP = 50`);
- defaults of module-level functions (`def get_muon_momentum(step, muon_warmup_steps=300)`);
- argparse options (`parser.add_argument("--num_iterations", type=int, default=5100)`).

A `Site` is one such definition with its value expression; rewriting replaces exactly that
expression's source span, so comments, formatting and everything else stay as they were.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field

MISSING = object()
CLASS_SUFFIXES = ("Hyperparameters", "Config")

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


@dataclass
class Site:
    """One place a hyperparameter is defined."""

    name: str
    kind: str  # field | keyword | module | default | argparse
    owner: str  # class, callee, function or "<module>"
    node: ast.expr = field(repr=False)
    value: object = MISSING  # the value, where it can be computed without running the script
    literal: bool = False  # the expression is a literal (numbers, strings, tuples, arithmetic on them)
    line: int = 0

    @property
    def where(self) -> str:
        if self.kind == "field":
            return f"{self.owner}.{self.name}"
        if self.kind == "keyword":
            return f"call {self.owner}({self.name}=) line {self.line}"
        if self.kind == "module":
            return f"module constant {self.name} line {self.line}"
        if self.kind == "default":
            return f"def {self.owner}({self.name}=) line {self.line}"
        return f"argparse --{self.name} default line {self.line}"


def const_eval(node: ast.AST, env: dict | None = None):
    """The value of a literal expression (names looked up in `env`), else MISSING."""
    env = env or {}
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [const_eval(e, env) for e in node.elts]
        if any(i is MISSING for i in items):
            return MISSING
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = const_eval(node.operand, env)
        return MISSING if v is MISSING else (-v if isinstance(node.op, ast.USub) else +v)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = const_eval(node.left, env), const_eval(node.right, env)
        if a is MISSING or b is MISSING:
            return MISSING
        try:
            return _BINOPS[type(node.op)](a, b)
        except Exception:
            return MISSING
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    return MISSING


def _callee(node: ast.Call) -> str:
    f = node.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return "?"


def find_sites(tree: ast.Module) -> list[Site]:
    """Every site in the script, in source order."""
    sites: list[Site] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name.endswith(CLASS_SUFFIXES):
            env: dict = {}
            for item in stmt.body:
                target, value = _assigned(item)
                if target is None or value is None:
                    continue
                v = const_eval(value, env)
                if v is not MISSING:
                    env[target] = v
                sites.append(Site(target, "field", stmt.name, value, v, const_eval(value) is not MISSING,
                                  item.lineno))
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            target, value = _assigned(stmt)
            if target is not None and value is not None:
                v = const_eval(value)
                sites.append(Site(target, "module", "<module>", value, v, v is not MISSING, stmt.lineno))
        elif isinstance(stmt, ast.FunctionDef):
            args = stmt.args.args[len(stmt.args.args) - len(stmt.args.defaults):]
            for arg, default in [*zip(args, stmt.args.defaults), *zip(stmt.args.kwonlyargs, stmt.args.kw_defaults)]:
                if default is not None:
                    v = const_eval(default)
                    sites.append(Site(arg.arg, "default", stmt.name, default, v, v is not MISSING, stmt.lineno))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node)
        if callee == "add_argument" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.startswith("--"):
            name = node.args[0].value.lstrip("-").replace("-", "_")
            for kw in node.keywords:
                if kw.arg == "default":
                    v = const_eval(kw.value)
                    sites.append(Site(name, "argparse", "add_argument", kw.value, v, v is not MISSING, node.lineno))
            continue
        for kw in node.keywords:
            if kw.arg is not None:
                v = const_eval(kw.value)
                sites.append(Site(kw.arg, "keyword", callee, kw.value, v, v is not MISSING, kw.value.lineno))
    sites.sort(key=lambda s: (s.node.lineno, s.node.col_offset))
    return sites


def _assigned(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id, stmt.value
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id, stmt.value
    return None, None


def literal_source(value: object) -> str:
    """Source text for an override value (numbers, strings, booleans, None, tuples and lists of them)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        inner = ", ".join(literal_source(v) for v in value)
        if isinstance(value, tuple):
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        return f"[{inner}]"
    raise ValueError(f"override value {value!r}: only int, float, str, bool, None, tuple and list literals")


def replace_spans(source: str, edits: list[tuple[ast.expr, str]]) -> str:
    """The source with each node's span replaced by its text (ast offsets are UTF-8 bytes)."""
    data = source.encode("utf-8")
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    spans = [(starts[n.lineno - 1] + n.col_offset, starts[n.end_lineno - 1] + n.end_col_offset, text)
             for n, text in edits]
    # an edit inside another rewritten value (a keyword within a replaced expression) is moot
    spans = [s for s in spans if not any(o is not s and o[0] <= s[0] and s[1] <= o[1] and o[:2] != s[:2]
                                         for o in spans)]
    for begin, end, text in sorted(set(spans), reverse=True):
        data = data[:begin] + text.encode("utf-8") + data[end:]
    return data.decode("utf-8")
