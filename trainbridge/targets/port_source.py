"""The naive port of a GPU program, as a source transformation a person can review.

What the public NPU ports did by hand (docs/method.md), done by libcst so each change is a
`PortChange` with its line. The rewrite rules (device strings, `torch.cuda`, NCCL,
`torch.compile`, autocast, GPU-only features reported) are the transformer in
`port_transformer.py`; the models in `port_models.py`. This module applies them:
`port_source` to one file's text (adding `import torch_npu` on npu), `port_naive` to every
Python file of a program, and `port_program` adds the feature porters (`features/`).

Target cuda: the program is returned unchanged.
"""

from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper

from ..pysource.syntax import code
from .port_models import PortChange, PortResult, PortTarget
from .port_transformer import _compiler_aliases, _Porter
from .registry import target_spec


class _AddTorchNpuImport(cst.CSTTransformer):
    """`import torch_npu` right after the first top-level torch import (registers the npu device)."""

    def __init__(self):
        super().__init__()
        self.done = False

    def leave_Module(self, original, updated):
        body = list(updated.body)
        for i, s in enumerate(body):
            if m.matches(s, m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("torch"))])])):
                body.insert(i + 1, cst.parse_statement("import torch_npu  # noqa: F401  (registers the npu device)\n"))
                self.done = True
                break
        else:
            for i, s in enumerate(body):
                if m.matches(s, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) and "torch" in code(s):
                    body.insert(i, cst.parse_statement("import torch_npu  # noqa: F401  (registers the npu device)\n"))
                    self.done = True
                    break
        return updated.with_changes(body=body)


def port_source(text: str, file: str, target: PortTarget, *,
                keep_autocast: bool = False) -> tuple[str, list[PortChange]]:
    """Port one file's text; returns (new text, changes). `keep_autocast`: on the cpu target,
    point a cuda autocast at the cpu instead of leaving it inert."""
    if target_spec(target).source_device:
        return text, []
    module = cst.parse_module(text)
    wrapper = MetadataWrapper(module)
    porter = _Porter(file, target, _compiler_aliases(module), keep_autocast=keep_autocast)
    new = wrapper.visit(porter)
    changes = porter.changes
    if target == "npu" and "torch" in text and not re.search(r"^\s*import torch_npu", text, re.M):
        adder = _AddTorchNpuImport()
        new = new.visit(adder)
        if adder.done:
            changes.append(PortChange(file=file, line=1, kind="import", before="", after="import torch_npu",
                                      note="torch_npu registers the npu device and its operators"))
    changes.sort(key=lambda c: c.line)
    return new.code, changes


def port_naive(files: dict[str, str], target: PortTarget, *, keep_autocast: bool = False) -> PortResult:
    """The naive port of every Python file (devices, torch.cuda, NCCL, torch.compile), GPU-only
    features reported but left as they are; other files pass through unchanged."""
    out, changes = {}, []
    for rel, text in files.items():
        if not rel.endswith(".py") or target_spec(target).source_device:
            out[rel] = text
            continue
        out[rel], ch = port_source(text, rel, target, keep_autocast=keep_autocast)
        changes.extend(ch)
    return PortResult(target=target, files=out, changes=changes)


def port_program(files: dict[str, str], target: PortTarget, *, keep_autocast: bool = False) -> PortResult:
    """The whole port: the naive port, then each GPU-only feature replaced by its porter
    (targets/features/). A feature the porters could not replace is a `PortBlocker` naming
    the construct; the naive port's report of a feature that was replaced is dropped."""
    from .features.pipeline import port_features

    naive = port_naive(files, target, keep_autocast=keep_autocast)
    if target_spec(target).source_device:
        return naive
    return port_features(naive)
