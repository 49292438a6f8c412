"""Target backends: cpu (measured here), cuda and npu (same code path, measured on their machines).

`registry` holds one row of facts per target; `get_target` builds the in-process `Target`
(clock boundary, memory, profiler) the harness child uses.
"""

from __future__ import annotations

import importlib

from .base import Target, TargetUnavailable
from .registry import TARGET_NAMES, TARGETS, TargetName, TargetSpec, target_spec


def get_target(name: str) -> Target:
    module, _, cls = target_spec(name).target_class.partition(":")
    return getattr(importlib.import_module(module), cls)()


__all__ = ["Target", "TargetUnavailable", "get_target", "TARGET_NAMES", "TARGETS", "TargetName", "TargetSpec",
           "target_spec"]
