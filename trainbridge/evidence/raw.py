"""The raw capture: what the collector saw, before any interpretation.

Written by `InductorCapturePlugin.finalize` (or `capture_step`) as JSON and turned into an
`EvidenceBundle` by `build_bundle`. Frames are already filtered to the program's own files
and made relative to its folder; everything else is kept as Inductor produced it, so the
bundle can be rebuilt (better analysis, same capture) without recompiling.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from .bundle import EagerOps, Phase, Route, SourceLoc


class RawNode(BaseModel):
    """One post-grad FX node of a compiled graph."""

    model_config = ConfigDict(ser_json_inf_nan="strings")  # a mask's -inf stays -inf in valid JSON

    target: str = Field(..., description="e.g. aten.mul.Tensor, prims.fma.default")
    seq_nr: int | None = None
    backward: bool = False
    stack: list[SourceLoc] = Field(default_factory=list, description="user frames, outermost first")
    modules: list[str] = Field(default_factory=list, description="nn_module_stack: 'path:Class', outermost first")
    dtype: str | None = None
    shape: list[int] | None = None
    in_dtypes: list[str] = Field(default_factory=list)
    tensor_args: int = Field(0, description="how many of the node's positional args are graph values")
    inputs: list[str] = Field(default_factory=list, description="names of the nodes it reads, in argument order: "
                                                                "the graph's edges (captures before these were "
                                                                "recorded have none, and get no graph matches)")
    library_module: str = Field("", description="the innermost nn.Module's class when torch defines it "
                                                "(torch.nn.modules.normalization.LayerNorm): a library op")
    scalars: list[float] = Field(default_factory=list, description="its number arguments (a scale, an epsilon, "
                                                                   "GELU's 0.044715), positional then keyword")


class RawLaunch(BaseModel):
    """One kernel launch line in the output code's call()."""

    name: str
    handle: str | None = None
    kind: str = "other"
    backend: str = "other"
    nodes: list[str] = Field(default_factory=list, description="post-grad node names (provenance or header)")
    header_aten: list[str] = Field(default_factory=list, description="'Original ATen' of the kernel's header")
    line: int = 0


class RawGraph(BaseModel):
    id: int
    phase: Phase
    region: str = "model"
    calls_per_step: int = 1
    device: str = "cpu"
    launches: list[RawLaunch] = Field(default_factory=list)
    nodes: dict[str, RawNode] = Field(default_factory=dict)
    code_file: str | None = None
    codegen_error: str | None = None
    fusion_groups: dict[str, int] = Field(default_factory=dict, description="ir_post_fusion.txt scheduler node kinds")


class RawGraphBreak(BaseModel):
    reason: str
    file: str | None = None
    line: int | None = None
    function: str = ""
    user_code: bool = False
    user_stack: list[SourceLoc] = Field(default_factory=list)


class RawCapture(BaseModel):
    version: int = 1
    route: Route
    device: str
    torch_version: str
    triton_version: str | None = None
    source_root: str | None = None
    program_sha: str = ""
    graphs: list[RawGraph] = Field(default_factory=list)
    graph_breaks: list[RawGraphBreak] = Field(default_factory=list)
    graph_break_count: int = 0
    eager: EagerOps | None = None
    compiled_steps_observed: int = 0
    limitations: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.model_dump_json())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "RawCapture":
        return cls.model_validate_json(Path(path).read_text())
