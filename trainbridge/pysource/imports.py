"""Reading and adding a module's top-level imports.

A rewrite must spell a library the way the program already does (`F` or
`torch.nn.functional`), add an import only when it is missing, and place new imports and
helper definitions where Python expects them (after the docstring, `__future__` imports and
the existing imports).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from .names import assigned_names
from .syntax import code


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
