"""The records comparison as a person reads it: records_table.md, records_results.json, a plot.

One row per record: the record's own GPU time, the record authors' published NPU pair (when
there is one), our port and optimized step on this machine with the speedup and its
interval, what was accepted, and the status with its reason. Figures from other machines sit
beside ours and are never divided by them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from .npu_published import published_pairs
from .results import RecordResult

_STATUS_WORDS = {
    "measured": "measured",
    "port_ok": "runs (port only)",
    "not_ported": "not ported",
    "port_failed": "does not run",
    "failed": "failed",
    "skipped": "skipped",
    "running": "interrupted",
}


def write_results(results: list[RecordResult], out: Path) -> None:
    """Every output file, rewritten whole (called after each record, so a crash keeps the rest)."""
    tmp = out / "records_results.json.tmp"
    tmp.write_text(json.dumps([r.model_dump() for r in results], indent=1))
    tmp.replace(out / "records_results.json")
    (out / "records_table.md").write_text(table_md(results) + "\n")
    plot(results, out / "records_speedup.png")


def _npu_pair(num: int | None) -> str:
    pair = published_pairs().get(num) if num is not None else None
    if pair is None:
        return "-"
    return f"{pair.direct_port_min:.2f} -> {pair.optimized_min:.2f} min ({pair.speedup:.2f}x)"


def _status(r: RecordResult) -> str:
    words = _STATUS_WORDS.get(r.status, r.status)
    reason = r.reason.replace("|", "/").replace("\n", " ")
    return f"{words}: {reason[:160]}" if reason else words


def table_md(results: list[RecordResult]) -> str:
    rows = ["| record | name | GPU time (README) | authors' NPU: direct -> optimized | GPU intents | port step "
            "| optimized step | speedup (95% CI) | accepted rewrites | status |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        intents = "not collected" if r.gpu_intents is None else (
            f"**none**: {r.evidence_note[:60]}" if r.evidence_note else str(r.gpu_intents))
        port_step = r.port_step_ms if r.port_step_ms is not None else (
            r.port_check.median_step_ms if r.port_check is not None else None)
        cells = [f"{port_step:.0f} ms" if port_step is not None else "-",
                 f"{r.optimized_step_ms:.0f} ms" if r.optimized_step_ms is not None else "-",
                 f"{r.speedup:.2f}x ({r.ci_low:.2f}-{r.ci_high:.2f})" if r.speedup is not None else "-",
                 ", ".join(r.accepted) or ("none" if r.status == "measured" else "-")]
        rows.append(f"| {r.num if r.num is not None else '?'} | {r.name} | {r.readme_time or '-'} | "
                    f"{_npu_pair(r.num)} | {intents} | " + " | ".join(cells) + f" | {_status(r)} |")
    rows.append("")
    counts = {s: sum(r.status == s for r in results) for s in _STATUS_WORDS}
    tried = [r for r in results if r.status != "skipped"]
    run = [r for r in tried if r.status in ("measured", "port_ok")]
    if tried:
        rows.append(f"Records that run on this target: {len(run)} of {len(tried)} tried ("
                    + ", ".join(f"{n} {_STATUS_WORDS[s]}" for s, n in counts.items() if n) + ").")
    measured = [r.speedup for r in results if r.status == "measured" and r.speedup]
    if measured:
        rows.append(f"Geometric mean speedup over {len(measured)} measured records: "
                    f"{statistics.geometric_mean(measured):.2f}x (per-record intervals in the table).")
    pairs = [published_pairs()[r.num].speedup for r in results if r.num in published_pairs()
             and r.status == "measured"]
    if pairs:
        rows.append(f"The authors' published NPU speedups for the same {len(pairs)} records: geometric mean "
                    f"{statistics.geometric_mean(pairs):.2f}x (8x Ascend 910C, full scale; shown beside ours, "
                    "never divided by it).")
    machines = sorted({r.machine for r in results if r.machine and r.status in ("measured", "port_ok")})
    if machines:
        rows.append(f"Machine: {'; '.join(machines)}.")
    return "\n".join(rows)


def plot(results: list[RecordResult], path: Path) -> None:
    """Speedup of the optimized program over the port, per record, with its 95% interval."""
    rows = [r for r in results if r.status == "measured" and r.speedup is not None]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4, 0.5 * len(rows) + 2), 3.5))
    xs = range(len(rows))
    ys = [r.speedup for r in rows]
    err = [[r.speedup - r.ci_low for r in rows], [r.ci_high - r.speedup for r in rows]]
    ax.bar(xs, ys, yerr=err, capsize=3, color="#4878a8", label="ours (this machine, scaled)")
    npu = [(i, published_pairs()[r.num].speedup) for i, r in enumerate(rows) if r.num in published_pairs()]
    if npu:
        ax.scatter([i for i, _ in npu], [v for _, v in npu], marker="D", color="#c05030", zorder=3,
                   label="authors' NPU port -> optimized (8x910C)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(list(xs), [f"{r.num}\n{r.name[:10]}" for r in rows], fontsize=6)
    ax.set_ylabel("optimized / port speed (x)")
    ax.set_title("records: optimized program vs naive port (95% CI)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
