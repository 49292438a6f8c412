"""Import evidence produced on a real GPU: a TORCH_COMPILE_DEBUG folder, output_code.py, or a log.

Accepted inputs (`import_debug_output(path, source_root=...)`):

- a `TORCH_COMPILE_DEBUG=1` folder (or any folder above it): every
  `torchinductor/<model>__<n>_<forward|backward|inference>_<k>.<m>/` holds `output_code.py`
  and `fx_graph_readable.py` / `fx_graph_transformed.py` (post-grad nodes under
  `# File: path:line in fn, code: ...` comments) and `ir_post_fusion.txt` (fusion groups);
- a single `output_code.py`;
- a `TORCH_LOGS=output_code` log: every `Output code:` record is one graph.

Kernels come from the Triton headers (`# [Topologically Sorted] Source Nodes: [...],
Original ATen: [...]`, `# Source node to ATen node mapping:`) and the launches in `call()`.
Library calls (`extern_kernels.mm(...)`) carry no node mapping: they are matched to the
graph's nodes of the same op in order. Source paths from the GPU machine are matched to
`source_root` by their longest existing suffix.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from pathlib import Path

from ..aten_ops import GRAPH_LIBRARY_CALLS
from .api import build_bundle
from .bundle import EvidenceBundle, Phase
from .codeparse import library_kind, parse_output_code, short_op
from .frames import SourceFilter
from .raw import RawCapture, RawGraph, RawLaunch, RawNode

_NODE_RE = re.compile(r'^\s+(?P<name>\w+): "(?P<dtype>[a-z]+\d*)\[(?P<shape>[^\]]*)\][^"]*" = '
                      r'torch\.ops\.(?P<target>[\w.]+)\((?P<args>.*)\)')
_NODE_PLAIN_RE = re.compile(r'^\s+(?P<name>\w+)(?:: "[^"]*")? = torch\.ops\.(?P<target>[\w.]+)\((?P<args>.*)\)')
_LOG_HEADER_RE = re.compile(r"^[VIWEDC]\d{4} \d\d:\d\d:\d\d[.\d]* +\d+ .*?\] (?:\[[^\]]*\] )*")
_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64", "i64": "int64",
           "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "b8": "bool"}
_OPTIMIZER_OPS = {"addcdiv", "addcmul", "lerp", "_foreach_add", "_foreach_mul", "_foreach_lerp", "_fused_adamw",
                  "_fused_adam", "_foreach_addcdiv", "_foreach_addcmul"}
_MM_OPS = GRAPH_LIBRARY_CALLS


def parse_graph_readable(text: str, filt: SourceFilter) -> dict[str, RawNode]:
    """Post-grad (or AOT) nodes of fx_graph_readable.py / fx_graph_transformed.py with their lines."""
    nodes: dict[str, RawNode] = {}
    current = None
    backward = "tangents_" in text.split("\n", 3)[1] if text.count("\n") > 2 else False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# File:"):
            current = filt.frame_from_file_comment(s)
            continue
        if not s:
            current = None
            continue
        m = _NODE_RE.match(line) or _NODE_PLAIN_RE.match(line)
        if not m:
            continue
        gd = m.groupdict()
        dtype = _DTYPES.get(gd.get("dtype") or "", gd.get("dtype"))
        shape = None
        if gd.get("shape") is not None:
            try:
                shape = [int(x) for x in gd["shape"].split(",") if x.strip()]
            except ValueError:
                shape = None
        args = gd.get("args") or ""
        tensor_args = len([a for a in re.split(r",\s*", args.split("=")[0]) if re.fullmatch(r"[a-z_]\w*", a.strip())])
        nodes[gd["name"]] = RawNode(target=gd["target"], backward=backward, stack=[current] if current else [],
                                    dtype=dtype, shape=shape, tensor_args=tensor_args)
    return nodes


_GROUP_RE = re.compile(r"^(?:op|buf)\w*: (\w*SchedulerNode)\(", re.M)


def parse_ir_post_fusion(text: str) -> dict[str, int]:
    """Scheduler groups after fusion: FusedSchedulerNode (fusion group), ExternKernelSchedulerNode
    (library kernel), SchedulerNode (single kernel), ... -> count."""
    return dict(Counter(_GROUP_RE.findall(text)))


def _phase_from_name(name: str) -> Phase:
    for p in ("forward", "backward", "inference"):
        if f"_{p}_" in name or name.startswith(p):
            return p  # type: ignore[return-value]
    return "unknown"


def _phase_from_code(code: str) -> Phase:
    head = code.split("def call(", 1)[-1][:4000]
    if "tangents_" in head:
        return "backward"
    return "forward"


def _graph_from_code(gid: int, code: str, nodes: dict[str, RawNode], phase: Phase, region: str = "model",
                     code_file: str | None = None) -> RawGraph:
    parsed = parse_output_code(code)
    # library calls: match to nodes of the same op in graph order
    by_op: dict[str, list[str]] = defaultdict(list)
    for name, n in nodes.items():
        by_op[short_op(n.target)].append(name)
    taken: Counter[str] = Counter()
    launches = []
    for l in parsed.launches:
        if l.name in parsed.defs:
            node_names = [x for x in parsed.defs[l.name].post_grad_nodes if x in nodes] or \
                list(parsed.defs[l.name].post_grad_nodes)
            header = parsed.defs[l.name].aten
        else:
            header = l.header_aten
            op = l.name.replace("extern_kernels.", "").replace("torch.ops.", "").split(".")
            op_name = op[1] if op[0] in ("aten", "prims") and len(op) > 1 else op[0]
            cands = by_op.get(op_name, [])
            i = taken[op_name]
            node_names = [cands[i]] if i < len(cands) else [x for x in l.header_source_nodes if x in nodes][-1:]
            taken[op_name] += 1
        launches.append(RawLaunch(name=l.name, handle=l.handle,
                                  kind=l.kind if l.backend != "extern" else library_kind(l.name),
                                  backend=l.backend, nodes=node_names, header_aten=header, line=l.line))
    if phase in ("inference", "unknown") and ({short_op(n.target) for n in nodes.values()} & _OPTIMIZER_OPS or any(
            "lerp" in l.name or "addcdiv" in l.name for l in parsed.launches)):
        phase, region = "optimizer", "optimizer:imported"
    g = RawGraph(id=gid, phase=phase, region=region, calls_per_step=1, device="cuda" if "triton" in code else "cpu",
                 launches=launches, nodes=nodes, code_file=code_file)
    return g


def split_output_code_log(text: str) -> list[str]:
    """The wrapper modules in a TORCH_LOGS=output_code log, in order."""
    codes: list[str] = []
    cur: list[str] | None = None
    for line in text.splitlines():
        if _LOG_HEADER_RE.match(line):
            if cur is not None:
                codes.append("\n".join(cur))
                cur = None
            rest = _LOG_HEADER_RE.sub("", line, count=1)
            if rest.strip().startswith("Output code:"):
                cur = [rest.split("Output code:", 1)[1].lstrip()]
            continue
        if cur is not None:
            cur.append(line)
    if cur is not None:
        codes.append("\n".join(cur))
    return [c for c in codes if "def call(" in c]


def _graph_dirs(root: Path) -> list[Path]:
    if (root / "output_code.py").is_file():
        return [root]
    dirs = sorted({p.parent for p in root.rglob("output_code.py")}, key=lambda p: (p.parent.as_posix(), _order(p.name)))
    return dirs


def _order(name: str) -> tuple:
    m = re.search(r"__(\d+)_\w+?_(\d+)(?:\.(\d+))?$", name)
    return tuple(int(x) for x in m.groups() if x is not None) if m else (10**6, name)


def read_debug_output(path: str | os.PathLike, *, source_root: str | os.PathLike | None = None) -> RawCapture:
    path = Path(path)
    filt = SourceFilter(source_root)
    graphs: list[RawGraph] = []
    lims = ["imported: launches per step assume every graph ran once per step",
            "imported: library calls (mm/bmm/addmm) are matched to graph nodes by order of their op",
            "imported: no eager step here, so no eager-vs-compiled ratio (collect on the port for that)"]
    if path.is_dir():
        for d in _graph_dirs(path):
            code = (d / "output_code.py").read_text(errors="replace")
            nodes: dict[str, RawNode] = {}
            for fname in ("fx_graph_transformed.py", "fx_graph_readable.py"):
                if (d / fname).is_file():
                    nodes = parse_graph_readable((d / fname).read_text(errors="replace"), filt)
                    break
            groups = parse_ir_post_fusion((d / "ir_post_fusion.txt").read_text(errors="replace")) \
                if (d / "ir_post_fusion.txt").is_file() else {}
            phase = _phase_from_name(d.name)
            if phase == "unknown":
                phase = _phase_from_code(code)
            g = _graph_from_code(len(graphs), code, nodes, phase, code_file=str(d / "output_code.py"))
            g.fusion_groups = groups
            graphs.append(g)
        if not graphs:
            raise FileNotFoundError(f"{path}: no torchinductor/*/output_code.py below this folder")
    else:
        text = path.read_text(errors="replace")
        codes = [text] if "def call(" in text and not _LOG_HEADER_RE.match(text.lstrip().split("\n", 1)[0]) \
            else split_output_code_log(text)
        if not codes:
            raise ValueError(f"{path}: neither an output_code.py nor a TORCH_LOGS=output_code log")
        for code in codes:
            graphs.append(_graph_from_code(len(graphs), code, {}, _phase_from_code(code), code_file=str(path)))
        lims.append("imported from output code only: source lines come from the kernels' node names "
                    "(no fx_graph_readable.py), so most kernels have none")
    return RawCapture(route="imported", device="cuda" if any(g.device == "cuda" for g in graphs) else "cpu",
                      torch_version="unknown (imported)", source_root=str(Path(source_root).resolve())
                      if source_root else None, graphs=graphs, limitations=lims)


def import_debug_output(path: str | os.PathLike, *, source_root: str | os.PathLike | None = None,
                        workload_name: str = "") -> EvidenceBundle:
    """Evidence bundle (route "imported") from real-GPU Inductor debug output."""
    raw = read_debug_output(path, source_root=source_root)
    # scan for porting intents only the program files the evidence names (when it names any)
    files = sorted({loc.file for g in raw.graphs for n in g.nodes.values() for loc in n.stack})
    return build_bundle(raw, source_root=source_root, workload_name=workload_name, route="imported",
                        scan_files=files or None)
