"""A single-file trainer in another house style (dropgpt: attention through torch.baddbmm with
a triu mask and masked_fill, a hand-written tanh GELU, dropout 0.2): the recipe library
realises its attention and activation intents, and each candidate passes the loop's own
validation (loss, work, mechanism) on the cpu target. Issue 19 reported both missed."""

import pytest

from trainbridge.agent.evaluate import reference_run, validate
from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable
from trainbridge.harness.runner import port_sources
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

DROPGPT = FIXTURES / "loop" / "dropgpt"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    wl = load_workload(DROPGPT)
    port, _ = port_sources(wl, "cpu")
    out = tmp_path_factory.mktemp("house")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    return wl, port, ref, out


@pytest.mark.parametrize("recipe,site", [("sdpa_attention", "SelfAttention.forward"), ("gelu_fused", "new_gelu")])
def test_the_recipe_realises_the_intent_and_passes_validation(baseline, recipe, site):
    wl, port, ref, out = baseline
    r = RECIPES[recipe]
    proposal = r.apply(port, "cpu")
    assert not isinstance(proposal, NotApplicable), proposal
    assert [s.qualname for s in proposal.sites] == [site]
    v, run = validate(wl, "cpu", original=port, candidate=proposal.files, changed=proposal.changed_files,
                      baseline_ref=ref, out_dir=out / recipe, seed=1337, low_precision=False,
                      ops_removed=r.ops_removed)
    assert v.passed, v.reason
    assert v.details["mechanism_confirmed"], v.details
