"""The loop's repair path on the real graph: a model's rejected candidate goes back to the
model with its failure, under ids minted from the planned one, until the repair budget ends.

The rewriter is scripted (source `llm:scripted`): every program it writes fails to parse,
so each attempt is rejected at the cheapest stage and nothing is timed but the baseline.
"""

import time

from trainbridge.agent.context import RunContext
from trainbridge.agent.graph import build_graph
from trainbridge.agent.rewriters.base import Proposal
from trainbridge.agent.state import RunConfig, RunPaths
from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger
from trainbridge.measure.acceptance import MAX_LOOP_REPAIRS, Rule
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"


class ScriptedModel:
    can_repair = True

    def __init__(self):
        self.calls: list[tuple[str, str | None]] = []

    @property
    def transcript(self) -> list:
        return []

    def transcript_json(self) -> str:
        return "[]"

    def _broken(self, files):
        return Proposal(source="llm:scripted", files={**files, "train.py": files["train.py"] + "\ndef (:\n"},
                        changed_files=["train.py"], description="d", mechanism="m")

    def propose(self, item, files, target, context):
        self.calls.append(("propose", None))
        return self._broken(files)

    def repair(self, item, files, target, context, previous, failure):
        self.calls.append(("repair", failure))
        return self._broken(files)


def test_a_models_failed_candidate_is_repaired_under_minted_ids_until_the_budget_ends(tmp_path):
    cfg = RunConfig(run_id="repair", workload=str(MINIGPT), budget_candidates=1, baseline_runs=4, timing_pairs=1,
                    collect=False, compare_compile=False)
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir()
    ledger = Ledger(paths.ledger)
    model = ScriptedModel()
    ctx = RunContext(cfg=cfg, workload=load_workload(MINIGPT), paths=paths, ledger=ledger, rewriter=model)
    final = build_graph().invoke({"run_dir": str(paths.root), "started_at": time.time(), "incumbent_speedup": 1.0},
                                 context=ctx)

    decided = [e for e in ledger.events() if isinstance(e, ev.CandidateDecided)]
    first = decided[0].candidate_id
    ids = [d.candidate_id for d in decided]
    assert ids == [first] + [f"{first}-r{n}" for n in range(1, MAX_LOOP_REPAIRS + 1)]
    assert all(d.decision == "rejected" and d.rule == Rule.FAILED_VALIDATION.value for d in decided)
    assert [d.reason.endswith(f"(sent back for repair as {first}-r{n + 1})") for n, d in enumerate(decided)] == \
        [True] * MAX_LOOP_REPAIRS + [False]
    assert [c[0] for c in model.calls] == ["propose"] + ["repair"] * MAX_LOOP_REPAIRS
    assert all(f.startswith("parse: does not parse") for _, f in model.calls[1:])
    assert final["candidates"] == ids and final["rejected"] == ids and final.get("accepted", []) == []
