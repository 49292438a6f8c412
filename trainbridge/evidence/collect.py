"""Collect a workload's evidence: run it unmodified in the harness with the capture plugin.

The program runs ported to the CPU (`run_workload(workload, "cpu", ...)`); with
device="cuda" and no GPU here, the fake-CUDA route regenerates each captured graph's GPU
(Triton) kernels. With a GPU present, device="cuda" runs the program natively on it.
Source lines are reported against the workload's own files: the ported copy has the same
relative paths and line numbers.
"""

from __future__ import annotations

import time
from pathlib import Path

from .api import build_bundle
from .bundle import EvidenceBundle

PLUGIN = "trainbridge.evidence.capture:InductorCapturePlugin"
PLUGIN_NAME = "evidence"


class CollectError(RuntimeError):
    """The collection run failed or wrote no capture; the message says why."""


def collect_workload(workload, *, device: str = "cuda", out_dir: str | Path, target: str | None = None,
                     warmup_steps: int = 1, measured_steps: int = 2, timeout_s: float | None = None,
                     eager_steps: int = 1) -> EvidenceBundle:
    """Run `workload` for warmup + measured steps with `InductorCapturePlugin` and build its bundle.

    Step 1 runs eagerly (its ATen ops are counted), step 2 compiles and runs the collecting
    graphs (their launches are counted), later steps run eagerly again. `target` is where
    the program runs: "cpu" (the default without a GPU) or "cuda" (default when
    device="cuda" and a GPU is present).
    """
    import torch

    from ..harness.runner import run_workload

    if device not in ("cuda", "cpu"):
        raise ValueError(f"evidence device must be cuda or cpu, not {device!r}")
    if target is None:
        target = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    # the capture plugin writes from the child's working directory (the program's folder):
    # every path it is given must be absolute, or it lands somewhere the parent never looks
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw_path = out_dir / "evidence_raw.json"
    raw_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    result = run_workload(
        workload, target, out_dir=out_dir, label="collect", warmup_steps=warmup_steps,
        measured_steps=measured_steps, plugins=[PLUGIN],
        plugin_options={"device": device, "out": str(raw_path), "source_root": str(workload.root),
                        "eager_steps": str(eager_steps)},
        timeout_s=timeout_s, eager_random_streams=False,  # Inductor's own random kernels are the evidence
    )
    written = result.plugin_outputs.get(PLUGIN_NAME)
    if result.status != "ok" or not written:
        tail = (result.stderr_tail or "")[-1500:]
        raise CollectError(
            f"evidence collection for {workload.manifest.name} failed: run status {result.status}"
            + (f", error: {result.error.strip()[:1500]}" if result.error else "")
            + ("" if written else "; the capture plugin wrote nothing")
            + (f"\nstderr tail:\n{tail}" if tail else ""))
    # program_sha: of the original sources (the capture hashes source_root)
    bundle = build_bundle(written, source_root=workload.root, workload_name=workload.manifest.name)
    bundle.collect_seconds = round(time.perf_counter() - t0, 1)
    bundle.save(out_dir / "evidence.json")
    return bundle
