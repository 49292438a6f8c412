"""The profile as a person reads it: a rich table of the step and its top operators."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .analysis import ProfileReport


def render_profile(report: ProfileReport, console: Console) -> None:
    s = report.step
    head = Table(title=f"{report.workload} on {report.target}: baseline step", show_header=False)
    head.add_row("median step", f"{s.median_ms:.1f} ms  (p10 {s.p10_ms:.1f}, p90 {s.p90_ms:.1f}, n={s.n})")
    head.add_row("warm-up steps", ", ".join(f"{x:.0f}" for x in s.warmup_ms) + " ms (excluded)")
    if report.ops_per_step is not None:
        head.add_row("ATen ops per step", f"{report.ops_per_step} ({report.distinct_ops} distinct)")
    head.add_row("GEMM share", f"{report.gemm_share:.1%} of operator time")
    head.add_row("outside operators", f"{report.outside_ops_ms_per_step:.1f} ms ({report.outside_ops_share:.1%})")
    if report.device_busy_share is not None:
        head.add_row("device busy", f"{report.device_busy_share:.1%}")
    if report.achieved_gflops is not None:
        head.add_row("achieved", f"{report.achieved_gflops:.1f} GFLOP/s ({report.flops_per_step / 1e9:.2f} GFLOP/step)")
    if report.peak_memory_mb is not None:
        head.add_row("peak memory", f"{report.peak_memory_mb:.0f} MiB")
    head.add_row("verdict", f"[bold]{report.verdict}[/bold]")
    console.print(head)
    for line in report.evidence:
        console.print(f"  - {line}")
    ops = Table(title="top operators by self time (per step)")
    for col in ("operator", "kind", "calls", "self ms", "share"):
        ops.add_column(col, justify="left" if col in ("operator", "kind") else "right")
    for o in report.top_ops:
        ops.add_row(o.name, o.kind, f"{o.calls_per_step:.0f}", f"{o.self_ms_per_step:.2f}", f"{o.share:.1%}")
    console.print(ops)
    if report.trace_path:
        console.print(f"trace (open in ui.perfetto.dev or chrome://tracing): {report.trace_path}")
