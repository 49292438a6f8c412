"""Intents: what to change, where, into what, and how sure we are.

Compiler intents come from supernodes (one per pattern found in a supernode); porting
intents from a scan of the GPU program's source compared with what the port does (autocast
no-op, host syncs in the step, removed `torch.compile`) and from graph breaks in user code.

Confidence is graded A (node-level ATen evidence + fused kernel + matching source text, or
runtime-observed), B (op evidence or source evidence alone), C (heuristic). Target
operators per target follow torch_npu's affinity APIs and the msprof-analyze advisor's
patterns (npu) and the native PyTorch equivalents (cpu / cuda). None is measured here.
"""

from __future__ import annotations

import re
from collections import Counter

from ..aten_ops import CONVOLUTION_BACKWARD, FUSED_ATTENTION, MATMUL
from ..patterns import pattern_spec
from .bundle import (
    EagerOps,
    GraphMatch,
    Intent,
    IntentEvidence,
    KernelRecord,
    MatmulDtype,
    SourceLoc,
    SourceSpan,
    Supernode,
    TargetOp,
)
from .codeparse import short_op
from .frames import read_line
from .graph_match import is_library, overlaps
from .raw import RawGraphBreak
from .recognize import recognize
from .source_scan import ScanFinding
from .supernodes import spans_from_locs

T = TargetOp

_TORCH_OPTIMIZERS = {"AdamW", "Adam", "SGD", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam", "Adadelta", "ASGD",
                     "LBFGS", "Rprop", "SparseAdam", "Adafactor"}
_CUSTOM_OPTIMIZER_TARGETS = {
    "npu": [T(api="torch.compile(optimizer math, backend='npu')", level="L4",
              note="the public ports compiled the Newton-Schulz / update math selectively"),
            T(api="batch the per-parameter loop over stacked same-shape parameters", level="L3")],
    "cpu": [T(api="torch.compile(optimizer.step)", level="L4"),
            T(api="batch the per-parameter loop over stacked same-shape parameters", level="L3")],
    "cuda": [T(api="torch.compile(optimizer.step)", level="L4")],
}

_LIB_OPS = MATMUL | {"matmul", "convolution"} | CONVOLUTION_BACKWARD | FUSED_ATTENTION


def grade_of(conf: float) -> str:
    return "A" if conf >= 0.8 else "B" if conf >= 0.5 else "C"


def _slug(s: str) -> str:
    return re.sub(r"[^a-zA-Z0-9]+", "_", s).strip("_").lower()


class _Ctx:
    def __init__(self, kernels: list[KernelRecord], eager: EagerOps | None, source_root: str | None):
        self.kernels = {k.id: k for k in kernels}
        self.eager = eager
        self.root = source_root
        self.ids: Counter[str] = Counter()

    def new_id(self, base: str) -> str:
        self.ids[base] += 1
        return base if self.ids[base] == 1 else f"{base}#{self.ids[base]}"

    def eager_at(self, lines: set[str]) -> tuple[int, list[str]]:
        """Non-library eager ops per step on these lines, and the ops (profiler style)."""
        if self.eager is None:
            return 0, []
        total = 0
        ops: Counter[str] = Counter()
        for key in lines:
            for op, n in (self.eager.by_line_ops.get(key) or {}).items():
                if short_op(op) in _LIB_OPS:
                    continue
                total += n
                ops[op] += n
        return total, [f"aten::{short_op(o)}" for o, _ in ops.most_common(12)]


def _pattern_locs(k: KernelRecord, pattern: str, weak: set[str],
                  lo: dict[str, set[str]]) -> tuple[tuple[str, str] | None, list[SourceLoc]]:
    """The function that holds the pattern's own ops in kernel `k`, and its lines there."""
    if pattern in ("optimizer_update", "pointwise_chain") or k.kind == "attention":
        fn = Counter((l.file, l.function) for l in k.sources).most_common(1)
        return (fn[0][0] if fn else None), list(k.sources)
    strong = pattern_spec(pattern).signature_ops or weak
    strong_locs = [l for l in k.sources if lo.get(l.key, set()) & strong]
    if not strong_locs:
        return None, []
    fn = Counter((l.file, l.function) for l in strong_locs).most_common(1)[0][0]
    strong_lines = {l.line for l in strong_locs if (l.file, l.function) == fn}
    locs = [l for l in k.sources if (l.file, l.function) == fn and (
        l.line in strong_lines or (lo.get(l.key, set()) & weak and min(abs(l.line - x) for x in strong_lines) <= 2))]
    return fn, locs


def compiler_intents(supernodes: list[Supernode], ctx: _Ctx, line_ops: dict[str, dict[str, set[str]]]) -> list[Intent]:
    """One intent per (pattern, function holding the pattern's ops): the place to change."""
    sn_of = {kid: sn for sn in supernodes for kid in sn.kernel_ids}
    groups: dict[tuple, dict] = {}
    for k in ctx.kernels.values():
        if k.phase == "backward":
            continue
        sn = sn_of.get(k.id)
        text = " ".join(l.code for l in k.sources)
        lo_k = line_ops.get(k.id, {})
        adds = sum(1 for v in lo_k.values() if "add2" in v)
        for m in recognize(k.aten_ops, text, k.phase, k.kind, adds):
            if not pattern_spec(m.pattern).target_ops or m.pattern not in k.patterns:
                continue
            fn, locs = _pattern_locs(k, m.pattern, m.signature_ops, line_ops.get(k.id, {}))
            if m.pattern == "optimizer_update":
                key = (m.pattern, k.region)
            elif fn is None and not k.sources:
                key = (m.pattern, "<no source lines>")  # imported output code without graph files
            elif fn is None:
                continue
            else:
                key = (m.pattern, fn)
            g = groups.setdefault(key, {"kernels": [], "locs": {}, "strength": 0.0, "notes": [], "sns": Counter()})
            g["kernels"].append(k)
            for l in locs:
                g["locs"].setdefault(l.key, l)
            g["strength"] = max(g["strength"], m.strength)
            g["notes"] += [n for n in m.notes if n not in g["notes"]]
            if sn is not None:
                g["sns"][sn.id] += 1
    out: list[Intent] = []
    for (pattern, where), g in groups.items():
        spec = pattern_spec(pattern)
        gap, level = spec.gap_class, spec.level
        targets = {t: list(ops) for t, ops in spec.target_ops.items()}
        pk: list[KernelRecord] = g["kernels"]
        if pattern == "optimizer_update" and str(where).split(":", 1)[-1] not in _TORCH_OPTIMIZERS:
            targets = _CUSTOM_OPTIMIZER_TARGETS
        locs: list[SourceLoc] = sorted(g["locs"].values(), key=lambda l: (l.file, l.line))
        keys = {l.key for l in locs}
        bk = [k for k in ctx.kernels.values() if k.phase == "backward" and k.patterns and k.patterns[0] == pattern
              and keys & {l.key for l in k.sources}]
        notes = list(g["notes"])
        conf = g["strength"] or 0.5
        fused = any(not k.is_library for k in pk)
        if fused and len({short_op(o) for k in pk for o in k.aten_ops}) >= 3:
            conf = min(0.95, conf + 0.05)
        if where == "<no source lines>":
            conf = min(conf, 0.6)
            notes.append("kernel header evidence only: no source lines (import fx_graph_readable.py for them)")
        elif not any(l.code for l in locs) and pattern != "optimizer_update":
            conf = min(conf, 0.7)
            notes.append("no source text for these nodes")
        if bk:
            notes.append(f"{len(bk)} backward kernel launch site(s) fused for the same lines")
        sites = sorted({f"{l.file}:{l.line}" for k in pk for l in k.call_sites if l.key not in keys})
        if sites and pattern != "optimizer_update":
            notes.append("called from " + ", ".join(sites[:6]) + (f" (+{len(sites) - 6})" if len(sites) > 6 else ""))
        eager_n, eager_ops = ctx.eager_at(keys)
        if pattern == "optimizer_update" and ctx.eager is not None:
            eager_n = ctx.eager.by_phase.get(where, eager_n)
        generated = sum(k.launches_per_step for k in pk + bk if not k.is_library)
        removed = max(0, eager_n - generated)
        spans = spans_from_locs(locs) if locs else []
        sn_id = g["sns"].most_common(1)[0][0] if g["sns"] else None
        sn = next((s for s in supernodes if s.id == sn_id), None)
        if pattern == "optimizer_update":
            ident = ctx.new_id(f"optimizer_update@{_slug(str(where).split(':', 1)[-1])}")
            if not spans:
                notes.append("optimizer code is library code: no program lines to point at")
        else:
            s0 = spans[0] if spans else None
            ident = ctx.new_id(f"{pattern}@{s0.file}:{s0.start_line}" if s0 else f"{pattern}@kernel:{pk[0].name[:48]}")
        if pattern == "attention" and any(k.kind == "attention" for k in pk):
            notes.append("the program already calls a fused attention op: map it to the target's fused attention")
        if pattern == "pointwise_chain":
            conf = min(conf, 0.4)
        out.append(Intent(
            id=ident, summary=f"{spec.title or pattern}" + (f" ({sn.label})" if sn else ""),
            pattern=pattern, gap_class=gap, level=level, kind="compiler", supernode=sn_id,  # type: ignore[arg-type]
            eager_ops_removed=removed,
            eager_ops=eager_ops or [f"aten::{o}" for o in sorted(spec.signature_ops)][:8],
            spans=spans,
            evidence=IntentEvidence(
                kernels=sorted({k.name for k in pk + bk}), kernel_ids=[k.id for k in pk + bk],
                aten_ops=[k.aten_ops for k in pk[:6]],
                source_text=list(dict.fromkeys(l.code for l in locs if l.code))[:8], notes=notes),
            confidence=round(conf, 2), grade=grade_of(conf), targets=targets,  # type: ignore[arg-type]
        ))
    out.sort(key=lambda i: (-i.confidence, -i.eager_ops_removed, i.id))
    return out


# ------------------------------------------------------------------ porting ----
def porting_intents(findings: list[ScanFinding], ctx: _Ctx, matmul_dtypes: list[MatmulDtype],
                    graph_breaks: list[RawGraphBreak], device: str) -> list[Intent]:
    out: list[Intent] = []
    low_precision = {"bfloat16", "float16", "half"}
    seen_mm = {d for m in matmul_dtypes if m.phase in ("forward", "backward") for d in m.input_dtypes}
    for f in findings:
        span = SourceSpan(file=f.file, start_line=f.line, end_line=f.end_line, function=f.function)
        if f.kind == "autocast" and (f.detail.get("device_type") in ("cuda", None)):
            dtype = f.detail.get("dtype") or "float16"
            notes = [f"autocast(device_type={f.detail.get('device_type')!r}) is a no-op for CPU / NPU tensors after "
                     "a naive device port"]
            conf = (0.5 if f.conditional else 0.7) if f.in_step else 0.4
            if f.conditional:
                notes.append("inside a conditional branch of the loop (validation?)")
            if f.in_step and not f.conditional and seen_mm and not (seen_mm & low_precision):
                conf = 0.9
                notes.append(f"captured matmuls ran in {sorted(seen_mm)}: the port lost the program's {dtype} matmuls")
            out.append(Intent(
                id=ctx.new_id(f"precision@{f.file}:{f.line}"),
                summary=f"cuda autocast to {dtype} does nothing on the port: restore {dtype} matmuls",
                pattern="precision", gap_class="precision", level="L0", kind="porting",
                eager_ops_removed=0, eager_ops=list(pattern_spec("precision").eager_ops), spans=[span],
                evidence=IntentEvidence(source_text=[f.code], notes=notes),
                confidence=conf, grade=grade_of(conf),  # type: ignore[arg-type]
                targets={
                    "npu": [T(api=f"torch.autocast(device_type='npu', dtype=torch.{dtype})", level="L0")],
                    "cpu": [T(api=f"torch.autocast(device_type='cpu', dtype=torch.{dtype})", level="L0",
                              note="bf16 matmuls need avx512_bf16 / AMX to be faster")],
                    "cuda": [T(api="keep torch.autocast(device_type='cuda')", level="L0", note="already right on cuda")],
                }))
        elif f.kind == "host_sync":
            key = f"{f.file}:{f.line}"
            observed = (ctx.eager.syncs.get(key, 0) if ctx.eager else 0)
            conf = 0.9 if observed else (0.55 if not f.conditional else 0.35)
            notes = [f"{f.detail.get('call')} in the training step" + (" (conditional)" if f.conditional else "")]
            if observed:
                notes.append(f"observed {observed} host sync(s) per step on this line")
            out.append(Intent(
                id=ctx.new_id(f"host_sync@{key}"),
                summary=f"host-device sync {f.detail.get('call')} every step: defer or remove it",
                pattern="host_sync", gap_class="sync", level="L1", kind="porting",
                eager_ops_removed=observed, eager_ops=["aten::_local_scalar_dense", "aten::item"], spans=[span],
                evidence=IntentEvidence(source_text=[f.code], notes=notes),
                confidence=conf, grade=grade_of(conf),  # type: ignore[arg-type]
                targets={t: [T(api="keep the value on the device; read it every N steps or after the loop", level="L1")]
                         for t in ("npu", "cpu", "cuda")}))
        elif f.kind == "torch_compile":
            target = f.detail.get("target") or "region"
            opts = {k: v for k, v in f.detail.items() if k not in ("target", "decorator", "function")}
            # `model = torch.compile(model)` compiles an object, not one of the program's functions: the model
            whole = not f.detail.get("decorator") and not f.detail.get("function", True) and bool(f.detail.get("target"))
            pattern = "compile_model" if whole else "compile_region"
            out.append(Intent(
                id=ctx.new_id(f"{pattern}@{f.file}:{f.line}"),
                summary=f"the GPU program compiles {target}; the naive port runs it eagerly",
                pattern=pattern, gap_class="compiler_boundary", level="L4", kind="porting",
                spans=[span],
                evidence=IntentEvidence(source_text=[f.code], notes=[f"torch.compile options: {opts}"] if opts else []),
                confidence=0.8, grade="A",
                targets={"npu": [T(api=f"torch.compile({target}, backend='npu') (torchair)", level="L4",
                                   note="compiling too broadly was slower or ran out of memory in the public ports")],
                         "cpu": [T(api=f"torch.compile({target})", level="L4")],
                         "cuda": [T(api=f"torch.compile({target})", level="L4")]}))
    grouped: Counter[tuple] = Counter()
    first: dict[tuple, RawGraphBreak] = {}
    for b in graph_breaks:
        if not b.user_code or b.file is None:
            continue
        key = (b.file, b.line, b.reason)
        grouped[key] += 1
        first.setdefault(key, b)
    for key, n in grouped.items():
        b = first[key]
        out.append(Intent(
            id=ctx.new_id(f"graph_break@{b.file}:{b.line}"),
            summary=f"graph break in the program: {b.reason[:120]}",
            pattern="compile_region", gap_class="compiler_boundary", level="L3", kind="compiler",
            spans=[SourceSpan(file=b.file, start_line=b.line or 0, end_line=b.line or 0, function=b.function)],
            evidence=IntentEvidence(source_text=[read_line(ctx.root, b.file, b.line or 0)],
                                    notes=[f"{n} graph break(s) here"]),
            confidence=0.75, grade="B",
            targets={t: [T(api="rewrite the line so the compiler can trace it (no data-dependent Python)", level="L3")]
                     for t in ("npu", "cpu", "cuda")}))
    return out


# ------------------------------------------------------------- whole model ----
def whole_model_intent(ctx: _Ctx, eager_ops: int | None, launches: int, regions: set[str]) -> Intent | None:
    """The GPU ran the model's step compiled: `launches` kernels where eager launches `eager_ops`.

    The capture compiles the whole model (its `model` region), so the bundle itself says what
    compiling it whole does to the step on the GPU: the fragmentation ratio. A step that
    fused well there (2x fewer launches or better) makes a compile_model intent of confidence
    0.7; a program that compiles its model itself says more (the porting intent, 0.8)."""
    if "model" not in regions or not eager_ops or not launches:
        return None
    ratio = eager_ops / launches
    if ratio < 2.0:
        return None
    conf = 0.7
    return Intent(
        id=ctx.new_id("compile_model@capture"),
        summary=f"on the GPU the whole model ran compiled: {launches} kernel launches a step where eager launches "
                f"{eager_ops} ({ratio:.1f}x fewer)",
        pattern="compile_model", gap_class="fusion", level="L4", kind="compiler",
        eager_ops_removed=max(0, eager_ops - launches),
        evidence=IntentEvidence(notes=[f"fragmentation ratio {ratio:.1f}x (eager ops / compiled launches per step)"]),
        confidence=conf, grade=grade_of(conf),  # type: ignore[arg-type]
        targets={"cpu": [T(api="model.compile(dynamic=False)", level="L4")],
                 "cuda": [T(api="model.compile(dynamic=False)", level="L4")],
                 "npu": [T(api='model.compile(backend="npu", dynamic=False)', level="L4",
                           note="torchair; compiling the whole model was slower or ran out of memory in the public "
                                "records")]})



# -------------------------------------------------------------------- graph ----
def _hull(spans: list[SourceSpan]) -> list[SourceSpan]:
    """Overlapping or adjacent spans of one file merged into one, in file and line order."""
    out: list[SourceSpan] = []
    for s in sorted(spans, key=lambda s: (s.file, s.start_line, s.end_line)):
        last = out[-1] if out else None
        if last is not None and last.file == s.file and s.start_line <= last.end_line + 1:
            out[-1] = last.model_copy(update={"end_line": max(last.end_line, s.end_line),
                                              "function": last.function or s.function})
        else:
            out.append(s)
    return out


def graph_note(m: GraphMatch) -> str:
    where = ", ".join(f"{s.file}:{s.start_line}-{s.end_line}" for s in m.spans)
    roles = "; ".join(f"{k} {v}" for k, v in m.roles.items())
    return (f"post-grad graph match at {where}" + (f" in {m.module}" if m.module else "")
            + (f": {roles}" if roles else ""))


LIBRARY_CONFIDENCE = 0.3
"""An intent whose lines call one of torch's own modules (nn.LayerNorm) is demoted to this: the
compiler's kernel fused that module's ops, but the program already calls the fused operator."""


def graph_intents(matches: list[GraphMatch], intents: list[Intent], ctx: _Ctx) -> list[Intent]:
    """Fold the graphs' dataflow matches into the kernel-level intents.

    A match on the lines of an intent of its pattern confirms it: the intent's spans grow to the
    whole computation (a kernel covers the softmax lines; the match runs from the first product
    to the second, the statements a rewrite replaces), its confidence rises to 0.9 and a note
    gives the match's roles. A match no intent covers (scores named `w`, no mask: nothing on
    the kernel's lines says attention) becomes an intent of its own. A match inside torch's own
    module (nn.LayerNorm, nn.GELU) demotes the intents on its lines instead. Returns the new intents."""
    new: list[Intent] = []
    for m in matches:
        spec = pattern_spec(m.pattern)
        if not spec.target_ops or not m.spans:
            continue
        if is_library(m):  # the kernel saw LayerNorm's ops; the program calls torch's LayerNorm there
            for i in intents:
                if i.pattern == m.pattern and overlaps(i.spans, m.spans):
                    i.confidence = min(i.confidence, LIBRARY_CONFIDENCE)
                    i.grade = grade_of(i.confidence)  # type: ignore[assignment]
                    i.evidence.notes.append(f"the program calls {m.roles['library']} at "
                                            f"{', '.join(f'{s.file}:{s.start_line}' for s in m.spans)}: already "
                                            f"the library operator, which the compiler decomposed")
            continue
        same = next((i for i in intents + new if i.pattern == m.pattern and overlaps(i.spans, m.spans)), None)
        if same is not None:
            same.spans = _hull(same.spans + m.spans)
            same.evidence.notes.append(graph_note(m))
            same.confidence = max(same.confidence, 0.9)
            same.grade = grade_of(same.confidence)  # type: ignore[assignment]
            continue
        keys = {f"{s.file}:{line}" for s in m.spans for line in range(s.start_line, s.end_line + 1)}
        eager_n, eager_ops = ctx.eager_at(keys)
        s0 = m.spans[0]
        conf = 0.85
        new.append(Intent(
            id=ctx.new_id(f"{m.pattern}@{s0.file}:{s0.start_line}"),
            summary=(spec.title or m.pattern) + (f" (found by the graph's dataflow in {m.module})" if m.module
                                                else " (found by the graph's dataflow)"),
            pattern=m.pattern, gap_class=spec.gap_class, level=spec.level, kind="compiler",  # type: ignore[arg-type]
            eager_ops=eager_ops or [f"aten::{o}" for o in sorted(spec.signature_ops)][:8],
            eager_ops_removed=eager_n, spans=list(m.spans),
            evidence=IntentEvidence(aten_ops=[m.ops], source_text=[], notes=[graph_note(m)]),
            confidence=conf, grade=grade_of(conf),  # type: ignore[arg-type]
            targets={t: list(ops) for t, ops in spec.target_ops.items()},  # type: ignore[arg-type]
        ))
    return new
