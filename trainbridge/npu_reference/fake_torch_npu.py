"""A fake `torch_npu` (and `torch.npu`) backed by the CPU references, for dry runs only.

Why: an npu-rewritten program must at least import, trace and step before it goes to an
Ascend machine. `install()` registers `torch_npu` in sys.modules with the reference ops,
`torch_npu.optim.NpuFused*`, `torch_npu.npu` (set_compile_mode, config.allow_internal_format,
matmul.allow_hf32, ...), `torch_npu.contrib.transfer_to_npu` (a no-op) and makes `torch.npu`
the same CPU-backed namespace. It never pretends to measure: `torch_npu.__trainbridge_reference__`
and `torch.npu.__trainbridge_reference__` are True, and `is_reference()` says so; device
memory stats are 0 and the device name is "reference (CPU)".

The "npu" device itself cannot be faked on a CPU build of torch, so a dry run executes the
rewritten program after `npu_to_cpu_for_dry_run(source)`: string literals "npu" / "npu:N",
f-strings starting with "npu:", `torch.device("npu", i)`, `.npu()` calls and the "hccl"
backend are mapped to "cpu" / `.cpu()` / "gloo" at the source level; `torch_npu.*` and
`torch.npu.*` calls are left alone, so they reach the references.
"""

from __future__ import annotations

import contextlib
import sys
import types

import libcst as cst
import libcst.matchers as m
import torch

from . import attention, ops, optim

REFERENCE_DEVICE_NAME = "reference (CPU)"
_SUBMODULES = ("torch_npu", "torch_npu.npu", "torch_npu.optim", "torch_npu.contrib",
               "torch_npu.contrib.transfer_to_npu", "torch_npu.profiler", "torch.npu")
_saved: dict | None = None

OP_NAMES = (
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_swiglu", "npu_geglu", "npu_gelu",
    "npu_fast_gelu", "npu_scaled_masked_softmax", "npu_confusion_transpose", "npu_cross_entropy_loss",
    "npu_format_cast", "get_npu_format",
)


def _module(name: str, doc: str) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__trainbridge_reference__ = True
    return mod


class _Event:
    """CPU stand-in for torch.npu.Event; reports 0 ms so nothing can read it as a timing."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end_event) -> float:
        return 0.0


class _Stream:
    def __init__(self, device=None, priority: int = 0):
        self.device = device

    def synchronize(self) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()

    def query(self) -> bool:
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def _npu_namespace() -> types.ModuleType:
    """`torch_npu.npu` == `torch.npu`: device, memory, RNG and knob stand-ins on the CPU."""
    npu = _module("torch_npu.npu", "CPU-backed stand-in for torch.npu (TrainBridge dry run, not a device).")
    state = {"device": 0, "compile_mode": {"jit_compile": True}}

    def _zero(device=None) -> int:
        return 0

    npu.is_available = lambda: True
    npu.is_initialized = lambda: True
    npu.init = lambda: None
    npu.device_count = lambda: 1
    npu.current_device = lambda: state["device"]
    npu.set_device = lambda device: state.__setitem__("device", 0)
    npu.synchronize = lambda device=None: None
    npu.empty_cache = lambda: None
    npu.get_device_name = lambda device=None: REFERENCE_DEVICE_NAME
    npu.get_device_properties = lambda device=None: types.SimpleNamespace(
        name=REFERENCE_DEVICE_NAME, total_memory=0, multi_processor_count=0)
    for stat in ("max_memory_allocated", "memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(npu, stat, _zero)
    npu.reset_peak_memory_stats = lambda device=None: None
    npu.reset_max_memory_allocated = lambda device=None: None
    npu.memory_stats = lambda device=None: {}
    npu.manual_seed = lambda seed: torch.manual_seed(seed)
    npu.manual_seed_all = lambda seed: torch.manual_seed(seed)
    npu.seed = lambda: torch.seed()
    npu.initial_seed = lambda: torch.initial_seed()
    npu.get_rng_state = lambda device=None: torch.get_rng_state()
    npu.set_rng_state = lambda new_state, device=None: torch.set_rng_state(new_state)
    npu.Event = _Event
    npu.Stream = _Stream
    npu.current_stream = lambda device=None: _Stream(device)
    npu.default_stream = lambda device=None: _Stream(device)
    npu.stream = lambda stream=None: contextlib.nullcontext(stream)
    npu.device = lambda device=None: contextlib.nullcontext(device)

    def set_compile_mode(jit_compile: bool = True) -> None:
        """Recorded only: the reference has no online compiler."""
        state["compile_mode"]["jit_compile"] = bool(jit_compile)

    npu.set_compile_mode = set_compile_mode
    npu.get_compile_mode = lambda: dict(state["compile_mode"])
    npu.matmul = types.SimpleNamespace(allow_hf32=False)
    npu.conv = types.SimpleNamespace(allow_hf32=True)
    npu.config = types.SimpleNamespace(allow_internal_format=False)
    npu.amp = types.SimpleNamespace(
        autocast=lambda enabled=True, dtype=torch.float16, cache_enabled=True: torch.autocast(
            "cpu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled),
        GradScaler=lambda *a, **k: torch.amp.GradScaler("cpu", *a, **k))
    return npu


def _build() -> dict[str, types.ModuleType]:
    tnpu = _module("torch_npu", "Fake torch_npu: CPU reference semantics for dry runs. Never a measurement.")
    tnpu.__version__ = "0+trainbridge.reference"
    for name in OP_NAMES:
        setattr(tnpu, name, getattr(ops, name))
    tnpu.npu_fusion_attention = attention.npu_fusion_attention
    tnpu.npu_apply_adam_w = optim.npu_apply_adam_w

    npu = _npu_namespace()
    tnpu.npu = npu

    opt = _module("torch_npu.optim", "Reference fused optimizers (CPU).")
    for cls in (optim.NpuFusedAdamW, optim.NpuFusedAdam, optim.NpuFusedSGD):
        setattr(opt, cls.__name__, cls)
    tnpu.optim = opt

    contrib = _module("torch_npu.contrib", "Reference torch_npu.contrib.")
    transfer = _module("torch_npu.contrib.transfer_to_npu",
                       "No-op: on the reference nothing maps cuda to npu; dry runs rewrite devices at the source.")
    contrib.transfer_to_npu = transfer
    tnpu.contrib = contrib

    prof = _module("torch_npu.profiler", "torch.profiler passthrough; NPU activity = CPU on the reference.")
    prof.ProfilerActivity = types.SimpleNamespace(CPU=torch.profiler.ProfilerActivity.CPU,
                                                  NPU=torch.profiler.ProfilerActivity.CPU)
    prof.profile = torch.profiler.profile
    prof.schedule = torch.profiler.schedule
    prof.tensorboard_trace_handler = torch.profiler.tensorboard_trace_handler
    prof.record_function = torch.profiler.record_function
    tnpu.profiler = prof
    return {"torch_npu": tnpu, "torch_npu.npu": npu, "torch_npu.optim": opt, "torch_npu.contrib": contrib,
            "torch_npu.contrib.transfer_to_npu": transfer, "torch_npu.profiler": prof, "torch.npu": npu}


def install() -> types.ModuleType:
    """Register the fake torch_npu and torch.npu; returns the fake module. Idempotent."""
    global _saved
    if _saved is not None:
        return sys.modules["torch_npu"]
    existing = sys.modules.get("torch_npu")
    if existing is not None and not getattr(existing, "__trainbridge_reference__", False):
        raise RuntimeError("a real torch_npu is already imported: refusing to shadow it with the reference")
    _saved = {name: sys.modules.get(name) for name in _SUBMODULES}
    _saved["<torch.npu attr>"] = getattr(torch, "npu", None)
    mods = _build()
    sys.modules.update(mods)
    torch.npu = mods["torch.npu"]
    return mods["torch_npu"]


def uninstall() -> None:
    """Restore sys.modules and torch.npu exactly as they were before install()."""
    global _saved
    if _saved is None:
        return
    attr = _saved.pop("<torch.npu attr>")
    for name, mod in _saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    if attr is None:
        if hasattr(torch, "npu"):
            delattr(torch, "npu")
    else:
        torch.npu = attr
    _saved = None


@contextlib.contextmanager
def installed():
    """`with installed(): ...` for tests and dry runs."""
    mod = install()
    try:
        yield mod
    finally:
        uninstall()


def is_reference(module=None) -> bool:
    """True when `module` (default: the imported torch_npu) is this fake: its numbers are no measurement."""
    mod = module if module is not None else sys.modules.get("torch_npu")
    return bool(getattr(mod, "__trainbridge_reference__", False))


# --- source rewrite for dry runs ----------------------------------------------------------------

def _is_npu_literal(value: str) -> bool:
    body = value[1:-1] if len(value) >= 2 else ""
    if value[:1] in "rRbBuU" or len(value) < 2 or value[0] not in "'\"" :
        return False
    return body == "npu" or (body.startswith("npu:") and body[4:].isdigit())


class _DryRunRewriter(cst.CSTTransformer):
    def __init__(self):
        super().__init__()
        self.changes: list[str] = []

    def leave_SimpleString(self, original, updated):
        q = original.value[0] if original.value[:1] in "'\"" else None
        if q is None:
            return updated
        if _is_npu_literal(original.value):
            self.changes.append(f"{original.value} -> {q}cpu{q}")
            return updated.with_changes(value=f"{q}cpu{q}")
        if original.value[1:-1] == "hccl":
            self.changes.append(f"{original.value} -> {q}gloo{q}")
            return updated.with_changes(value=f"{q}gloo{q}")
        return updated

    def leave_FormattedString(self, original, updated):
        first = original.parts[0] if original.parts else None
        if isinstance(first, cst.FormattedStringText) and first.value.startswith("npu:"):
            q = original.end
            self.changes.append(f"{cst.Module(body=[]).code_for_node(original)} -> {q}cpu{q}")
            return cst.SimpleString(f"{q}cpu{q}")
        return updated

    def leave_Call(self, original, updated):
        # x.npu() / x.npu(0) -> x.cpu()
        if m.matches(updated.func, m.Attribute(attr=m.Name("npu"))) and not m.matches(
                updated.func, m.Attribute(value=m.Name("torch") | m.Name("torch_npu"))):
            self.changes.append(".npu() -> .cpu()")
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("cpu")), args=[])
        # torch.device("cpu", i) after the literal rewrite: drop the index (one CPU device)
        if m.matches(updated.func, m.Attribute(value=m.Name("torch"), attr=m.Name("device"))) \
                and len(updated.args) == 2 and m.matches(updated.args[0].value, m.SimpleString()) \
                and updated.args[0].value.value[1:-1] == "cpu":
            self.changes.append("torch.device(..., index) -> torch.device(\"cpu\")")
            return updated.with_changes(args=[updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        return updated


def npu_to_cpu_for_dry_run(source: str) -> str:
    """The npu-rewritten program with its device strings mapped to the CPU (see module doc)."""
    return dry_run_rewrite(source)[0]


def dry_run_rewrite(source: str) -> tuple[str, list[str]]:
    """Like npu_to_cpu_for_dry_run, plus the list of rewrites made (for the run record)."""
    tree = cst.parse_module(source)
    rw = _DryRunRewriter()
    return tree.visit(rw).code, rw.changes
