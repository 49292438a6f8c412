"""Eager ATen ops of one training step, by phase, op and user source line.

A `TorchDispatchMode` sees every ATen op the eager step dispatches. Forward (and
optimizer / host) ops are attributed to the innermost user frame of the live Python stack;
backward ops, which run inside the autograd engine, to the forward line that created their
autograd node: anomaly mode (`torch.autograd.set_detect_anomaly(True, check_nan=False)`,
public API) records that line in each node's `metadata["traceback_"]`.
"""

from __future__ import annotations

import sys
import warnings
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .bundle import EagerOps
from .frames import SourceFilter

# ops that only produce views / metadata: no kernel launch on a GPU
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select", "split",
    "split_with_sizes", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "unbind", "_reshape_alias",
    "lift_fresh", "view_as", "numpy_T", "chunk", "narrow", "diagonal", "unfold", "_unsafe_split",
    "real", "imag", "view_as_real", "view_as_complex", "_neg_view", "_conj", "conj", "resolve_conj",
    "resolve_neg", "set_", "_local_scalar_dense_meta", "is_same_size", "sym_size", "sym_stride",
    "sym_numel", "sym_storage_offset", "dim", "size", "stride", "storage_offset", "is_contiguous",
    "_has_compatible_shallow_copy_type", "empty_like_meta",
})
SYNC_OPS = frozenset({"_local_scalar_dense", "item", "_assert_async", "nonzero", "masked_select", "unique",
                      "_unique2", "equal"})


class EagerStepProfiler(TorchDispatchMode):
    """Counts dispatched ATen ops; `phase` is set by the collector around regions it knows."""

    def __init__(self, source_filter: SourceFilter):
        super().__init__()
        self.filter = source_filter
        self.phase = "other"
        self.by_op: Counter[str] = Counter()
        self.by_phase: Counter[str] = Counter()
        self.by_line: Counter[str] = Counter()
        self.syncs: Counter[str] = Counter()
        self.by_line_ops: dict[str, Counter[str]] = {}
        self.total = 0
        self.kernel_ops = 0
        self._node_line: dict[int, str | None] = {}
        self._anomaly_prev: tuple[bool, bool] | None = None
        self.active = False

    # --------------------------------------------------------------- control ----
    def start(self) -> None:
        self._anomaly_prev = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.autograd.set_detect_anomaly(True, check_nan=False)
        self.__enter__()
        self.active = True

    def stop(self) -> None:
        if not self.active:
            return
        self.__exit__(None, None, None)
        self.active = False
        if self._anomaly_prev is not None:
            enabled, check_nan = self._anomaly_prev
            torch.autograd.set_detect_anomaly(enabled, check_nan=check_nan)

    def result(self) -> EagerOps:
        return EagerOps(total=self.total, kernel_ops=self.kernel_ops, by_phase=dict(self.by_phase),
                        by_op=dict(self.by_op.most_common()), by_line=dict(self.by_line.most_common()),
                        by_line_ops={k: dict(v) for k, v in self.by_line_ops.items()}, syncs=dict(self.syncs))

    # -------------------------------------------------------------- dispatch ----
    def _line_of_node(self, node) -> str | None:
        key = id(node)
        if key not in self._node_line:
            tb = None
            try:
                tb = node.metadata.get("traceback_")
            except Exception:  # pragma: no cover - nodes without metadata
                pass
            frames = self.filter.frames_from_trace("".join(tb)) if tb else []
            self._node_line[key] = frames[-1].key if frames else None
        return self._node_line[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.overloadpacket
        name = getattr(packet, "__name__", str(packet))
        ns = func.namespace if hasattr(func, "namespace") else "aten"
        if ns != "profiler":
            self.total += 1
            self.by_op[f"{ns}.{name}"] += 1
            node = torch._C._current_autograd_node()
            phase = "backward" if node is not None else self.phase
            if name not in VIEW_OPS:
                self.kernel_ops += 1
                self.by_phase[phase] += 1
                if node is not None:
                    line = self._line_of_node(node)
                else:
                    line = self.filter.innermost_key(sys._getframe(1))
                if line is not None:
                    self.by_line[line] += 1
                    self.by_line_ops.setdefault(line, Counter())[f"{ns}.{name}"] += 1
                    if name in SYNC_OPS:
                        self.syncs[line] += 1
        return func(*args, **(kwargs or {}))
