"""The workload contract: a folder with a training program and its `trainbridge.toml`.

The manifest says what the harness runs, what an agent may edit and what it may not, and
how much work one step does. Everything downstream (harness, guard, correctness, work
conservation) reads this one model, so a bad manifest fails here, naming field and file.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .targets.registry import TargetName

MANIFEST_NAME = "trainbridge.toml"


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProtectedRegion(_Strict):
    """Source an agent may not change: a whole file, or named functions/classes/assignments.

    `symbols` are dotted qualified names (`Hyperparameters`, `GPT.forward`,
    `distributed_data_generator`); `names` are module-level variables whose assignments
    must stay as they are (`seed`, `batch_size`).
    """

    file: str
    symbols: list[str] = Field(default_factory=list)
    names: list[str] = Field(default_factory=list)
    whole_file: bool = False
    reason: str = ""


class StepsConfig(_Strict):
    warmup: int = Field(3, ge=0, description="steps run before timing starts (compile, allocator, caches)")
    measured: int = Field(10, ge=1, description="steps timed per harness run")
    timed: int | None = Field(None, ge=1, description="steps measured per run when two programs are compared for "
                              "speed (baseline timing, candidate timing, verify); more steps per run narrow the "
                              "step-paired interval for little time next to a run's start-up. Unset: `measured`")


class WorkConfig(_Strict):
    """What one optimizer step processes; the harness counts it from the root module's inputs,
    and the baseline's count is checked against `per_step` (`work_note`)."""

    unit: Literal["tokens", "samples"] = "tokens"
    per_step: int = Field(..., gt=0)


def work_note(work: WorkConfig, counted: list[int]) -> str | None:
    """Why the manifest's `[work] per_step` does not describe the steps the harness counted, or None."""
    if not counted:
        return None
    median = sorted(counted)[len(counted) // 2]
    if median == work.per_step:
        return None
    return (f"trainbridge.toml says [work] per_step = {work.per_step} {work.unit}; the harness counted {median} per "
            "step (the root module's integer inputs, or its batch): work conservation uses the count, fix the "
            "manifest (`trainbridge init` writes the counted value)")


class CorrectnessConfig(_Strict):
    """Loss-trajectory tolerance for a candidate against the baseline from the same seed."""

    steps: int = Field(8, ge=1, description="steps compared")
    fp32_rtol: float = Field(2e-3, gt=0, description="relative loss tolerance when both run fp32")
    low_precision_rtol: float = Field(4e-2, gt=0, description="when either side runs bf16/fp16 math")
    trained_steps: int = Field(32, ge=0, description="baseline steps trained once per run before the later-window "
                                                     "check (measure.later_window); 0 turns that check off")
    later_steps: int = Field(4, ge=1, description="at least this many steps compared from the trained state (the "
                             "window runs a timed run's warm-up + timed steps when those are more)")


class LimitsConfig(_Strict):
    timeout_s: float = Field(600.0, gt=0)
    memory_limit_mb: int = Field(16000, gt=0)
    sandbox: bool = Field(True, description="refuse writes outside the program's folder, network connections "
                                            "and processes the program starts itself (harness/sandbox.py)")


class PrepareConfig(_Strict):
    """A command that makes the workload's data locally (run once, when `creates` is missing)."""

    command: list[str] = Field(..., min_length=1, description="run in the workload folder; 'python' means this interpreter")
    creates: list[str] = Field(..., min_length=1, description="paths that exist once it has run")


class PortConfig(_Strict):
    """How the port treats this program where the default would not run it."""

    autocast: Literal["inert", "keep"] = Field(
        "inert", description="cpu target: a cuda autocast is left inert, as the public ports left it (the "
                             "autocast_reapply recipe may restore it), or kept and pointed at the cpu, for a "
                             "program that needs it to reconcile bf16 and fp32 tensors")


class Manifest(_Strict):
    name: str
    entry: str = Field(..., description="script run by the harness, relative to the workload folder")
    args: list[str] = Field(default_factory=list, description="arguments for a short measured run")
    editable: list[str] = Field(..., min_length=1, description="globs of files an agent may edit")
    protected: list[ProtectedRegion] = Field(default_factory=list)
    steps: StepsConfig = Field(default_factory=StepsConfig)
    work: WorkConfig
    correctness: CorrectnessConfig = Field(default_factory=CorrectnessConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    env: dict[str, str] = Field(default_factory=dict, description="environment for every run")
    prepare: PrepareConfig | None = None
    port: PortConfig = Field(default_factory=PortConfig)
    native_device: TargetName = Field(
        "cuda", description="the device the program was written for; the harness ports from it"
    )

    @field_validator("entry")
    @classmethod
    def _entry_is_python(cls, v: str) -> str:
        if not v.endswith(".py"):
            raise ValueError("entry must be a .py script")
        return v


class Workload(BaseModel):
    """A loaded workload: its folder and its validated manifest."""

    model_config = ConfigDict(frozen=True)

    root: Path
    manifest: Manifest

    @property
    def entry_path(self) -> Path:
        return self.root / self.manifest.entry

    def run_folders(self) -> set[str]:
        """Top-level folders of the workload that hold TrainBridge run folders (`runs/<id>/ledger.jsonl`):
        a run started from inside the workload puts them there, and the programs they hold are
        not the program."""
        return {d.name for d in self.root.iterdir() if d.is_dir() and not d.is_symlink()
                and any((d / "ledger.jsonl").is_file() or (sub / "ledger.jsonl").is_file()
                        for sub in d.iterdir() if sub.is_dir())} if self.root.is_dir() else set()

    def program_paths(self) -> list[Path]:
        """Every path of the program's folder, run folders and `__pycache__` left out."""
        skip = self.run_folders()
        return [p for p in sorted(self.root.rglob("*"))
                if not (p.relative_to(self.root).parts[0] in skip or "__pycache__" in p.relative_to(self.root).parts)]

    def editable_files(self) -> list[str]:
        """Relative paths of existing files an agent may edit (protected whole files excluded)."""
        whole = {p.file for p in self.manifest.protected if p.whole_file}
        out = []
        for path in self.program_paths():
            rel = path.relative_to(self.root).as_posix()
            if path.is_file() and any(fnmatch.fnmatch(rel, g) for g in self.manifest.editable):
                if rel not in whole:
                    out.append(rel)
        return out

    def source_files(self) -> list[str]:
        """Every Python file of the program (what gets copied, hashed and ported)."""
        return sorted(p.relative_to(self.root).as_posix() for p in self.program_paths()
                      if p.suffix == ".py" and p.is_file())


def _format_errors(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid manifest"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        lines.append(f"  field '{loc}': {e['msg']}")
    return "\n".join(lines)


def load_workload(path: str | Path) -> Workload:
    """Load a workload folder (or its manifest file); raise ManifestError naming file and field."""
    path = Path(path)
    manifest_path = path if path.name == MANIFEST_NAME else path / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ManifestError(f"{manifest_path}: no {MANIFEST_NAME} here (a workload is a folder with one)")
    try:
        data = tomllib.loads(manifest_path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ManifestError(f"{manifest_path}: not valid TOML: {e}") from e
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as e:
        raise ManifestError(_format_errors(manifest_path, e)) from e
    root = manifest_path.parent.resolve()
    if not (root / manifest.entry).is_file():
        raise ManifestError(f"{manifest_path}: field 'entry': {manifest.entry} does not exist in {root}")
    for i, region in enumerate(manifest.protected):
        if not (root / region.file).is_file():
            raise ManifestError(f"{manifest_path}: field 'protected.{i}.file': {region.file} does not exist")
    return Workload(root=root, manifest=manifest)
