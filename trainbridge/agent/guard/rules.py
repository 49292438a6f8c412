"""The guard's rule table and the verdict it returns.

Every rule has an id, a tier (`error` refuses the candidate, `warning` is recorded) and the
rationale stated once here, so a violation can always be traced to why it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

Severity = Literal["error", "warning"]


class Violation(BaseModel):
    rule: str
    file: str
    line: int
    message: str
    severity: Severity = "error"


class GuardVerdict(BaseModel):
    passed: bool
    violations: list[Violation]

    @property
    def errors(self) -> list[Violation]:
        return [v for v in self.violations if v.severity == "error"]


@dataclass
class Rule:
    id: str
    severity: Severity
    rationale: str


RULES: dict[str, Rule] = {r.id: r for r in [
    Rule("not_editable", "error", "Only files the manifest lets an agent edit may change; a candidate that edits the "
         "data loader, a config or the harness changes the workload (and new or deleted files escape review)."),
    Rule("parse", "error", "A candidate that does not parse cannot be reviewed, let alone run."),
    Rule("protected_file", "error", "A whole protected file (data, config) belongs to the harness."),
    Rule("protected_symbol", "error", "Protected functions/classes (data loading, hyperparameters, step count, "
         "batch size) must stay textually as they were, defined once, and not be rebound: otherwise the workload "
         "changes under the measurement."),
    Rule("protected_symbol_format", "warning", "Only comments or formatting of a protected symbol changed."),
    Rule("protected_name", "error", "Module-level names the harness relies on (seed, batch_size, seq_len, ...) keep "
         "exactly their assignments; a later `batch_size = 4` anywhere is a smaller workload."),
    Rule("protected_field", "error", "Fields of a protected config class may not be overwritten after "
         "construction (`args.batch_size = 2`, `setattr(args, 'batch_size', 2)`, `replace(args, ...)`)."),
    Rule("protected_call", "error", "Calls to protected functions keep their arguments: "
         "`loader(batch_size // 2)` changes the data without touching the loader."),
    Rule("seed", "error", "Seeds belong to the harness: a new or changed seed call changes the data order and the "
         "initialisation the baseline used."),
    Rule("argv", "error", "The harness passes the program's arguments; reading or rewriting sys.argv anew can "
         "change hyperparameters behind its back."),
    Rule("monkeypatch", "error", "Assigning to library or timing functions (time.perf_counter, "
         "torch.cuda.synchronize, torch.Tensor.backward, F.cross_entropy) fools the timer or the loss reading "
         "(KernelBench's static checker refuses the same); settings under torch.backends / *.config are knobs."),
    Rule("harness_env", "error", "Environment variables the harness sets (seeds, visible devices, ranks) are "
         "not the candidate's."),
    Rule("process_control", "error", "Exiting, forking or starting threads/processes can end a run early, or run "
         "work outside the timed step where the clock does not see it."),
    Rule("side_stream", "error", "Work on a side stream is not covered by the harness's synchronize at the step "
         "boundary: timings would exclude it."),
    Rule("step_loop", "error", "The training loop's header and exits belong to the harness: a new break/return in "
         "it, or a changed iteration range, runs fewer steps."),
    Rule("silent_fallback", "error", "try/except (or contextlib.suppress) added around a rewritten op can fall back "
         "to the original path, so the 'optimized' code never runs and the gain measured is noise."),
    Rule("loss_removed", "error", "The loss the original computed must still be computed, with the same reduction, "
         "ignore_index, label smoothing and weights (a fused equivalent such as npu_cross_entropy_loss is fine)."),
    Rule("work_removed", "error", "backward(), optimizer step() and zero_grad() calls may not disappear: fewer of "
         "them is less work per step."),
    Rule("backward_added", "error", "The loss the harness records is the tensor backward() runs on: a new "
         "backward() call (on a tensor built from a reference file, say) can forge it."),
    Rule("reflection", "error", "Code that writes code or reaches into the interpreter (exec, eval, compile, "
         "__import__, importlib, sys.modules, gc's object lists, frame inspection, ctypes, os.system, sockets) can "
         "reach the harness's clock and loss behind every other rule; a candidate adds none of it."),
    Rule("early_return", "error", "A return added to a forward function skips the layers after it."),
    Rule("layer_skip", "error", "Slicing or re-ranging the layer list, or changing how it is built, drops layers."),
    Rule("layer_build_changed", "warning", "The construction of a layer list changed (count or kind of layers): "
         "the FLOP/work-conservation check decides; a rewrite recipe never touches it."),
    Rule("grad_disabled", "error", "Turning gradients off (no_grad, inference_mode, requires_grad_(False)) for part of "
         "the model skips backward work."),
    Rule("default_dtype", "error", "torch.set_default_dtype silently lowers the precision of every new tensor."),
    Rule("target_api", "error", "A candidate for cpu/cuda may not call torch_npu; one for cpu may not move "
         "tensors to cuda: it would not run, or run elsewhere, on the target."),
    Rule("precision_change", "warning", "The candidate changes math precision (autocast, HF32/TF32, half casts): "
         "the low-precision loss tolerance applies and the change must be a declared precision recipe."),
    Rule("stale_cache", "warning", "Caching keyed by a storage address (data_ptr) can return stale results when "
         "memory is reused."),
    Rule("detach_in_forward", "warning", "A new .detach() in a forward function cuts gradients to what precedes it."),
]}
