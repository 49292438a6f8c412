"""Extension points of the child process, for instruments that need to see the program.

A plugin is named `module:Class` in `RunRequest.plugins`; the child constructs it with the
request's `plugin_options` and calls the hooks below. Evidence capture (compiling the root
module and the optimizers with Inductor) is one such plugin, so the harness itself stays
free of compiler details.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch


class HarnessPlugin:
    """Base class: override what you need. Hooks run in the child, on the main thread."""

    name = "plugin"

    def __init__(self, options: dict[str, str]):
        # Options that name paths are called `out`, `source_root` or `*_path|_dir|_root|_file`
        # and arrive absolute (RunRequest refuses relative ones): the child runs in the
        # program's folder, not in the parent's working directory.
        self.options = options

    def before_program(self) -> None:
        """Called after seeds/port are set up, before the program's first line runs."""

    def on_root_module(self, module: torch.nn.Module) -> None:
        """Called once with the first module called at top level (the model)."""

    def wrap_root_call(self, module: torch.nn.Module, call: Any) -> Any:
        """Return the callable used for the root module's forward (default: unchanged)."""
        return call

    def on_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Called once per optimizer, before its first step runs."""

    def on_step_end(self, step: int) -> None:
        """Called after each optimizer step boundary (1-based)."""

    def finalize(self, status: str) -> str | None:
        """Called once at the end; return the path of a file written, if any."""
        return None


def load_plugin(spec: str, options: dict[str, str]) -> HarnessPlugin:
    module_name, _, cls_name = spec.partition(":")
    if not cls_name:
        raise ValueError(f"plugin spec {spec!r} must be 'module:Class'")
    cls = getattr(importlib.import_module(module_name), cls_name)
    return cls(options)
