"""Scale a record script to the machine: the documented hyperparameter override.

Record scripts hard-code an 8xH100 configuration (12 layers, width 768, 64K-token batches,
thousands of steps) in a `Hyperparameters` dataclass and in the model constructor call.
`scale_script` rewrites those literals in the source (libcst), so the program itself is
unchanged otherwise:

1. in every class whose name ends in `Hyperparameters` or `Config` (the records' `args`
   dataclass, `GPTConfig`), the default of each annotated field named in the overrides;
2. in every call, a keyword argument named in the overrides whose value is a literal
   (`GPT(vocab_size=50304, num_layers=12, ...)`); a keyword passing a variable is left alone.

Overrides are given by knob (`layers=4`) or by exact field name (`n_layer=4`); a knob
stands for all the names the records used for it (KNOBS). The result says which names
matched where, and which knobs matched nothing, so a reader sees exactly what changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

# knob -> the field / keyword names the records (and our series) use for it
KNOBS: dict[str, tuple[str, ...]] = {
    "layers": ("n_layer", "num_layers"),
    "heads": ("n_head", "num_heads"),
    "width": ("n_embd", "model_dim"),
    "vocab": ("vocab_size",),
    "seq": ("seq_len", "sequence_length", "train_seq_len", "max_seq_len"),
    "val_seq": ("val_seq_len",),
    "batch": ("batch_size", "device_batch_size"),
    "steps": ("num_iterations",),
    "val_every": ("val_loss_every",),
    "val_tokens": ("val_tokens",),
    "train_files": ("train_files", "input_bin"),
    "val_files": ("val_files", "input_val_bin"),
}

# What `trainbridge records run` uses on a 2-core CPU unless told otherwise.
CPU_DEFAULTS: dict[str, object] = {
    "layers": 4, "heads": 2, "width": 128, "vocab": 256, "seq": 128, "val_seq": 128, "batch": 8,
    "steps": 200, "val_every": 0, "val_tokens": 8192,
}


class ScaleError(ValueError):
    pass


@dataclass
class ScaleResult:
    source: str
    applied: dict[str, list[str]] = field(default_factory=dict)  # name -> where it was set
    unmatched: list[str] = field(default_factory=list)  # knobs / names that matched nothing


def expand(overrides: dict[str, object]) -> dict[str, object]:
    """Knobs to concrete names; an exact name given explicitly wins over its knob."""
    out: dict[str, object] = {}
    for key, value in overrides.items():
        if key in KNOBS:
            for name in KNOBS[key]:
                out.setdefault(name, value)
    for key, value in overrides.items():
        if key not in KNOBS:
            out[key] = value
    return out


def _literal(value: object) -> cst.BaseExpression:
    if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
        return cst.parse_expression(repr(value))
    raise ScaleError(f"override value {value!r}: only int, float, str, bool literals")


def _is_literal(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.UnaryOperation):
        return _is_literal(node.expression)
    if isinstance(node, cst.BinaryOperation):  # 64 * 1024, 8 * 64
        return _is_literal(node.left) and _is_literal(node.right)
    return isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString, cst.Name)) and \
        (not isinstance(node, cst.Name) or node.value in ("True", "False", "None"))


class _Override(cst.CSTTransformer):
    def __init__(self, names: dict[str, object]):
        self.names = names
        self.classes: list[str] = []
        self.functions = 0
        self.applied: dict[str, list[str]] = {}

    def visit_ClassDef(self, node):
        self.classes.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.classes.pop()
        return updated

    def visit_FunctionDef(self, node):
        self.functions += 1

    def leave_FunctionDef(self, original, updated):
        self.functions -= 1
        return updated

    def leave_AnnAssign(self, original, updated):
        if not self.classes or self.functions or not isinstance(updated.target, cst.Name) or updated.value is None:
            return updated
        cls, name = self.classes[-1], updated.target.value
        if name in self.names and (cls.endswith("Hyperparameters") or cls.endswith("Config")):
            self.applied.setdefault(name, []).append(f"{cls}.{name}")
            return updated.with_changes(value=_literal(self.names[name]))
        return updated

    def leave_Arg(self, original, updated):
        if updated.keyword is not None and updated.keyword.value in self.names and _is_literal(updated.value):
            name = updated.keyword.value
            self.applied.setdefault(name, []).append(f"call keyword {name}=")
            return updated.with_changes(value=_literal(self.names[name]))
        return updated


def scale_script(source: str, overrides: dict[str, object]) -> ScaleResult:
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise ScaleError(f"the script does not parse: {e}") from e
    names = expand(overrides)
    tr = _Override(names)
    new = module.visit(tr)
    unmatched = [k for k in overrides if not any(n in tr.applied for n in KNOBS.get(k, (k,)))]
    return ScaleResult(source=new.code, applied=tr.applied, unmatched=unmatched)
