"""Read Inductor's generated wrapper code (output_code.py): kernel definitions and launches.

Works on both backends:

- Triton: each kernel is `triton_<kind>_fused_... = async_compile.triton(...)`, preceded by
  `# kernel path:`, `# [Topologically Sorted] Source Nodes: [...], Original ATen: [...]` and
  `# Source node to ATen node mapping:` comments; the decorator inside
  (`@triton_heuristics.pointwise / reduction / persistent_reduction / template`) says its kind.
- C++: `cpp_fused_... = async_compile.cpp_pybinding(...)`, with no reliable header.

Launches are read from the body of `call()` in order: `triton_x.run(...)`, `cpp_fused_x(...)`,
`extern_kernels.mm(...)`, `torch.ops.aten.<op>(...)` fallbacks, each with the
`# [Provenance debug handles] name:N` comment that precedes it when provenance tracking is on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_DEF_RE = re.compile(r"^(?P<name>(?:triton|cpp)_\w+) = async_compile\.(?P<how>triton|cpp_pybinding|cpp)\(", re.M)
_HEADER_RE = re.compile(r"#\s*(?:Topologically Sorted )?Source Nodes: \[(?P<src>.*?)\], Original ATen: \[(?P<aten>.*?)\]")
_MAPPING_RE = re.compile(r"^#\s{2,}(?P<src>[\w.]*) => (?P<dst>[\w., ]+?)\s*$")
_KPATH_RE = re.compile(r"^# kernel path: (?P<path>\S+)")
_DECO_RE = re.compile(r"@triton_heuristics\.(?P<kind>\w+)\(")
_HANDLE_RE = re.compile(r"#\s*\[Provenance debug handles\]\s*(?P<h>\S+)")
_LAUNCH_RE = re.compile(
    r"^\s*(?:[\w, ]+ = )?(?:(?P<triton>triton_\w+)\.run\("
    r"|(?P<cpp>cpp_fused_\w+)\("
    r"|(?P<extern>extern_kernels\.\w+)\("
    r"|(?P<op>(?:torch\.ops\.)?(?:aten|prims|inductor_ops|_quantized|torch\.ops\.\w+)\.[\w.]+)\()"
)
_TRITON_PREFIX_KIND = {
    "triton_poi_": "pointwise", "triton_red_": "reduction", "triton_per_": "persistent_reduction",
    "triton_tem_": "template", "triton_for_": "pointwise", "triton_spl_": "reduction",
}
_DECO_KIND = {
    "pointwise": "pointwise", "reduction": "reduction", "persistent_reduction": "persistent_reduction",
    "template": "template", "split_scan": "reduction", "cooperative_reduction": "reduction",
    "foreach": "pointwise", "user_autotune": "other",
}
# aten fallbacks in call() that only relabel memory: no kernel launch
_NO_LAUNCH_OPS = {
    "view", "_unsafe_view", "reshape", "as_strided", "alias", "permute", "t", "transpose", "expand",
    "squeeze", "unsqueeze", "select", "slice", "detach", "_reshape_alias", "resize_", "set_",
    "record_stream", "_assert_async", "_assert_scalar",
}
_REDUCTION_OPS = {
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean", "argmax", "argmin",
    "_softmax", "_log_softmax", "softmax", "log_softmax", "prepare_softmax_online", "nll_loss_forward",
    "nll_loss_backward", "_softmax_backward_data", "_log_softmax_backward_data", "norm", "linalg_vector_norm",
    "native_layer_norm", "native_layer_norm_backward", "logsumexp", "cumsum", "any", "all",
    "embedding_dense_backward", "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit_functional",
}
_ATTENTION_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention", "flex_attention")


@dataclass
class KernelDef:
    name: str
    backend: str  # triton | cpp
    kind: str
    source_nodes: list[str] = field(default_factory=list)  # header "Source Nodes" (pre-grad names)
    aten: list[str] = field(default_factory=list)  # header "Original ATen"
    post_grad_nodes: list[str] = field(default_factory=list)  # "Source node to ATen node mapping" right sides
    path: str | None = None
    line: int = 0


@dataclass
class Launch:
    name: str
    backend: str  # triton | cpp | extern | aten
    kind: str
    handle: str | None = None
    header_aten: list[str] = field(default_factory=list)
    header_source_nodes: list[str] = field(default_factory=list)
    line: int = 0


@dataclass
class OutputCode:
    defs: dict[str, KernelDef]
    launches: list[Launch]

    @property
    def generated(self) -> int:
        return sum(1 for l in self.launches if l.backend in ("triton", "cpp"))

    @property
    def library(self) -> int:
        return len(self.launches) - self.generated


def _split_list(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def short_op(target: str) -> str:
    """'aten.mul.Tensor' / 'torch.ops.aten.mul.Tensor' -> 'mul'; 'prims.fma.default' -> 'fma';
    '<built-in function getitem>' (how FX prints operator.getitem) -> 'getitem'."""
    if target.startswith("<built-in function ") and target.endswith(">"):
        return target[len("<built-in function "):-1]
    t = target.replace("torch.ops.", "")
    parts = t.split(".")
    if len(parts) >= 2 and parts[0] in ("aten", "prims", "inductor", "_quantized", "quantized", "higher_order"):
        return parts[1]
    return parts[0] if parts else t


def op_family(target: str) -> str:
    """'aten.mul.Tensor' -> 'aten.mul' (namespace + op, no overload)."""
    t = target.replace("torch.ops.", "")
    parts = t.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else t


def kind_from_ops(ops: list[str] | set[str], backend: str = "cpp") -> str:
    shorts = {short_op(o) for o in ops}
    return "reduction" if shorts & _REDUCTION_OPS else "pointwise"


def library_kind(name: str) -> str:
    """Kind of an extern / aten fallback call from its name."""
    low = name.lower()
    if any(m in low for m in _ATTENTION_MARKERS):
        return "attention"
    op = name.replace("torch.ops.", "").replace("extern_kernels.", "").split(".")
    op_name = op[1] if op[0] in ("aten", "prims") and len(op) > 1 else op[0]
    if op_name in ("mm", "_int_mm", "_mm_plus_mm", "mm_plus_mm", "_scaled_mm"):
        return "mm"
    if op_name in ("bmm", "baddbmm"):
        return "bmm"
    if op_name == "addmm":
        return "addmm"
    if "convolution" in op_name or op_name.startswith("conv"):
        return "conv"
    return "extern"


def _kind_for_def(name: str, block: str) -> str:
    for prefix, kind in _TRITON_PREFIX_KIND.items():
        if name.startswith(prefix):
            return kind
    m = _DECO_RE.search(block)
    if m:
        return _DECO_KIND.get(m.group("kind"), "other")
    return "other"


def parse_output_code(code: str) -> OutputCode:
    """Kernel definitions and the ordered launches of one generated wrapper module."""
    lines = code.splitlines()
    defs: dict[str, KernelDef] = {}
    # ------------------------------------------------------------- definitions ----
    def_lines = [(i, m) for i, line in enumerate(lines) if (m := _DEF_RE.match(line))]
    for idx, (i, m) in enumerate(def_lines):
        name = m.group("name")
        backend = "triton" if m.group("how") == "triton" else "cpp"
        # comment block right above the definition
        j = i - 1
        header: list[str] = []
        while j >= 0 and (lines[j].startswith("#") or not lines[j].strip()):
            if not lines[j].strip() and header and header[-1].startswith("# kernel path"):
                break
            header.append(lines[j])
            j -= 1
            if len(header) > 400:
                break
        header.reverse()
        # cut the header at the previous kernel's end: keep from the last 'kernel path' line
        start = max((k for k, h in enumerate(header) if h.startswith("# kernel path")), default=0)
        header = header[start:]
        end = def_lines[idx + 1][0] if idx + 1 < len(def_lines) else len(lines)
        block = "\n".join(lines[i:min(end, i + 60)])
        kd = KernelDef(name=name, backend=backend, kind=_kind_for_def(name, block) if backend == "triton" else "other",
                       line=i + 1)
        in_mapping = False
        for h in header:
            if (pm := _KPATH_RE.match(h)):
                kd.path = pm.group("path")
            elif (hm := _HEADER_RE.search(h)):
                kd.source_nodes = _split_list(hm.group("src"))
                kd.aten = _split_list(hm.group("aten"))
            elif h.startswith("# Source node to ATen node mapping"):
                in_mapping = True
            elif h.startswith("# Graph fragment"):
                in_mapping = False
            elif in_mapping and (mm := _MAPPING_RE.match(h)):
                for dst in _split_list(mm.group("dst")):
                    if dst not in kd.post_grad_nodes:
                        kd.post_grad_nodes.append(dst)
        if backend == "cpp":
            kd.kind = kind_from_ops(kd.aten) if kd.aten else _cpp_kind_from_name(name)
        defs[name] = kd
    # ---------------------------------------------------------------- launches ----
    start = next((i for i, l in enumerate(lines) if re.match(r"^\s*def (call|partition_\d+)\(", l)), None)
    launches: list[Launch] = []
    if start is None:
        return OutputCode(defs, launches)
    pending_handle: str | None = None
    pending_header: tuple[list[str], list[str]] | None = None
    for i in range(start, len(lines)):
        line = lines[i]
        if re.match(r"^def (benchmark_compiled_module|get_args)\(", line) or line.startswith("if __name__"):
            break
        s = line.strip()
        if s.startswith("#"):
            if (h := _HANDLE_RE.search(s)):
                pending_handle = h.group("h")
            elif (hm := _HEADER_RE.search(s)):
                pending_header = (_split_list(hm.group("src")), _split_list(hm.group("aten")))
            continue
        m = _LAUNCH_RE.match(line)
        if not m:
            continue
        if m.group("triton"):
            name, backend = m.group("triton"), "triton"
            kind = defs[name].kind if name in defs else _kind_for_def(name, "")
        elif m.group("cpp"):
            name, backend = m.group("cpp"), "cpp"
            kind = defs[name].kind if name in defs else _cpp_kind_from_name(name)
        elif m.group("extern"):
            name, backend = m.group("extern"), "extern"
            kind = library_kind(name)
        else:
            name, backend = m.group("op"), "aten"
            op = name.replace("torch.ops.", "").replace("inductor_ops.", "inductor.")
            if short_op(op) in _NO_LAUNCH_OPS or op.startswith("inductor.") or op.startswith("aten.view"):
                pending_handle, pending_header = None, None
                continue
            name = op
            kind = library_kind(name)
        hdr = pending_header or ([], [])
        launches.append(Launch(name=name, backend=backend, kind=kind, handle=pending_handle,
                               header_source_nodes=hdr[0], header_aten=hdr[1], line=i + 1))
        pending_handle, pending_header = None, None
    return OutputCode(defs, launches)


def _cpp_kind_from_name(name: str) -> str:
    base = name.removeprefix("cpp_fused_")
    parts = set(re.findall(r"[a-z]+(?:_[a-z]+)*", base))
    tokens = set(base.split("_"))
    if tokens & {"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "softmax", "norm", "nll"} or parts & _REDUCTION_OPS:
        return "reduction"
    return "pointwise"
