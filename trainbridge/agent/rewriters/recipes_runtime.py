"""Level-L0 recipes: runtime knobs and the precision the port lost.

* threads_knob (cpu): intra-op threads = the physical cores this process may run on.
  PyTorch's default counts the host's cores, not the ones a container/cgroup/taskset lets
  the process use, and counts SMT siblings on some builds: both oversubscribe. On npu the
  same rung is the host launch pipeline: TASK_QUEUE_ENABLE=2 (load-balanced two-stage
  dispatch) and CPU_AFFINITY_CONF=1 (bind the hot host threads), set with
  `os.environ.setdefault` before `import torch` so a user's own setting wins.
* npu_alloc_conf (npu): PYTORCH_NPU_ALLOC_CONF=expandable_segments:True (fragmentation).
* npu_jit_compile_off (npu): `torch_npu.npu.set_compile_mode(jit_compile=False)` (binary
  kernels instead of online operator compilation; pain point 6).
* npu_hf32 (npu): `torch.npu.matmul.allow_hf32 = True` (a precision change: HF32 matmuls).
* autocast_reapply (cpu/npu/cuda): the GPU program's `torch.autocast(device_type="cuda",
  dtype=torch.bfloat16)` is a no-op on the port's cpu tensors; pointing it at the target
  restores the precision the GPU ran, it does not lower it.

Each knob is its own recipe so that each is measured and kept or rejected on its own.
The env knobs only work if the device runtime has not read them yet: a harness that
initialises the NPU before the program's first line needs them in the manifest's `env`.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from ...pysource.edits import Edits
from ...pysource.imports import (
    _is_docstring,
    _is_future,
    ensure_imports,
    insert_after_imports,
    module_aliases,
)
from ...pysource.shapes import dotted, kwarg, positional
from ...pysource.sites import positions
from ...pysource.syntax import code, expr, stmt, walk
from ...targets.capabilities import fast_bf16
from ...targets.registry import target_spec
from .recipe_base import NotApplicable, Recipe, Site, shorten

# ------------------------------------------------------------- entry file ----

def _is_entry(module: cst.Module) -> bool:
    for s in module.body:
        if isinstance(s, cst.If) and "__name__" in code(s.test) and "__main__" in code(s.test):
            return True
    return False


def _trains(text: str) -> bool:
    return ".backward(" in text


def entry_files(files: dict[str, str]) -> list[str]:
    """Files that run as the program: `if __name__ == "__main__"`, else the one that trains."""
    mains, trainers = [], []
    for rel in sorted(files):
        if not rel.endswith(".py"):
            continue
        try:
            mod = positions(files[rel]).module
        except Exception:
            continue
        if _is_entry(mod):
            mains.append(rel)
        elif _trains(files[rel]):
            trainers.append(rel)
    return mains[:1] or trainers[:1]


def _torch_import_line(module: cst.Module) -> int | None:
    for i, s in enumerate(module.body):
        if m.matches(s, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])):
            return i
        if m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) and "torch" in code(s).split()[1].split(".")[0]:
            return i
    return None


def _top_insert_index(module: cst.Module) -> int:
    idx = 0
    for i, s in enumerate(module.body):
        if i == idx and (_is_docstring(s) or _is_future(s)):
            idx = i + 1
    return idx


# ---------------------------------------------------------- physical cores ----

def physical_cores() -> int:
    """Physical cores among the CPUs this process may run on (SMT siblings counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
    cores = set()
    for c in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(), topo.joinpath("core_id").read_text().strip()))
        except OSError:
            cores.add(("?", str(c)))
    return max(1, len(cores))


def default_threads() -> int:
    """The intra-op thread count a fresh program gets here (what the knob would change)."""
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return torch.get_num_threads()


class _FileKnob(Recipe):
    """A statement (or env line) inserted once into the program's entry file."""

    def _knob_lines(self, target: str, module: cst.Module) -> tuple[list[str], str] | NotApplicable:
        """(lines, where) with where in {"before_torch", "after_imports"}."""
        raise NotImplementedError

    def _already(self, text: str, target: str) -> str | None:
        return None

    def _find_file(self, rel, text, target):
        return []

    def find(self, files, target, *, protected=None):
        if target not in self.targets:
            return []
        out = []
        for rel in entry_files(files):
            text = files[rel]
            if self._already(text, target):
                continue
            mod = positions(text).module
            got = self._knob_lines(target, mod)
            if isinstance(got, NotApplicable):
                continue
            lines, where = got
            out.append(Site(file=rel, qualname="<module>", line=1, text=shorten("; ".join(lines)),
                            detail={"where": where}))
        from .recipe_base import _outside_protected
        return _outside_protected(out, files, protected)

    def _no_site_reason(self, files, target):
        entries = entry_files(files)
        if not entries:
            return f"{self.name}: no entry file (no `if __name__ == '__main__'` and no file calling .backward())"
        why = self._already(files[entries[0]], target)
        if why:
            return f"{self.name}: {why}"
        got = self._knob_lines(target, positions(files[entries[0]]).module)
        if isinstance(got, NotApplicable):
            return got.reason
        return f"{self.name}: nothing to change"

    def _rewrite_file(self, rel, text, target, sites):
        mod = positions(text).module
        got = self._knob_lines(target, mod)
        if isinstance(got, NotApplicable):
            return got
        lines, where = got
        new = [stmt(line) for line in lines]
        body = list(mod.body)
        if where == "before_torch":
            idx = _torch_import_line(mod)
            if idx is None:
                idx = _top_insert_index(mod)
            if not any(m.matches(s, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("os"))])]))
                       for s in body[:idx]):
                new.insert(0, stmt("import os"))
            body[idx:idx] = new
            mod = mod.with_changes(body=body)
        else:
            mod = ensure_imports(mod, self._imports(target))
            mod = insert_after_imports(mod, new)
        return mod.code, sites, []

    def _imports(self, target: str) -> list[str]:
        return ["import torch", *target_spec(target).runtime_imports]


class ThreadsRecipe(_FileKnob):
    def _already(self, text, target):
        if target == "cpu" and "set_num_threads" in text:
            return "the program sets its own intra-op thread count"
        if target == "npu" and "TASK_QUEUE_ENABLE" in text and "CPU_AFFINITY_CONF" in text:
            return "the program sets TASK_QUEUE_ENABLE and CPU_AFFINITY_CONF itself"
        return None

    def _knob_lines(self, target, module):
        if target == "cpu":
            n, now = physical_cores(), default_threads()
            if n == now:
                return NotApplicable(reason=f"threads_knob: intra-op threads already equal the {n} physical cores "
                                            "this process may use (nothing to change)")
            return [f"torch.set_num_threads({n})  # trainbridge threads_knob: physical cores available "
                    f"here (default was {now})"], "after_imports"
        return ['os.environ.setdefault("TASK_QUEUE_ENABLE", "2")  # trainbridge: load-balanced launch pipeline',
                'os.environ.setdefault("CPU_AFFINITY_CONF", "1")  # trainbridge: bind hot host threads to cores'], \
            "before_torch"

    def _imports(self, target):
        return ["import torch"]


class EnvKnobRecipe(_FileKnob):
    """One `os.environ.setdefault(VAR, VALUE)` before `import torch`."""

    var: str = ""
    value: str = ""

    def __init__(self, *a, var: str, value: str, why: str, **kw):
        super().__init__(*a, **kw)
        self.var, self.value, self.why = var, value, why

    def _already(self, text, target):
        return f"the program sets {self.var} itself" if self.var in text else None

    def _knob_lines(self, target, module):
        return [f'os.environ.setdefault("{self.var}", "{self.value}")  # trainbridge: {self.why}'], "before_torch"


class StatementKnobRecipe(_FileKnob):
    """One statement after the imports (torch_npu imported first)."""

    def __init__(self, *a, line: str, marker: str, **kw):
        super().__init__(*a, **kw)
        self.line, self.marker = line, marker

    def _already(self, text, target):
        return f"the program already contains {self.marker}" if self.marker in text else None

    def _knob_lines(self, target, module):
        return [self.line], "after_imports"


# ------------------------------------------------------------ autocast ----

_AUTOCAST = {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cpu.amp.autocast",
             "torch.npu.amp.autocast", "torch.amp.autocast_mode.autocast"}


def _autocast_call(node: cst.Call, aliases: dict[str, str]):
    """(device literal node | implied device str, dtype node) for an autocast call, else None."""
    d = dotted(node.func)
    if d is None:
        return None
    head = d.split(".")[0]
    full = aliases.get(head, head) + d[len(head):] if head in aliases else d
    if full not in _AUTOCAST:
        return None
    if full.endswith("cuda.amp.autocast"):
        return "cuda", kwarg(node, "dtype")
    if full.endswith("cpu.amp.autocast"):
        return "cpu", kwarg(node, "dtype")
    if full.endswith("npu.amp.autocast"):
        return "npu", kwarg(node, "dtype")
    dev = kwarg(node, "device_type")
    if dev is None:
        pos = positional(node)
        dev = pos[0] if pos else None
    return dev, kwarg(node, "dtype") if kwarg(node, "dtype") is not None else (positional(node)[1] if len(positional(node)) > 1 else None)


def _autocast_off_cpu(node, aliases: dict[str, str]):
    """(autocast call, dtype node) for `A if <test naming "cpu"> else B` where one branch is an
    autocast on a device chosen at run time: the GPU took the autocast, the cpu port does not."""
    if not isinstance(node, cst.IfExp) or "cpu" not in code(node.test):
        return None
    for branch in (node.body, node.orelse):
        got = isinstance(branch, cst.Call) and _autocast_call(branch, aliases)
        if got and not isinstance(got[0], (str, cst.SimpleString)) \
                and not m.matches(kwarg(branch, "enabled"), m.Name("False")):
            return branch, got[1]
    return None


class AutocastRecipe(Recipe):
    def _sites(self, rel, text, target):
        pos = positions(text)
        aliases = module_aliases(pos.module)
        out = []
        scope_of = pos.qualnames()
        for node in walk(pos.module):
            off_cpu = _autocast_off_cpu(node, aliases)
            if off_cpu is not None:  # `nullcontext() if device_type == "cpu" else torch.autocast(...)`
                call, dtype = off_cpu
                out.append((Site(file=rel, qualname=scope_of.get(pos.line(node), "<module>"), line=pos.line(node),
                                 end_line=pos.end_line(node), text=shorten(code(node)),
                                 detail={"from": "a device chosen at run time (none on cpu)",
                                         "dtype": code(dtype) if dtype is not None else ""}), node, dtype))
                continue
            if not isinstance(node, cst.Call):
                continue
            got = _autocast_call(node, aliases)
            if got is None:
                continue
            dev, dtype = got
            if m.matches(kwarg(node, "enabled"), m.Name("False")):
                continue
            dev_s = dev if isinstance(dev, str) else (dev.evaluated_value if isinstance(dev, cst.SimpleString) else None)
            if dev_s is None or dev_s.split(":")[0] == target:
                continue
            out.append((Site(file=rel, qualname=scope_of.get(pos.line(node), "<module>"), line=pos.line(node),
                             end_line=pos.end_line(node), text=shorten(code(node)),
                             detail={"from": dev_s, "dtype": code(dtype) if dtype is not None else ""}), node, dtype))
        return pos, out

    def _find_file(self, rel, text, target):
        if not fast_bf16(target):  # emulated bf16 GEMMs: 10-40x slower, not a repair (fp32_where_bf16_slow)
            return []
        return [s for s, _, _ in self._sites(rel, text, target)[1]]

    def _rewrite_file(self, rel, text, target, sites):
        """Edit the device literal (and a float16 dtype on cpu) in place; rebuild only the
        implicit-device spellings (torch.cuda.amp.autocast(...))."""
        pos, found = self._sites(rel, text, target)
        want = {(s.qualname, s.line) for s in sites}
        edits, done, notes = Edits(), [], []
        for site, node, dtype in found:
            if (site.qualname, site.line) not in want:
                continue
            if isinstance(node, cst.IfExp):
                call = node.body if isinstance(node.body, cst.Call) else node.orelse
                keep = [a for a in call.args
                        if a.keyword is not None and a.keyword.value not in ("device_type", "dtype")]
                dt = code(dtype) if dtype is not None else "torch.bfloat16"
                edits.sub(node, expr(", ".join([f'torch.autocast(device_type="{target}"', f"dtype={dt}"]
                                               + [code(a) for a in keep]) + ")"))
                notes.append(f"{site.file}:{site.line}: the autocast the GPU took (the program skips it on cpu) is "
                             f"taken on {target} too, dtype {dt} as the program chose it")
                done.append(site)
                continue
            dt = code(dtype) if dtype is not None else None
            to_bf16 = target == "cpu" and dt is not None and dt.endswith("float16") and not dt.endswith("bfloat16")
            if to_bf16:
                notes.append(f"{site.file}:{site.line}: float16 autocast on cpu becomes bfloat16 "
                             "(the CPU half type with fast kernels; same 16-bit math class, fp32 range)")
                edits.sub(dtype, expr("torch.bfloat16"))
            dev = kwarg(node, "device_type")
            if dev is None and positional(node) and isinstance(positional(node)[0], cst.SimpleString):
                dev = positional(node)[0]
            if isinstance(dev, cst.SimpleString) and not dotted(node.func).endswith("cuda.amp.autocast"):
                q = dev.value[-1]
                edits.sub(dev, cst.SimpleString(f"{q}{target}{q}"))
                if dtype is None:
                    notes.append(f"{site.file}:{site.line}: no dtype given: the target's default applies "
                                 f"(cpu: bfloat16; the GPU's default was float16)")
            else:
                if dt is None:
                    dt = "torch.bfloat16" if target == "cpu" else "torch.float16"
                    notes.append(f"{site.file}:{site.line}: no dtype given: made explicit as {dt}")
                if to_bf16:
                    dt = "torch.bfloat16"
                keep = [a for a in node.args if a.keyword is not None and a.keyword.value not in ("device_type", "dtype")]
                args = ", ".join([f'device_type="{target}"', f"dtype={dt}"] + [code(a) for a in keep])
                edits.sub(node, expr(f"torch.autocast({args})"))
            done.append(site)
        notes.append("restores the GPU program's 16-bit autocast on the target: matmuls run in bf16 as on the GPU "
                     "(low-precision loss tolerance applies); on CPUs without AVX512-BF16/AMX bf16 GEMMs can be "
                     "slower than fp32, so this is measured, not assumed")
        return edits.apply(pos.module).code, done, notes

    def _no_site_reason(self, files, target):
        if not fast_bf16(target):
            return (f"autocast_reapply: {target} has no bf16 math units here (targets/capabilities.py): "
                    "16-bit autocast would be emulated and slower than the port's fp32")
        return (f"autocast_reapply: no enabled autocast for another device than {target!r} (a program that never "
                "used autocast is out of scope: adding low precision is not a port repair)")


