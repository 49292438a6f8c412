"""The parent side of a harness run: prepare a program folder, start the child, watch it.

The parent owns the time-out and the memory limit: it polls the child's process tree,
kills the whole process group when either is exceeded, and still returns a RunResult
built from the steps the child had flushed. A crash, hang or out-of-memory program gives
a result that says why, never an exception. The child starts without credentials in its
environment and under resource limits, and its process tree ends with the run however the
run ends (`child_env`). Step times are the parent's stamps of the child's boundary signals,
with the child's own clock kept as a cross-check (`boundaries`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from ..workload import Workload
from .boundaries import BoundaryReader, apply_parent_clock, prompt_stamps
from .child_env import MAX_FILE_MB, child_environment, end_process_tree, limit_child, read_tail
from .loglines import parse_log
from .models import RunRequest, RunResult, StepRecord, TargetName
from .torchrun_env import requires_torchrun, torchrun_env

_TAIL_CHARS = 4000
_POLL_S = 0.1


class PrepareError(RuntimeError):
    """The workload's data-preparation command failed."""


def ensure_prepared(workload: Workload) -> None:
    """Run the manifest's `prepare` command once, when what it creates is missing."""
    prep = workload.manifest.prepare
    if prep is None or all((workload.root / c).exists() for c in prep.creates):
        return
    cmd = [sys.executable if c == "python" else c for c in prep.command]
    proc = subprocess.run(cmd, cwd=workload.root, capture_output=True, text=True)
    missing = [c for c in prep.creates if not (workload.root / c).exists()]
    if proc.returncode != 0 or missing:
        raise PrepareError(
            f"{workload.root}: prepare command {' '.join(prep.command)} failed "
            f"(exit {proc.returncode}, missing {missing}):\n{proc.stderr[-2000:]}"
        )


def materialize(workload: Workload, sources: dict[str, str], dest: Path) -> Path:
    """Lay out a runnable copy of the program in `dest`: the given Python sources written,
    every other file of the workload linked, so data paths relative to the script hold.
    Folders are made, empty ones too: a program may write into a `logs/` it never creates.

    `dest` is emptied first: every run starts from the same folder, so nothing one run left
    there (a marker saying "I was validated already") can change what the next one does."""
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    elif dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for path in workload.program_paths():
        rel = path.relative_to(workload.root)
        if path.is_dir():
            (dest / rel).mkdir(parents=True, exist_ok=True)
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if rel.as_posix() in sources:
            continue
        if out.exists() or out.is_symlink():
            out.unlink()
        out.symlink_to(path.resolve())
    for rel, text in sources.items():
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.is_symlink():
            out.unlink()
        out.write_text(text)
    return dest


def run_folder_of(path: Path) -> Path | None:
    """The loop's run folder (the one holding `ledger.jsonl`) that `path` lies in, if any: its
    records are closed to the programs run under it (`sandbox`)."""
    for p in [path, *path.parents]:
        if (p / "ledger.jsonl").is_file():
            return p
    return None


def sources_digest(sources: dict[str, str]) -> str:
    h = hashlib.sha256()
    for k in sorted(sources):
        h.update(k.encode() + b"\0" + sources[k].encode() + b"\0")
    return h.hexdigest()[:12]


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, from /proc."""
    total_kb = 0
    todo = [pid]
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total_kb += int(line.split()[1])
                        break
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total_kb / 1024.0


def _read_steps(path: Path) -> list[StepRecord]:
    steps = []
    try:
        for line in path.read_text().splitlines():
            try:
                steps.append(StepRecord.model_validate_json(line))
            except ValueError:
                break  # a half-written last line from a killed child
    except OSError:
        pass
    return steps


class ChildRun:
    """One started harness child: its process, its boundary pipe and where its output goes.

    `start` launches it; the caller polls `check_limits` until the process ends (or kills it)
    and calls `finish` for the result. `run_request` does all three for one child; the
    lockstep runner (`lockstep`) does them for two at once.
    """

    def __init__(self, req: RunRequest, *, env: dict[str, str] | None, max_file_mb: float,
                 on_boundary: Callable[[bytes, int], None] | None = None, gate_fd: int | None = None):
        Path(req.result_path).parent.mkdir(parents=True, exist_ok=True)
        self.req_path = Path(req.result_path).with_suffix(".request.json")
        self.boundaries = BoundaryReader(on_message=on_boundary)
        self.req = req.model_copy(update={"boundary_fd": self.boundaries.write_fd, "step_gate_fd": gate_fd})
        self.req_path.write_text(self.req.model_dump_json(indent=1))
        for p in (self.req.result_path, self.req.steps_path):
            Path(p).unlink(missing_ok=True)
        self.stdout_path = Path(self.req.result_path).with_suffix(".stdout.log")
        self.stderr_path = Path(self.req.result_path).with_suffix(".stderr.log")
        self.env = child_environment(os.environ, {**(env or {}), "PYTHONHASHSEED": str(req.seed),
                                                  "PYTHONUNBUFFERED": "1"})
        # the child must import this very trainbridge, wherever the program's folder is
        pkg_root = str(Path(__file__).resolve().parents[2])
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, self.env.get("PYTHONPATH")]))
        self.max_file_mb = max_file_mb
        self.gate_fd = gate_fd
        self.killed_for: str | None = None
        self.peak_rss = 0.0
        self.proc: subprocess.Popen | None = None
        self.ended = False

    def start(self) -> None:
        self.t0 = time.monotonic()
        fds = (self.boundaries.write_fd,) + ((self.gate_fd,) if self.gate_fd is not None else ())
        parent = os.getpid()
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "trainbridge.harness.child", str(self.req_path)],
                cwd=self.req.cwd, env=self.env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=lambda: limit_child(self.max_file_mb, parent), pass_fds=fds,
            )
        self.boundaries.start()

    def check_limits(self, timeout_s: float, memory_limit_mb: float) -> bool:
        """Whether the child must be killed now (time-out or memory), remembering why."""
        rss = _tree_rss_mb(self.proc.pid)
        self.peak_rss = max(self.peak_rss, rss)
        if time.monotonic() - self.t0 > timeout_s:
            self.killed_for = "timeout"
        elif rss > memory_limit_mb:
            self.killed_for = "oom"
        return self.killed_for is not None

    def end(self) -> None:
        """End the child's whole process tree and reap it; once (its process id is not ours after)."""
        if self.ended:
            return
        end_process_tree(self.proc.pid)
        self.proc.wait()
        self.ended = True
        self.boundaries.join()

    def finish(self, timeout_s: float, memory_limit_mb: float) -> RunResult:
        req = self.req
        wall_s = time.monotonic() - self.t0
        stdout_tail, stderr_tail = read_tail(self.stdout_path, _TAIL_CHARS), read_tail(self.stderr_path, _TAIL_CHARS)
        result_file = Path(req.result_path)
        if self.killed_for is None and result_file.exists():
            result = RunResult.model_validate_json(result_file.read_text())
        else:
            steps = _read_steps(Path(req.steps_path))
            if self.killed_for == "timeout":
                status, error = "timeout", (
                    f"killed after {timeout_s:.0f} s (time-out) at step {len(steps)} of {req.total_steps}")
            elif self.killed_for == "oom":
                status, error = "oom", (
                    f"killed at {self.peak_rss:.0f} MiB resident, over the {memory_limit_mb:.0f} MiB limit, "
                    f"at step {len(steps)} of {req.total_steps}")
            else:
                code = self.proc.returncode
                how = f"signal {-code}" if code < 0 else f"exit code {code}"
                if code == -signal.SIGXFSZ:
                    how += f": a file it wrote (its output included) passed the {self.max_file_mb:.0f} MiB limit"
                status, error = "crashed", f"the child died ({how}) at step {len(steps)}: {stderr_tail[-800:]}"
            result = RunResult(status=status, error=error, request=req, steps=steps)  # type: ignore[arg-type]
        clock_problem = apply_parent_clock(result.steps, self.boundaries, complete=result.status == "ok")
        if clock_problem is not None:
            if result.status == "ok":
                result.status, result.error = "tampered", clock_problem
            else:
                result.error = f"{result.error or ''}\n{clock_problem}".strip()
        result.program_log = parse_log(read_tail(self.stdout_path))
        result.stdout_tail = stdout_tail
        result.stderr_tail = stderr_tail
        result.wall_s = wall_s
        result_file.write_text(result.model_dump_json())
        return result


def run_request(
    req: RunRequest,
    *,
    timeout_s: float,
    memory_limit_mb: float,
    env: dict[str, str] | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    max_file_mb: float = MAX_FILE_MB,
) -> RunResult:
    """Run one child to completion (or kill it) and return its result."""
    child = ChildRun(req, env=env, max_file_mb=max_file_mb)
    try:
        child.start()
        with prompt_stamps():
            _watch(child, timeout_s, memory_limit_mb, on_step)
    finally:  # a time-out, a limit, Ctrl-C or an error here: nothing the child started outlives the run
        if child.proc is not None:
            child.end()
    return child.finish(timeout_s, memory_limit_mb)


def _watch(child: ChildRun, timeout_s: float, memory_limit_mb: float,
           on_step: Callable[[StepRecord], None] | None) -> None:
    """Poll the child until it ends or breaks a limit, reporting its steps as they land."""
    reported = 0
    while child.proc.poll() is None:
        time.sleep(_POLL_S)
        if on_step is not None:
            steps = _read_steps(Path(child.req.steps_path))
            for s in steps[reported:]:
                on_step(s)
            reported = len(steps)
        if child.check_limits(timeout_s, memory_limit_mb):
            break


def port_sources(workload: Workload, target: TargetName) -> tuple[dict[str, str], list]:
    """The program's Python sources ported from its native device to `target`."""
    ported = port_workload(workload, target)
    return ported.files, ported.changes


def port_workload(workload: Workload, target: TargetName):
    """The whole port (`targets.port_source.PortResult`: files, changes, blockers)."""
    from ..targets.port_models import PortResult
    from ..targets.port_source import port_program

    files = {rel: (workload.root / rel).read_text() for rel in workload.source_files()}
    if target == workload.manifest.native_device:
        return PortResult(target=target, files=files)
    return port_program(files, target, keep_autocast=workload.manifest.port.autocast == "keep")


def prepare_run(
    workload: Workload,
    target: TargetName = "cpu",
    *,
    out_dir: str | Path,
    label: str = "run",
    sources: dict[str, str] | None = None,
    warmup_steps: int | None = None,
    measured_steps: int | None = None,
    profile_steps: int = 0,
    count_ops: bool = False,
    count_flops: bool = False,
    seed: int = 1337,
    plugins: list[str] | None = None,
    plugin_options: dict[str, str] | None = None,
    timeout_s: float | None = None,
    env: dict[str, str] | None = None,
    npu_reference: bool = False,
    max_file_mb: float = MAX_FILE_MB,
    eager_random_streams: bool = True,
) -> "PreparedRun":
    """Lay out a workload's program (ported to `target`, or the given `sources`) and the
    request, environment and limits its child runs under; `run_workload` runs it.

    `sources` maps relative paths to the program text to run (a candidate); by default the
    workload's own files ported to the target. Files go to `out_dir/<program digest>/`.
    `eager_random_streams` (Inductor's fallback_random, on unless evidence is captured) makes a
    compiled region's dropout draw eager's masks, in validation and timing alike: the loss
    checks then compare math, at the price of eager random kernels inside compiled regions.
    """
    ensure_prepared(workload)
    m = workload.manifest
    if sources is None:
        sources, _ = port_sources(workload, target)
    if npu_reference:
        if target != "npu":
            raise ValueError("npu_reference (dry run) applies to the npu target only")
        from ..npu_reference.fake_torch_npu import npu_to_cpu_for_dry_run

        sources = {rel: npu_to_cpu_for_dry_run(t) if rel.endswith(".py") else t for rel, t in sources.items()}
    out_dir = Path(out_dir).resolve()  # the child runs in the program folder: paths must be absolute
    prog_dir = materialize(workload, sources, out_dir / "programs" / sources_digest(sources))
    results = out_dir / "results"
    results.mkdir(parents=True, exist_ok=True)
    n = len(list(results.glob(f"{label}-*.json")))
    stem = results / f"{label}-{n:03d}"
    req = RunRequest(
        script=str(prog_dir / m.entry),
        args=list(m.args),
        cwd=str(prog_dir),
        target=target,
        warmup_steps=m.steps.warmup if warmup_steps is None else warmup_steps,
        measured_steps=m.steps.measured if measured_steps is None else measured_steps,
        seed=seed,
        result_path=f"{stem}.json",
        steps_path=f"{stem}.steps.jsonl",
        profile_steps=profile_steps,
        profile_dir=f"{stem}.profile" if profile_steps else None,
        count_ops_step=count_ops,
        count_flops_step=count_flops,
        plugins=plugins or [],
        plugin_options=plugin_options or {},
        npu_reference=npu_reference,
        eager_random_streams=eager_random_streams,
        sandbox=m.limits.sandbox,
        read_only_roots=[str(workload.root.resolve())],
        private_roots=[str(r) for r in [run_folder_of(out_dir)] if r is not None],
    )
    run_env = dict(m.env)
    run_env.update(env or {})
    if requires_torchrun(sources):  # the harness plays torchrun: rank 0 of a world of 1
        run_env.update(torchrun_env({**os.environ, **run_env}))
    return PreparedRun(request=req, env=run_env, timeout_s=timeout_s or m.limits.timeout_s,
                       memory_limit_mb=m.limits.memory_limit_mb, max_file_mb=max_file_mb)


class PreparedRun(BaseModel):
    """A program laid out and the request its child runs under, not yet started."""

    request: RunRequest
    env: dict[str, str]
    timeout_s: float
    memory_limit_mb: float
    max_file_mb: float


def run_workload(workload: Workload, target: TargetName = "cpu", *, out_dir: str | Path,
                 on_step: Callable[[StepRecord], None] | None = None, **kwargs) -> RunResult:
    """Run a workload's program in a child (`prepare_run` lists the options) and return its result."""
    p = prepare_run(workload, target, out_dir=out_dir, **kwargs)
    return run_request(p.request, timeout_s=p.timeout_s, memory_limit_mb=p.memory_limit_mb, env=p.env,
                       on_step=on_step, max_file_mb=p.max_file_mb)
