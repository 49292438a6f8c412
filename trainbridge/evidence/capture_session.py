"""The collecting backend: what Inductor does with each graph of a training step.

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

It also records Dynamo's graph breaks and assembles everything into a `RawCapture`. When
steps begin and which callables are compiled is decided elsewhere (`step_driver.py`); the
Inductor patches it installs are in `inductor_hooks.py`, the output-code parsing in
`codeparse.py`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
import warnings
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..aten_ops import FUSED_ATTENTION, GRAPH_LIBRARY_CALLS
from .bundle import Route
from .codeparse import parse_output_code, short_op
from .frames import SourceFilter
from .graph_match import DROPOUT
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


def _library_module(stack) -> str:
    """The innermost nn.Module's qualified class when torch itself defines it ('torch.nn.modules.
    normalization.LayerNorm'), else '': Inductor decomposes such a module into the same ATen ops
    a hand-written one has, but the program already calls the library operator there."""
    values = [v for v in (stack or {}).values() if isinstance(v, tuple) and len(v) == 2]
    if not values:
        return ""
    cls = values[-1][1]
    name = cls if isinstance(cls, str) else f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', '')}"
    name = name.replace("<class '", "").strip("'>")
    return name if name.startswith("torch.") else ""


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
        self._stack.enter_context(collector_config(self._on_post_grad_graph,
                                                   fallback_random=self.route == "fake_cuda_codegen"))
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
                inputs=[a.name for a in n.all_input_nodes],
                library_module=_library_module(meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")),
                scalars=[float(a) for a in (*n.args, *n.kwargs.values())
                         if isinstance(a, (int, float)) and not isinstance(a, bool)],
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
            if any(short_op(n.target) in DROPOUT for g in graphs for n in g.nodes.values()):
                lims.append("fake_cuda_codegen: random ops (dropout) are eager fallback kernels here (Inductor's "
                            "fallback_random): a CPU-only torch cannot seed Inductor's GPU random kernels; on a GPU "
                            "they are generated inside the fused kernels")
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
