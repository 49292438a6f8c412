"""The region check sees what the first K losses cannot: each function a candidate rewrote is
run against the original on fresh inputs taken from the program's own call.

The attacks edit the minigpt fixture's RMSNorm.forward. Two of them (a detached variance, a
larger eps) leave the 6-step loss trajectory inside its tolerance: only the region check
refuses them, and the tests assert both halves of that.
"""

import pytest

from trainbridge.agent.evaluate import reference_run, validate
from trainbridge.harness.runner import port_sources
from trainbridge.measure.correctness import compare_losses
from trainbridge.measure.region_check import changed_regions
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"
FILE = "train.py"
NORM = "        return hidden * torch.rsqrt(variance + self.eps) * self.weight\n"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    wl = load_workload(MINIGPT)
    port, _ = port_sources(wl, "cpu")
    assert NORM in port[FILE]
    out = tmp_path_factory.mktemp("region")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    return wl, port, ref, out


def _validate(setup, new_line):
    wl, port, ref, out = setup
    cand = {**port, FILE: port[FILE].replace(NORM, new_line)}
    v, run = validate(wl, "cpu", original=port, candidate=cand, changed=[FILE], baseline_ref=ref, out_dir=out,
                      seed=1337, low_precision=False, ops_removed=[])
    c = wl.manifest.correctness
    loss_alone = compare_losses(ref.losses, run.losses, rtol_fp32=c.fp32_rtol, rtol_low_precision=c.low_precision_rtol,
                                low_precision=False, steps=c.steps).passed
    return v, loss_alone


def test_the_same_math_written_differently_passes_with_its_region_checked(setup):
    v, _ = _validate(setup, NORM.replace("torch.rsqrt(variance + self.eps)", "(variance + self.eps).rsqrt()"))
    assert v.passed, v.reason
    assert "RMSNorm.forward" in v.details["regions"] and "trials on fresh inputs within float32" in v.details["regions"]


@pytest.mark.parametrize("name, new_line, why", [
    ("gradient cut", NORM.replace("variance + self.eps", "variance.detach() + self.eps"), "gradient cosine"),
    ("larger eps", NORM.replace("self.eps", "1e-2"), "forward error"),
])
def test_a_change_the_first_losses_miss_is_refused_by_the_region_check(setup, name, new_line, why):
    v, loss_alone = _validate(setup, new_line)
    assert loss_alone, f"{name}: the loss check alone already catches it; the test would not show the region check"
    assert not v.passed and v.stage == "lab" and "RMSNorm.forward" in v.reason and why in v.reason, v.reason


def test_a_deleted_norm_is_refused_naming_the_function(setup):
    v, _ = _validate(setup, "        return hidden * self.weight\n")
    assert not v.passed and v.stage == "lab" and "train.py:RMSNorm.forward" in v.reason, v.reason


def test_only_changed_functions_outside_the_training_loop_are_regions():
    original = {"t.py": "class N:\n    def forward(self, x):\n        return x * 2\n\n"
                        "def main(m, opt):\n    m.forward(1).backward()\n    opt.step()\n\n"
                        "def same(x):\n    return x\n"}
    candidate = {"t.py": original["t.py"].replace("x * 2", "x + x").replace("opt.step()", "opt.step()\n    pass")}
    regions = changed_regions(original, candidate, ["t.py"])
    assert [r.qualname for r in regions] == ["N.forward"]
    assert regions[0].original_source.startswith("def forward(self, x):")


def test_a_compiled_region_is_checked_as_the_python_it_compiles(setup):
    wl, port, ref, out = setup
    decorated = port[FILE].replace("    def forward(self, hidden):\n",
                                   "    @torch.compile\n    def forward(self, hidden):\n", 1)
    assert decorated != port[FILE]
    v, run = validate(wl, "cpu", original=port, candidate={**port, FILE: decorated}, changed=[FILE], baseline_ref=ref,
                      out_dir=out, seed=1337, low_precision=False, ops_removed=[], compiled_region=True)
    assert v.passed, v.reason
    assert "RMSNorm.forward" in v.details["regions"] and "trials on fresh inputs" in v.details["regions"]


ORTHOGONALIZE = '''def orthogonalize(G):
    X = G.bfloat16()
    X = X / (X.norm() + 1e-7)
    for _ in range(5):
        A = X @ X.T
        X = 3.4445 * X + (-4.7750 * A + 2.0315 * A @ A) @ X
    return X
'''


def test_a_compiled_bf16_iteration_is_checked_eagerly_even_when_first_called_from_compiled_code(tmp_path, monkeypatch):
    """Newton-Schulz in bf16, compiled: Inductor's bf16 result differs from eager's by more than
    bf16 precision, so a check that ran the compiled function (Dynamo traced the check itself when
    the first call came from a compiled frame) refused a rewrite that changed no math."""
    import json
    import sys

    import torch

    from trainbridge.measure.correctness import lab_check
    from trainbridge.measure.region_check import Region, RegionCheckPlugin

    def mk(gen):
        return [torch.randn(64, 32, generator=gen).requires_grad_(True)]

    namespace: dict = {"torch": torch}
    exec(ORTHOGONALIZE, namespace)
    eager = namespace["orthogonalize"]
    compiled = torch.compile(eager, dynamic=False)
    assert not lab_check(eager, compiled, mk, dtype=torch.float32).passed, \
        "Inductor now matches eager here: the test no longer shows a compiled run reaching the check"

    (tmp_path / "prog.py").write_text("import torch\n\n\n@torch.compile(dynamic=False)\n" + ORTHOGONALIZE)
    (tmp_path / "regions.json").write_text(json.dumps([Region(
        file="prog.py", qualname="orthogonalize", original_source=ORTHOGONALIZE).model_dump()]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = RegionCheckPlugin({"regions_path": str(tmp_path / "regions.json"), "out": str(tmp_path / "out.json")})
    plugin.before_program()
    try:
        import prog
        prog.orthogonalize(torch.randn(64, 32))
    finally:
        plugin.finalize("ok")
        sys.modules.pop("prog", None)
    [result] = json.loads((tmp_path / "out.json").read_text())
    assert result["checked"] and result["passed"], result["reason"]
