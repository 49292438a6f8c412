"""Optimizers a program writes itself, seen by the step clock like torch.optim ones.

The clock ends a step when every optimizer of the first step has stepped again, using
torch.optim's global step hooks. Programs that write their optimizer as a plain class (the
Modded-NanoGPT records from 2026-01 on: `NorMuonAndAdam`, not a `torch.optim.Optimizer`)
never fire those hooks, so the harness would see no step at all and let the program run
to its end. This module wraps, as each class statement of the program's own files runs
(`builtins.__build_class__`), the `step` method of a class that is not a torch.optim
optimizer; the wrapper reports to the clock only for an instance that holds parameters
(an LR schedule or a training manager with a `step` method holds none), so only the
program's optimizers count. Classes from outside the program folder (torch, libraries) are
never touched.
"""

from __future__ import annotations

import builtins
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

Hook = Callable[[object, tuple, dict], None]


def holds_parameters(obj: object, depth: int = 3) -> bool:
    """Whether `obj`'s attributes reach an nn.Parameter within `depth` containers
    (a list of params, a dict keyed or valued by params, param_groups' dicts)."""

    def reach(value, d: int) -> bool:
        if isinstance(value, torch.nn.Parameter):
            return True
        if d <= 0:
            return False
        if isinstance(value, dict):
            return any(reach(k, d - 1) or reach(v, d - 1) for k, v in list(value.items())[:64])
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(reach(v, d - 1) for v in list(value)[:64])
        return False

    return any(reach(v, depth) for v in list(getattr(obj, "__dict__", {}).values()))


class HandwrittenOptimizerHooks:
    """Installs the class-statement hook; `before` / `after` get (optimizer, args, kwargs)."""

    def __init__(self, root: Path, before: Hook, after: Hook):
        self.roots = tuple({str(root) + os.sep, str(Path(root).resolve()) + os.sep})
        self.before, self.after = before, after
        self.wrapped: list[str] = []  # qualnames, for the run's record
        self._original = None

    def _in_program(self, filename: str) -> bool:
        return filename.startswith(self.roots)

    def _wrap(self, cls: type) -> None:
        raw = cls.__dict__.get("step")
        if raw is None or isinstance(raw, (staticmethod, classmethod, property)) or not callable(raw):
            return
        if issubclass(cls, torch.optim.Optimizer) or issubclass(cls, torch.nn.Module):
            return
        hooks, verdict = self, {}

        @functools.wraps(raw)
        def step(self_opt, *args, **kwargs):
            counts = verdict.get(id(self_opt))
            if counts is None:
                counts = verdict[id(self_opt)] = holds_parameters(self_opt)
            if not counts:
                return raw(self_opt, *args, **kwargs)
            hooks.before(self_opt, args, kwargs)
            out = raw(self_opt, *args, **kwargs)
            hooks.after(self_opt, args, kwargs)
            return out

        cls.step = step
        self.wrapped.append(cls.__qualname__)

    def install(self) -> None:
        original = self._original = builtins.__build_class__
        hooks = self

        def build_class(func, name, *bases, **kwargs):
            cls = original(func, name, *bases, **kwargs)
            try:
                if hooks._in_program(sys._getframe(1).f_code.co_filename) and isinstance(cls, type):
                    hooks._wrap(cls)
            except Exception:  # never let the observer break a class statement
                pass
            return cls

        builtins.__build_class__ = build_class

    def uninstall(self) -> None:
        if self._original is not None:
            builtins.__build_class__ = self._original
            self._original = None
