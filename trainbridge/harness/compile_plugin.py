"""`torch.compile` of the port, without editing it: the yardstick a final program must beat.

Wraps the root module's forward (so forward and backward are compiled, as
`model = torch.compile(model)` does in the GPU originals) and, with option
`optimizers=1`, each optimizer's step.
"""

from __future__ import annotations

import torch

from .plugins import HarnessPlugin


class CompilePortPlugin(HarnessPlugin):
    name = "compile_port"

    def _backend(self) -> str:
        return self.options.get("backend", "inductor")

    def wrap_root_call(self, module, call):
        return torch.compile(call, backend=self._backend())

    def on_optimizer(self, optimizer):
        if self.options.get("optimizers") != "1":
            return
        optimizer.step = torch.compile(optimizer.step, backend=self._backend())
