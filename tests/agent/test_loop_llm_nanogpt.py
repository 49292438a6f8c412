"""Issue 5's done-when: `trainbridge run workloads/nanogpt --agent llm` against a scripted
OpenAI-compatible server on 127.0.0.1. The model's candidates (a recipe chosen by name, an
edit that does not apply and its repair, an edit of the loss) go through the same
validation and measurement as recipe candidates, and land in the same ledger.

The program is nanogpt's own `train_gpt.py`, unchanged; only the manifest's `args` are
made smaller (2 layers, width 64, seq 64, 5 measured steps, small shards) so the loop fits in a CI minute or two.
"""

import os
import subprocess
import sys

from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger

from tests.kits.openai_server import FakeOpenAIServer
from tests.kits.small_workloads import NANOGPT, small_nanogpt

KEY = "sk-nanogpt-SECRET-31cc"

# The repair must remove operators, or the mechanism check rightly stops it before the clock:
# F.rms_norm, say, decomposes on the CPU into the same ATen ops as the hand-written norm.
# torch.lerp does the value residual's rsub, two muls and add as one op (and in backward).
LERP_OLD = "        v = (1 - self.lamb) * v + self.lamb * v1.view_as(v)  # value residual (record 9)\n"
LERP_NEW = "        v = torch.lerp(v, v1.view_as(v), self.lamb)  # value residual (record 9)\n"
LOSS_OLD = "return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))"
LOSS_NEW = "return 0.5 * F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))"


def _answer(edits=None, recipe=None, mechanism="scripted"):
    return {"intent_addressed": "scripted", "mechanism": mechanism, "level": "L2",
            "hypothesis": {"ops_removed": ["aten::mul"], "predicted_saving_pct": 3.0, "reject_if": "no speedup"},
            "recipe": recipe, "edits": edits or []}


def test_llm_run_on_nanogpt_validates_and_measures_model_candidates(tmp_path):
    assert LERP_OLD in (NANOGPT / "train_gpt.py").read_text() and LOSS_OLD in (NANOGPT / "train_gpt.py").read_text()
    work = small_nanogpt(tmp_path)
    script = [
        _answer(recipe="sdpa_attention", mechanism="fused attention"),                     # c01: recipe by name
        _answer([{"file": "train_gpt.py", "search": "no such text", "replace": "x"}]),     # c02: does not apply
        _answer([{"file": "train_gpt.py", "search": LERP_OLD, "replace": LERP_NEW}]),      # ... its repair
        _answer([{"file": "train_gpt.py", "search": LOSS_OLD, "replace": LOSS_NEW}]),      # c03: edits the loss
    ] + ["not json at all"] * 12
    runs = tmp_path / "runs"
    with FakeOpenAIServer(script, model="fake-coder") as srv:
        proc = subprocess.run(
            [sys.executable, "-m", "trainbridge.cli", "run", str(work), "--agent", "llm", "--model", "fake-coder",
             "--base-url", srv.base_url, "--budget", "3", "--pairs", "1", "--looks", "1", "--baseline-runs", "4",
             "--skip-collect",
             "--no-compile-compare", "--runs-root", str(runs)],
            capture_output=True, text=True, timeout=900, env={**os.environ, "OPENAI_API_KEY": KEY, "TRAINBRIDGE_LLM_BACKOFF_S": "0.01"},
        )
        requests = list(srv.requests)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(requests) >= 4, "the loop asked the model once per candidate, plus the repair"
    run_dir = next(runs.iterdir())
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    proposed = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateProposed)}
    validated = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateValidated)}
    measured = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateMeasured)}
    decided = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateDecided)}
    assert proposed and all(p.source.startswith("llm:fake-coder") for p in proposed.values())
    assert all(p.llm for p in proposed.values()), "every model candidate carries its request/answer record"

    sdpa = [c for c, p in proposed.items() if "scaled_dot_product_attention" in p.diff]
    lerp = [c for c, p in proposed.items() if "torch.lerp" in p.diff]
    loss = [c for c, p in proposed.items() if "0.5 * F.cross_entropy" in p.diff]
    assert sdpa and lerp and loss, sorted(proposed)
    # the recipe the model chose and the repaired edit pass correctness, then are timed
    # with the same interleaved pairs as any recipe candidate, and get a decision from them
    for cid in (sdpa[0], lerp[0]):
        assert validated[cid].passed, validated[cid]
        assert cid in measured and measured[cid].comparison.n_runs_candidate >= 1
        assert decided[cid].decision in ("accepted", "rejected")
    # the loss edit fails validation and never reaches the clock
    assert not validated[loss[0]].passed and loss[0] not in measured
    assert decided[loss[0]].decision == "rejected"
    # the API key never reaches the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".md", ".log", ".diff", ".txt"):
            assert KEY not in path.read_text(errors="replace"), path
