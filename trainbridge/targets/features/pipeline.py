"""The feature porters in order, after the naive port, and what is left that will not run.

Order matters: kernels go first (a Triton launcher may hold FP8 code the catalog replaces
whole), then attention, then the distributed rewrites, then FP8 in whatever code remains, then unsigned shifts, last the autograd
Functions whose backward only a compiled program got away with.
The naive port already reported each GPU-only construct (`gpu_only_feature`); those reports
are dropped once the construct is gone from the ported program, and the constructs still
there become `PortBlocker`s.
"""

from __future__ import annotations

import importlib
import re

from ..port_models import PortBlocker, PortResult
from ..shims import SHIM_PREFIX

ORDER = ("triton_kernels", "flash_attention", "flex_attention", "distributed", "fp8", "unsigned_shifts",
         "eager_autograd")

# What still cannot run on a non-CUDA target if it survives the porters (checked on code, not comments).
_RESIDUAL = [
    (re.compile(r"^\s*(import triton\b|from triton\b)"), "Triton import", "Triton kernels left in the program"),
    (re.compile(r"^\s*@triton\.(jit|autotune|heuristics)"), "Triton kernel", "a @triton kernel the catalog does not cover"),
    (re.compile(r"^\s*(from flash_attn_interface|import flash_attn_interface|from flash_attn\b|import flash_attn\b)"),
     "FlashAttention import", "FlashAttention kernels do not exist on this target"),
    (re.compile(r"\bget_kernel\("), "kernels.get_kernel(...)", "downloads a GPU kernel at run time"),
    (re.compile(r"^\s*from torch\.nn\.attention\.flex_attention import .*\bflex_attention\b"),
     "FlexAttention", "flex_attention left in the program"),
    (re.compile(r"torch\._scaled_mm\("), "torch._scaled_mm", "FP8 GEMM left in the program"),
    (re.compile(r"_compile_kernel\("), "NVRTC kernel (torch.cuda._compile_kernel)", "a CUDA kernel compiled at run time"),
]


def residual_blockers(files: dict[str, str]) -> list[PortBlocker]:
    """GPU-only constructs still in the program's own files (not in the shims)."""
    out = []
    for rel, text in files.items():
        if not rel.endswith(".py") or rel.startswith(SHIM_PREFIX):
            continue
        for n, line in enumerate(text.splitlines(), start=1):
            code = line.split("#", 1)[0]
            for pattern, construct, reason in _RESIDUAL:
                if pattern.search(code):
                    out.append(PortBlocker(file=rel, line=n, construct=f"{construct}: {line.strip()[:100]}",
                                           reason=reason))
    return out


def port_features(naive: PortResult) -> PortResult:
    files, changes, blockers = dict(naive.files), list(naive.changes), []
    for name in ORDER:
        module = importlib.import_module(f"{__package__}.{name}")
        got = module.port(files, naive.target)
        files = got.files
        changes.extend(got.changes)
        blockers.extend(got.blockers)
    seen = {(b.file, b.line) for b in blockers}
    blockers.extend(b for b in residual_blockers(files) if (b.file, b.line) not in seen)
    # the naive port's notes of GPU-only features: kept only where the feature is still there
    # (a porter may keep the program's names and only redirect the import, so a name still in
    # the file is no sign the feature is left: only files with a blocker keep those notes)
    blocked = {b.file for b in blockers}
    changes = [c for c in changes if c.kind != "gpu_only_feature"
               or (c.file in blocked and c.before in files.get(c.file, ""))]
    return PortResult(target=naive.target, files=files, changes=changes, blockers=blockers)
