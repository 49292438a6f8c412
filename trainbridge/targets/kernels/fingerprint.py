"""Structural fingerprints of Triton kernels and of run-time-compiled CUDA sources.

A catalog entry vouches for what one kernel computes. The records copy kernels from file to
file, rename them (`ns_line_1_kernel` became `XXT_kernel`), reformat them, add comments and
change their autotune decorators, none of which changes the computation; they also change
one line now and then (a coalesced load, an fp8 output), which does. The fingerprint keeps the
second kind of change and forgets the first: it hashes the kernel's syntax tree with the
decorators, docstring, function name and comments dropped, parameters and local variables
renamed by order of first appearance, and each helper `@triton.jit` function it calls replaced
by that helper's own fingerprint. A kernel whose fingerprint is not in the catalog is never
taken for a known one, however similar its name.
"""

from __future__ import annotations

import ast
import hashlib
import re

JIT_DECORATORS = {"jit", "autotune", "heuristics"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return _dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def triton_aliases(tree: ast.Module) -> set[str]:
    """Names under which this module imported `triton` itself or its decorators."""
    names = {"triton"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "triton" or a.name.startswith("triton."):
                    names.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
            for a in node.names:
                if a.name in JIT_DECORATORS:
                    names.add(a.asname or a.name)
    return names


def is_jit_decorator(dec: ast.AST, aliases: set[str]) -> bool:
    """`@triton.jit`, `@triton.jit(...)`, `@triton.autotune(...)`, `@jit` imported from triton."""
    parts = _dotted(dec).split(".")
    if not parts or not parts[0]:
        return False
    if len(parts) == 1:
        return parts[0] in aliases and parts[0] in JIT_DECORATORS | {"jit"}
    return parts[0] in aliases and parts[-1] in JIT_DECORATORS


def jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Top-level functions of `tree` decorated as Triton kernels (or kernel helpers)."""
    aliases = triton_aliases(tree)
    return {n.name: n for n in tree.body
            if isinstance(n, ast.FunctionDef) and any(is_jit_decorator(d, aliases) for d in n.decorator_list)}


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names


def _stored_names(fn: ast.FunctionDef) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
    return out


class _Canon(ast.NodeTransformer):
    def __init__(self, fn: ast.FunctionDef, helper_fp, helper_params):
        self.params = {p: f"a{i}" for i, p in enumerate(_params(fn))}
        self.local_names = _stored_names(fn) - set(self.params)
        self.locals: dict[str, str] = {}
        self.helper_fp = helper_fp
        self.helper_params = helper_params

    def _rename(self, name: str) -> str:
        if name in self.params:
            return self.params[name]
        if name in self.local_names:
            return self.locals.setdefault(name, f"v{len(self.locals)}")
        fp = self.helper_fp(name)
        return f"jit_{fp}" if fp else name

    def visit_Name(self, node: ast.Name):
        return ast.copy_location(ast.Name(id=self._rename(node.id), ctx=node.ctx), node)

    def visit_arg(self, node: ast.arg):
        ann = self.visit(node.annotation) if node.annotation is not None else None
        return ast.arg(arg=self.params.get(node.arg, node.arg), annotation=ann)

    def visit_Call(self, node: ast.Call):
        callee = node.func.id if isinstance(node.func, ast.Name) else None
        node = self.generic_visit(node)
        params = self.helper_params(callee) if callee else None
        if params:
            for kw in node.keywords:
                if kw.arg in params:
                    kw.arg = f"a{params.index(kw.arg)}"
        return node


def _strip(fn: ast.FunctionDef) -> ast.FunctionDef:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:] or [ast.Pass()]
    return ast.FunctionDef(name="k", args=fn.args, body=body, decorator_list=[], returns=None,
                           type_comment=None)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class KernelFingerprinter:
    """Fingerprints of the jit functions of one module (helpers resolved inside that module)."""

    def __init__(self, functions: dict[str, ast.FunctionDef]):
        self.functions = functions
        self._memo: dict[str, str] = {}
        self._busy: set[str] = set()

    def helper_params(self, name: str) -> list[str] | None:
        fn = self.functions.get(name)
        return _params(fn) if fn is not None else None

    def __call__(self, name: str) -> str:
        if name not in self.functions:
            return ""
        if name in self._memo:
            return self._memo[name]
        if name in self._busy:  # recursion between jit functions: name the cycle, not its contents
            return "cycle"
        self._busy.add(name)
        fn = _strip(self.functions[name])
        canon = _Canon(self.functions[name], self, self.helper_params)
        tree = canon.visit(ast.fix_missing_locations(fn))
        self._busy.discard(name)
        fp = _digest(ast.dump(tree, annotate_fields=False, include_attributes=False))
        self._memo[name] = fp
        return fp

    def helpers_of(self, name: str) -> list[str]:
        """The jit functions `name` calls, directly or through other helpers, in first-call order."""
        seen: list[str] = []

        def walk(n: str) -> None:
            for node in ast.walk(self.functions[n]):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in self.functions and node.func.id != name and node.func.id not in seen:
                    seen.append(node.func.id)
                    walk(node.func.id)

        walk(name)
        return seen


_C_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def cuda_source_fingerprint(source: str, kernel_name: str = "") -> str:
    """Fingerprint of CUDA C++ source text: comments and whitespace differences forgotten."""
    text = _C_COMMENT.sub(" ", source)
    text = re.sub(r"\s+", " ", text).strip()
    return _digest(f"{kernel_name}\n{text}")


def static_string(expr: ast.AST, assigns: dict[str, ast.AST]) -> str | None:
    """The text a module-level string expression spells: literals, `+`, names of string
    constants; an f-string contributes its template (its values are not evaluated)."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.JoinedStr):
        return ast.unparse(expr)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = static_string(expr.left, assigns), static_string(expr.right, assigns)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.Name) and expr.id in assigns:
        return static_string(assigns[expr.id], assigns)
    return None
