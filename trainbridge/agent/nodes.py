"""The nodes of the optimization graph: each does one phase and returns a partial state.

Every node writes what it did to the ledger before returning, so the ledger is complete up
to the last finished node even if the process dies; the checkpointer then resumes at the
first unfinished node. Nodes orchestrate; what counts as better lives in
`measure.acceptance`, how programs are timed in `measure.timing`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from langgraph.runtime import Runtime

from ..harness.crash import crash_site
from ..harness.models import RunResult
from ..harness.runner import port_workload, run_workload
from ..ledger import models as ev
from ..measure import acceptance
from ..measure.acceptance import Rule
from ..measure.prediction import Observation, PredictionCheck
from ..measure.outliers import OUTLIER_RULE
from ..measure.timed_runs import timed_run_problem
from ..measure.timing import candidate_session, lockstep_session, timing_kwargs
from ..profile.analysis import ProfileReport, analyse
from ..profile.ascend.intents import profile_intents
from ..profile.floor import floor_request, measure_floor, summarise
from ..workload import work_note
from .candidate import Candidate, Stage
from .context import PortBlocked, RunContext
from .evaluate import later_window_shape, reference_run, train_baseline_state
from .evaluate import validate as validate_candidate
from .planner import PlanItem, candidate_hypothesis, combined_item, make_item, rank, site_pattern
from .programs import read_program, unified_diff, write_program
from .rewriters.base import Declined, Proposal
from .rewriters.llm import lowers_precision
from .rewriters.recipe_base import off_limits
from .rewriters.recipe_rewriter import RecipeRewriter
from . import time_budget
from .state import RunState

Rt = Runtime[RunContext]
log = logging.getLogger(__name__)


# ------------------------------------------------------------------- port ----
def port(state: RunState, runtime: Rt) -> dict:
    """Naive port of the GPU program to the target: the baseline everything is measured against."""
    ctx = runtime.context
    cfg = ctx.cfg
    ctx.report("port")
    done = ctx.logged_once(ev.PortApplied)
    if done is not None:
        if done.blockers:
            raise PortBlocked(f"the port to {cfg.target} cannot make this program run: " + "; ".join(done.blockers))
        return {"phase": "baseline", "incumbent_dir": str(ctx.paths.baseline_dir), "incumbent_id": "port"}
    ported = port_workload(ctx.workload, cfg.target)
    files = ported.files
    write_program(ctx.paths.baseline_dir, files)
    original = {rel: (ctx.workload.root / rel).read_text() for rel in ctx.workload.source_files()}
    blockers = [str(b) for b in ported.blockers]
    ctx.log(ev.PortApplied(**ctx.base(), target=cfg.target, changes=[c.model_dump() for c in ported.changes],
                           diff=unified_diff(original, files, "original", "port"), blockers=blockers))
    if blockers:
        raise PortBlocked(f"the port to {cfg.target} cannot make this program run: " + "; ".join(blockers))
    return {"phase": "baseline", "incumbent_dir": str(ctx.paths.baseline_dir), "incumbent_id": "port"}


# --------------------------------------------------------------- baseline ----
def baseline(state: RunState, runtime: Rt) -> dict:
    """Reference losses, A/A-calibrated timing of the port, and its profile."""
    ctx = runtime.context
    cfg = ctx.cfg
    done = ctx.logged_once(ev.BaselineMeasured)
    if done is not None:
        return {"phase": "collect", "baseline_median_ms": done.median_ms,
                "min_effect": done.min_effect if done.min_effect is not None else cfg.min_effect}
    files = read_program(ctx.paths.baseline_dir)
    out = ctx.paths.harness_dir
    ctx.report("baseline", detail="reference run")
    dry = cfg.dry_run
    ref = reference_run(ctx.workload, cfg.target, files, out, seed=cfg.seed, label="baseline-ref", npu_reference=dry)
    if ref.status != "ok":
        site = crash_site(ref.error, files) if ref.status == "crashed" else (ref.error or "").strip()[:500]
        raise RuntimeError(f"the ported program does not run ({ref.status}): {site}")
    (ctx.paths.root / "baseline_ref.json").write_text(ref.model_dump_json())
    c = ctx.workload.manifest.correctness
    if c.trained_steps:
        ctx.report("baseline", detail=f"training {c.trained_steps} steps for the later-window check")
        warmup, steps = later_window_shape(ctx.workload)
        window = train_baseline_state(ctx.workload, cfg.target, files, out, seed=cfg.seed,
                                      trained_steps=c.trained_steps, warmup_steps=warmup, steps=steps,
                                      npu_reference=dry)
        (ctx.paths.root / "trained_window.json").write_text(window.model_dump_json())
    runs, prof_run = [], None
    profile = {"profile_steps": 3, "count_ops": True, "count_flops": True}
    n_runs = 0 if dry else cfg.baseline_runs
    for i in range(n_runs):
        last = i == n_runs - 1
        ctx.report("baseline", detail=f"timing run {i + 1}/{n_runs}" + (" (then the profile)" if last else ""))
        # The last timing run carries the profile: the harness starts its instruments (profiler,
        # op and FLOP counts) only after the timed steps, so those are timed as in every other
        # run, and one process start (a torch import, the program's set-up) is saved.
        r = run_workload(ctx.workload, cfg.target, out_dir=out, label="baseline", sources=files, seed=cfg.seed,
                         **timing_kwargs(ctx.workload), **(profile if last else {}))
        if r.status != "ok":
            raise RuntimeError(f"baseline timing run {r.status}: {r.error}")
        runs.append(r.measured_ms)
        prof_run = r if last else None
    aa, bar = None, cfg.min_effect
    if not dry:
        aa, bar = acceptance.calibrated_bar(runs, min_effect=cfg.min_effect, confidence=cfg.confidence,
                                            max_false_accept_rate=cfg.max_false_accept_rate)
    if prof_run is None:  # a dry run times nothing: the profile gets its own run
        ctx.report("baseline", detail="profile")
        prof_run = run_workload(ctx.workload, cfg.target, out_dir=out, label="profile", sources=files,
                                seed=cfg.seed, **profile, npu_reference=dry)
    if prof_run.status != "ok":
        raise RuntimeError(f"profile run {prof_run.status}: {prof_run.error}")
    prof = analyse(prof_run, ctx.workload.manifest.name)
    pooled = sorted(x for r in (runs or [prof.step.raw_ms]) for x in r)
    median = pooled[len(pooled) // 2]
    notes = [n for n in [work_note(ctx.workload.manifest.work, [s.work_items for s in ref.steps])] if n]
    if not dry:
        floor, why = _floor(ctx, prof_run, prof, median)
        prof = prof.model_copy(update={"floor": floor})
        notes += [why] if why else []
    ctx.paths.profile.write_text(prof.model_dump_json(indent=1))
    ctx.log(ev.BaselineMeasured(
        **ctx.base(), runs_ms=runs, losses=ref.losses, flops_per_step=ref.flops_per_step,
        work_items_per_step=[s.work_items for s in ref.steps], ops_per_step=prof.ops_per_step,
        median_ms=median, verdict=prof.verdict, profile_path=str(ctx.paths.profile),
        aa=aa, min_effect=bar, environment=(ref.environment.model_dump() if ref.environment else {}),
        floor=prof.floor, notes=notes,
    ))
    return {"phase": "collect", "baseline_median_ms": median, "min_effect": bar}


def _floor(ctx: RunContext, prof_run: RunResult, prof: ProfileReport, median_ms: float):
    """(FloorSummary or None, a note when there is none): the port's step against its floor."""
    req = floor_request(prof_run, ctx.cfg.target)
    if req is None:
        return None, "no floor: the profile run recorded no op-count or elementwise step"
    ctx.report("baseline", detail=f"the step's floor: {len(req.kernel_calls)} matrix call shapes timed alone")
    try:
        floor = measure_floor(req, ctx.paths.root / "floor", env={**os.environ, **ctx.workload.manifest.env})
    except Exception as e:  # noqa: BLE001 - the floor explains the step; without it the run goes on
        log.warning("no floor: %s", e)
        return None, f"no floor: {e}"
    return summarise(floor, step_ms=median_ms, op_ms_by_kind=prof.op_ms_by_kind(),
                     outside_ms=prof.outside_ops_ms_per_step, path=str(ctx.paths.root / "floor" / "floor.json")), ""


# ---------------------------------------------------------------- collect ----
def collect(state: RunState, runtime: Rt) -> dict:
    """GPU evidence: load the given bundle, or compile the program with Inductor now.

    Without evidence the loop still plans from the target profile, but a run that was
    asked for evidence records that it has none (`EvidenceLoaded.missing`): the summary,
    report.md and the exit code say so (unless --allow-no-evidence or --skip-collect)."""
    ctx = runtime.context
    cfg = ctx.cfg
    ctx.report("collect")
    if ctx.logged_once(ev.EvidenceLoaded) is not None:
        return {"phase": "plan"}
    note, error, n_intents = "", None, 0
    source = "file" if cfg.evidence else ("collected" if cfg.collect else "skipped")
    try:
        if source == "file":
            from ..evidence.bundle import EvidenceBundle

            bundle = EvidenceBundle.load(cfg.evidence)
            note = f"loaded {cfg.evidence}"
        elif source == "skipped":
            bundle = None
            note = "collection switched off (--skip-collect); planning from the target profile only"
        else:
            from ..evidence.collect import collect_workload

            bundle = collect_workload(ctx.workload, device=cfg.evidence_device, out_dir=ctx.paths.root / "evidence")
            note = f"collected with route {bundle.route}"
        if bundle is not None:
            bundle.save(ctx.paths.evidence)
            n_intents = len(bundle.intents)
    except Exception as e:  # evidence is guidance: without it, plan from the profile alone
        error = f"{type(e).__name__}: {str(e)[:2000]}"
        note = f"no GPU evidence ({error}); planning from the target profile only"
    event = ev.EvidenceLoaded(**ctx.base(), path=str(ctx.paths.evidence) if n_intents else None,
                              intents=n_intents, note=note, source=source, error=error,
                              required=source != "skipped" and not cfg.allow_no_evidence)
    ctx.log(event)
    if event.missing:
        ctx.report("collect", warning=f"NO GPU EVIDENCE: {event.missing}")
    else:
        ctx.report("collect", detail=f"{n_intents} intents ({source})")
    return {"phase": "plan"}


# ------------------------------------------------------------------- plan ----
def _bar(state: RunState, ctx: RunContext) -> float:
    """The bar decisions use: the A/A check's (possibly raised) one, else the configured one."""
    return state.get("min_effect") or ctx.cfg.min_effect


def plan(state: RunState, runtime: Rt) -> dict:
    """Pick the highest-scoring untried (recipe, intent) that applies to the incumbent."""
    from .rewriters.recipes import RECIPES

    ctx = runtime.context
    cfg = ctx.cfg
    n = state.get("n_candidates", 0)
    if n >= cfg.budget_candidates:
        return {"current": None, "done_reason": f"candidate budget ({cfg.budget_candidates}) used"}
    if ctx.active_minutes() >= cfg.budget_minutes:
        return {"current": None, "done_reason": f"time budget ({cfg.budget_minutes:.0f} min) used"}
    left = time_budget.estimate(ctx.ledger.events(), budget_min=cfg.budget_minutes, elapsed_min=ctx.active_minutes(),
                                pairs=cfg.timing_pairs, baseline_runs=cfg.baseline_runs,
                                with_compile=cfg.compare_compile, end_to_end=not cfg.dry_run)
    if not left.fits_another:
        return {"current": None, "done_reason": left.reason()}
    ctx.report("plan", candidates=n)
    files = read_program(Path(state["incumbent_dir"]))
    prof = ctx.profile()
    # on npu the port's own profile adds its findings (ours and msprof-analyze's) as intents
    intents = ctx.intents() + (profile_intents(prof.ascend) if cfg.target == "npu" else [])
    tried = set(state.get("tried", []))
    items: list[PlanItem] = []
    m = ctx.workload.manifest
    fence = off_limits(files, m.protected, m.editable)
    observed = [Observation.model_validate(d) for d in state.get("realised", [])]
    for recipe in RECIPES.values():
        if cfg.target not in recipe.targets or (cfg.dry_run and not recipe.dry_run_checkable):
            continue
        sites = recipe.find(files, cfg.target, protected=fence)
        if not sites:
            continue
        if recipe.name == "compile_region":
            sites = _run_in_step(sites, prof)
        for site in ({s.qualname for s in sites} if recipe.per_site else {None}):
            pattern = site_pattern(recipe.pattern, site)
            matching = [i for i in intents if i.get("pattern") == pattern]
            intent = max(matching, key=lambda i: i.get("confidence", 0)) if matching else None
            item = make_item(recipe, prof, intent=intent, min_effect=_bar(state, ctx), site=site, target=cfg.target,
                             observed=observed)
            if item.key not in tried:
                items.append(item)
    ranked = rank(items)
    # near misses measured alone are better evidence than any prediction: their combination first
    combo = combined_item([PlanItem.model_validate(d) for d in state.get("near_misses", [])],
                          min_effect=_bar(state, ctx))
    if combo is not None and combo.key not in tried:
        ranked.insert(0, combo)
    if not ranked:
        return {"current": None, "done_reason": "no untried recipe applies to the incumbent"}
    item = ranked[0]
    cid = f"c{n + 1:02d}-{item.recipe}" + (f"-{item.site.split('.')[-1 if not item.site.endswith('forward') else 0]}"
                                            if item.site else "")
    return {"current": Candidate.planned(cid, item).to_state(), "tried": [item.key], "n_candidates": n + 1,
            "candidates": [cid]}


def _run_in_step(sites: list, prof: ProfileReport) -> list:
    """The compile sites a training step calls: compiling a function that only runs before
    training (an initializer, a data builder) cannot make a step faster. Without a record of
    the step's functions every site stays a candidate (the mechanism check still guards)."""
    if prof.step_functions is None:
        return sites
    return [s for s in sites if f"{s.file}:{s.qualname}" in prof.step_functions]


# ---------------------------------------------------------------- rewrite ----
def _hypothesis(ctx: RunContext, item: PlanItem, proposal: Proposal, incumbent: dict[str, str]):
    """The mechanism this candidate's own change claims (planner.candidate_hypothesis)."""
    return candidate_hypothesis(item, proposal.source, ctx.cfg.target, ops_claimed=proposal.ops_removed,
                                lowers_precision=lowers_precision(incumbent, proposal.files))


def rewrite(state: RunState, runtime: Rt) -> dict:
    ctx = runtime.context
    cfg = ctx.cfg
    cur = Candidate.model_validate(state["current"])
    item = cur.item
    ctx.report("rewrite", candidate=cur.id)
    cdir = ctx.paths.candidate_dir(cur.id)
    if ctx.logged(cur.id, ev.CandidateProposed) is not None and (cdir / "proposal.json").exists():
        prev = Proposal.model_validate_json((cdir / "proposal.json").read_text())
        done = cur.model_copy(update=dict(stage=Stage.PROPOSED, dir=str(cdir), low_precision=prev.low_precision,
                                          source=prev.source))
        return {"current": done.to_state()}
    incumbent = read_program(Path(state["incumbent_dir"]))
    m = ctx.workload.manifest
    intents = [i for i in ctx.intents() if i.get("id") == item.intent_id]
    context = {"profile": ctx.profile(), "history": ctx.history(), "original": read_program(ctx.paths.baseline_dir),
               "protected": m.protected, "editable": m.editable, "intent": intents[0] if intents else None}
    seen = len(ctx.rewriter.transcript)
    if cur.stage == Stage.REPAIR:
        previous = Proposal.model_validate_json((Path(cur.previous_dir) / "proposal.json").read_text())
        proposal = ctx.rewriter.repair(item, incumbent, cfg.target, context, previous, cur.feedback)
    else:
        # a combination of recipe near misses is applied by the recipes themselves, whatever the rewriter
        rewriter = RecipeRewriter() if item.combines else ctx.rewriter
        proposal = rewriter.propose(item, incumbent, cfg.target, context)
    if isinstance(proposal, Declined):
        if ctx.rewriter.transcript:
            cdir.mkdir(parents=True, exist_ok=True)
            (cdir / "llm_transcript.json").write_text(ctx.rewriter.transcript_json())
        ctx.log(ev.CandidateValidated(**ctx.base(), candidate_id=cur.id, passed=False, stage="apply",
                                      reason=proposal.reason))
        ctx.decide(cur.id, "rejected", f"apply: {proposal.reason}", None, Rule.REWRITER_DECLINED)
        return {"current": None, "rejected": [cur.id]}
    write_program(cdir / "program", proposal.files)
    diff = unified_diff(incumbent, proposal.files, "incumbent", "candidate")
    (cdir / "candidate.diff").write_text(diff)
    (cdir / "proposal.json").write_text(proposal.model_dump_json(indent=1))
    ctx.log(ev.CandidateProposed(
        **ctx.base(), candidate_id=cur.id, intent_id=item.intent_id, intent_summary=item.intent_summary,
        pattern=item.pattern,
        level=item.level, gap_class=item.gap_class, source=proposal.source, mechanism=proposal.mechanism,
        hypothesis=_hypothesis(ctx, item, proposal, incumbent).model_dump(), diff=diff, files=proposal.changed_files,
        incumbent=state.get("incumbent_id", "port"),
        llm=[x.model_dump(mode="json") for x in ctx.rewriter.transcript[seen:]],
    ))
    done = cur.model_copy(update=dict(stage=Stage.PROPOSED, dir=str(cdir), low_precision=proposal.low_precision,
                                      source=proposal.source))
    return {"current": done.to_state()}


# --------------------------------------------------------------- validate ----
def _reject_or_repair(state: RunState, ctx: RunContext, cur: Candidate, stage: str, reason: str, rule: Rule) -> dict:
    """Reject the candidate; if a model wrote it and has repairs left, send the exact failure
    back to it as the next candidate (`<base id>-r<n>`) instead of moving on."""
    can_repair = acceptance.may_repair(cur.source or "", cur.repairs, bool(getattr(ctx.rewriter, "can_repair", False)))
    feedback = f"{stage}: {reason}"
    nxt = cur.repair(feedback) if can_repair else None
    note = f" (sent back for repair as {nxt.id})" if nxt else ""
    ctx.decide(cur.id, "rejected", feedback + note, state.get("incumbent_speedup", 1.0), rule)
    if nxt is None:
        return {"current": None, "rejected": [cur.id]}
    return {"current": nxt.to_state(), "rejected": [cur.id], "candidates": [nxt.id]}


def validate(state: RunState, runtime: Rt) -> dict:
    ctx = runtime.context
    cfg = ctx.cfg
    cur = Candidate.model_validate(state["current"])
    ctx.report("validate", candidate=cur.id)
    cdir = Path(cur.dir)
    done = ctx.logged(cur.id, ev.CandidateValidated)
    if done is not None:
        if not done.passed:
            ctx.decide(cur.id, "rejected", f"{done.stage}: {done.reason}", state.get("incumbent_speedup", 1.0),
                       Rule.FAILED_VALIDATION)
            return {"current": None, "rejected": [cur.id]}
        return {"current": cur.model_copy(update={"stage": Stage.VALIDATED}).to_state()}
    proposal = Proposal.model_validate_json((cdir / "proposal.json").read_text())
    original = read_program(ctx.paths.baseline_dir)
    incumbent_ref = None
    inc_ref_path = Path(state["incumbent_dir"]).parent / "validate_ref.json"
    if inc_ref_path.exists():
        incumbent_ref = RunResult.model_validate_json(inc_ref_path.read_text())
    low = cur.low_precision or bool(state.get("low_precision"))
    hyp = _hypothesis(ctx, cur.item, proposal, read_program(Path(state["incumbent_dir"])))
    verdict, run = validate_candidate(
        ctx.workload, cfg.target, original=original, candidate=proposal.files,
        changed=proposal.changed_files, baseline_ref=ctx.baseline_ref(), out_dir=cdir / "harness",
        seed=cfg.seed, low_precision=low, ops_removed=hyp.ops_removed,
        compiled_region=hyp.compiled_region, gemm_precision=hyp.gemm_precision,
        incumbent_ref=incumbent_ref, npu_reference=cfg.dry_run, later_window=ctx.trained_window(),
    )
    if run is not None:
        (cdir / "validate_ref.json").write_text(run.model_dump_json())
    ctx.log(ev.CandidateValidated(**ctx.base(), candidate_id=cur.id, passed=verdict.passed,
                                  stage=verdict.stage, reason=verdict.reason, details=verdict.details))
    if not verdict.passed:
        return _reject_or_repair(state, ctx, cur, verdict.stage, verdict.reason, Rule.FAILED_VALIDATION)
    stage = Stage.VALIDATED_DRY_RUN if cfg.dry_run else Stage.VALIDATED
    return {"current": cur.model_copy(update={"stage": stage}).to_state()}


# ---------------------------------------------------------------- measure ----
class _TimedRunMismatch(Exception):
    """A timed candidate run did other work than validation saw (`measure.timed_runs`)."""


def measure(state: RunState, runtime: Rt) -> dict:
    ctx = runtime.context
    cfg = ctx.cfg
    cur = Candidate.model_validate(state["current"])
    cdir = Path(cur.dir)
    done = ctx.logged(cur.id, ev.CandidateMeasured)
    if done is not None:
        return {"current": cur.model_copy(update={"stage": Stage.MEASURED, "comparison": done.comparison}).to_state()}
    incumbent = read_program(Path(state["incumbent_dir"]))
    candidate = read_program(cdir / "program")

    c = ctx.workload.manifest.correctness
    reference = ctx.baseline_ref().losses
    low = cur.low_precision or bool(state.get("low_precision"))

    validated_path = cdir / "validate_ref.json"
    validated = RunResult.model_validate_json(validated_path.read_text()) if validated_path.exists() else None

    def check(rnd: dict[str, RunResult]) -> str | None:
        return timed_run_problem(rnd["candidate"], rnd["incumbent"], reference, loss_steps=c.steps,
                                 rtol_fp32=c.fp32_rtol, rtol_low_precision=c.low_precision_rtol, low_precision=low,
                                 validated=validated)

    def time_pairs():
        if cfg.timing_scheme == "lockstep":
            session = lockstep_session(
                ctx.workload, cfg.target, {"incumbent": incumbent, "candidate": candidate}, cfg.timing_pairs,
                out_dir=cdir / "harness", seed=cfg.seed, check=check,
                on_round=lambda i, r: ctx.report("measure", candidate=cur.id, detail=f"lockstep round {i + 1}"))
        else:
            session = candidate_session(
                ctx.workload, cfg.target, incumbent=incumbent, candidate=candidate, pairs=cfg.timing_pairs,
                out_dir=cdir / "harness", seed=cfg.seed, check=check,
                on_run=lambda label, r: ctx.report("measure", candidate=cur.id, detail=f"{label} run"))
        if session.violation:
            raise _TimedRunMismatch(session.violation)
        problems.extend(session.problems)
        return session.pair("incumbent", "candidate")

    problems: list[str] = []
    try:
        inc, cand = time_pairs()
        if not inc or not cand:
            ctx.decide(cur.id, "rejected", "timing runs failed: " + "; ".join(problems),
                       state.get("incumbent_speedup", 1.0), Rule.TIMING_RUNS_FAILED)
            return {"current": None, "rejected": [cur.id]}
        inc, cand, comp, note = acceptance.judge_sequentially((inc, cand), time_pairs, bar=_bar(state, ctx),
                                                              confidence=cfg.confidence, looks=cfg.looks,
                                                              pairs_per_look=cfg.timing_pairs)
    except _TimedRunMismatch as e:
        return _reject_or_repair(state, ctx, cur, "timed run", str(e), Rule.TIMED_RUN_MISMATCH)

    ctx.log(ev.CandidateMeasured(**ctx.base(), candidate_id=cur.id, incumbent_runs_ms=inc, candidate_runs_ms=cand,
                                 comparison=comp, note=note, problems=problems, outlier_rule=OUTLIER_RULE,
                                 prediction=PredictionCheck.of(cur.item.hypothesis.predicted_saving_ms, comp)))
    return {"current": cur.model_copy(update={"stage": Stage.MEASURED, "comparison": comp}).to_state()}


# ----------------------------------------------------------------- decide ----
def _realised(ctx: RunContext, cur: Candidate) -> dict:
    """What a measured recipe candidate realised of its raw prediction: the planner's next
    predictions for that recipe are calibrated with it (measure.prediction)."""
    h = cur.item.hypothesis
    if not (cur.source or "").startswith("recipe:") or cur.item.combines or h.uncalibrated_saving_ms is None:
        return {}
    obs = Observation.of(cur.item.recipe, ctx.cfg.target, h.uncalibrated_saving_ms, cur.comparison, source=cur.id)
    return {"realised": [obs.model_dump()]}


def decide(state: RunState, runtime: Rt) -> dict:
    ctx = runtime.context
    cur = Candidate.model_validate(state["current"])
    speed = state.get("incumbent_speedup", 1.0)
    keeps_low = {"low_precision": True} if cur.low_precision else {}
    if cur.stage == Stage.VALIDATED_DRY_RUN:
        # Validated against the references, not measured: it becomes the incumbent so the
        # rewrites stack, and `trainbridge ledger measure` times each one on an NPU later.
        ctx.decide(cur.id, "validated_not_measured",
                   "passed parse, guard, reference run, loss and work checks; not measured (dry run)", None,
                   Rule.DRY_RUN_VALIDATED)
        return {"incumbent_dir": str(Path(cur.dir) / "program"), "incumbent_id": cur.id, "accepted": [cur.id],
                "current": None, **keeps_low}
    comp = cur.comparison
    rule = acceptance.rule_of(comp)
    learned = _realised(ctx, cur)
    if rule == Rule.INTERVAL_CLEARS_BAR:
        new_speed = speed * comp.speedup
        ctx.decide(cur.id, "accepted", comp.reason, new_speed, rule)
        return {"incumbent_dir": str(Path(cur.dir) / "program"), "incumbent_id": cur.id,
                "incumbent_speedup": new_speed, "accepted": [cur.id], "current": None, **keeps_low, **learned}
    out = {**_reject_or_repair(state, ctx, cur, "measure", comp.reason, rule), **learned}
    if (cur.source or "").startswith("recipe:") and not cur.item.combines and comp.speedup > 1.0 \
            and comp.ci_high > 1 + _bar(state, ctx):
        out["near_misses"] = [cur.item.model_dump(mode="json")]  # planner.combined_item
    return out


# ----------------------------------------------------------------- report ----
def report(state: RunState, runtime: Rt) -> dict:
    from .report import final_report

    runtime.context.report("report")
    return final_report(runtime.context, state)


NODES = {"port": port, "baseline": baseline, "collect": collect, "plan": plan, "rewrite": rewrite,
         "validate": validate, "measure": measure, "decide": decide, "report": report}
