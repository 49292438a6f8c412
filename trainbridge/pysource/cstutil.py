"""Shared libcst machinery for the recipes: expression shapes, name resolution, edits.

Recipes match the *shape* of the code, never a program's text. Three pieces make that work
for idioms written in different ways:

* shape helpers (`call_name`, `square_base`, `mean_last_dim_arg`, ...) that accept the
  usual spellings of one operation (`x.pow(2)` / `x ** 2` / `x * x` / `torch.square(x)`);
* `Scope`, a small single-assignment view of one function body: a matcher *follows* a
  local name to the expression it was assigned (`var = x.pow(2).mean(-1, keepdim=True)`),
  so split statements match like chained ones, and two expressions written at different
  statements are compared by what they compute (`Scope.same`), not by their text;
* `Edits`, one batch of node replacements / statement deletions / insertions applied in a
  single transformer pass, with dead-assignment removal for the statements a match used up.

Comparisons use Python's own `ast.dump` of the resolved expression, so redundant
parentheses and formatting never matter.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

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


# ------------------------------------------------------------------ shapes ----

def num(node) -> float | None:
    """The value of a numeric literal (with unary minus), else None."""
    node = strip_parens(node)
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.evaluated_value)
        except Exception:
            return None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        v = num(node.expression)
        return -v if v is not None else None
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Plus):
        return num(node.expression)
    return None


def strip_parens(node):
    if node is not None and getattr(node, "lpar", None) and not isinstance(node, cst.Tuple):
        return node.with_changes(lpar=[], rpar=[])
    return node


def call_name(node) -> str | None:
    """'mean' for x.mean(...), torch.mean(...), mean(...)."""
    if isinstance(node, cst.Call):
        f = node.func
        if isinstance(f, cst.Attribute):
            return f.attr.value
        if isinstance(f, cst.Name):
            return f.value
    return None


def dotted(node) -> str | None:
    """'torch.nn.functional.relu' for that attribute chain, 'relu' for a Name, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else None
    return None


def kwarg(call: cst.Call, name: str):
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None


def positional(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if a.keyword is None and not a.star]


def arg(call: cst.Call, index: int, name: str):
    """Argument by keyword `name`, else the positional one at `index`."""
    v = kwarg(call, name)
    if v is not None:
        return v
    pos = positional(call)
    return pos[index] if index < len(pos) else None


TORCH_ROOTS = {"torch", "F", "nn", "functional"}


def is_module_call(call: cst.Call, names: set[str], roots: set[str] = TORCH_ROOTS) -> bool:
    """torch.X(...) / F.X(...) / torch.nn.functional.X(...) for X in names (not a tensor method)."""
    f = call.func
    if isinstance(f, cst.Attribute) and f.attr.value in names:
        d = dotted(f.value)
        return d is not None and d.split(".")[0] in roots
    return isinstance(f, cst.Name) and f.value in names


def method_receiver(call: cst.Call, names: set[str]):
    """X for X.name(...) where X is not a torch namespace, else None."""
    f = call.func
    if isinstance(f, cst.Attribute) and f.attr.value in names:
        d = dotted(f.value)
        if d is not None and d.split(".")[0] in TORCH_ROOTS:
            return None
        return f.value
    return None


def is_true(node) -> bool:
    return m.matches(node, m.Name("True"))


def dim_is_last(node) -> bool:
    """-1, (-1,), [-1]."""
    node = strip_parens(node)
    if num(node) == -1:
        return True
    if isinstance(node, (cst.Tuple, cst.List)) and len(node.elements) == 1:
        return num(node.elements[0].value) == -1
    return False


def flatten_mul(node) -> list:
    """Factors of a product chain a * b * c (parentheses ignored)."""
    node = strip_parens(node)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return flatten_mul(node.left) + flatten_mul(node.right)
    return [node]


def product(factors: Sequence[cst.BaseExpression]) -> cst.BaseExpression:
    out = parens(factors[0])
    for f in factors[1:]:
        out = cst.BinaryOperation(left=out, operator=cst.Multiply(), right=parens(f))
    return out


def contains_name(node: cst.CSTNode, names: Iterable[str]) -> bool:
    want = set(names)
    return any(n in want for n in load_names(node))


# ---------------------------------------------------------- name analysis ----

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


# ------------------------------------------------------------------ scopes ----

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


# ------------------------------------------------------------------ module ----

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


def module_aliases(module: cst.Module) -> dict[str, str]:
    """Local name -> dotted module/object it is bound to by top-level imports."""
    out: dict[str, str] = {}
    for s in module.body:
        if not isinstance(s, cst.SimpleStatementLine):
            continue
        for small in s.body:
            if isinstance(small, cst.Import):
                for a in small.names:
                    full = code(a.name)
                    if a.asname is not None:
                        out[code(a.asname.name)] = full
                    else:
                        out[full.split(".")[0]] = full.split(".")[0]
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not isinstance(small.names, cst.ImportStar):
                mod = code(small.module)
                for a in small.names:
                    name = code(a.name)
                    out[code(a.asname.name) if a.asname else name] = f"{mod}.{name}"
    return out


def functional_alias(module: cst.Module) -> str:
    """How this module spells torch.nn.functional (`F`, or the full path)."""
    for local, full in module_aliases(module).items():
        if full == "torch.nn.functional":
            return local
    return "torch.nn.functional"


def has_import(module: cst.Module, name: str) -> bool:
    return any(full == name or full.startswith(name + ".") for full in module_aliases(module).values()) or \
        name in module_aliases(module)


def _is_import_line(s) -> bool:
    return m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()]))


def _is_docstring(s) -> bool:
    return m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())]))


def _is_future(s) -> bool:
    return m.matches(s, m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))]))


def ensure_imports(module: cst.Module, imports: Sequence[str]) -> cst.Module:
    """Add `import X` lines that the module lacks: `import torch_npu` right after `import torch`."""
    body = list(module.body)
    for imp in imports:
        mod = cst.parse_module(imp + "\n")
        small = mod.body[0].body[0]
        names = [code(a.name) for a in small.names] if isinstance(small, cst.Import) else []
        if isinstance(small, cst.Import) and all(n in module_aliases(module.with_changes(body=body)).values()
                                                 or n in module_aliases(module.with_changes(body=body)) for n in names):
            continue
        if isinstance(small, cst.ImportFrom) and any(code(s) == imp for s in body):
            continue
        idx = None
        for i, s in enumerate(body):
            if m.matches(s, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])):
                idx = i + 1
        if idx is None:
            idx = 0
            for i, s in enumerate(body):
                if _is_import_line(s):
                    idx = i + 1
                elif i == idx and (_is_docstring(s) or _is_future(s)):
                    idx = i + 1
        body.insert(idx, mod.body[0])
    return module.with_changes(body=body)


def insert_after_imports(module: cst.Module, stmts: Sequence[cst.BaseStatement]) -> cst.Module:
    """Module-level helper definitions, placed after the last top-level import."""
    body = list(module.body)
    idx = 0
    for i, s in enumerate(body):
        if _is_import_line(s) or (i == 0 and _is_docstring(s)):
            idx = i + 1
        elif not isinstance(s, cst.SimpleStatementLine):
            break
    first = True
    out = []
    for s in stmts:
        if first and hasattr(s, "leading_lines"):
            s = s.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        first = False
        out.append(s)
    body[idx:idx] = out
    return module.with_changes(body=body)


def defines(module: cst.Module, name: str) -> bool:
    return name in assigned_names(module)


# ------------------------------------------------------------------- edits ----

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


def dead_statements(function: cst.FunctionDef, candidates: Iterable[tuple], edits: Edits) -> list:
    """Which candidate assignments (statement, scope, index) nothing reads any more.

    Def-aware within the candidate's block: an assignment of `n` at index i is read by the
    statements from i+1 up to and including the next assignment of `n` (which may read the
    old value, as in `att = att.softmax(-1)`), outside deleted statements and replaced nodes
    (a replacement's own names count). In a loop body every statement of the block counts
    (the back edge), and for a nested block every later statement of the enclosing blocks
    counts. Iterates, since deleting one assignment can free the ones it read.
    """
    cands = []
    for c, scope, i in candidates:
        if isinstance(c, cst.SimpleStatementLine) and len(c.body) == 1 and isinstance(c.body[0], cst.Assign) \
                and not _has_effects(c.body[0].value) and (c, scope, i) not in cands:
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


_PURE_CALLS = {"pow", "square", "mean", "sum", "rsqrt", "sqrt", "size", "float", "type_as", "to", "view",
               "reshape", "transpose", "chunk", "split", "unbind", "cat", "stack", "softmax", "masked_fill",
               "matmul", "bmm", "tanh", "relu", "neg", "contiguous", "add", "mul", "div", "sub", "bfloat16",
               "half", "triu", "tril", "ones", "zeros", "ones_like", "zeros_like", "outer", "cos", "sin",
               "exp", "log", "clamp", "abs", "expand", "unsqueeze", "squeeze", "permute", "roll", "flip",
               ITEM, "float32", "type", "masked_fill_", "where"}


def _has_effects(node) -> bool:
    """Calls other than the pure tensor operations a matched pattern consists of."""
    for sub in _walk(node):
        if isinstance(sub, cst.Call) and call_name(sub) not in _PURE_CALLS:
            return True
    return False


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
