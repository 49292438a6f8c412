"""Cluster kernels into supernodes: one meaning, one source region, all three phases.

1. Every forward kernel gets a *family* from its patterns (attention_input: rotary +
   QK-norm; attention: masked softmax / SDPA; norm; mlp; loss; embedding; other) and an
   *anchor*: the function of its call-site frame (the enclosing module's `forward`).
2. Pattern kernels with the same (family, anchor) form one supernode, across layers (the
   layers share their source lines). A norm next to a rotary in the same function joins
   the attention_input supernode (QK-norm).
3. Library calls (mm/bmm/addmm) and pattern-less kernels join the supernode in the same
   function whose lines are nearest (within a few lines), else an `other` supernode.
4. Backward kernels join the supernode whose forward lines they differentiate (most shared
   lines); optimizer kernels form one supernode per optimizer.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from .bundle import KernelRecord, SourceLoc, SourceSpan, Supernode

_FAMILY_OF = {
    "rotary": "attention_input", "attention": "attention", "rms_norm": "norm", "add_rms_norm": "norm",
    "layer_norm": "norm", "relu2": "mlp", "swiglu": "mlp", "gelu": "mlp",
    "softcap_cross_entropy": "loss", "cross_entropy": "loss", "optimizer_update": "optimizer",
}
_FAMILY_PRIORITY = ["optimizer", "loss", "attention", "attention_input", "mlp", "norm", "embedding", "other"]
NEAR_LINES = 3


def family_of(k: KernelRecord) -> str:
    fams = {_FAMILY_OF[p] for p in k.patterns if p in _FAMILY_OF}
    if k.phase == "optimizer":
        return "optimizer"
    if any(o.endswith(".embedding") for o in k.aten_ops) and not fams - {"norm"}:
        return "embedding" if not fams else "norm"
    for f in _FAMILY_PRIORITY:
        if f in fams:
            return f
    return "other"


def _anchor(k: KernelRecord) -> tuple[str, str] | None:
    locs = k.call_sites or k.sources
    if not locs:
        return None
    c = Counter((l.file, l.function) for l in locs)
    return c.most_common(1)[0][0]


def _lines(locs: list[SourceLoc]) -> set[tuple[str, int]]:
    return {(l.file, l.line) for l in locs}


def _distance(lines: set[tuple[str, int]], other: set[tuple[str, int]]) -> int:
    best = 10**9
    for f, l in lines:
        for f2, l2 in other:
            if f == f2:
                best = min(best, abs(l - l2))
    return best


def spans_from_locs(locs: list[SourceLoc], gap: int = NEAR_LINES) -> list[SourceSpan]:
    """Group lines per (file, function) into ranges, merging gaps of up to `gap` lines."""
    by_fn: dict[tuple[str, str], list[int]] = defaultdict(list)
    for l in locs:
        by_fn[(l.file, l.function)].append(l.line)
    spans = []
    for (file, fn), lines in sorted(by_fn.items(), key=lambda kv: (kv[0][0], min(kv[1]))):
        lines = sorted(set(lines))
        start = prev = lines[0]
        for ln in lines[1:]:
            if ln - prev > gap:
                spans.append(SourceSpan(file=file, start_line=start, end_line=prev, function=fn))
                start = ln
            prev = ln
        spans.append(SourceSpan(file=file, start_line=start, end_line=prev, function=fn))
    return spans


class _Group:
    def __init__(self, family: str, anchor: tuple[str, str] | None, region: str = ""):
        self.family = family
        self.anchor = anchor
        self.region = region
        self.kernels: list[KernelRecord] = []
        self.lines: set[tuple[str, int]] = set()  # innermost lines of forward kernels
        self.sites: set[tuple[str, int]] = set()  # call-site lines of forward kernels

    def add(self, k: KernelRecord, forward: bool = True,
            math: tuple[list[SourceLoc], list[SourceLoc]] | None = None) -> None:
        self.kernels.append(k)
        if forward:
            sources, sites = math if math is not None else (k.sources, k.call_sites)
            self.lines |= _lines(sources)
            self.sites |= _lines(sites)


def _label(g: _Group, patterns: list[str], kernels: list[KernelRecord]) -> str:
    has_mm = any(k.kind in ("mm", "addmm") for k in kernels if k.phase in ("forward", "inference"))
    where = g.anchor[1] if g.anchor else ""
    mods = Counter(m for k in kernels if k.phase != "backward" and not k.is_library for m in k.modules)
    owner = mods.most_common(1)[0][0] if mods else where
    if g.family == "attention_input":
        parts = (["qkv projection"] if has_mm else []) + (["QK-norm"] if {"rms_norm", "layer_norm"} & set(patterns) else []) \
            + ["rotary"]
        return "attention: " + " + ".join(parts)
    if g.family == "attention":
        lib = any(k.kind == "attention" for k in kernels)
        core = "library attention call (SDPA)" if lib else "scores + mask + softmax + AV"
        return f"attention: {core}" + (" + output projection" if has_mm and not lib else "")
    if g.family == "norm":
        name = "LayerNorm" if "layer_norm" in patterns else "RMSNorm"
        pre = "residual add + " if "add_rms_norm" in patterns else ""
        return f"{pre}{name} ({owner})" if owner else f"{pre}{name}"
    if g.family == "mlp":
        act = {"relu2": "ReLU²", "swiglu": "SiLU gating (SwiGLU)", "gelu": "GELU"}
        acts = [act[p] for p in ("relu2", "swiglu", "gelu") if p in patterns]
        return "MLP activation: " + " + ".join(acts) + (" (+ projections)" if has_mm else "")
    if g.family == "loss":
        if "softcap_cross_entropy" in patterns:
            return "softcap + cross-entropy" + (" (+ head projection)" if has_mm else "")
        return "cross-entropy" + (" (+ head projection)" if has_mm else "")
    if g.family == "optimizer":
        return f"optimizer update: {g.region.split(':', 1)[-1] or 'optimizer'}"
    if g.family == "embedding":
        return "embedding"
    return f"other: {where}" if where else "other"


def build_supernodes(kernels: list[KernelRecord], eager_by_line: dict[str, int] | None = None,
                     eager_by_phase: dict[str, int] | None = None,
                     line_ops: dict[str, dict[str, set[str]]] | None = None) -> list[Supernode]:
    """Assign `kernel.supernode` in place and return the supernodes.

    `line_ops` (kernel id -> 'file:line' -> ops of its nodes on that line) lets the spans
    leave out lines a kernel only touches through layout ops (a view of a matmul's output).
    """
    groups: list[_Group] = []
    index: dict[tuple, _Group] = {}
    # Grouping uses every line a kernel's nodes carry: a view of a matmul's output carries
    # the matmul's line, which is how a projection joins the kernel that consumes it.
    # Spans (below) keep only the lines that hold math.
    fwd = [k for k in kernels if k.phase in ("forward", "inference")]
    bwd = [k for k in kernels if k.phase == "backward"]
    opt = [k for k in kernels if k.phase == "optimizer"]
    pending: list[KernelRecord] = []
    # 1-2: pattern seeds
    for k in fwd:
        fam = family_of(k)
        if fam == "other" or (k.is_library and fam != "attention"):
            pending.append(k)
            continue
        key = (fam, _anchor(k))
        if key not in index:
            index[key] = _Group(fam, key[1])
            groups.append(index[key])
        index[key].add(k)
    # QK-norm: a norm group in the same function as an attention_input group, close by
    for g in [g for g in groups if g.family == "norm"]:
        for h in groups:
            if h.family == "attention_input" and h.anchor == g.anchor and \
                    _distance(g.sites or g.lines, h.sites or h.lines) <= NEAR_LINES:
                for k in g.kernels:
                    h.add(k)
                groups.remove(g)
                break
    # 3: library and pattern-less forward kernels join the nearest group in their function
    for k in pending:
        anchor = _anchor(k)
        mine = _lines(k.call_sites or k.sources)
        best, best_d = None, float(10**9)
        for g in groups:
            if g.anchor != anchor or g.family == "optimizer":
                continue
            d: float = _distance(mine, g.sites or g.lines)
            if k.kind == "bmm" and g.family == "attention":
                d -= 2  # batched matmuls next to a masked softmax are its scores and AV products
            if d < best_d:
                best, best_d = g, d
        limit = NEAR_LINES if k.is_library else 1
        if best is not None and best_d <= limit:
            best.add(k)
            continue
        fam = "embedding" if any(o.endswith(".embedding") for o in k.aten_ops) else "other"
        key = (fam, anchor, "pending")
        if key not in index:
            index[key] = _Group(fam, anchor)
            groups.append(index[key])
        index[key].add(k)
    # 4a: backward kernels follow the forward lines they differentiate
    for k in bwd:
        mine = _lines(k.sources)
        best, best_score = None, 0.0
        for g in groups:
            if g.family == "optimizer":
                continue
            shared = len(mine & g.lines)
            if shared:
                score = shared + (0.5 if g.family in {_FAMILY_OF.get(p) for p in k.patterns} else 0.0)
                if score > best_score:
                    best, best_score = g, score
        if best is None:
            for g in groups:
                if g.family != "optimizer" and _distance(mine, g.lines) <= 1:
                    best = g
                    break
        if best is None:
            key = ("other", _anchor(k), "backward")
            if key not in index:
                index[key] = _Group("other", key[1])
                groups.append(index[key])
            best = index[key]
        best.add(k, forward=False)
    # 4b: one optimizer supernode per optimizer graph region
    for k in opt:
        region = _region_of(k)
        key = ("optimizer", region)
        if key not in index:
            index[key] = _Group("optimizer", None, region)
            groups.append(index[key])
        index[key].add(k, forward=False)
    return _finish(groups, eager_by_line or {}, eager_by_phase or {}, line_ops or {})


def _region_of(k: KernelRecord) -> str:
    return k.region or "optimizer"


# ops that only relabel memory or make constants: the line they carry is the producer's
LAYOUT_OPS = frozenset({"view", "_unsafe_view", "reshape", "t", "permute", "transpose", "expand", "alias",
                        "squeeze", "unsqueeze", "as_strided", "full", "scalar_tensor", "iota", "arange",
                        "empty", "zeros", "ones", "getitem"})


def _math_lines(k: KernelRecord, line_ops: dict[str, dict[str, set[str]]]
                ) -> tuple[list[SourceLoc], list[SourceLoc]]:
    """(sources, call sites) of `k` that hold its math: lines whose nodes are all layout
    ops are dropped when other lines remain."""
    lo = line_ops.get(k.id)
    if k.is_library or not lo:
        return list(k.sources), list(k.call_sites)
    math = [l for l in k.sources if lo.get(l.key) and not lo[l.key] <= LAYOUT_OPS]
    if not math:
        return list(k.sources), list(k.call_sites)
    sites = [l for l in k.call_sites if l.key not in lo or not lo[l.key] <= LAYOUT_OPS]
    return math, sites


def _span_locs(k: KernelRecord, line_ops: dict[str, dict[str, set[str]]]) -> list[SourceLoc]:
    sources, sites = _math_lines(k, line_ops)
    return sources + sites


def _finish(groups: list[_Group], eager_by_line: dict[str, int], eager_by_phase: dict[str, int],
            line_ops: dict[str, dict[str, set[str]]] | None = None) -> list[Supernode]:
    line_ops = line_ops or {}
    out: list[Supernode] = []
    order = {f: i for i, f in enumerate(_FAMILY_PRIORITY)}
    groups = [g for g in groups if g.kernels]
    # assign each eager line to one supernode: the one whose kernels have it most often
    line_owner: dict[str, tuple[int, int]] = {}
    for gi, g in enumerate(groups):
        c = Counter(l.key for k in g.kernels for l in k.sources)
        for key, n in c.items():
            if key not in line_owner or n > line_owner[key][1]:
                line_owner[key] = (gi, n)
    used: dict[str, int] = defaultdict(int)
    for i, g in enumerate(sorted(range(len(groups)), key=lambda gi: (order.get(groups[gi].family, 99), gi))):
        grp = groups[g]
        patterns: list[str] = []
        for k in grp.kernels:
            if k.phase == "backward":  # backward kernels inherit patterns; they do not define them
                continue
            for p in k.patterns:
                if p not in patterns:
                    patterns.append(p)
        if grp.family == "other" and not patterns and any(
                k.kind in ("pointwise", "reduction", "persistent_reduction") for k in grp.kernels):
            patterns.append("pointwise_chain")
        # spans: where the forward math is (backward kernels differentiate the same lines,
        # and their stray nodes, e.g. the loss's constant tangent, would widen the span)
        fwd = [k for k in grp.kernels if k.phase in ("forward", "inference")] or \
            [k for k in grp.kernels if k.phase != "optimizer"]
        locs = [l for k in fwd if not k.is_library for l in _span_locs(k, line_ops)]
        # a library call (projection) is part of the span when it sits next to that math
        near = {(l.file, l.function): [] for l in locs}
        for l in locs:
            near[(l.file, l.function)].append(l.line)
        for k in fwd:
            if k.is_library or not locs:
                for l in k.sources + k.call_sites:
                    lines = near.get((l.file, l.function))
                    if not locs or (lines and min(abs(l.line - x) for x in lines) <= 2 * NEAR_LINES):
                        locs.append(l)
        if grp.family == "optimizer":
            locs = [l for k in grp.kernels for l in _span_locs(k, line_ops)]
        sid = f"sn{len(out) + 1:02d}-{grp.family}"
        if grp.family == "optimizer" and f"optimizer:{grp.region.split(':', 1)[-1]}" in eager_by_phase:
            eager = eager_by_phase[f"optimizer:{grp.region.split(':', 1)[-1]}"]
        else:
            eager = sum(n for key, n in eager_by_line.items() if line_owner.get(key, (-1,))[0] == g)
        for key, owner in line_owner.items():
            if owner[0] == g:
                used[key] += 1
        phases = []
        for k in grp.kernels:
            if k.phase not in phases:
                phases.append(k.phase)
            k.supernode = sid
        sn = Supernode(
            id=sid, label=_label(grp, patterns, grp.kernels), family=grp.family, patterns=patterns,  # type: ignore[arg-type]
            kernel_ids=[k.id for k in grp.kernels], phases=phases, spans=spans_from_locs(locs) if locs else [],
            modules=sorted({m for k in grp.kernels for m in k.modules}),
            compiled_launches_per_step=sum(k.launches_per_step for k in grp.kernels),
            library_launches_per_step=sum(k.launches_per_step for k in grp.kernels if k.is_library),
            eager_ops_per_step=eager,
            aten_ops=sorted({o for k in grp.kernels for o in k.aten_ops}),
        )
        out.append(sn)
    return out
