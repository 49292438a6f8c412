"""Each defence of docs/measurement_integrity.md, tried with the attack it stops.

Candidates are written as edits of the ported minigpt fixture and go through the same
`validate` the loop uses; every one of them must come back rejected, at the stage named.
"""


import pytest

from trainbridge.agent.evaluate import reference_run, validate
from trainbridge.measure.timing import candidate_session
from trainbridge.harness.runner import port_sources
from trainbridge.measure.statistics import compare
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"
FILE = "train.py"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    wl = load_workload(MINIGPT)
    port, _ = port_sources(wl, "cpu")
    out = tmp_path_factory.mktemp("integrity")
    ref = reference_run(wl, "cpu", port, out, seed=1337, label="ref")
    assert ref.status == "ok", ref.error
    return wl, port, ref, out


def _edit(port, old, new, count=1):
    text = port[FILE]
    assert old in text, old
    return {**port, FILE: text.replace(old, new, count)}


def _validate(setup, candidate):
    wl, port, ref, out = setup
    verdict, _ = validate(wl, "cpu", original=port, candidate=candidate, changed=[FILE], baseline_ref=ref,
                          out_dir=out, seed=1337, low_precision=False, ops_removed=[])
    return verdict


def test_legitimate_rewrite_passes(setup):
    _, port, _, _ = setup
    # the same math written differently: x*x -> x.pow(2)
    cand = _edit(port, "(hidden * hidden).mean(dim=-1, keepdim=True)", "hidden.pow(2).mean(-1, keepdim=True)")
    v = _validate(setup, cand)
    assert v.passed, v.reason


def test_candidate_that_breaks_correctness(setup):
    _, port, _, _ = setup
    cand = _edit(port, "torch.rsqrt(variance + self.eps)", "torch.rsqrt(variance + 0.5)")
    v = _validate(setup, cand)
    # the region check sees it first and names the function; the loss trajectory would too
    assert not v.passed and v.stage == "lab" and "RMSNorm.forward" in v.reason, v


def test_smaller_batch_is_skipped_work(setup):
    _, port, _, _ = setup
    cand = _edit(port, "        x, y = get_batch(gen)\n", "        x, y = get_batch(gen)\n        x, y = x[:2], y[:2]\n")
    v = _validate(setup, cand)
    assert not v.passed and v.stage in ("work", "correctness"), v
    assert v.stage == "work" or "loss" in v.reason


def test_fewer_layers_is_refused(setup):
    _, port, _, _ = setup
    cand = _edit(port, "for _ in range(n_layers)]", "for _ in range(n_layers - 1)]")
    v = _validate(setup, cand)
    # the guard sees the layer list shrink; were it missed, the loss and FLOP checks would not
    assert not v.passed and v.stage in ("guard", "correctness", "work"), v


def test_early_return_in_forward_is_refused(setup):
    _, port, _, _ = setup
    cand = _edit(port, "        h = h + self.attn(self.n1(h))\n", "        h = h + self.attn(self.n1(h))\n        return h\n")
    v = _validate(setup, cand)
    assert not v.passed and v.stage == "guard" and "early_return" in v.reason


def test_cached_output_is_refused(setup):
    _, port, _, _ = setup
    cand = _edit(port, "        return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))",
                 "        loss = F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))\n"
                 "        self.__dict__.setdefault('_cached', loss.detach().requires_grad_())\n"
                 "        return self._cached")
    v = _validate(setup, cand)
    assert not v.passed and v.stage in ("guard", "correctness"), v


def test_protected_region_edits_are_refused(setup):
    _, port, _, _ = setup
    v = _validate(setup, _edit(port, "torch.randint(1, 4,", "torch.randint(1, 2,"))  # inside get_batch
    assert not v.passed and v.stage == "guard" and "get_batch" in v.reason
    v = _validate(setup, {FILE: port[FILE] + "\nbatch_size = 2\n"})
    assert not v.passed and v.stage == "guard" and "batch_size" in v.reason


def test_reseeding_and_timer_patching_are_refused(setup):
    _, port, _, _ = setup
    v = _validate(setup, {FILE: port[FILE].replace("def main():\n", "def main():\n    torch.manual_seed(1)\n")})
    assert not v.passed and "seed" in v.reason
    v = _validate(setup, {FILE: port[FILE].replace("import torch\n", "import torch\nimport time\ntime.perf_counter = lambda: 0.0\n", 1)})
    assert not v.passed and "monkeypatch" in v.reason


def test_silent_fallback_is_refused(setup):
    _, port, _, _ = setup
    old = "        probs = F.softmax(scores, dim=-1)\n"
    new = ("        try:\n            probs = torch.special.softmax(scores, dim=-1)\n"
           "        except Exception:\n            probs = F.softmax(scores, dim=-1)\n")
    v = _validate(setup, _edit(port, old, new))
    assert not v.passed and v.stage == "guard" and "silent_fallback" in v.reason


def test_non_editable_file_is_refused(setup):
    _, port, _, _ = setup
    v = _validate(setup, {**port, "trainbridge.toml": "name = 'x'\n"})
    assert not v.passed and v.stage == "guard"


def test_same_program_against_itself_is_not_accepted(setup):
    wl, port, _, out = setup
    # 4 pairs: each program goes first twice (A B, B A, A B, B A), so an order effect cancels.
    # What is asserted is that the harness favours neither arm, not the rule's error rate: on this
    # tiny program a whole process runs fast or slow (run medians 3.6-8.0 ms for one program here, each
    # run's own steps within ~15%), so at the loop's 95% an A/A session is accepted about 2% of the
    # time by chance (one CI run saw 1.267x [1.186, 1.353]). At 99.9% chance alone fails this test
    # about once in 2000; an arm favoured by 40% in every round (spread as in that run) still fails it.
    # The rule's real false-accept rate is measured by benchmarks/calibration.py.
    session = candidate_session(wl, "cpu", incumbent=port, candidate=port, pairs=4, out_dir=out, seed=1337)
    inc, cand = session.pair("incumbent", "candidate")
    assert not session.problems and len(inc) == len(cand) == 4
    comp = compare(inc, cand, min_effect=0.02, confidence=0.999)
    assert comp.decision == "reject", comp.reason
    assert comp.ci_low <= 1.02


def _validate_compiled(setup, candidate):
    wl, port, ref, out = setup
    verdict, _ = validate(wl, "cpu", original=port, candidate=candidate, changed=[FILE], baseline_ref=ref,
                          out_dir=out, seed=1337, low_precision=False, ops_removed=[], compiled_region=True)
    return verdict


def test_compiling_a_function_outside_the_step_is_refused_before_timing(setup):
    # A real false accept on the noisy VM: torch.compile of an initialisation function, timed
    # at "1.43x". It cannot make a step faster, and the mechanism check says so without timing.
    _, port, _, _ = setup
    cand = _edit(port, "class Model(nn.Module):", "@torch.compile(backend=\"eager\")\n"
                 "def _init_scale(w):\n    return w * 1.0\n\n\nclass Model(nn.Module):")
    cand = {**cand, FILE: cand[FILE].replace("def main():\n", "def main():\n    _init_scale(torch.ones(3))\n", 1)}
    v = _validate_compiled(setup, cand)
    assert not v.passed and v.stage == "mechanism" and "only before the first forward" in v.reason, v


def test_compiled_region_without_any_compile_is_refused(setup):
    _, port, _, _ = setup
    v = _validate_compiled(setup, _edit(port, "(hidden * hidden).mean(dim=-1, keepdim=True)",
                                        "hidden.pow(2).mean(-1, keepdim=True)"))
    assert not v.passed and v.stage == "mechanism" and "nothing compiled" in v.reason, v


def test_compiled_region_on_the_step_passes(setup):
    _, port, _, _ = setup
    cand = _edit(port, "    def forward(self, hidden):", "    @torch.compile(backend=\"eager\")\n    def forward(self, hidden):")
    v = _validate_compiled(setup, cand)
    assert v.passed and v.details["mechanism_confirmed"], v


def _validate_precision(setup, candidate, direction):
    wl, port, ref, out = setup
    verdict, _ = validate(wl, "cpu", original=port, candidate=candidate, changed=[FILE], baseline_ref=ref,
                          out_dir=out, seed=1337, low_precision=True, ops_removed=[], gemm_precision=direction)
    return verdict


def test_precision_change_that_reaches_no_gemm_is_refused_before_timing(setup):
    # An "autocast on the target" whose region encloses no matmul: same work in fp32, so any
    # timing difference could only be noise. The GEMM dtypes of the op count say so.
    _, port, _, _ = setup
    cand = _edit(port, 'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):',
                 'with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=False):')
    v = _validate_precision(setup, cand, "lower")
    assert not v.passed and v.stage == "mechanism" and "16-bit GEMM/convolution ops per step 0/" in v.reason, v


def test_autocast_on_the_target_moves_the_gemms_to_bf16(setup):
    _, port, ref, _ = setup
    cand = _edit(port, 'with torch.autocast(device_type="cuda", dtype=torch.bfloat16):',
                 'with torch.autocast(device_type="cpu", dtype=torch.bfloat16):')
    v = _validate_precision(setup, cand, "lower")
    assert v.passed and v.details["mechanism_confirmed"], v
    n = sum(ref.ops_per_step.gemm_by_dtype.values())
    assert n > 0 and ref.ops_per_step.gemm_by_dtype == {"float32": n}
    # the same program claimed as a move *to* fp32 is refused: its 16-bit GEMMs did not fall
    v = _validate_precision(setup, cand, "higher")
    assert not v.passed and v.stage == "mechanism", v


def test_a_failed_timing_run_drops_its_whole_pair(setup):
    # The paired run-level interval compares incumbent run k with candidate run k: a lone
    # surviving run of a broken pair would be paired with a run of another pair.
    wl, port, _, out = setup
    broken = _edit(port, "def main():\n", "def main():\n    raise RuntimeError('deliberate')\n")
    session = candidate_session(wl, "cpu", incumbent=port, candidate=broken, pairs=2, out_dir=out, seed=1337)
    inc, cand = session.pair("incumbent", "candidate")
    assert inc == [] and cand == [] and len(session.problems) == 2 and all("dropped" in p for p in session.problems)


def _timed_check(ref, wl):
    from trainbridge.measure.timed_runs import timed_run_problem

    c = wl.manifest.correctness

    def check(rnd):
        return timed_run_problem(rnd["candidate"], rnd["incumbent"], ref.losses, loss_steps=c.steps,
                                 rtol_fp32=c.fp32_rtol, rtol_low_precision=c.low_precision_rtol, low_precision=False)
    return check


def test_a_candidate_that_cheats_only_when_timed_is_caught_in_its_timed_runs(setup):
    # It reads its own command line, which names the harness request: `validate-...` while it is
    # checked, `candidate-...` while it is timed; it halves its batch only then.
    from trainbridge.measure.timing import candidate_session

    wl, port, ref, out = setup
    cheat = _edit(port, "        x, y = get_batch(gen)\n",
                  "        x, y = get_batch(gen)\n"
                  "        if b'candidate-' in open('/proc/self/cmdline', 'rb').read():\n"
                  "            x, y = x[:2], y[:2]\n")
    v = _validate(setup, cheat)
    assert v.passed or v.stage == "mechanism", v  # validation alone cannot see it: it behaves there
    honest = candidate_session(wl, "cpu", incumbent=port, candidate=port, pairs=1, out_dir=out, seed=1337,
                               check=_timed_check(ref, wl))
    assert honest.violation is None and honest.rounds_kept == 1, honest.violation
    caught = candidate_session(wl, "cpu", incumbent=port, candidate=cheat, pairs=2, out_dir=out, seed=1337,
                               check=_timed_check(ref, wl))
    assert caught.violation and "work items" in caught.violation and "when it is timed" in caught.violation
    assert caught.rounds_kept == 0 and len(caught.orders) == 1, "the session stops at the first bad round"


def test_a_candidate_that_changes_its_math_after_the_validated_steps_is_caught_in_its_timed_runs(setup):
    # Validation compares K = 6 steps; from step 7 on this candidate drops the final norm. Its
    # first K timed losses match the reference; the later ones miss the incumbent's run of the
    # same round.
    wl, port, ref, out = setup
    late = _edit(port, "        x, y = get_batch(gen)\n",
                 "        x, y = get_batch(gen)\n"
                 "        if step == 6:\n"
                 "            model.norm = nn.Identity()\n")
    v = _validate(setup, late)
    # its K compared steps are the port's; validation's op- and FLOP-count steps after them are
    # held to the baseline's same steps too, and there it has already dropped the norm
    assert not v.passed and v.stage == "correctness" and "under the op and FLOP counters" in v.reason, v
    caught = candidate_session(wl, "cpu", incumbent=port, candidate=late, pairs=1, out_dir=out, seed=1337,
                               check=_timed_check(ref, wl))
    assert caught.violation and "over all 15 timed steps" in caught.violation, caught.violation
    assert "incumbent's run of the same round" in caught.violation
