"""GPU intents no candidate took up, each with why (a form no recipe knows, no recipe for the
pattern or the target, or a recipe that matched but the budget ended first)."""

import textwrap
from types import SimpleNamespace

from trainbridge.agent.coverage import unrealised_intents

PROGRAM = textwrap.dedent("""
    import math
    import torch
    import torch.nn.functional as F


    def attend(q, k, v):
        scores = q.unsqueeze(-2).mul(k.unsqueeze(-3)).sum(-1) / math.sqrt(q.size(-1))
        weights = scores.softmax(dim=-1)
        return weights.unsqueeze(-1).mul(v.unsqueeze(-3)).sum(-2)


    def act(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
""")


def _line(text):
    return next(i + 1 for i, line in enumerate(PROGRAM.splitlines()) if text in line)


def _intent(iid, pattern, first=None, last=None):
    spans = [{"file": "m.py", "start_line": first, "end_line": last or first}] if first else []
    return {"id": iid, "pattern": pattern, "spans": spans}


INTENTS = [
    _intent("attention@m.py", "attention", _line("scores ="), _line("return weights")),
    _intent("gelu@m.py", "gelu", _line("return 0.5 * x")),
    _intent("cross_entropy@m.py", "cross_entropy", 3),
    _intent("host_sync@m.py", "host_sync", 3),
    _intent("optimizer_update@adamw", "optimizer_update"),
]


def test_each_intent_left_over_says_why():
    proposed = [SimpleNamespace(intent_id="optimizer_update@adamw", pattern="optimizer_update")]
    got = {u.intent_id: u for u in unrealised_intents(INTENTS, proposed, {"m.py": PROGRAM}, "cpu",
                                                      done_reason="candidate budget (1) used")}
    assert set(got) == {"attention@m.py", "gelu@m.py", "cross_entropy@m.py", "host_sync@m.py"}
    attention = got["attention@m.py"]
    assert attention.spans == [f"m.py:{_line('scores =')}-{_line('return weights')}"]
    assert "no recipe recognised the code at m.py:" in attention.reason and "sdpa_attention" in attention.reason
    assert got["gelu@m.py"].reason == "gelu_fused matches these lines but was not tried: candidate budget (1) used"
    assert got["cross_entropy@m.py"].reason.startswith("no recipe realises cross_entropy yet")
    assert got["host_sync@m.py"].reason.startswith("no recipe for host_sync on cpu: a CPU runs each operator")


def test_a_pattern_a_candidate_took_up_is_not_listed_whatever_its_intent():
    proposed = [SimpleNamespace(intent_id=None, pattern="gelu"), SimpleNamespace(intent_id=None, pattern="attention")]
    got = unrealised_intents(INTENTS[:2], proposed, {"m.py": PROGRAM}, "cpu")
    assert got == []


def test_a_recipe_site_just_past_the_fused_lines_in_the_same_function_counts_as_theirs():
    """nanogpt: the evidence's attention is `att = ...` and `att.softmax` (lines 299-300), the
    recipe's site the statement it replaces, `y = att @ v` (301): one site, budget-ended."""
    src = textwrap.dedent("""
        import math
        import torch


        def attend(q, k, v):
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.softmax(dim=-1)
            y = att @ v
            return y
    """)
    first = next(i + 1 for i, line in enumerate(src.splitlines()) if "att = (q" in line)
    intent = {"id": "attention@m.py", "pattern": "attention",
              "spans": [{"file": "m.py", "start_line": first, "end_line": first + 1, "function": "attend"}]}
    (got,) = unrealised_intents([intent], [], {"m.py": src}, "cpu", done_reason="candidate budget (1) used")
    assert got.reason == "sdpa_attention matches these lines but was not tried: candidate budget (1) used", got
