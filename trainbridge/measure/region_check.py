"""The region-level check: every function a candidate rewrote, against the original, on fresh inputs.

The whole-program loss check spans the first K steps from initialisation, where a near-identity
op (a softcap, a norm) can be deleted without moving the loss. So each function the candidate
changed is also checked on its own (`correctness.lab_check`): forward error within the dtype's
precision and input gradients with cosine > 0.9999 and the same norm.

Inputs come from the program itself. During the candidate's validation run, a harness plugin
(`RegionCheckPlugin`) waits for each changed function's first call, takes its real arguments,
rebuilds the original function from its source in the same module namespace, and runs the lab
check with the floating-point arguments perturbed per trial (fresh values, the same shapes,
dtypes, devices and structure). The program's own RNG state and module state are left alone:
the check runs on a copy of `self`, in eval mode, under forked RNG.

A function is not checked (and says why) when it holds the training loop (it calls
`.backward()` or `.step()`), is nested, has no floating-point tensor argument, uses zero-argument
`super()`, is never called, or when the original cannot run in the candidate's module (a helper
it used was removed). Only a check that ran and failed rejects the candidate.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import sys
import textwrap
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from ..harness.plugins import HarnessPlugin
from .correctness import LabVerdict, lab_check

PLUGIN = "trainbridge.measure.region_check:RegionCheckPlugin"
MAX_SELF_PARAMETERS = 50_000_000  # larger modules are not copied for a check
TRIALS = 2


class Region(BaseModel):
    file: str = Field(..., description="path relative to the program folder")
    qualname: str = Field(..., description="function or Class.method, as Python's co_qualname spells it")
    original_source: str = Field(..., description="the original function's definition, decorators included")


class RegionResult(BaseModel):
    file: str
    qualname: str
    checked: bool
    passed: bool | None = None
    reason: str
    verdict: LabVerdict | None = None


# ---------------------------------------------------------------- parent side ----
def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = item
    return out


def _runs_training(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step")
               for n in ast.walk(fn))


def _source(text: str, fn: ast.FunctionDef) -> str:
    lines = text.splitlines(keepends=True)
    start = min([fn.lineno, *(d.lineno for d in fn.decorator_list)]) - 1
    return textwrap.dedent("".join(lines[start:fn.end_lineno]))


def changed_regions(original: dict[str, str], candidate: dict[str, str], changed: list[str]) -> list[Region]:
    """Functions (top level, or methods of top-level classes) whose code the candidate changed."""
    out = []
    for rel in changed:
        if not rel.endswith(".py") or rel not in original or rel not in candidate:
            continue
        try:
            old, new = _functions(ast.parse(original[rel])), _functions(ast.parse(candidate[rel]))
        except SyntaxError:
            continue
        for name, fn in old.items():
            if name in new and ast.dump(fn) != ast.dump(new[name]) and not _runs_training(fn):
                out.append(Region(file=rel, qualname=name, original_source=_source(original[rel], fn)))
    return out


def read_results(path: str | None) -> list[RegionResult]:
    if not path or not Path(path).exists():
        return []
    return [RegionResult.model_validate(r) for r in json.loads(Path(path).read_text())]


# ----------------------------------------------------------------- child side ----
def _perturbed(a: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    x = a.detach().float().cpu()
    finite = torch.isfinite(x)
    scale = float(x[finite].std()) if int(finite.sum()) > 1 else 1.0
    scale = scale if scale > 0 and scale == scale else 1.0
    noise = torch.randn(x.shape, generator=gen, dtype=torch.float32)
    return torch.where(finite, x + 0.05 * scale * noise, x).to(dtype=a.dtype, device=a.device).requires_grad_(True)


class RegionCheckPlugin(HarnessPlugin):
    """Lab-checks each changed function at its first call (module doc). Options: `regions_path`, `out`."""

    name = "region_check"

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        regions = [Region.model_validate(r) for r in json.loads(Path(options["regions_path"]).read_text())]
        self.pending = {r.qualname: r for r in regions}
        self.results: list[RegionResult] = []
        self.low_precision = options.get("low_precision") == "1"
        self.program_dir = os.path.realpath(os.getcwd())

    def before_program(self) -> None:
        if self.pending:
            sys.setprofile(self._on_call)

    def _on_call(self, frame, event, arg) -> None:
        if event != "call":
            return
        code = frame.f_code
        region = self.pending.get(code.co_qualname)
        if region is None or not os.path.realpath(code.co_filename).endswith(os.sep + region.file):
            return
        del self.pending[code.co_qualname]
        if not self.pending:
            sys.setprofile(None)
        try:
            # The first call may come from a compiled frame, where Dynamo's frame hook is live and
            # would trace the check itself (reading a compiled function's original through Dynamo
            # gives back the compiled one): the whole check runs plain Python.
            self.results.append(torch.compiler.disable(self._check)(frame, region))
        except Exception as e:  # the checker's own trouble is a note, never a crash of the program
            self.results.append(RegionResult(file=region.file, qualname=region.qualname, checked=False,
                                             reason=f"not checked: {type(e).__name__}: {e}"))

    def _skip(self, region: Region, why: str) -> RegionResult:
        return RegionResult(file=region.file, qualname=region.qualname, checked=False, reason=f"not checked: {why}")

    def _check(self, frame, region: Region) -> RegionResult:
        code = frame.f_code
        if code.co_kwonlyargcount or code.co_flags & 0x0C:  # keyword-only, *args or **kwargs
            return self._skip(region, "keyword-only or variadic parameters")
        if "super()" in region.original_source:
            return self._skip(region, "zero-argument super() cannot be rebuilt outside its class")
        args = [frame.f_locals[n] for n in code.co_varnames[:code.co_argcount]]
        if not any(torch.is_tensor(a) and a.is_floating_point() for a in args):
            return self._skip(region, "no floating-point tensor argument to vary")
        method = "." in region.qualname
        if method:
            owner = args[0]
            candidate = getattr(type(owner), code.co_name)
            if isinstance(owner, torch.nn.Module) and sum(p.numel() for p in owner.parameters()) > MAX_SELF_PARAMETERS:
                return self._skip(region, "its module is too large to copy for the check")
        else:
            candidate = frame.f_globals.get(code.co_name)
        # A torch.compile'd function is checked as the Python it compiles: the math is the program's
        # to keep, the compiler's correctness is not (and a compiled graph cannot be re-entered here).
        candidate = getattr(candidate, "_torchdynamo_orig_callable", candidate)
        namespace = dict(frame.f_globals)
        exec(compile(region.original_source, os.path.join(self.program_dir, region.file), "exec"), namespace)
        original = namespace[code.co_name]
        dtype = next(a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point())
        if self.low_precision and dtype == torch.float32:
            dtype = torch.bfloat16

        def make_inputs(gen: torch.Generator) -> list:
            out = []
            for i, a in enumerate(args):
                if torch.is_tensor(a) and a.is_floating_point():
                    out.append(_perturbed(a, gen))
                elif i == 0 and method and isinstance(a, torch.nn.Module):
                    out.append(copy.deepcopy(a).eval())
                else:
                    out.append(a)
            return out

        cpu_state = torch.get_rng_state()
        try:
            with torch.enable_grad():
                verdict = lab_check(original, candidate, make_inputs, dtype=dtype, trials=TRIALS)
        except Exception as e:  # the original could not run in the candidate's module
            return self._skip(region, f"the original raised {type(e).__name__}: {e}")
        finally:
            torch.set_rng_state(cpu_state)
        return RegionResult(file=region.file, qualname=region.qualname, checked=True, passed=verdict.passed,
                            reason=verdict.reason, verdict=verdict)

    def finalize(self, status: str) -> str | None:
        sys.setprofile(None)
        results = self.results + [self._skip(r, "never called during the run") for r in self.pending.values()]
        out = Path(self.options["out"])
        out.write_text(json.dumps([r.model_dump(mode="json") for r in results]))
        return str(out)
