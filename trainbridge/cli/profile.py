"""`trainbridge profile`: a workload's baseline profile, or the analysis of a torch_npu profiler folder."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.text import Text

from ..workload import load_workload
from .app import TargetOpt, app, console, err_console, user_errors
from .progress import step_progress


@app.command()
@user_errors
def profile(
    path: Path = typer.Argument(..., metavar="DIR", help=(
        "a workload folder (with trainbridge.toml) to run and profile, or a profiler output to analyse: a torch_npu "
        "*_ascend_pt folder, its ASCEND_PROFILER_OUTPUT, a parent of one or more (one per rank), or a PyTorch "
        "*.pt.trace.json (or its folder)")),
    target: str = TargetOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="output folder (default runs/profile-<name>-<target>)"),
    measured: Optional[int] = typer.Option(None, help="measured steps (default: the manifest's)"),
    profile_steps: int = typer.Option(3, help="steps under torch.profiler, after the measured ones"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="profiler folder: write the AscendProfileReport as "
                                                               "JSON here (a JSON list of them for several ranks)"),
    top: int = typer.Option(10, "--top", help="profiler folder: findings to print (--json keeps them all)"),
    advisor: Optional[Path] = typer.Option(None, "--advisor", metavar="OUT", help=(
        "profiler folder: also run msprof-analyze's advisor on it (where installed), its output kept in OUT, "
        "its findings printed and kept in --json next to ours")),
) -> None:
    """Baseline profile of a workload, or the analysis of an Ascend profile you already have.

    `profile W --target cpu` runs workload W: step times, top operators, verdict; writes profile.json.

    `profile DIR` reads a torch_npu profiler folder (no run): verdict, step breakdown, findings, suggestions;
    or a PyTorch profiler trace (*.pt.trace.json): the report a live profile prints.
    """
    if not _is_workload(path):
        if out is not None or measured is not None:
            raise ValueError(f"{path}: not a workload (no trainbridge.toml); --out and --measured are for profiling "
                             "a workload (use --json FILE to keep the analysis of a profiler folder)")
        _analyse_profile_folder(path, json_out, top, advisor)
        return
    if json_out is not None or advisor is not None:
        raise ValueError("--json and --advisor are for analysing a profiler folder; profiling a workload writes "
                         "profile.json under --out")
    from ..harness.runner import run_workload
    from ..profile import analyse, render_profile

    wl = load_workload(path)
    m = wl.manifest
    out = out or Path("runs") / f"profile-{m.name}-{target}"
    total = m.steps.warmup + (measured or m.steps.measured) + profile_steps + 2
    progress, on_step = step_progress(total, f"profiling {m.name} on {target}")
    with progress:
        result = run_workload(
            wl, target, out_dir=out, label="profile", measured_steps=measured,
            profile_steps=profile_steps, count_ops=True, count_flops=True, on_step=on_step,
        )
    if not result.ok:
        err_console.print(f"[red]run {result.status}:[/red] {result.error}")
        raise typer.Exit(1)
    report = analyse(result, m.name)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile.json").write_text(report.model_dump_json(indent=1))
    render_profile(report, console)
    console.print(f"wrote {out / 'profile.json'}")


def _is_workload(path: Path) -> bool:
    from ..workload import MANIFEST_NAME

    return (path / MANIFEST_NAME).is_file() or (path.name == MANIFEST_NAME and path.is_file())


def _analyse_torch_trace(path: Path, json_out: Optional[Path], top: int) -> None:
    """`trainbridge profile DIR` on a PyTorch profiler trace: the report a live profile prints."""
    from ..profile import render_profile
    from ..profile.analysis import analyse_trace
    from ..profile.torch_trace import load_torch_trace

    window = load_torch_trace(path)
    report = analyse_trace(window, Path(window.path).name, top=top)
    render_profile(report, console)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(report.model_dump_json(indent=1))
        console.print(f"wrote {json_out}")


def _analyse_profile_folder(path: Path, json_out: Optional[Path], top: int,
                            advisor_out: Optional[Path] = None) -> None:
    """`trainbridge profile DIR` on a torch_npu profiler folder: one report per rank folder found."""
    from pydantic import TypeAdapter

    from ..profile.ascend import (
        AscendProfileError,
        AscendProfileReport,
        PyTorchTraceOnly,
        analyse_ranks,
    )
    from ..profile.ascend.advisor import run_advisor
    from ..profile.ascend.render import render_advisor, render_ascend_report, render_rank_summary

    if json_out is not None and json_out.is_dir():
        raise ValueError(f"--json {json_out}: is a folder; give a file name, e.g. {json_out / 'ascend_profile.json'}")
    try:
        ranks = analyse_ranks(path, top=top)
    except PyTorchTraceOnly:
        _analyse_torch_trace(path, json_out, top)
        return
    except AscendProfileError as e:
        if path.is_dir():
            raise AscendProfileError(f"{e} (nor is it a workload: no trainbridge.toml)") from None
        raise
    if len(ranks) == 1 and isinstance(ranks[0][1], AscendProfileError):
        raise ranks[0][1]
    rows: list[tuple[str, AscendProfileReport | None]] = []
    for i, (folder, result) in enumerate(ranks, 1):
        name = folder.parent.name if folder.name == "ASCEND_PROFILER_OUTPUT" else folder.name
        title = f"rank {i}/{len(ranks)}: {name}" if len(ranks) > 1 else None
        if isinstance(result, AscendProfileError):
            err_console.print(Text(f"warning: {name}: not analysed: {result}", style="yellow"), soft_wrap=True)
            rows.append((name, None))
            continue
        if i > 1:
            console.print()
        render_ascend_report(result, console, title=title, top=top)
        rows.append((name, result))
    reports = [r for _, r in rows if r is not None]
    if not reports:
        raise AscendProfileError(f"{path}: no profiler folder could be analysed "
                                 f"({len(ranks)} found, none readable; see the warnings above)")
    if len(ranks) > 1:
        console.print()
        render_rank_summary(rows, console)
    if advisor_out is not None:
        # one rank: its *_ascend_pt folder, as the advisor expects; several: the parent (its cluster analysis)
        folder = ranks[0][0]
        folder = folder.parent if folder.name == "ASCEND_PROFILER_OUTPUT" else folder
        with console.status("msprof-analyze advisor ..."):
            rep = run_advisor(folder if len(ranks) == 1 else path, advisor_out)
        console.print()
        render_advisor(rep, console)
        for r in reports:
            r.advisor = rep
    if json_out is not None:
        data = (reports[0].model_dump_json(indent=1) if len(ranks) == 1 else
                TypeAdapter(list[AscendProfileReport]).dump_json(reports, indent=1).decode())
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(data)
        except OSError as e:
            raise ValueError(f"--json {json_out}: cannot write ({e.strerror or e})") from None
        console.print(f"wrote {json_out}")
