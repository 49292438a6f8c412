"""End of a run: the final program, its diffs, one end-to-end measurement, report.md.

The end-to-end figure is measured here, in one interleaved session of the port, the final
program and (optionally) `torch.compile` of the port, rather than multiplied from the
per-candidate speedups: chained ratios compound their noise.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..harness.runner import run_workload
from ..ledger import models as ev
from ..measure.statistics import compare
from .nodes import RunContext, unified_diff
from .state import RunState, read_program, write_program

COMPILE_PLUGIN = "trainbridge.harness.compile_plugin:CompilePortPlugin"


def end_to_end(ctx: RunContext, port: dict[str, str], final: dict[str, str], *, pairs: int,
               with_compile: bool, out: Path) -> dict:
    """Interleaved port / final / compiled-port runs; returns raw samples and comparisons."""
    cfg, wl = ctx.cfg, ctx.workload
    arms = {"port": [], "final": [], "compiled_port": []}
    for i in range(pairs):
        order = ["port", "final"] + (["compiled_port"] if with_compile else [])
        if i % 2:
            order.reverse()
        for arm in order:
            ctx.report("report", detail=f"end-to-end {arm} run {i + 1}/{pairs}")
            if arm == "compiled_port":
                r = run_workload(wl, cfg.target, out_dir=out, label=arm, sources=port, seed=cfg.seed,
                                 plugins=[COMPILE_PLUGIN], warmup_steps=wl.manifest.steps.warmup + 2)
            else:
                r = run_workload(wl, cfg.target, out_dir=out, label=arm, sources=port if arm == "port" else final,
                                 seed=cfg.seed)
            if r.status == "ok":
                arms[arm].append(r.measured_ms)
    result = {"runs_ms": arms}
    if arms["port"] and arms["final"]:
        result["final_vs_port"] = compare(arms["port"], arms["final"], min_effect=cfg.min_effect,
                                          confidence=cfg.confidence).model_dump()
    if arms["compiled_port"] and arms["final"]:
        result["final_vs_compiled_port"] = compare(arms["compiled_port"], arms["final"], min_effect=0.0,
                                                   confidence=cfg.confidence).model_dump()
        result["compiled_port_vs_port"] = compare(arms["port"], arms["compiled_port"], min_effect=0.0,
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
                         out=paths.root / "end_to_end")
    (paths.root / "end_to_end.json").write_text(json.dumps(e2e, indent=1))
    fvp = e2e.get("final_vs_port") or {}
    fvc = e2e.get("final_vs_compiled_port")
    cvp = e2e.get("compiled_port_vs_port")
    ctx.ledger.append(ev.RunFinished(
        run_id=cfg.run_id, time_utc=ev.utc_now(), final_speedup=fvp.get("speedup"),
        final_ci=[fvp.get("ci_low"), fvp.get("ci_high")] if fvp else None,
        compiled_port_speedup=(cvp or {}).get("speedup"), final_vs_compiled=(fvc or {}).get("speedup"),
        accepted=state.get("accepted", []), rejected=state.get("rejected", []),
        done_reason=state.get("done_reason", ""), report_path=str(paths.report), end_to_end=e2e,
    ))
    from ..ledger.report import write_report_md

    write_report_md(ctx.paths.root, ctx.ledger)
    return {"phase": "done"}
