"""Validate a candidate before it is timed, then time it against the incumbent.

Validation order is cheapest first: parse, guard (protected regions, forbidden calls),
one short run from the baseline's seed (it must import and train), loss trajectory
against the baseline, work conservation (work items and FLOPs per step), and the
region check (each function the candidate rewrote against the original on fresh inputs,
`measure.region_check`) and the mechanism check (did the operators the hypothesis named
actually go away?). Timing comes after, through `measure.timing`.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from ..aten_ops import MODEL_RANDOM
from ..harness.models import RunResult
from ..harness.runner import run_workload, sources_digest
from ..measure.correctness import compare_losses
from ..measure.later_window import PLUGIN as TRAINED_STATE_PLUGIN
from ..measure.later_window import read_report as read_trained_state_report
from ..measure.region_check import PLUGIN as REGION_PLUGIN
from ..measure.region_check import changed_regions, read_results
from ..measure.work import check_work
from ..workload import CorrectnessConfig, Workload


class Validation(BaseModel):
    passed: bool
    stage: str
    reason: str
    details: dict[str, str | float | int | bool | None] = Field(default_factory=dict)


def reference_run(workload: Workload, target: str, files: dict[str, str], out_dir: Path, *, seed: int,
                  label: str, npu_reference: bool = False, plugins: list[str] | None = None,
                  plugin_options: dict[str, str] | None = None) -> RunResult:
    """The short run every validation compares against: K steps from the seed, ops and FLOPs counted."""
    k = workload.manifest.correctness.steps
    return run_workload(workload, target, out_dir=out_dir, label=label, sources=files, warmup_steps=0,
                        measured_steps=k, count_ops=True, count_flops=True, seed=seed, npu_reference=npu_reference,
                        plugins=plugins, plugin_options=plugin_options)


class TrainedWindow(BaseModel):
    """The later window (`measure.later_window`): the baseline's trained state and its losses from there.

    The window runs in a timed run's shape (`later_window_shape`): a candidate that counts its
    own steps and changes its math only past the validation's steps finds no step index here
    that its timed runs reach and this window does not compare."""

    state_path: str = Field(..., description="absolute path of the saved model + optimizer state")
    trained_steps: int = Field(..., description="baseline steps trained before the state was saved")
    warmup_steps: int = Field(0, ge=0, description="warm-up steps run from the trained state (compared too)")
    steps: int = Field(..., description="measured steps run from the trained state after the warm-up")
    baseline_losses: list[float | None]

    @property
    def compared_steps(self) -> int:
        return self.warmup_steps + self.steps


def later_window_shape(workload: Workload) -> tuple[int, int]:
    """(warm-up, measured) steps of the later window: those of a timed run (the manifest's warm-up
    and `[steps] timed`, else `measured`), lengthened to at least `[correctness] later_steps`.

    Why a timed run's shape: the window is the run that holds near-identity operators to the
    baseline (from the trained state a deleted softcap moves the loss at once). A window shorter
    than a timed run would leave the timed runs' later steps unchecked for that, and a window of
    another length than a timed run is one a program could tell apart by counting its steps."""
    m = workload.manifest
    warmup, measured = m.steps.warmup, m.steps.timed or m.steps.measured
    return warmup, max(measured, m.correctness.later_steps - warmup)


def train_baseline_state(workload: Workload, target: str, files: dict[str, str], out_dir: Path, *, seed: int,
                         trained_steps: int, steps: int, warmup_steps: int = 0,
                         npu_reference: bool = False) -> TrainedWindow:
    """Once per run: train the baseline `trained_steps` steps, save its state, and record its losses
    over `warmup_steps` + `steps` steps from that state (the reference every candidate's later
    window is held to; `later_window_shape` gives the loop's)."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    state = out_dir / "trained_state.pt"
    save = run_workload(workload, target, out_dir=out_dir, label="baseline-train", sources=files, warmup_steps=0,
                        measured_steps=trained_steps, seed=seed, npu_reference=npu_reference,
                        plugins=[TRAINED_STATE_PLUGIN],
                        plugin_options={"mode": "save", "out": str(state), "after_step": str(trained_steps)})
    if save.status != "ok" or not state.exists():
        raise RuntimeError(f"training the baseline {trained_steps} steps for the later-window check failed "
                           f"({save.status}): {(save.error or 'no state saved')[:500]}")
    window = TrainedWindow(state_path=str(state), trained_steps=trained_steps, warmup_steps=warmup_steps,
                           steps=steps, baseline_losses=[])
    ref = trained_window_run(workload, target, files, out_dir, window, seed=seed, label="baseline-later",
                             npu_reference=npu_reference)
    if isinstance(ref, str):
        raise RuntimeError(f"the baseline does not run from its own trained state: {ref}")
    return window.model_copy(update={"baseline_losses": ref.losses})


def trained_window_run(workload: Workload, target: str, files: dict[str, str], out_dir: Path,
                       window: TrainedWindow, *, seed: int, label: str,
                       npu_reference: bool = False) -> RunResult | str:
    """`window.warmup_steps` + `window.steps` steps of `files` from the trained state: the run, or
    why it did not load or run."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    report_path = out_dir / f"{label}-{sources_digest(files)}.trained_state.json"
    run = run_workload(workload, target, out_dir=out_dir, label=label, sources=files,
                       warmup_steps=window.warmup_steps, measured_steps=window.steps, seed=seed, npu_reference=npu_reference,
                       plugins=[TRAINED_STATE_PLUGIN],
                       plugin_options={"mode": "load", "trained_state": window.state_path,
                                       "report_path": str(report_path)})
    report = read_trained_state_report(run.plugin_outputs.get("trained_state"))
    if report is not None and report.errors:
        return report.errors[0]
    if run.status != "ok":
        return f"run {run.status}: {(run.error or '')[:500]}"
    if report is None or not report.model_loaded or report.optimizers_loaded != report.optimizers_in_state:
        loaded = "nothing" if report is None else (
            f"model {'loaded' if report.model_loaded else 'not loaded'}, "
            f"{report.optimizers_loaded}/{report.optimizers_in_state} optimizers")
        return f"the trained state was not loaded ({loaded})"
    return run


def random_ops(run: RunResult) -> str:
    """The model's random operators per step in a run with an op count ('native_dropout x4'), or ''."""
    if run.ops_per_step is None:
        return ""
    found = {op.removeprefix("aten."): n for op, n in run.ops_per_step.by_op.items()
             if op.removeprefix("aten.").split(".")[0] in MODEL_RANDOM}
    return ", ".join(f"{op} x{n}" for op, n in sorted(found.items()))


def _region_check_options(original: dict[str, str], candidate: dict[str, str], changed: list[str], out_dir: Path,
                          low_precision: bool) -> dict[str, str] | None:
    """The region-check plugin's options for this candidate, or None when it changed no checkable function."""
    regions = changed_regions(original, candidate, changed)
    if not regions:
        return None
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"regions-{sources_digest(candidate)}"
    Path(f"{stem}.json").write_text(json.dumps([r.model_dump() for r in regions]))
    return {"regions_path": f"{stem}.json", "out": f"{stem}.results.json", "low_precision": "1" if low_precision else "0"}


def _parses(files: dict[str, str], changed: list[str]) -> str | None:
    for rel in changed:
        try:
            compile(files[rel], rel, "exec")
        except SyntaxError as e:
            return f"{rel}:{e.lineno}: {e.msg}"
    return None


def mechanism_check(reference: RunResult, candidate: RunResult, ops: list[str], *,
                    compiled_region: bool = False, gemm_precision: str | None = None) -> tuple[bool, str]:
    """Whether the change did what its hypothesis said: the named operators fell in the per-step
    dispatcher count, or (a torch.compile region) a compiled graph was entered in the steps.

    Op counting runs the program eager (Dynamo steps aside under a dispatch mode), so a
    compiled region is checked by Dynamo's graph count instead: a graph first compiled after
    the first forward of the training model lies on the step's path; one compiled before it
    (an initialisation function, say) cannot make a step faster. A precision change is checked
    by the dtypes the step's GEMMs and convolutions ran in: an autocast that never reaches the
    model's matmuls (wrong device, a region that encloses no layer) moves none of them.
    """
    if compiled_region:
        n = candidate.compiled_graphs_in_steps
        if not n:
            return False, ("no torch.compile graph was entered inside the training steps "
                           f"({'nothing compiled at all' if n is None else 'only before the first forward'})")
        return True, f"{n} compiled graph(s) entered inside the training steps"
    if gemm_precision and reference.ops_per_step is not None and candidate.ops_per_step is not None:
        return _gemm_precision_check(reference, candidate, gemm_precision)
    if not ops or reference.ops_per_step is None or candidate.ops_per_step is None:
        return True, "no operator-level prediction to check"
    def count(r: RunResult) -> int:
        by = r.ops_per_step.by_op
        return sum(v for k, v in by.items() if f"aten::{k.removeprefix('aten.')}" in ops)
    before, after = count(reference), count(candidate)
    total_b, total_a = reference.ops_per_step.total, candidate.ops_per_step.total
    fell = after < before or total_a < total_b
    return fell, (f"named operators per step {before} -> {after}; all ATen ops per step {total_b} -> {total_a}")


HALF_DTYPES = ("bfloat16", "float16")


def _gemm_precision_check(reference: RunResult, candidate: RunResult, direction: str) -> tuple[bool, str]:
    """'lower': more of the step's GEMM/convolution ops run in a 16-bit dtype; 'higher': fewer."""
    def half(r: RunResult) -> tuple[int, int]:
        by = r.ops_per_step.gemm_by_dtype
        return sum(by.get(d, 0) for d in HALF_DTYPES), sum(by.values())

    (hb, tb), (ha, ta) = half(reference), half(candidate)
    note = f"16-bit GEMM/convolution ops per step {hb}/{tb} -> {ha}/{ta}"
    return (ha > hb if direction == "lower" else ha < hb), note


def validate(
    workload: Workload, target: str, *, original: dict[str, str], candidate: dict[str, str],
    changed: list[str], baseline_ref: RunResult, out_dir: Path, seed: int, low_precision: bool,
    ops_removed: list[str], incumbent_ref: RunResult | None = None, npu_reference: bool = False,
    compiled_region: bool = False, gemm_precision: str | None = None, later_window: TrainedWindow | None = None,
) -> tuple[Validation, RunResult | None]:
    from .guard import check_candidate

    err = _parses(candidate, changed)
    if err:
        return Validation(passed=False, stage="parse", reason=f"does not parse: {err}"), None
    m = workload.manifest
    verdict = check_candidate(original, candidate, m.protected, m.editable, target)
    errors = [v for v in verdict.violations if v.severity == "error"]
    if errors:
        v = errors[0]
        return Validation(passed=False, stage="guard", reason=f"{v.rule}: {v.message} ({v.file}:{v.line})",
                          details={"violations": len(errors)}), None
    regions = _region_check_options(original, candidate, changed, out_dir, low_precision)
    run = reference_run(workload, target, candidate, out_dir, seed=seed, label="validate", npu_reference=npu_reference,
                        plugins=[REGION_PLUGIN] if regions else None, plugin_options=regions)
    if run.status == "tampered":
        return Validation(passed=False, stage="clock", reason=f"candidate run: {run.error}"), run
    if run.status != "ok":
        return Validation(passed=False, stage="import",
                          reason=f"candidate run {run.status}: {(run.error or '')[:600]}"), run
    region_results = read_results(run.plugin_outputs.get("region_check"))
    region_note = {"regions": "; ".join(f"{r.qualname}: {r.reason}" for r in region_results)} if region_results else {}
    failed = next((r for r in region_results if r.checked and not r.passed), None)
    if failed is not None:  # before the loss: it names the function, where a drifting loss names none
        return Validation(passed=False, stage="lab", reason=f"{failed.file}:{failed.qualname} differs from the "
                          f"original on fresh inputs: {failed.reason}", details=region_note), run
    c = m.correctness
    loss = compare_losses(baseline_ref.losses, run.losses, rtol_fp32=c.fp32_rtol,
                          rtol_low_precision=c.low_precision_rtol, low_precision=low_precision, steps=c.steps)
    if not loss.passed:
        return Validation(passed=False, stage="correctness", reason=loss.reason), run
    if (why := _instrumented_steps_problem(baseline_ref, run, c, low_precision)) is not None:
        return Validation(passed=False, stage="correctness", reason=why), run
    work = check_work(baseline_ref, run)
    if not work.passed:
        return Validation(passed=False, stage="work", reason=work.reason), run
    region_note = {**region_note, "work": "; ".join([work.reason, *work.notes])}
    fell, note = mechanism_check(incumbent_ref or baseline_ref, run, ops_removed, compiled_region=compiled_region,
                                 gemm_precision=gemm_precision)
    if not fell and not npu_reference:
        # (A dry run's torch_npu references are written in ATen ops, so counts cannot fall there.)
        # The method: verify the mechanism before the objective. Timing a change that did not
        # do what it claimed can only find noise.
        return Validation(passed=False, stage="mechanism", reason=f"mechanism not confirmed: {note}",
                          details={"mechanism_confirmed": False, "mechanism": note, "loss": loss.reason,
                                   **region_note}), run
    details = {"mechanism_confirmed": fell, "mechanism": note, "loss": loss.reason, **region_note}
    if (drawn := random_ops(baseline_ref)):
        details["random_ops"] = (f"{drawn} per step: compiled regions drew eager's random numbers in these runs "
                                 "(Inductor fallback_random), so the losses compare the math")
    checks = "parse, guard, run, loss, work and region checks passed"
    if later_window is not None:
        why, later = _later_window_problem(workload, target, candidate, later_window, out_dir, seed=seed,
                                           low_precision=low_precision, npu_reference=npu_reference)
        if why is not None:
            return Validation(passed=False, stage="later_window", reason=why, details=details), run
        details["later_window"] = later
        checks = "parse, guard, run, loss, work, region and later-window checks passed"
    return Validation(passed=True, stage="work", reason=checks, details=details), run


def _instrumented_steps_problem(baseline_ref: RunResult, run: RunResult, c: CorrectnessConfig,
                                low_precision: bool) -> str | None:
    """Why the steps run under the instruments (op and FLOP counters, after the compared steps)
    drift from the baseline's same steps, or None. Those steps are the only ones a program can
    tell apart from a timed step (a dispatch mode is active); their counts stand for the whole
    run only if the program computes there what it computes elsewhere."""
    n = min(len(baseline_ref.losses), len(run.losses))
    if n <= c.steps or any(x is None for x in baseline_ref.losses[:n]):
        return None
    every = compare_losses(baseline_ref.losses, run.losses, rtol_fp32=c.fp32_rtol,
                           rtol_low_precision=c.low_precision_rtol, low_precision=low_precision, steps=n)
    if every.passed:
        return None
    return f"the steps run under the op and FLOP counters (after the {c.steps} compared) differ: {every.reason}"


def _later_window_problem(workload: Workload, target: str, candidate: dict[str, str], window: TrainedWindow,
                          out_dir: Path, *, seed: int, low_precision: bool,
                          npu_reference: bool) -> tuple[str | None, str]:
    """Why the candidate's losses from the trained state miss the baseline's (None when they match)."""
    run = trained_window_run(workload, target, candidate, out_dir, window, seed=seed, label="validate-later",
                             npu_reference=npu_reference)
    where = f"from the baseline's state after {window.trained_steps} steps"
    if isinstance(run, str):
        return f"{where}: {run}", ""
    c = workload.manifest.correctness
    loss = compare_losses(window.baseline_losses, run.losses, rtol_fp32=c.fp32_rtol,
                          rtol_low_precision=c.low_precision_rtol, low_precision=low_precision,
                          steps=window.compared_steps)
    if not loss.passed:
        return f"{where}: {loss.reason}", ""
    return None, f"{where}: {loss.reason}"
