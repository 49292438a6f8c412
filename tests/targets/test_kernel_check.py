"""The kernel check: a PyTorch replacement against the Triton kernel itself, on a CPU.

The kernels are this suite's own (tests/kits/triton_programs.py), in the records' forms. The check
must pass a correct replacement and fail subtly wrong ones (a missing factor 2, a transposed
result), or it vouches for nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.kits.triton_programs import GRAM_KERNELS, NEWTON_SCHULZ_SCRIPT, TRITON_KERNELS_FILE

from trainbridge.targets.kernel_check import CheckRequest, check_proposed, run_checks
from trainbridge.targets.kernels import cases, nvrtc_reference
from trainbridge.targets.kernels.catalog import CheckCase
from trainbridge.targets.kernels.compare import compare
from trainbridge.targets.kernels.extract import extract
from trainbridge.targets.kernels.scan import scan_file
from trainbridge.targets.shims import shim_source

SMALL_RELU2 = [CheckCase(builder="linear_relu_square", params={"rows": 64, "dim": 64, "hidden": 64}, name="forward"),
               CheckCase(builder="linear_relu_square", params={"rows": 64, "dim": 64, "hidden": 64, "backward": True},
                         name="backward", seed=1)]

RELU2_RIGHT = """
import torch
def linear_relu_square(a, b, aux=None):
    c = (a @ b.T).to(torch.bfloat16)
    if aux is None:
        return c, c.relu().square()
    return 2 * c * aux.relu()
"""
RELU2_NO_FACTOR_2 = RELU2_RIGHT.replace("return 2 * c * aux.relu()", "return c * aux.relu()")
RELU2_TRANSPOSED = RELU2_RIGHT.replace("return c, c.relu().square()", "return c.T, c.T.relu().square()")


def _gram_program() -> str:
    return "import torch\nimport triton\nimport triton.language as tl\n" + GRAM_KERNELS


def test_fingerprint_forgets_names_comments_and_decorators_but_not_the_math():
    base = scan_file(_gram_program(), "k.py").kernels[0].fingerprint
    renamed = (_gram_program().replace("acc", "accumulator").replace("rows", "offs_m").replace("xi", "x_block")
               .replace("_gram_kernel", "gram_kernel_v2").replace("    for k0", "    # blocks of K\n\n    for k0"))
    autotuned = _gram_program().replace("@triton.jit", '@triton.autotune(configs=[], key=["M"])\n@triton.jit')
    assert scan_file(renamed, "k.py").kernels[0].fingerprint == base
    assert scan_file(autotuned, "k.py").kernels[0].fingerprint == base
    doubled = _gram_program().replace("acc * alpha + x", "acc * alpha * 2 + x")
    assert scan_file(doubled, "k.py").kernels[0].fingerprint != base


def test_extract_takes_the_launcher_closure_and_no_training_code():
    modules = extract({"train_gpt.py": NEWTON_SCHULZ_SCRIPT}, "train_gpt.py", ["XXT"])
    text = modules["train_gpt"]
    assert "def _gram_kernel" in text and "def _gram_configs" in text and "def XXT" in text
    assert "configs=_tb_one_config(_gram_configs())" in text  # the interpreter cannot autotune
    for training in ("model = nn.Sequential", "for step in range", "def newton_schulz", "device = "):
        assert training not in text
    compile(text, "train_gpt.py", "exec")


def test_nvrtc_replacement_matches_the_independent_reference_and_a_wrong_one_does_not():
    shim = {}
    exec(compile(shim_source("kernels"), "_tb_kernels.py", "exec"), shim)
    for n_predict in (3, 1):
        want, got = cases.ce_fwd_bwd(0, rows=24, vocab=200, n_predict=n_predict), \
            cases.ce_fwd_bwd(0, rows=24, vocab=200, n_predict=n_predict)
        nvrtc_reference.ce_fwd_bwd(*want.args)
        shim["ce_fwd_bwd"](*got.args)
        for name in ("losses", "grad_input"):
            assert compare("c", name, got.watch[name], want.watch[name]).passed, name
    wrong = cases.ce_fwd_bwd(0, rows=24, vocab=200)
    want = cases.ce_fwd_bwd(0, rows=24, vocab=200)
    nvrtc_reference.ce_fwd_bwd(*want.args)
    args = list(wrong.args)
    args[-1] = args[-1] * 2  # grad_scale applied twice
    shim["ce_fwd_bwd"](*args)
    assert not compare("c", "grad_input", wrong.watch["grad_input"], want.watch["grad_input"]).passed


def test_interpreter_needs_and_gets_gpu_bf16_numerics(tmp_path):
    pytest.importorskip("triton")
    script = tmp_path / "dot.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, triton, triton.language as tl
        @triton.jit
        def k(x_ptr, y_ptr, N: tl.constexpr):
            o = tl.arange(0, N)
            a = tl.load(x_ptr + o[:, None] * N + o[None, :])
            r = tl.maximum(tl.dot(a, a).to(tl.bfloat16), 0.0)
            tl.store(y_ptr + o[:, None] * N + o[None, :], r * r)
        x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        want = (x.float() @ x.float()).to(torch.bfloat16).relu().square()
        if sys.argv[1] == "patched":
            from trainbridge.targets.kernels.interp_numerics import install
            install()
        y = torch.empty_like(x)
        k[(1,)](x, y, 16)
        print((y.float() - want.float()).abs().max().item())
    """))
    env = dict(os.environ, TRITON_INTERPRET="1")
    errs = {}
    for mode in ("plain", "patched"):
        proc = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        errs[mode] = float(proc.stdout.split()[-1])
    assert errs["patched"] == 0.0
    assert not errs["plain"] < 1.0  # the unpatched interpreter multiplies bf16 bit patterns


def test_check_passes_the_right_replacement_and_fails_a_missing_factor_or_a_transpose(tmp_path):
    pytest.importorskip("triton")
    reqs = [CheckRequest(file="triton_kernels.py", launcher="linear_relu_square", replacement_attr="linear_relu_square",
                         replacement_source=src, cases=SMALL_RELU2)
            for src in (RELU2_RIGHT, RELU2_NO_FACTOR_2, RELU2_TRANSPOSED)]
    right, no_factor, transposed = run_checks({"triton_kernels.py": TRITON_KERNELS_FILE}, reqs, tmp_path / "cache")
    assert right.passed, right.reason
    assert right.kernel_ran and "interpreter" in right.against and right.max_rel < 0.02
    assert not no_factor.passed and "case backward" in no_factor.reason and no_factor.max_rel > 0.3
    assert not transposed.passed and "case forward" in transposed.reason
    again = check_proposed(TRITON_KERNELS_FILE, "linear_relu_square", RELU2_RIGHT, cases=SMALL_RELU2,
                           file="triton_kernels.py", cache_dir=tmp_path / "cache")
    assert again.passed and again.cached and again.cache_key == right.cache_key


def test_check_reports_a_replacement_that_raises(tmp_path):
    pytest.importorskip("triton")
    broken = "def linear_relu_square(a, b, aux=None):\n    raise RuntimeError('not written yet')\n"
    res = check_proposed(TRITON_KERNELS_FILE, "linear_relu_square", broken, cases=SMALL_RELU2[:1],
                         file="triton_kernels.py")
    assert not res.passed and "replacement raised" in res.reason and "not written yet" in res.reason


def test_proposed_replacement_with_its_own_cases(tmp_path):
    """The extension point: a kernel the catalog does not know, a replacement and cases as text."""
    pytest.importorskip("triton")
    kernel = ("import torch\nimport triton\nimport triton.language as tl\n\n@triton.jit\n"
              "def _axpy(x_ptr, y_ptr, n, a, B: tl.constexpr):\n"
              "    o = tl.program_id(0) * B + tl.arange(0, B)\n"
              "    m = o < n\n"
              "    tl.store(y_ptr + o, tl.load(y_ptr + o, mask=m) + a * tl.load(x_ptr + o, mask=m), mask=m)\n\n"
              "def axpy(x, y, a):\n    _axpy[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), a, B=64)\n")
    case_text = ("import torch\nfrom trainbridge.targets.kernels.cases import Case\n"
                 "def axpy_case(seed, n=300):\n    g = torch.Generator().manual_seed(seed)\n"
                 "    y = torch.randn(n, generator=g)\n    return Case(args=(torch.randn(n, generator=g), y, 0.5), "
                 "watch={'y': y})\n")
    good = check_proposed(kernel, "axpy", "def axpy(x, y, a):\n    y.add_(x, alpha=a)\n",
                          cases=[CheckCase(builder="axpy_case")], cases_source=case_text)
    bad = check_proposed(kernel, "axpy", "def axpy(x, y, a):\n    y.add_(x)\n",
                         cases=[CheckCase(builder="axpy_case")], cases_source=case_text)
    assert good.passed and good.entry is None, good.reason
    assert not bad.passed and "arg:y" in bad.reason


def test_compare_tolerates_rounding_but_not_a_factor_of_two():
    want = torch.randn(64, 64).to(torch.bfloat16)
    one_ulp = (want.float() * (1 + 2 ** -8)).to(torch.bfloat16)
    assert compare("c", "x", one_ulp, want).passed
    assert not compare("c", "x", want * 2, want).passed
    assert not compare("c", "x", want.float(), want).passed  # a dtype change is a failure, not a rounding


def test_without_triton_the_check_says_it_cannot_run(monkeypatch, tmp_path):
    import trainbridge.targets.kernel_check as kc

    real = kc.importlib.util.find_spec
    monkeypatch.setattr(kc.importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    res = check_proposed(TRITON_KERNELS_FILE, "linear_relu_square", RELU2_RIGHT, cases=SMALL_RELU2,
                         file="triton_kernels.py", cache_dir=tmp_path)
    assert not res.passed and "Triton is not installed" in res.reason
    assert not list(tmp_path.iterdir())  # nothing cached: the replacement was not judged
