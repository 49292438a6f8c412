"""Dropout under a compiled region: judged on its math (harness `eager_random_streams`).

dropgpt uses dropout 0.2. Compiled, Inductor draws its own random numbers, so a compiled
block's losses drift from eager's at once, whatever its math; with Inductor's fallback_random
the compiled region draws eager's masks and the losses agree.
"""

import pytest

from trainbridge.agent.evaluate import random_ops, reference_run, validate
from trainbridge.harness.runner import port_sources, run_workload
from trainbridge.measure.correctness import compare_losses
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

DROPGPT = FIXTURES / "loop" / "dropgpt"
FILE = "train.py"
COMPILED_BLOCK = ("    def forward(self, x):\n        x = x + self.attn(self.ln_1(x))\n",
                  "    @torch.compile\n    def forward(self, x):\n        x = x + self.attn(self.ln_1(x))\n")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    wl = load_workload(DROPGPT)
    port, _ = port_sources(wl, "cpu")
    out = tmp_path_factory.mktemp("random")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    assert COMPILED_BLOCK[0] in port[FILE]
    cand = {**port, FILE: port[FILE].replace(*COMPILED_BLOCK, 1)}
    return wl, port, cand, ref, out


def test_the_models_random_ops_are_detected(setup):
    *_, ref, _ = setup
    assert "bernoulli_ x" in random_ops(ref) or "native_dropout x" in random_ops(ref)


def test_a_compiled_block_with_dropout_passes_validation_on_its_math(setup):
    wl, port, cand, ref, out = setup
    v, run = validate(wl, "cpu", original=port, candidate=cand, changed=[FILE], baseline_ref=ref, out_dir=out,
                      seed=1337, low_precision=False, ops_removed=[], compiled_region=True)
    assert v.passed, v.reason
    assert run.environment.eager_random_streams and "fallback_random" in v.details["random_ops"]


def test_without_eager_random_streams_the_same_block_misses_the_loss(setup):
    # the control: the failure the loop saw before (a compiled region's own random numbers)
    wl, port, cand, _, out = setup
    k = wl.manifest.correctness.steps
    runs = [run_workload(wl, "cpu", out_dir=out / "own-rng", label=label, sources=files, warmup_steps=0,
                         measured_steps=k, seed=1337, eager_random_streams=False)
            for label, files in (("eager", port), ("compiled", cand))]
    assert all(r.status == "ok" for r in runs), [r.error for r in runs]
    assert not runs[1].environment.eager_random_streams
    c = wl.manifest.correctness
    loss = compare_losses(runs[0].losses, runs[1].losses, rtol_fp32=c.fp32_rtol,
                          rtol_low_precision=c.low_precision_rtol, low_precision=False, steps=k)
    assert not loss.passed, loss.reason
