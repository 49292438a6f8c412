"""The target's operators as the prompt lists them: exact signatures and the caveats that bite.

The model writes better code when it sees the operators the target really has, with their
argument conventions (eps defaults, mask polarity, return tuples). On npu the list comes from
`trainbridge.targets.npu_catalog` when it loads; otherwise, and for cpu and cuda, the short
built-in lists below are used. Kept in one module so that the source of this text can be
replaced without touching the rest of the prompt.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_BUILTIN_CATALOG = {
    "cpu": """\
- `torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)`: replaces
  `x * rsqrt(mean(x^2, -1, keepdim=True) + eps) [* w]`. eps=None means torch.finfo(dtype).eps,
  not the program's eps: pass eps explicitly. normalized_shape is a tuple, e.g. `(x.size(-1),)`.
- `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False)`: replaces matmul/scale/mask/softmax/matmul.
  Layout (B, heads, T, head_dim); default scale 1/sqrt(head_dim); a bool attn_mask is True where
  attention is ALLOWED; is_causal=True together with attn_mask is an error. Flash kernel on CPU.
- `torch.nn.functional.layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-05)`.
- `torch.nn.functional.silu / gelu(input, approximate='none'|'tanh') / relu`: fused activations.
- `torch.nn.functional.cross_entropy(input, target, weight=None, ignore_index=-100, reduction='mean',
  label_smoothing=0.0)`: fuses log_softmax + nll_loss; input [N, C].
- `torch.optim.AdamW(params, lr, betas, eps, weight_decay, foreach=None, fused=None)`: `fused=True`
  (CPU and CUDA, floating-point params) or `foreach=True` replace the per-parameter update loop.
- `torch.compile(fn, fullgraph=False, dynamic=None, mode=None)`: compile ONE region; the first
  steps pay compilation (warm-up steps absorb it); graph breaks show as extra ops.
- `torch.autocast(device_type="cpu", dtype=torch.bfloat16)`: bf16 matmuls on CPU (a precision change:
  only to restore what the GPU program did).
- `torch.addcmul / torch.addcdiv / torch.lerp / torch._foreach_*`: fused pointwise optimizer maths.""",
    "cuda": """\
- `torch.nn.functional.rms_norm(input, normalized_shape, weight=None, eps=None)`: fused RMSNorm;
  pass the program's eps explicitly (None means machine epsilon of the dtype).
- `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
  is_causal=False, scale=None, enable_gqa=False)`: flash / memory-efficient kernels; layout
  (B, heads, T, head_dim); bool mask True = attend; prefer is_causal=True over a tril mask.
- `torch.nn.functional.layer_norm / silu / gelu / cross_entropy`: fused kernels.
- `torch.optim.AdamW(..., fused=True)`: one multi-tensor kernel for the update.
- `torch.compile(fn, fullgraph=False, dynamic=None, mode=None)`: Inductor/Triton for ONE region.
- `torch.autocast(device_type="cuda", dtype=torch.bfloat16)`; `torch.backends.cuda.matmul.allow_tf32`
  is a precision change (only when the GPU program used it).""",
    "npu": """\
- `torch_npu.npu_rms_norm(input, gamma, epsilon=1e-6) -> (y, rstd)`: take `[0]`; gamma must exist
  (use ones when the program has no weight) and share the input's dtype; has backward.
- `torch_npu.npu_fusion_attention(query, key, value, head_num, input_layout, atten_mask=None,
  scale=1., keep_prob=1., sparse_mode=0, ...)`: returns 7 values, output `[0]`; scale defaults to 1
  (pass 1/sqrt(d)); bool atten_mask is True where MASKED OUT; causal via sparse_mode=2 or 3 with a
  2048x2048 upper-triangular mask; layouts BSH/SBH/BSND/BNSD/TND; head dim <= 768.
- `torch_npu.npu_rotary_mul(input, r1, r2, rotary_mode='half')`: 4-D input, even head dim < 896.
- `torch_npu.npu_swiglu(input, dim=-1)`: `silu(a) * b` for `a, b = x.chunk(2, dim)`; has backward.
- `torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6)`: NO backward (inference only).
- `torch_npu.optim.NpuFusedAdamW`: fused update; `zero_grad(set_to_none=True)` raises.
- `torch.optim.AdamW(..., fused=True)` and `F.scaled_dot_product_attention` have NPU kernels too.
- requires `import torch_npu`; nothing here was verified on hardware: measure.""",
}


def operator_catalog(target: str, pattern: str | None = None) -> str:
    """The target's operators for the prompt: trainbridge.targets.npu_catalog when present, else built-in."""
    if target == "npu":
        try:
            from ....targets import npu_catalog  # type: ignore[attr-defined]

            entries = list(npu_catalog.load_catalog())
            relevant = [e for e in entries if pattern and getattr(e, "pattern", None) == pattern]
            text = str(npu_catalog.render_for_prompt(relevant or entries)).strip()
            others = [e for e in entries if e not in relevant] if relevant else []
            if others:
                text += "\n\nOther operators and knobs on npu (signatures only):\n" + "\n".join(
                    f"- {getattr(e, 'signature', None) or getattr(e, 'api', e)}" for e in others)
            if text:
                return text
        except Exception as e:  # the catalog module is optional
            log.debug("npu catalog unavailable (%s); using the built-in list", e)
    return _BUILTIN_CATALOG.get(target, _BUILTIN_CATALOG["cpu"])
