"""What the GPU program does that a naive device port silently changes: a scan of its source.

- `torch.autocast(device_type="cuda", dtype=...)` (also `torch.cuda.amp.autocast`,
  `torch.amp.autocast("cuda")`): on CPU / NPU tensors a cuda autocast region does nothing,
  so the port loses the program's low-precision matmuls.
- host syncs inside the training step: `.item()`, `.tolist()`, `.cpu()`, `.numpy()`,
  `torch.cuda.synchronize()` in a loop (or function) that calls `.backward()`.
- `torch.compile(...)` calls and `@torch.compile` decorators, which naive ports remove.

It reads Python's own `ast`, not libcst like `trainbridge.pysource`: the scan only reads (no
edits to write back) and covers up to 200 files of a program, where `ast` parses several times
faster. That is also why its small name helpers below are its own, not pysource's.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

_SYNC_METHODS = {"item", "tolist", "cpu", "numpy"}


@dataclass
class ScanFinding:
    kind: str  # autocast | host_sync | torch_compile
    file: str
    line: int
    end_line: int
    function: str
    code: str
    in_step: bool = False
    conditional: bool = False
    detail: dict = field(default_factory=dict)


# Not pysource.shapes.dotted: that reads libcst nodes and gives None for a call; this names `f().x`, '' if unnamed.
def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return _dotted(node.func) + "()"
    return ""


def _const(node: ast.AST | None):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute):
        return _dotted(node)
    return None


# pysource has no `ast` counterpart (the guard's libcst `_HasBackward` asks the same of a libcst tree).
def _calls_backward(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "backward":
            return True
    return False


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, lines: list[str]):
        self.file, self.lines = file, lines
        self.findings: list[ScanFinding] = []
        self.func: list[str] = []
        self.step_depth = 0  # inside a loop / function that calls .backward()
        self.if_depth = 0
        self.functions: set[str] = set()  # the file's own function names: `torch.compile(f)` compiles a region

    def _code(self, node: ast.AST) -> str:
        ln = getattr(node, "lineno", 0)
        return self.lines[ln - 1].strip() if 0 < ln <= len(self.lines) else ""

    def _fn(self) -> str:
        return self.func[-1] if self.func else "<module>"

    # scopes
    def visit_FunctionDef(self, node):
        self._decorators(node)
        self.func.append(node.name)
        outer = self.step_depth
        self.step_depth = 1 if _calls_backward(node) and not any(
            isinstance(s, (ast.For, ast.While)) and _calls_backward(s) for s in ast.walk(node) if s is not node) else 0
        outer_if, self.if_depth = self.if_depth, 0
        self.generic_visit(node)
        self.step_depth, self.if_depth = outer, outer_if
        self.func.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def _loop(self, node):
        if _calls_backward(node):
            self.step_depth += 1
            outer_if, self.if_depth = self.if_depth, 0
            self.generic_visit(node)
            self.if_depth = outer_if
            self.step_depth -= 1
        else:
            self.generic_visit(node)

    visit_For = _loop
    visit_While = _loop

    def visit_If(self, node):
        self.if_depth += 1
        self.generic_visit(node)
        self.if_depth -= 1

    # findings
    def _decorators(self, node):
        for d in node.decorator_list:
            name = _dotted(d.func if isinstance(d, ast.Call) else d)
            if name == "torch.compile":
                self.findings.append(ScanFinding("torch_compile", self.file, d.lineno, node.end_lineno or d.lineno,
                                                 node.name, self._code(d), detail={"target": node.name,
                                                                                   "decorator": True}))

    def visit_With(self, node):
        for item in node.items:
            call = item.context_expr
            if not isinstance(call, ast.Call):
                continue
            name = _dotted(call.func)
            device = None
            if name in ("torch.autocast", "autocast", "torch.amp.autocast", "amp.autocast"):
                device = _const(call.args[0]) if call.args else None
                for kw in call.keywords:
                    if kw.arg == "device_type":
                        device = _const(kw.value)
            elif name in ("torch.cuda.amp.autocast", "cuda.amp.autocast"):
                device = "cuda"
            else:
                continue
            dtype = None
            for kw in call.keywords:
                if kw.arg == "dtype":
                    dtype = _const(kw.value)
            if dtype is None and len(call.args) > 1:
                dtype = _const(call.args[1])
            self.findings.append(ScanFinding(
                "autocast", self.file, node.lineno, node.end_lineno or node.lineno, self._fn(), self._code(node),
                in_step=self.step_depth > 0 or _calls_backward(node), conditional=self.if_depth > 0,
                detail={"device_type": device, "dtype": str(dtype).replace("torch.", "") if dtype else "float16"}))
        self.generic_visit(node)

    def visit_Call(self, node):
        name = _dotted(node.func)
        if name == "torch.compile":
            target = _dotted(node.args[0]) if node.args else ""
            opts = {kw.arg: _const(kw.value) for kw in node.keywords if kw.arg}
            self.findings.append(ScanFinding("torch_compile", self.file, node.lineno, node.end_lineno or node.lineno,
                                             self._fn(), self._code(node), in_step=self.step_depth > 0,
                                             detail={"target": target, "function": target in self.functions,
                                                     **{k: v for k, v in opts.items() if v is not None}}))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in _SYNC_METHODS and not node.args \
                and self.step_depth > 0:
            self.findings.append(ScanFinding("host_sync", self.file, node.lineno, node.end_lineno or node.lineno,
                                             self._fn(), self._code(node), in_step=True,
                                             conditional=self.if_depth > 0, detail={"call": f".{node.func.attr}()"}))
        elif name in ("torch.cuda.synchronize", "cuda.synchronize") and self.step_depth > 0:
            self.findings.append(ScanFinding("host_sync", self.file, node.lineno, node.end_lineno or node.lineno,
                                             self._fn(), self._code(node), in_step=True,
                                             conditional=self.if_depth > 0, detail={"call": "torch.cuda.synchronize()"}))
        self.generic_visit(node)


def scan_file(path: Path, rel: str) -> list[ScanFinding]:
    try:
        text = path.read_text(errors="replace")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return []
    s = _Scanner(rel, text.splitlines())
    s.functions = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    s.visit(tree)
    return s.findings


def scan_program(root: str | Path | None, files: list[str] | None = None, max_files: int = 200) -> list[ScanFinding]:
    """Findings in the program's Python files (`files` relative to `root`, default: all)."""
    if root is None:
        return []
    root = Path(root)
    if not root.is_dir():
        return []
    if files is None:
        files = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.py"))
                 if "__pycache__" not in p.parts and not any(part.startswith(".") for part in p.parts)][:max_files]
    out: list[ScanFinding] = []
    for rel in files:
        out.extend(scan_file(root / rel, rel))
    return out
