"""The run ledger: typed events, crash-safe appends, folding, and the review table."""

from __future__ import annotations

import json
import warnings

import pytest
from pydantic import ValidationError
from rich.console import Console

from trainbridge.harness.models import Environment
from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger, LedgerError
from trainbridge.ledger.view import render_ledger
from trainbridge.measure.statistics import calibrate_aa, compare

RUN = "20261202-000000-minigpt-cpu"
T = "2026-12-02T14:00:00.000+00:00"
INC = [[10.0, 10.2, 9.9, 10.1], [10.1, 10.0, 10.3, 9.8], [9.9, 10.1, 10.0, 10.2]]
CAND = [[9.0, 9.1, 8.9, 9.2], [9.1, 9.0, 9.2, 8.8], [8.9, 9.1, 9.0, 9.1]]
COMP = compare(INC, CAND, n_boot=200)
AA = calibrate_aa(INC + CAND[:1], min_effect=0.02, confidence=0.95, n_splits=10, n_boot=100)
HYP = {"ops_removed": ["aten::mul", "aten::rsqrt"], "predicted_saving_ms": 0.4, "predicted_saving_pct": 4.0,
       "reject_if": "speedup CI low <= 1.02"}
ENV = Environment(python="3.12", torch_version="2.13.0", target="cpu", device_name="cpu", cpu_model="x86",
                  torch_threads=4, interop_threads=4, hostname="h", program_sha256="ab" * 32,
                  env_knobs={"OMP_NUM_THREADS": "4"})


def one_of_each() -> list:
    b = {"run_id": RUN, "time_utc": T}
    return [
        ev.RunStarted(**b, workload="/w/minigpt", workload_name="minigpt", target="cpu", agent="recipes",
                      budget_candidates=4, budget_minutes=10.0, argv=["trainbridge", "run"],
                      environment={"python": "3.12", "torch": "2.13.0"}),
        ev.RunResumed(**b, argv=["trainbridge", "run", "--resume"]),
        ev.PortApplied(**b, target="cpu", diff="--- a\n+++ b\n", changes=[ev.PortChangeRecord(
            file="train.py", line=12, kind="device", before="'cuda'", after="'cpu'", semantic_change=False,
            note="device string")]),
        ev.BaselineMeasured(**b, runs_ms=INC, losses=[4.0, 3.9, None], flops_per_step=10**9,
                            work_items_per_step=[512, 512, 512], ops_per_step=321, median_ms=10.05,
                            verdict="host-bound", profile_path="runs/x/profile.json", aa=AA, environment=ENV),
        ev.EvidenceLoaded(**b, path="runs/x/evidence.json", intents=3, note="loaded"),
        ev.CandidateProposed(**b, candidate_id="c01-fuse", intent_id="i7", pattern="rmsnorm", level="L1",
                             gap_class="fusion", source="recipe:fused_rmsnorm", mechanism="F.rms_norm",
                             hypothesis=ev.HypothesisRecord(**HYP), diff="@@ -1 +1 @@", files=["train.py"],
                             incumbent="port", llm=[{"tokens": 120, "latency_s": 1.5}]),
        ev.CandidateValidated(**b, candidate_id="c01-fuse", passed=True, stage="work", reason="ok",
                              details={"mechanism_confirmed": True, "ops": 3, "loss_rel": 1e-4, "note": "x",
                                       "none": None}),
        ev.CandidateMeasured(**b, candidate_id="c01-fuse", incumbent_runs_ms=INC, candidate_runs_ms=CAND,
                             comparison=COMP, note="", aa_note="A/A noise 0.4%", problems=[]),
        ev.CandidateDecided(**b, candidate_id="c01-fuse", decision="accepted", reason=COMP.reason,
                            incumbent_speedup_vs_baseline=COMP.speedup),
        ev.RunFinished(**b, final_speedup=1.1, final_ci=(1.05, 1.15), compiled_port_speedup=1.3,
                       final_vs_compiled=0.85, accepted=["c01-fuse"], rejected=[], done_reason="budget",
                       report_path="runs/x/report.md",
                       end_to_end=ev.EndToEnd(runs_ms={"port": INC, "final": CAND}, final_vs_port=COMP)),
        ev.VerifyResult(**b, recorded_speedup=1.1, measured_speedup=1.09, ci=(1.04, 1.14), holds=True,
                        port_runs_ms=INC, final_runs_ms=CAND),
    ]


# ------------------------------------------------------------- round trip ----
def test_every_event_type_round_trips(tmp_path):
    events = one_of_each()
    assert {type(e) for e in events} == set(ev.EVENT_TYPES)
    led = Ledger(tmp_path / "runs" / RUN / "ledger.jsonl")
    for e in events:
        led.append(e)
    back = led.events()
    assert back == events
    assert [json.loads(line)["event"] for line in led.path.read_text().splitlines()] == [e.event for e in events]
    details = back[6].details
    assert details["mechanism_confirmed"] is True and details["ops"] == 3 and details["none"] is None


def test_schema_covers_every_event():
    schema = ev.ledger_schema()
    mapping = schema["discriminator"]["mapping"]
    assert set(mapping) == {t.model_fields["event"].default for t in ev.EVENT_TYPES}
    json.dumps(schema)  # publishable as is


def test_baseline_summary_is_derived_and_empty_environment_is_none():
    e = ev.BaselineMeasured(run_id=RUN, time_utc=T, runs_ms=INC, losses=[], flops_per_step=None,
                            work_items_per_step=[], environment={})
    assert e.environment is None and e.summary.n == 12 and e.summary.median_ms == pytest.approx(10.05)


def test_unknown_fields_and_bad_times_are_refused():
    with pytest.raises(ValidationError):
        ev.CandidateDecided(run_id=RUN, time_utc=T, candidate_id="c", decision="accepted", reason="", bogus=1)
    with pytest.raises(ValidationError):
        ev.RunResumed(run_id=RUN, time_utc="2026-12-02T14:00:00", argv=[])  # no UTC offset
    with pytest.raises(ValidationError):
        ev.CandidateValidated(run_id=RUN, time_utc=T, candidate_id="c", passed=False, stage="vibes", reason="")
    assert ev.RunResumed(run_id=RUN, time_utc=ev.utc_now(), argv=[]).time_utc.endswith("+00:00")


def test_events_as_the_loop_writes_them():
    """The call shapes of agent/nodes.py, agent/run.py, agent/report.py and review/verify.py:
    plain dicts (model_dump() of their own models) must validate into the typed fields."""
    b = {"run_id": RUN, "time_utc": ev.utc_now()}
    change = {"file": "train.py", "line": 3, "kind": "precision_lost", "before": "bf16", "after": "fp32",
              "semantic_change": True, "note": ""}
    p = ev.PortApplied(**b, target="npu", changes=[change], diff="")
    assert p.changes[0].semantic_change is True
    base = ev.BaselineMeasured(**b, runs_ms=INC, losses=[1.0], flops_per_step=5, work_items_per_step=[4],
                               ops_per_step=None, median_ms=10.0, verdict="unknown", profile_path="p",
                               aa=AA.model_dump(), environment=ENV.model_dump())
    assert base.aa == AA and base.environment == ENV
    prop = ev.CandidateProposed(**b, candidate_id="c", intent_id=None, pattern="p", level="L0", gap_class="g",
                                source="recipe:r", mechanism="m", hypothesis=HYP, diff="", files=[], incumbent="port")
    assert prop.hypothesis.ops_removed == HYP["ops_removed"]
    m = ev.CandidateMeasured(**b, candidate_id="c", incumbent_runs_ms=INC, candidate_runs_ms=CAND,
                             comparison=COMP.model_dump(), note="", problems=[])
    assert m.comparison == COMP
    e2e = {"runs_ms": {"port": INC, "final": CAND, "compiled_port": []}, "final_vs_port": COMP.model_dump()}
    fin = ev.RunFinished(**b, final_speedup=COMP.speedup, final_ci=[COMP.ci_low, COMP.ci_high],
                         compiled_port_speedup=None, final_vs_compiled=None, accepted=[], rejected=["c"],
                         done_reason="", report_path="r.md", end_to_end=e2e)
    assert fin.end_to_end.final_vs_port == COMP and fin.final_ci == (COMP.ci_low, COMP.ci_high)
    ev.VerifyResult(**b, recorded_speedup=None, measured_speedup=1.0, ci=[0.9, 1.1], holds=False,
                    port_runs_ms=INC, final_runs_ms=CAND)
    ev.CandidateValidated(**b, candidate_id="c", passed=False, stage="apply", reason="declined")


# ------------------------------------------------------------ crash safety ----
def test_each_append_is_on_disk_before_it_returns(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    for i, e in enumerate(one_of_each(), start=1):
        led.append(e)
        with open(led.path) as f:  # a separate reader while the ledger is still in use
            lines = f.read().splitlines()
        assert len(lines) == i and ev.parse_event(lines[-1]) == e


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    events = one_of_each()[:3]
    for e in events:
        led.append(e)
    half = events[0].model_dump_json()[:40]
    with open(led.path, "a") as f:
        f.write(half)  # the process died mid-write
    with pytest.warns(UserWarning, match="truncated"):
        assert led.events() == events
    # a resumed run cuts the fragment off before it appends: a torn line is only ever the last one
    with pytest.warns(UserWarning, match="cutting a torn last line"):
        led.append(events[1])
    assert led.path.read_text().count("\n") == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert led.events() == [*events, events[1]]


def test_a_damaged_line_before_the_end_is_an_error_naming_it_never_a_silent_drop(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    events = one_of_each()[:4]
    for e in events:
        led.append(e)
    lines = led.path.read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # half a line lost in the middle of the file
    led.path.write_text("\n".join(lines) + "\n")
    with pytest.raises(LedgerError, match=r"ledger.jsonl:3: a damaged line"):
        led.events()
    with pytest.warns(UserWarning, match=":3: skipping a damaged line"):
        assert Ledger(led.path, salvage=True).events() == [events[0], events[1], events[3]]


def test_fields_a_newer_version_wrote_are_ignored_and_a_newer_schema_is_refused(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    first = one_of_each()[0]
    data = json.loads(first.model_dump_json())
    led.path.write_text(json.dumps({**data, "added_later": 1}) + "\n")
    with pytest.warns(UserWarning, match="ignoring fields this version does not know: .*added_later"):
        assert led.events() == [first]
    assert "ledger_schema_version" in data
    led.path.write_text(json.dumps({**data, "ledger_schema_version": 99}) + "\n")
    with pytest.raises(LedgerError, match="ledger schema 99.*upgrade"):
        led.events()


def test_a_complete_but_invalid_line_is_an_error(tmp_path):
    led = Ledger(tmp_path / "ledger.jsonl")
    led.append(one_of_each()[1])
    with open(led.path, "a") as f:
        f.write(json.dumps({"event": "run_resumed", "run_id": RUN}) + "\n")
    with pytest.raises(LedgerError, match="ledger.jsonl:2"):
        led.events()


def test_only_events_are_appended(tmp_path):
    with pytest.raises(TypeError):
        Ledger(tmp_path / "l.jsonl").append(ev.PortChangeRecord(file="f", line=1, kind="k", before="", after=""))


def test_missing_ledger_reads_empty(tmp_path):
    led = Ledger(tmp_path / "none" / "ledger.jsonl")
    assert led.events() == [] and led.candidates() == [] and led.final_state().n_events == 0


# --------------------------------------------------------------- folding ----
def folded_ledger(tmp_path) -> Ledger:
    b = {"run_id": RUN, "time_utc": T}
    led = Ledger(tmp_path / "ledger.jsonl")
    started, *_ = one_of_each()
    led.append(started)

    def propose(cid, pattern):
        led.append(ev.CandidateProposed(**b, candidate_id=cid, intent_id=f"i-{cid}", pattern=pattern, level="L1",
                                        gap_class="fusion", source=f"recipe:{pattern}", mechanism="m",
                                        hypothesis=ev.HypothesisRecord(**HYP), diff="", files=["train.py"]))
    propose("c01-fuse", "rmsnorm")
    led.append(ev.CandidateValidated(**b, candidate_id="c01-fuse", passed=True, stage="work", reason="ok"))
    led.append(ev.CandidateMeasured(**b, candidate_id="c01-fuse", incumbent_runs_ms=INC, candidate_runs_ms=CAND,
                                    comparison=COMP))
    led.append(ev.CandidateDecided(**b, candidate_id="c01-fuse", decision="accepted", reason=COMP.reason,
                                   incumbent_speedup_vs_baseline=COMP.speedup))
    propose("c02-sdpa", "attention")
    led.append(ev.CandidateValidated(**b, candidate_id="c02-sdpa", passed=False, stage="correctness",
                                     reason="step 3: candidate loss 0 [cached]"))
    led.append(ev.CandidateDecided(**b, candidate_id="c02-sdpa", decision="rejected",
                                   reason="correctness: step 3: candidate loss 0 [cached]"))
    propose("c03-noise", "adamw")
    noise = compare(INC, INC, n_boot=200)
    led.append(ev.CandidateMeasured(**b, candidate_id="c03-noise", incumbent_runs_ms=INC, candidate_runs_ms=INC,
                                    comparison=noise))
    led.append(ev.CandidateDecided(**b, candidate_id="c03-noise", decision="rejected", reason=noise.reason))
    propose("c04-open", "gelu")
    return led


def test_candidates_fold_into_one_summary_each(tmp_path):
    cands = {c.candidate_id: c for c in folded_ledger(tmp_path).candidates()}
    assert list(cands) == ["c01-fuse", "c02-sdpa", "c03-noise", "c04-open"]
    c1, c2, c3, c4 = cands.values()
    assert (c1.decision, c1.pattern, c1.level, c1.intent_id) == ("accepted", "rmsnorm", "L1", "i-c01-fuse")
    assert c1.speedup == COMP.speedup and c1.ci == (COMP.ci_low, COMP.ci_high) and c1.validated
    assert (c2.decision, c2.stage, c2.validated, c2.speedup) == ("rejected", "correctness", False, None)
    assert c2.reason.startswith("correctness:")
    assert c3.decision == "rejected" and "does not clear" in c3.reason
    assert c4.decision == "pending" and c4.speedup is None


def test_final_state(tmp_path):
    led = folded_ledger(tmp_path)
    st = led.final_state()
    assert (st.run_id, st.target, st.incumbent_id) == (RUN, "cpu", "c01-fuse")
    assert st.accepted == ["c01-fuse"] and st.rejected == ["c02-sdpa", "c03-noise"] and st.pending == ["c04-open"]
    assert st.incumbent_speedup_vs_baseline == COMP.speedup and not st.finished and st.verified is None
    led.append(one_of_each()[9])
    led.append(one_of_each()[10])
    st = led.final_state()
    assert st.finished and st.final_speedup == 1.1 and st.final_ci == (1.05, 1.15) and st.verified is True
    assert st.last_event == "verify_result"


# ------------------------------------------------------------------ view ----
def test_table_renders_ids_decisions_and_reasons_verbatim(tmp_path):
    led = folded_ledger(tmp_path)
    led.append(one_of_each()[9])
    console = Console(record=True, width=240)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        render_ledger(led, console)
    text = console.export_text()
    for cid in ("c01-fuse", "c02-sdpa", "c03-noise", "c04-open"):
        assert cid in text
    assert text.count("accepted") >= 1 and text.count("rejected") >= 2 and "pending" in text
    assert "[cached]" in text  # markup-like text in a reason is shown, not interpreted
    assert f"{COMP.speedup:.3f}x [{COMP.ci_low:.3f}, {COMP.ci_high:.3f}]" in text
    assert "final vs port: 1.100x [1.050, 1.150]" in text
