"""Scale a record script to the machine: the documented hyperparameter override.

Record scripts hard-code an 8xH100 configuration (11-12 layers, width 768, 400K-token
batches, thousands of steps). `scale_script` rewrites those values in the source, and
nothing else, so the program is otherwise the record's own:

1. sites (trainbridge/records/scale_sites.py): fields of `...Hyperparameters` /
   `...Config` classes (dataclass or plain attributes), literal keywords of calls (the
   model constructor, `TrainingStage(...)` schedule entries), module constants
   (`grad_accum_steps`), step-count defaults of schedule functions, argparse defaults;
2. a plan (scale_plan.py) that turns the knobs into one consistent configuration in each
   record's own units (sequences or tokens, tuples or stages, scheduled + extension steps),
   keeping what the model code fixes (layer-indexed logic, asserted head counts);
3. a static check (scale_check.py) of the scaled hyperparameter section against the
   record's own asserts and the invariants it relies on.

The result lists every value set and where (`applied`), the knobs that matched nothing
(`unmatched`), decisions a reader should know (`notes`) and anything that could not be
made consistent (`problems`, each naming the construct).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .scale_check import check
from .scale_plan import FILE_NAMES, block_count_edits, kernel_warmup_edits, plan
from .scale_sites import find_sites, literal_source, replace_spans

# knob -> the field / keyword / constant names the records (and our series) use for it
KNOBS: dict[str, tuple[str, ...]] = {
    "layers": ("n_layer", "num_layers"),
    "heads": ("n_head", "num_heads"),
    "head_dim": ("head_dim",),
    "width": ("n_embd", "model_dim"),
    "vocab": ("vocab_size",),
    "seq": ("sequence_length", "seq_len", "train_seq_len", "max_seq_len", "train_max_seq_len"),
    "val_seq": ("val_seq_len",),
    "batch": ("batch_size", "device_batch_size", "max_device_batch_size", "train_batch_size",
              "val_batch_size", "train_bs_schedule", "train_bs_extension"),
    "steps": ("num_iterations", "num_scheduled_iterations", "num_extension_iterations", "iteration_extension",
              "warmup_iters", "warmdown_iters", "cooldown_iters", "transition_steps", "momentum_cd_steps",
              "muon_warmup_steps", "muon_cooldown_steps", "NORMUON_NOISE_WARMUP"),
    "val_every": ("val_loss_every",),
    "val_tokens": ("val_tokens",),
    "grad_accum": ("grad_accum_steps",),
    "bigram_vocab": ("bigram_vocab_size",),
    "bigram_dim": ("bigram_dim",),
    "train_files": FILE_NAMES["train_files"],
    "val_files": FILE_NAMES["val_files"],
}

# What `trainbridge records run` uses on a 2-core CPU unless told otherwise. None: derived
# per record (head_dim 64, or the record's 128 where it passes head_dim; width = heads x
# head_dim; val_tokens = two validation batches). vocab is not set: the shards carry GPT-2
# token ids (BOS 50256), so the records' 50257 -> 50304 stays.
CPU_DEFAULTS: dict[str, object] = {
    "layers": 4, "heads": 2, "head_dim": None, "width": None, "seq": 1024, "batch": 1, "steps": 300,
    "val_every": 0, "val_tokens": None, "grad_accum": 1, "bigram_vocab": 50304,
}


class ScaleError(ValueError):
    pass


@dataclass
class ScaleResult:
    source: str
    applied: dict[str, list[str]] = field(default_factory=dict)  # name -> where it was set
    unmatched: list[str] = field(default_factory=list)  # knobs / names that matched nothing
    problems: list[str] = field(default_factory=list)  # what could not be made consistent, construct named
    notes: list[str] = field(default_factory=list)  # decisions: a layer count kept, a head_dim chosen ...
    settings: dict[str, object] = field(default_factory=dict)  # where -> the value written there
    config: dict[str, object] = field(default_factory=dict)  # layers, heads, head_dim, width, tokens_per_step, steps
    hyperparameters: dict[str, object] = field(default_factory=dict)  # the scaled args.*, evaluated
    model: dict[str, object] = field(default_factory=dict)  # the model constructor's keywords, evaluated
    asserts_checked: int = 0  # the record's own asserts evaluated on the scaled values
    invariants_checked: int = 0  # relations the record relies on without an assert (scale_check.py)

    @property
    def tokens_per_step(self) -> int:
        """Training tokens in one optimizer step (the largest, where the batch size is scheduled)."""
        return int(self.config.get("tokens_per_step") or 1) * int(self.config.get("grad_accum") or 1)

    @property
    def tokens_at_start(self) -> int:
        """Training tokens in the first steps (the first stage of a batch-size schedule): the work
        per step of the few steps a timing run measures."""
        return int(self.config.get("tokens_first_step") or self.tokens_per_step)

    def train_tokens_needed(self) -> int:
        """Tokens a full run of the scaled schedule reads: what the training shard must hold."""
        return self.tokens_per_step * int(self.config.get("steps") or 1) + 1


def expand(overrides: dict[str, object]) -> dict[str, object]:
    """Knobs to concrete names (all names of a knob get its value); an exact name wins."""
    out: dict[str, object] = {}
    for key, value in overrides.items():
        if key in KNOBS and value is not None:
            for name in KNOBS[key]:
                out.setdefault(name, value)
    for key, value in overrides.items():
        if key not in KNOBS:
            out[key] = value
    return out


def scale_script(source: str, overrides: dict[str, object], *, explicit: set[str] | None = None,
                 run_check: bool = True, companions: dict[str, str] | None = None) -> ScaleResult:
    """Rewrite the script's hyperparameters for these knobs and exact names.

    `explicit`: the knobs the user asked for (the rest are defaults, which yield to what the
    model code fixes); None: every knob whose value differs from its CPU_DEFAULTS value.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ScaleError(f"the script does not parse: {e}") from e
    knobs = {k: v for k, v in overrides.items() if k in KNOBS}
    names = {k: v for k, v in overrides.items() if k not in KNOBS}
    if explicit is None:
        explicit = {k for k, v in overrides.items() if k not in CPU_DEFAULTS or CPU_DEFAULTS[k] != v}
    sites = find_sites(tree)
    p = plan(tree, source, sites, knobs, explicit, names, companions)
    edits, applied, settings = [], {}, {}
    for i, value in p.values.items():
        s = sites[i]
        try:
            text = literal_source(value)
        except ValueError as e:
            raise ScaleError(str(e)) from e
        edits.append((s.node, text))
        applied.setdefault(s.name, []).append(s.where)
        settings[s.where] = value
    for node, old, count in block_count_edits(tree, sites, p.values):
        edits.append((node, str(count)))
        where = f"torch.arange({old}) line {node.lineno}"
        applied.setdefault("mask_blocks", []).append(where)
        settings[where] = count
    for node, old, new_value in kernel_warmup_edits(tree):
        edits.append((node, new_value))
        where = f"module constant warmup_steps line {node.lineno} (was {old[:60]})"
        applied.setdefault("kernel_warmup_steps", []).append(where)
        settings[where] = new_value
        p.notes.append(f"GPU kernel warmup cut to one step (warmup_steps = {new_value}, line {node.lineno}): it "
                       f"compiles graphs and restores the initial state; the port runs eager, so the harness "
                       f"times training steps (one warmup step creates the optimizers' buffers)")
    new = replace_spans(source, edits)
    try:
        ast.parse(new)
    except SyntaxError as e:  # never expected: each edit is a literal in place of an expression
        raise ScaleError(f"the scaled script does not parse: {e}") from e
    unmatched = [k for k, v in overrides.items()
                 if v is not None and not any(n in applied for n in KNOBS.get(k, (k,)))]
    result = ScaleResult(source=new, applied=applied, unmatched=unmatched, problems=list(p.problems),
                         notes=list(p.notes), settings=settings, config=p.config)
    if run_check:
        c = check(new, even_layers=p.model.even_layers, layer_ties=p.model.layer_ties,
                  record_layers=p.config.get("record_layers"))
        result.problems += [q for q in c.problems if q not in result.problems]
        result.notes += c.notes
        result.hyperparameters, result.model = c.values, c.model
        result.asserts_checked, result.invariants_checked = c.asserts_checked, c.invariants_checked
    return result


def scale_record(source: str, overrides: dict[str, object] | None = None, *, shards: Path | None = None,
                 run_check: bool = True, companions: dict[str, str] | None = None) -> ScaleResult:
    """The CPU configuration for one record: CPU_DEFAULTS, then the user's knobs and names.

    `shards`: a folder of `train_*.bin` / `val_*.bin` the script should read. `companions`:
    the record's other files (kernel modules), whose asserted head shapes the scale keeps.
    """
    user = dict(overrides or {})
    knobs = {**CPU_DEFAULTS, **user}
    if shards is not None:
        shards = Path(shards)
        knobs.setdefault("train_files", str(shards / "train_*.bin"))
        knobs.setdefault("val_files", str(shards / "val_*.bin"))
    explicit = set(user) | {"train_files", "val_files"}
    result = scale_script(source, knobs, explicit=explicit, run_check=run_check, companions=companions)
    # defaults that a record has no place for are not worth reporting as unmatched
    result.unmatched = [k for k in result.unmatched if k in explicit]
    return result


__all__ = ["CPU_DEFAULTS", "KNOBS", "ScaleError", "ScaleResult", "expand", "scale_record", "scale_script"]
