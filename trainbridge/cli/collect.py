"""`trainbridge collect`: GPU compilation evidence for a workload."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..agent.state import EvidenceDevice
from ..workload import load_workload
from .app import app, choices, console, err_console, user_errors

DeviceChoice = choices("DeviceChoice", EvidenceDevice)


@app.command()
@user_errors
def collect(
    workload: Path = typer.Argument(..., help="workload folder (with trainbridge.toml)"),
    device: DeviceChoice = typer.Option("cuda", "--device", help="whose compiler decisions: cuda (Triton kernels, "
                                                                "GPU or not) or cpu"),
    out: Path = typer.Option(Path("evidence.json"), "--out", "-o", help="evidence bundle to write"),
    import_debug: Optional[Path] = typer.Option(None, "--import", help="a TORCH_COMPILE_DEBUG folder or output_code.py from a GPU run"),
) -> None:
    """GPU compilation evidence: Inductor kernels -> supernodes -> optimization intents."""
    import time

    from ..evidence.bundle import render_summary

    wl = load_workload(workload)
    t0 = time.perf_counter()
    if import_debug is not None:
        from ..evidence.importer import import_debug_output

        bundle = import_debug_output(import_debug, source_root=wl.root)
    else:
        from ..evidence.collect import collect_workload

        with err_console.status(f"compiling {wl.manifest.name} with Inductor ({device.value} kernels) ..."):
            bundle = collect_workload(wl, device=device.value, out_dir=out.parent / f".collect-{wl.manifest.name}")
    bundle.save(out)
    render_summary(bundle, console)
    console.print(f"wrote {out} ({bundle.route}, {time.perf_counter() - t0:.0f} s)")
