"""The Ascend report as a person reads it: verdict, step breakdown, findings by severity, suggestions."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .models import AdvisorReport, AscendProfileReport, Finding

SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2, "info": 3}
SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def ranked_findings(report: AscendProfileReport) -> list[Finding]:
    """Findings, most severe first (the analysers' order kept within a severity)."""
    return sorted(report.findings, key=lambda f: SEVERITY_ORDER.get(f.severity, len(SEVERITY_ORDER)))


def _catalog_api(name: str) -> str | None:
    try:
        from ...targets.npu_catalog import entry

        return entry(name).api
    except Exception:  # noqa: BLE001 - the catalog only adds a pointer; the report stands without it
        return None


def _us(x: float) -> str:
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.1f} us"


def render_ascend_report(report: AscendProfileReport, console: Console, *, title: str | None = None,
                         top: int = 10) -> None:
    head = Table(title=escape(title or f"Ascend profile: {report.path}"), show_header=False, title_justify="left")
    head.add_row("verdict", f"[bold]{escape(report.verdict)}[/bold]")
    bd = report.breakdown
    if bd is not None:
        head.add_row("mean step", f"{_us(bd.step_us)} over {bd.steps} step(s), from {bd.source}")
        head.add_row("computing", f"{_us(bd.computing_us)} ({bd.computing_share:.1%})")
        head.add_row("uncovered communication", f"{_us(bd.communication_us)} ({bd.communication_share:.1%})")
        head.add_row("free (device idle)", f"{_us(bd.free_us)} ({bd.free_share:.1%})")
    kt = report.kernel_time
    if kt is not None:
        head.add_row("kernel time", f"{_us(kt.total_us)} in {kt.kernels} kernels: cube {kt.cube_share:.1%}, "
                                    f"vector {kt.vector_share:.1%}, AI CPU {kt.aicpu_share:.1%}; "
                                    f"communication {_us(kt.communication_us)}")
    head.add_row("files found", escape(", ".join(report.files_present)) or "-")
    if report.files_missing:
        head.add_row("files missing", escape(", ".join(report.files_missing)))
    console.print(head)
    # _verdict's evidence opens with the breakdown and kernel-time lines the table above shows
    for line in report.evidence[(bd is not None) + (kt is not None):]:
        console.print(f"  - {escape(line)}")
    for w in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")

    if report.top_op_types:
        ops = Table(title="top operator types (op_statistic.csv)", title_justify="left")
        for col in ("op type", "core", "count", "total", "share"):
            ops.add_column(col, justify="left" if col in ("op type", "core") else "right")
        for s in report.top_op_types[:5]:
            ops.add_row(escape(s.op_type), escape(s.core_type), str(s.count), _us(s.total_us),
                        f"{s.ratio_pct:.1f}%" if s.ratio_pct is not None else "-")
        console.print(ops)

    findings = ranked_findings(report)
    console.print(f"[bold]findings[/bold] ({len(findings)})" + (":" if findings else ": none"))
    for f in findings[:top]:
        style = SEVERITY_STYLE.get(f.severity, "")
        console.print(f"  [{style}]{f.severity.upper():<6}[/{style}] {escape(f.rule)}: {escape(f.message)}")
        if f.source_lines and ", ".join(f.source_lines) not in f.message:
            console.print(f"         at {escape(', '.join(f.source_lines))}")
    if len(findings) > top:
        console.print(f"  ... and {len(findings) - top} more (--top N shows more; --json FILE keeps them all)")

    suggested: dict[str, list[str]] = {}
    for f in findings:
        if f.suggestion:
            suggested.setdefault(f.suggestion, []).append(f.rule)
    if suggested:
        console.print("[bold]suggestions[/bold] (trainbridge/targets/npu_catalog.json):")
        for name, rules in suggested.items():
            api = _catalog_api(name)
            where = f" ({escape(api)})" if api and api != name else ""
            console.print(f"  - {escape(name)}{where}: for {escape(', '.join(dict.fromkeys(rules)))}")


def render_rank_summary(rows: Sequence[tuple[str, AscendProfileReport | None]], console: Console) -> None:
    """One line per rank folder (None: not analysed), to spot the slow or idle rank at a glance."""
    done = sum(r is not None for _, r in rows)
    console.print(f"[bold]{len(rows)} rank folders[/bold]" + (f", {done} analysed" if done < len(rows) else "") + ":")
    for name, r in rows:
        if r is None:
            console.print(f"  {escape(name)}: [yellow]not analysed[/yellow]")
            continue
        bd = r.breakdown
        step = (f", step {_us(bd.step_us)}, free {bd.free_share:.1%}, uncovered comm {bd.communication_share:.1%}"
                if bd else "")
        console.print(f"  {escape(name)}: [bold]{escape(r.verdict)}[/bold]{step}, {len(r.findings)} finding(s)")


def render_advisor(rep: AdvisorReport | None, console: Console) -> None:
    """msprof-analyze's advisor on the same folder, its findings marked as its own."""
    if rep is None:
        console.print("[yellow]msprof-analyze is not installed[/yellow] (pip install msprof-analyze, or set "
                      "TRAINBRIDGE_MSPROF_ANALYZE to its executable): our analysis alone")
        return
    console.print(f"[bold]msprof-analyze advisor[/bold] ({len(rep.findings)} finding(s); its own output in "
                  f"{escape(rep.out_dir)})" + (":" if rep.findings else ""))
    if rep.note:
        console.print(f"[yellow]warning:[/yellow] {escape(rep.note)}")
    for f in rep.findings:
        tag = f" -> {escape(f.suggestion)} [{escape(f.pattern)}]" if f.suggestion and f.pattern else ""
        console.print(f"  {escape('[msprof-analyze]')} {escape(f.message)}{tag}")
        if f.source_lines and ", ".join(f.source_lines) not in f.message:
            console.print(f"         at {escape(', '.join(f.source_lines))}")
    for e in rep.errors[:5]:
        console.print(f"  [yellow]advisor log:[/yellow] {escape(e[:300])}")

