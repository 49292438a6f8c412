"""Capture what Inductor does with a training step: kernels, nodes, source lines, counts.

The eager ATen ops of one uncompiled step are counted first (`eager.py`); then one step
runs compiled with the collecting backend of `capture_session.py`, stepped by the drivers
of `step_driver.py`.

Two ways in, both here: `InductorCapturePlugin` (a harness plugin: the unmodified program
runs in the harness child; loaded by the dotted path
`trainbridge.evidence.capture:InductorCapturePlugin`) and
`capture_step(model, optimizers, step_fn)` in-process. Both share the session and the step
logic, and write / return a `RawCapture`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..harness.plugins import HarnessPlugin
from .capture_session import CaptureSession
from .raw import RawCapture
from .step_driver import _AutoStepDriver, _StepDriver


# ------------------------------------------------------------------- plugin ----
class InductorCapturePlugin(HarnessPlugin):
    """Harness plugin: collect Inductor evidence from an unmodified training program.

    Options (all strings): `device` cuda|cpu (default cuda: Triton kernels, on a fake GPU
    when none is present), `out` (raw capture JSON, default `evidence_raw.json` in the
    program's folder), `source_root` (the program's folder; default: the script's folder),
    `eager_steps` (uncompiled steps before compiling, the last one profiled; default 1),
    `keep_code` 1|0 (save each graph's output code next to `out`; default 1).
    """

    name = "evidence"

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        self.driver: _AutoStepDriver | None = None
        self.session: CaptureSession | None = None
        self.error: str | None = None

    def _source_root(self) -> str:
        if self.options.get("source_root"):
            return self.options["source_root"]
        script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
        return str(Path(script).resolve().parent) if script else os.getcwd()

    def _out(self) -> Path:
        if self.options.get("out"):
            return Path(self.options["out"])
        return Path(self._source_root()) / "evidence_raw.json"

    @staticmethod
    def _running_copy() -> list[str]:
        script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
        return [str(Path(script).resolve().parent)] if script else []

    def _ensure(self) -> CaptureSession:
        if self.session is None:
            out = self._out()
            keep = self.options.get("keep_code", "1") != "0"
            self.session = CaptureSession(device=self.options.get("device", "cuda"),
                                          source_root=self._source_root(),
                                          code_dir=out.with_name(out.stem + "_code") if keep else None,
                                          program_copies=self._running_copy())
            self.session.start()
            self.driver = _AutoStepDriver(self.session, eager_steps=int(self.options.get("eager_steps", "1")))
        return self.session

    def before_program(self) -> None:
        # nothing yet: the harness sets sys.argv to the (ported) script only after this
        # hook, and the session needs that folder; compilation starts at the root module
        pass

    def on_root_module(self, module: torch.nn.Module) -> None:
        try:
            self._ensure()
        except Exception as e:
            self.error = f"{type(e).__name__}: {e}"
            return
        # The harness finds the root module in a pre-hook of its first call: that forward is
        # already under way with the original callable, so step 1 starts here.
        assert self.driver is not None
        if torch.is_grad_enabled():
            self.driver.on_training_forward()
            self.driver.set_phase("model")

    def wrap_root_call(self, module: torch.nn.Module, call: Any) -> Any:
        if self.driver is None:
            return call
        return self.driver.wrap_forward(module, call)

    def on_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if self.driver is None or not isinstance(optimizer, torch.optim.Optimizer):
            return  # a hand-written optimizer runs as the program wrote it (its step is not a region)
        driver = self.driver
        driver.wrap_optimizer(optimizer)
        driver.on_optimizer_step()  # this first step is already under way, unwrapped
        driver.set_phase(f"optimizer:{type(optimizer).__name__}")
        box: dict = {}

        def after_first_step(opt, args, kwargs):
            driver.set_phase("other")
            box["h"].remove()

        box["h"] = optimizer.register_step_post_hook(after_first_step)

    def finalize(self, status: str) -> str | None:
        out = self._out()
        if self.session is None:
            if self.error:
                raise RuntimeError(self.error)
            return None
        assert self.driver is not None
        self.driver.end_eager_profile()
        self.session.stop()
        raw = self.session.raw(eager=self.driver.eager)
        if self.error:
            raw.errors.append(self.error)
        if self.driver.step <= self.driver.eager_steps:
            raw.errors.append(f"the program ran {self.driver.step} step(s); compiled capture starts at step "
                              f"{self.driver.eager_steps + 1}: run more steps")
        raw.errors.append(f"harness status: {status}") if status != "ok" else None
        raw.save(out)
        return str(out)


# -------------------------------------------------------------- in-process ----
def capture_step(model: torch.nn.Module, optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None,
                 step_fn: Callable[[], Any], *, device: str = "cuda",
                 source_root: str | os.PathLike | None = None, eager_steps: int = 2,
                 code_dir: str | os.PathLike | None = None, reset_dynamo: bool = True) -> RawCapture:
    """Run `step_fn()` (one training step: forward, backward, optimizer step) eagerly
    `eager_steps` times (the last one profiled), then once compiled with the collector.

    The model's forward and the optimizers' step are wrapped only for the duration and
    restored afterwards; so are every Inductor / functorch config the collector changes.
    `reset_dynamo` clears Dynamo's caches first, so earlier compilations in this process
    cannot hide graphs.
    """
    if optimizers is None:
        opts: list[torch.optim.Optimizer] = []
    elif isinstance(optimizers, torch.optim.Optimizer):
        opts = [optimizers]
    else:
        opts = list(optimizers)
    if source_root is None:
        source_root = Path(sys.modules[type(model).__module__].__file__).resolve().parent \
            if getattr(sys.modules.get(type(model).__module__), "__file__", None) else os.getcwd()
    if reset_dynamo:
        torch._dynamo.reset()
    session = CaptureSession(device=device, source_root=source_root, code_dir=code_dir)
    driver = _StepDriver(session, eager_steps=eager_steps)
    had_forward = "forward" in vars(model)
    old_forward = vars(model).get("forward")
    session.start()
    try:
        model.forward = driver.wrap_forward(model, model.forward)  # type: ignore[method-assign]
        for opt in opts:
            driver.wrap_optimizer(opt)
        for index in range(1, eager_steps + 2):
            driver.begin_step(index)
            step_fn()
            driver.end_step(index)
    finally:
        driver.close()
        session.stop()
        if had_forward:
            model.forward = old_forward  # type: ignore[method-assign]
        else:
            vars(model).pop("forward", None)
    return session.raw(eager=driver.eager)
