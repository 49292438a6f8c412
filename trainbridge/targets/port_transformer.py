"""The rules of the naive port: a libcst transformer that rewrites one file node by node.

What the public NPU ports did by hand (docs/method.md), done by libcst so each
change is a `PortChange` with its line:

* device strings: "cuda" / "cuda:0" / f"cuda:{rank}" / torch.device("cuda", i) -> the target
  (cpu drops the index: one device per process);
* `x.cuda(...)` -> `x.to("<target>", ...)`; `torch.cuda.X` -> `torch.npu.X` (npu) or the
  `torch.cpu` equivalent (cpu: synchronize, current_device, set_device, device_count,
  streams and events exist there); `torch.cuda.is_available()` -> `False` on cpu (the port
  behaves the same on a machine that has a GPU); memory statistics -> `0` on cpu (no device
  allocator: the harness reports peak RSS); cache/peak resets -> `None` (no-ops);
* NCCL -> gloo (cpu) / HCCL (npu); `import torch_npu` after `import torch` (npu);
* `pin_memory=True` and `.pin_memory()` dropped (the public ports dropped them);
* every `torch.compile` removed: `m = torch.compile(m, ...)` -> `m = m`, `@torch.compile`
  decorators deleted (not a semantic change: the naive port runs eager);
* autocast. npu: `device_type="cuda"` -> `"npu"`, which is what `transfer_to_npu` does at run
  time (it wraps `torch.autocast` and rewrites its `device_type` kwarg). cpu: left as it is,
  exactly like the public ports: on CPU tensors a cuda autocast does nothing, so the port runs
  fp32 where the GPU ran bf16. That is recorded as a `precision_lost` change (unchanged text)
  for the `autocast_reapply` recipe to repair later;
* a dtype chosen on the device's abilities (`'bfloat16' if torch.cuda.is_available() and
  torch.cuda.is_bf16_supported() else 'float16'`) keeps the GPU's choice (`port_precision.py`),
  and an autocast taken only off the cpu is recorded as `precision_lost`;
* GPU-only features are reported (kind `gpu_only_feature`, semantic_change True, nothing
  rewritten) with file:line: FP8 (`torch._scaled_mm`, float8 dtypes), FlexAttention
  (`flex_attention`, `create_block_mask`, `BlockMask`), FlashAttention-3 (`flash_attn_interface`,
  `flash_attn_varlen_func`), Triton kernels (`import triton`, `@triton.jit`), SM-count and
  device-property queries.

Target cuda: the program is returned unchanged.

`_Porter` records each edit as a `PortChange` with its line; `port_source.py` runs it over
a file (and adds `import torch_npu` on npu) and over a whole program.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import PositionProvider

from ..pysource.shapes import dotted
from ..pysource.syntax import code
from .port_models import PortChange, PortTarget
from .port_precision import gpu_branch
from .registry import target_spec

_CUDA_STR = re.compile(r"^cuda(:\d+)?$")
_CPU_EQUIV = {"synchronize", "current_device", "set_device", "device_count", "current_stream", "stream",
              "Stream", "Event", "StreamContext"}
_MEMORY_STATS = {"max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved",
                 "max_memory_cached", "memory_cached"}
_NOOPS_ON_CPU = {"empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached",
                 "reset_accumulated_memory_stats", "ipc_collect"}
_AUTOCAST_FUNCS = {"autocast"}

_GPU_ONLY_ATTRS = {
    "_scaled_mm": "FP8 matmul (torch._scaled_mm): no FP8 GEMM on this target; the public ports used bf16 matmuls",
    "get_device_properties": "GPU device-property query",
    "get_device_capability": "GPU compute-capability query",
}
_GPU_ONLY_NAMES = {
    "flex_attention": "FlexAttention: GPU-only (Triton); port to SDPA / npu_fusion_attention with an explicit mask",
    "create_block_mask": "FlexAttention block mask",
    "BlockMask": "FlexAttention block mask",
    "flash_attn_varlen_func": "FlashAttention-3 varlen: on Ascend npu_fusion_attention with TND layout",
    "flash_attn_func": "FlashAttention kernel",
}
_GPU_ONLY_MODULES = {
    "triton": "Triton kernels: replace with PyTorch on this target (Triton-Ascend is an L6 option on npu)",
    "flash_attn_interface": "FlashAttention-3 (Hopper only)",
    "flash_attn": "FlashAttention",
}


def _string_value(node) -> str | None:
    if isinstance(node, cst.SimpleString):
        try:
            v = node.evaluated_value
            return v if isinstance(v, str) else None
        except Exception:
            return None
    return None


def _quote(node: cst.SimpleString) -> str:
    prefix = re.match(r"^[a-zA-Z]*", node.value).group(0)
    return node.value[len(prefix)]


def _is_autocast(call: cst.Call) -> bool:
    f = call.func
    name = f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else None
    return name in _AUTOCAST_FUNCS


def _runs_nvidia_smi(call: cst.Call) -> bool:
    """`subprocess.run(["nvidia-smi"], ...)`: the GPU report programs print at start."""
    if dotted(call.func) not in ("subprocess.run",) or not call.args:
        return False
    first = call.args[0].value
    return isinstance(first, cst.List) and bool(first.elements) and \
        _string_value(first.elements[0].value) == "nvidia-smi"


def _torch_cuda_member(func) -> str | None:
    """'synchronize' for torch.cuda.synchronize; None otherwise."""
    if m.matches(func, m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("cuda")))):
        return func.attr.value
    return None


_COMPILER_MODULES = ("torch._inductor", "torch._dynamo")


def _compiler_aliases(module: cst.Module) -> set[str]:
    """Local names bound to torch._inductor / torch._dynamo (or their config) by imports."""
    names = set(_COMPILER_MODULES)
    for node in module.body:
        if not isinstance(node, cst.SimpleStatementLine):
            continue
        for small in node.body:
            if isinstance(small, cst.Import):
                for a in small.names:
                    full = code(a.name)
                    if full.startswith(_COMPILER_MODULES) and a.asname is not None:
                        names.add(code(a.asname.name))
            elif isinstance(small, cst.ImportFrom) and small.module is not None \
                    and not isinstance(small.names, cst.ImportStar):
                mod = code(small.module)
                for a in small.names:
                    full = f"{mod}.{code(a.name)}"
                    if full.startswith(_COMPILER_MODULES):
                        names.add(code(a.asname.name) if a.asname else code(a.name))
    return names


class _Porter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str, target: PortTarget, compiler_names: set[str] = frozenset(),
                 keep_autocast: bool = False):
        super().__init__()
        self.file, self.target, self.changes = file, target, []
        self.keep_autocast = keep_autocast
        self._keep_strings: set[int] = set()  # ids of string nodes to leave (cpu autocast device_type)
        self._seen: set[tuple[int, str, str]] = set()
        self._compiler_names = set(compiler_names) | set(_COMPILER_MODULES)
        self._function_depth = 0

    def visit_FunctionDef(self, node) -> None:
        self._function_depth += 1

    def leave_FunctionDef(self, original, updated):
        self._function_depth -= 1
        return updated

    # ------------------------------------------------------ statements dropped ----
    def leave_Assert(self, original: cst.Assert, updated: cst.Assert):
        # `assert torch.cuda.is_available()` states "this program needs a GPU": on the cpu
        # target the port answers that by running on the CPU, so the assert goes.
        if self.target == "cpu" and "torch.cuda.is_available" in code(original.test):
            self._forget_inside(original)
            self._note(original, "assert_dropped", code(original), "(removed)",
                       "the program asserts a GPU; the cpu port runs without one")
            return cst.RemoveFromParent()
        return updated

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr):
        # `enable_math_sdp(False)` and friends pick CUDA's attention kernels (cuDNN only, say);
        # on another target they would switch off the kernels it has, so they go.
        call = original.value
        if isinstance(call, cst.Call):
            name = dotted(call.func) or ""
            if re.fullmatch(r"(torch\.backends\.cuda\.)?enable_\w+_sdp", name):
                self._note(original, "cuda_api", code(original), "(removed)",
                           "CUDA attention-kernel choice: the target picks among its own kernels")
                return cst.RemoveFromParent()
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        # torch._inductor / torch._dynamo settings only tune torch.compile, which the naive
        # port removes: they go with it.
        targets = [dotted(t.target) or "" for t in original.targets]
        # an alias (`config.x = ...` after `import torch._inductor.config as config`) counts only
        # outside functions, where a parameter of the same name cannot shadow it
        by_alias = self._function_depth == 0 and any(t.split(".")[0] in self._compiler_names for t in targets)
        if (by_alias or any(t.startswith(_COMPILER_MODULES) for t in targets)) and all("." in t for t in targets):
            self._note(original, "compiler_config", code(original), "(removed)",
                       "compiler setting of torch.compile, which the naive port removes")
            return cst.RemoveFromParent()
        return updated

    # ------------------------------------------------------------------ record ----
    def _line(self, node) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def _note(self, node, kind, before, after, note="", semantic=False):
        key = (self._line(node), kind, "" if kind == "gpu_only_feature" else before)
        if key in self._seen:
            return
        self._seen.add(key)
        self.changes.append(PortChange(file=self.file, line=self._line(node), kind=kind, before=before,
                                       after=after, note=note, semantic_change=semantic))

    def _forget_inside(self, node) -> None:
        """Drop the notes of edits inside `node`, which is replaced as a whole."""
        line, text = self._line(node), code(node)
        self.changes = [c for c in self.changes if not (c.line == line and c.before in text)]

    def _gpu_only(self, node, what: str, note: str):
        self._note(node, "gpu_only_feature", what, what, note, semantic=True)

    # --------------------------------------------------------------- autocast ----
    def visit_Call(self, node: cst.Call) -> None:
        if not _is_autocast(node):
            return
        dev_arg = None
        for i, a in enumerate(node.args):
            if (a.keyword and a.keyword.value == "device_type") or (i == 0 and a.keyword is None):
                dev_arg = a.value
        implied_cuda = dotted(node.func) in ("torch.cuda.amp.autocast",)
        dev = _string_value(dev_arg) if dev_arg is not None else None
        if not (implied_cuda or (dev is not None and _CUDA_STR.match(dev))):
            return
        if self.target == "cpu" and self.keep_autocast and dev_arg is not None:
            self._note(node, "precision", code(dev_arg), '"cpu"',
                       "autocast kept, pointed at the cpu: the program relies on it to reconcile bf16 and fp32 "
                       "tensors (the workload's [port] autocast = \"keep\")")
        elif self.target == "cpu":
            if dev_arg is not None:
                self._keep_strings.add(id(dev_arg))
            self._note(node, "precision_lost", code(node), code(node),
                       "autocast for cuda does nothing on CPU tensors: the port runs fp32 where the GPU ran 16-bit "
                       "math (left as the naive port leaves it; the autocast_reapply recipe repairs it)",
                       semantic=True)
        elif self.target == "npu" and dev_arg is not None:
            self._note(node, "device", code(dev_arg), '"npu"',
                       "autocast device_type mapped to npu, as transfer_to_npu does at run time (16-bit math kept)")

    def leave_IfExp(self, original: cst.IfExp, updated: cst.IfExp) -> cst.BaseExpression:
        if self.target != "cpu":
            return updated
        gpu = gpu_branch(original)
        if gpu is not None:  # a dtype chosen on the device's abilities: the GPU's choice stays
            self._forget_inside(original.test)
            kept = updated.body if gpu is original.body else updated.orelse
            self._note(original, "precision", code(original), code(kept),
                       "precision chosen on the device's abilities, evaluated as the GPU answered them (the cpu "
                       "port would otherwise pick the other branch)")
            return kept
        branches = [b for b in (original.body, original.orelse) if isinstance(b, cst.Call) and _is_autocast(b)]
        if branches and "cpu" in code(original.test):
            self._note(original, "precision_lost", code(original), code(original),
                       "autocast only off the cpu: the cpu port takes the other branch and runs fp32 where the GPU "
                       "ran 16-bit math (the autocast_reapply recipe repairs it)", semantic=True)
        return updated

    # ------------------------------------------------------------------ calls ----
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if len(updated.args) < len(original.args) and updated.args:  # an argument was dropped: no dangling comma
            updated = updated.with_changes(args=[*updated.args[:-1],
                                                 updated.args[-1].with_changes(comma=original.args[-1].comma)])
        func = original.func
        if _runs_nvidia_smi(original) and not target_spec(self.target).source_device:
            # the hardware report GPU programs log: no GPU tool here, and no process to start
            tool = target_spec(self.target).device_list_command
            new = cst.parse_expression(
                f'subprocess.CompletedProcess(args=["nvidia-smi"], returncode=0, '
                f'stdout="nvidia-smi: no NVIDIA GPU on the {self.target} target (see {tool})\\n", stderr="")')
            self._note(original, "cuda_api", code(original), code(new),
                       "GPU hardware report: the port answers it without starting nvidia-smi")
            return new
        member = _torch_cuda_member(func)
        if member is not None and self.target == "cpu":
            if member == "is_available":
                self._note(original, "cuda_api", code(original), "False",
                           "cpu target: no accelerator, whatever the machine has")
                return cst.Name("False")
            if member in _MEMORY_STATS:
                self._note(original, "memory_stat", code(original), "0",
                           "no device allocator on cpu; the harness reports peak RSS")
                return cst.Integer("0")
            if member in _NOOPS_ON_CPU:
                self._note(original, "cuda_api", code(original), "None", "allocator cache/statistics reset: no-op on cpu")
                return cst.Name("None")
            if member in _CPU_EQUIV:
                new = updated.with_changes(func=cst.Attribute(
                    value=cst.Attribute(value=cst.Name("torch"), attr=cst.Name("cpu")), attr=cst.Name(member)))
                note = ""
                if member in ("Event", "Stream") and updated.args:
                    new = new.with_changes(args=[])
                    note = "torch.cpu events/streams take no arguments (and cpu events have no elapsed_time)"
                self._note(original, "cuda_api", code(original), code(new), note)
                return new
        # x.cuda(...) -> x.to("<target>", ...)
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and not m.matches(func.value, m.Name("torch")):
            kept = [code(a) for a in updated.args if a.keyword is not None and a.keyword.value != "device"]
            dev = '"' + self.target + '"'
            new = cst.parse_expression(f"{code(updated.func.value)}.to({', '.join([dev, *kept])})")
            self._note(original, "device", code(original), code(new))
            return new
        # x.pin_memory() -> x
        if isinstance(func, cst.Attribute) and func.attr.value == "pin_memory" and not original.args:
            self._note(original, "pin_memory", code(original), code(updated.func.value),
                       "pinned host memory dropped (the public ports dropped it)")
            return updated.func.value
        # torch.device("cuda", i)
        if m.matches(func, m.Attribute(value=m.Name("torch"), attr=m.Name("device"))) and len(original.args) == 2 and \
                _string_value(original.args[0].value) == "cuda" and self.target == "cpu":
            new = updated.with_changes(args=[cst.Arg(cst.SimpleString('"cpu"'))])
            self._note(original, "device", code(original), code(new), "device index dropped: one device per process")
            return new
        # torch.compile(model, ...) -> model
        if m.matches(func, m.Attribute(value=m.Name("torch"), attr=m.Name("compile"))) and updated.args \
                and updated.args[0].keyword is None:
            self._note(original, "compile_removed", code(original), code(updated.args[0].value),
                       "the naive port runs eager (all torch.compile removed)")
            return updated.args[0].value
        return updated

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg):
        if original.keyword and original.keyword.value == "pin_memory" and m.matches(original.value, m.Name("True")):
            self._note(original, "pin_memory", "pin_memory=True", "(dropped)",
                       "pinned host memory dropped (needs an accelerator on cpu; the public npu ports dropped it)")
            return cst.RemoveFromParent()
        return updated

    # ---------------------------------------------------------------- strings ----
    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        value = _string_value(original)
        if value is None:
            return updated
        q = _quote(original)
        if _CUDA_STR.match(value):
            if id(original) in self._keep_strings:
                return updated
            idx = value.partition(":")[2]
            spec = target_spec(self.target)
            new_value = spec.device_type + (f":{idx}" if idx and spec.indexed_devices else "")
            new = cst.SimpleString(f"{q}{new_value}{q}")
            self._note(original, "device", original.value, new.value,
                       "device index dropped: one device per process" if idx and not spec.indexed_devices else "")
            return new
        if value == "nccl":
            backend = target_spec(self.target).dist_backend
            self._note(original, "backend", original.value, f"{q}{backend}{q}")
            return cst.SimpleString(f"{q}{backend}{q}")
        return updated

    def leave_FormattedString(self, original, updated):
        first = original.parts[0] if original.parts else None
        if not (isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda:")):
            return updated
        if self.target == "cpu":
            q = original.end
            new = cst.SimpleString(f"{q}cpu{q}")
            self._note(original, "device", code(original), new.value,
                       "per-rank device index dropped: one device per process on cpu")
            return new
        new = updated.with_changes(parts=[first.with_changes(value="npu:" + first.value[len("cuda:"):]),
                                          *updated.parts[1:]])
        self._note(original, "device", code(original), code(new))
        return new

    # --------------------------------------------------------- torch.cuda (npu) ----
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        name = original.attr.value
        if name == "multi_processor_count":
            # the SM count sizes Triton grids and persistent kernels, which the port replaces
            new = cst.parse_expression("torch.get_num_threads()")
            self._forget_inside(original)
            self._note(original, "cuda_api", code(original), code(new),
                       "SM-count query: the target has no streaming multiprocessors; its thread count stands in")
            return new
        if name == "_orig_mod":
            # `model._orig_mod` is the module torch.compile wrapped; the port runs eager, so the
            # module it names is the model itself (records 84+: `quantize_weights_fp8(model._orig_mod)`)
            self._forget_inside(original)
            self._note(original, "compile_removed", code(original), code(updated.value),
                       "torch.compile is removed, so the compiled module's original is the module itself")
            return updated.value
        if name in _GPU_ONLY_ATTRS:
            self._gpu_only(original, code(original), _GPU_ONLY_ATTRS[name])
        elif name == "elapsed_time" and self.target == "cpu":
            self._gpu_only(original, code(original), "device-event timing: cpu events have no elapsed_time "
                                                      "(time the host with time.perf_counter instead)")
        elif name.startswith("float8_"):
            self._gpu_only(original, code(original), "FP8 dtype: no FP8 on this target (the public ports used bf16)")
        elif name in _GPU_ONLY_NAMES:
            self._gpu_only(original, code(original), _GPU_ONLY_NAMES[name])
        if self.target == "npu" and m.matches(original, m.Attribute(value=m.Name("torch"), attr=m.Name("cuda"))):
            return updated.with_changes(attr=cst.Name("npu"))
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        if original.value in _GPU_ONLY_NAMES:
            self._gpu_only(original, original.value, _GPU_ONLY_NAMES[original.value])
        return updated

    # -------------------------------------------------------------- decorators ----
    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        d = original.decorator
        target = d.func if isinstance(d, cst.Call) else d
        dn = dotted(target) or ""
        if dn == "torch.compile":
            self._note(original, "compile_removed", "@" + code(d), "(removed)", "the naive port runs eager")
            return cst.RemoveFromParent()
        if dn.startswith("triton."):
            self._gpu_only(original, "@" + code(d), _GPU_ONLY_MODULES["triton"])
        return updated

    # ---------------------------------------------------------------- imports ----
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            root = code(alias.name).split(".")[0]
            if root in _GPU_ONLY_MODULES:
                self._gpu_only(node, code(node), _GPU_ONLY_MODULES[root])

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = code(node.module) if node.module else ""
        root = mod.split(".")[0]
        if root in _GPU_ONLY_MODULES:
            self._gpu_only(node, code(node), _GPU_ONLY_MODULES[root])
        elif "flex_attention" in mod:
            self._gpu_only(node, code(node), _GPU_ONLY_NAMES["flex_attention"])
        return False  # the imported names are reported once, at the import statement

    def visit_ImportAlias(self, node):
        return False
