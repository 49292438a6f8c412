"""Does a record run on the target? Port it, then train a few steps for real.

`records run --port-only` answers this for every record in about a minute each, and the
full `records run` starts with it (its step times size the timing runs). A record passes
when its port has no blocker, the program reaches its optimizer steps, and its loss is
finite and falls over the first steps. Otherwise the reason names the construct: the port's
blocker, or the line of the program where the run crashed (`harness/crash.py`).
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, Field

from ..harness.crash import crash_site
from ..harness.runner import run_workload
from ..targets.port_source import port_program
from ..workload import load_workload

# Optimizer steps of the short run. Records 46-52 keep one kernel-warmup step per window size
# (4 steps, Adam idle, loss flat), then train with Adam on odd steps only: their loss first
# moves at the 7th optimizer step, so 6 steps refused ports that run.
CHECK_STEPS = 10


class PortCheck(BaseModel):
    """The port of one record and a short real run of it."""

    ported: bool
    changes_by_kind: dict[str, int] = Field(default_factory=dict, description="port edits, counted by kind")
    blockers: list[str] = Field(default_factory=list, description="constructs the port could not make run")
    run_status: str | None = Field(None, description="the harness's status of the short run (None: not run)")
    losses: list[float | None] = Field(default_factory=list, description="per-step training loss of the short run")
    step_ms: list[float] = Field(default_factory=list, description="per-step wall time of the short run")
    peak_memory_mb: float | None = None
    wall_s: float = Field(0.0, description="port + short run, seconds")
    loss_falling: bool | None = None
    reason: str = Field("", description="why the record does not run, naming the construct; empty when it does")

    @property
    def ok(self) -> bool:
        return self.ported and self.run_status == "ok" and bool(self.loss_falling)

    @property
    def median_step_ms(self) -> float | None:
        later = self.step_ms[1:] or self.step_ms  # the first step pays for warm-up allocations
        return statistics.median(later) if later else None


def loss_falls(losses: list[float | None]) -> tuple[bool, str]:
    """Finite losses whose last steps sit below the first: the program trains."""
    if not losses or any(x is None or not math.isfinite(x) for x in losses):
        return False, f"loss not finite: {losses}"
    tail = min(losses[-2:])
    if tail < losses[0]:
        return True, ""
    return False, f"loss did not fall over {len(losses)} steps ({losses[0]:.4f} -> {losses[-1]:.4f})"


_DTYPE_MISMATCH = re.compile(r"same dtype|expected scalar type|must have the same dtype|dtype mismatch", re.I)


def check_port(workload_dir: Path, target: str, out_dir: Path, *, steps: int = CHECK_STEPS,
               timeout_s: float = 300.0) -> PortCheck:
    """Port the scaled record in `workload_dir` and run `steps` optimizer steps of it.

    A port that crashes on a dtype mismatch while its cuda autocast was left inert is checked
    once more with the autocast kept (pointed at the cpu); when that runs, the workload's
    manifest says `[port] autocast = "keep"` so the loop ports it the same way (record 24
    casts its embeddings to bf16 and multiplies them with an fp32 weight under autocast).
    """
    t0 = time.perf_counter()
    wl = load_workload(workload_dir)
    files = {rel: (wl.root / rel).read_text() for rel in wl.source_files()}
    keep = wl.manifest.port.autocast == "keep"
    ported = port_program(files, target, keep_autocast=keep)
    check = PortCheck(ported=not ported.blockers, changes_by_kind=dict(Counter(c.kind for c in ported.changes)),
                      blockers=[str(b) for b in ported.blockers])
    if ported.blockers:
        check.reason = "not ported: " + "; ".join(check.blockers[:3]) + \
            (f" (+{len(check.blockers) - 3} more)" if len(check.blockers) > 3 else "")
        check.wall_s = time.perf_counter() - t0
        return check
    run = run_workload(wl, target, out_dir=out_dir, label="port-check", sources=ported.files, warmup_steps=0,
                       measured_steps=steps, timeout_s=timeout_s)
    check.run_status = run.status
    check.losses = [s.loss for s in run.steps]
    check.step_ms = [s.step_ms for s in run.steps]
    check.peak_memory_mb = run.peak_memory_mb
    if run.status != "ok":
        site = crash_site(run.error, ported.files)
        check.reason = f"the ported program {run.status}: {site}" if run.status == "crashed" else \
            f"the ported program {run.status}: {(run.error or '').strip().splitlines()[0][:300] if run.error else ''}"
        if run.status == "crashed" and _DTYPE_MISMATCH.search(run.error or "") and \
                any(c.kind == "precision_lost" for c in ported.changes):
            check.reason += (" - the program mixes bf16 and fp32 tensors and relies on its cuda autocast to "
                             "reconcile them; the cpu port leaves that autocast inert (precision_lost)")
            manifest = Path(workload_dir) / "trainbridge.toml"
            text = manifest.read_text()
            if "[port]" not in text:
                manifest.write_text(text.rstrip("\n") + '\n\n[port]\nautocast = "keep"  # set by the port check: '
                                    + check.reason[:160].replace("\n", " ") + "\n")
                again = check_port(workload_dir, target, out_dir, steps=steps, timeout_s=timeout_s)
                if again.ok:
                    again.wall_s += time.perf_counter() - t0
                    return again
                manifest.write_text(text)  # no better: the manifest as it was, the first reason
    else:
        check.loss_falling, why = loss_falls(check.losses)
        check.reason = why
    check.wall_s = time.perf_counter() - t0
    return check
