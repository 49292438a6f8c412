"""RawCapture -> EvidenceBundle: resolve kernels, recognise patterns, cluster, derive intents."""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from pathlib import Path

from ..aten_ops import GRAPH_LIBRARY_CALLS
from .bundle import (EvidenceBundle, GraphBreak, GraphRecord, KernelRecord, MatmulDtype, Route, SourceLoc)
from .codeparse import kind_from_ops, op_family, short_op
from .frames import read_line
from .graph_match import match_graphs
from .intents import _Ctx, compiler_intents, graph_intents, porting_intents, whole_model_intent
from .raw import RawCapture, RawGraph, RawNode
from .recognize import recognize, recognize_backward
from .source_scan import scan_program
from .supernodes import build_supernodes

_MM = GRAPH_LIBRARY_CALLS
_SKIP_OPS = {"getitem"}
# nodes that only relabel memory (or constants): their source line is the producer's
_LAYOUT_OPS = {"view", "_unsafe_view", "reshape", "t", "permute", "transpose", "expand", "alias", "squeeze",
               "unsqueeze", "as_strided", "getitem", "full", "scalar_tensor", "iota", "arange", "empty",
               "zeros", "ones"}


def _innermost(n: RawNode) -> SourceLoc | None:
    return n.stack[-1] if n.stack else None


def _call_site(n: RawNode) -> SourceLoc | None:
    for loc in reversed(n.stack):
        if loc.function == "forward":
            return loc
    return n.stack[0] if n.stack else None


def _with_code(loc: SourceLoc, root: str | None) -> SourceLoc:
    if loc.code or root is None:
        return loc
    return loc.model_copy(update={"code": read_line(root, loc.file, loc.line)})


def resolve_kernels(raw: RawCapture, source_root: str | None = None) -> tuple[list[KernelRecord], dict]:
    """KernelRecords with ops, sources, call sites and patterns; plus per-kernel line -> ops."""
    root = source_root or raw.source_root
    # seq_nr -> forward stack: backward nodes without a stack differentiate that forward op
    seq_stack: dict[int, RawNode] = {}
    for g in raw.graphs:
        if g.phase in ("forward", "inference"):
            for n in g.nodes.values():
                if n.seq_nr is not None and n.stack and n.seq_nr not in seq_stack:
                    seq_stack[n.seq_nr] = n
    kernels: list[KernelRecord] = []
    line_ops: dict[str, dict[str, set[str]]] = {}
    bwd_hints: dict[str, list[str]] = {}
    for g in raw.graphs:
        for i, launch in enumerate(g.launches):
            nodes = [g.nodes[name] for name in launch.nodes if name in g.nodes]
            targets = [n.target for n in nodes if short_op(n.target) not in _SKIP_OPS]
            ops = {op_family(t) for t in targets}
            if launch.backend in ("triton", "cpp") or not ops:
                # the header's "Original ATen" names the ops before decomposition (masked_fill, _softmax)
                ops |= {op_family(a) for a in launch.header_aten}
            ops = sorted(ops)
            sources: list[SourceLoc] = []
            sites: list[SourceLoc] = []
            modules: list[str] = []
            lo: dict[str, set[str]] = defaultdict(set)
            tensor_adds = 0
            for n in nodes:
                src_node = n
                if not n.stack and n.seq_nr is not None and n.seq_nr in seq_stack:
                    src_node = seq_stack[n.seq_nr]
                inner = _innermost(src_node)
                site = _call_site(src_node)
                residual = short_op(n.target) == "add" and n.tensor_args >= 2
                if residual:
                    tensor_adds += 1
                if inner is not None:
                    inner = _with_code(inner, root)
                    if inner.key not in {s.key for s in sources}:
                        sources.append(inner)
                    lo[inner.key].add(short_op(n.target))
                    if residual:
                        lo[inner.key].add("add2")
                if site is not None:
                    site = _with_code(site, root)
                    if site.key not in {s.key for s in sites}:
                        sites.append(site)
                for m in (src_node.modules or n.modules)[-1:]:
                    cls = m.rsplit(":", 1)[-1]
                    if cls not in modules:
                        modules.append(cls)
            kind = launch.kind
            if launch.backend == "cpp" and targets:
                kind = kind_from_ops(targets)
            k = KernelRecord(
                id=f"g{g.id}:{i}", graph_id=g.id, phase=g.phase, region=g.region, name=launch.name,
                handle=launch.handle, kind=kind, backend=launch.backend if launch.backend in (
                    "triton", "cpp", "extern", "aten") else "other",  # type: ignore[arg-type]
                post_grad_nodes=list(launch.nodes), aten_ops=ops, sources=sources, call_sites=sites,
                modules=modules, differentiates=g.phase == "backward", launches_per_step=g.calls_per_step,
            )
            text = " ".join(s.code for s in sources)
            if g.phase == "backward":
                k.patterns = []  # filled from the forward lines below
                bwd_hints[k.id] = recognize_backward(ops)
            else:
                k.patterns = list(dict.fromkeys(m.pattern for m in recognize(ops, text, g.phase, kind, tensor_adds)))
            kernels.append(k)
            line_ops[k.id] = dict(lo)
    # backward kernels: patterns of the forward kernels whose lines they differentiate
    fwd_line_patterns: dict[str, Counter] = defaultdict(Counter)
    for k in kernels:
        if k.phase in ("forward", "inference"):
            for s in k.sources:
                for p in k.patterns:
                    fwd_line_patterns[s.key][p] += 1
    for k in kernels:
        if k.phase != "backward":
            continue
        hints = bwd_hints.get(k.id, [])
        found: list[str] = []
        for s in k.sources:
            for p, _ in fwd_line_patterns.get(s.key, Counter()).most_common():
                if p not in found:
                    found.append(p)
        if not k.is_library:
            k.patterns = [p for p in found if p in hints] + [p for p in found if p not in hints]  # type: ignore[misc]
            k.patterns = [p for p in k.patterns if p != "add_rms_norm" or "rms_norm" in k.patterns]  # type: ignore[misc]
    return kernels, line_ops


def _graph_records(raw: RawCapture) -> list[GraphRecord]:
    out = []
    for g in raw.graphs:
        gen = sum(1 for l in g.launches if l.backend in ("triton", "cpp"))
        out.append(GraphRecord(id=g.id, phase=g.phase, region=g.region, calls_per_step=g.calls_per_step,
                               launches_per_call=len(g.launches), generated_kernels=gen,
                               library_calls=len(g.launches) - gen, post_grad_nodes=len(g.nodes),
                               code_file=g.code_file, codegen_error=g.codegen_error,
                               fusion_groups=dict(g.fusion_groups)))
    return out


def _matmul_dtypes(graphs: list[RawGraph]) -> list[MatmulDtype]:
    c: Counter[tuple] = Counter()
    for g in graphs:
        for n in g.nodes.values():
            op = short_op(n.target)
            if op in _MM or "scaled_dot_product" in op:
                c[(op, g.phase, tuple(n.in_dtypes), n.dtype)] += max(1, g.calls_per_step)
    return [MatmulDtype(op=op, phase=ph, input_dtypes=list(ins), out_dtype=out, count=n)  # type: ignore[arg-type]
            for (op, ph, ins, out), n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0][0]))]


def _graph_breaks(raw: RawCapture) -> list[GraphBreak]:
    c: Counter[tuple] = Counter()
    first = {}
    for b in raw.graph_breaks:
        key = (b.reason, b.file, b.line)
        c[key] += 1
        first.setdefault(key, b)
    out = [GraphBreak(reason=b.reason, file=b.file, line=b.line, function=b.function, user_code=b.user_code,
                      count=c[key]) for key, b in first.items()]
    missing = raw.graph_break_count - sum(g.count for g in out)
    if missing > 0:
        out.append(GraphBreak(reason="(graph breaks counted by Dynamo without a logged reason)", count=missing))
    return out


def bundle_from_raw(raw: RawCapture, *, source_root: str | os.PathLike | None = None, workload_name: str = "",
                    route: Route | None = None, program_sha: str | None = None,
                    scan_files: list[str] | None = None) -> EvidenceBundle:
    root = str(Path(source_root).resolve()) if source_root else raw.source_root
    kernels, line_ops = resolve_kernels(raw, root)
    eager = raw.eager
    supernodes = build_supernodes(kernels, eager.by_line if eager else None, eager.by_phase if eager else None,
                                  line_ops=line_ops)
    ctx = _Ctx(kernels, eager, root)
    intents = compiler_intents(supernodes, ctx, line_ops)
    matches = match_graphs(raw)
    intents += graph_intents(matches, intents, ctx)
    matmul = _matmul_dtypes(raw.graphs)
    findings = scan_program(root, scan_files) if root else []
    breaks = _graph_breaks(raw)
    intents += porting_intents(findings, ctx, matmul, raw.graph_breaks, raw.device)
    compiled = sum(len(g.launches) * g.calls_per_step for g in raw.graphs)
    eager_n = eager.kernel_ops if eager else None
    if not any(i.pattern == "compile_model" for i in intents):  # the program's own compile says it already
        whole = whole_model_intent(ctx, eager_n, compiled, {g.region for g in raw.graphs})
        intents += [whole] if whole is not None else []
    lims = list(raw.limitations)
    if raw.errors:
        lims += [f"error: {e}" for e in raw.errors]
    if eager is None:
        lims.append("no eager step was profiled: eager ops per step and fragmentation ratio unknown")
    if not findings and root is None:
        lims.append("no source_root: porting intents (autocast, host syncs, torch.compile) not scanned")
    return EvidenceBundle(
        route=route or raw.route, device=raw.device, torch_version=raw.torch_version, triton_version=raw.triton_version,
        workload=workload_name, program_sha=program_sha if program_sha is not None else raw.program_sha,
        source_root=root, kernels=kernels, graphs=_graph_records(raw), graph_breaks=breaks, eager=eager,
        eager_ops_per_step=eager_n, compiled_launches_per_step=compiled,
        fragmentation_ratio=round(eager_n / compiled, 2) if eager_n and compiled else None,
        matmul_dtypes=matmul, supernodes=supernodes, intents=intents, graph_matches=matches, limitations=lims,
    )
