"""End of a run: the final program, its diffs, one end-to-end measurement, report.md.

The end-to-end figure is measured here, in one interleaved session of the port, the final
program and (optionally) `torch.compile` of the port, rather than multiplied from the
per-candidate speedups: chained ratios compound their noise.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..ledger import models as ev
from ..measure.acceptance import judge
from ..measure.outliers import OUTLIER_RULE
from ..measure.timing import interleave, lockstep_session, program_arm
from .context import RunContext
from .coverage import unrealised_intents
from .planner import predicted_saving_ms
from .programs import read_program, unified_diff, write_program
from .state import RunState

COMPILE_PLUGIN = "trainbridge.harness.compile_plugin:CompilePortPlugin"


def end_to_end(ctx: RunContext, port: dict[str, str], final: dict[str, str], *, pairs: int,
               with_compile: bool, out: Path, bar: float) -> dict:
    """Interleaved port / final / compiled-port rounds; returns raw samples and comparisons.

    The final program is judged against the port at the run's bar (the A/A check's, if it
    raised the configured one), as every candidate was. The compiled port is a reference
    point, compared without a bar.
    """
    cfg, wl = ctx.cfg, ctx.workload
    programs = {"port": port, "final": final, **({"compiled_port": port} if with_compile else {})}
    extra = {"compiled_port": {"plugins": [COMPILE_PLUGIN], "warmup_steps": wl.manifest.steps.warmup + 2}}
    if cfg.timing_scheme == "lockstep":
        session = lockstep_session(wl, cfg.target, programs, pairs, out_dir=out, seed=cfg.seed, run_kwargs=extra,
                                   on_round=lambda i, r: ctx.report("report", detail=f"end-to-end round {i + 1}/{pairs}"))
    else:
        arms = {a: program_arm(wl, cfg.target, files, out_dir=out, label=a, seed=cfg.seed, **extra.get(a, {}))
                for a, files in programs.items()}
        session = interleave(arms, pairs, on_run=lambda arm, i, r: ctx.report(
            "report", detail=f"end-to-end {arm} run {i + 1}/{pairs}"))
    runs = {"port": [], "final": [], "compiled_port": [], **session.runs_ms}
    result = {"runs_ms": runs, "min_effect": bar, "problems": session.problems, "outlier_rule": OUTLIER_RULE}
    if with_compile:  # the compiled port is compile_model applied to the port: its prediction, for calibration
        result["compiled_port_raw_saving_ms"] = round(predicted_saving_ms("compile_model", ctx.profile()), 3)
    if runs["port"] and runs["final"]:
        result["final_vs_port"] = judge(runs["port"], runs["final"], bar=bar, confidence=cfg.confidence).model_dump()
    if runs["compiled_port"] and runs["final"]:
        result["final_vs_compiled_port"] = judge(runs["compiled_port"], runs["final"], bar=0.0,
                                                 confidence=cfg.confidence).model_dump()
        result["compiled_port_vs_port"] = judge(runs["port"], runs["compiled_port"], bar=0.0,
                                                confidence=cfg.confidence).model_dump()
    return result


def final_report(ctx: RunContext, state: RunState) -> dict:
    cfg, paths = ctx.cfg, ctx.paths
    port = read_program(paths.baseline_dir)
    final = read_program(Path(state["incumbent_dir"]))
    # the port may add files (the `_tb_*.py` replacements): the original has none of them
    original = {rel: path.read_text() for rel in port if (path := ctx.workload.root / rel).is_file()}
    write_program(paths.final_dir, final)
    (paths.final_dir / "vs_original.diff").write_text(unified_diff(original, final, "original", "final"))
    (paths.final_dir / "vs_port.diff").write_text(unified_diff(port, final, "port", "final"))
    if cfg.dry_run:
        e2e = {"runs_ms": {}, "note": "dry run: validated against torch_npu references on the CPU, not measured"}
    else:
        e2e = end_to_end(ctx, port, final, pairs=cfg.timing_pairs, with_compile=cfg.compare_compile,
                         out=paths.root / "end_to_end", bar=state.get("min_effect") or cfg.min_effect)
    (paths.root / "end_to_end.json").write_text(json.dumps(e2e, indent=1))
    fvp = e2e.get("final_vs_port") or {}
    fvc = e2e.get("final_vs_compiled_port")
    proposed = [e for e in ctx.ledger.events() if isinstance(e, ev.CandidateProposed)]
    unrealised = unrealised_intents(ctx.intents(), proposed, port, cfg.target, done_reason=state.get("done_reason", ""),
                                    dry_run=cfg.dry_run, protected=ctx.workload.manifest.protected)
    cvp = e2e.get("compiled_port_vs_port")
    ctx.ledger.append(ev.RunFinished(
        run_id=cfg.run_id, time_utc=ev.utc_now(), final_speedup=fvp.get("speedup"),
        final_ci=[fvp.get("ci_low"), fvp.get("ci_high")] if fvp else None,
        compiled_port_speedup=(cvp or {}).get("speedup"), final_vs_compiled=(fvc or {}).get("speedup"),
        accepted=state.get("accepted", []), rejected=state.get("rejected", []),
        done_reason=state.get("done_reason", ""), report_path=str(paths.report), end_to_end=e2e,
        unrealised_intents=unrealised,
    ))
    from ..ledger.report import write_report_md
    from ..ledger.report_html import write_report_html

    write_report_md(ctx.paths.root, ctx.ledger)
    write_report_html(ctx.paths.root, ctx.ledger)
    return {"phase": "done"}
