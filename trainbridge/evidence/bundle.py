"""The evidence bundle: what Inductor decided for one training program, as data.

A bundle holds the compiled graphs of a training step (forward, backward, optimizer) with
their launch counts, every launched kernel with the post-grad nodes / ATen ops it covers and
the user's source lines (backward kernels: the forward lines they differentiate), graph
breaks, eager-vs-compiled counts per step, matmul dtypes, the supernodes (kernels
clustered by meaning and source region) and the optimization intents.

Contract with the planner: it reads `intents[*]` as dicts and uses the keys "id",
"pattern", "confidence", "level", "summary" and "eager_ops". Keep those names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from ..patterns import GapClass, Level, Pattern, TargetOp

SCHEMA_VERSION = 1

Route = Literal["real_gpu", "fake_cuda_codegen", "cpu_inductor", "imported"]
Phase = Literal["forward", "backward", "optimizer", "inference", "unknown"]
KernelKind = Literal[
    "pointwise", "reduction", "persistent_reduction", "template",  # generated (Triton / C++)
    "mm", "bmm", "addmm", "attention", "conv", "extern",  # library calls
    "other",
]
LIBRARY_KINDS = frozenset({"mm", "bmm", "addmm", "attention", "conv", "extern"})
Grade = Literal["A", "B", "C"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ------------------------------------------------------------------- sources ----
class SourceLoc(_Model):
    """One user source line (program-relative file)."""

    file: str
    line: int
    function: str = ""
    code: str = ""

    @property
    def key(self) -> str:
        return f"{self.file}:{self.line}"


class SourceSpan(_Model):
    file: str
    start_line: int
    end_line: int
    function: str = ""


# --------------------------------------------------------------------- eager ----
class EagerOps(_Model):
    """ATen ops one eager (uncompiled) training step dispatched."""

    total: int = Field(0, description="every dispatched ATen op, views included")
    kernel_ops: int = Field(0, description="ops that launch work (view / metadata ops excluded)")
    by_phase: dict[str, int] = Field(default_factory=dict,
                                     description="kernel ops per phase: model, backward, optimizer:<Class>, other")
    by_op: dict[str, int] = Field(default_factory=dict, description="'aten.mul' -> count (views included)")
    by_line: dict[str, int] = Field(default_factory=dict, description="'file:line' -> kernel ops")
    by_line_ops: dict[str, dict[str, int]] = Field(default_factory=dict, description="'file:line' -> op -> count")
    syncs: dict[str, int] = Field(default_factory=dict, description="'file:line' -> host syncs (.item() ...)")


# -------------------------------------------------------------------- graphs ----
class KernelRecord(_Model):
    """One kernel launch in a compiled graph's call()."""

    id: str = Field(..., description="g<graph>:<launch index>")
    graph_id: int
    phase: Phase
    region: str = Field("model", description="what was compiled: model, optimizer:<Class>")
    name: str = Field(..., description="kernel as generated: triton_per_fused_..., cpp_fused_..., extern_kernels.mm")
    handle: str | None = Field(None, description="provenance debug handle 'name:N'")
    kind: KernelKind
    backend: Literal["triton", "cpp", "extern", "aten", "other"]
    post_grad_nodes: list[str] = Field(default_factory=list)
    aten_ops: list[str] = Field(default_factory=list, description="'aten.pow', 'prims.fma' (no overload)")
    sources: list[SourceLoc] = Field(default_factory=list, description="innermost user lines of its nodes")
    call_sites: list[SourceLoc] = Field(default_factory=list, description="the enclosing module forward's lines")
    modules: list[str] = Field(default_factory=list, description="innermost nn.Module classes")
    differentiates: bool = Field(False, description="backward kernel: its sources are the forward lines it differentiates")
    launches_per_step: int = 1
    patterns: list[str] = Field(default_factory=list)
    supernode: str | None = None

    @property
    def is_library(self) -> bool:
        return self.kind in LIBRARY_KINDS or self.backend in ("extern", "aten")


class GraphRecord(_Model):
    id: int
    phase: Phase
    region: str = "model"
    calls_per_step: int = 1
    launches_per_call: int = 0
    generated_kernels: int = Field(0, description="Triton / C++ kernel launches per call")
    library_calls: int = Field(0, description="mm / bmm / attention / other library launches per call")
    post_grad_nodes: int = 0
    code_file: str | None = None
    codegen_error: str | None = None
    fusion_groups: dict[str, int] = Field(default_factory=dict)

    @property
    def launches_per_step(self) -> int:
        return self.launches_per_call * self.calls_per_step


class GraphBreak(_Model):
    reason: str
    file: str | None = None
    line: int | None = None
    function: str = ""
    user_code: bool = False
    count: int = 1


class MatmulDtype(_Model):
    op: str
    phase: Phase
    input_dtypes: list[str] = Field(default_factory=list)
    out_dtype: str | None = None
    count: int = 1


class GraphMatch(_Model):
    """A pattern found by the dataflow of a post-grad graph (`evidence.graph_match`), with the
    source lines its nodes came from: the statements a rewrite of it replaces."""

    pattern: str
    graph_id: int
    nodes: list[str] = Field(default_factory=list, description="post-grad node names, in match order")
    ops: list[str] = Field(default_factory=list, description="their ATen ops (no namespace or overload)")
    spans: list[SourceSpan] = Field(default_factory=list, description="the program lines the nodes came from")
    module: str = Field("", description="the nn.Module class most of its nodes ran in")
    roles: dict[str, str] = Field(default_factory=dict, description="what each part is: the products, the "
                                                                    "scale, the mask, dropout, eps, ...")


# ---------------------------------------------------------- supernodes/intents ----
class Supernode(_Model):
    id: str
    label: str
    family: str = Field(..., description="attention_input, attention, norm, mlp, loss, embedding, optimizer, other")
    patterns: list[str] = Field(default_factory=list)
    kernel_ids: list[str] = Field(default_factory=list)
    phases: list[str] = Field(default_factory=list)
    spans: list[SourceSpan] = Field(default_factory=list)
    modules: list[str] = Field(default_factory=list)
    compiled_launches_per_step: int = 0
    library_launches_per_step: int = 0
    eager_ops_per_step: int | None = Field(None, description="eager kernel ops attributed to its lines")
    aten_ops: list[str] = Field(default_factory=list)


class IntentEvidence(_Model):
    kernels: list[str] = Field(default_factory=list, description="kernel names")
    kernel_ids: list[str] = Field(default_factory=list)
    aten_ops: list[list[str]] = Field(default_factory=list, description="ATen ops of the first kernels")
    source_text: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class Intent(_Model):
    id: str
    pattern: Pattern
    gap_class: GapClass
    level: Level
    summary: str
    kind: Literal["compiler", "porting"] = "compiler"
    eager_ops: list[str] = Field(default_factory=list, description="'aten::pow' style, as the profiler names them")
    eager_ops_removed: int = Field(0, description="eager ops per step the compiled form does not launch")
    spans: list[SourceSpan] = Field(default_factory=list)
    evidence: IntentEvidence = Field(default_factory=IntentEvidence)
    confidence: float = Field(..., ge=0.0, le=1.0)
    grade: Grade
    target_ops: dict[str, list[TargetOp]] = Field(
        default_factory=dict, validation_alias=AliasChoices("target_ops", "targets"),
        description="per target (npu, cpu, cuda): what to use instead")
    supernode: str | None = None

    @property
    def targets(self) -> dict[str, list[TargetOp]]:
        return self.target_ops


# -------------------------------------------------------------------- bundle ----
class EvidenceBundle(_Model):
    schema_version: int = SCHEMA_VERSION
    route: Route
    device: str = Field(..., description="device whose compiler decisions these are: cuda | cpu")
    torch_version: str
    triton_version: str | None = None
    workload: str = Field("", validation_alias=AliasChoices("workload", "workload_name"))
    program_sha: str = ""
    source_root: str | None = None
    kernels: list[KernelRecord] = Field(default_factory=list)
    graphs: list[GraphRecord] = Field(default_factory=list)
    graph_breaks: list[GraphBreak] = Field(default_factory=list)
    eager: EagerOps | None = None
    eager_ops_per_step: int | None = Field(None, description="eager kernel ops (views excluded) per step")
    compiled_launches_per_step: int = 0
    fragmentation_ratio: float | None = Field(None, description="eager_ops_per_step / compiled_launches_per_step")
    matmul_dtypes: list[MatmulDtype] = Field(default_factory=list)
    supernodes: list[Supernode] = Field(default_factory=list)
    intents: list[Intent] = Field(default_factory=list)
    graph_matches: list[GraphMatch] = Field(default_factory=list, description="patterns found by the "
                                            "graphs' dataflow; each became or confirmed an intent")
    limitations: list[str] = Field(default_factory=list)
    collect_seconds: float | None = None

    # ---------------------------------------------------------------- files ----
    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        return cls.model_json_schema()

    @classmethod
    def write_schema(cls, path: str | Path) -> Path:
        return write_schema(path)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "EvidenceBundle":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no evidence bundle here")
        try:
            return cls.model_validate_json(path.read_text())
        except ValueError as e:
            raise ValueError(f"{path}: not a valid evidence bundle: {e}") from e

    # -------------------------------------------------------------- queries ----
    def intents_for(self, pattern: str) -> list[Intent]:
        return [i for i in self.intents if i.pattern == pattern]

    def kernels_in(self, phase: str) -> list[KernelRecord]:
        return [k for k in self.kernels if k.phase == phase]


def write_schema(path: str | Path) -> Path:
    """Write the bundle's JSON schema (for other tools reading bundles)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = EvidenceBundle.json_schema()
    schema.setdefault("title", "EvidenceBundle")
    path.write_text(json.dumps(schema, indent=1))
    return path


def render_summary(bundle: EvidenceBundle, console=None) -> None:
    """Print a bundle's graphs, supernodes and intents as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    head = (f"[bold]{bundle.workload or 'program'}[/bold]: route {bundle.route}, device {bundle.device}, "
            f"torch {bundle.torch_version}; compiled launches per step {bundle.compiled_launches_per_step}")
    if bundle.eager_ops_per_step is not None:
        head += f", eager ops per step {bundle.eager_ops_per_step}"
    head += (f", fragmentation {bundle.fragmentation_ratio:.1f}x" if bundle.fragmentation_ratio
             else ", fragmentation unknown")
    console.print(head)
    for g in bundle.graphs:
        console.print(f"  graph {g.id} [{g.phase}] {g.region}: {g.launches_per_call} launches x {g.calls_per_step}/step "
                      f"({g.generated_kernels} generated, {g.library_calls} library)"
                      + (f" - codegen error: {g.codegen_error}" if g.codegen_error else ""))
    if bundle.graph_breaks:
        console.print("  graph breaks: " + "; ".join(
            f"{b.file}:{b.line} x{b.count} {b.reason[:70]}" for b in bundle.graph_breaks[:5]))

    t = Table(title="supernodes")
    for col in ("id", "label", "lines", "phases", "compiled/step", "eager ops/step"):
        t.add_column(col)
    for s in bundle.supernodes:
        lines = ", ".join(f"{sp.file}:{sp.start_line}-{sp.end_line}" for sp in s.spans[:3])
        t.add_row(s.id, s.label, lines, ",".join(s.phases), str(s.compiled_launches_per_step),
                  "-" if s.eager_ops_per_step is None else str(s.eager_ops_per_step))
    console.print(t)

    if bundle.graph_matches:
        t = Table(title="found by the graph's dataflow")
        for col in ("pattern", "lines", "module", "roles"):
            t.add_column(col)
        for m in bundle.graph_matches:
            t.add_row(m.pattern, ", ".join(f"{sp.file}:{sp.start_line}-{sp.end_line}" for sp in m.spans[:3]),
                      m.module, "; ".join(f"{k} {v}" for k, v in m.roles.items()))
        console.print(t)

    t = Table(title="intents")
    for col in ("id", "pattern", "gap", "level", "confidence", "eager ops removed", "summary"):
        t.add_column(col)
    for i in bundle.intents:
        t.add_row(i.id, i.pattern, i.gap_class, i.level, f"{i.confidence:.2f} ({i.grade})",
                  str(i.eager_ops_removed), i.summary)
    console.print(t)
    for lim in bundle.limitations:
        console.print(f"[dim]limitation: {lim}[/dim]")
