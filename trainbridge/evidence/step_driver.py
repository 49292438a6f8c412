"""Step boundaries and wrapping: which training step runs eagerly, profiled or compiled.

The capture needs one uncompiled step profiled (eager ATen ops, `eager.py`) and one
compiled step whose graph calls are counted; the program itself must keep running. The
drivers here wrap the root module's forward and each optimizer's `step` so that, step by
step, they run the program's own code or the `CaptureSession`'s compiled version, and
restore them afterwards. `_StepDriver` is told where steps begin (`capture_step`);
`_AutoStepDriver` infers it in an unmodified program (the harness plugin).
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from .capture_session import CaptureSession
from .eager import EagerStepProfiler


class _StepDriver:
    """Shared by the plugin and `capture_step`: eager steps (the last one counted), then compiled.

    Steps are numbered from 1. Steps 1..eager_steps run uncompiled and the last of them is
    profiled (eager ATen ops); step eager_steps+1 compiles and runs the collecting graphs,
    whose calls are counted as the launches per step; later steps run uncompiled again.
    """

    def __init__(self, session: CaptureSession, eager_steps: int = 1):
        self.session = session
        self.eager_steps = max(0, int(eager_steps))
        self.step = 0
        self.compiled = False
        self.profiler: EagerStepProfiler | None = None
        self.eager = None
        self._phase_stack: list[str] = []
        self.restore: list[Callable[[], None]] = []
        self.optimizers: list[torch.optim.Optimizer] = []

    # phases for the eager profiler
    def _enter_phase(self, name: str) -> None:
        self._phase_stack.append(name)
        if self.profiler is not None:
            self.profiler.phase = name

    def set_phase(self, name: str) -> None:
        """Phase for code the collector does not wrap (the harness's first forward / step)."""
        self._phase_stack = [name]
        if self.profiler is not None:
            self.profiler.phase = name

    def _exit_phase(self) -> None:
        if self._phase_stack:
            self._phase_stack.pop()
        if self.profiler is not None:
            self.profiler.phase = self._phase_stack[-1] if self._phase_stack else "other"

    def begin_step(self, index: int) -> None:
        """Called when step `index` starts (before its first forward)."""
        self.step = index
        if index > 1 and self.profiler is not None and index - 1 == self.eager_steps:
            self.end_eager_profile()
        if index == self.eager_steps + 1:
            self.compiled = True
            self.session.reset_calls()
        elif index == self.eager_steps + 2:
            self.session.freeze_calls()
            # capture done: later steps run the program's own code again (a recompile
            # for a changed hyperparameter, e.g. Muon's momentum warm-up, would only cost time)
            self.compiled = False
        if index == self.eager_steps and self.eager is None:
            self.profiler = EagerStepProfiler(self.session.filter)
            self.profiler.start()
        if index > self.eager_steps:
            self.session.compiled_steps = index - self.eager_steps

    def end_eager_profile(self) -> None:
        if self.profiler is not None:
            self.profiler.stop()
            self.eager = self.profiler.result()
            self.profiler = None

    def end_step(self, index: int) -> None:
        """Optional explicit end of a step (in-process use)."""
        if index == self.eager_steps and self.profiler is not None:
            self.end_eager_profile()
        if index == self.eager_steps + 1:
            self.session.freeze_calls()

    # ---------------------------------------------------------------- wrapping ----
    def wrap_forward(self, module: torch.nn.Module, call: Callable) -> Callable:
        compiled_box: dict[str, Callable] = {}
        driver = self

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():  # evaluation: not part of a training step
                return call(*args, **kwargs)
            driver.on_training_forward()
            driver._enter_phase("model")
            try:
                if driver.compiled:
                    if "fn" not in compiled_box:
                        compiled_box["fn"] = driver.session.compile(call, region="model")
                    return compiled_box["fn"](*args, **kwargs)
                return call(*args, **kwargs)
            finally:
                driver._exit_phase()

        forward.__trainbridge_capture__ = True  # type: ignore[attr-defined]
        return forward

    def on_training_forward(self) -> None:  # overridden by the plugin driver
        pass

    def on_optimizer_step(self) -> None:  # overridden by the plugin driver
        pass

    def wrap_optimizer(self, opt: torch.optim.Optimizer) -> None:
        from torch.optim.optimizer import Optimizer

        if any(o is opt for o in self.optimizers):
            return
        self.optimizers.append(opt)
        cls_step = type(opt).step
        raw = cls_step.__wrapped__ if getattr(cls_step, "hooked", False) and hasattr(cls_step, "__wrapped__") \
            else cls_step
        driver = self
        compiled_box: dict[str, Callable] = {}
        region = f"optimizer:{type(opt).__name__}"

        def optimizer_step(*args, **kwargs):
            return raw(opt, *args, **kwargs)

        def step_impl(self_opt, *args, **kwargs):
            driver.on_optimizer_step()
            driver._enter_phase(region)
            try:
                if driver.compiled:
                    if "fn" not in compiled_box:
                        compiled_box["fn"] = driver.session.compile(optimizer_step, region=region)
                    return compiled_box["fn"](*args, **kwargs)
                return raw(self_opt, *args, **kwargs)
            finally:
                driver._exit_phase()

        had_instance_step = "step" in vars(opt)
        old = vars(opt).get("step")
        opt.step = types.MethodType(Optimizer.profile_hook_step(step_impl), opt)  # type: ignore[method-assign]

        def undo():
            if had_instance_step:
                opt.step = old  # type: ignore[method-assign]
            else:
                vars(opt).pop("step", None)

        self.restore.append(undo)

    def close(self) -> None:
        self.end_eager_profile()
        for undo in reversed(self.restore):
            try:
                undo()
            except Exception:
                pass
        self.restore.clear()


class _AutoStepDriver(_StepDriver):
    """Infers step boundaries in an unmodified program: a new step starts with the first
    training forward after an optimizer step (gradient accumulation stays inside a step)."""

    def __init__(self, session: CaptureSession, eager_steps: int = 1):
        super().__init__(session, eager_steps)
        self._stepped_since_forward = False
        self._forwards = 0

    def on_training_forward(self) -> None:
        if self._forwards == 0 or self._stepped_since_forward:
            self.begin_step(self.step + 1)
        self._forwards += 1
        self._stepped_since_forward = False

    def on_optimizer_step(self) -> None:
        self._stepped_since_forward = True
