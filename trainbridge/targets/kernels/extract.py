"""Cut a launcher, its kernels and everything they use out of a program, as modules that import cleanly.

A record script cannot be imported to reach its kernels: it builds a model and trains at import
time. The check needs the launcher exactly as written, so this module copies, statement by
statement (libcst, so the text is the program's own), the top-level definitions the launcher
needs: the closure of its global names over the file's functions, classes, constants and
imports, following `from <program file> import name` into the program's other files. Nothing
else of the program is copied, so no training code runs.

The copy is then made runnable on a CPU under Triton's interpreter, which is what a check is:
device guards are neutralised (`x.is_cuda` -> `True`, `"cuda"` device strings -> `"cpu"`,
`torch.cuda.get_device_properties(...)` -> fixed properties with 4 SMs), `torch.compile`
decorators are dropped, and `triton.autotune` keeps only its first config (the interpreter would
otherwise benchmark every config with GPU timers; each config must compute the same values).
"""

from __future__ import annotations

import ast
import functools
import symtable

import libcst as cst

PREAMBLE = '''\
# Extracted by TrainBridge for a kernel check: the launcher, its kernels and what they need.
class _TbDeviceProperties:
    """What a launcher may ask of the GPU; 4 SMs keeps persistent grids small."""
    multi_processor_count = 4
    name = "triton-interpreter"
    major, minor = 9, 0
    total_memory = 1 << 34


def _tb_device_properties(*args, **kwargs):
    return _TbDeviceProperties()


def _tb_one_config(configs):
    return list(configs)[:1]
'''


class ExtractError(ValueError):
    pass


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a top-level statement binds in the module namespace."""
    out: set[str] = set()

    def targets(t: ast.AST) -> None:  # `a`, `a, b`, `*a` bind; `a.x` and `a[i]` do not
        if isinstance(t, ast.Name):
            out.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                targets(e)
        elif isinstance(t, ast.Starred):
            targets(t.value)

    def visit(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(s.name)
            elif isinstance(s, ast.Assign):
                for t in s.targets:
                    targets(t)
            elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
                targets(s.target)
            elif isinstance(s, (ast.Import, ast.ImportFrom)):
                for a in s.names:
                    if a.name != "*":
                        out.add((a.asname or a.name).split(".")[0])
            elif isinstance(s, (ast.If, ast.Try, ast.With, ast.For)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(s, field, []) or [])
                for h in getattr(s, "handlers", []) or []:
                    visit(h.body)

    visit(tree.body if isinstance(tree, ast.Module) else [tree])
    return out


def _referenced_globals(code: str) -> set[str]:
    """Global names a top-level statement reads (decorators, defaults, bases and bodies)."""
    table = symtable.symtable(code, "<stmt>", "exec")
    out = {s.get_name() for s in table.get_symbols() if s.is_referenced()}

    def walk(t: symtable.SymbolTable) -> None:
        for s in t.get_symbols():
            if s.is_global() or (t.get_type() == "class" and s.is_referenced() and not s.is_assigned()):
                out.add(s.get_name())
        for c in t.get_children():
            walk(c)

    for child in table.get_children():
        walk(child)
    return out


class Statement:
    """One top-level statement: its text, the names it binds and the global names it reads."""

    def __init__(self, node: cst.BaseStatement, code: str):
        self.node = node
        self.code = code
        self.defines, self.refs, self.imports_from, self.call_root = _analyse(code)


@functools.lru_cache(maxsize=8192)
def _analyse(code: str):
    """(names bound, globals read, `from m import ...` pairs, root of a configuring call) of a
    statement's text; cached, since a port reads the same statements once per launcher and the
    records repeat most of their code."""
    tree = ast.parse(code)
    defines = frozenset(_bound_names(tree))
    refs = frozenset(_referenced_globals(code))
    imports_from = None
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.ImportFrom) and tree.body[0].level == 0:
        imp = tree.body[0]
        imports_from = (imp.module or "", [(a.name, a.asname or a.name) for a in imp.names])
    call_root = None  # `name.method(...)` statements and `@name.attr` decorated defs
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Call):
        f = first.value.func
        while isinstance(f, ast.Attribute):
            f = f.value
        if isinstance(f, ast.Name) and isinstance(first.value.func, ast.Attribute):
            call_root = f.id
    elif isinstance(first, ast.FunctionDef):
        for d in first.decorator_list:
            f = d.func if isinstance(d, ast.Call) else d
            if isinstance(f, ast.Attribute):
                while isinstance(f, ast.Attribute):
                    f = f.value
                if isinstance(f, ast.Name):
                    call_root = f.id
    return defines, refs, imports_from, call_root


def _is_import(node: cst.BaseStatement) -> bool:
    return isinstance(node, cst.SimpleStatementLine) and any(isinstance(x, (cst.Import, cst.ImportFrom))
                                                             for x in node.body)


@functools.lru_cache(maxsize=16)
def statements(text: str) -> tuple[Statement, ...]:
    """The top-level statements of a file (parsed once per text: a port extracts many launchers
    from one record script)."""
    module = cst.parse_module(text)
    return tuple(Statement(s, module.code_for_node(s)) for s in module.body)


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Call):
        return _dotted(node.func)
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    if isinstance(node, cst.Name):
        return node.value
    return ""


class _ForInterpreter(cst.CSTTransformer):
    """The device-guard and decorator rewrites that let the copy run under the interpreter."""

    def leave_Decorator(self, original, updated):
        if _dotted(updated.decorator) in ("torch.compile", "compile"):
            return cst.RemovalSentinel.REMOVE
        return updated

    def leave_Attribute(self, original, updated):
        if updated.attr.value == "is_cuda":
            return cst.Name("True")
        return updated

    def leave_SimpleString(self, original, updated):
        value = updated.evaluated_value
        if isinstance(value, str) and (value == "cuda" or (value.startswith("cuda:") and value[5:].isdigit())):
            return updated.with_changes(value=updated.value.replace(value, "cpu"))
        return updated

    def leave_Call(self, original, updated):
        name = _dotted(updated.func)
        if name == "torch.cuda.get_device_properties":
            return cst.Call(func=cst.Name("_tb_device_properties"))
        if name == "torch.cuda.current_device":
            return cst.Integer("0")
        if name == "torch.cuda.synchronize":
            return cst.Name("None")
        if name.endswith("autotune") and name.split(".")[0] in ("triton", "autotune"):
            args = []
            for i, a in enumerate(updated.args):
                if (a.keyword is not None and a.keyword.value == "configs") or (a.keyword is None and i == 0):
                    a = a.with_changes(value=cst.Call(func=cst.Name("_tb_one_config"), args=[cst.Arg(a.value)]))
                args.append(a)
            return updated.with_changes(args=args)
        return updated


def _module_name(file: str) -> str:
    return file[:-3].replace("/", ".") if file.endswith(".py") else file


def _file_of(module: str, files: dict[str, str]) -> str | None:
    path = module.replace(".", "/") + ".py"
    return path if path in files else None


def extract(files: dict[str, str], file: str, names: list[str]) -> dict[str, str]:
    """{module name: source} for the closure of `names` defined in `file`, plus what it imports
    from the program's other files. The module for `file` keeps its name (`triton_kernels`,
    `train_gpt`), so the launcher's own imports between program files still resolve."""
    out: dict[str, str] = {}
    _extract_into(files, file, list(names), out, set())
    return out


def _extract_into(files, file, names, out, busy) -> None:
    module_name = _module_name(file)
    if file in busy:
        raise ExtractError(f"import cycle through {file}")
    busy.add(file)
    try:
        stmts = statements(files[file])
    except cst.ParserSyntaxError as e:
        raise ExtractError(f"{file} does not parse: {e}") from e
    defined: dict[str, list[int]] = {}
    for i, s in enumerate(stmts):
        for n in s.defines:
            defined.setdefault(n, []).append(i)
    # objects this file creates itself (not imported modules): the only roots of configuring calls
    own = {n for i, s in enumerate(stmts) if not s.imports_from and not _is_import(s.node) for n in s.defines}
    missing = [n for n in names if n not in defined]
    if missing:
        raise ExtractError(f"{file} defines no {', '.join(missing)}")
    include: set[int] = set()
    needed: set[str] = set()
    queue = list(names)
    foreign: dict[str, set[str]] = {}
    while queue:
        name = queue.pop()
        if name in needed:
            continue
        needed.add(name)
        for i in defined.get(name, []):
            if i in include:
                continue
            include.add(i)
            s = stmts[i]
            if s.imports_from and _file_of(s.imports_from[0], files):
                foreign.setdefault(_file_of(s.imports_from[0], files), set()).update(
                    orig for orig, alias in s.imports_from[1] if alias == name or alias in needed)
            queue += [r for r in s.refs if r in defined and r not in needed]
        # statements that configure a needed object: `k.set_config(...)`, `@op.register_fake def _`
        for i, s in enumerate(stmts):
            if i not in include and s.call_root in needed and s.call_root in own and not (s.defines - {"_"}):
                include.add(i)
                queue += [r for r in s.refs if r in defined and r not in needed]
    for other, wanted in foreign.items():
        if other not in busy and wanted:
            _extract_into(files, other, sorted(wanted), out, busy)
    body = [stmts[i].node.visit(_ForInterpreter()) for i in sorted(include)]
    future = [b for b in body if isinstance(b, cst.SimpleStatementLine)
              and any(isinstance(x, cst.ImportFrom) and _dotted(x.module) == "__future__" for x in b.body)]
    rest = [b for b in body if b not in future]
    preamble = list(cst.parse_module(PREAMBLE).body)
    out[module_name] = cst.Module(body=future + preamble + rest).code
    busy.discard(file)
