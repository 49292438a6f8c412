"""Porting a program's Triton kernels to the catalog's PyTorch replacements, checked first.

The programs are this suite's own, in the records' forms (tests/kits/triton_programs.py): a script
with autotuned symmetric-matmul kernels for Newton-Schulz, and a main script importing a
`triton_kernels.py` with a fused linear + ReLU^2 autograd.Function, a softcapped cross-entropy
with a backward kernel and a `torch.library.custom_op` launcher. Their kernels are not the
records', so the catalog used here is the real one plus the same entries vouching for these
kernels' fingerprints; the check then runs the real replacements against these kernels.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.kits import triton_programs as tp

from trainbridge.targets.features.triton_kernels import port
from trainbridge.targets.kernels.catalog import BY_ID, ENTRIES, CatalogEntry, CheckCase
from trainbridge.targets.kernels.scan import scan_program
from trainbridge.targets.port_source import port_naive

pytestmark = pytest.mark.skipif(__import__("importlib").util.find_spec("triton") is None,
                                reason="the check runs the kernels in Triton's interpreter")

SCRIPT = {"train_gpt.py": tp.NEWTON_SCHULZ_SCRIPT}
EXTRA_FILE = {"train_gpt.py": tp.MAIN_WITH_EXTRA_FILE, "triton_kernels.py": tp.TRITON_KERNELS_FILE}
ENTRY_OF = {"XXT": "symmetric_xxt", "gram_op": "symmetric_xxt", "ba_plus_cAA": "symmetric_ba_plus_caa",
            "linear_relu_square": "linear_relu_square", "FusedSoftcappedCrossEntropy": "softcapped_cross_entropy"}
SMALL = {
    "symmetric_xxt": [CheckCase(builder="xxt", params={"shape": [64, 96]}),
                      CheckCase(builder="xxt", params={"shape": [2, 40, 72]}, seed=1, name="batched")],
    "symmetric_ba_plus_caa": [CheckCase(builder="ba_plus_caa", params={"shape": [64, 64]})],
    "linear_relu_square": [CheckCase(builder="linear_relu_square", params={"rows": 64, "dim": 64, "hidden": 128}),
                           CheckCase(builder="linear_relu_square", name="backward", seed=1,
                                     params={"rows": 64, "dim": 64, "hidden": 128, "backward": True})],
    "softcapped_cross_entropy": [CheckCase(builder="softcapped_ce", params={"rows": 32, "vocab": 96})],
}


def catalog_for(files: dict[str, str], **replacements: str) -> list[CatalogEntry]:
    """The real catalog, plus its entries vouching for this program's kernels (small cases);
    `replacements` swaps an entry's replacement (to see a wrong one refused)."""
    extra = {}
    for lau in scan_program(files).launchers:
        base = BY_ID[ENTRY_OF[lau.name]]
        e = extra.setdefault(base.id, base.model_copy(update={"id": f"test_{base.id}", "kernel_fingerprints": {},
                                                              "cases": SMALL[base.id]}))
        e.kernel_fingerprints.update({fp: "this suite's kernel" for fp in lau.fingerprints})
        if base.id in replacements:
            e.replacement = replacements[base.id]
    return list(extra.values()) + ENTRIES


def _imports_triton(text: str) -> bool:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "triton" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
            return True
        if isinstance(node, ast.Name) and node.id in ("triton", "tl"):
            return True
    return False


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernel-checks")


@pytest.fixture(scope="module")
def ported(cache):
    return {"script": port(SCRIPT, "cpu", cache_dir=cache, catalog=catalog_for(SCRIPT)),
            "extra": port(EXTRA_FILE, "cpu", cache_dir=cache, catalog=catalog_for(EXTRA_FILE))}


def test_known_launchers_replaced_after_their_checks_and_no_triton_left(ported):
    for name, launchers in (("script", {"XXT", "ba_plus_cAA"}),
                            ("extra", {"linear_relu_square", "FusedSoftcappedCrossEntropy", "gram_op"})):
        res = ported[name]
        assert res.blockers == []
        replaced = [c for c in res.changes if c.kind == "kernel_replaced" and "check test_" in c.note]
        assert {next(n for n in launchers if n in c.before) for c in replaced} == launchers
        assert all(" passed: max abs err" in c.note for c in replaced)
        assert "_tb_kernels.py" in res.files
        for file, text in res.files.items():
            assert not _imports_triton(text), file
            assert "@triton" not in text and "_kernel[" not in text
    script = ported["script"].files["train_gpt.py"]
    assert "XXT = _tb_kernels.xxt" in script and "ba_plus_cAA = _tb_kernels.ba_plus_caa" in script
    assert "_gram_configs" not in script  # the autotune configs went with the kernel
    assert "Running Triton version {'none (Triton kernels replaced by PyTorch)'}" in script
    kernels = ported["extra"].files["triton_kernels.py"]
    assert "FusedSoftcappedCrossEntropy = _tb_kernels.SoftcappedCrossEntropy" in kernels
    assert "class FusedLinearReLUSquareFunction" in kernels  # not a launcher: kept, now calling the shim
    # the custom op keeps its registration; only its body calls the replacement
    assert '@torch.library.custom_op("tbtest::gram", mutates_args={"out"})' in kernels
    assert "    _tb_kernels.xxt(A, out)\n" in kernels
    assert "renamed" in next(c.note for c in ported["extra"].changes if "gram_op" in c.before)


def _run(folder: Path, interpret: bool) -> subprocess.CompletedProcess:
    runner = folder / "_run.py"
    runner.write_text(textwrap.dedent("""
        import os, runpy, sys
        sys.path.insert(0, os.getcwd())
        if os.environ.get("TRITON_INTERPRET") == "1":
            from trainbridge.targets.kernels.interp_numerics import install
            install()
        else:
            sys.modules["triton"] = None  # a target without Triton: any import of it fails
        sys.argv = ["train_gpt.py"]
        runpy.run_path("train_gpt.py", run_name="__main__")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "triton" and sys.modules[m] is not None)
        print("triton modules loaded:", loaded)
    """))
    env = dict(os.environ, TRITON_INTERPRET="1" if interpret else "0", OMP_NUM_THREADS="2")
    return subprocess.run([sys.executable, "_run.py"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)


def _losses(out: str) -> list[float]:
    return [float(line.split("loss:")[1]) for line in out.splitlines() if line.startswith("step:")]


def test_ported_programs_run_on_cpu_without_triton_and_train_like_the_kernels(ported, tmp_path):
    for name in ("script", "extra"):
        folder = tmp_path / name
        folder.mkdir()
        for file, text in port_naive(ported[name].files, "cpu").files.items():  # devices, torch.compile
            (folder / file).write_text(text)
        proc = _run(folder, interpret=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "done" in proc.stdout and "triton modules loaded: []" in proc.stdout
        assert len(_losses(proc.stdout)) == 3
    # the same program with the original kernels, run by the interpreter: the same losses
    original = tmp_path / "original"
    original.mkdir()
    for file, text in port_naive(EXTRA_FILE, "cpu").files.items():
        (original / file).write_text(text)
    want = _run(original, interpret=True)
    assert want.returncode == 0, want.stderr[-3000:]
    got = _run(tmp_path / "extra", interpret=False)
    assert _losses(got.stdout) == pytest.approx(_losses(want.stdout), rel=2e-2)
    assert got.stdout.splitlines()[0] == want.stdout.splitlines()[0].replace(
        want.stdout.splitlines()[0].split("version ")[1], "none (Triton kernels replaced by PyTorch)")


def test_unknown_kernel_is_a_blocker_and_stays(cache):
    files = {"train_gpt.py": "import torch\nfrom triton_kernels import scaled_copy\n",
             "triton_kernels.py": tp.UNKNOWN_KERNELS}
    res = port(files, "cpu", cache_dir=cache)
    assert len(res.blockers) == 1
    b = res.blockers[0]
    assert (b.file, b.line) == ("triton_kernels.py", 6)
    assert "_scaled_copy_kernel" in b.construct and "scaled_copy" in b.construct and "no catalog entry" in b.reason
    assert res.files == files  # nothing half-ported


def test_changed_kernel_is_not_taken_for_the_known_one(cache):
    catalog = catalog_for(EXTRA_FILE)
    changed = dict(EXTRA_FILE, **{"triton_kernels.py": tp.TRITON_KERNELS_FILE.replace(
        "2 * c * tl.where(pre > 0, pre, 0.0)", "3 * c * tl.where(pre > 0, pre, 0.0)")})
    res = port(changed, "cpu", cache_dir=cache, catalog=catalog)
    (b,) = [b for b in res.blockers if "_relu2_kernel" in b.construct]
    assert "kernel changed" in b.reason and "test_linear_relu_square" in b.reason
    kernels = res.files["triton_kernels.py"]
    assert "def linear_relu_square(a, b, aux=None):" in kernels and "import triton\n" in kernels
    assert "FusedSoftcappedCrossEntropy = _tb_kernels.SoftcappedCrossEntropy" in kernels


def test_a_replacement_that_fails_its_check_is_refused(cache):
    catalog = catalog_for(SCRIPT, symmetric_xxt="xtx")  # A.mT @ A where the kernel computes A @ A.mT
    res = port(SCRIPT, "cpu", cache_dir=cache, catalog=catalog)
    (b,) = [b for b in res.blockers if "launched by XXT" in b.construct]
    assert "failed its check" in b.reason
    text = res.files["train_gpt.py"]
    assert "def XXT(A: torch.Tensor, out: torch.Tensor):" in text and "import triton\n" in text
    assert "ba_plus_cAA = _tb_kernels.ba_plus_caa" in text


def test_check_off_and_cuda_target():
    assert port(EXTRA_FILE, "cuda").files == EXTRA_FILE
    res = port(SCRIPT, "npu", check=False, catalog=catalog_for(SCRIPT))
    notes = [c.note for c in res.changes if c.kind == "kernel_replaced" and "test_" in c.note]
    assert len(notes) == 2 and all("not checked (check=False)" in n for n in notes)
