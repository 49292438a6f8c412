"""FlexAttention where torch's fused FlexAttention kernel does not run: the BlockMask's token mask + SDPA.

Why a replacement: FlexAttention's speed and meaning come from its Triton kernel, which
visits only the key blocks a `BlockMask` lists. On a CPU, eager `flex_attention` runs an
unfused reference that applies `mask_mod` to every (query, key) pair and ignores the block
lists; the Modded-NanoGPT records encode their sliding windows only in those lists
(`BlockMask.from_kv_blocks` with a document-causal `mask_mod`), so that reference silently
drops the window. On an Ascend NPU there is no Triton at all.

What this module computes, for the masks those programs build, is what the GPU kernel
computes: a key is visible to a query when its block is one of the query block's *full*
blocks, or one of its *partial* blocks and `mask_mod` says so; every other key is masked.
That boolean token mask is derived once per `BlockMask` (it is cached on the object, since a
program reuses one mask in every layer) and handed to

* `torch.nn.functional.scaled_dot_product_attention` (BACKEND "sdpa", the default), or
* `torch_npu.npu_fusion_attention` in layout BNSD with `atten_mask = ~visible` (True means
  masked out on the NPU) and the scale passed explicitly (its default is 1, not 1/sqrt(d)),
  when BACKEND is "npu_fusion_attention" (a port to the npu target sets it in its copy).

Rows with no visible key return zeros (and zero gradients), as FlexAttention does; neither
SDPA (NaN) nor the NPU operator (NaN unless asked otherwise) would, so such a row is given
one placeholder key and its output is zeroed afterwards.

`BlockMask`, `create_mask`, `and_masks`, `or_masks` and `noop_mask` are torch's own (pure
PyTorch). `create_block_mask` builds the same `BlockMask` as torch's (same block lists and
order) without `torch.compile`; `_compile` is accepted and ignored.

Not supported (they raise NotImplementedError, and the porter reports them before a run):
`score_mod`, and `return_aux` asking for max_scores (`AuxRequest(lse=True)` is supported).
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, and_masks, create_mask, noop_mask, or_masks

try:  # torch >= 2.9; the torch that torch_npu pins may be older
    from torch.nn.attention.flex_attention import AuxOutput, AuxRequest
except ImportError:  # pragma: no cover - depends on the installed torch
    AuxOutput = AuxRequest = None

__all__ = ["AuxOutput", "AuxRequest", "BlockMask", "and_masks", "create_block_mask", "create_mask", "flex_attention",
           "noop_mask", "or_masks", "visible_mask"]

# Which operator computes the attention: "sdpa" or "npu_fusion_attention" (set by a port to npu).
BACKEND = "sdpa"

_CACHE_ATTR = "_tb_visible_mask"
_FROM_KV_BLOCKS_TAKES_LENGTHS = "seq_lengths" in inspect.signature(BlockMask.from_kv_blocks).parameters
_PREPARED_ATTR = "_tb_prepared_mask"


def _block_sizes(block_size) -> tuple[int, int]:
    if isinstance(block_size, int):
        return block_size, block_size
    q_bs, kv_bs = block_size
    return int(q_bs), int(kv_bs)


def _eval_mask_mod(mask_mod, b: int, h: int, q_len: int, kv_len: int, device) -> torch.Tensor:
    """mask_mod on the (b, h, q, kv) grid, broadcastable to (b, h, q_len, kv_len).

    Broadcast index tensors first: the records' mask_mods (`docs[q_idx] == docs[kv_idx]`,
    `q_idx >= kv_idx`) are elementwise, so this costs one pass of plain tensor ops. A mask_mod
    written for scalars only (it fails, or answers in another shape) goes through torch's own
    vmap evaluation, `create_mask`, which is what FlexAttention itself uses.
    """
    want = (b, h, q_len, kv_len)
    idx = [torch.arange(n, device=device).view([n if i == d else 1 for i in range(4)]) for d, n in enumerate(want)]
    try:
        got = mask_mod(*idx)
        got = torch.as_tensor(got, device=device)
        if got.dtype != torch.bool or got.dim() > 4 or torch.broadcast_shapes(got.shape, want) != want:
            raise ValueError("mask_mod result does not broadcast to (B, H, Q, KV)")
        return got.reshape((1,) * (4 - got.dim()) + tuple(got.shape))
    except Exception:  # noqa: BLE001 - any failure means "not elementwise": use torch's vmap path
        return create_mask(mask_mod, b, h, q_len, kv_len, device=device).bool()


def _listed_blocks(num: torch.Tensor | None, indices: torch.Tensor | None, n_kv_blocks: int) -> torch.Tensor | None:
    """(B, H, Q_blocks, KV_blocks) bool: the first num[b, h, i] entries of indices[b, h, i] set."""
    if num is None or indices is None:
        return None
    width = max(n_kv_blocks, indices.shape[-1])
    listed = torch.arange(indices.shape[-1], device=indices.device) < num.unsqueeze(-1)
    target = torch.where(listed, indices.long(), width)  # unlisted entries land in a spare column
    dense = torch.zeros(*indices.shape[:-1], width + 1, dtype=torch.bool, device=indices.device)
    dense.scatter_(-1, target, True)
    return dense[..., :n_kv_blocks]


def _to_tokens(blocks: torch.Tensor, q_len: int, kv_len: int, q_bs: int, kv_bs: int) -> torch.Tensor:
    qb = torch.arange(q_len, device=blocks.device) // q_bs
    kb = torch.arange(kv_len, device=blocks.device) // kv_bs
    return blocks[..., qb[:, None], kb[None, :]]


def visible_mask(block_mask: BlockMask, q_len: int | None = None, kv_len: int | None = None) -> torch.Tensor:
    """Bool (B|1, H|1, Q, KV): True where the query sees the key under the GPU kernel's rules.

    Full blocks are visible, partial blocks through mask_mod, unlisted blocks masked.
    Cached on the BlockMask for each (q_len, kv_len).
    """
    seq_q, seq_kv = block_mask.seq_lengths
    q_len = seq_q if q_len is None else q_len
    kv_len = seq_kv if kv_len is None else kv_len
    key = (q_len, kv_len)
    cache = getattr(block_mask, _CACHE_ATTR, None)
    if cache is not None and cache[0] == key:
        return cache[1]
    q_bs, kv_bs = _block_sizes(block_mask.BLOCK_SIZE)
    n_kv_blocks = -(-kv_len // kv_bs)
    partial = _listed_blocks(block_mask.kv_num_blocks, block_mask.kv_indices, n_kv_blocks)
    full = _listed_blocks(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, n_kv_blocks)
    b, h = partial.shape[0], partial.shape[1]
    visible = _to_tokens(partial, q_len, kv_len, q_bs, kv_bs)
    if block_mask.mask_mod is not noop_mask:
        visible = visible & _eval_mask_mod(block_mask.mask_mod, b, h, q_len, kv_len, partial.device)
    if full is not None:
        visible = visible | _to_tokens(full, q_len, kv_len, q_bs, kv_bs)
    setattr(block_mask, _CACHE_ATTR, (key, visible))
    return visible


def _dense_to_ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block lists as torch builds them: counts, and listed block indices first, ascending."""
    num = dense.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return num, indices


def create_block_mask(mask_mod, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int, device=None,
                      BLOCK_SIZE: int | tuple[int, int] = 128, _compile: bool = False, **_options) -> BlockMask:
    """torch's `create_block_mask` without torch.compile (`_compile` and layout options ignored).

    A block is full when mask_mod is True on all of it, partial when on some of it (the last,
    partly padded block is never full), as torch decides; the token mask computed here is kept
    on the BlockMask so attention does not evaluate mask_mod again.
    """
    b, h = (1 if B is None else B), (1 if H is None else H)
    device = torch.device("cpu") if device is None else torch.device(device)
    q_bs, kv_bs = _block_sizes(BLOCK_SIZE)
    visible = _eval_mask_mod(mask_mod, b, h, Q_LEN, KV_LEN, device)
    tokens = visible.expand(b, h, Q_LEN, KV_LEN)
    n_q, n_kv = -(-Q_LEN // q_bs), -(-KV_LEN // kv_bs)
    padded = F.pad(tokens, (0, n_kv * kv_bs - KV_LEN, 0, n_q * q_bs - Q_LEN), value=False)
    blocks = padded.reshape(b, h, n_q, q_bs, n_kv, kv_bs)
    any_visible = blocks.any(dim=5).any(dim=3)
    all_visible = blocks.all(dim=5).all(dim=3)
    kv_num, kv_idx = _dense_to_ordered(any_visible & ~all_visible)
    full_num, full_idx = _dense_to_ordered(all_visible)
    if _FROM_KV_BLOCKS_TAKES_LENGTHS:
        block_mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(q_bs, kv_bs),
                                              mask_mod=mask_mod, seq_lengths=(Q_LEN, KV_LEN))
    else:  # older torch infers whole blocks; the lengths are what the mask was built for
        block_mask = BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(q_bs, kv_bs),
                                              mask_mod=mask_mod)
        block_mask.seq_lengths = (Q_LEN, KV_LEN)
    setattr(block_mask, _CACHE_ATTR, ((Q_LEN, KV_LEN), visible))
    return block_mask


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: BlockMask | None,
           enable_gqa: bool) -> None:
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise NotImplementedError("flex_attention: query, key and value must be 4-D (B, H, S, D)")
    if not enable_gqa and query.size(1) != key.size(1):
        raise ValueError(f"flex_attention: query has {query.size(1)} heads, key/value {key.size(1)}: "
                         "set enable_gqa=True for grouped-query attention")
    if enable_gqa and query.size(1) % key.size(1):
        raise ValueError(f"flex_attention: query heads {query.size(1)} not a multiple of key heads {key.size(1)}")
    if block_mask is not None and tuple(block_mask.seq_lengths) != (query.size(-2), key.size(-2)):
        raise ValueError(f"flex_attention: block_mask was created for lengths {tuple(block_mask.seq_lengths)} "
                         f"but got q_len={query.size(-2)} and kv_len={key.size(-2)}")


def _repair_empty_rows(visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mask with one placeholder key in each row that has none, those rows) or (mask, None)."""
    empty = ~visible.any(dim=-1)
    if not bool(empty.any()):
        return visible, None
    first_key = torch.zeros(visible.shape[-1], dtype=torch.bool, device=visible.device)
    first_key[0] = True
    return visible | (empty.unsqueeze(-1) & first_key), empty


def _prepared(block_mask: BlockMask, q_len: int, kv_len: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """visible_mask with empty rows repaired, cached beside it (one host sync per mask, not per layer)."""
    visible = visible_mask(block_mask, q_len, kv_len)
    cache = getattr(block_mask, _PREPARED_ATTR, None)
    if cache is None or cache[0] is not visible:
        cache = (visible, *_repair_empty_rows(visible))
        setattr(block_mask, _PREPARED_ATTR, cache)
    return cache[1], cache[2]


def _lse(query, key, visible, scale) -> torch.Tensor:
    """Natural-log logsumexp of the visible scaled scores, float32, -inf on rows with no key."""
    k = key.float().repeat_interleave(query.size(1) // key.size(1), dim=1)
    s = (query.float() @ k.transpose(-2, -1)) * scale
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    return torch.logsumexp(s, dim=-1)


def _npu_attention(query, key, value, visible, scale) -> torch.Tensor:
    import torch_npu  # only on the npu target

    mask = None
    if visible is not None:
        mask = ~visible
        if mask.size(1) > 1 and mask.size(0) != query.size(0):  # documented shapes: (B|1, 1, S, S) or (B, N, S, S)
            mask = mask.expand(query.size(0), -1, -1, -1)
    return torch_npu.npu_fusion_attention(query, key, value, query.size(1), "BNSD", atten_mask=mask,
                                          scale=scale, keep_prob=1.0, sparse_mode=0)[0]


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None,
                   block_mask: BlockMask | None = None, scale: float | None = None, enable_gqa: bool = False,
                   return_lse: bool = False, kernel_options=None, *, return_aux=None):
    """FlexAttention's result for (B, H, S, D) inputs, without its Triton kernel (module doc).

    Returns the output in the query's dtype, or (output, lse) with return_lse, or
    (output, AuxOutput(lse=...)) with return_aux=AuxRequest(lse=True) (lse float32, natural
    log, -inf on rows with no visible key). kernel_options only tune the GPU kernel
    and are ignored.
    """
    if score_mod is not None:
        raise NotImplementedError("flex_attention shim: score_mod is not supported (only block_mask masking)")
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise NotImplementedError("flex_attention shim: return_aux max_scores is not supported (lse is)")
    _check(query, key, value, block_mask, enable_gqa)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    visible, empty = (None, None) if block_mask is None else _prepared(block_mask, query.size(-2), key.size(-2))
    if BACKEND == "npu_fusion_attention":
        out = _npu_attention(query, key, value, visible, scale)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=visible, scale=scale,
                                             enable_gqa=query.size(1) != key.size(1))
    if empty is not None:
        out = out.masked_fill(empty.unsqueeze(-1), 0.0)
    want_lse = return_lse or (return_aux is not None and getattr(return_aux, "lse", False))
    lse = None
    if want_lse:
        lse = _lse(query, key, visible, scale)
        if empty is not None:
            lse = lse.masked_fill(empty, float("-inf"))
    if return_aux is not None:
        return out, AuxOutput(lse=lse, max_scores=None)
    return (out, lse) if return_lse else out
