"""Run a function on a module as soon as the program imports it, without importing it first.

Why: the child sets Inductor's `fallback_random` so that compiled regions draw eager's random
numbers (`RunRequest.eager_random_streams`). Importing `torch._inductor.config` just to set it
cost about 1.6 s a process on a 2-core EPYC, paid by every run of every program, most of which
never compile; set as the program first imports Inductor, it costs the others nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """`then(module)` right after `name` is first executed (at once if it already was)."""
    if name in sys.modules:
        then(sys.modules[name])
        return
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the other finders and wraps its loader's exec_module; leaves
    `sys.meta_path` as it found it once used."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then(module)

        spec.loader.exec_module = exec_module
        return spec
