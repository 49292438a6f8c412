"""The nodes of the optimization graph: each does one phase and returns a partial state.

Every node writes what it did to the ledger before returning, so the ledger is complete up
to the last finished node even if the process dies; the checkpointer then resumes at the
first unfinished node.
"""

from __future__ import annotations

import difflib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..harness.crash import crash_site
from ..harness.models import RunResult
from ..harness.runner import port_workload, run_workload
from ..ledger import models as ev
from ..ledger.store import Ledger
from ..measure.statistics import calibrate_aa, compare
from ..profile.analysis import ProfileReport, analyse
from ..workload import Workload
from .evaluate import interleaved_timing, reference_run, validate
from .planner import PlanItem, candidate_hypothesis, make_item, rank, site_pattern
from .rewriters.recipe_base import off_limits
from .rewriters.base import Declined, Proposal
from .rewriters.llm import lowers_precision
from .state import RunConfig, RunPaths, RunState, read_program, write_program


def unified_diff(before: dict[str, str], after: dict[str, str], a: str = "a", b: str = "b") -> str:
    out = []
    for rel in sorted(set(before) | set(after)):
        x, y = before.get(rel, ""), after.get(rel, "")
        if x != y:
            out.extend(difflib.unified_diff(x.splitlines(True), y.splitlines(True), f"{a}/{rel}", f"{b}/{rel}"))
    return "".join(out)


class PortBlocked(RuntimeError):
    """The program uses a GPU-only construct the port cannot replace (the message names it)."""


@dataclass
class RunContext:
    """What nodes share that is not state: inputs, the ledger, the progress reporter."""

    cfg: RunConfig
    workload: Workload
    paths: RunPaths
    ledger: Ledger
    rewriter: object
    report: callable = field(default=lambda phase, **kw: None)

    def now(self) -> str:
        return ev.utc_now()


class Nodes:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    # ---------------------------------------------------------------- helpers ----
    @property
    def cfg(self) -> RunConfig:
        return self.ctx.cfg

    def _log(self, event) -> None:
        self.ctx.ledger.append(event)

    def _base(self) -> dict:
        return {"run_id": self.cfg.run_id, "time_utc": ev.utc_now()}

    def _baseline_ref(self) -> RunResult:
        return RunResult.model_validate_json((self.ctx.paths.root / "baseline_ref.json").read_text())

    def _profile(self) -> ProfileReport:
        return ProfileReport.model_validate_json(self.ctx.paths.profile.read_text())

    MAX_REPAIRS = 2

    def _reject_or_repair(self, state: RunState, cur: dict, stage: str, reason: str) -> dict:
        """Reject the candidate; if a model wrote it and has repairs left, send the exact
        failure back to it as a new candidate (`<id>-r<n>`) instead of moving on."""
        repairs = int(cur.get("repairs", 0))
        source = cur.get("source", "")
        can_repair = source.startswith("llm:") and hasattr(self.ctx.rewriter, "repair") and repairs < self.MAX_REPAIRS
        base_id = cur["id"].split("-r")[0] if cur.get("repairs") else cur["id"]
        new_id = f"{base_id}-r{repairs + 1}"
        note = f" (sent back for repair as {new_id})" if can_repair else ""
        self._decide(cur["id"], "rejected", f"{stage}: {reason}{note}", state.get("incumbent_speedup", 1.0))
        update = {"rejected": [*state.get("rejected", []), cur["id"]]}
        if can_repair:
            update["current"] = {"id": new_id, "item": cur["item"], "stage": "repair", "repairs": repairs + 1,
                                 "feedback": f"{stage}: {reason}", "previous_dir": cur["dir"]}
            update["candidates"] = [*state.get("candidates", []), new_id]
        else:
            update["current"] = None
        return update

    def _logged(self, cid: str, kind):
        """The candidate's last event of this kind, if an interrupted earlier attempt wrote it:
        nodes reuse it instead of redoing (and re-logging) finished work on --resume."""
        found = None
        for e in self.ctx.ledger.events():
            if isinstance(e, kind) and getattr(e, "candidate_id", None) == cid:
                found = e
        return found

    def _history(self) -> list[str]:
        """What was tried before and why it was rejected (for the LLM's prompt)."""
        return [f"{c.candidate_id} ({c.pattern}, {c.level}): {c.decision}: {c.reason[:200]}"
                for c in self.ctx.ledger.candidates() if c.decision in ("accepted", "rejected")]

    def _min_effect(self, state: RunState) -> float:
        """The bar decisions use: the configured one, or the A/A check's higher one."""
        return state.get("min_effect") or self.cfg.min_effect

    def _elapsed_min(self, state: RunState) -> float:
        return (time.time() - state["started_at"]) / 60.0

    # ------------------------------------------------------------------ nodes ----
    def port(self, state: RunState) -> dict:
        """Naive port of the GPU program to the target: the baseline everything is measured against."""
        self.ctx.report("port")
        ported = port_workload(self.ctx.workload, self.cfg.target)
        files = ported.files
        write_program(self.ctx.paths.baseline_dir, files)
        original = {rel: (self.ctx.workload.root / rel).read_text() for rel in self.ctx.workload.source_files()}
        blockers = [str(b) for b in ported.blockers]
        self._log(ev.PortApplied(**self._base(), target=self.cfg.target,
                                 changes=[c.model_dump() for c in ported.changes],
                                 diff=unified_diff(original, files, "original", "port"), blockers=blockers))
        if blockers:
            raise PortBlocked(f"the port to {self.cfg.target} cannot make this program run: " + "; ".join(blockers))
        return {"phase": "baseline", "incumbent_dir": str(self.ctx.paths.baseline_dir), "incumbent_id": "port"}

    def baseline(self, state: RunState) -> dict:
        """Reference losses, A/A-calibrated timing of the port, and its profile."""
        ctx, cfg = self.ctx, self.cfg
        files = read_program(ctx.paths.baseline_dir)
        out = ctx.paths.harness_dir
        ctx.report("baseline", detail="reference run")
        dry = cfg.dry_run
        ref = reference_run(ctx.workload, cfg.target, files, out, seed=cfg.seed, label="baseline-ref", npu_reference=dry)
        if ref.status != "ok":
            site = crash_site(ref.error, files) if ref.status == "crashed" else (ref.error or "").strip()[:500]
            raise RuntimeError(f"the ported program does not run ({ref.status}): {site}")
        (ctx.paths.root / "baseline_ref.json").write_text(ref.model_dump_json())
        runs = []
        for i in range(0 if dry else cfg.baseline_runs):
            ctx.report("baseline", detail=f"timing run {i + 1}/{cfg.baseline_runs}")
            r = run_workload(ctx.workload, cfg.target, out_dir=out, label="baseline", sources=files, seed=cfg.seed)
            if r.status != "ok":
                raise RuntimeError(f"baseline timing run {r.status}: {r.error}")
            runs.append(r.measured_ms)
        aa, min_effect = None, cfg.min_effect
        if not dry:
            aa = calibrate_aa(runs, min_effect=min_effect, confidence=cfg.confidence,
                              target_rate=cfg.max_false_accept_rate)
            if aa.false_accept_rate > cfg.max_false_accept_rate:
                # The rule takes this program for faster than itself too often: raise the bar to
                # what the A/A splits need (rounded up to 0.5%) and record the calibration there.
                min_effect = math.ceil(aa.min_effect_needed * 200 + 1e-9) / 200
                aa = calibrate_aa(runs, min_effect=min_effect, confidence=cfg.confidence,
                                  target_rate=cfg.max_false_accept_rate)
        ctx.report("baseline", detail="profile")
        prof_run = run_workload(ctx.workload, cfg.target, out_dir=out, label="profile", sources=files,
                                seed=cfg.seed, profile_steps=3, count_ops=True, count_flops=True, npu_reference=dry)
        if prof_run.status != "ok":
            raise RuntimeError(f"profile run {prof_run.status}: {prof_run.error}")
        prof = analyse(prof_run, ctx.workload.manifest.name)
        ctx.paths.profile.write_text(prof.model_dump_json(indent=1))
        pooled = sorted(x for r in (runs or [prof.step.raw_ms]) for x in r)
        median = pooled[len(pooled) // 2]
        self._log(ev.BaselineMeasured(
            **self._base(), runs_ms=runs, losses=ref.losses, flops_per_step=ref.flops_per_step,
            work_items_per_step=[s.work_items for s in ref.steps], ops_per_step=prof.ops_per_step,
            median_ms=median, verdict=prof.verdict, profile_path=str(ctx.paths.profile),
            aa=aa, min_effect=min_effect, environment=(ref.environment.model_dump() if ref.environment else {}),
        ))
        return {"phase": "collect", "baseline_median_ms": median, "min_effect": min_effect}

    def collect(self, state: RunState) -> dict:
        """GPU evidence: load the given bundle, or compile the program with Inductor now.

        Without evidence the loop still plans from the target profile, but a run that was
        asked for evidence records that it has none (`EvidenceLoaded.missing`): the summary,
        report.md and the exit code say so (unless --allow-no-evidence or --skip-collect)."""
        ctx, cfg = self.ctx, self.cfg
        ctx.report("collect")
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

                bundle = collect_workload(ctx.workload, device=cfg.evidence_device,
                                          out_dir=ctx.paths.root / "evidence")
                note = f"collected with route {bundle.route}"
            if bundle is not None:
                bundle.save(ctx.paths.evidence)
                n_intents = len(bundle.intents)
        except Exception as e:  # evidence is guidance: without it, plan from the profile alone
            error = f"{type(e).__name__}: {str(e)[:2000]}"
            note = f"no GPU evidence ({error}); planning from the target profile only"
        event = ev.EvidenceLoaded(**self._base(), path=str(ctx.paths.evidence) if n_intents else None,
                                  intents=n_intents, note=note, source=source, error=error,
                                  required=source != "skipped" and not cfg.allow_no_evidence)
        self._log(event)
        if event.missing:
            ctx.report("collect", warning=f"NO GPU EVIDENCE: {event.missing}")
        else:
            ctx.report("collect", detail=f"{n_intents} intents ({source})")
        return {"phase": "plan"}

    def _intents(self) -> list[dict]:
        if not self.ctx.paths.evidence.exists():
            return []
        data = json.loads(self.ctx.paths.evidence.read_text())
        return data.get("intents", [])

    def plan(self, state: RunState) -> dict:
        """Pick the highest-scoring untried (recipe, intent) that applies to the incumbent."""
        from .rewriters.recipes import RECIPES

        ctx, cfg = self.ctx, self.cfg
        n = state.get("n_candidates", 0)
        if n >= cfg.budget_candidates:
            return {"current": None, "done_reason": f"candidate budget ({cfg.budget_candidates}) used"}
        if self._elapsed_min(state) >= cfg.budget_minutes:
            return {"current": None, "done_reason": f"time budget ({cfg.budget_minutes:.0f} min) used"}
        ctx.report("plan", candidates=n)
        files = read_program(Path(state["incumbent_dir"]))
        prof = self._profile()
        intents = self._intents()
        tried = set(state.get("tried", []))
        items: list[PlanItem] = []
        m = ctx.workload.manifest
        fence = off_limits(files, m.protected, m.editable)
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
                item = make_item(recipe, prof, intent=intent, min_effect=self._min_effect(state), site=site,
                                 target=cfg.target)
                if item.key not in tried:
                    items.append(item)
        ranked = rank(items)
        if not ranked:
            return {"current": None, "done_reason": "no untried recipe applies to the incumbent"}
        item = ranked[0]
        cid = f"c{n + 1:02d}-{item.recipe}" + (f"-{item.site.split('.')[-1 if not item.site.endswith('forward') else 0]}"
                                                if item.site else "")
        return {
            "current": {"id": cid, "item": item.model_dump(), "stage": "planned"},
            "tried": sorted(tried | {item.key}),
            "n_candidates": n + 1,
            "candidates": [*state.get("candidates", []), cid],
        }

    def rewrite(self, state: RunState) -> dict:
        ctx, cfg = self.ctx, self.cfg
        cur = dict(state["current"])
        item = PlanItem.model_validate(cur["item"])
        ctx.report("rewrite", candidate=cur["id"])
        cdir = ctx.paths.candidate_dir(cur["id"])
        if self._logged(cur["id"], ev.CandidateProposed) is not None and (cdir / "proposal.json").exists():
            prev = Proposal.model_validate_json((cdir / "proposal.json").read_text())
            cur.update(stage="proposed", dir=str(cdir), low_precision=prev.low_precision, source=prev.source)
            return {"current": cur}
        incumbent = read_program(Path(state["incumbent_dir"]))
        m = ctx.workload.manifest
        intents = [i for i in self._intents() if i.get("id") == item.intent_id]
        context = {"profile": self._profile(), "history": self._history(), "original": read_program(ctx.paths.baseline_dir),
                   "protected": m.protected, "editable": m.editable, "intent": intents[0] if intents else None}
        seen = len(getattr(ctx.rewriter, "transcript", []))
        if cur.get("feedback"):
            previous = Proposal.model_validate_json((Path(cur["previous_dir"]) / "proposal.json").read_text())
            proposal = ctx.rewriter.repair(item, incumbent, cfg.target, context, previous, cur["feedback"])
        else:
            proposal = ctx.rewriter.propose(item, incumbent, cfg.target, context)
        if isinstance(proposal, Declined):
            (cdir / "llm_transcript.json").parent.mkdir(parents=True, exist_ok=True)
            if hasattr(ctx.rewriter, "transcript_json"):
                (cdir / "llm_transcript.json").write_text(ctx.rewriter.transcript_json())
            self._reject(cur["id"], "apply", proposal.reason)
            return {"current": None, "rejected": [*state.get("rejected", []), cur["id"]]}
        cdir = ctx.paths.candidate_dir(cur["id"])
        write_program(cdir / "program", proposal.files)
        diff = unified_diff(incumbent, proposal.files, "incumbent", "candidate")
        (cdir / "candidate.diff").write_text(diff)
        (cdir / "proposal.json").write_text(proposal.model_dump_json(indent=1))
        self._log(ev.CandidateProposed(
            **self._base(), candidate_id=cur["id"], intent_id=item.intent_id, pattern=item.pattern,
            level=item.level, gap_class=item.gap_class, source=proposal.source, mechanism=proposal.mechanism,
            hypothesis=self._hypothesis(item, proposal, incumbent).model_dump(), diff=diff, files=proposal.changed_files,
            incumbent=state.get("incumbent_id", "port"),
            llm=[x.model_dump(mode="json") for x in getattr(ctx.rewriter, "transcript", [])[seen:]],
        ))
        cur.update(stage="proposed", dir=str(cdir), low_precision=proposal.low_precision, source=proposal.source)
        return {"current": cur}

    def validate(self, state: RunState) -> dict:
        ctx, cfg = self.ctx, self.cfg
        cur = dict(state["current"])
        item = PlanItem.model_validate(cur["item"])
        ctx.report("validate", candidate=cur["id"])
        cdir = Path(cur["dir"])
        done = self._logged(cur["id"], ev.CandidateValidated)
        if done is not None:
            if not done.passed:
                self._decide(cur["id"], "rejected", f"{done.stage}: {done.reason}", state.get("incumbent_speedup", 1.0))
                return {"current": None, "rejected": [*state.get("rejected", []), cur["id"]]}
            cur.update(stage="validated")
            return {"current": cur}
        proposal = Proposal.model_validate_json((cdir / "proposal.json").read_text())
        original = read_program(ctx.paths.baseline_dir)
        incumbent_ref = None
        inc_ref_path = Path(state["incumbent_dir"]).parent / "validate_ref.json"
        if inc_ref_path.exists():
            incumbent_ref = RunResult.model_validate_json(inc_ref_path.read_text())
        low = bool(cur.get("low_precision")) or bool(state.get("low_precision"))
        hyp = self._hypothesis(item, proposal, read_program(Path(state["incumbent_dir"])))
        verdict, run = validate(
            ctx.workload, cfg.target, original=original, candidate=proposal.files,
            changed=proposal.changed_files, baseline_ref=self._baseline_ref(), out_dir=cdir / "harness",
            seed=cfg.seed, low_precision=low, ops_removed=hyp.ops_removed,
            compiled_region=hyp.compiled_region, gemm_precision=hyp.gemm_precision,
            incumbent_ref=incumbent_ref, npu_reference=cfg.dry_run,
        )
        if run is not None:
            (cdir / "validate_ref.json").write_text(run.model_dump_json())
        self._log(ev.CandidateValidated(**self._base(), candidate_id=cur["id"], passed=verdict.passed,
                                        stage=verdict.stage, reason=verdict.reason, details=verdict.details))
        if not verdict.passed:
            return self._reject_or_repair(state, cur, verdict.stage, verdict.reason)
        cur.update(stage="validated_dry_run" if cfg.dry_run else "validated")
        return {"current": cur}

    def measure(self, state: RunState) -> dict:
        ctx, cfg = self.ctx, self.cfg
        cur = dict(state["current"])
        cdir = Path(cur["dir"])
        done = self._logged(cur["id"], ev.CandidateMeasured)
        if done is not None:
            cur.update(stage="measured", comparison=done.comparison.model_dump())
            return {"current": cur}
        incumbent = read_program(Path(state["incumbent_dir"]))
        candidate = read_program(cdir / "program")

        def on_run(label, r):
            ctx.report("measure", candidate=cur["id"], detail=f"{label} run")

        inc, cand, problems = interleaved_timing(
            ctx.workload, cfg.target, incumbent=incumbent, candidate=candidate, pairs=cfg.timing_pairs,
            out_dir=cdir / "harness", seed=cfg.seed, on_run=on_run,
        )
        if not inc or not cand:
            self._decide(cur["id"], "rejected", "timing runs failed: " + "; ".join(problems),
                         state.get("incumbent_speedup", 1.0))
            return {"current": None, "rejected": [*state.get("rejected", []), cur["id"]]}
        min_effect = self._min_effect(state)
        comp = compare(inc, cand, min_effect=min_effect, confidence=cfg.confidence)
        note = ""
        inconclusive = comp.decision == "reject" and comp.speedup > 1 + 2 * min_effect and \
            comp.ci_low <= 1 + min_effect < comp.ci_high
        if comp.suspicious or inconclusive:
            # > 3x from one change, or a point estimate that clears the bar with an interval
            # too wide to decide (a noisy neighbour): one more set of pairs, never more, so the
            # rule is looked at twice at most (measurement_integrity.md).
            inc2, cand2, _ = interleaved_timing(
                ctx.workload, cfg.target, incumbent=incumbent, candidate=candidate, pairs=cfg.timing_pairs,
                out_dir=cdir / "harness", seed=cfg.seed, on_run=on_run)
            inc, cand = inc + inc2, cand + cand2
            comp = compare(inc, cand, min_effect=min_effect, confidence=cfg.confidence)
            note = ("suspiciously large gain" if comp.suspicious else "inconclusive interval") + \
                ": re-measured with a second set of pairs"
        self._log(ev.CandidateMeasured(**self._base(), candidate_id=cur["id"], incumbent_runs_ms=inc,
                                       candidate_runs_ms=cand, comparison=comp, note=note,
                                       problems=problems))
        cur.update(stage="measured", comparison=comp.model_dump())
        return {"current": cur}

    def decide(self, state: RunState) -> dict:
        cur = dict(state["current"])
        speed = state.get("incumbent_speedup", 1.0)
        if cur.get("stage") == "validated_dry_run":
            # Validated against the references, not measured: it becomes the incumbent so the
            # rewrites stack, and `trainbridge ledger measure` times each one on an NPU later.
            self._decide(cur["id"], "validated_not_measured",
                         "passed parse, guard, reference run, loss and work checks; not measured (dry run)", None)
            return {"incumbent_dir": str(Path(cur["dir"]) / "program"), "incumbent_id": cur["id"],
                    "accepted": [*state.get("accepted", []), cur["id"]], "current": None,
                    **({"low_precision": True} if cur.get("low_precision") else {})}
        comp = cur["comparison"]
        if comp["decision"] == "accept":
            new_speed = speed * comp["speedup"]
            self._decide(cur["id"], "accepted", comp["reason"], new_speed)
            update = {
                "incumbent_dir": str(Path(cur["dir"]) / "program"),
                "incumbent_id": cur["id"],
                "incumbent_speedup": new_speed,
                "accepted": [*state.get("accepted", []), cur["id"]],
                "current": None,
            }
            if cur.get("low_precision"):
                update["low_precision"] = True
            return update
        return self._reject_or_repair(state, cur, "measure", comp["reason"])

    def report(self, state: RunState) -> dict:
        from .report import final_report

        self.ctx.report("report")
        return final_report(self.ctx, state)

    def _hypothesis(self, item: PlanItem, proposal: Proposal, incumbent: dict[str, str]):
        """The mechanism this candidate's own change claims (planner.candidate_hypothesis)."""
        return candidate_hypothesis(item, proposal.source, self.cfg.target, ops_claimed=proposal.ops_removed,
                                    lowers_precision=lowers_precision(incumbent, proposal.files))

    # --------------------------------------------------------------- ledger ----
    def _reject(self, cid: str, stage: str, reason: str) -> None:
        self._log(ev.CandidateValidated(**self._base(), candidate_id=cid, passed=False, stage=stage, reason=reason))
        self._decide(cid, "rejected", f"{stage}: {reason}", None)

    def _decide(self, cid: str, decision: str, reason: str, speed: float | None) -> None:
        self.ctx.report("decide", candidate=cid, decision=decision, speedup=speed)
        if self._logged(cid, ev.CandidateDecided) is not None:
            return  # decided before an interruption; the checkpoint just had not caught up
        self._log(ev.CandidateDecided(**self._base(), candidate_id=cid, decision=decision, reason=reason,
                                      incumbent_speedup_vs_baseline=speed))


def _run_in_step(sites: list, prof: ProfileReport) -> list:
    """The compile sites a training step calls: compiling a function that only runs before
    training (an initializer, a data builder) cannot make a step faster. Without a record of
    the step's functions every site stays a candidate (the mechanism check still guards)."""
    if prof.step_functions is None:
        return sites
    return [s for s in sites if f"{s.file}:{s.qualname}" in prof.step_functions]
