"""The naive port of a GPU program, as a source transformation a person can review.

What the public NPU ports did by hand (method.md, "the naive port"): device strings and
`torch.cuda.*` calls mapped to the target, NCCL -> gloo (cpu) / HCCL (npu), `torch.compile`
removed, `pin_memory` dropped. Every change is a `PortChange` with its line; GPU-only
features (FP8, FlexAttention, FlashAttention-3, Triton) are reported where they are, not
rewritten. A GPU program's `torch.autocast(device_type="cuda")` is left as it is on cpu,
exactly like a naive port: on CPU tensors it then does nothing, which is recorded as the
`precision_lost` porting artifact that a recipe later repairs.
"""

from __future__ import annotations

import re
from typing import Literal

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider
from pydantic import BaseModel, Field

PortTarget = Literal["cpu", "cuda", "npu"]

_CUDA_STR = re.compile(r"""^(?P<q>['"])cuda(:\d+)?(?P=q)$""")
# torch.cuda functions and what they become on cpu (None: replaced by the literal 0)
_CPU_EQUIV = {"synchronize", "current_device", "set_device", "device_count", "current_stream", "stream",
              "Stream", "Event"}
_MEMORY_STATS = {"max_memory_allocated", "max_memory_reserved", "memory_allocated", "memory_reserved"}
_GPU_ONLY = {
    "_scaled_mm": "FP8 matmul (torch._scaled_mm): no FP8 on this target; the ports used bf16 matmuls",
    "float8_e4m3fn": "FP8 dtype", "float8_e5m2": "FP8 dtype",
    "flex_attention": "FlexAttention: GPU-only; port to SDPA / npu_fusion_attention with an explicit mask",
    "create_block_mask": "FlexAttention block mask",
    "flash_attn_varlen_func": "FlashAttention-3 varlen: on Ascend npu_fusion_attention with TND layout",
    "flash_attn_interface": "FlashAttention-3",
    "multi_processor_count": "SM-count query",
}


class PortChange(BaseModel):
    file: str
    line: int
    kind: Literal["device", "cuda_api", "memory_stat", "backend", "pin_memory", "compile_removed",
                  "precision_lost", "precision", "import", "gpu_only_feature"]
    before: str
    after: str
    semantic_change: bool = False
    note: str = ""


class PortResult(BaseModel):
    target: PortTarget
    files: dict[str, str]
    changes: list[PortChange] = Field(default_factory=list)

    @property
    def gpu_only(self) -> list[PortChange]:
        return [c for c in self.changes if c.kind == "gpu_only_feature"]


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _is_torch_cuda_call(node: cst.Call) -> str | None:
    """'synchronize' for torch.cuda.synchronize(...), else None."""
    f = node.func
    if m.matches(f, m.Attribute(value=m.Attribute(value=m.Name("torch"), attr=m.Name("cuda")))):
        return f.attr.value
    return None


class _Porter(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str, target: PortTarget):
        super().__init__()
        self.file, self.target, self.changes = file, target, []
        self.dev = {"cpu": "cpu", "npu": "npu", "cuda": "cuda"}[target]
        self._autocast_depth = 0

    def _line(self, node) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def _note(self, node, kind, before, after, note="", semantic=False):
        self.changes.append(PortChange(file=self.file, line=self._line(node), kind=kind, before=before,
                                       after=after, note=note, semantic_change=semantic))

    # autocast: keep its device_type string on cpu (record), map it on npu
    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(attr=m.Name("autocast")) | m.Name("autocast")):
            self._autocast_depth += 1
            for a in node.args:
                if a.keyword and a.keyword.value == "device_type" and isinstance(a.value, cst.SimpleString) \
                        and _CUDA_STR.match(a.value.value):
                    if self.target == "cpu":
                        self._note(node, "precision_lost", _code(node), _code(node),
                                   "autocast(device_type='cuda') does nothing on CPU tensors: the port runs "
                                   "fp32 where the GPU ran bf16 (left as the naive port leaves it)")
                    elif self.target == "npu":
                        self._note(node, "precision", _code(a.value), '"npu"',
                                   "autocast device_type mapped to npu, as transfer_to_npu does")

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if m.matches(original.func, m.Attribute(attr=m.Name("autocast")) | m.Name("autocast")):
            self._autocast_depth -= 1
            if self.target == "cpu":
                # undo any device-string rewrite inside autocast's device_type argument
                args = [a.with_changes(value=o.value) if a.keyword and a.keyword.value == "device_type" else a
                        for a, o in zip(updated.args, original.args)]
                return updated.with_changes(args=args)
        if self.target == "cuda":
            return updated
        name = _is_torch_cuda_call(original)
        if name is not None:
            if name in _MEMORY_STATS and self.target == "cpu":
                self._note(original, "memory_stat", _code(original), "0",
                           "no device allocator on cpu: the harness reports peak RSS")
                return cst.Integer("0")
            if self.target == "npu" or name in _CPU_EQUIV:
                ns = "npu" if self.target == "npu" else "cpu"
                new = updated.with_changes(func=cst.Attribute(
                    value=cst.Attribute(value=cst.Name("torch"), attr=cst.Name(ns)), attr=cst.Name(name)))
                self._note(original, "cuda_api", _code(original), _code(new))
                return new
        # x.cuda() -> x.to(device)
        if m.matches(original.func, m.Attribute(attr=m.Name("cuda"))) and not m.matches(
                original.func, m.Attribute(value=m.Name("torch"))):
            new = updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")),
                                       args=[cst.Arg(cst.SimpleString(f'"{self.dev}"'))])
            self._note(original, "device", _code(original), _code(new))
            return new
        # torch.compile(model, ...) -> model
        if m.matches(original.func, m.Attribute(value=m.Name("torch"), attr=m.Name("compile"))) and original.args:
            self._note(original, "compile_removed", _code(original), _code(updated.args[0].value),
                       "the naive port runs eager (all torch.compile removed)")
            return updated.args[0].value
        return updated

    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        if self.target != "cuda" and _CUDA_STR.match(original.value):
            q = original.value[0]
            new = cst.SimpleString(f"{q}{self.dev}{q}")
            if not (self._autocast_depth and self.target == "cpu"):
                self._note(original, "device", original.value, new.value)
            return new
        if self.target != "cuda" and original.value[1:-1] == "nccl":
            q = original.value[0]
            backend = "gloo" if self.target == "cpu" else "hccl"
            self._note(original, "backend", original.value, f"{q}{backend}{q}")
            return cst.SimpleString(f"{q}{backend}{q}")
        return updated

    def leave_FormattedString(self, original, updated):
        if self.target == "cuda":
            return updated
        first = original.parts[0] if original.parts else None
        if isinstance(first, cst.FormattedStringText) and first.value.startswith("cuda:"):
            q = original.end
            new = cst.SimpleString(f"{q}{self.dev}{q}")
            self._note(original, "device", _code(original), new.value,
                       "per-rank device index dropped: one device per process on this target")
            return new
        return updated

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg):
        if self.target in ("cpu", "npu") and original.keyword and original.keyword.value == "pin_memory" \
                and m.matches(original.value, m.Name("True")):
            self._note(original, "pin_memory", "pin_memory=True", "pin_memory=False",
                       "no pinned-memory allocator on cpu" if self.target == "cpu"
                       else "the public NPU ports removed pin_memory")
            return updated.with_changes(value=cst.Name("False"))
        return updated

    def leave_Decorator(self, original: cst.Decorator, updated: cst.Decorator):
        d = original.decorator
        target = d.func if isinstance(d, cst.Call) else d
        if self.target != "cuda" and m.matches(target, m.Attribute(value=m.Name("torch"), attr=m.Name("compile"))):
            self._note(original, "compile_removed", _code(d), "(removed)", "the naive port runs eager")
            return cst.RemoveFromParent()
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute):
        if original.attr.value in _GPU_ONLY:
            self._note(original, "gpu_only_feature", _code(original), _code(original),
                       _GPU_ONLY[original.attr.value], semantic=True)
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name):
        if original.value in ("flex_attention", "create_block_mask", "flash_attn_varlen_func"):
            self._note(original, "gpu_only_feature", original.value, original.value, _GPU_ONLY[original.value],
                       semantic=True)
        return updated

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = _code(alias.name)
            if name.split(".")[0] in ("triton", "flash_attn_interface"):
                self._note(node, "gpu_only_feature", _code(node), _code(node),
                           "Triton / FlashAttention kernels: replace with PyTorch on this target", semantic=True)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = _code(node.module) if node.module else ""
        if mod.split(".")[0] in ("triton", "flash_attn_interface") or "flex_attention" in mod:
            self._note(node, "gpu_only_feature", _code(node), _code(node),
                       "GPU-only kernels imported: replace with PyTorch on this target", semantic=True)


class _AddTorchNpuImport(cst.CSTTransformer):
    """`import torch_npu` right after the first `import torch` (the npu backend registers then)."""

    def __init__(self):
        self.done = False

    def leave_Module(self, original, updated):
        body = list(updated.body)
        for i, stmt in enumerate(body):
            if m.matches(stmt, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])):
                body.insert(i + 1, cst.parse_statement("import torch_npu  # noqa: F401  (registers the npu device)"))
                self.done = True
                break
        return updated.with_changes(body=body)


def port_source(text: str, file: str, target: PortTarget) -> tuple[str, list[PortChange]]:
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module)
    porter = _Porter(file, target)
    new = wrapper.visit(porter)
    changes = porter.changes
    if target == "npu" and "import torch_npu" not in text:
        adder = _AddTorchNpuImport()
        new = new.visit(adder)
        if adder.done:
            changes.append(PortChange(file=file, line=1, kind="import", before="", after="import torch_npu"))
    return new.code, changes


def port_program(files: dict[str, str], target: PortTarget) -> PortResult:
    """Port every Python file of a program; other files pass through unchanged."""
    out, changes = {}, []
    for rel, text in files.items():
        if not rel.endswith(".py") or target == "cuda":
            out[rel] = text
            continue
        out[rel], ch = port_source(text, rel, target)
        changes.extend(ch)
    return PortResult(target=target, files=out, changes=changes)
