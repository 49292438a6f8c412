"""Port a program's Triton kernels (and its NVRTC-compiled CUDA kernel) to plain PyTorch.

The target has no Triton (Ascend runs torch_npu; a CPU port must not need a GPU compiler), so
each launcher the catalog knows (`targets/kernels/catalog.py`: matched by its parameters and
the fingerprints of the kernels it launches, never by name alone) is replaced by the catalog's
PyTorch function from the `_tb_kernels.py` shim, after `targets/kernel_check.py` has checked
that function against the kernel itself (default on, results cached). How it is installed
keeps the program's other uses working:

* a plain launcher function or autograd.Function is rebound where it was defined
  (`XXT = _tb_kernels.xxt`), so `from triton_kernels import XXT` and `.apply(...)` still work;
* a decorated launcher (`@torch.library.custom_op(...)`) keeps its definition and decorators,
  so the registered op (`torch.ops.ns.name`, `register_fake`, `mutates_args`) stays as it was,
  and only its body is replaced by a call to the shim.

Then the kernels and what only they used go: the `@triton.jit` functions no launcher calls any
more, autotune config builders, the NVRTC compile statement and its CUDA source strings, and
`import triton` / `triton.language` / `TensorDescriptor` when nothing else uses them;
`triton.cdiv`/`next_power_of_2` left in other code call the shim's, and `triton.__version__` in
a log line becomes a string. A kernel the catalog does not know, whose kernel changed, or whose
check failed is left in place with a `PortBlocker` saying which and why.

Target "cuda": the program is returned unchanged.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import libcst as cst

from ..kernel_check import KernelCheckResult, request_for, run_checks
from ..kernels.catalog import CatalogEntry, match_launcher
from ..kernels.extract import Statement
from ..kernels.scan import LauncherInfo, ProgramScan, scan_program
from ..port_models import PortChange, PortTarget
from ..registry import target_spec
from ..shims import add_shim, shim_filename
from . import FeatureResult, PortBlocker

SHIM = "kernels"
SHIM_MODULE = shim_filename(SHIM)[:-3]
_COMPILE_DECORATORS = {"torch.compile", "compile"}
_TRITON_HELPERS = {"cdiv", "next_power_of_2"}
VERSION_TEXT = "none (Triton kernels replaced by PyTorch)"


def default_cache_dir() -> Path:
    """Where kernel checks are cached unless the caller says: $TRAINBRIDGE_CACHE/kernel-checks,
    else ~/.cache/trainbridge/kernel-checks."""
    root = os.environ.get("TRAINBRIDGE_CACHE") or Path.home() / ".cache" / "trainbridge"
    return Path(root) / "kernel-checks"


class _Plan:
    """What to do to one file."""

    def __init__(self) -> None:
        self.rebind: dict[str, str] = {}  # launcher or companion -> shim attribute
        self.body: dict[str, str] = {}  # decorated launcher -> shim attribute
        self.notes: dict[str, str] = {}
        self.comments: dict[str, str] = {}


def _installs_by_body(launcher: LauncherInfo, entry: CatalogEntry) -> bool:
    if launcher.kind != "function":
        return False
    return entry.install == "body" or any(d not in _COMPILE_DECORATORS for d in launcher.decorators)


def port(files: dict[str, str], target: PortTarget, *, check: bool = True,
         cache_dir: str | Path | None = None, catalog: list[CatalogEntry] | None = None) -> FeatureResult:
    """Replace every known kernel launcher of `files` by its checked PyTorch replacement.
    `catalog` defaults to `kernels.catalog.ENTRIES`; `cache_dir` to `default_cache_dir()`."""
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    scan = scan_program(files)
    if scan.empty and not scan.launchers:
        return FeatureResult(files=dict(files))
    blockers: list[PortBlocker] = []
    accepted: list[tuple[LauncherInfo, CatalogEntry, str, KernelCheckResult | None]] = []
    matched: list[tuple[LauncherInfo, CatalogEntry, str]] = []
    for lau in scan.launchers:
        m = match_launcher(lau.name, lau.params, lau.fingerprints, catalog)
        if m.entry is None:
            blockers += _kernel_blockers(scan, lau, m.reason)
            continue
        renamed = f" (launcher renamed from {'/'.join(m.entry.launcher_names)})" if m.renamed else ""
        matched.append((lau, m.entry, renamed))
    results: list[KernelCheckResult | None] = [None] * len(matched)
    if check and matched:
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        results = run_checks(files, [request_for(lau, entry) for lau, entry, _ in matched], cache)
    for (lau, entry, renamed), res in zip(matched, results):
        if res is not None and not res.passed:
            blockers += _kernel_blockers(scan, lau, f"replacement {entry.id} failed its check: {res.reason}")
            continue
        vouch = res.summary() if res is not None else "not checked (check=False)"
        accepted.append((lau, entry, f"{entry.id}: {entry.what}{renamed}; {vouch}", res))
    for ml in scan.module_launches:
        blockers.append(PortBlocker(file=ml.file, line=ml.line, construct=f"launch of {ml.kernel} at module level",
                                    reason="no launcher function to replace"))
    for nv in scan.nvrtc:
        if not any(nv.name in lau.kernels for lau in scan.launchers):
            blockers.append(PortBlocker(file=nv.file, line=nv.line, construct=f"NVRTC kernel {nv.kernel_name} "
                                        f"({nv.name})", reason="compiled at run time by torch.cuda._compile_kernel "
                                        "and called from no function a catalog entry can replace"))
    plans: dict[str, _Plan] = {}
    for lau, entry, note, res in accepted:
        plan = plans.setdefault(lau.file, _Plan())
        (plan.body if _installs_by_body(lau, entry) else plan.rebind)[lau.name] = entry.replacement
        plan.notes[lau.name] = note
        plan.comments[lau.name] = f"{lau.name} -> {SHIM_MODULE}.{entry.replacement}, catalog entry {entry.id}" + (
            f", check passed (max rel err {res.max_rel:.2g})" if res is not None else ", not checked")
        for helper, shim_name in entry.companions.items():
            plan.rebind.setdefault(helper, shim_name)
            plan.notes.setdefault(helper, f"{entry.id}: {helper} replaced by _tb_kernels.{shim_name} (the same "
                                          "shape and dtype guard, without its is_cuda checks)")
            plan.comments.setdefault(helper, f"{helper} -> {SHIM_MODULE}.{shim_name}: its guard without is_cuda")
    out = dict(files)
    changes: list[PortChange] = []
    imported = _names_imported_from(files)
    for file in sorted(f for f in files if f.endswith(".py")):
        plan = plans.get(file, _Plan())
        blocked_here = any(b.file == file for b in blockers)
        text, file_changes, file_blockers = _rewrite(file, files[file], plan, imported.get(_module(file), set()),
                                                     keep_triton=blocked_here)
        out[file] = text
        changes += file_changes
        blockers += file_blockers
    if any(f"import {SHIM_MODULE}\n" in out[f] and f"import {SHIM_MODULE}\n" not in files[f] for f in files):
        out = add_shim(out, SHIM)
        changes.append(PortChange(file=shim_filename(SHIM), line=1, kind="shim_added", before="",
                                  after=shim_filename(SHIM), note="PyTorch replacements of the GPU kernels' launchers"))
    return FeatureResult(files=out, changes=changes, blockers=blockers)


def _kernel_blockers(scan: ProgramScan, lau: LauncherInfo, reason: str) -> list[PortBlocker]:
    out = []
    by_name = {(k.file, k.name): k for k in scan.kernels + scan.helpers}
    nv = {(n.file, n.name): n for n in scan.nvrtc}
    for k in lau.kernels:
        if (lau.file, k) in nv:
            n = nv[(lau.file, k)]
            out.append(PortBlocker(file=lau.file, line=n.line, construct=f"NVRTC kernel {n.kernel_name} (launched by "
                                   f"{lau.name})", reason=reason))
        else:
            info = by_name.get((lau.file, k))
            out.append(PortBlocker(file=lau.file, line=info.line if info else lau.line,
                                   construct=f"Triton kernel {k} (launched by {lau.name}, fingerprint "
                                             f"{info.fingerprint if info else '?'})", reason=reason))
    return out


def _module(file: str) -> str:
    return file[:-3].replace("/", ".")


def _names_imported_from(files: dict[str, str]) -> dict[str, set[str]]:
    """module -> names other program files take from it (`from m import x`, or `m.x` after
    `import m as alias`): kept even when nothing inside the module uses them."""
    out: dict[str, set[str]] = {}
    for text in files.values():
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.setdefault(node.module, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    aliases[a.asname or a.name] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                out.setdefault(aliases[node.value.id], set()).add(node.attr)
    return out


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Call):
        return _dotted(node.func)
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    if isinstance(node, cst.Name):
        return node.value
    return ""


def _def_name(node: cst.BaseStatement) -> str | None:
    return node.name.value if isinstance(node, (cst.FunctionDef, cst.ClassDef)) else None


def _is_jit(node: cst.BaseStatement, aliases: set[str]) -> bool:
    if not isinstance(node, cst.FunctionDef):
        return False
    for d in node.decorators:
        parts = _dotted(d.decorator).split(".")
        if parts[0] in aliases and parts[-1] in ("jit", "autotune", "heuristics"):
            return True
    return False


def _triton_aliases(module: cst.Module) -> set[str]:
    out = {"triton"}
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import):
                    for a in small.names:
                        name = _dotted(a.name)
                        if name.split(".")[0] == "triton":
                            out.add(a.asname.name.value if a.asname else name.split(".")[0])
                elif isinstance(small, cst.ImportFrom) and small.module is not None \
                        and _dotted(small.module).split(".")[0] == "triton" \
                        and not isinstance(small.names, cst.ImportStar):
                    out.update(a.asname.name.value if a.asname else _dotted(a.name) for a in small.names)
    return out


def _imports_triton(stmt: Statement) -> bool:
    try:
        tree = ast.parse(stmt.code)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, ast.Import) and all(a.name.split(".")[0] == "triton" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
            return True
    return False


def _call_args(fn: cst.FunctionDef) -> str:
    p = fn.params
    parts = [x.name.value for x in list(p.posonly_params) + list(p.params)]
    if isinstance(p.star_arg, cst.Param):
        parts.append(f"*{p.star_arg.name.value}")
    parts += [f"{x.name.value}={x.name.value}" for x in p.kwonly_params]
    if p.star_kwarg is not None:
        parts.append(f"**{p.star_kwarg.name.value}")
    return ", ".join(parts)


def _comment(text: str) -> cst.EmptyLine:
    return cst.EmptyLine(comment=cst.Comment("# TrainBridge: " + text.replace("\n", " ")[:160]))


class _TritonRefs(cst.CSTTransformer):
    """`triton.cdiv` -> the shim's, `triton.__version__` -> a string; counts what is left."""

    def __init__(self, aliases: set[str]):
        self.aliases = aliases
        self.rewritten: list[str] = []
        self.left: list[str] = []
        self.uses_shim = False

    def leave_Attribute(self, original, updated):
        if isinstance(updated.value, cst.Name) and updated.value.value in self.aliases:
            if updated.attr.value == "__version__":
                self.rewritten.append("triton.__version__")
                return cst.SimpleString(repr(VERSION_TEXT))
            if updated.attr.value in _TRITON_HELPERS:
                self.rewritten.append(f"triton.{updated.attr.value}")
                self.uses_shim = True
                return cst.Attribute(value=cst.Name(SHIM_MODULE), attr=updated.attr)
        return updated

    def leave_Name(self, original, updated):
        if updated.value in self.aliases:
            self.left.append(updated.value)
        return updated


def _rewrite(file: str, text: str, plan: _Plan, imported_elsewhere: set[str], keep_triton: bool
             ) -> tuple[str, list[PortChange], list[PortBlocker]]:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return text, [], []
    wrapper = cst.MetadataWrapper(module)
    positions = wrapper.resolve(cst.metadata.PositionProvider)
    module = wrapper.module
    aliases = _triton_aliases(module)
    body = list(module.body)
    stmts = [Statement(s, module.code_for_node(s)) for s in body]
    line = [positions[s].start.line for s in body]
    changes: list[PortChange] = []
    new_body: list[cst.BaseStatement | None] = list(body)
    installed: set[int] = set()
    for i, s in enumerate(body):
        name = _def_name(s)
        if name in plan.rebind or name in plan.body:
            installed.add(i)
        if name in plan.rebind:
            target = plan.rebind[name]
            repl = cst.parse_statement(f"{name} = {SHIM_MODULE}.{target}\n")
            repl = repl.with_changes(leading_lines=list(s.leading_lines) + [_comment(plan.comments.get(name, ""))])
            new_body[i] = repl
            changes.append(PortChange(file=file, line=line[i], kind="kernel_replaced",
                                      before=stmts[i].code.strip().splitlines()[0], after=f"{name} = "
                                      f"{SHIM_MODULE}.{target}", note=plan.notes.get(name, "")))
        elif name in plan.body and isinstance(s, cst.FunctionDef):
            returns_none = s.returns is not None and isinstance(s.returns.annotation, cst.Name) \
                and s.returns.annotation.value == "None"
            call = f"{'' if returns_none else 'return '}{SHIM_MODULE}.{plan.body[name]}({_call_args(s)})\n"
            new_body[i] = s.with_changes(body=cst.IndentedBlock(body=[cst.parse_statement(call)]),
                                         leading_lines=list(s.leading_lines) + [_comment(plan.comments.get(name, ""))])
            changes.append(PortChange(file=file, line=line[i], kind="kernel_replaced",
                                      before=f"body of {name} (launches a GPU kernel)", after=call.strip(),
                                      note=plan.notes.get(name, "")))
    refs = _TritonRefs(aliases)  # a file that keeps a kernel keeps triton: its launchers stay as they are
    new_body = [b if b is None or keep_triton or _is_jit(b, aliases) else b.visit(refs) for b in new_body]
    # what is left refers to what: drop kernels and what only they (or replaced code) used
    live = [Statement(b, module.code_for_node(b)) if b is not None else None for b in new_body]
    removed: set[int] = set()
    orphaned: set[str] = set()
    for i in installed:
        orphaned |= stmts[i].refs
    while True:
        referenced = set(imported_elsewhere)
        for j, st in enumerate(live):
            if st is not None and j not in removed:  # configuring `obj.method(...)` keeps obj's other uses only
                referenced |= st.refs - ({st.call_root} if not st.defines and st.call_root else set())
        victims = []
        for j, st in enumerate(live):
            if st is None or j in removed or not st.defines or st.defines & referenced or j in installed:
                continue
            node = new_body[j]
            jit = _is_jit(node, aliases)
            nvrtc = _compiles_kernel(node)
            triton_import = _imports_triton(st) and not keep_triton
            helper = isinstance(node, (cst.FunctionDef, cst.ClassDef)) or (
                isinstance(node, cst.SimpleStatementLine) and all(isinstance(x, (cst.Assign, cst.AnnAssign))
                                                                  for x in node.body))
            if jit or nvrtc or triton_import or (helper and st.defines <= orphaned):
                victims.append(j)
        # statements that only configure a removed object (`kernel.set_shared_memory_config(...)`)
        gone = {n for j in list(removed) + victims for n in live[j].defines}
        for j, st in enumerate(live):
            if st is not None and j not in removed and j not in victims and not st.defines \
                    and st.call_root in gone:
                victims.append(j)
        if not victims:
            break
        for j in victims:
            removed.add(j)
            orphaned |= live[j].refs
    for j in sorted(removed):
        first = stmts[j].code.strip().splitlines()
        node = new_body[j]
        kind = "import" if isinstance(node, cst.SimpleStatementLine) and any(
            isinstance(x, (cst.Import, cst.ImportFrom)) for x in node.body) else "kernel_replaced"
        what = ("Triton kernel" if _is_jit(node, aliases) else "NVRTC kernel compile" if _compiles_kernel(node)
                else "import" if kind == "import" else "helper")
        shown = [x.strip() for x in first if x.strip() and not x.strip().startswith(("#", "@"))]
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            shown = [("@triton.jit " if _is_jit(node, aliases) else "") + ("def " if isinstance(node, cst.FunctionDef)
                                                                           else "class ") + node.name.value]
        changes.append(PortChange(file=file, line=line[j], kind=kind, before=shown[0] if shown else "", after="",
                                  note=f"{what} removed: nothing left uses it"))
        new_body[j] = None
    kept_at = [j for j, b in enumerate(new_body) if b is not None]
    kept = [new_body[j] for j in kept_at]
    left = _TritonRefs(aliases)
    for b in kept:
        b.visit(left)
    blockers: list[PortBlocker] = []
    triton_imports_left = [b for b in kept if isinstance(b, cst.SimpleStatementLine)
                           and _imports_triton(Statement(b, module.code_for_node(b)))]
    if refs.rewritten:
        done = sorted(set(refs.rewritten))
        changes.append(PortChange(file=file, line=1, kind="import", before=", ".join(done), after=", ".join(
            repr(VERSION_TEXT) if r == "triton.__version__" else f"{SHIM_MODULE}.{r.split('.')[1]}" for r in done),
            note="triton used outside the kernels"))
    if triton_imports_left and not keep_triton:
        users = [line[j] for j, b in zip(kept_at, kept)
                 if not _imports_triton(Statement(b, module.code_for_node(b))) and _uses(b, aliases)]
        blockers.append(PortBlocker(file=file, line=users[0] if users else 1,
                                    construct=f"triton still used ({', '.join(sorted(set(left.left))) or 'import'})",
                                    reason="code outside the replaced launchers uses triton; the port would need it"))
    if plan.rebind or plan.body or refs.uses_shim:
        kept = _insert_import(kept, module)
    return module.with_changes(body=kept).code, changes, blockers


def _uses(node: cst.CSTNode, aliases: set[str]) -> bool:
    found = _TritonRefs(aliases)
    node.visit(found)
    return bool(found.left)


def _compiles_kernel(node: cst.BaseStatement) -> bool:
    if not isinstance(node, cst.SimpleStatementLine):
        return False
    return any(isinstance(x, cst.Assign) and isinstance(x.value, cst.Call)
               and _dotted(x.value.func).endswith("_compile_kernel") for x in node.body)


def _insert_import(body: list[cst.BaseStatement], module: cst.Module) -> list[cst.BaseStatement]:
    """`import _tb_kernels` after the file's first `import torch` (a program may set environment
    variables before torch is imported), else after its last leading import."""
    stmt = cst.parse_statement(f"import {SHIM_MODULE}\n")

    def imports(b, root=None):
        if not isinstance(b, cst.SimpleStatementLine):
            return False
        for x in b.body:
            if isinstance(x, cst.Import) and (root is None or any(_dotted(a.name).split(".")[0] == root
                                                                  for a in x.names)):
                return True
            if isinstance(x, cst.ImportFrom) and x.module is not None and (
                    root is None or _dotted(x.module).split(".")[0] == root):
                return True
        return False

    at = next((i + 1 for i, b in enumerate(body) if imports(b, "torch")), None)
    if at is None:
        at = 0
        for i, b in enumerate(body):
            if imports(b):
                at = i + 1
            elif i > at:
                break
    return body[:at] + [stmt] + body[at:]
