"""The check subprocess: run a launcher's original and its replacement on the same inputs, compare.

Started by `kernel_check` as `python -m trainbridge.targets.kernels.runner REQUEST RESULT` with
`TRITON_INTERPRET=1`, so every `@triton.jit` kernel runs on CPU tensors in Triton's interpreter
(patched by `interp_numerics` to compute bf16 and fp8 the GPU's way). A separate process keeps
the interpreter, the extracted program modules and whatever they do at import away from the
caller; one process runs every job of a request, so a port pays for one interpreter start.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from . import cases as builtin_cases
from .compare import compare


def _load_path(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve(spec: dict, job_id: str):
    if "reference" in spec:
        module, attr = spec["reference"].split(":")
        return getattr(importlib.import_module(module), attr)
    if "path" in spec:
        return getattr(_load_path(spec["path"], f"_tb_replacement_{job_id}"), spec["attr"])
    module = importlib.import_module(spec["module"])
    target = module
    for part in spec["attr"].split("."):
        target = getattr(target, part)
    return target


def _flatten(result) -> dict[str, object]:
    if isinstance(result, torch.Tensor):
        return {"out": result}
    if isinstance(result, (tuple, list)):
        return {f"out{i}": r for i, r in enumerate(result) if r is not None}
    return {} if result is None else {"out": result}


def _run(fn, case) -> dict[str, object]:
    call = fn.apply if case.apply else fn
    result = call(*case.args, **case.kwargs)
    observed = case.observe(result, case) if case.observe else _flatten(result)
    if not case.observe:
        observed.update({f"arg:{k}": v for k, v in case.watch.items()})
    if case.grad_output is not None:
        torch.autograd.backward(result, case.grad_output(result))
        observed.update({f"grad:{k}": v.grad for k, v in case.grad_of.items()})
    return {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in observed.items()}


def _builders(job: dict) -> dict:
    if job.get("cases_path"):
        module = _load_path(job["cases_path"], f"_tb_cases_{job['id']}")
        return {n: f for n, f in vars(module).items() if callable(f)}
    return builtin_cases.BUILDERS


def run_job(job: dict) -> dict:
    started = time.time()
    out = {"id": job["id"], "cases": [], "error": None}
    sandbox = job.get("sandbox")
    if sandbox:
        for name in job.get("modules", []):
            sys.modules.pop(name, None)
        sys.path.insert(0, sandbox)
    try:
        try:
            original = _resolve(job["original"], job["id"])
        except Exception:
            out["error"] = "original could not be loaded:\n" + traceback.format_exc(limit=6)
            return out
        try:
            replacement = _resolve(job["replacement"], job["id"])
        except Exception:
            out["error"] = "replacement could not be loaded:\n" + traceback.format_exc(limit=6)
            return out
        builders = _builders(job)
        for spec in job["cases"]:
            name = spec.get("name") or spec["builder"]
            entry = {"name": name, "outputs": [], "error": None}
            out["cases"].append(entry)
            build = builders.get(spec["builder"])
            if build is None:
                entry["error"] = f"no case builder {spec['builder']!r}"
                continue
            params, seed = spec.get("params", {}), spec.get("seed", 0)
            try:
                want = _run(original, build(seed, **params))
            except Exception:
                entry["error"] = "original raised:\n" + traceback.format_exc(limit=8)
                continue
            try:
                got = _run(replacement, build(seed, **params))
            except Exception:
                entry["error"] = "replacement raised:\n" + traceback.format_exc(limit=8)
                continue
            for key in want:
                if key not in got:
                    entry["outputs"].append({"case": name, "name": key, "dtype": "?", "shape": [], "max_abs": 1e300,
                                             "max_rel": 1e300, "rtol": 0, "atol": 0, "passed": False,
                                             "note": "the replacement does not produce it"})
                    continue
                entry["outputs"].append(compare(name, key, got[key], want[key]).model_dump())
    finally:
        if sandbox and sys.path and sys.path[0] == sandbox:
            sys.path.pop(0)
        out["seconds"] = round(time.time() - started, 3)
    return out


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[0]).read_text())
    if importlib.util.find_spec("triton") is not None:  # NVRTC checks need no Triton
        from .interp_numerics import install

        install()
    torch.set_num_threads(1)
    results = []
    for job in request["jobs"]:
        results.append(run_job(job))
        Path(argv[1]).write_text(json.dumps({"results": results}))
    Path(argv[1]).write_text(json.dumps({"results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
