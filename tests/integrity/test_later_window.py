"""Near-identity deletions against the later-window check (measure.later_window).

capgpt's softcap sits on a zero-initialised head and its learning rate warms up, so deleting
the softcap or the final norm passes the first-window loss check: each test shows that first,
then that the same candidate is refused from the baseline's trained state.
"""

import re

import pytest

from trainbridge.agent.evaluate import later_window_shape, reference_run, train_baseline_state, validate
from trainbridge.harness.runner import port_sources
from trainbridge.measure.later_window import PLUGIN, read_report
from trainbridge.harness.runner import run_workload
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

CAPGPT = FIXTURES / "integrity" / "capgpt"
FILE = "train.py"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    wl = load_workload(CAPGPT)
    port, _ = port_sources(wl, "cpu")
    out = tmp_path_factory.mktemp("later")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    c = wl.manifest.correctness
    warmup, steps = later_window_shape(wl)
    window = train_baseline_state(wl, "cpu", port, out / "baseline", seed=1337, trained_steps=c.trained_steps,
                                  warmup_steps=warmup, steps=steps)
    return wl, port, ref, window, out


def _edit(port, old, new):
    assert old in port[FILE], old
    return {**port, FILE: port[FILE].replace(old, new, 1)}


def _validate(setup, candidate, *, later: bool):
    wl, port, ref, window, out = setup
    verdict, _ = validate(wl, "cpu", original=port, candidate=candidate, changed=[FILE], baseline_ref=ref,
                          out_dir=out / "cand", seed=1337, low_precision=False, ops_removed=[],
                          later_window=window if later else None)
    return verdict


def test_the_trained_state_is_trained_and_reloads_to_the_same_losses(setup):
    wl, port, ref, window, out = setup
    # trained: its losses are well below the first window's (ln 64 = 4.16 at initialisation)
    assert max(window.baseline_losses) < 0.6 * ref.losses[0], (window.baseline_losses, ref.losses)
    again = _validate(setup, port, later=True)
    assert again.passed, again.reason  # (no operators named: the mechanism check has nothing to hold it to)
    assert "after 40 steps" in again.details["later_window"] and "rel diff 0.00e+00" in again.details["later_window"]


@pytest.mark.parametrize("old,new,what", [
    ("logits = cap * torch.tanh(logits / cap)", "logits = logits", "softcap"),
    ("self.head(rms_norm(x))", "self.head(x)", "final norm"),
])
def test_deleting_a_near_identity_op_passes_the_first_window_but_not_the_trained_one(setup, old, new, what):
    _, port, _, _, _ = setup
    cand = _edit(port, old, new)
    first = _validate(setup, cand, later=False)
    assert first.passed, f"{what}: the first window alone should miss it ({first.reason})"
    v = _validate(setup, cand, later=True)
    assert not v.passed and v.stage == "later_window", v
    assert "after 40 steps" in v.reason and "fp32 tolerance" in v.reason


def test_a_legitimate_rewrite_passes_the_trained_window(setup):
    _, port, _, _, _ = setup
    v = _validate(setup, _edit(port, "x.pow(2).mean(-1, keepdim=True)", "(x * x).mean(dim=-1, keepdim=True)"),
                  later=True)
    assert v.passed and "later-window" in v.reason, v
    v = _validate(setup, _edit(port, "lr=lr, weight_decay=0.0)", "lr=lr, weight_decay=0.0, foreach=False)"),
                  later=True)
    # the optimizer's own options stay (foreach=False runs); the moments come from the trained state
    assert v.passed, v


def _renamed_head(port):
    cand = port
    for old, new in [("self.head = nn.Linear", "self.unembed = nn.Linear"), ("nn.init.zeros_(self.head.weight)",
                     "nn.init.zeros_(self.unembed.weight)"), ("self.head(rms_norm(x))", "self.unembed(rms_norm(x))")]:
        cand = _edit(cand, old, new)
    return cand


def test_a_candidate_whose_model_does_not_take_the_state_is_refused(setup):
    _, port, _, _, _ = setup
    cand = _renamed_head(port)
    assert _validate(setup, cand, later=False).stage != "later_window"
    v = _validate(setup, cand, later=True)
    assert not v.passed and v.stage == "later_window" and "does not take the trained state" in v.reason, v
    assert "unembed" in v.reason


def test_a_candidate_that_swallows_the_load_error_is_still_refused(setup):
    _, port, _, _, _ = setup
    # the load runs in the root module's forward pre-hook: a try/except around the first call
    # catches it, and the program goes on from initialisation; the plugin's report still names it
    cand = _edit(_renamed_head(port), "        loss = model(x, y)\n",
                 "        try:\n            loss = model(x, y)\n"
                 "        except RuntimeError:\n            loss = model(x, y)\n")
    v = _validate(setup, cand, later=True)
    assert not v.passed, v
    assert v.stage == "guard" or (v.stage == "later_window" and "does not take the trained state" in v.reason), v


def test_the_save_run_reports_the_step_it_saved_at(setup, tmp_path):
    wl, port, _, _, _ = setup
    state = tmp_path / "s.pt"
    run = run_workload(wl, "cpu", out_dir=tmp_path, label="save", sources=port, warmup_steps=0, measured_steps=3,
                       seed=1, plugins=[PLUGIN], plugin_options={"mode": "save", "out": str(state), "after_step": "2"})
    assert run.status == "ok", run.error
    report = read_report(run.plugin_outputs["trained_state"])
    assert report.saved_at_step == 2 and state.exists()


def test_the_window_runs_a_timed_runs_steps():
    """capgpt: 2 warm-up + 6 measured steps a timed run; `later_steps = 3` alone would compare 3."""
    wl = load_workload(CAPGPT)
    assert wl.manifest.correctness.later_steps == 3
    assert later_window_shape(wl) == (2, 6)


# Counts its own forward calls and drops the softcap from the 4th on: past the 3 steps
# `later_steps` names, inside the 8 a timed run has. From the seed the softcap is near the
# identity, so the timed runs' loss checks cannot see it either.
COUNTED = ("        logits = cap * torch.tanh(logits / cap)\n",
           "        _forwards[0] += 1\n"
           "        if _forwards[0] <= 3:\n"
           "            logits = cap * torch.tanh(logits / cap)\n")


def test_a_deletion_that_waits_past_the_later_steps_is_caught_in_a_window_of_timed_length(setup):
    wl, port, ref, window, out = setup
    cand = _edit(port, *COUNTED)
    cand = _edit(cand, "def rms_norm(", "_forwards = [0]\n\n\ndef rms_norm(")
    assert window.compared_steps == 8
    v = _validate(setup, cand, later=True)
    assert not v.passed and v.stage == "later_window", v
    assert "after 40 steps" in v.reason, v.reason
    assert int(re.search(r"step (\d+)", v.reason).group(1)) >= 4, v.reason  # where the softcap went
    # the window `later_steps` alone gives (3 steps, no warm-up) would have passed it
    short = train_baseline_state(wl, "cpu", port, out / "short", seed=1337, trained_steps=40, steps=3)
    verdict, _ = validate(wl, "cpu", original=port, candidate=cand, changed=[FILE], baseline_ref=ref,
                          out_dir=out / "short-cand", seed=1337, low_precision=False, ops_removed=[],
                          later_window=short)
    assert verdict.passed, verdict.reason
