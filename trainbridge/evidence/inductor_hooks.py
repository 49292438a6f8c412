"""The Inductor internals the collector hooks into, each in one context manager that restores.

All checked on torch 2.13.0 (`CHECKED_ON`); `missing_private_apis()` lists what has gone
(a test calls it). The fake-CUDA patches are in `fake_cuda.py`.

- `collector_config()`: caches off (a cache hit skips code generation and provenance),
  backward lowered eagerly (`force_non_lazy_backward_lowering`, else the backward's
  provenance is empty), provenance tracking on, one compile thread, and a post-grad custom
  pass that records every post-grad FX node; on the fake-CUDA route, random ops as eager
  fallbacks (`fallback_random`: Inductor's own random kernels need a GPU to seed); previous
  values restored on exit.
- `stop_after_codegen(on_code)`: `GraphLowering.save_output_code` (Inductor's hook for
  tests) receives the wrapper code before the module is loaded; we keep it and the kernel ->
  post-grad node provenance map, then stop. Nothing is compiled by a C++ compiler or Triton.
- `structured_trace(on_record)`: a handler on the structured-trace logger, for the
  `dynamo_graph_break_reason` artifacts (graph breaks with their user stack).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any, Callable
from unittest import mock

import torch

CHECKED_ON = "2.13.0"

USED_PRIVATE_APIS = [
    "torch._inductor.compile_fx:compile_fx",  # compile_fx(gm, inputs, inner_compile=...)
    "torch._inductor.compile_fx:compile_fx_inner",
    "torch._inductor.graph:GraphLowering.save_output_code",  # test hook: code before load
    "torch._inductor.debug:_inductor_triton_kernel_to_post_grad_node_info",  # kernel handle -> post-grad nodes
    "torch._inductor.custom_graph_pass:CustomGraphPass",
    "torch._inductor.config:post_grad_custom_post_pass",
    "torch._inductor.config:fx_graph_cache",
    "torch._inductor.config:fx_graph_remote_cache",
    "torch._inductor.config:compile_threads",
    "torch._inductor.config:fallback_random",
    "torch._inductor.config:trace.provenance_tracking_level",
    "torch._functorch.config:enable_autograd_cache",
    "torch._functorch.config:force_non_lazy_backward_lowering",
    "torch._logging._internal:trace_log",
    "torch._dynamo.utils:counters",
    "torch.optim.optimizer:Optimizer.profile_hook_step",
    "torch._C:_current_autograd_node",
]


def missing_private_apis() -> list[str]:
    missing = []
    for spec in USED_PRIVATE_APIS:
        mod, _, path = spec.partition(":")
        try:
            obj: Any = importlib.import_module(mod)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            missing.append(spec)
    return missing


class CodegenDone(Exception):
    """Raised from the save_output_code hook: the code is kept, the module is not loaded."""


def _post_grad_pass_class():
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class PostGradRecorder(CustomGraphPass):
        """Post-grad custom pass that hands every graph to a callback (and chains a previous pass)."""

        def __init__(self, callback: Callable[[torch.fx.Graph], None], previous=None):
            self.callback = callback
            self.previous = previous

        def __call__(self, graph: torch.fx.Graph) -> None:
            if self.previous is not None:
                self.previous(graph)
            self.callback(graph)

        def uuid(self) -> Any:  # caches are off while collecting; still a stable value
            return ("trainbridge.evidence.PostGradRecorder", id(self))

    return PostGradRecorder


@contextlib.contextmanager
def collector_config(on_post_grad_graph: Callable[[torch.fx.Graph], None], *, fallback_random: bool = False):
    import torch._functorch.config as fc
    import torch._inductor.config as ic

    recorder = _post_grad_pass_class()(on_post_grad_graph, ic.post_grad_custom_post_pass)
    with ic.patch({
        "fx_graph_cache": False,
        "fx_graph_remote_cache": False,
        "trace.provenance_tracking_level": 1,
        "post_grad_custom_post_pass": recorder,
        "compile_threads": 1,
        # fake CUDA: Inductor seeds its own random kernels with a tensor on the GPU, which a CPU-only
        # torch cannot make, and the whole graph of a program with dropout failed to generate
        **({"fallback_random": True} if fallback_random else {}),
    }), fc.patch({"enable_autograd_cache": False, "force_non_lazy_backward_lowering": True}):
        yield


def provenance_map() -> dict[str, list[str]]:
    """Kernel debug handle ('name:N') -> post-grad node names, as Inductor tracked them so far."""
    import torch._inductor.debug as idebug

    return {k: list(v) for k, v in dict(idebug._inductor_triton_kernel_to_post_grad_node_info).items()}


@contextlib.contextmanager
def stop_after_codegen(on_code: Callable[[str, dict[str, list[str]]], None]):
    from torch._inductor.graph import GraphLowering

    def hook(code: str) -> None:
        on_code(code, provenance_map())
        raise CodegenDone()

    with mock.patch.object(GraphLowering, "save_output_code", staticmethod(hook)):
        yield


def is_codegen_done(exc: BaseException) -> bool:
    """True when `exc` (possibly wrapped by Inductor) is our CodegenDone."""
    seen = 0
    e: BaseException | None = exc
    while e is not None and seen < 10:
        if isinstance(e, CodegenDone):
            return True
        e = getattr(e, "inner_exception", None) or e.__cause__ or e.__context__
        seen += 1
    return False


class _TraceHandler(logging.Handler):
    def __init__(self, on_record: Callable[[str, Any, dict], None]):
        super().__init__(level=logging.DEBUG)
        self.on_record = on_record

    def emit(self, record: logging.LogRecord) -> None:
        md = getattr(record, "metadata", None) or {}
        if "artifact" in md:
            name = md["artifact"].get("name")
        else:
            name = next(iter(md), None)
        try:
            self.on_record(name, getattr(record, "payload", None), md)
        except Exception:  # evidence must never break the program
            pass


@contextlib.contextmanager
def structured_trace(on_record: Callable[[str, Any, dict], None]):
    from torch._logging._internal import trace_log

    handler = _TraceHandler(on_record)
    old_level = trace_log.level
    trace_log.addHandler(handler)
    trace_log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(old_level)
