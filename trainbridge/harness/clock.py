"""The step clock of the harness child: where a training step ends, and what it did.

Everything is observed through public hooks; the program's source is never edited:

- a *step* ends when every optimizer seen in the first step has stepped once more
  (global optimizer step post-hooks), so Muon + AdamW count as one step and gradient
  accumulation (several backward calls) stays inside it; an optimizer the program writes as
  a plain class reports through `handwritten_optimizers`;
- the *loss* is the tensor `backward()` was called on, kept as a detached reference and
  read only after the run, so no host sync is added to a timed step;
- the *work* of a step is read from the root module's inputs (integer tensors' numel =
  tokens, else the batch dimension = samples) - shapes only, no sync;
- every boundary synchronizes the device before reading the clock.

Instruments that perturb timing (profiler, op counting, FLOP counting) each get their own
steps after the measured ones.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..aten_ops import FLOOR_KERNELS, PRECISION_GEMMS, dispatcher_names
from .boundaries import FORMAT as BOUNDARY_FORMAT
from .handwritten_optimizers import HandwrittenOptimizerHooks
from .models import ElementwiseCount, KernelCall, OpCount, RunRequest, StepRecord
from .plugins import HarnessPlugin


_write, _read = os.write, os.read  # bound at import, before the program runs


class HarnessStop(BaseException):
    """Raised from a step boundary once enough steps ran. BaseException, so a program's
    `except Exception` cannot swallow it."""


# The matrix-unit ops: a precision change (autocast, a cast to fp32) shows in their dtypes.
GEMM_OPS = dispatcher_names(PRECISION_GEMMS)
_FLOOR_OPS = dispatcher_names(FLOOR_KERNELS)


def _spec(value):
    """An argument as JSON: a tensor by shape and dtype (the floor makes its own), else the value."""
    if isinstance(value, torch.Tensor):
        return {"shape": list(value.shape), "stride": list(value.stride()),
                "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, (list, tuple)):
        return [_spec(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _spec(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class _OpCounter(TorchDispatchMode):
    """Counts ATen ops reaching the dispatcher: the eager 'operators launched' per step, and the
    GEMM/convolution ops by input dtype."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.gemm_dtypes: Counter[str] = Counter()
        self.kernel_calls: Counter[str] = Counter()  # JSON of (op, args, kwargs) -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if not name.startswith("profiler."):  # record_function markers are not kernels
            self.counts[name] += 1
            if name in GEMM_OPS:
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    self.gemm_dtypes[str(first.dtype).removeprefix("torch.")] += 1
            if name in _FLOOR_OPS:
                key = json.dumps([str(func), _spec(list(args)), _spec(kwargs or {})])
                self.kernel_calls[key] += 1
        return func(*args, **(kwargs or {}))

    def kernel_call_list(self) -> list[KernelCall]:
        out = []
        for key, n in self.kernel_calls.most_common():
            op, args, kwargs = json.loads(key)
            out.append(KernelCall(op=op, args=args, kwargs=kwargs, calls=n))
        return out


class _FunctionTracer:
    """Counts calls of the program's own Python functions during one step.

    Which functions a training step actually runs (a function that only runs before
    training, such as a data-dependent initializer, cannot speed a step up). Keys are
    `relative/path.py:qualname`; files outside the program folder are not recorded.
    """

    def __init__(self, root: Path):
        self.roots = tuple({str(root) + os.sep, str(root.resolve()) + os.sep})
        self.calls: Counter[str] = Counter()
        self._previous = None

    def _hook(self, frame, event, arg):
        if event == "call":
            code_ = frame.f_code
            name = code_.co_filename
            for root in self.roots:
                if name.startswith(root):
                    self.calls[f"{name[len(root):]}:{code_.co_qualname}"] += 1
                    break

    def __enter__(self):
        self._previous = sys.getprofile()
        sys.setprofile(self._hook)
        return self

    def __exit__(self, *exc):
        sys.setprofile(self._previous)


def _compiled_graphs() -> int:
    """Graphs Dynamo compiled so far in this process (0 if torch.compile was never used)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0


class StepClock:
    """Detects step boundaries from optimizer and backward hooks; records one StepRecord each."""

    def __init__(self, req: RunRequest, target, plugins: list[HarnessPlugin]):
        self.req = req
        self.target = target
        self.plugins = plugins
        self.known: set[int] | None = None  # optimizer ids that make up one step
        self.stepped: set[int] = set()
        self.optimizers_seen: set[int] = set()
        self.backward_calls = 0
        self.loss_ref: torch.Tensor | None = None
        self.work_items = 0
        self._boundary_fd = req.boundary_fd
        self._gate_fd = req.step_gate_fd
        self.t_last = time.perf_counter()
        self._signal(b"S")
        self.t_last_opt = self.t_last
        self.work_at_last_opt = 0  # work counted up to the last optimizer step (for step 1)
        self.steps: list[StepRecord] = []
        self.loss_refs: list[torch.Tensor | None] = []
        self.root: torch.nn.Module | None = None
        self._depth = 0
        self._global_handles: list = []
        self._steps_file = open(req.steps_path, "a", buffering=1)
        # instruments
        self.profiler = None
        self.op_counter: _OpCounter | None = None
        self.flop_counter = None
        self.ops_per_step: OpCount | None = None
        self.kernel_calls: list[KernelCall] | None = None
        self.function_tracer: _FunctionTracer | None = None
        self.step_functions: dict[str, int] | None = None
        self.flops_per_step: int | None = None
        self.elementwise_counter = None
        self.elementwise_per_step: ElementwiseCount | None = None
        self.profile_ops: list[dict] | None = None
        self.graphs_at_root: int | None = None  # compiled graphs before the first training forward

    def _signal(self, kind: bytes, index: int = 0) -> None:
        """Tell the parent a boundary happened now (`boundaries`: the parent's clock is the measurement)."""
        if self._boundary_fd is not None:
            _write(self._boundary_fd, struct.pack(BOUNDARY_FORMAT, kind, index))

    # ----------------------------------------------------------------- phases ----
    def phase_of(self, index: int) -> str:
        r = self.req
        edges = [
            ("warmup", r.warmup_steps),
            ("measured", r.measured_steps),
            ("profile", r.profile_steps),
            ("count_ops", int(r.count_ops_step)),
            ("count_flops", int(r.count_flops_step)),
        ]
        upto = 0
        for name, n in edges:
            upto += n
            if index <= upto:
                return name
        return "measured"

    # ------------------------------------------------------------------ hooks ----
    def install(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self._opt_pre)
        register_optimizer_step_post_hook(self._opt_post)
        # optimizers the program writes as plain classes: their step() reports the same way
        self.handwritten = HandwrittenOptimizerHooks(Path(self.req.script).parent, self._opt_pre, self._opt_post)
        self.handwritten.install()
        # Global module hooks only until the root module is known, then removed so they
        # cost nothing in timed steps and never meet a compiled region.
        self._global_handles = [
            register_module_forward_pre_hook(self._global_pre),
            register_module_forward_hook(self._global_post),
        ]
        clock = self
        orig_backward = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            clock._on_backward(tensor)
            return orig_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign]

    def _global_pre(self, module, args):
        if self._depth == 0 and self.root is None:
            self._set_root(module)
            self._count_work(module, args)  # the hook below is registered after this call began
        self._depth += 1

    def _global_post(self, module, args, output):
        self._depth = max(0, self._depth - 1)
        if self.root is not None and self._depth == 0:
            for h in self._global_handles:
                h.remove()
            self._global_handles = []

    def _set_root(self, module: torch.nn.Module) -> None:
        self.root = module
        self.graphs_at_root = _compiled_graphs()
        module.register_forward_pre_hook(self._count_work)
        for p in self.plugins:
            p.on_root_module(module)
            module.forward = p.wrap_root_call(module, module.forward)

    def _count_work(self, module, args):
        if not torch.is_grad_enabled():  # evaluation passes are not training work
            return
        for a in args:
            if isinstance(a, torch.Tensor):
                if not a.is_floating_point() and not a.is_complex():
                    self.work_items += a.numel()
                else:
                    self.work_items += a.shape[0] if a.dim() else 1
                return

    def _on_backward(self, tensor: torch.Tensor) -> None:
        if self.known is None and self.stepped:
            # First step's optimizer set is now complete: close step 1 where it ended.
            self.known = set(self.stepped)
            carried = self.work_items - self.work_at_last_opt  # this forward belongs to step 2
            self.work_items = self.work_at_last_opt
            self._close_step(self.t_last_opt)
            self.work_items = carried
        self.backward_calls += 1
        self.loss_ref = tensor.detach()

    def _opt_pre(self, optimizer, args, kwargs):
        if self.elementwise_counter is not None:
            self.elementwise_counter.paused += 1  # the update is not elementwise work of the model
        oid = id(optimizer)
        if oid not in self.optimizers_seen:
            self.optimizers_seen.add(oid)
            for p in self.plugins:
                p.on_optimizer(optimizer)

    def _opt_post(self, optimizer, args, kwargs):
        if self.elementwise_counter is not None and self.elementwise_counter.paused:
            self.elementwise_counter.paused -= 1
        self.stepped.add(id(optimizer))
        if self.known is None:
            self.target.synchronize()
            self.t_last_opt = time.perf_counter()
            self._signal(b"T")
            self.work_at_last_opt = self.work_items
            return
        if self.known <= self.stepped:
            self._close_step(None)

    # ------------------------------------------------------------- boundaries ----
    def _close_step(self, t_end: float | None) -> None:
        lazy = t_end is not None
        index = len(self.steps) + 1
        if t_end is None:
            self.target.synchronize()
            t_end = time.perf_counter()
            self._signal(b"E", index)
        else:
            self._signal(b"L", index)
        phase = self.phase_of(index)
        self._stop_instruments(phase)
        rec = StepRecord(
            index=index,
            phase=phase,  # type: ignore[arg-type]
            step_ms=(t_end - self.t_last) * 1e3,
            backward_calls=self.backward_calls,
            work_items=self.work_items,
        )
        self.steps.append(rec)
        self.loss_refs.append(self.loss_ref)
        self._steps_file.write(rec.model_dump_json() + "\n")
        self.stepped = set()
        self.backward_calls = 0
        self.work_items = 0
        self.loss_ref = None
        for p in self.plugins:
            p.on_step_end(index)
        if index >= self.req.total_steps:
            raise HarnessStop()
        self._start_instruments(self.phase_of(index + 1), phase)
        if lazy:
            # step 1 was closed late (at step 2's first backward): step 2 began at t_end
            self.t_last = t_end
        else:
            if self._gate_fd is not None:  # lockstep: wait for the parent's go (the other arm ran its step)
                _read(self._gate_fd, 1)
            self.target.synchronize()
            self.t_last = time.perf_counter()
            self._signal(b"S")

    def _start_instruments(self, next_phase: str, this_phase: str) -> None:
        if next_phase == "profile" and this_phase != "profile":
            self.profiler = self.target.profiler(self.req.profile_dir)
            self.profiler.start()
        elif next_phase == "count_ops":
            self.op_counter = _OpCounter()
            self.op_counter.__enter__()
            self.function_tracer = _FunctionTracer(Path(self.req.cwd))
            self.function_tracer.__enter__()
        elif next_phase == "count_flops":
            from .elementwise import ElementwiseCounter
            from .flops import flop_counter

            self.flop_counter = flop_counter()
            self.flop_counter.__enter__()
            self.elementwise_counter = ElementwiseCounter()
            self.elementwise_counter.__enter__()

    def _stop_instruments(self, phase: str) -> None:
        index = len(self.steps) + 1
        if phase == "profile" and self.profiler is not None and self.phase_of(index + 1) != "profile":
            self.profiler.stop()
            self._save_profile()
            self.profiler = None
        if phase == "count_ops" and self.op_counter is not None:
            counter, self.op_counter = self.op_counter, None  # exited once, whatever follows
            counter.__exit__(None, None, None)
            c = counter.counts
            self.ops_per_step = OpCount(total=sum(c.values()), by_op=dict(c.most_common()),
                                        gemm_by_dtype=dict(counter.gemm_dtypes.most_common()))
            self.kernel_calls = counter.kernel_call_list()
            if self.function_tracer is not None:
                self.function_tracer.__exit__(None, None, None)
                self.step_functions = dict(self.function_tracer.calls.most_common())
                self.function_tracer = None
        if phase == "count_flops" and self.elementwise_counter is not None:
            c, self.elementwise_counter = self.elementwise_counter, None
            c.__exit__(None, None, None)
            self.elementwise_per_step = ElementwiseCount(total=c.total, by_op=dict(c.by_op.most_common()),
                                                         calls=c.calls, opaque=dict(c.opaque.most_common()))
        if phase == "count_flops" and self.flop_counter is not None:
            self.flop_counter.__exit__(None, None, None)
            self.flops_per_step = int(self.flop_counter.get_total_flops())
            self.flop_counter = None

    def _save_profile(self) -> None:
        """The operator table of the profile window (its trace went to profile_dir at stop)."""
        prof = self.profiler
        rows = []
        try:
            averages = prof.key_averages()
        except Exception:  # a vendor profiler without the table: its own output folder is the record
            averages = []
        for e in averages:
            rows.append(
                {
                    "name": e.key,
                    "calls": int(e.count),
                    "self_cpu_us": float(e.self_cpu_time_total),
                    "cpu_total_us": float(e.cpu_time_total),
                    "self_device_us": float(getattr(e, "self_device_time_total", 0.0) or 0.0),
                }
            )
        self.profile_ops = rows

    def close(self) -> None:
        if getattr(self, "handwritten", None) is not None:
            self.handwritten.uninstall()
        if self.function_tracer is not None:
            self.function_tracer.__exit__(None, None, None)
        if self.op_counter is not None:
            self.op_counter.__exit__(None, None, None)
        if self.elementwise_counter is not None:
            self.elementwise_counter.__exit__(None, None, None)
        if self.flop_counter is not None:
            self.flop_counter.__exit__(None, None, None)
        if self.profiler is not None:
            try:
                self.profiler.stop()
            except Exception:
                pass
        self._steps_file.close()

    def read_losses(self) -> None:
        """After the run: the only place losses are brought to the host."""
        for rec, ref in zip(self.steps, self.loss_refs):
            if ref is not None:
                rec.loss = float(ref.float().mean())

