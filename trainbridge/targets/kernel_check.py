"""Check a PyTorch replacement against the GPU kernel it replaces, on a CPU.

The launcher, its kernels and what they need are cut out of the program's source
(`kernels/extract.py`: the record script itself cannot be imported, it trains at import time)
and run in a subprocess under Triton's interpreter (`TRITON_INTERPRET=1`, with its bf16/fp8
arithmetic made the GPU's, `kernels/interp_numerics.py`) on seeded random inputs at the
records' shapes scaled down; the replacement runs on the same inputs; every output, every
tensor written in place and, for an autograd.Function, every input gradient is compared within
a per-dtype tolerance (`kernels/compare.py`). A kernel compiled at run time by NVRTC cannot run
here: its replacement is checked against an independently written reference of the CUDA source
instead, and the result says the kernel itself was not run (`kernel_ran=False`).

Results are cached in a folder the caller names, keyed by the kernels' fingerprints, the
extracted source, the replacement and the check's own code, so porting sixty records runs each
distinct check once. `check_proposed` is the same check on any replacement text, for a
replacement someone (or a model) proposes for a kernel the catalog does not know.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from .kernels.catalog import CatalogEntry, CheckCase
from .kernels.compare import OutputComparison
from .kernels.extract import ExtractError, extract
from .kernels.scan import LauncherInfo, scan_file
from .shims import shim_source

CHECK_TIMEOUT_S = 1200
_KERNELS_DIR = Path(__file__).parent / "kernels"
_SHIM_PATH = Path(__file__).parent / "shims" / "kernels.py"
INTERPRETER = "the original kernel run by Triton's interpreter (TRITON_INTERPRET=1) on the CPU"
NO_TRITON = ("cannot check here: Triton is not installed on this machine, and the check runs the original kernel "
             "in Triton's interpreter; check where it is (the results are cached by fingerprint: share the cache "
             "folder) or port with check=False")


class KernelCheckResult(BaseModel):
    entry: str | None = Field(None, description="catalog entry id; None for a proposed replacement")
    launcher: str
    file: str
    kernel_fingerprints: list[str] = Field(default_factory=list)
    cache_key: str = ""
    passed: bool
    kernel_ran: bool = Field(True, description="False when the kernel could not run here (NVRTC) and a "
                                               "reference of its source stood in")
    against: str = INTERPRETER
    max_abs: float = 0.0
    max_rel: float = 0.0
    outputs: list[OutputComparison] = Field(default_factory=list)
    reason: str = ""
    cached: bool = False
    seconds: float = 0.0

    def summary(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        what = self.entry or "proposed replacement"
        ran = "" if self.kernel_ran else " (kernel not run: checked against a reference of its CUDA source)"
        cache = ", cached" if self.cached else ""
        return (f"check {what} [{'/'.join(self.kernel_fingerprints) or '-'}] {verdict}: max abs err "
                f"{self.max_abs:.3g}, max rel err {self.max_rel:.3g}{ran}{cache}")


class CheckRequest(BaseModel):
    """One launcher of a program to check against one replacement."""

    file: str
    launcher: str
    kernel_fingerprints: list[str] = Field(default_factory=list)
    entry: str | None = None
    replacement_attr: str
    replacement_source: str | None = Field(None, description="text of a proposed replacement module; None: the "
                                                             "_tb_kernels shim")
    nvrtc_reference: str | None = None
    cases: list[CheckCase]
    cases_source: str | None = Field(None, description="text of a module of case builders; None: kernels/cases.py")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_code_version() -> str:
    parts = [p.read_text() for p in sorted(_KERNELS_DIR.glob("*.py"))]
    try:
        import triton
        import torch

        parts.append(f"triton {triton.__version__} torch {torch.__version__}")
    except ImportError:  # pragma: no cover - triton is a dependency on the platforms that check
        parts.append("no triton")
    return _sha("\n".join(parts))[:16]


def _normalized(source: str) -> str:
    try:
        return ast.dump(ast.parse(source), annotate_fields=False)
    except SyntaxError:
        return source


def request_for(launcher: LauncherInfo, entry: CatalogEntry) -> CheckRequest:
    return CheckRequest(file=launcher.file, launcher=launcher.name, kernel_fingerprints=launcher.fingerprints,
                        entry=entry.id, replacement_attr=entry.replacement, nvrtc_reference=entry.nvrtc_reference,
                        cases=entry.cases)


def _cache_key(req: CheckRequest, modules: dict[str, str]) -> str:
    replacement = req.replacement_source if req.replacement_source is not None else shim_source("kernels")
    payload = {
        "entry": req.entry, "launcher": req.launcher, "fps": req.kernel_fingerprints,
        "modules": {k: _sha(_normalized(v)) for k, v in sorted(modules.items())},
        "replacement": _sha(replacement), "attr": req.replacement_attr, "nvrtc": req.nvrtc_reference,
        "cases": [c.model_dump() for c in req.cases], "cases_source": _sha(req.cases_source or ""),
        "code": _check_code_version(),
    }
    return _sha(json.dumps(payload, sort_keys=True))[:24]


def _write_modules(root: Path, modules: dict[str, str]) -> None:
    for name, text in modules.items():
        path = root / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _job(i: int, req: CheckRequest, modules: dict[str, str], work: Path) -> dict:
    sandbox = work / f"job{i}"
    sandbox.mkdir(parents=True)
    _write_modules(sandbox, modules)
    job: dict = {"id": f"j{i}", "sandbox": str(sandbox), "modules": sorted(modules), "cases": [
        c.model_dump() | {"name": c.label()} for c in req.cases]}
    stem = req.file[:-3].replace("/", ".") if req.file.endswith(".py") else req.file
    job["original"] = {"reference": req.nvrtc_reference} if req.nvrtc_reference else \
        {"module": stem, "attr": req.launcher}
    if req.replacement_source is not None:
        path = sandbox / "_tb_proposed.py"
        path.write_text(req.replacement_source)
        job["replacement"] = {"path": str(path), "attr": req.replacement_attr}
    else:
        job["replacement"] = {"path": str(_SHIM_PATH), "attr": req.replacement_attr}
    if req.cases_source is not None:
        path = sandbox / "_tb_cases.py"
        path.write_text(req.cases_source)
        job["cases_path"] = str(path)
    return job


def _result_from(req: CheckRequest, key: str, raw: dict | None, seconds: float, failure: str = "") -> KernelCheckResult:
    base = dict(entry=req.entry, launcher=req.launcher, file=req.file, kernel_fingerprints=req.kernel_fingerprints,
                cache_key=key, kernel_ran=req.nvrtc_reference is None, seconds=round(seconds, 2),
                against=INTERPRETER if req.nvrtc_reference is None else
                f"an independent PyTorch reference of the CUDA source ({req.nvrtc_reference}); the NVRTC kernel "
                f"itself was not run (it needs a CUDA GPU)")
    if raw is None:
        return KernelCheckResult(passed=False, reason=failure or "the check process gave no result", **base)
    if raw.get("error"):
        return KernelCheckResult(passed=False, reason=raw["error"].strip()[-1500:], **base)
    outputs = [OutputComparison(**o) for c in raw["cases"] for o in c["outputs"]]
    errors = [f"case {c['name']}: {c['error'].strip()[-1200:]}" for c in raw["cases"] if c.get("error")]
    finite = [o for o in outputs if o.max_abs != float("inf")]
    max_abs = max((o.max_abs for o in finite), default=0.0)
    max_rel = max((o.max_rel for o in finite), default=0.0)
    bad = [o for o in outputs if not o.passed]
    if errors:
        reason = errors[0]
    elif bad:
        o = bad[0]
        reason = (f"case {o.case} output {o.name} ({o.dtype}{o.shape}): max abs err {o.max_abs:.3g}, max rel err "
                  f"{o.max_rel:.3g} over tolerance rtol {o.rtol:g} + atol {o.atol:g} x max|kernel|; {o.note}")
    elif not outputs:
        reason = "no outputs compared"
    else:
        reason = f"{len(outputs)} outputs over {len(raw['cases'])} cases within tolerance"
    passed = not errors and not bad and bool(outputs)
    return KernelCheckResult(passed=passed, reason=reason, outputs=outputs, max_abs=max_abs, max_rel=max_rel,
                             **base)


def run_checks(files: dict[str, str], requests: list[CheckRequest], cache_dir: str | Path | None = None,
               timeout_s: int = CHECK_TIMEOUT_S) -> list[KernelCheckResult]:
    """Check every request against `files` (the program's original sources); cached results are
    reused and the rest run in one interpreter subprocess."""
    cache = Path(cache_dir) if cache_dir is not None else None
    requests = list(requests)
    results: list[KernelCheckResult | None] = [None] * len(requests)
    pending: list[tuple[int, CheckRequest, dict[str, str], str]] = []
    for i, req in enumerate(requests):
        if not req.kernel_fingerprints and req.file in files:
            scan = scan_file(files[req.file], req.file)
            fps = next((lau.fingerprints for lau in scan.launchers if lau.name == req.launcher), [])
            req = requests[i] = req.model_copy(update={"kernel_fingerprints": fps})
        try:
            modules = extract(files, req.file, [req.launcher])
        except ExtractError as e:
            results[i] = _result_from(req, "", None, 0.0, f"the launcher could not be extracted: {e}")
            continue
        key = _cache_key(req, modules)
        hit = cache / f"{key}.json" if cache is not None else None
        if hit is not None and hit.exists():
            try:
                results[i] = KernelCheckResult.model_validate_json(hit.read_text()).model_copy(
                    update={"cached": True, "file": req.file, "launcher": req.launcher})
                continue
            except ValueError:
                pass
        pending.append((i, req, modules, key))
    if pending and importlib.util.find_spec("triton") is None:
        for i, req, _, key in [p for p in pending if p[1].nvrtc_reference is None]:
            results[i] = _result_from(req, key, None, 0.0, NO_TRITON)
        pending = [p for p in pending if p[1].nvrtc_reference is not None]
    if pending:
        _run_pending(pending, results, cache, timeout_s)
    return [r for r in results if r is not None]


def _run_pending(pending, results, cache: Path | None, timeout_s: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tb-kernel-check-") as tmp:
        work = Path(tmp)
        jobs = [_job(n, req, modules, work) for n, (_, req, modules, _) in enumerate(pending)]
        request, result = work / "request.json", work / "result.json"
        request.write_text(json.dumps({"jobs": jobs}))
        env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        started = time.time()
        failure = ""
        try:
            proc = subprocess.run([sys.executable, "-m", "trainbridge.targets.kernels.runner", str(request),
                                   str(result)], cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
            if proc.returncode != 0:
                failure = f"check process exited {proc.returncode}: {proc.stderr.strip()[-1500:]}"
        except subprocess.TimeoutExpired:
            failure = f"check process timed out after {timeout_s} s"
        raw = json.loads(result.read_text())["results"] if result.exists() else []
        by_id = {r["id"]: r for r in raw}
        for n, (i, req, _, key) in enumerate(pending):
            got = by_id.get(f"j{n}")
            seconds = got.get("seconds", 0.0) if got else time.time() - started
            res = _result_from(req, key, got, seconds, failure)
            results[i] = res
            if cache is not None and got is not None:
                cache.mkdir(parents=True, exist_ok=True)
                (cache / f"{key}.json").write_text(res.model_dump_json(indent=1))


def check_launcher(files: dict[str, str], launcher: LauncherInfo, entry: CatalogEntry,
                   cache_dir: str | Path | None = None) -> KernelCheckResult:
    """Check catalog `entry`'s replacement against `launcher` as the program `files` define it."""
    return run_checks(files, [request_for(launcher, entry)], cache_dir)[0]


def check_proposed(kernel_source: str, launcher: str, replacement_source: str, *, replacement_name: str | None = None,
                   cases: list[CheckCase], cases_source: str | None = None, file: str = "kernels.py",
                   cache_dir: str | Path | None = None) -> KernelCheckResult:
    """The extension point for kernels the catalog does not know: check a proposed replacement
    (module text defining `replacement_name`, default the launcher's name) against the launcher
    `launcher` of `kernel_source` (the file that holds the kernel, its helpers and launcher). The
    cases name builders of `kernels/cases.py`, or of `cases_source` (module text whose functions
    take a seed and keyword parameters and return a `kernels.cases.Case`)."""
    req = CheckRequest(file=file, launcher=launcher, replacement_attr=replacement_name or launcher,
                       replacement_source=replacement_source, cases=cases, cases_source=cases_source)
    return run_checks({file: kernel_source}, [req], cache_dir)[0]

