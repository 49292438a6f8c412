"""The child process: runs an unmodified training program and owns its clock.

`python -m trainbridge.harness.child request.json` sets the seeds, installs hooks, runs the
program with runpy, and stops it after the requested number of optimizer steps. The
program's source is never edited here; everything is observed through public hooks by the
step clock (`clock.StepClock`: how a step, its loss and its work are found, and the
instruments that get their own steps after the measured ones).
"""

from __future__ import annotations

import hashlib
import os
import platform
import random
import runpy
import socket
import sys
import time
import traceback
from pathlib import Path

import torch

from ..targets import TargetUnavailable, get_target
from ..targets.base import cpu_model
from ..targets.capabilities import cpu_signature
from . import sandbox
from .after_import import when_imported
from .child_env import end_descendants
from .clock import GEMM_OPS, HarnessStop, StepClock, _compiled_graphs
from .models import Environment, RunRequest, RunResult, is_path_option
from .plugins import load_plugin

# Names that lived here before the step clock moved to `clock`.
__all__ = ["GEMM_OPS", "HarnessStop", "StepClock", "main", "run"]


def _program_sha(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(p.relative_to(root).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()



def _seed_everything(seed: int) -> None:
    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)


def _environment(req: RunRequest, target) -> Environment:
    return Environment(
        python=platform.python_version(),
        torch_version=torch.__version__,
        target=req.target,
        device_name=("torch_npu reference (CPU): not an NPU measurement" if req.npu_reference else target.device_name()),
        cpu_model=cpu_model(),
        cpu_signature=cpu_signature(),
        torch_threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        hostname=socket.gethostname(),
        program_sha256=_program_sha(Path(req.script).parent),
        env_knobs=target.knobs(),
    )


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "defaultcpuallocator" in text


def _harness_write_dirs(req: RunRequest) -> list[str]:
    """Folders the harness and its plugins write in while the program runs (results, traces, outputs)."""
    paths = [req.result_path, req.steps_path, req.profile_trace_path, req.profile_dir]
    paths += [v for k, v in req.plugin_options.items() if is_path_option(k)]
    return sorted({str(Path(p).parent) if Path(p).suffix else str(p) for p in paths if p})


def run(req: RunRequest) -> RunResult:
    t0 = time.perf_counter()
    result = RunResult(status="crashed", request=req)
    if req.npu_reference:
        # Dry run: the npu program executes on the CPU against plain-PyTorch references of
        # torch_npu; nothing it measures is an NPU measurement (environment says so).
        from ..npu_reference.fake_torch_npu import install

        install()
        target = get_target("cpu")
    else:
        target = get_target(req.target)
    try:
        target.check_available()
    except TargetUnavailable as e:
        result.error = str(e)
        return result
    result.environment = _environment(req, target)
    if req.eager_random_streams:
        # set as the program first imports Inductor (a program that never compiles skips that import)
        when_imported("torch._inductor.config", lambda config: setattr(config, "fallback_random", True))
        result.environment.eager_random_streams = True
    plugins = [load_plugin(spec, req.plugin_options) for spec in req.plugins]
    _seed_everything(req.seed)
    target.reset_peak_memory()
    clock = StepClock(req, target, plugins)
    clock.install()
    for p in plugins:
        p.before_program()
    sys.argv = [req.script, *req.args]
    sys.path.insert(0, str(Path(req.script).parent))
    if req.sandbox:
        sandbox.install(req.cwd, _harness_write_dirs(req), req.read_only_roots, req.private_roots)
    status, error = "crashed", None
    try:
        runpy.run_path(req.script, run_name="__main__")
        status = "finished_early"
        error = f"the program ended after {len(clock.steps)} of {req.total_steps} steps"
    except HarnessStop:
        status = "ok"
    except SystemExit as e:
        if e.code in (None, 0):
            status = "finished_early"
            error = f"the program exited after {len(clock.steps)} of {req.total_steps} steps"
        else:
            error = f"the program called sys.exit({e.code!r}) after {len(clock.steps)} steps"
    except BaseException as e:  # the program's own failure, reported in words
        status = "oom" if _is_oom(e) else "crashed"
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        error = f"{type(e).__name__}: {e}\n" + "".join(tb[-12:])
    finally:
        clock.close()
    if not clock.steps and status in ("ok", "finished_early"):
        status, error = "no_steps", "no optimizer step was observed: is this a training program?"
    try:
        clock.read_losses()
    except Exception as e:  # a crashed device may not give losses back
        error = (error or "") + f"\n(losses unreadable: {e})"
    result.status = status  # type: ignore[assignment]
    result.error = error
    result.steps = clock.steps
    result.optimizers_per_step = len(clock.known or clock.stepped)
    result.peak_memory_mb = target.peak_memory_mb()
    result.ops_per_step = clock.ops_per_step
    result.kernel_calls = clock.kernel_calls
    result.flops_per_step = clock.flops_per_step
    result.elementwise_per_step = clock.elementwise_per_step
    result.step_functions = clock.step_functions
    total_graphs = _compiled_graphs()
    if total_graphs:
        result.compiled_graphs_in_steps = total_graphs - (clock.graphs_at_root or 0)
    result.profile_ops = clock.profile_ops
    if clock.profile_ops is not None and req.profile_dir and Path(req.profile_dir).is_dir():
        result.profile_dir = req.profile_dir
        traces = sorted(Path(req.profile_dir).glob("*.pt.trace.json"), key=lambda f: f.stat().st_mtime)
        result.profile_trace_path = str(traces[-1]) if traces else None
    for p in plugins:
        try:
            out = p.finalize(status)
        except Exception as e:
            result.error = (result.error or "") + f"\nplugin {p.name} failed: {type(e).__name__}: {e}"
            out = None
        if out:
            # the parent reads this from another working directory: make it absolute against
            # the program's folder (the program itself may have changed directory since)
            result.plugin_outputs[p.name] = out if Path(out).is_absolute() else str(Path(req.cwd) / out)
    result.wall_s = time.perf_counter() - t0
    return result


def main() -> None:
    req = RunRequest.model_validate_json(Path(sys.argv[1]).read_text())
    result = run(req)
    tmp = Path(req.result_path + ".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, req.result_path)
    sys.stdout.flush()
    end_descendants(os.getpid())  # background processes the program started end with it
    # Skip interpreter teardown of the program's threads/pools: the result is written.
    os._exit(0)


if __name__ == "__main__":
    main()
