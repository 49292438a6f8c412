"""report.html: the run as a person reviews it, in one file that opens from disk.

Written from the ledger and the run folder alone (the baseline's and each candidate's
validation runs for the loss curves, the evidence bundle for the GPU side). Everything is
inline: CSS in a <style>, charts as SVG that matplotlib writes, no script, no font or image
from anywhere else, so the file shows the same offline, attached to a review, years later.

What a reviewer looks for, in the order the page gives it: the verdict (what the end-to-end
measurement confirms, with its interval, and against torch.compile of the port); how the
accepted rewrites stacked up (a waterfall); then a card per candidate with its hypothesis,
the predicted saving beside the measured one and how far the prediction missed (the method's
quantitative hypothesis is only useful if its misses are seen), the mechanism evidence, the
GPU evidence it came from, the diff, the step-time distributions and the loss curves;
then the port's changes with their reasons and the machine.
"""

from __future__ import annotations

import html
import io
import json
import logging
from pathlib import Path

from . import models as ev
from ..measure.prediction import PredictionCheck
from ..measure.statistics import Comparison
from .store import Ledger
from .summary import evidence_event, evidence_line, verdict_line

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"
MAX_DIFF_LINES = 200

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;color:#222;
 line-height:1.4;padding:0 1rem}
h1{font-size:1.5rem} h2{font-size:1.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
.verdict{font-size:1.15rem;padding:.8rem 1rem;border-radius:6px;background:#f3f6fa;border-left:6px solid #4a78b5}
.verdict.good{border-color:#2e8b57} .verdict.none{border-color:#999} .verdict.bad{border-color:#c0392b}
.evidence-missing{color:#c0392b;font-weight:bold}
.card{border:1px solid #ddd;border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
.card h3{margin:.1rem 0 .5rem;font-size:1.05rem}
.badge{display:inline-block;padding:0 .5rem;border-radius:4px;color:#fff;font-size:.85rem;margin-left:.5rem}
.accepted{background:#2e8b57} .rejected{background:#c0392b} .pending{background:#b8860b}
.validated_not_measured{background:#4a78b5}
.miss{color:#c0392b} .hit{color:#2e8b57}
table{border-collapse:collapse;font-size:.9rem} td,th{border:1px solid #ddd;padding:.2rem .5rem;text-align:left}
pre{background:#f7f7f7;padding:.5rem;overflow-x:auto;font-size:.8rem;max-height:24rem}
.charts{display:flex;flex-wrap:wrap;gap:1rem} .chart svg{max-width:100%;height:auto}
.muted{color:#777}
"""


# ------------------------------------------------------------------ charts ----
def _svg(fig) -> str:
    """The figure as inline SVG (text kept as text, ids stable), closed after."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"
    matplotlib.rcParams["svg.hashsalt"] = "trainbridge"
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _chart(name: str, draw, *args) -> str:
    """One chart's block. A chart is a view of figures the ledger already holds, so a chart that
    cannot be drawn says why in its place (and in the log) instead of failing the run's report."""
    try:
        svg = draw(*args)
    except Exception as exc:  # noqa: BLE001 - any plotting failure, shown on the page
        log.warning("report.html: the %s chart could not be drawn: %s", name, exc)
        return f"<div class='chart missing' data-chart='{name}'>chart not drawn: {_e(str(exc))}</div>"
    return f"<div class='chart' data-chart='{name}'>{svg}</div>"


def waterfall_svg(accepted: list[tuple[str, float]], final: Comparison | None) -> str:
    """Each accepted candidate's step from the incumbent it beat, as the incumbent's speedup over
    the port after it; the end-to-end final-vs-port figure with its interval last."""
    fig, ax = _figure(7, 3.2)
    level, labels = 1.0, ["port"]
    ax.bar(0, 1.0, color="#999")
    for i, (cid, after) in enumerate(accepted, start=1):
        ax.bar(i, after - level, bottom=level, color="#2e8b57" if after >= level else "#c0392b")
        labels.append(cid)
        level = after
    if final is not None:
        x = len(labels)
        ax.bar(x, final.speedup, color="#4a78b5")
        # The interval is the wider of a bootstrap and a t-interval, and a percentile bootstrap
        # need not contain the point estimate (one pair of runs, skewed steps): draw the whole
        # interval as given, and the point where it lies, rather than a negative bar length.
        ax.vlines(x, final.ci_low, final.ci_high, color="#222")
        ax.hlines([final.ci_low, final.ci_high], x - 0.12, x + 0.12, color="#222")
        ax.plot([x], [final.speedup], "o", color="#222", ms=3)
        labels.append("final vs port\n(end to end)")
    ax.axhline(1.0, color="#555", lw=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speedup over the port")
    lo = min([1.0, *(a for _, a in accepted), *([final.ci_low] if final else [])])
    hi = max([1.0, *(a for _, a in accepted), *([final.ci_high] if final else [])])
    ax.set_ylim(lo - 0.05 * max(hi - lo, 0.2), hi + 0.05 * max(hi - lo, 0.2))
    return _svg(fig)


def step_times_svg(incumbent_runs_ms: list[list[float]], candidate_runs_ms: list[list[float]]) -> str:
    """Pooled step times of both arms, as box plots over the points themselves."""
    fig, ax = _figure(4.2, 2.8)
    inc = [x for r in incumbent_runs_ms for x in r]
    cand = [x for r in candidate_runs_ms for x in r]
    import matplotlib

    # `orientation` replaced `vert` in matplotlib 3.10 (`vert` warns from 3.11, goes in 3.13)
    horizontal = ({"orientation": "horizontal"} if tuple(map(int, matplotlib.__version__.split(".")[:2])) >= (3, 10)
                  else {"vert": False})
    ax.boxplot([inc, cand], widths=0.5, showfliers=False, **horizontal)
    for y, xs in ((1, inc), (2, cand)):
        ax.plot(xs, [y + 0.18] * len(xs), "|", color="#4a78b5", alpha=0.5, ms=6)
    ax.set_yticks([1, 2], [f"incumbent ({len(inc)} steps)", f"candidate ({len(cand)} steps)"], fontsize=8)
    ax.set_xlabel("step time (ms)")
    return _svg(fig)


def losses_svg(baseline: list[float | None], candidate: list[float | None]) -> str:
    """The candidate's validation losses over the baseline's, step by step from the same seed."""
    fig, ax = _figure(4.2, 2.8)
    for ys, label, style in ((baseline, "baseline", "-"), (candidate, "candidate", "--")):
        pts = [(i, y) for i, y in enumerate(ys, start=1) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return _svg(fig)


# ------------------------------------------------------------- the cards ----
def _e(text) -> str:
    return html.escape(str(text))


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _losses(path: Path) -> list[float | None] | None:
    data = _read_json(path)
    if not data:
        return None
    return [s.get("loss") for s in data.get("steps", [])]


def _intents(run_dir: Path) -> dict[str, dict]:
    bundle = _read_json(run_dir / "evidence.json") or {}
    return {i.get("id"): i for i in bundle.get("intents", []) if isinstance(i, dict)}


def _gpu_evidence(intent: dict | None) -> str:
    if not intent:
        return "<p class='muted'>no GPU intent behind this candidate (planned from the target profile)</p>"
    kernels = intent.get("evidence", {}).get("kernels", [])
    spans = [f"{s.get('file')}:{s.get('start_line')}-{s.get('end_line')}" for s in intent.get("spans", [])]
    ops = intent.get("eager_ops", [])
    return ("<table>"
            f"<tr><th>intent</th><td>{_e(intent.get('id'))}: {_e(intent.get('summary', ''))}</td></tr>"
            f"<tr><th>kernels</th><td>{_e(', '.join(kernels[:6]) or '-')}"
            f"{_e(f' (+{len(kernels) - 6} more)') if len(kernels) > 6 else ''}</td></tr>"
            f"<tr><th>fused eager ops</th><td>{_e(', '.join(ops[:12]) or '-')}; "
            f"{_e(intent.get('eager_ops_removed', 0))} eager ops a step removed on the GPU</td></tr>"
            f"<tr><th>source lines</th><td>{_e(', '.join(spans) or '-')}</td></tr></table>")


def _diff(text: str) -> str:
    lines = text.splitlines()
    more = f"\n... {len(lines) - MAX_DIFF_LINES} more lines in candidate.diff" if len(lines) > MAX_DIFF_LINES else ""
    return f"<details><summary>diff</summary><pre>{_e(chr(10).join(lines[:MAX_DIFF_LINES]) + more)}</pre></details>"


def _card(run_dir: Path, cid: str, p: ev.CandidateProposed | None, v: ev.CandidateValidated | None,
          m: ev.CandidateMeasured | None, d: ev.CandidateDecided, intents: dict[str, dict],
          baseline_losses: list[float | None] | None) -> str:
    parts = [f"<div class='card' id='{_e(cid)}' data-decision='{_e(d.decision)}'>",
             f"<h3>{_e(cid)}<span class='badge {_e(d.decision)}'>{_e(d.decision)}</span></h3>"]
    if p is not None:
        h = p.hypothesis
        parts.append(f"<p><b>{_e(p.pattern)}</b> ({_e(p.level)}, {_e(p.source)}): {_e(p.mechanism)}</p>")
        parts.append(f"<p>Hypothesis: removes {_e(', '.join(h.ops_removed) or 'no named operators')}; "
                     f"reject if {_e(h.reject_if)}</p>")
    if p is not None and m is not None:
        check = m.prediction or PredictionCheck.of(p.hypothesis.predicted_saving_ms, m.comparison)
        cls = "hit" if check.missed_by_pct == 0.0 else "miss"
        parts.append(f"<p class='{cls}'>{_e(check.sentence())}</p>")
    if p is not None and p.hypothesis.calibration:
        parts.append(f"<p>Prediction calibrated {_e(p.hypothesis.calibration)}</p>")
    if p is not None and m is None:
        parts.append(f"<p>predicted {p.hypothesis.predicted_saving_pct:.1f}% "
                     f"({p.hypothesis.predicted_saving_ms:.2f} ms a step); never timed</p>")
    if v is not None:
        where = "passed" if v.passed else f"failed at stage <b>{_e(v.stage)}</b>"
        parts.append(f"<p>Validation {where}: {_e(v.reason)}</p>")
        if v.details.get("mechanism"):
            parts.append(f"<p>Mechanism: {_e(v.details['mechanism'])}</p>")
    parts.append(f"<p>Decision: {_e(d.reason)}{_e(f' ({d.rule})') if d.rule else ''}</p>")
    charts = []
    if m is not None:
        charts.append(_chart("steps", step_times_svg, m.incumbent_runs_ms, m.candidate_runs_ms))
    cand_losses = _losses(run_dir / "candidates" / cid / "validate_ref.json")
    if baseline_losses and cand_losses:
        charts.append(_chart("losses", losses_svg, baseline_losses, cand_losses))
    if charts:
        parts.append(f"<div class='charts'>{''.join(charts)}</div>")
    parts.append("<details><summary>GPU evidence</summary>"
                 f"{_gpu_evidence(intents.get(p.intent_id) if p and p.intent_id else None)}</details>")
    if p is not None and p.diff:
        parts.append(_diff(p.diff))
    parts.append("</div>")
    return "".join(parts)


def _verdict_class(fin: ev.RunFinished | None) -> str:
    fvp = fin.end_to_end.final_vs_port if fin else None
    if fin is None or not fin.accepted or fvp is None:
        return "none"
    return "good" if fvp.ci_low > 1.0 else ("bad" if fvp.ci_high < 1.0 else "")


def _port_section(port: ev.PortApplied | None) -> str:
    if port is None or not port.changes:
        return "<p class='muted'>the port changed nothing</p>"
    rows = "".join(
        f"<tr><td>{_e(c.file)}:{c.line}</td><td>{_e(c.kind)}</td><td><code>{_e(c.before)}</code> &rarr; "
        f"<code>{_e(c.after)}</code></td><td>{_e(c.note or 'no reason recorded')}"
        f"{' <b>(semantic change)</b>' if c.semantic_change else ''}</td></tr>" for c in port.changes)
    return f"<table><tr><th>where</th><th>kind</th><th>change</th><th>why</th></tr>{rows}</table>"


def _machine(started: ev.RunStarted | None, base: ev.BaselineMeasured | None) -> str:
    rows = []
    env = base.environment if base is not None else None
    if env is not None:
        rows += [("CPU", env.cpu_signature or env.cpu_model), ("device", env.device_name),
                 ("torch", env.torch_version), ("python", env.python),
                 ("threads", f"{env.torch_threads} intra-op, {env.interop_threads} inter-op"), ("host", env.hostname)]
    if started is not None:
        rows += [("target", started.target), ("agent", started.agent), ("command", " ".join(started.argv))]
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"


def write_report_html(run_dir: Path, ledger: Ledger) -> Path:
    """Write `run_dir/report.html` from the ledger and the run folder; returns its path."""
    run_dir = Path(run_dir)
    events = list(ledger.events())
    started = next((e for e in events if isinstance(e, ev.RunStarted)), None)
    base = next((e for e in events if isinstance(e, ev.BaselineMeasured)), None)
    port = next((e for e in events if isinstance(e, ev.PortApplied)), None)
    fin = next((e for e in reversed(events) if isinstance(e, ev.RunFinished)), None)
    by = lambda kind: {e.candidate_id: e for e in events if isinstance(e, kind)}  # noqa: E731 (last one wins)
    proposed, validated = by(ev.CandidateProposed), by(ev.CandidateValidated)
    measured, decided = by(ev.CandidateMeasured), by(ev.CandidateDecided)
    evidence = evidence_event(events)
    intents = _intents(run_dir)
    baseline_losses = _losses(run_dir / "baseline_ref.json") or (base.losses if base else None)

    title = f"TrainBridge run {started.run_id if started else run_dir.name}"
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>",
           f"<style>{_CSS}</style></head><body>", f"<h1>{_e(title)}</h1>",
           f"<p class='verdict {_verdict_class(fin)}' id='verdict'>{_e(verdict_line(fin))}</p>",
           f"<p class='{'evidence-missing' if evidence is not None and evidence.missing else ''}'>"
           f"{_e(evidence_line(evidence))}</p>"]
    if started is not None:
        out.append(f"<p class='muted'>workload {_e(started.workload)}, target {_e(started.target)}, budget "
                   f"{started.budget_candidates} candidates / {started.budget_minutes:.0f} min</p>")
    if base is not None and base.floor is not None:
        out.append(f"<p id='floor'>Port: {_e(base.floor.line())}</p>")

    accepted = [(cid, d.incumbent_speedup_vs_baseline) for cid, d in decided.items()
                if d.decision == "accepted" and d.incumbent_speedup_vs_baseline is not None]
    final = fin.end_to_end.final_vs_port if fin is not None else None
    out.append("<h2>Accepted rewrites, stacked</h2>")
    if accepted or final is not None:
        out.append(_chart("waterfall", waterfall_svg, accepted, final))
        out.append("<p class='muted'>Each green step: an accepted candidate, as the incumbent's speedup over the "
                   "port after it (measured against the incumbent it replaced). Blue: the final program against "
                   "the port, measured end to end in one interleaved session, with its interval.</p>")
    else:
        out.append("<p class='muted'>nothing accepted and nothing measured end to end</p>")

    order = list(decided)
    out.append(f"<h2>Candidates ({len(order)})</h2>")
    for cid in order:
        out.append(_card(run_dir, cid, proposed.get(cid), validated.get(cid), measured.get(cid), decided[cid],
                         intents, baseline_losses))
    if fin is not None and fin.unrealised_intents:
        out.append(f"<h2>GPU intents no candidate took up ({len(fin.unrealised_intents)})</h2><ul>")
        out += [f"<li><code>{_e(u.intent_id)}</code> ({_e(u.pattern)}{_e(', ' + ', '.join(u.spans)) if u.spans else ''})"
                f": {_e(u.reason)}</li>" for u in fin.unrealised_intents]
        out.append("</ul>")
    out += ["<h2>The port</h2>", _port_section(port), "<h2>Machine</h2>", _machine(started, base),
            "<p class='muted'>Written from ledger.jsonl; `trainbridge ledger show` prints the same decisions.</p>",
            "</body></html>"]
    path = run_dir / REPORT_NAME
    path.write_text("\n".join(out))
    return path
