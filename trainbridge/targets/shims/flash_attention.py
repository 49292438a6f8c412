"""FlashAttention-3's varlen interface where FA3 does not exist: per-document SDPA, or the NPU's TND attention.

Why a replacement: FA3 is a Hopper-only CUDA library, and the `kernels` package form
(`get_kernel('varunneal/flash-attention-3').flash_attn_interface`) downloads a binary when the
program starts. The programs call `flash_attn_varlen_func` on documents packed into one
sequence: `cu_seqlens_*` holds the cumulative document ends (a leading 0, possibly repeated
trailing values = empty documents), attention is causal inside each document, and
`window_size=(left, right)` limits query i to keys [i - left, i + right] (-1 = unlimited;
causal forces right = 0). When a document's query and key lengths differ, positions are
aligned at the bottom right, as in FA3. A query row with no key returns zeros.

Targets:

* BACKEND "sdpa" (default): one `scaled_dot_product_attention` per document (`is_causal`
  when the window covers the whole document, an explicit band mask otherwise). Per document
  costs sum(L_i^2) score entries against T^2 for one SDPA over the whole packed sequence
  with a block-diagonal mask: for the few documents per 1-4K tokens of the scaled records it
  is several times less work. With many small documents the per-call overhead wins instead,
  and one block-diagonal SDPA is used; the switch point is a cost model
  (`_CALL_COST_SCORES`, one call ~ a 256-token document), not a measurement.
* BACKEND "npu_fusion_attention" (a port to npu sets it in its copy):
  `torch_npu.npu_fusion_attention` in layout TND with `actual_seq_qlen/kvlen` = cumulative
  document ends (empty documents dropped), sparse_mode 3 (causal, bottom-right) or 4 (band,
  `pre_tockens` = left, `next_tockens` = right) with the compressed 2048x2048 mask, and the
  scale passed explicitly (the NPU's default is 1).

Return value as FA3's: the output (total_q, heads, head_dim) in q's dtype, or
(output, softmax_lse) with return_attn_probs=True (lse float32, (heads, total_q), natural log).
Tokens outside [cu_seqlens_q[0], cu_seqlens_q[-1]) get zeros (FA3 leaves them unwritten).

The module is also its own `flash_attn_interface` attribute, so a port can replace
`get_kernel(...)` by this module and keep `.flash_attn_interface` / `getattr(...)` as written.
Not supported (NotImplementedError; the porter reports them before a run): seqused_q/k, qv,
FP8 descales, attention_chunk, softcap.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_interface"]

# Which operator computes the attention: "sdpa" or "npu_fusion_attention" (set by a port to npu).
BACKEND = "sdpa"

_CALL_COST_SCORES = 256 * 256  # per-document SDPA call overhead, in score entries (a modelled guess)
_NPU_COMPRESSED = 2048
_NPU_UNBOUNDED = 2147483647
_npu_masks: dict[str, torch.Tensor] = {}


def _window(window_size, window_size_left, window_size_right, causal: bool) -> tuple[int, int]:
    """(left, right) as ints, -1 = unlimited; causal makes right 0."""
    left, right = (-1, -1) if window_size is None else window_size
    left = left if window_size_left is None else window_size_left
    right = right if window_size_right is None else window_size_right
    left = -1 if left is None else int(left)
    right = -1 if right is None else int(right)
    return left, (0 if causal else right)


def _band(lq: int, lk: int, left: int, right: int, device) -> torch.Tensor | None:
    """(lq, lk) bool, True = visible, bottom-right aligned; None when every key is visible."""
    if left < 0 and right < 0:
        return None
    i = torch.arange(lq, device=device).view(-1, 1) + (lk - lq)
    j = torch.arange(lk, device=device).view(1, -1)
    visible = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    return visible


def _sdpa(q, k, v, visible, scale, causal_shortcut: bool):
    """q (H, Lq, D) etc.; rows with no visible key give zeros (and zero gradients)."""
    gqa = q.size(0) != k.size(0)
    if causal_shortcut:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    empty = None
    if visible is not None:
        empty = ~visible.any(dim=-1)
        if bool(empty.any()):
            visible = visible.clone()
            visible[empty, 0] = True
        else:
            empty = None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=gqa)
    return out if empty is None else out.masked_fill(empty.view(1, -1, 1), 0.0)


def _lse(q, k, visible, scale) -> torch.Tensor:
    """(H, Lq) float32 logsumexp of the visible scaled scores, -inf where no key is visible."""
    kk = k.float().repeat_interleave(q.size(0) // k.size(0), dim=0)
    s = (q.float() @ kk.transpose(-2, -1)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _documents(cu_q: list[int], cu_k: list[int]) -> list[tuple[int, int, int, int]]:
    if len(cu_q) != len(cu_k):
        raise ValueError(f"flash_attn_varlen_func: cu_seqlens_q has {len(cu_q)} entries, cu_seqlens_k {len(cu_k)}")
    docs = []
    for qs, qe, ks, ke in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        if qe < qs or ke < ks:
            raise ValueError("flash_attn_varlen_func: cu_seqlens must be non-decreasing (cumulative lengths)")
        if qe > qs:
            docs.append((qs, qe, ks, ke))
    return docs


def _assemble(pieces: list[tuple[int, torch.Tensor]], total: int, dim: int, fill: float = 0.0) -> torch.Tensor:
    """Concatenate (start, piece) along `dim`, `fill` in the gaps, `total` long (pieces non-empty).

    Contiguous, as FlashAttention's own outputs are: callers `.view()` them (record 85 does).
    """
    out, at = [], 0
    template = pieces[0][1]
    for start, piece in pieces + [(total, None)]:
        if start > at:
            shape = list(template.shape)
            shape[dim] = start - at
            out.append(template.new_full(shape, fill))
        if piece is not None:
            out.append(piece)
            at = start + piece.shape[dim]
    return out[0].contiguous() if len(out) == 1 else torch.cat(out, dim=dim)


def _per_document(q, k, v, docs, scale, left, right, want_lse):
    outs, lses = [], []
    for qs, qe, ks, ke in docs:
        lq, lk = qe - qs, ke - ks
        qd, kd, vd = q[qs:qe].transpose(0, 1), k[ks:ke].transpose(0, 1), v[ks:ke].transpose(0, 1)
        shortcut = lq == lk and right == 0 and (left < 0 or left >= lk - 1)
        visible = None if shortcut or lk == 0 else _band(lq, lk, left, right, q.device)
        if lk == 0:
            o = q.new_zeros(q.size(1), lq, v.size(-1))
            visible = torch.zeros(lq, 0, dtype=torch.bool, device=q.device)
        else:
            o = _sdpa(qd, kd, vd, visible, scale, shortcut)
        outs.append((qs, o.transpose(0, 1)))
        if want_lse:
            if visible is None:
                visible = _band(lq, lk, left, right, q.device)
            lses.append((qs, _lse(qd, kd, visible, scale) if lk else q.new_full((q.size(1), lq), float("-inf"),
                                                                                   dtype=torch.float32)))
    return outs, lses


def _block_diagonal(q, k, v, cu: list[int], scale, left, right):
    """One SDPA over the packed tokens [cu[0], cu[-1]) with a same-document band mask."""
    start, end = cu[0], cu[-1]
    pos = torch.arange(start, end, device=q.device)
    ends = torch.tensor(cu[1:], device=q.device)
    doc = torch.searchsorted(ends, pos, right=True)
    i, j = pos.view(-1, 1), pos.view(1, -1)
    visible = doc.view(-1, 1) == doc.view(1, -1)
    if right >= 0:
        visible &= j <= i + right
    if left >= 0:
        visible &= j >= i - left
    sl = slice(start, end)
    o = _sdpa(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1), visible, scale, False)
    return [(start, o.transpose(0, 1))], visible


def _npu_causal_mask(device) -> torch.Tensor:
    key = str(device)
    if key not in _npu_masks:
        _npu_masks[key] = torch.ones(_NPU_COMPRESSED, _NPU_COMPRESSED, dtype=torch.bool, device=device).triu(1)
    return _npu_masks[key]


def _npu_varlen(q, k, v, docs, scale, left, right, causal, want_lse):
    """torch_npu.npu_fusion_attention, TND layout, over the non-empty documents (module doc)."""
    import torch_npu  # only on the npu target

    q0, k0 = docs[0][0], docs[0][2]
    for (_, qe, _, ke), (qs2, _, ks2, _) in zip(docs, docs[1:]):
        if qs2 != qe or ks2 != ke:
            raise NotImplementedError("flash_attn_varlen_func on npu: a document with queries but no keys "
                                      "between documents (cross-attention packing) is not supported")
    qlen = [qe - q0 for _, qe, _, _ in docs]
    kvlen = [ke - k0 for _, _, _, ke in docs]
    if any(ke == ks for _, _, ks, ke in docs):
        raise NotImplementedError("flash_attn_varlen_func on npu: a document with queries and no keys")
    mask, sparse_mode, pre, nxt = None, 0, _NPU_UNBOUNDED, _NPU_UNBOUNDED
    if causal and left < 0:
        mask, sparse_mode = _npu_causal_mask(q.device), 3
    elif left >= 0 or right >= 0:
        mask, sparse_mode = _npu_causal_mask(q.device), 4
        pre = left if left >= 0 else _NPU_UNBOUNDED
        nxt = right if right >= 0 else _NPU_UNBOUNDED
    # rows with no key exist only when a document has more queries than the right window reaches
    empty_rows = right >= 0 and any((qe - qs) - (ke - ks) > right for qs, qe, ks, ke in docs)
    res = torch_npu.npu_fusion_attention(
        q[q0:q0 + qlen[-1]], k[k0:k0 + kvlen[-1]], v[k0:k0 + kvlen[-1]], q.size(1), "TND", atten_mask=mask,
        scale=scale, keep_prob=1.0, pre_tockens=pre, next_tockens=nxt, inner_precise=2 if empty_rows else 0,
        actual_seq_qlen=qlen, actual_seq_kvlen=kvlen, sparse_mode=sparse_mode)
    lse = None
    if want_lse:  # softmax_max / softmax_sum: (N, T, 8), the 8 copies equal
        lse = res[1][..., 0] + torch.log(res[2][..., 0])
    return res[0], q0, lse


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False, qv=None,
                           q_descale=None, k_descale=None, v_descale=None, window_size=(-1, -1),
                           attention_chunk=0, softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False,
                           sm_margin=0, return_attn_probs=False, *, window_size_left=None, window_size_right=None):
    """FA3's `flash_attn_varlen_func` (module doc); q (total_q, H, D), k/v (total_k, H_kv, D).

    max_seqlen_*, num_splits, pack_gqa, deterministic and sm_margin only tune the CUDA kernel
    and are ignored. window_size_left/right are the keyword spelling of one FA3 fork.
    """
    for name, val in (("seqused_q", seqused_q), ("seqused_k", seqused_k), ("qv", qv), ("q_descale", q_descale),
                      ("k_descale", k_descale), ("v_descale", v_descale)):
        if val is not None:
            raise NotImplementedError(f"flash_attn_varlen_func shim: {name} is not supported")
    if attention_chunk:
        raise NotImplementedError("flash_attn_varlen_func shim: attention_chunk is not supported")
    if softcap:
        raise NotImplementedError("flash_attn_varlen_func shim: softcap is not supported")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError("flash_attn_varlen_func: q, k, v must be (total_tokens, heads, head_dim)")
    if q.size(1) % k.size(1):
        raise ValueError(f"flash_attn_varlen_func: query heads {q.size(1)} not a multiple of key heads {k.size(1)}")
    scale = q.size(-1) ** -0.5 if softmax_scale is None else float(softmax_scale)
    left, right = _window(window_size, window_size_left, window_size_right, causal)
    cu_q = [int(x) for x in cu_seqlens_q.tolist()]  # one host sync: document boundaries drive the loop
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else [int(x) for x in cu_seqlens_k.tolist()]
    docs = _documents(cu_q, cu_k)
    total = q.size(0)
    if not docs:
        out = q.new_zeros(total, q.size(1), v.size(-1))
        return (out, q.new_full((q.size(1), total), float("-inf"), dtype=torch.float32)) if return_attn_probs else out
    if BACKEND == "npu_fusion_attention":
        o, start, lse = _npu_varlen(q, k, v, docs, scale, left, right, causal, return_attn_probs)
        out = _assemble([(start, o)], total, 0)
        return (out, _assemble([(start, lse.float())], total, 1, float("-inf"))) if return_attn_probs else out
    packed_self = cu_q == cu_k and cu_q[-1] > cu_q[0]
    loop_cost = sum((qe - qs) * (ke - ks) for qs, qe, ks, ke in docs) + _CALL_COST_SCORES * len(docs)
    if packed_self and not return_attn_probs and (cu_q[-1] - cu_q[0]) ** 2 < loop_cost:
        pieces, _ = _block_diagonal(q, k, v, cu_q, scale, left, right)
        return _assemble(pieces, total, 0)
    pieces, lses = _per_document(q, k, v, docs, scale, left, right, return_attn_probs)
    out = _assemble(pieces, total, 0)
    return (out, _assemble(lses, total, 1, float("-inf"))) if return_attn_probs else out


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, *,
                    window_size_left=None, window_size_right=None):
    """FA3's fixed-length `flash_attn_func`, (B, S, H, D): the varlen path with B equal documents."""
    b, s = q.shape[:2]
    sk = k.size(1)
    cu_q = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
    cu_k = torch.arange(0, (b + 1) * sk, sk, dtype=torch.int32, device=q.device)
    res = flash_attn_varlen_func(q.reshape(b * s, *q.shape[2:]), k.reshape(b * sk, *k.shape[2:]),
                                 v.reshape(b * sk, *v.shape[2:]), cu_q, cu_k, s, sk, None, None, softmax_scale,
                                 causal, qv, q_descale, k_descale, v_descale, window_size, attention_chunk, softcap,
                                 num_splits, pack_gqa, deterministic, sm_margin, return_attn_probs,
                                 window_size_left=window_size_left, window_size_right=window_size_right)
    if return_attn_probs:
        out, lse = res
        return out.view(b, s, *out.shape[1:]), lse.view(lse.size(0), b, s).transpose(0, 1)
    return res.view(b, s, *res.shape[1:])


# `get_kernel(...).flash_attn_interface` and `getattr(module, "flash_attn_interface", module)` both land here.
flash_attn_interface = sys.modules[__name__]
