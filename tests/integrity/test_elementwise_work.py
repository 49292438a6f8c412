"""Deleted elementwise work against work conservation's elementwise count (measure.work).

A wide-vocabulary copy of capgpt (vocabulary 1024, width 32): the logits are most of the
step's elementwise work, so its tanh softcap is a third of it. The head starts at zero, so
deleting the softcap passes the first-window loss check; the FLOPs, which count matrix
products only, do not move. The elementwise count refuses it on the validation run alone
(no trained window), and a fused rewrite of the same program passes.
"""

import shutil

import pytest

from trainbridge.agent.evaluate import reference_run, validate
from trainbridge.harness.runner import port_sources
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

FILE = "train.py"
NARROW = "batch_size, seq_len, vocab, width, n_layers = 8, 32, 64, 64, 2"
WIDE = "batch_size, seq_len, vocab, width, n_layers = 8, 32, 1024, 32, 2"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("widecap") / "widecap"
    shutil.copytree(FIXTURES / "integrity" / "capgpt", folder)
    source = (folder / FILE).read_text()
    assert NARROW in source
    (folder / FILE).write_text(source.replace(NARROW, WIDE))
    wl = load_workload(folder)
    port, _ = port_sources(wl, "cpu")
    out = tmp_path_factory.mktemp("runs")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    return wl, port, ref, out


def _validate(setup, old, new):
    wl, port, ref, out = setup
    assert old in port[FILE], old
    cand = {**port, FILE: port[FILE].replace(old, new, 1)}
    verdict, run = validate(wl, "cpu", original=port, candidate=cand, changed=[FILE], baseline_ref=ref,
                            out_dir=out / "cand", seed=1337, low_precision=False, ops_removed=[])
    return verdict, run


def test_deleting_a_softcap_that_is_a_third_of_the_step_is_refused_as_deleted_work(setup):
    _, _, ref, _ = setup
    v, run = _validate(setup, "logits = cap * torch.tanh(logits / cap)", "logits = logits")
    assert not v.passed and v.stage == "work", v
    assert "elementwise work per step fell" in v.reason and "tanh" in v.reason and "work was deleted" in v.reason
    # what the other checks saw: the FLOPs unchanged, the first-window losses within tolerance
    assert run.flops_per_step == ref.flops_per_step
    assert "loss" not in v.reason.split("elementwise")[0]


def test_a_fused_rewrite_of_the_same_program_keeps_its_elementwise_work(setup):
    v, run = _validate(setup, "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)",
                       "return F.rms_norm(x, (x.shape[-1],), eps=eps)")
    assert v.passed, v.reason
    base = setup[2].elementwise_per_step.total
    assert f"elementwise work {base:,} -> {run.elementwise_per_step.total:,}" in v.details["work"]
    assert 0.9 < run.elementwise_per_step.total / base < 1.3
