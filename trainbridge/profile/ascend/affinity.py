"""Fused-API affinity: the advisor's aten-sequence patterns, mapped back to user source lines.

`AFFINITY` (rule, regex over top-level aten tokens, catalog suggestion) is the one table of
patterns; `affinity_matches` runs it over trace_view.json events per thread and finds the
user's lines from the events' own call stacks or from operator_details.csv.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

from .models import Finding, OperatorDetailRow, TraceEvent

# affinity patterns over top-level aten call sequences (advisor rules; docs/npu.md)
_CHUNK = r"(?:(?:chunk|slice|split|narrow) )+"
AFFINITY: tuple[tuple[str, str, str], ...] = (
    ("rms_norm", r"pow mean add rsqrt mul ", "npu_rms_norm"),
    ("rotary", _CHUNK + r"neg cat (?:mul )?add ", "npu_rotary_mul"),
    ("attention", r"matmul (?:(?!matmul )\S+ ){0,4}?softmax (?:(?!matmul )\S+ ){0,2}?matmul ", "npu_fusion_attention"),
    ("swiglu", _CHUNK + r"silu mul ", "npu_swiglu"),
    ("geglu", _CHUNK + r"gelu mul ", "npu_geglu"),
    ("confusion_transpose", r"(?:permute|transpose) contiguous (?:reshape|view) ", "npu_confusion_transpose"),
    ("scaled_masked_softmax", r"(?:(?:mul|div) (?:masked_fill|add) |(?:masked_fill|add) (?:mul|div) )softmax ",
     "npu_scaled_masked_softmax"),
)
OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#(?P<cls>\w+)\.step$|^(?P<cls2>\w+)\.step$")
FUSED_OPTIMIZER = {"AdamW": "NpuFusedAdamW", "Adam": "NpuFusedAdam", "SGD": "NpuFusedSGD"}
_LIB_FRAME = re.compile(r"site-packages|dist-packages|/torch/|torch_npu|<built-in|<frozen|threading\.py|runpy\.py")
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\)")


def _token(name: str) -> str:
    t = name[len("aten::"):]
    return t[:-1] if t.endswith("_") and not t.startswith("_") else t


def top_level_aten(events: list[TraceEvent]) -> dict[tuple[str, str], list[TraceEvent]]:
    """Per (pid, tid), aten:: events not nested in another aten:: event, in time order."""
    threads: dict[tuple[str, str], list[TraceEvent]] = defaultdict(list)
    for e in events:
        if e.name.startswith("aten::"):
            threads[(e.pid, e.tid)].append(e)
    out = {}
    for key, evs in threads.items():
        evs.sort(key=lambda e: (e.ts_us, -e.dur_us))
        top, end = [], -math.inf
        for e in evs:
            if e.ts_us >= end:
                top.append(e)
                end = e.ts_us + e.dur_us
        out[key] = top
    return out


def _user_frame(stack: list[str]) -> tuple[str, int] | None:
    for fr in stack:
        mm = _FRAME.match(fr)
        if mm and not _LIB_FRAME.search(mm.group("file")):
            return mm.group("file"), int(mm.group("line"))
    return None


def _lines_from_details(names: list[str], details: list[OperatorDetailRow] | None, window: int = 15) -> list[str]:
    """User lines for an op sequence from operator_details' aggregated call stacks.

    Rows are aggregated per call site, so a sequence is placed by chaining each op to the
    nearest call site at or after the previous op's line (same file, within `window`);
    every anchor that places the whole sequence is reported (ambiguity stays visible).
    """
    if not details:
        return []
    sites: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for d in details:
        fr = _user_frame(d.call_stack)
        if fr:
            sites[d.name].add(fr)
    wanted = names
    if not sites.get(wanted[0]):
        return []
    hits: set[str] = set()
    for anchor in sorted(sites[wanted[0]]):
        chain, prev = [anchor], anchor
        for n in wanted[1:]:
            cands = [c for c in sites.get(n, ()) if c[0] == prev[0] and abs(c[1] - prev[1]) <= window]
            if not cands:
                chain = None
                break
            prev = min(cands, key=lambda c: (c[1] < prev[1], abs(c[1] - prev[1])))
            chain.append(prev)
        if chain:
            hits.update(f"{f}:{ln}" for f, ln in chain)
    return sorted(hits, key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))


def _source_lines(evs: list[TraceEvent], details: list[OperatorDetailRow] | None) -> list[str]:
    own = [_user_frame(e.call_stack) for e in evs if e.call_stack]
    own = [f for f in own if f]
    if own:
        return sorted({f"{f}:{ln}" for f, ln in own}, key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))
    return _lines_from_details([e.name for e in evs], details)


def affinity_matches(events: list[TraceEvent] | None, details: list[OperatorDetailRow] | None = None) -> list[Finding]:
    """The advisor's fused-API patterns on top-level aten sequences, mapped to source lines."""
    if not events:
        return []
    found: dict[str, dict] = {}
    for key, top in sorted(top_level_aten(events).items()):
        text, starts = "", []
        for e in top:
            starts.append(len(text))
            text += _token(e.name) + " "
        idx = {s: i for i, s in enumerate(starts)}
        spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for rule, rx, _ in AFFINITY:
            for mm in re.finditer(r"(?:(?<= )|^)(" + rx + ")", text):
                a = mm.start(1)
                if a not in idx:
                    continue
                i = idx[a]
                j = i + mm.group(1).count(" ")
                if rule == "scaled_masked_softmax" and any(s <= i < e for s, e in spans["attention"]):
                    continue  # part of a full attention block: npu_fusion_attention covers it
                spans[rule].append((i, j))
                rec = found.setdefault(rule, {"count": 0, "lines": set(), "seq": None, "threads": set()})
                rec["count"] += 1
                rec["threads"].add(key[1])
                rec["seq"] = rec["seq"] or mm.group(1).split()
                rec["lines"].update(_source_lines(top[i:j], details))
    out = []
    for rule, rx, sugg in AFFINITY:
        if rule not in found:
            continue
        rec = found[rule]
        lines = sorted(rec["lines"], key=lambda s: (s.rsplit(":", 1)[0], int(s.rsplit(":", 1)[1])))
        out.append(Finding(
            rule=f"affinity.{rule}", severity="medium", suggestion=sugg, source_lines=lines, count=rec["count"],
            ops=["aten::" + t for t in rec["seq"]],
            message=(f"aten sequence {' -> '.join(rec['seq'])} seen {rec['count']} time(s) matches the advisor's "
                     f"{sugg} pattern" + (f" at {', '.join(lines)}" if lines else " (no call stacks recorded: "
                                          "profile with with_stack=True to get source lines)"))))
    out.extend(_optimizer_findings(events, details))
    return out


def _optimizer_findings(events: list[TraceEvent], details: list[OperatorDetailRow] | None) -> list[Finding]:
    steps: dict[str, list[TraceEvent]] = defaultdict(list)
    for e in events:
        mm = OPTIMIZER_STEP.match(e.name)
        if mm:
            steps[mm.group("cls") or mm.group("cls2")].append(e)
    out = []
    for cls, evs in sorted(steps.items()):
        if cls.startswith("NpuFused") or cls == "Optimizer":
            continue
        sugg = FUSED_OPTIMIZER.get(cls)
        lines = _source_lines(evs, None) or _lines_from_details([evs[0].name], details)
        mean_us = sum(e.dur_us for e in evs) / len(evs)
        out.append(Finding(
            rule="affinity.optimizer", severity="medium", suggestion=sugg, source_lines=lines, count=len(evs),
            ops=[evs[0].name], value=mean_us,
            message=(f"{cls}.step: {len(evs)} call(s), {mean_us:.1f} us each on the host: "
                     + (f"torch_npu.optim.{sugg} updates all parameters in one fused pass (mind its caveats)"
                        if sugg else "no fused torch_npu equivalent in the catalog; a fused/foreach form may help"))))
    return out
