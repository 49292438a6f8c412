"""What the two attention porters share: the shim copy for a target, line numbers, argument edits.

Why here: `flex_attention` and `flash_attention` rewrite different APIs but record their
edits the same way (one `PortChange` per edit, a `PortBlocker` per construct they cannot
port) and add their shim the same way, with the attention operator chosen for the target
written into the copy (`BACKEND = "npu_fusion_attention"` on npu), so the ported program
needs nothing from TrainBridge at run time.
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ...pysource.syntax import code
from ..port_models import PortChange, PortTarget
from ..shims import add_shim, shim_filename
from . import PortBlocker

_BACKEND_LINE = 'BACKEND = "sdpa"'
_BACKEND_FOR = {"cpu": "sdpa", "npu": "npu_fusion_attention"}


def shim_module(name: str) -> str:
    """The import name of shim `name` in the ported program (`_tb_<name>`)."""
    return shim_filename(name)[: -len(".py")]


def with_shim(files: dict[str, str], name: str, target: PortTarget) -> tuple[dict[str, str], PortChange]:
    """`files` plus shim `name` set to the target's operator, and the change that records it."""
    out = add_shim(files, name)
    fname = shim_filename(name)
    backend = _BACKEND_FOR[target]
    text = out[fname]
    if _BACKEND_LINE not in text:
        raise RuntimeError(f"shim {fname} lost its `{_BACKEND_LINE}` line")
    out[fname] = text.replace(_BACKEND_LINE, f'BACKEND = "{backend}"', 1)
    change = PortChange(file=fname, line=1, kind="shim_added", before="", after=fname,
                        note=f"replacement module copied beside the program (BACKEND = {backend!r})")
    return out, change


class Recorder(cst.CSTTransformer):
    """Base transformer: line numbers of original nodes, and the changes/blockers of one file."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, file: str):
        super().__init__()
        self.file = file
        self.changes: list[PortChange] = []
        self.blockers: list[PortBlocker] = []

    def line(self, node: cst.CSTNode) -> int:
        try:
            return self.get_metadata(PositionProvider, node).start.line
        except KeyError:
            return 0

    def change(self, node, kind, before: str, after: str, note: str = "") -> None:
        self.changes.append(PortChange(file=self.file, line=self.line(node), kind=kind, before=before, after=after,
                                       note=note))

    def block(self, node, construct: str, reason: str) -> None:
        self.blockers.append(PortBlocker(file=self.file, line=self.line(node), construct=construct, reason=reason))


def run(text: str, transformer: Recorder) -> str:
    """Apply `transformer` to `text` with line metadata; the new text."""
    return MetadataWrapper(cst.parse_module(text)).visit(transformer).code


def without_kwarg(call: cst.Call, name: str) -> cst.Call:
    """`call` minus keyword argument `name`, keeping the commas valid."""
    args = [a for a in call.args if not (a.keyword is not None and a.keyword.value == name)]
    if args and len(args) < len(call.args):
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)


def literal_value(node):
    """Python value of a literal argument (None, True/False, numbers, strings), else the `...` sentinel."""
    try:
        return ast.literal_eval(code(node))
    except Exception:  # noqa: BLE001 - not a literal
        return ...


def unparseable(file: str, err: Exception) -> PortBlocker:
    return PortBlocker(file=file, line=getattr(err, "raw_line", 0) or 0, construct="the file itself",
                       reason=f"libcst cannot parse it: {str(err).splitlines()[0] if str(err) else type(err).__name__}")
