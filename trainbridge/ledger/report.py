"""report.md: the run as a person reviews it, written from the ledger alone."""

from __future__ import annotations

from pathlib import Path

from . import models as ev
from ..measure.statistics import Comparison
from .store import Ledger
from .summary import evidence_event, evidence_line, verdict_line


def _ci(c: Comparison | None) -> str:
    if c is None:
        return "-"
    return f"{c.speedup:.3f}x ({c.confidence:.0%} CI {c.ci_low:.3f}-{c.ci_high:.3f})"


def write_report_md(run_dir: Path, ledger: Ledger) -> Path:
    events = list(ledger.events())
    started = next((e for e in events if isinstance(e, ev.RunStarted)), None)
    base = next((e for e in events if isinstance(e, ev.BaselineMeasured)), None)
    port = next((e for e in events if isinstance(e, ev.PortApplied)), None)
    fin = next((e for e in reversed(events) if isinstance(e, ev.RunFinished)), None)
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    measured = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateMeasured)}
    decided = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateDecided)}
    evidence = evidence_event(events)
    lines = [f"# TrainBridge run {started.run_id if started else run_dir.name}", "",
             f"**Verdict:** {verdict_line(fin)}", "",
             (f"**{evidence_line(evidence)}**" if evidence is not None and evidence.missing
              else evidence_line(evidence)), ""]
    if started:
        lines += [f"- workload: `{started.workload}`", f"- target: **{started.target}**, agent: {started.agent}",
                  f"- budget: {started.budget_candidates} candidates / {started.budget_minutes:.0f} min", ""]
    if port:
        lines += ["## Port", "", f"{len(port.changes)} changes (see ledger `PortApplied`):", ""]
        for c in port.changes[:40]:
            flag = " **(semantic change)**" if c.semantic_change else ""
            lines.append(f"- `{c.file}:{c.line}` {c.kind}: `{c.before}` -> `{c.after}`; "
                         f"{c.note or 'no reason recorded'}{flag}")
        lines.append("")
    if base:
        aa = base.aa
        median = base.median_ms if base.median_ms is not None else (base.summary.median_ms if base.summary else float("nan"))
        lines += ["## Baseline (the port)", "",
                  f"- median step {median:.1f} ms over {sum(len(r) for r in base.runs_ms)} steps in "
                  f"{len(base.runs_ms)} runs; verdict **{base.verdict}**",
                  f"- ATen ops per step: {base.ops_per_step}; FLOPs per step: {base.flops_per_step}",
                  (f"- floor: {base.floor.line()}" if base.floor else "- floor: not measured"),
                  (f"- A/A calibration: false-accept rate {aa.false_accept_rate:.3f} over {aa.n_splits} splits "
                   f"of the baseline runs; {aa.note}" if aa else "- A/A calibration: not run"),
                  *[f"- **note:** {n}" for n in base.notes], ""]
    lines += ["## Candidates", "",
              "| id | pattern | level | mechanism | predicted | measured | decision | reason |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for cid, d in decided.items():
        p = proposed.get(cid)
        m = measured.get(cid)
        pred = f"{p.hypothesis.predicted_saving_pct:.1f}%" if p else "-"
        if m is not None and m.prediction is not None and m.prediction.far:
            pred += f" (**far**: missed by {m.prediction.missed_by_pct:+.1f} pts)"
        lines.append(
            f"| {cid} | {p.pattern if p else '-'} | {p.level if p else '-'} | {(p.mechanism if p else '')[:60]} | "
            f"{pred} | {_ci(m.comparison if m else None)} | {d.decision}{f' ({d.rule})' if d.rule else ''} | "
            f"{d.reason[:120].replace('|', '/')} |")
    lines.append("")
    timed = sum(1 for cid in decided if cid in measured)
    if timed and base and base.aa:
        # Each timed candidate is one more chance to accept noise: the run-level risk grows with them.
        alpha = max(base.aa.false_accept_rate, base.aa.target_false_accept_rate)
        lines += [f"Run-level risk: {timed} candidates were timed, each judged by a rule allowed an A/A "
                  f"false-accept rate of {alpha:.0%}; the chance that at least one accepted candidate is noise "
                  f"is at most 1 - (1 - {alpha:.2f})^{timed} = {1 - (1 - alpha) ** timed:.0%} "
                  "(benchmarks/calibration.py measures the rule's rate over real A/A sessions).", ""]
    if fin:
        e2e = fin.end_to_end
        lines += ["## End to end (measured in one interleaved session)", "",
                  f"- final vs port: {_ci(e2e.final_vs_port)}"
                  + (f", judged at the run's bar of {e2e.min_effect:.1%}" if e2e.min_effect is not None else ""),
                  f"- torch.compile of the port vs port: {_ci(e2e.compiled_port_vs_port)}",
                  f"- final vs torch.compile of the port: {_ci(e2e.final_vs_compiled_port)}",
                  *([f"- final step against the port's floor: {_final_over_floor(e2e.final_vs_port, base.floor)}"
                     + ("; an accepted precision change moved the floor itself, so this is no bound"
                        if any(proposed[c].pattern == "precision" for c in fin.accepted if c in proposed) else "")]
                    if base and base.floor and e2e.final_vs_port else []),
                  f"- accepted: {', '.join(fin.accepted) or 'none'}; rejected: {len(fin.rejected)}",
                  f"- loop ended: {fin.done_reason}",
                  *[f"- dropped round: {p}" for p in e2e.problems], "",
                  "Final program: `final/` (diffs `final/vs_port.diff`, `final/vs_original.diff`).", ""]
        if fin.unrealised_intents:
            lines += ["## GPU intents no candidate took up", "",
                      *[f"- `{u.intent_id}` ({u.pattern}{', ' + ', '.join(u.spans) if u.spans else ''}): {u.reason}"
                        for u in fin.unrealised_intents], ""]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _final_over_floor(final_vs_port, floor) -> str:
    """The final program's step over the port's floor: the same work (work conservation), so the
    same floor at the port's precision; the port's step is scaled by the end-to-end speedup, both
    measured on this machine."""
    step = floor.step_ms / final_vs_port.speedup
    return (f"{step / floor.floor_ms:.2f}x (port {floor.step_over_floor:.2f}x; the port's {floor.step_ms:.1f} ms "
            f"over {final_vs_port.speedup:.3f}, against {floor.floor_ms:.1f} ms)")
