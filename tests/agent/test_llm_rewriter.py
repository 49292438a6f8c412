"""LLMRewriter against a real local HTTP server that replays scripted OpenAI answers."""

from __future__ import annotations

import importlib.util
import json
import logging
import time

import pytest

from trainbridge.agent.guard import check_candidate
from trainbridge.agent.planner import Hypothesis, PlanItem
from trainbridge.agent.rewriters.base import Declined, Proposal
from trainbridge.agent.rewriters.edits import Edit, EditError, apply_edits
from trainbridge.agent.rewriters.llm import LLMRewriter, WithFallback
from trainbridge.agent.rewriters.recipe_rewriter import RecipeRewriter
from trainbridge.agent.rewriters.recipes import RECIPES
from trainbridge.workload import ProtectedRegion

from tests.kits.openai_server import FakeOpenAIServer, Reply

pytestmark = [pytest.mark.timeout(60)] if importlib.util.find_spec("pytest_timeout") else []

KEY = "sk-test-SECRET-4f9a1c77e2"

PROGRAM = '''\
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size, seed, num_steps = 4, 0, 10


def rms_norm(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, y):
        h = rms_norm(self.lin(x))
        return F.cross_entropy(h, y)


def main():
    torch.manual_seed(seed)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(num_steps):
        x, y = torch.randn(batch_size, 16), torch.randint(0, 16, (batch_size,))
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
'''
FILES = {"train.py": PROGRAM}
OLD = "    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)\n"
NEW = "    return F.rms_norm(x, (x.size(-1),), None, eps)\n"
PROTECTED = [ProtectedRegion(file="train.py", symbols=["main"], names=["batch_size", "seed", "num_steps"],
                             reason="data, seed, step count")]


def item(recipe="rms_norm_fused", pattern="rms_norm") -> PlanItem:
    return PlanItem(key=recipe, recipe=recipe, pattern=pattern, level="L2", gap_class="fusion",
                    intent_id="i-rms-1", intent_summary="Inductor fused pow/mean/rsqrt/mul into one kernel",
                    confidence=0.8, score=1.0,
                    hypothesis=Hypothesis(ops_removed=["aten::pow", "aten::mean", "aten::rsqrt"],
                                          predicted_saving_ms=0.4, predicted_saving_pct=5.0,
                                          reject_if="no speedup or ops do not fall"))


def answer(edits=None, recipe=None, level="L2") -> dict:
    return {"intent_addressed": "i-rms-1: hand-written RMSNorm", "mechanism": "fused RMSNorm operator",
            "level": level, "hypothesis": {"ops_removed": ["aten::pow", "aten::mean", "aten::rsqrt"],
                                           "predicted_saving_pct": 4.0, "reject_if": "ops do not fall"},
            "recipe": recipe, "edits": edits if edits is not None else []}


GOOD = answer([{"file": "train.py", "search": OLD, "replace": NEW}])


@pytest.fixture
def server():
    srv = FakeOpenAIServer(model="fake-coder", hang_s=8.0).start()
    yield srv
    srv.stop()


def make(srv, **kw) -> LLMRewriter:
    kw.setdefault("timeout_s", 5)
    kw.setdefault("max_retries", 2)
    return LLMRewriter("fake-coder", base_url=srv.base_url, api_key=KEY, backoff_s=0.01, max_backoff_s=0.05, **kw)


def test_good_rewrite_returns_exact_new_file(server):
    server.push(GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {"history": ["sdpa_attention: rejected, loss left tolerance"]})
    assert isinstance(p, Proposal), p
    assert p.source == "llm:fake-coder"
    assert p.files == {"train.py": PROGRAM.replace(OLD, NEW)}
    assert p.changed_files == ["train.py"]
    assert p.ops_removed == ["aten::pow", "aten::mean", "aten::rsqrt"]
    assert not p.low_precision
    # what was sent: the schema, the prompts, the program, the history; the key only as the bearer token
    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.body["model"] == "fake-coder"
    assert req.body["response_format"]["type"] == "json_schema"
    assert req.messages[0]["role"] == "system" and "One mechanism" in req.messages[0]["content"]
    user = req.messages[1]["content"]
    assert "def rms_norm(x, eps=1e-6):" in user and "F.rms_norm" not in PROGRAM
    assert "sdpa_attention: rejected, loss left tolerance" in user
    assert "torch.nn.functional.rms_norm" in user  # the cpu operator catalog
    assert "rms_norm_fused" in user  # the recipe library
    assert req.headers["authorization"] == f"Bearer {KEY}"
    (ex,) = rw.transcript
    assert ex.outcome == "applied" and ex.prompt_tokens == 120 and ex.completion_tokens == 40
    assert ex.response_model == "fake-coder" and ex.latency_ms > 0


def test_malformed_then_good_is_retried(server):
    server.push("Sure! Here is my plan: use a fused norm.", {"edits": "not a list"}, GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal), p
    assert [x.outcome for x in rw.transcript] == ["invalid_answer", "invalid_answer", "applied"]
    assert "no JSON object" in rw.transcript[0].error
    assert "schema" in rw.transcript[1].error
    # the retry tells the model what was wrong
    assert "could not be used" in server.requests[1].messages[-1]["content"]


def test_fenced_json_is_parsed_when_the_server_ignores_the_schema(server):
    server.push("Here you go:\n```json\n" + json.dumps(GOOD) + "\n```\nDone.")
    p = make(server).propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal) and p.files["train.py"] == PROGRAM.replace(OLD, NEW)


def test_edit_that_does_not_apply_is_repaired_with_the_exact_failure(server):
    bad = answer([{"file": "train.py", "search": "    return x * torch.rsqrt(x.square().mean(-1) + eps)\n",
                   "replace": NEW}])
    with pytest.raises(EditError) as err:
        apply_edits(FILES, [Edit(**bad["edits"][0])])
    failure = str(err.value)
    assert "train.py" in failure and "x.square()" in failure
    server.push(bad, GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal), p
    assert p.files["train.py"] == PROGRAM.replace(OLD, NEW)
    assert [x.kind for x in rw.transcript] == ["propose", "repair"]
    assert rw.transcript[0].outcome == "apply_failed" and rw.transcript[0].error == failure
    repair_text = server.requests[1].messages[-1]["content"]
    assert failure in repair_text
    assert server.requests[1].messages[-2]["role"] == "assistant"  # the previous answer, as the model's turn


def test_repairs_are_bounded(server):
    bad = answer([{"file": "train.py", "search": "no such line\n", "replace": "x = 1\n"}])
    server.push(bad, bad, bad, GOOD)
    rw = make(server, max_repairs=2)
    d = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(d, Declined) and "after 2 repair(s)" in d.reason and "not found" in d.reason
    assert len(server.requests) == 3


def test_public_repair_after_validation_failure(server):
    server.push(GOOD)
    rw = make(server)
    first = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(first, Proposal)
    failure = "validate: loss at step 3 is 2.91, outside tolerance 1e-3 of 2.87 (eps differs)"
    fix = answer([{"file": "train.py", "search": NEW, "replace": NEW.replace("eps)", "eps=eps)")}])
    server.push(fix)
    p = rw.repair(item(), FILES, "cpu", {}, previous=first, failure=failure)
    assert isinstance(p, Proposal), p
    assert p.files["train.py"] == PROGRAM.replace(OLD, NEW.replace("eps)", "eps=eps)"))
    req = server.requests[-1]
    assert failure in req.messages[-1]["content"]
    assert NEW.strip() in req.messages[-1]["content"]  # the candidate source the new edits apply to
    assert rw.transcript[-1].kind == "repair"


def test_loss_edit_is_refused_by_the_guard(server):
    cheat = answer([{"file": "train.py", "search": "        return F.cross_entropy(h, y)\n",
                     "replace": "        return h.sum() * 0.0\n"}])
    server.push(cheat)
    p = make(server).propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal)  # it applies and compiles: the guard is what refuses it
    verdict = check_candidate(FILES, p.files, PROTECTED, ["train.py"], "cpu")
    assert not verdict.passed and "loss_removed" in {v.rule for v in verdict.violations}


def test_guard_in_context_sends_violations_back_for_repair(server):
    cheat = answer([{"file": "train.py", "search": "batch_size, seed, num_steps = 4, 0, 10\n",
                     "replace": "batch_size, seed, num_steps = 4, 0, 2\n"}])
    server.push(cheat, GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {"protected": PROTECTED, "editable": ["train.py"]})
    assert isinstance(p, Proposal) and p.files["train.py"] == PROGRAM.replace(OLD, NEW)
    assert rw.transcript[0].outcome == "guard_failed"
    assert "protected_name" in server.requests[1].messages[-1]["content"]
    assert "assignments to batch_size, seed, num_steps" in server.requests[0].messages[1]["content"]


def test_429_then_200(server):
    server.push(429, GOOD)
    rw = make(server)
    t0 = time.monotonic()
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal)
    assert [x.outcome for x in rw.transcript] == ["rate_limited", "applied"]
    assert rw.transcript[0].http_status == 429 and "Retry-After 0" in rw.transcript[0].error
    assert time.monotonic() - t0 < 5


def test_5xx_exhausts_retries_then_declines(server):
    server.push(500, 502, 503)
    rw = make(server, max_retries=2)
    d = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(d, Declined) and "HTTP 503" in d.reason and "3 attempt(s)" in d.reason
    assert len(server.requests) == 3


def test_hanging_server_declines_with_timeout_in_bounded_time(server):
    server.push("hang", "hang")
    rw = make(server, timeout_s=0.5, max_retries=1)
    t0 = time.monotonic()
    d = rw.propose(item(), FILES, "cpu", {})
    elapsed = time.monotonic() - t0
    assert isinstance(d, Declined) and "time-out" in d.reason
    assert elapsed < 4, elapsed
    assert [x.outcome for x in rw.transcript] == ["timeout", "timeout"]


def test_broken_http_body_is_retried(server):
    server.push(Reply(body="<html>proxy error</html>", content_type="text/html"), GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal)
    assert rw.transcript[0].outcome in ("invalid_answer", "error")


def test_schema_rejected_by_server_falls_back_to_plain_json(server):
    server.push(400, GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal)
    assert "response_format" in server.requests[0].body and "response_format" not in server.requests[1].body


def test_recipe_by_name_maps_to_the_recipe_proposal(server):
    server.push(answer(recipe="rms_norm_fused"))
    p = make(server).propose(item(), FILES, "cpu", {})
    expected = RecipeRewriter().propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal) and isinstance(expected, Proposal)
    assert p.files == expected.files and p.changed_files == expected.changed_files
    assert p.mechanism == RECIPES["rms_norm_fused"].mechanism
    assert p.source == "llm:fake-coder+recipe:rms_norm_fused"


def test_unknown_recipe_is_repaired(server):
    server.push(answer(recipe="make_it_fast"), GOOD)
    rw = make(server)
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal)
    assert "no recipe named 'make_it_fast'" in server.requests[1].messages[-1]["content"]


def test_model_declines(server):
    server.push(answer())
    d = make(server).propose(item(), FILES, "cpu", {})
    assert isinstance(d, Declined) and "proposed no change" in d.reason


def test_with_fallback_uses_recipes_when_the_server_returns_garbage(server):
    server.push("garbage", "more garbage", "{not json", "still garbage")
    llm = make(server, max_retries=3)
    rw = WithFallback(llm, RecipeRewriter())
    p = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal), p
    assert p.source == "recipe:rms_norm_fused"
    assert any("fallback after the primary declined" in n for n in p.notes)
    assert len(server.requests) == 4 and rw.transcript is llm.transcript


def test_with_fallback_survives_a_raising_primary():
    class Boom:
        def propose(self, *a):
            raise RuntimeError("no endpoint")

    p = WithFallback(Boom(), RecipeRewriter()).propose(item(), FILES, "cpu", {})
    assert isinstance(p, Proposal) and "RuntimeError" in p.notes[-1]


def test_key_never_in_transcript_or_logs(server, caplog):
    caplog.set_level(logging.DEBUG)
    # a server that echoes the key back in an error and in an answer
    server.push(Reply(status=500, body=json.dumps({"error": {"message": f"bad key {KEY}"}})),
                f"your key is {KEY}", 401)
    rw = make(server, max_retries=3)
    d = rw.propose(item(), FILES, "cpu", {})
    assert isinstance(d, Declined) and "HTTP 401" in d.reason
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was used...
    dumped = json.dumps([x.model_dump() for x in rw.transcript])
    assert KEY not in dumped and KEY not in rw.transcript_json()  # ...and never recorded
    assert "[redacted]" in dumped
    assert KEY not in caplog.text and KEY not in d.reason and KEY not in repr(rw)


def test_key_from_environment_and_dummy_key(monkeypatch, server):
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.push(GOOD)
    rw = LLMRewriter("fake-coder", timeout_s=5, max_retries=0)
    assert isinstance(rw.propose(item(), FILES, "cpu", {}), Proposal)
    assert server.requests[0].headers["authorization"].startswith("Bearer ")


def test_repair_of_a_recipe_candidate_shows_its_diff(server):
    previous = RecipeRewriter().propose(item(), FILES, "cpu", {})
    assert isinstance(previous, Proposal)
    failure = "measure: speedup 0.98x, CI [0.95, 1.01] does not clear 1.02x"
    server.push(answer())  # the model gives up on the mechanism
    rw = WithFallback(make(server), RecipeRewriter())
    d = rw.repair(item(), FILES, "cpu", {}, previous=previous, failure=failure)
    assert isinstance(d, Declined) and "proposed no change" in d.reason
    last = server.requests[0].messages[-1]["content"]
    assert failure in last and "candidate/train.py" in last and "recipe:rms_norm_fused" in last


def test_cost_from_usage_and_base_url_without_v1(server):
    server.push(Reply(content=json.dumps(GOOD), usage={"prompt_tokens": 7, "completion_tokens": 3,
                                                       "total_tokens": 10, "cost": 0.00042}))
    rw = LLMRewriter("fake-coder", base_url=server.url, api_key=KEY, timeout_s=5, max_retries=0)
    assert isinstance(rw.propose(item(), FILES, "cpu", {}), Proposal)
    assert server.requests[0].path == "/chat/completions"
    ex = rw.transcript[0]
    assert (ex.prompt_tokens, ex.completion_tokens, ex.total_tokens, ex.cost) == (7, 3, 10, 0.00042)


def test_the_backoff_setting_is_read_and_a_bad_one_is_a_usage_error(monkeypatch, tmp_path):
    from trainbridge.agent.run import LLM_BACKOFF_ENV, llm_backoff_s, make_rewriter, start_run
    from trainbridge.agent.state import RunConfig

    monkeypatch.delenv(LLM_BACKOFF_ENV, raising=False)
    assert llm_backoff_s() == 1.0
    monkeypatch.setenv(LLM_BACKOFF_ENV, "0.25")
    cfg = RunConfig.model_construct(agent="llm", llm_model="m", llm_base_url="http://127.0.0.1:9/v1", run_id="x")
    assert make_rewriter(cfg).chat.backoff_s == 0.25
    for bad in ("soon", "-1", "nan"):
        monkeypatch.setenv(LLM_BACKOFF_ENV, bad)
        with pytest.raises(ValueError, match=LLM_BACKOFF_ENV):
            start_run(cfg, tmp_path / "runs")
        assert not (tmp_path / "runs").exists(), "no run folder for a usage error"
