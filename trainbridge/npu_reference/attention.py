"""Reference semantics of torch_npu.npu_fusion_attention, the op most ports get wrong.

Why a separate module: its contract differs from SDPA in four ways that silently change
results, and each is enforced here exactly as documented (op-plugin docs,
torch_npu-npu_fusion_attention.md):

- `atten_mask` is bool/uint8 and True (1) means *masked out*; a float additive mask (the GPU
  convention, 0 / -inf) is refused with an explanation.
- `scale` defaults to 1.0: pass 1/sqrt(d) yourself.
- `sparse_mode` 2 (leftUpCausal) and 3 (rightDownCausal) need the compressed 2048x2048
  upper-triangular mask; with `atten_mask=None`, sparse_mode/pre/next are ignored and the
  computation is full (not causal).
- 7 return values; the output is `[0]`.

Computed in float32 (formula: Dropout(Softmax(Mask(scale*(pse + Q K^T), atten_mask)),
keep_prob) @ V) and cast to the query dtype. Rows with every key masked give NaN, or zeros
with inner_precise=2 (the documented "invalid row" mode).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .ops import NpuConstraintError, check_dtype

LAYOUTS = ("BSH", "SBH", "BSND", "BNSD", "TND")
COMPRESSED_CAUSAL = 2048
MAX_HEAD_DIM = 768


def _to_bnsd(t: torch.Tensor, layout: str, heads: int | None, d: int | None, name: str) -> torch.Tensor:
    """BNSD view of q/k/v. For BSH/SBH the head count of k/v is inferred from q's head dim."""
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if t.dim() != 3:
        raise NpuConstraintError(f"npu_fusion_attention: {name} must be 3-D for layout {layout}, got {tuple(t.shape)}")
    h = t.shape[-1]
    if heads is None:
        if d is None or h % d:
            raise NpuConstraintError(f"npu_fusion_attention: {name} hidden size {h} is not a multiple of head dim {d}")
        heads = h // d
    if h % heads:
        raise NpuConstraintError(f"npu_fusion_attention: {name} hidden size {h} is not divisible by head_num {heads}")
    if layout == "BSH":
        b, s, _ = t.shape
        return t.view(b, s, heads, h // heads).transpose(1, 2)
    s, b, _ = t.shape  # SBH
    return t.view(s, b, heads, h // heads).permute(1, 2, 0, 3)


def _from_bnsd(o: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return o
    if layout == "BSND":
        return o.transpose(1, 2)
    b, n, s, d = o.shape
    if layout == "BSH":
        return o.transpose(1, 2).reshape(b, s, n * d)
    return o.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _check_compressed(mask: torch.Tensor | None, sparse_mode: int) -> None:
    if mask is None:
        return
    if tuple(mask.shape[-2:]) != (COMPRESSED_CAUSAL, COMPRESSED_CAUSAL):
        raise NpuConstraintError(
            f"npu_fusion_attention: sparse_mode={sparse_mode} needs the compressed {COMPRESSED_CAUSAL}x"
            f"{COMPRESSED_CAUSAL} mask torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1), "
            f"got shape {tuple(mask.shape)}")
    m = mask[..., :64, :64].bool()
    want = torch.ones(64, 64, dtype=torch.bool, device=mask.device).triu(diagonal=1)
    if not torch.equal(m.reshape(-1, 64, 64)[0], want):
        raise NpuConstraintError(
            f"npu_fusion_attention: sparse_mode={sparse_mode} mask must be upper-triangular True "
            "(True = masked); a lower-triangular or inverted mask reverses causality")


def _masked(sq: int, skv: int, atten_mask: torch.Tensor | None, sparse_mode: int,
            pre_tockens: int, next_tockens: int, device) -> torch.Tensor | None:
    """Bool tensor broadcastable to (B, N, Sq, Skv); True = excluded. None = nothing masked."""
    if atten_mask is None:
        return None  # documented: sparse_mode, pre_tockens, next_tockens then have no effect
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(skv, device=device).view(1, -1)
    if sparse_mode in (0, 1):
        m = atten_mask.bool()
        if m.shape[-2:] != (sq, skv):
            raise NpuConstraintError(
                f"npu_fusion_attention: atten_mask last dims {tuple(m.shape[-2:])} must be (Sq, Skv)=({sq}, {skv}) "
                f"for sparse_mode={sparse_mode}")
        if sparse_mode == 0:  # the band must agree with the mask; applying both is the documented meaning
            m = m | (j > i + next_tockens) | (j < i - pre_tockens)
        return m
    if sparse_mode in (2, 3, 4):
        _check_compressed(atten_mask, sparse_mode)
        off = 0 if sparse_mode == 2 else skv - sq  # 2 = top-left aligned, 3/4 = bottom-right aligned
        if sparse_mode == 4:
            return (j > i + off + next_tockens) | (j < i + off - pre_tockens)
        return j > i + off
    raise NotImplementedError(f"npu_fusion_attention: sparse_mode={sparse_mode} (prefix / varlen split modes) "
                              "has no reference; use 0-4")


def _zero_invalid(inner_precise: int, sparse_mode: int, sq: int, skv: int) -> bool:
    """inner_precise=2 zeroes fully masked rows; documented as automatic for sparse_mode 3 with Sq > Skv."""
    return inner_precise == 2 or (sparse_mode == 3 and sq > skv)


def _attend(q, k, v, pse, mask, scale, keep_prob, zero_invalid_rows):
    """q (B,N,Sq,D), k/v (B,Nkv,Skv,D); returns out (B,N,Sq,Dv) fp32, row max, row sum."""
    n, nkv = q.shape[1], k.shape[1]
    if nkv == 0 or n % nkv:
        raise NpuConstraintError(f"npu_fusion_attention: query heads {n} must be a multiple of key/value heads {nkv}")
    if nkv != n:  # GQA
        k = k.repeat_interleave(n // nkv, dim=1)
        v = v.repeat_interleave(n // nkv, dim=1)
    s = q.float() @ k.float().transpose(-2, -1)
    if pse is not None:
        s = s + pse.float()
    s = s * scale
    if mask is not None:
        s = s.masked_fill(mask, float("-inf"))
    row_max = s.amax(dim=-1, keepdim=True)
    p = torch.softmax(s, dim=-1)
    row_sum = torch.exp(s - row_max).sum(dim=-1, keepdim=True)
    if zero_invalid_rows and mask is not None:
        p = torch.nan_to_num(p, nan=0.0)
    if keep_prob < 1.0:
        p = F.dropout(p, p=1.0 - keep_prob, training=True)
    return p @ v.float(), row_max, row_sum


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                         atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647,
                         next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
                         softmax_layout=""):
    """7-tuple (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels).

    softmax_max/sum are float32 (B, N, Sq, 8) (TND: (N, T, 8), or (T, N, 8) with
    softmax_layout="TND"); softmax_out is an empty reserved tensor; seed/offset/numels are 0
    (the reference's dropout uses torch's RNG, so dropout masks never match the NPU's).
    """
    check_dtype("npu_fusion_attention", query, key, value, pse)
    if not (query.dtype == key.dtype == value.dtype) or (pse is not None and pse.dtype != query.dtype):
        raise NpuConstraintError("npu_fusion_attention: query, key, value (and pse) must have the same dtype")
    if input_layout not in LAYOUTS:
        raise NpuConstraintError(f"npu_fusion_attention: input_layout {input_layout!r} (documented: {', '.join(LAYOUTS)})")
    if padding_mask is not None:
        raise NpuConstraintError("npu_fusion_attention: padding_mask is documented as not supported")
    if prefix is not None:
        raise NotImplementedError("npu_fusion_attention: prefix (sparse_mode 5/6) has no reference")
    if not 0.0 < keep_prob <= 1.0:
        raise NpuConstraintError(f"npu_fusion_attention: keep_prob must be in (0, 1] (= 1 - dropout), got {keep_prob}")
    if atten_mask is not None and atten_mask.dtype not in (torch.bool, torch.uint8):
        raise NpuConstraintError(
            f"npu_fusion_attention: atten_mask must be bool/uint8 with True/1 = masked out, got {atten_mask.dtype}. "
            "A float additive mask (0 keep / -inf drop) is the GPU convention: pass `float_mask < 0`.")
    if key.shape != value.shape and input_layout != "TND":
        # documented: key and value shapes equal (Dk >= Dv is allowed only through equal shapes here)
        if key.shape[:-1] != value.shape[:-1] or key.shape[-1] < value.shape[-1]:
            raise NpuConstraintError("npu_fusion_attention: key and value shapes must match (Dk >= Dv)")
    if softmax_layout not in ("", "TND"):
        raise NpuConstraintError(f"npu_fusion_attention: softmax_layout {softmax_layout!r} (only '' or 'TND')")

    if input_layout == "TND":
        return _tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre_tockens,
                    next_tockens, inner_precise, actual_seq_qlen, actual_seq_kvlen, sparse_mode, softmax_layout)

    if input_layout in ("BSH", "SBH"):
        d = query.shape[-1] // head_num if head_num else None
        q = _to_bnsd(query, input_layout, head_num, None, "query")
        k = _to_bnsd(key, input_layout, None, d, "key")
        v = _to_bnsd(value, input_layout, None, value.shape[-1] // (key.shape[-1] // d) if d else None, "value")
    else:
        if query.dim() != 4:
            raise NpuConstraintError(f"npu_fusion_attention: query must be 4-D for {input_layout}, got {tuple(query.shape)}")
        q, k, v = (_to_bnsd(t, input_layout, None, None, n) for t, n in ((query, "query"), (key, "key"), (value, "value")))
        if q.shape[1] != head_num:
            raise NpuConstraintError(f"npu_fusion_attention: head_num={head_num} but query has {q.shape[1]} heads "
                                     f"in layout {input_layout}")
    dq = q.shape[-1]
    if dq != k.shape[-1] or not 1 <= dq <= MAX_HEAD_DIM:
        raise NpuConstraintError(f"npu_fusion_attention: head dim must satisfy Dq == Dk in [1, {MAX_HEAD_DIM}], "
                                 f"got Dq={dq}, Dk={k.shape[-1]}")
    sq, skv = q.shape[2], k.shape[2]
    mask = _masked(sq, skv, atten_mask, sparse_mode, pre_tockens, next_tockens, q.device)
    out, row_max, row_sum = _attend(q, k, v, pse, mask, scale, keep_prob, _zero_invalid(inner_precise, sparse_mode, sq, skv))
    out = _from_bnsd(out.to(query.dtype), input_layout)
    return (out, row_max.expand(*row_max.shape[:-1], 8).contiguous(),
            row_sum.expand(*row_sum.shape[:-1], 8).contiguous(), query.new_empty(0), 0, 0, 0)


def _tnd(query, key, value, head_num, pse, atten_mask, scale, keep_prob, pre_tockens, next_tockens,
         inner_precise, actual_seq_qlen, actual_seq_kvlen, sparse_mode, softmax_layout):
    """Varlen: (T, N, D) packed sequences; actual_seq_* are cumulative ends (2, 4, 6, ...)."""
    if actual_seq_qlen is None or actual_seq_kvlen is None:
        raise NpuConstraintError("npu_fusion_attention: TND needs actual_seq_qlen and actual_seq_kvlen "
                                 "(cumulative lengths, e.g. [2, 4, 6] for three sequences of 2)")
    qlen, kvlen = list(actual_seq_qlen), list(actual_seq_kvlen)
    if len(qlen) != len(kvlen):
        raise NpuConstraintError("npu_fusion_attention: actual_seq_qlen and actual_seq_kvlen differ in length")
    if any(b < a for a, b in zip(qlen, qlen[1:]) if b != 0) or any(b < a for a, b in zip(kvlen, kvlen[1:]) if b != 0):
        raise NpuConstraintError("npu_fusion_attention: actual_seq_qlen/kvlen must be cumulative (non-decreasing); "
                                 "pass [2, 4, 6], not the lengths [2, 2, 2]")
    if query.dim() != 3 or query.shape[1] != head_num:
        raise NpuConstraintError(f"npu_fusion_attention: TND query must be (T, head_num={head_num}, D), got {tuple(query.shape)}")
    if pse is not None:
        raise NotImplementedError("npu_fusion_attention: pse with TND has no reference")
    outs, maxes, sums = [], [], []
    q0 = kv0 = 0
    for q1, kv1 in zip(qlen, kvlen):
        if q1 == 0 and kv1 == 0 and q0 > 0:  # documented: trailing zeros = batches not computed
            break
        q = query[q0:q1].transpose(0, 1).unsqueeze(0)       # (1, N, Sq_i, D)
        k = key[kv0:kv1].transpose(0, 1).unsqueeze(0)
        v = value[kv0:kv1].transpose(0, 1).unsqueeze(0)
        mask = None
        if atten_mask is not None:
            m = atten_mask if sparse_mode in (2, 3, 4) else atten_mask[..., : q1 - q0, : kv1 - kv0]
            mask = _masked(q1 - q0, kv1 - kv0, m, sparse_mode, pre_tockens, next_tockens, query.device)
        o, mx, sm = _attend(q, k, v, None, mask, scale, keep_prob,
                            _zero_invalid(inner_precise, sparse_mode, q1 - q0, kv1 - kv0))
        outs.append(o[0].transpose(0, 1))                      # (Sq_i, N, Dv)
        maxes.append(mx[0, :, :, 0])                            # (N, Sq_i)
        sums.append(sm[0, :, :, 0])
        q0, kv0 = q1, kv1
    out = torch.cat(outs, dim=0).to(query.dtype)
    mx = torch.cat(maxes, dim=1)
    sm = torch.cat(sums, dim=1)
    if softmax_layout == "TND":
        mx, sm = mx.transpose(0, 1), sm.transpose(0, 1)
    return (out, mx.unsqueeze(-1).expand(*mx.shape, 8).contiguous(),
            sm.unsqueeze(-1).expand(*sm.shape, 8).contiguous(), query.new_empty(0), 0, 0, 0)
