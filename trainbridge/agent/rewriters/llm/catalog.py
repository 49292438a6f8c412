"""The target's operators as the prompt lists them: exact signatures and the caveats that bite.

The model writes better code when it sees the operators the target really has, with their
argument conventions (eps defaults, mask polarity, return tuples). On npu the list is the
torch_npu catalog (`trainbridge.targets.npu_catalog`: signatures, constraints, caveats); on
cpu and cuda it is the pattern registry's target operators with their notes
(`trainbridge.patterns`). Either way the pattern being realised comes first, so the prompt
and the evidence offer the same operators.
"""

from __future__ import annotations

from ....patterns import PATTERNS
from ....targets import npu_catalog


def _npu(pattern: str | None) -> str:
    entries = list(npu_catalog.load_catalog())
    relevant = [e for e in entries if pattern and e.pattern == pattern]
    text = str(npu_catalog.render_for_prompt(relevant or entries)).strip()
    others = [e for e in entries if e not in relevant] if relevant else []
    if others:
        text += "\n\nOther operators and knobs on npu (signatures only):\n" + "\n".join(
            f"- {e.signature or e.api}" for e in others)
    return text


def _registry(target: str, pattern: str | None) -> str:
    """One line per operator the registry offers on `target`, its patterns named; `pattern`'s first."""
    order = sorted(PATTERNS.values(), key=lambda s: s.name != pattern)
    lines: dict[str, list] = {}
    for spec in order:
        for op in spec.target_ops.get(target, ()):
            entry = lines.setdefault(op.api, [op, []])
            entry[1].append(spec.name)
    out = []
    for api, (op, patterns) in lines.items():
        out.append(f"- `{api}` ({op.level}; {', '.join(patterns)})" + (f": {op.note}" if op.note else ""))
    return "\n".join(out)


def operator_catalog(target: str, pattern: str | None = None) -> str:
    """The operators the prompt offers on `target`, those for `pattern` first."""
    return _npu(pattern) if target == "npu" else _registry(target, pattern)
