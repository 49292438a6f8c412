"""The two entry points that produce a bundle from a capture: in-process, or from a raw JSON."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable

from .build import bundle_from_raw
from .bundle import EvidenceBundle, Route
from .raw import RawCapture


def collect_inprocess(model, optimizers, step_fn: Callable[[], Any], *, device: str = "cuda",
                      source_root: str | os.PathLike | None = None, workload_name: str = "",
                      eager_steps: int = 2, code_dir: str | os.PathLike | None = None,
                      raw_out: str | os.PathLike | None = None) -> EvidenceBundle:
    """Capture `step_fn` (one training step) with Inductor in this process and build the bundle.

    `device`: "cuda" (Triton kernels: a real GPU when present, else fake-CUDA code
    generation) or "cpu" (Inductor's C++ backend). `source_root`: the program's folder;
    source lines are reported relative to it and only its files count as user code.
    """
    from .capture import capture_step

    raw = capture_step(model, optimizers, step_fn, device=device, source_root=source_root,
                       eager_steps=eager_steps, code_dir=code_dir)
    if raw_out is not None:
        raw.save(raw_out)
    return bundle_from_raw(raw, source_root=source_root or raw.source_root, workload_name=workload_name)


def build_bundle(raw_capture_json_path: str | os.PathLike | RawCapture, *,
                 source_root: str | os.PathLike | None = None, workload_name: str = "",
                 route: Route | None = None, program_sha: str | None = None,
                 scan_files: Iterable[str] | None = None) -> EvidenceBundle:
    """The bundle for what `InductorCapturePlugin` wrote (or a RawCapture object).

    `source_root` is where the source lines are read and the porting scan looks (pass the
    original GPU program's folder: its autocast / syncs / torch.compile are what the port
    changed); defaults to the folder recorded at capture time.
    """
    raw = raw_capture_json_path if isinstance(raw_capture_json_path, RawCapture) else \
        RawCapture.load(Path(raw_capture_json_path))
    return bundle_from_raw(raw, source_root=source_root, workload_name=workload_name, route=route,
                           program_sha=program_sha, scan_files=list(scan_files) if scan_files is not None else None)
