"""`trainbridge init`: a manifest for a program this tool has never seen.

A user brings a training script (or a folder holding one); the loop needs to know which file
runs, which files it may edit, what it must leave alone and how much work a step does. This
reads that from the source and one short probe run:

* **entry**: the given script, or the one file in the folder that calls `.backward(` and runs
  as `__main__`;
* **editable**: the entry and the local modules it imports (recursively); a file the program
  reads with `exec(open(...).read())` (a configurator) is configuration, not editable;
* **protected**, each with its reason: data loading (functions and classes whose names say
  batch/data/loader/dataset, `Dataset` subclasses), the hyperparameters set at module level
  (`batch_size = 12`: they fix the work a step does), config classes (`@dataclass ...Config`),
  and the names seeds are drawn from (`torch.manual_seed(seed)`);
* **steps and work**: the probe runs a few steps on the cpu target; the work per step is what
  the harness counted (the root module's integer inputs, or samples), the measured steps are
  sized to take about ten seconds, and the probe's failure is reported instead of guessed around.

The manifest is printed for the user to confirm before anything is written.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from .workload import MANIFEST_NAME, Manifest, ProtectedRegion, StepsConfig, WorkConfig, Workload

_DATA_WORDS = re.compile(r"(batch|data|loader|dataset|shard|tokeni[sz]|sampler|prepare)", re.I)
_SEED_CALLS = {"torch.manual_seed", "random.seed", "np.random.seed", "numpy.random.seed", "torch.cuda.manual_seed",
               "torch.cuda.manual_seed_all", "torch.random.manual_seed"}
MEASURED_SECONDS = 10.0
"""The measured phase of one harness run is sized to take about this long on the probe's target."""


class InitError(ValueError):
    """The program cannot be described without the user's help; the message says what to give."""


class ProbeResult(BaseModel):
    status: str
    error: str | None = None
    step_ms: list[float] = Field(default_factory=list)
    work_items: list[int] = Field(default_factory=list)


class InitResult(BaseModel):
    manifest: Manifest
    notes: list[str] = Field(default_factory=list, description="what was found and what the user should check")
    probe: ProbeResult | None = None


# ----------------------------------------------------------------- source ----
def _parse(path: Path) -> ast.Module:
    try:
        return ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as e:
        raise InitError(f"{path}:{e.lineno}: does not parse ({e.msg})") from e


def _is_main_script(tree: ast.Module) -> bool:
    text = ast.unparse(tree)
    return ".backward(" in text and ("__main__" in text or any(isinstance(n, (ast.For, ast.While))
                                                                for n in tree.body))


def find_entry(folder: Path) -> str:
    """The one script of the folder that trains (calls backward and runs as a script)."""
    found = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.py")
                   if ".git" not in p.parts and _is_main_script(_parse(p)))
    if not found:
        raise InitError(f"{folder}: no Python file here calls .backward() in a script; name the training script")
    if len(found) > 1:
        raise InitError(f"{folder}: several training scripts ({', '.join(found)}); name the one to optimize")
    return found[0]


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _exec_files(tree: ast.Module) -> list[str]:
    """Files the program runs with `exec(open("x.py").read())`: its configurators."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) == "exec" and node.args:
            for inner in ast.walk(node.args[0]):
                if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and inner.value.endswith(".py"):
                    out.append(inner.value)
    return out


def local_modules(folder: Path, entry: str) -> tuple[list[str], list[str]]:
    """(the entry and the local modules it imports, recursively; the files it exec's)."""
    seen, configs, todo = [], [], [entry]
    while todo:
        rel = todo.pop()
        if rel in seen or not (folder / rel).is_file():
            continue
        seen.append(rel)
        tree = _parse(folder / rel)
        configs += [c for c in _exec_files(tree) if (folder / c).is_file() and c not in configs]
        base = Path(rel).parent
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                for cand in (base / (name.replace(".", "/") + ".py"), Path(name.replace(".", "/") + ".py")):
                    if (folder / cand).is_file():
                        todo.append(cand.as_posix())
    return [s for s in seen if s not in configs], configs


def _is_literal(node: ast.AST) -> bool:
    """A literal, or `dict(key=literal, ...)` (a settings dict written as a call)."""
    if isinstance(node, ast.Call) and _dotted(node.func) == "dict" and not node.args:
        return all(k.arg is not None and _is_literal(k.value) for k in node.keywords)
    try:
        ast.literal_eval(node)
        return True
    except Exception:
        return False


_CONFIG_CLASS_SUFFIXES = ("Config", "Hyperparameters", "Args", "Arguments", "Settings", "Options", "Params")


def _is_settings_class(node: ast.ClassDef) -> bool:
    """A class that only holds literal settings (`class TrainingArguments: batch_size = 8`)."""
    body = [b for b in node.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
    return bool(body) and all(isinstance(b, ast.Assign) and _is_literal(b.value) or
                              isinstance(b, ast.AnnAssign) and b.value is not None and _is_literal(b.value)
                              for b in body)


def protected_regions(folder: Path, files: list[str]) -> list[ProtectedRegion]:
    """What a candidate must not change, with the reason, file by file."""
    out = []
    for rel in files:
        tree = _parse(folder / rel)
        data, config, hyper, seeds = [], [], [], []
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bases = [_dotted(b) or "" for b in getattr(node, "bases", [])]
                decorators = [_dotted(d.func if isinstance(d, ast.Call) else d) or "" for d in node.decorator_list]
                if _DATA_WORDS.search(node.name) or any(b.endswith("Dataset") for b in bases):
                    data.append(node.name)
                elif isinstance(node, ast.ClassDef) and (node.name.endswith(_CONFIG_CLASS_SUFFIXES)
                                                         or any(d.endswith("dataclass") for d in decorators)
                                                         or _is_settings_class(node)):
                    config.append(node.name)
            elif isinstance(node, ast.Assign) and _is_literal(node.value):  # `lr = 3e-4`, `B, T = 8, 256`
                hyper += [n.id for t in node.targets for n in ast.walk(t)
                          if isinstance(n, ast.Name) and not n.id.startswith("_")]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None \
                    and _is_literal(node.value):
                hyper.append(node.target.id)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func) in _SEED_CALLS:
                seeds += [n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)]
        reasons = []
        if data:
            reasons.append("data loading")
        if config:
            reasons.append("configuration classes")
        if hyper:
            reasons.append("module-level hyperparameters (they fix the work a step does)")
        if seeds:
            reasons.append("seeds")
        names = sorted(set(hyper) | set(seeds))
        if data or config or names:
            out.append(ProtectedRegion(file=rel, symbols=sorted(set(data) | set(config)), names=names,
                                       reason="; ".join(reasons)))
    return out


# ------------------------------------------------------------------ probe ----
def probe(folder: Path, manifest: Manifest, *, steps: int = 4, target: str = "cpu",
          timeout_s: float = 600.0) -> ProbeResult:
    """Run the program a few steps as the harness would, to count its work and time its steps."""
    from .harness.runner import run_workload

    wl = Workload(root=folder.resolve(), manifest=manifest)
    with tempfile.TemporaryDirectory(prefix="trainbridge-init-") as tmp:
        run = run_workload(wl, target, out_dir=Path(tmp), label="probe", warmup_steps=1, measured_steps=steps,
                           seed=1337, timeout_s=timeout_s)
    measured = [s for s in run.steps if s.phase == "measured"]
    return ProbeResult(status=run.status, error=(run.error or "")[-1500:] or None,
                       step_ms=[s.step_ms for s in measured], work_items=[s.work_items for s in measured])


def sized_steps(step_ms: list[float]) -> StepsConfig:
    """Warm-up and measured steps for a measured phase of about `MEASURED_SECONDS`."""
    median = statistics.median(step_ms)
    measured = int(min(30, max(5, round(MEASURED_SECONDS * 1e3 / max(median, 1e-3)))))
    return StepsConfig(warmup=3, measured=measured)


# ---------------------------------------------------------------- compose ----
def describe(path: Path, *, args: list[str] | None = None, run_probe: bool = True,
             target: str = "cpu") -> InitResult:
    """The manifest for the script or folder at `path` (nothing is written)."""
    path = path.resolve()
    if not path.exists():
        raise InitError(f"{path}: no such file or folder")
    folder, entry = (path.parent, path.name) if path.is_file() else (path, None)
    if path.is_file() and path.suffix != ".py":
        raise InitError(f"{path}: not a Python script")
    entry = entry or find_entry(folder)
    editable, configs = local_modules(folder, entry)
    notes = [f"entry {entry}; editable {', '.join(editable)}"]
    if configs:
        notes.append(f"{', '.join(configs)}: run by exec() as configuration: not editable, not protected "
                     "(the hyperparameters they set are protected where the entry defines them)")
    protected = protected_regions(folder, editable)
    for region in protected:
        notes.append(f"protected in {region.file}: {', '.join(region.symbols + region.names)} ({region.reason})")
    manifest = Manifest(name=re.sub(r"[^A-Za-z0-9_-]+", "-", folder.name),
                        entry=entry, args=list(args or []), editable=editable, protected=protected,
                        work=WorkConfig(per_step=1))
    if not run_probe:
        notes.append("no probe run: [work] per_step = 1 and the default steps are placeholders to fill in")
        return InitResult(manifest=manifest, notes=notes)
    result = probe(folder, manifest, target=target)
    if result.status != "ok" or not result.step_ms:
        raise InitError(f"the probe run of {entry} on {target} did not complete ({result.status}): "
                        f"{(result.error or 'no steps').strip()[-800:]}\n(give arguments for a short run with "
                        "--arg, or make the program's data first)")
    items = statistics.median(result.work_items)
    unit = "tokens" if items > 0 else "samples"
    manifest = manifest.model_copy(update={"steps": sized_steps(result.step_ms),
                                           "work": WorkConfig(unit=unit, per_step=max(1, int(items)))})
    notes.append(f"probe on {target}: median step {statistics.median(result.step_ms):.0f} ms, "
                 f"{int(items)} work items per step (as the harness counts them)")
    if statistics.median(result.step_ms) > 2000:
        notes.append("steps take over 2 s here: consider arguments for a smaller configuration (--arg)"
                     + (f"; its hyperparameters: {', '.join(protected[0].names[:8])}" if protected else ""))
    return InitResult(manifest=manifest, notes=notes, probe=result)


def manifest_toml(m: Manifest) -> str:
    """The manifest as trainbridge.toml text (strings and lists in JSON spelling, valid TOML)."""
    q = json.dumps
    lines = [f"name = {q(m.name)}", f"entry = {q(m.entry)}", f"args = {q(m.args)}", f"editable = {q(m.editable)}",
             f"native_device = {q(m.native_device)}", ""]
    for region in m.protected:
        lines += ["[[protected]]", f"file = {q(region.file)}", f"symbols = {q(region.symbols)}",
                  f"names = {q(region.names)}", f"reason = {q(region.reason)}", ""]
    lines += ["[steps]", f"warmup = {m.steps.warmup}", f"measured = {m.steps.measured}", "",
              "[work]", f"unit = {q(m.work.unit)}", f"per_step = {m.work.per_step}", ""]
    return "\n".join(lines)


def write_manifest(folder: Path, m: Manifest, *, force: bool = False) -> Path:
    path = folder / MANIFEST_NAME
    if path.exists() and not force:
        raise InitError(f"{path} exists: pass --force to replace it")
    path.write_text(manifest_toml(m))
    return path
