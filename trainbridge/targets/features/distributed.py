"""torchrun / DDP programs on a one-rank process group.

GPU training programs expect torchrun: `RANK`, `WORLD_SIZE`, `LOCAL_RANK` in the environment,
`dist.init_process_group("nccl", device_id=...)`, one GPU per rank. The harness plays
torchrun for one rank (`harness/torchrun_env.py`) and the naive port turns NCCL into gloo
(cpu) or HCCL (npu), so the program's collectives really run. What is left is here:

* `init_process_group(..., device_id=...)`: gloo refuses a non-accelerator device_id (cpu);
  a composite backend string ("cuda:nccl,cpu:gloo") is mapped whole;
* `DDP(model, device_ids=[...])`: a CPU module takes no device_ids (cpu);
* `assert world_size == 8`: the program runs as one rank here; the assert goes, and every
  per-rank quantity computed from the world size (batch slices, gradient accumulation,
  validation steps) is listed as a `world_size` change, so the ledger says what one rank
  changed;
* gloo's reduce_scatter work has no `get_future()`, and gloo's tensor-form collectives
  (`all_gather_into_tensor`, `reduce_scatter_tensor`) want the rank dimension flat where NCCL
  takes any shape of the right size (`(world_size, n)` buffers): those calls go through
  `_tb_collectives` (cpu), which flattens and returns a completed future after the collective.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

from ..port_models import PortChange, PortTarget
from ..registry import target_spec
from ..shims import add_shim, shim_filename
from . import FeatureResult

SHIM = "collectives"
SHIM_MODULE = shim_filename(SHIM).removesuffix(".py")
_NO_FUTURE_ON_GLOO = {"reduce_scatter_tensor", "reduce_scatter", "all_gather_into_tensor"}
_WORLD = re.compile(r"world_size|WORLD_SIZE")
_DDP = {"DDP", "DistributedDataParallel"}


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node).strip()


def _last_name(func: cst.BaseExpression) -> str | None:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return None


def _dist_aliases(module: cst.Module) -> set[str]:
    """Local names bound to torch.distributed (`dist`, `torch.distributed`)."""
    names = {"torch.distributed"}
    for node in module.body:
        if not m.matches(node, m.SimpleStatementLine()):
            continue
        for small in node.body:
            if isinstance(small, cst.Import):
                for a in small.names:
                    if _code(a.name) == "torch.distributed" and a.asname is not None:
                        names.add(_code(a.asname.name))
            elif isinstance(small, cst.ImportFrom) and small.module is not None and _code(small.module) == "torch" \
                    and not isinstance(small.names, cst.ImportStar):
                for a in small.names:
                    if _code(a.name) == "distributed":
                        names.add(_code(a.asname.name) if a.asname else "distributed")
    return names


def _mentions_world_size(node: cst.CSTNode) -> bool:
    return bool(_WORLD.search(_code(node))) or "get_world_size" in _code(node)


def _compares_world_size_to_literal(test: cst.BaseExpression) -> bool:
    """`world_size == 8` (either side), the assert a one-rank run cannot satisfy."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = [test.left, target.comparator]
    literal = [s for s in sides if isinstance(s, cst.Integer)]
    named = [s for s in sides if isinstance(s, (cst.Name, cst.Attribute, cst.Call)) and _mentions_world_size(s)]
    return bool(literal and named and literal[0].evaluated_value != 1)


class _Distributed(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str, target: PortTarget, dist_names: set[str]):
        super().__init__()
        self.file, self.target, self.dist_names = file, target, dist_names
        self.changes: list[PortChange] = []
        self.uses_shim = False
        self._function_depth = 0

    def _line(self, node) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def _change(self, node, kind, before, after, note, semantic=False):
        self.changes.append(PortChange(file=self.file, line=self._line(node), kind=kind, before=before, after=after,
                                       note=note, semantic_change=semantic))

    # ------------------------------------------------------------ calls ----
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = _last_name(original.func)
        if name == "init_process_group":
            return self._init_process_group(original, updated)
        if name in _DDP and self.target == "cpu":
            kept = [a for a in updated.args if not (a.keyword and a.keyword.value in ("device_ids", "output_device"))]
            if len(kept) != len(updated.args):
                new = updated.with_changes(args=_fix_commas(kept))
                self._change(original, "distributed", _code(original), _code(new),
                             "a CPU module takes no device_ids: DDP runs it on the one-rank gloo group")
                return new
        if name in _NO_FUTURE_ON_GLOO and self.target == "cpu" and isinstance(original.func, cst.Attribute) \
                and _code(original.func.value) in self.dist_names:
            self.uses_shim = True
            new = updated.with_changes(func=cst.Attribute(value=cst.Name(SHIM_MODULE), attr=cst.Name(name)))
            self._change(original, "distributed", _code(original.func), _code(new.func),
                         f"gloo runs {name} but its work has no get_future(): the shim completes the future")
            return new
        return updated

    def _init_process_group(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        for i, a in enumerate(args):
            is_backend = (a.keyword and a.keyword.value == "backend") or (i == 0 and a.keyword is None)
            value = a.value
            if is_backend and isinstance(value, cst.SimpleString) and "nccl" in value.value and ":" in value.value:
                q = value.value[-1]
                spec = "gloo" if self.target == "cpu" else value.evaluated_value.replace("cuda:", "npu:").replace(
                    "nccl", "hccl")
                args[i] = a.with_changes(value=cst.SimpleString(f"{q}{spec}{q}"))
                self._change(original, "backend", value.value, f"{q}{spec}{q}",
                             "a per-device backend string, mapped whole to the target's collectives")
        if self.target == "cpu":
            kept = [a for a in args if not (a.keyword and a.keyword.value == "device_id")]
            if len(kept) != len(args):
                self._change(original, "distributed", _code(original), _code(updated.with_changes(args=_fix_commas(kept))),
                             "gloo takes no device_id (it must be an accelerator); the group is the harness's one rank")
                args = kept
        return updated.with_changes(args=_fix_commas(args))

    # ----------------------------------------------------------- asserts ----
    def leave_Assert(self, original: cst.Assert, updated: cst.Assert):
        if _compares_world_size_to_literal(original.test):
            self._change(original, "assert_dropped", _code(original), "(removed)",
                         "the harness runs one rank (world size 1); the program's per-rank quantities follow it",
                         semantic=True)
            return cst.RemoveFromParent()
        return updated

    # ------------------------------------------- world-size dependent values ----
    def visit_FunctionDef(self, node):
        self._function_depth += 1

    def leave_FunctionDef(self, original, updated):
        self._function_depth -= 1
        return updated

    def leave_Assign(self, original: cst.Assign, updated: cst.Assign):
        value = original.value
        reads_world = _mentions_world_size(value) and not _is_world_size_source(value)
        if reads_world and isinstance(value, (cst.BinaryOperation, cst.Call, cst.Subscript)):
            self._change(original, "world_size", _code(original), _code(original),
                         "per-rank quantity: computed from the world size, which is 1 here (the GPU run had 8 ranks)",
                         semantic=True)
        return updated


def _is_world_size_source(value: cst.BaseExpression) -> bool:
    """`int(os.environ["WORLD_SIZE"])`, `dist.get_world_size()`: where the size comes from, not a use."""
    text = _code(value)
    return bool(re.fullmatch(r"int\(os\.environ(\[|\.get\().*WORLD_SIZE.*\)", text)) or text.endswith("get_world_size()")


def _fix_commas(args: list[cst.Arg]) -> list[cst.Arg]:
    if not args:
        return args
    return [*args[:-1], args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)]


def _reads_torchrun_env(text: str) -> bool:
    return bool(re.search(r"""environ(\[|\.get\()\s*['"](RANK|WORLD_SIZE|LOCAL_RANK)['"]""", text))


def port(files: dict[str, str], target: PortTarget) -> FeatureResult:
    """Distributed constructs of every Python file, for one rank on the target."""
    if target_spec(target).source_device:
        return FeatureResult(files=dict(files))
    out, changes, shim = {}, [], False
    for rel, text in files.items():
        if not rel.endswith(".py") or ("distributed" not in text and "world_size" not in text):
            out[rel] = text
            continue
        module = cst.parse_module(text)
        tr = _Distributed(rel, target, _dist_aliases(module))
        new = MetadataWrapper(module).visit(tr)
        if tr.uses_shim:
            new = _import_shim(new)
            shim = True
        out[rel] = new.code
        if _reads_torchrun_env(text):
            changes.append(PortChange(
                file=rel, line=1, kind="distributed", before="torchrun (RANK, WORLD_SIZE, LOCAL_RANK)",
                after="the harness as torchrun for one rank",
                note="RANK=0, LOCAL_RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT set by the harness: a real one-rank "
                     + target_spec(target).dist_backend + " process group, so the collectives run"))
        changes.extend(tr.changes)
    if shim:
        out = add_shim(out, SHIM)
        changes.append(PortChange(file=shim_filename(SHIM), line=1, kind="shim_added", before="",
                                  after=shim_filename(SHIM), note="collectives in NCCL's shapes and with futures on gloo"))
    return FeatureResult(files=out, changes=changes)


def _import_shim(module: cst.Module) -> cst.Module:
    from ...pysource.imports import ensure_imports

    return ensure_imports(module, [f"import {SHIM_MODULE}"])
