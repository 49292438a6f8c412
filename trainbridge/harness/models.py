"""What crosses the process boundary of a harness run: the request and the result.

The parent writes a `RunRequest` as JSON, the child (`trainbridge.harness.child`) runs the
program under it and writes a `RunResult`. Times are milliseconds, memory mebibytes; raw
per-step samples are kept and statistics are computed later, never here.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from ..targets.registry import TargetName

# Plugin options with these names (or ending in one of the suffixes) are paths. The child runs
# in the program's own folder, so a relative path there means something else than in the
# parent: every path option must be absolute.
PATH_OPTION_NAMES = ("out", "source_root")
PATH_OPTION_SUFFIXES = ("_path", "_dir", "_root", "_file")


def is_path_option(name: str) -> bool:
    return name in PATH_OPTION_NAMES or name.endswith(PATH_OPTION_SUFFIXES)
RunStatus = Literal["ok", "finished_early", "crashed", "timeout", "oom", "no_steps", "tampered"]


class RunRequest(BaseModel):
    """Everything the child needs; written by the parent, read once by the child."""

    script: str = Field(..., description="absolute path of the (ported) entry script")
    args: list[str] = Field(default_factory=list)
    cwd: str
    target: TargetName = "cpu"
    warmup_steps: int = 3
    measured_steps: int = 10
    seed: int = 1337
    result_path: str
    steps_path: str = Field(..., description="JSONL written one line per finished step, so a crash loses nothing")
    # Optional instruments, each on its own step after the measured ones so they never
    # perturb a timed step: profiler window, ATen op count, FLOP count.
    profile_steps: int = 0
    profile_trace_path: str | None = Field(None, description="unused by new requests: profile_dir holds the trace")
    profile_dir: str | None = Field(None, description="the profiler's output folder (tensorboard_trace_handler): "
                                    "`*.pt.trace.json` from torch.profiler, `*_ascend_pt/` from torch_npu's")
    count_ops_step: bool = False
    count_flops_step: bool = False
    npu_reference: bool = Field(False, description="dry run of an npu program on the CPU with the torch_npu references")
    plugins: list[str] = Field(default_factory=list, description="'module:Class' harness plugins (e.g. evidence capture)")
    plugin_options: dict[str, str] = Field(default_factory=dict)
    boundary_fd: int | None = Field(None, description="pipe the child signals step boundaries on; the parent "
                                    "stamps them (harness/boundaries.py)")
    step_gate_fd: int | None = Field(None, description="lockstep timing: before each step after the first, the "
                                     "child waits for one byte on this pipe (harness/lockstep.py)")
    sandbox: bool = Field(True, description="run the program under the audit hooks of harness/sandbox.py")
    eager_random_streams: bool = Field(True, description="Inductor's fallback_random: a compiled region draws the "
                                       "random numbers eager draws (dropout masks included), so a compiled "
                                       "candidate is judged on its math; evidence capture turns it off")
    private_roots: list[str] = Field(default_factory=list, description="folders the program may not open files "
                                     "in, except its own folder and the harness's outputs (the run folder)")
    read_only_roots: list[str] = Field(default_factory=list, description="folders the program may not write in "
                                       "(the user's workload, linked into the program folder), wherever they are")

    @model_validator(mode="after")
    def _paths_are_absolute(self) -> "RunRequest":
        # The parent and the child have different working directories: a relative path that
        # crosses this boundary is read or written in the wrong place (a capture once landed
        # under programs/<digest>/runs/... while the parent looked under runs/...).
        named = {"script": self.script, "cwd": self.cwd, "result_path": self.result_path,
                 "steps_path": self.steps_path, "profile_trace_path": self.profile_trace_path,
                 "profile_dir": self.profile_dir}
        named.update({f"plugin_options[{k!r}]": v for k, v in self.plugin_options.items() if is_path_option(k)})
        relative = [f"{k}={v!r}" for k, v in named.items() if v is not None and not PurePath(v).is_absolute()]
        if relative:
            raise ValueError("paths that cross to the child process must be absolute: " + ", ".join(relative))
        return self

    @property
    def total_steps(self) -> int:
        return (
            self.warmup_steps
            + self.measured_steps
            + self.profile_steps
            + int(self.count_ops_step)
            + int(self.count_flops_step)
        )


class StepRecord(BaseModel):
    index: int = Field(..., description="1-based optimizer step number")
    phase: Literal["warmup", "measured", "profile", "count_ops", "count_flops"]
    step_ms: float = Field(..., description="wall time from the previous step boundary, device synchronized: the "
                                            "parent's stamps of the child's boundary signals (harness/boundaries.py)")
    child_step_ms: float | None = Field(None, description="the same step by the child's own clock: a cross-check")
    loss: float | None = Field(None, description="the tensor backward() was called on, read after the run")
    backward_calls: int = 0
    work_items: int = Field(0, description="tokens (integer inputs' numel) or samples (batch dim) the root module saw")


class Environment(BaseModel):
    python: str
    torch_version: str
    target: TargetName
    device_name: str
    cpu_model: str
    cpu_signature: str | None = Field(None, description="model, family/model numbers, cores and bf16 units of the CPU "
                                                        "(targets/capabilities.py): which precision recipes apply")
    torch_threads: int
    interop_threads: int
    hostname: str
    program_sha256: str = Field(..., description="hash of the program's Python sources as run")
    env_knobs: dict[str, str] = Field(default_factory=dict)
    eager_random_streams: bool = Field(False, description="compiled regions drew eager's random numbers")


class OpCount(BaseModel):
    total: int
    by_op: dict[str, int]
    gemm_by_dtype: dict[str, int] = Field(
        default_factory=dict, description="GEMM and convolution ops (forward and backward) per step by the dtype "
                                          "of their first tensor input: where a precision change shows")


class KernelCall(BaseModel):
    """One matrix-engine call signature of a training step (`aten_ops.FLOOR_KERNELS`), replayable."""

    op: str = Field(description="dispatcher overload, e.g. 'aten.mm.default'")
    args: list = Field(description="positional arguments: a tensor as {'shape': [...], 'dtype': 'float32'}, "
                                   "anything else as its value")
    kwargs: dict = Field(default_factory=dict)
    calls: int = Field(description="calls with this signature in the op-count step")


class ElementwiseCount(BaseModel):
    """Elementwise work of one training step (harness.elementwise), optimizer update excluded."""

    total: int = Field(description="elements written by arithmetic ops plus elements read by reductions")
    by_op: dict[str, int] = Field(description="the same, by arithmetic op or reduction (after decomposition)")
    calls: int = Field(0, description="arithmetic ops and reductions counted (after decomposition; a formula "
                                      "counts one per pass)")
    opaque: dict[str, int] = Field(
        default_factory=dict,
        description="calls of ops the counter could neither decompose nor give a formula (their work is not in total)")


class LogLine(BaseModel):
    """A Modded-NanoGPT style `step:N/M ... train_time:...ms step_avg:...ms` line the program printed."""

    step: int
    total_steps: int
    val_loss: float | None = None
    train_loss: float | None = None
    train_time_ms: float
    step_avg_ms: float | None = None


class RunResult(BaseModel):
    status: RunStatus
    error: str | None = Field(None, description="why the run did not finish cleanly, in words")
    request: RunRequest
    environment: Environment | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    optimizers_per_step: int = 0
    peak_memory_mb: float | None = None
    ops_per_step: OpCount | None = None
    kernel_calls: list[KernelCall] | None = Field(
        None, description="the op-count step's matrix-engine calls by signature (the floor replays them)")
    flops_per_step: int | None = None
    elementwise_per_step: ElementwiseCount | None = Field(
        None, description="counted on the FLOP-count step: the arithmetic a FLOP count leaves out")
    compiled_graphs_in_steps: int | None = Field(
        None, description="torch.compile graphs first compiled after the first forward of the root module (so "
                          "inside the training steps); None when nothing was compiled at all")
    step_functions: dict[str, int] | None = Field(
        None, description="calls per step of the program's own functions ('file.py:qualname'), recorded on the "
                          "op-count step; None when no op-count step ran")
    profile_trace_path: str | None = Field(None, description="the Chrome trace torch.profiler wrote in profile_dir")
    profile_dir: str | None = Field(None, description="the profiler's output folder, kept with the run")
    profile_ops: list[dict] | None = Field(None, description="key_averages rows of the profiler window")
    program_log: list[LogLine] = Field(default_factory=list)
    wall_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    plugin_outputs: dict[str, str] = Field(default_factory=dict, description="plugin name -> file it wrote")

    @property
    def measured_ms(self) -> list[float]:
        return [s.step_ms for s in self.steps if s.phase == "measured"]

    @property
    def warmup_ms(self) -> list[float]:
        return [s.step_ms for s in self.steps if s.phase == "warmup"]

    @property
    def losses(self) -> list[float | None]:
        return [s.loss for s in self.steps]

    @property
    def ok(self) -> bool:
        return self.status == "ok"
