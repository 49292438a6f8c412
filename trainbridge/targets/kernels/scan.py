"""Find a program's Triton kernels, its NVRTC-compiled CUDA kernels and the code that launches them.

A *kernel* is a top-level `@triton.jit` function that is not only called by other jit functions
(those are its *helpers*). A *launcher* is the top-level function or class whose body launches a
kernel (`kernel[grid](...)`) or calls a kernel compiled at run time by
`torch.cuda._compile_kernel`: it is the unit a catalog entry replaces, because it is what the
rest of the program calls. The scan only reads the source; it never imports it (a record script
trains at import time).
"""

from __future__ import annotations

import ast
from typing import Literal

from pydantic import BaseModel, Field

from .fingerprint import KernelFingerprinter, cuda_source_fingerprint, jit_functions, static_string


class KernelInfo(BaseModel):
    file: str
    name: str
    line: int
    fingerprint: str
    helpers: list[str] = Field(default_factory=list, description="jit helpers it calls, transitively")
    decorators: list[str] = Field(default_factory=list)
    launched_by: list[str] = Field(default_factory=list)


class NvrtcKernelInfo(BaseModel):
    """`name = torch.cuda._compile_kernel(source, "kernel_name", ...)` at module level."""

    file: str
    name: str
    line: int
    kernel_name: str
    fingerprint: str
    source_known: bool = Field(..., description="the CUDA source text could be read statically")


class LauncherInfo(BaseModel):
    file: str
    name: str
    line: int
    kind: Literal["function", "autograd_function", "class"]
    params: list[str] = Field(..., description="parameter names (an autograd.Function's forward, without ctx)")
    decorators: list[str] = Field(default_factory=list)
    kernels: list[str] = Field(default_factory=list, description="Triton kernels or NVRTC kernel objects it launches")
    fingerprints: list[str] = Field(default_factory=list, description="fingerprints of those kernels, sorted")
    nvrtc: bool = False


class ModuleLaunch(BaseModel):
    """A launch outside any function or class: nothing to rebind, always a blocker."""

    file: str
    line: int
    kernel: str


class ProgramScan(BaseModel):
    kernels: list[KernelInfo] = Field(default_factory=list)
    helpers: list[KernelInfo] = Field(default_factory=list)
    nvrtc: list[NvrtcKernelInfo] = Field(default_factory=list)
    launchers: list[LauncherInfo] = Field(default_factory=list)
    module_launches: list[ModuleLaunch] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.kernels or self.helpers or self.nvrtc)


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        return dotted(node.func)
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _params(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args] + ([a.vararg.arg] if a.vararg else []) \
        + [x.arg for x in a.kwonlyargs] + ([a.kwarg.arg] if a.kwarg else [])


def _is_autograd_function(cls: ast.ClassDef) -> bool:
    return any(dotted(b).split(".")[-1] == "Function" for b in cls.bases)


def _launches(node: ast.AST, kernels: set[str], nvrtc: set[str]) -> list[str]:
    found: list[str] = []
    for sub in ast.walk(node):
        if not isinstance(sub, ast.Call):
            continue
        f = sub.func
        if isinstance(f, ast.Subscript) and isinstance(f.value, ast.Name) and f.value.id in kernels:
            name = f.value.id
        elif isinstance(f, ast.Name) and f.id in nvrtc:
            name = f.id
        else:
            continue
        if name not in found:
            found.append(name)
    return found


def _nvrtc_sites(tree: ast.Module, file: str) -> list[NvrtcKernelInfo]:
    assigns = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)}
    out = []
    for n in tree.body:
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                and isinstance(n.value, ast.Call) and dotted(n.value.func).endswith("_compile_kernel")):
            continue
        call = n.value
        src_expr = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in
                                                        ("kernel_source", "source")), None)
        name_expr = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords
                                                                  if k.arg == "kernel_name"), None)
        source = static_string(src_expr, assigns) if src_expr is not None else None
        kname = static_string(name_expr, assigns) if name_expr is not None else None
        out.append(NvrtcKernelInfo(file=file, name=n.targets[0].id, line=n.lineno, kernel_name=kname or "?",
                                   fingerprint=cuda_source_fingerprint(source or ast.unparse(call), kname or ""),
                                   source_known=source is not None))
    return out


def scan_file(text: str, file: str) -> ProgramScan:
    """Kernels, NVRTC kernels and launchers defined in one Python file."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ProgramScan()
    jits = jit_functions(tree)
    fp = KernelFingerprinter(jits)
    called_by_jit = {h for name in jits for h in fp.helpers_of(name)}
    nvrtc = _nvrtc_sites(tree, file)
    nv_names = {n.name for n in nvrtc}
    scan = ProgramScan(nvrtc=nvrtc)
    for name, fn in jits.items():
        info = KernelInfo(file=file, name=name, line=min([d.lineno for d in fn.decorator_list] + [fn.lineno]),
                          fingerprint=fp(name), helpers=fp.helpers_of(name),
                          decorators=[dotted(d) for d in fn.decorator_list])
        (scan.helpers if name in called_by_jit else scan.kernels).append(info)
    kernel_names = {k.name for k in scan.kernels} | {h.name for h in scan.helpers}
    fps = {k.name: k.fingerprint for k in scan.kernels + scan.helpers} | {n.name: n.fingerprint for n in nvrtc}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in jits:
            continue
        launched = _launches(node, kernel_names, nv_names)
        if not launched:
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind, params = "function", _params(node)
        elif isinstance(node, ast.ClassDef):
            fwd = next((m for m in node.body if isinstance(m, ast.FunctionDef) and m.name == "forward"), None)
            kind = "autograd_function" if _is_autograd_function(node) else "class"
            params = _params(fwd)[1:] if fwd is not None else []
        else:
            scan.module_launches += [ModuleLaunch(file=file, line=node.lineno, kernel=k) for k in launched]
            continue
        line = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
        scan.launchers.append(LauncherInfo(
            file=file, name=node.name, line=line, kind=kind, params=params,
            decorators=[dotted(d) for d in getattr(node, "decorator_list", [])], kernels=launched,
            fingerprints=sorted(fps[k] for k in launched), nvrtc=any(k in nv_names for k in launched)))
        for k in scan.kernels + scan.helpers:
            if k.name in launched:
                k.launched_by.append(node.name)
    return scan


def scan_program(files: dict[str, str]) -> ProgramScan:
    """`scan_file` over every Python file of the program, merged."""
    out = ProgramScan()
    for file, text in sorted(files.items()):
        if not file.endswith(".py"):
            continue
        s = scan_file(text, file)
        out.kernels += s.kernels
        out.helpers += s.helpers
        out.nvrtc += s.nvrtc
        out.launchers += s.launchers
        out.module_launches += s.module_launches
    return out
