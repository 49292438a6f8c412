"""Capture what Inductor does with a training step: kernels, nodes, source lines, counts.

`CaptureSession` compiles the root module's forward (forward + backward graphs via
AOTAutograd) and each optimizer's step (one graph each) with a backend whose inner compile

1. records the graph (phase, region) and generates its code on the chosen route -
   `cpu_inductor` (C++), `fake_cuda_codegen` (Triton for a fake H100, see fake_cuda.py) or
   `real_gpu` - stopping before anything is compiled by a C++ compiler or Triton;
2. keeps the code, the kernel -> post-grad node provenance and every post-grad node's
   target, seq_nr, module stack and user stack (backward nodes carry the forward line they
   differentiate);
3. returns the graph itself, run eagerly, counting its calls - so the program keeps its
   semantics and the launches per step are exact.

The eager ATen ops of one uncompiled step are counted first (`eager.py`).

Two ways in: `InductorCapturePlugin` (a harness plugin: the unmodified program runs in the
harness child) and `capture_step(model, optimizers, step_fn)` in-process. Both share the
session and the step logic, and write / return a `RawCapture`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import time
import types
import warnings
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..aten_ops import FUSED_ATTENTION, GRAPH_LIBRARY_CALLS
from ..harness.plugins import HarnessPlugin
from .bundle import Route
from .codeparse import parse_output_code
from .eager import EagerStepProfiler
from .frames import SourceFilter
from .raw import RawCapture, RawGraph, RawGraphBreak, RawLaunch, RawNode

_MATMUL_OPS = GRAPH_LIBRARY_CALLS | {"matmul"} | FUSED_ATTENTION


def decide_route(device: str) -> Route:
    dev = torch.device(device).type
    if dev == "cpu":
        return "cpu_inductor"
    if dev != "cuda":
        raise ValueError(f"evidence device must be cuda or cpu, not {device!r}")
    return "real_gpu" if torch.cuda.is_available() else "fake_cuda_codegen"


def program_sha(root: str | os.PathLike | None) -> str:
    if not root or not Path(root).is_dir():
        return ""
    h = hashlib.sha256()
    root = Path(root)
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def _dtype_name(d) -> str:
    return str(d).replace("torch.", "")


def _module_entries(stack) -> list[str]:
    out = []
    for v in (stack or {}).values():
        if isinstance(v, tuple) and len(v) == 2:
            path, cls = v
            cname = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
            cname = cname.rsplit(".", 1)[-1].strip("'>")
            path = str(path).replace("L['self']", "").replace("L['fn']", "").lstrip(".")
            path = path.replace("._modules['", ".").replace("']", "")
            out.append(f"{path}:{cname}")
    return out


class CaptureSession:
    """Compiles with the collecting backend; holds everything captured until `raw()`."""

    def __init__(self, *, device: str = "cuda", source_root: str | os.PathLike | None = None,
                 code_dir: str | os.PathLike | None = None, program_copies: Iterable[str] = ()):
        self.device = device
        self.route: Route = decide_route(device)
        self.source_root = str(Path(source_root).resolve()) if source_root else None
        # the harness runs a ported copy of the program (same relative paths and line
        # numbers): its frames are user frames too, reported under the original's names
        self.filter = SourceFilter(self.source_root, copies=list(program_copies))
        self.code_dir = Path(code_dir) if code_dir else None
        self.graphs: list[RawGraph] = []
        self.calls: list[int] = []
        self._frozen_calls: list[int] | None = None
        self.breaks: list[RawGraphBreak] = []
        self.errors: list[str] = []
        self._current: RawGraph | None = None
        self._stack: ExitStack | None = None
        self._breaks_before = 0
        self.compiled_steps = 0
        if self.route == "fake_cuda_codegen":
            from .fake_cuda import triton_available

            if not triton_available():
                raise RuntimeError("device='cuda' without a GPU needs the 'triton' package for the "
                                   "fake_cuda_codegen route (pip install triton), or use device='cpu'")

    # ------------------------------------------------------------ lifecycle ----
    def start(self) -> None:
        if self._stack is not None:
            return
        from .inductor_hooks import collector_config, structured_trace

        self._stack = ExitStack()
        self._stack.enter_context(collector_config(self._on_post_grad_graph))
        self._stack.enter_context(structured_trace(self._on_trace_record))
        self._breaks_before = self._graph_break_total()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    @staticmethod
    def _graph_break_total() -> int:
        from torch._dynamo.utils import counters

        return sum(counters["graph_break"].values())

    # ------------------------------------------------------------- compiling ----
    def backend(self, region: str) -> Callable:
        from torch._inductor.compile_fx import compile_fx

        def collecting_backend(gm, example_inputs):
            return compile_fx(gm, example_inputs, inner_compile=functools.partial(self._inner, region=region))

        return collecting_backend

    def compile(self, fn: Callable, region: str) -> Callable:
        return torch.compile(fn, backend=self.backend(region))

    def _inner(self, gm: torch.fx.GraphModule, example_inputs, *, region: str, **kwargs):
        if kwargs.get("is_backward"):
            phase = "backward"
        elif region.startswith("optimizer"):
            phase = "optimizer"
        elif kwargs.get("is_inference"):
            phase = "inference"
        else:
            phase = "forward"
        gid = len(self.graphs)
        rec = RawGraph(id=gid, phase=phase, region=region)
        self.graphs.append(rec)
        self.calls.append(0)
        t0 = time.perf_counter()
        try:
            self._codegen(gm, list(example_inputs), kwargs, rec)
        except Exception as e:  # evidence is best effort; the program must run on
            rec.codegen_error = f"{type(e).__name__}: {str(e)[:600]}"
            self.errors.append(f"graph {gid} ({phase}): {rec.codegen_error}")
        rec.codegen_error = rec.codegen_error
        self._codegen_s = getattr(self, "_codegen_s", 0.0) + time.perf_counter() - t0
        return self._eager_runner(gm, gid)

    def _eager_runner(self, gm: torch.fx.GraphModule, gid: int):
        calls = self.calls

        def run(args):
            calls[gid] += 1
            a = list(args)
            args.clear()
            return gm(*a)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def _codegen(self, gm, example_inputs, kwargs, rec: RawGraph) -> None:
        import copy

        from torch._inductor.compile_fx import compile_fx_inner

        from .inductor_hooks import is_codegen_done, stop_after_codegen

        box: dict[str, Any] = {}

        def on_code(code: str, prov: dict[str, list[str]]) -> None:
            box["code"], box["prov"] = code, prov

        on_cuda_inputs = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
        if self.route == "cpu_inductor" or (self.route == "real_gpu" and on_cuda_inputs):
            g2, inputs, ctx = copy.deepcopy(gm), example_inputs, nullcontext()
            rec.device = "cuda" if on_cuda_inputs else "cpu"
        else:
            from .fake_cuda import fake_cuda_lowering, retarget_to_cuda

            g2, inputs, fake_mode = retarget_to_cuda(gm, example_inputs)
            if self.route == "fake_cuda_codegen":
                ctx = fake_cuda_lowering(fake_mode)
            else:  # a real GPU is present but the program runs on CPU: lower for it
                ctx = torch._guards.tracing(torch._guards.TracingContext(fake_mode))
            rec.device = "cuda"
        self._current = rec
        try:
            with ctx, stop_after_codegen(on_code), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compile_fx_inner(g2, inputs, **kwargs)
        except BaseException as e:
            if "code" not in box or not is_codegen_done(e):
                if "code" not in box:
                    raise
        finally:
            self._current = None
        code: str = box["code"]
        prov: dict[str, list[str]] = box.get("prov", {})
        parsed = parse_output_code(code)
        for launch in parsed.launches:
            nodes: list[str] = []
            if launch.handle and launch.handle in prov:
                nodes = prov[launch.handle]
            elif launch.name in parsed.defs:
                nodes = parsed.defs[launch.name].post_grad_nodes
            header = parsed.defs[launch.name].aten if launch.name in parsed.defs else launch.header_aten
            rec.launches.append(RawLaunch(name=launch.name, handle=launch.handle, kind=launch.kind,
                                          backend=launch.backend, nodes=list(nodes), header_aten=list(header),
                                          line=launch.line))
        if self.code_dir is not None:
            self.code_dir.mkdir(parents=True, exist_ok=True)
            path = self.code_dir / f"graph_{rec.id:02d}_{rec.phase}.py"
            path.write_text(code)
            rec.code_file = str(path)

    # ---------------------------------------------------------- observation ----
    def _on_post_grad_graph(self, graph: torch.fx.Graph) -> None:
        rec = self._current
        if rec is None:
            return
        for n in graph.nodes:
            if n.op != "call_function":
                continue
            meta = n.meta
            stack = self.filter.frames_from_trace(meta.get("stack_trace"))
            modules = _module_entries(meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack"))
            val = meta.get("val")
            dtype = shape = None
            if isinstance(val, torch.Tensor):
                dtype, shape = _dtype_name(val.dtype), [int(s) if isinstance(s, int) else -1 for s in val.shape]
            target = str(n.target)
            in_dtypes: list[str] = []
            op = target.split(".")[1] if target.count(".") >= 1 else target
            if op in _MATMUL_OPS:
                for a in n.args:
                    v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
                    if isinstance(v, torch.Tensor):
                        in_dtypes.append(_dtype_name(v.dtype))
            rec.nodes[n.name] = RawNode(
                target=target, seq_nr=meta.get("seq_nr"),
                backward=meta.get("partitioner_tag") == "is_backward" or rec.phase == "backward",
                stack=stack, modules=modules, dtype=dtype, shape=shape, in_dtypes=in_dtypes,
                tensor_args=sum(1 for a in n.args if isinstance(a, torch.fx.Node)),
            )

    def _on_trace_record(self, name: str | None, payload: Any, metadata: dict) -> None:
        if name != "dynamo_graph_break_reason" or not isinstance(payload, str):
            return
        import re

        m = re.search(r"Graph break in user code at (.+?):(\d+)\n", payload)
        reason = ""
        r = re.search(r"Graph Break Reason: (.*?)(?:\n\n|\nUser code traceback:)", payload, re.S)
        if r:
            reason = r.group(1).strip()
            # the first meaningful line: skip the generic "Failed to handle graph break gracefully" preamble
            lines = [l.strip() for l in reason.splitlines() if l.strip()]
            meaningful = [l for l in lines if not l.startswith(("Failed to handle", "Graph break encountered"))]
            reason = (meaningful or lines or [""])[0]
        tb = payload.split("User code traceback:", 1)[-1].split("\nTraceback (most recent call last)", 1)[0]
        user = self.filter.frames_from_trace(tb)
        file = line = None
        function = ""
        if m:
            rel = self.filter.rel(m.group(1))
            file, line = (rel or m.group(1)), int(m.group(2))
            user_code = rel is not None
        else:
            user_code = False
        if not user_code and user:
            function = user[-1].function
        self.breaks.append(RawGraphBreak(reason=reason[:400], file=file, line=line, function=function,
                                         user_code=user_code, user_stack=user[-4:]))

    # --------------------------------------------------------------- counting ----
    def reset_calls(self) -> None:
        for i in range(len(self.calls)):
            self.calls[i] = 0
        self._frozen_calls = None

    def freeze_calls(self) -> None:
        if self._frozen_calls is None:
            self._frozen_calls = list(self.calls)

    def raw(self, eager=None, limitations: Iterable[str] = ()) -> RawCapture:
        calls = self._frozen_calls if self._frozen_calls is not None else list(self.calls)
        graphs = []
        for g, n in zip(self.graphs, calls + [0] * (len(self.graphs) - len(calls))):
            g = g.model_copy()
            g.calls_per_step = n
            graphs.append(g)
        lims = list(limitations)
        if self.route == "fake_cuda_codegen":
            from .fake_cuda import LIMITATIONS

            lims += LIMITATIONS
        elif self.route == "cpu_inductor":
            lims.append("cpu_inductor: the kernels are Inductor's C++ code generation for this CPU, not a GPU's; "
                        "fusion groups differ from Triton's (consecutive groups merge into one cpp kernel)")
        else:
            lims.append("real_gpu: generated code was captured without running it (eager execution), "
                        "so no kernel timings; matmul autotuning choices are Inductor's defaults")
        if self.route != "fake_cuda_codegen":
            lims.append("decisions taken before Inductor (SDPA backend, optimizer foreach/fused) are the "
                        "program's as it ran here")
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        return RawCapture(
            route=self.route, device=torch.device(self.device).type, torch_version=torch.__version__,
            triton_version=triton_version, source_root=self.source_root, program_sha=program_sha(self.source_root),
            graphs=graphs, graph_breaks=list(self.breaks),
            graph_break_count=max(0, self._graph_break_total() - self._breaks_before),
            eager=eager, compiled_steps_observed=self.compiled_steps, limitations=lims, errors=list(self.errors),
        )


# ---------------------------------------------------------------- step logic ----
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
