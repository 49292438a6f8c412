"""`trainbridge run --agent llm` against a scripted OpenAI-compatible server on 127.0.0.1:
model-written candidates go through the same validation and measurement as recipes."""

import os
import subprocess
import sys
from pathlib import Path

from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger

try:
    from fakes.openai_server import FakeOpenAIServer
except ImportError:
    from tests.fakes.openai_server import FakeOpenAIServer

MINIGPT = Path(__file__).parent / "fixtures" / "loop" / "minigpt"
KEY = "sk-loop-SECRET-77aa"


def _answer(edits=None, recipe=None):
    return {"intent_addressed": "scripted", "mechanism": "scripted mechanism", "level": "L2",
            "hypothesis": {"ops_removed": ["aten::mul"], "predicted_saving_pct": 3.0, "reject_if": "no speedup"},
            "recipe": recipe, "edits": edits or []}


RMS_OLD = "        variance = (hidden * hidden).mean(dim=-1, keepdim=True)\n" \
          "        return hidden * torch.rsqrt(variance + self.eps) * self.weight\n"
RMS_NEW = "        return F.rms_norm(hidden, (hidden.size(-1),), self.weight, self.eps)\n"
LOSS_OLD = "return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))"
LOSS_NEW = "return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1)) * 0.5"


def test_llm_candidates_are_validated_and_measured_like_recipes(tmp_path):
    script = [
        _answer(recipe="autocast_reapply"),                                        # c01: a recipe by name
        _answer([{"file": "train.py", "search": "no such text", "replace": "x"}]),  # c02: does not apply ...
        _answer([{"file": "train.py", "search": RMS_OLD, "replace": RMS_NEW}]),     # ... repaired
        _answer([{"file": "train.py", "search": LOSS_OLD, "replace": LOSS_NEW}]),   # c03: changes the loss
    ] + ["garbage"] * 12
    with FakeOpenAIServer(script, model="fake-coder") as srv:
        runs = tmp_path / "runs"
        proc = subprocess.run(
            [sys.executable, "-m", "trainbridge.cli", "run", str(MINIGPT), "--agent", "llm", "--model", "fake-coder",
             "--base-url", srv.base_url, "--budget", "3", "--pairs", "2", "--baseline-runs", "4", "--skip-collect",
             "--no-compile-compare", "--runs-root", str(runs)],
            capture_output=True, text=True, timeout=600, env={**os.environ, "OPENAI_API_KEY": KEY},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = next(runs.iterdir())
    events = list(Ledger(run_dir / "ledger.jsonl").events())
    proposed = [e for e in events if isinstance(e, ev.CandidateProposed)]
    assert proposed and all(e.source.startswith("llm:fake-coder") for e in proposed)
    assert all(e.llm for e in proposed), "every model candidate carries its request/answer record"
    measured = {e.candidate_id for e in events if isinstance(e, ev.CandidateMeasured)}
    validated = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateValidated)}
    decided = {e.candidate_id: e for e in events if isinstance(e, ev.CandidateDecided)}
    # the recipe-by-name candidate and the repaired RMSNorm edit were validated, then timed
    assert all(validated[p.candidate_id].passed for p in proposed if p.candidate_id in measured)
    assert len(measured) >= 2
    # the loss edit never reaches the clock
    loss = [p for p in proposed if "* 0.5" in p.diff]
    assert loss and loss[0].candidate_id not in measured
    assert not validated[loss[0].candidate_id].passed and decided[loss[0].candidate_id].decision == "rejected"
    # the key is never written anywhere in the run folder
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".md", ".log", ".diff"):
            assert KEY not in path.read_text(errors="replace"), path
