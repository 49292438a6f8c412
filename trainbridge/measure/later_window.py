"""The later-window loss check: losses compared from a trained state, not only from initialisation.

The first-K-steps loss check starts where near-identity operators are near the identity: a
tanh softcap on zero-initialised logits, a norm over activations already near unit scale.
Deleting one barely moves the first losses. So once per run the baseline is trained for a
few dozen steps and its model and optimizer state saved (a *trained state*); every
candidate's validation then also runs from that state, as many steps as a timed run and
without instruments (`agent.evaluate.later_window_shape`), and its losses are held to the
baseline's from the same state by the same rule as the first window.

Child side: `TrainedStatePlugin` saves the state at a step (mode `save`) or loads it into
the program's model before its first forward and into each optimizer before its first step
(mode `load`). Optimizer hyperparameters stay the candidate's own (a fused optimizer stays
fused); only the per-parameter state (moments, momentum buffers, step counts) is loaded.
A candidate whose model or optimizers do not take the baseline's state (other parameter
names or shapes, another optimizer count) fails the check: its work is no longer the
baseline's. A candidate that swallows the load error gains nothing: its losses are then
from initialisation and miss the trained ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from pydantic import BaseModel, Field

from ..harness.plugins import HarnessPlugin

PLUGIN = "trainbridge.measure.later_window:TrainedStatePlugin"


class TrainedStateReport(BaseModel):
    """What the plugin did in one run; read by the parent."""

    mode: str
    saved_at_step: int | None = None
    model_loaded: bool = False
    optimizers_loaded: int = 0
    optimizers_in_state: int = 0
    errors: list[str] = Field(default_factory=list)


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The model under torch.compile's and data-parallel wrappers, whose state_dict keys carry
    no `_orig_mod.` or `module.`: a candidate that adds or drops a wrapper still takes the state."""
    while True:
        if hasattr(module, "_orig_mod"):
            module = module._orig_mod
        elif isinstance(module, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            module = module.module
        else:
            return module


class TrainedStatePlugin(HarnessPlugin):
    """Options: `mode` (save|load); save: `out` (absolute .pt path), `after_step`; load: `trained_state`."""

    name = "trained_state"

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        self.mode = options["mode"]
        self.report = TrainedStateReport(mode=self.mode)
        self.root: torch.nn.Module | None = None
        self.optimizers: list[torch.optim.Optimizer] = []
        self.state: dict | None = None

    def before_program(self) -> None:
        if self.mode == "load":
            # read before the sandbox is up: the file lies in the run folder, private to the program
            self.state = torch.load(self.options["trained_state"], map_location="cpu", weights_only=True)
            self.report.optimizers_in_state = len(self.state["optimizers"])

    def on_root_module(self, module: torch.nn.Module) -> None:
        self.root = module
        if self.mode == "load":
            try:
                _unwrap(module).load_state_dict(self.state["model"], strict=True)
                self.report.model_loaded = True
            except Exception as e:
                self.report.errors.append(f"the model does not take the trained state: {e}"[:800])
                raise

    def on_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        i = len(self.optimizers)
        self.optimizers.append(optimizer)
        if self.mode != "load":
            return
        try:
            saved = self.state["optimizers"]
            if i >= len(saved):
                raise ValueError(f"the trained state holds {len(saved)} optimizer(s); the program steps a "
                                 f"{i + 1}th")
            own = optimizer.state_dict()
            n_own = sum(len(g["params"]) for g in own["param_groups"])
            n_saved = sum(len(g["params"]) for g in saved[i]["param_groups"])
            if n_own != n_saved:
                raise ValueError(f"optimizer {i + 1} holds {n_own} parameters, the trained state's {n_saved}")
            optimizer.load_state_dict({"state": saved[i]["state"], "param_groups": own["param_groups"]})
            self.report.optimizers_loaded += 1
        except Exception as e:
            self.report.errors.append(f"optimizer {i + 1} does not take the trained state: {e}"[:800])
            raise

    def on_step_end(self, step: int) -> None:
        if self.mode == "save" and step == int(self.options["after_step"]) and self.root is not None:
            torch.save({"model": {k: v.detach().cpu() for k, v in _unwrap(self.root).state_dict().items()},
                        "optimizers": [_cpu_state(o.state_dict()) for o in self.optimizers]}, self.options["out"])
            self.report.saved_at_step = step

    def finalize(self, status: str) -> str | None:
        path = Path(self.options["out"]).with_suffix(".report.json") if self.mode == "save" else \
            Path(self.options["report_path"])
        path.write_text(self.report.model_dump_json())
        return str(path)


def _cpu_state(sd: dict) -> dict:
    def cpu(v):
        if isinstance(v, torch.Tensor):
            return v.detach().cpu()
        if isinstance(v, dict):
            return {k: cpu(x) for k, x in v.items()}
        return v
    return {"state": cpu(sd["state"]), "param_groups": sd["param_groups"]}


def read_report(path: str | None) -> TrainedStateReport | None:
    if not path or not Path(path).exists():
        return None
    return TrainedStateReport.model_validate(json.loads(Path(path).read_text()))
