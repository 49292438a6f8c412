"""FlexAttention port: the shim against torch's own FlexAttention, its npu branch, and the porter.

The masks are the kinds the Modded-NanoGPT records build (documents separated by a BOS
token, causal, sliding window), built both with `create_block_mask` and by hand with
`BlockMask.from_kv_blocks` (partial and full block lists, the window as a clamp on the
list lengths). One fact shapes the comparisons: torch's eager FlexAttention on the CPU
applies `mask_mod` to every pair and ignores the block lists, while the GPU kernel visits only
listed blocks. So for hand-built masks torch's reference is given a mask_mod that says what
the GPU kernel does, derived here by a loop over the block lists (`_gpu_visible`);
`test_torch_eager_ignores_block_lists` pins that fact. Backward: torch's eager FlexAttention
refuses gradients on the CPU, so gradients are compared with torch's own unfused
implementation (`math_attention`, what the eager forward runs) and a float64 reference.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import flex_attention as torch_flex

from trainbridge.npu_reference import fake_torch_npu as fake
from trainbridge.targets.features import flex_attention as feature
from trainbridge.targets.port_source import port_naive, port_program
from trainbridge.targets.shims import flex_attention as shim

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
BOS = 0
TOL = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 2e-2)}


# ----------------------------------------------------------------------------- masks ----

def _docs(n: int, n_bos: int, seed: int) -> torch.Tensor:
    """Document id of each of n tokens (cumsum of BOS positions), as the records compute it."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 100, (n,), generator=g)
    tokens[torch.randperm(n, generator=g)[:n_bos]] = BOS
    return (tokens == BOS).cumsum(0)


def _doc_causal(docs):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])
    return mask_mod


def _doc_causal_window(docs, window: int):
    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx]) & (q_idx - kv_idx < window)
    return mask_mod


def _ordered(dense: torch.Tensor):
    num = dense.sum(dim=-1, dtype=torch.int32)
    idx = dense.to(torch.int8).argsort(dim=-1, descending=False, stable=True).flip(-1).to(torch.int32)
    return num[None, None].contiguous(), idx[None, None].contiguous()


def _hand_block_mask(docs, window_blocks: int, block: int = 128) -> torch_flex.BlockMask:
    """Partial/full block lists of document-causal blocks, most recent first, clamped to a window."""
    n = len(docs) // block
    bidx = torch.arange(n)
    low, high = docs.view(-1, block)[:, 0], docs.view(-1, block)[:, -1]
    any_bm = (bidx[:, None] >= bidx) & (low[:, None] <= high) & (high[:, None] >= low)
    all_bm = (bidx[:, None] > bidx) & (low[:, None] == high) & (high[:, None] == low)
    p_num, p_idx = _ordered(any_bm & ~all_bm)
    f_num, f_idx = _ordered(all_bm)
    w = torch.tensor(window_blocks, dtype=torch.int32)
    return torch_flex.BlockMask.from_kv_blocks(
        torch.clamp_max(p_num, torch.clamp_min(w - f_num, 1)), p_idx, torch.clamp_max(f_num, w - 1), f_idx,
        BLOCK_SIZE=block, mask_mod=_doc_causal(docs))


def _simple_hand_block_mask(docs, window: int, block: int = 128) -> torch_flex.BlockMask:
    """The earlier form: one list of blocks (no full blocks), window in blocks applied to the list."""
    n = len(docs) // block
    qb, kb = torch.arange(n)[:, None], torch.arange(n)[None, :]
    low, high = docs.view(-1, block)[:, 0], docs.view(-1, block)[:, -1]
    dense = (qb >= kb) & (low[:, None] <= high[None, :]) & (low[None, :] <= high[:, None]) & (qb - kb < window)
    num = dense.sum(-1).to(torch.int32)[None, None].contiguous()
    idx = torch.argsort(dense.to(torch.int32), dim=-1, descending=True, stable=True).to(torch.int32)[None, None]
    return torch_flex.BlockMask.from_kv_blocks(num, idx.contiguous(), BLOCK_SIZE=block, mask_mod=_doc_causal(docs))


def _gpu_visible(bm: torch_flex.BlockMask) -> torch.Tensor:
    """(B, H, Q, KV) visibility under the GPU kernel's rules, by a plain loop over the block lists."""
    q_len, kv_len = bm.seq_lengths
    q_bs, kv_bs = bm.BLOCK_SIZE
    b_n, h_n, n_q = bm.kv_num_blocks.shape
    partial = torch.zeros(b_n, h_n, q_len, kv_len, dtype=torch.bool)
    full = torch.zeros_like(partial)
    for b in range(b_n):
        for h in range(h_n):
            for i in range(n_q):
                rows = slice(i * q_bs, (i + 1) * q_bs)
                for j in bm.kv_indices[b, h, i, : int(bm.kv_num_blocks[b, h, i])].tolist():
                    partial[b, h, rows, j * kv_bs:(j + 1) * kv_bs] = True
                if bm.full_kv_num_blocks is not None:
                    for j in bm.full_kv_indices[b, h, i, : int(bm.full_kv_num_blocks[b, h, i])].tolist():
                        full[b, h, rows, j * kv_bs:(j + 1) * kv_bs] = True
    mm = torch_flex.create_mask(bm.mask_mod, b_n, h_n, q_len, kv_len, device="cpu")
    return full | (partial & mm)


def _faithful(bm: torch_flex.BlockMask) -> torch_flex.BlockMask:
    """The same BlockMask with a mask_mod that states the GPU semantics (for torch's eager reference)."""
    visible = _gpu_visible(bm)
    b_n, h_n = visible.shape[:2]

    def mask_mod(b, h, q_idx, kv_idx):  # a (1, 1, ...) mask applies to every batch and head
        return visible[b if b_n > 1 else 0, h if h_n > 1 else 0, q_idx, kv_idx]
    return torch_flex.BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                               bm.full_kv_indices, BLOCK_SIZE=bm.BLOCK_SIZE, mask_mod=mask_mod,
                                               seq_lengths=bm.seq_lengths)


def _qkv(b, h, s, d, dtype, seed, h_kv=None):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, hh, s, d, generator=g).to(dtype) for hh in (h, h_kv or h, h_kv or h)]


def _close(a, b, dtype):
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(a.float(), b.float(), atol=atol, rtol=rtol)


def _ref64(q, k, v, visible, scale):
    """Float64 masked softmax attention; rows with no visible key give 0."""
    k = k.double().repeat_interleave(q.size(1) // k.size(1), dim=1)
    v = v.double().repeat_interleave(q.size(1) // v.size(1), dim=1)
    s = (q.double() @ k.transpose(-2, -1)) * scale
    s = s.masked_fill(~visible, -math.inf)
    p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
    return p @ v


# ------------------------------------------------------------------- block masks ----

@pytest.mark.parametrize("length,window", [(1024, 300), (1000, 1 << 20), (384, 64)])
def test_create_block_mask_lists_equal_torch(length, window):
    docs = _docs(length, 5, seed=length)
    mm = _doc_causal_window(docs, window)
    ours = shim.create_block_mask(mm, None, None, length, length, device="cpu", _compile=True)
    theirs = torch_flex.create_block_mask(mm, None, None, length, length, device="cpu")
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    assert ours.seq_lengths == theirs.seq_lengths and tuple(ours.BLOCK_SIZE) == tuple(theirs.BLOCK_SIZE)


def test_create_block_mask_per_head_mask_mod():
    def mm(b, h, q, kv):
        return (q >= kv) & ((q - kv) < 64 * (h + 1)) & (b >= 0)
    ours = shim.create_block_mask(mm, 2, 3, 256, 256, BLOCK_SIZE=64)
    theirs = torch_flex.create_block_mask(mm, 2, 3, 256, 256, device="cpu", BLOCK_SIZE=64)
    assert torch.equal(ours.kv_indices, theirs.kv_indices) and torch.equal(ours.full_kv_num_blocks,
                                                                            theirs.full_kv_num_blocks)
    assert torch.equal(shim.visible_mask(ours).expand(2, 3, 256, 256), _gpu_visible(theirs))


def test_visible_mask_follows_the_block_lists():
    docs = _docs(1024, 4, seed=3)
    bm = _hand_block_mask(docs, window_blocks=3)
    assert torch.equal(shim.visible_mask(bm), _gpu_visible(bm))
    assert shim.visible_mask(bm) is shim.visible_mask(bm)  # computed once, reused by every layer


def test_scalar_only_mask_mod_goes_through_torch_vmap():
    table = torch.rand(256, 256) > 0.3

    def scalar_only(b, h, q, kv):  # two-step indexing: correct only under vmap, not under broadcasting
        return table[q][kv] & (q >= kv)
    ours = shim.create_block_mask(scalar_only, None, None, 256, 256, BLOCK_SIZE=64)
    want = torch_flex.create_mask(scalar_only, 1, 1, 256, 256, device="cpu")
    assert torch.equal(shim.visible_mask(ours), want)


def test_torch_eager_ignores_block_lists():
    """Why the shim exists on the CPU: eager flex drops a window that lives only in the block lists."""
    docs = torch.zeros(512, dtype=torch.long)  # one document
    bm = _hand_block_mask(docs, window_blocks=1)
    q, k, v = _qkv(1, 2, 512, 16, torch.float32, seed=0)
    eager = torch_flex.flex_attention(q, k, v, block_mask=bm)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(eager, causal, atol=1e-5, rtol=1e-5)  # the window is gone
    ours = shim.flex_attention(q, k, v, block_mask=bm)
    assert (ours - causal).abs().max() > 1e-2
    _close(ours, torch_flex.flex_attention(q, k, v, block_mask=_faithful(bm)), torch.float32)


# ---------------------------------------------------------------------- forward ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("build", ["create_block_mask", "from_kv_blocks", "from_kv_blocks_simple"])
def test_forward_matches_torch_flex(dtype, build):
    length = 1024
    docs = _docs(length, 6, seed=11)
    if build == "create_block_mask":
        bm = shim.create_block_mask(_doc_causal_window(docs, 300), None, None, length, length, device="cpu")
        ref_bm = torch_flex.create_block_mask(_doc_causal_window(docs, 300), None, None, length, length, device="cpu")
    elif build == "from_kv_blocks":
        bm = _hand_block_mask(docs, window_blocks=3)
        ref_bm = _faithful(bm)
    else:
        bm = _simple_hand_block_mask(docs, window=2)
        ref_bm = _faithful(bm)
    q, k, v = _qkv(1, 4, length, 32, dtype, seed=1)
    for kwargs in ({}, {"scale": 0.12}):
        ours = shim.flex_attention(q, k, v, block_mask=bm, **kwargs)
        assert ours.dtype == dtype and ours.shape == q.shape
        _close(ours, torch_flex.flex_attention(q, k, v, block_mask=ref_bm, **kwargs), dtype)


def test_window_changes_between_steps():
    """The records rebuild the mask each step with a growing window: each one is honoured."""
    docs = _docs(1024, 3, seed=5)
    q, k, v = _qkv(1, 2, 1024, 16, torch.float32, seed=2)
    outs = []
    for wb in (1, 2, 4, 8):
        bm = _hand_block_mask(docs, window_blocks=wb)
        outs.append(shim.flex_attention(q, k, v, block_mask=bm, scale=0.12))
        _close(outs[-1], torch_flex.flex_attention(q, k, v, block_mask=_faithful(bm), scale=0.12), torch.float32)
    assert all((a - b).abs().max() > 1e-4 for a, b in zip(outs, outs[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa_matches_torch_flex(dtype):
    docs = _docs(512, 3, seed=7)
    bm = _hand_block_mask(docs, window_blocks=2)
    q, k, v = _qkv(1, 6, 512, 16, dtype, seed=3, h_kv=2)
    _close(shim.flex_attention(q, k, v, block_mask=bm, enable_gqa=True),
           torch_flex.flex_attention(q, k, v, block_mask=_faithful(bm), enable_gqa=True), dtype)
    with pytest.raises(ValueError, match="enable_gqa"):
        shim.flex_attention(q, k, v, block_mask=bm)


def test_rows_without_keys_are_zero_like_flex():
    def mm(b, h, q, kv):
        return (q >= kv) & (q >= 200)
    bm = shim.create_block_mask(mm, None, None, 384, 384)
    q, k, v = _qkv(1, 2, 384, 16, torch.float32, seed=4)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = shim.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    with torch.no_grad():
        ref_out, aux = torch_flex.flex_attention(q.detach(), k.detach(), v.detach(),
                                                 block_mask=torch_flex.create_block_mask(mm, None, None, 384, 384,
                                                                                         device="cpu"),
                                                 return_aux=torch_flex.AuxRequest(lse=True))
        ref_lse = aux.lse
        _, our_aux = shim.flex_attention(q, k, v, block_mask=bm, return_aux=shim.AuxRequest(lse=True))
        torch.testing.assert_close(our_aux.lse, lse)
    assert not out.isnan().any() and torch.equal(out[:, :, :200], torch.zeros_like(out[:, :, :200]))
    assert torch.isneginf(lse[:, :, :200]).all() and torch.isneginf(ref_lse[:, :, :200]).all()
    _close(out, ref_out, torch.float32)
    torch.testing.assert_close(lse[:, :, 200:], ref_lse[:, :, 200:], atol=1e-5, rtol=1e-5)
    out.sum().backward()
    assert all(t.grad.isfinite().all() for t in (q, k, v))
    assert torch.equal(q.grad[:, :, :200], torch.zeros_like(q.grad[:, :, :200]))


def test_block_mask_length_must_match():
    bm = shim.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 256, 256)
    q, k, v = _qkv(1, 2, 128, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match="lengths"):
        shim.flex_attention(q, k, v, block_mask=bm)


def test_unsupported_arguments_raise():
    q, k, v = _qkv(1, 2, 128, 16, torch.float32, seed=0)
    with pytest.raises(NotImplementedError, match="score_mod"):
        shim.flex_attention(q, k, v, lambda s, b, h, qi, ki: s)
    with pytest.raises(NotImplementedError, match="max_scores"):
        shim.flex_attention(q, k, v, return_aux=shim.AuxRequest(max_scores=True))


# --------------------------------------------------------------------- backward ----

def _torch_math_attention():
    """torch's own unfused FlexAttention (what eager flex runs), differentiable; None if it moved."""
    try:
        from torch._higher_order_ops.flex_attention import math_attention
    except ImportError:
        return None
    return math_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("build", ["create_block_mask", "from_kv_blocks"])
def test_backward_matches_torch_math_and_float64(dtype, build):
    length = 512
    docs = _docs(length, 4, seed=13)
    if build == "create_block_mask":
        bm = shim.create_block_mask(_doc_causal_window(docs, 200), None, None, length, length)
    else:
        bm = _hand_block_mask(docs, window_blocks=2)
    scale = 0.12
    base = _qkv(1, 2, length, 32, dtype, seed=21)
    dout = torch.randn(1, 2, length, 32, generator=torch.Generator().manual_seed(9)).to(dtype)

    leaves = [t.clone().requires_grad_() for t in base]
    shim.flex_attention(*leaves, block_mask=bm, scale=scale).backward(dout)
    ours = [t.grad for t in leaves]

    leaves64 = [t.double().requires_grad_() for t in base]
    _ref64(*leaves64, _gpu_visible(bm), scale).backward(dout.double())
    for g, r in zip(ours, (t.grad for t in leaves64)):
        _close(g, r, dtype) if dtype == torch.float32 else torch.testing.assert_close(
            g.float(), r.float(), atol=6e-2, rtol=6e-2)

    math_attention = _torch_math_attention()
    if math_attention is None:
        pytest.skip("torch's math_attention moved; compared with the float64 reference only")
    leaves_t = [t.clone().requires_grad_() for t in base]
    out_t = math_attention(*leaves_t, lambda s, b, h, q, kv: s, _faithful(bm).as_tuple(), scale, {})[0]
    out_t.backward(dout)
    for g, r in zip(ours, (t.grad for t in leaves_t)):
        _close(g, r, dtype) if dtype == torch.float32 else torch.testing.assert_close(
            g.float(), r.float(), atol=6e-2, rtol=6e-2)


# -------------------------------------------------------------------------- npu ----

@pytest.fixture
def npu_shim(monkeypatch):
    """The shim with BACKEND npu_fusion_attention, the fake torch_npu, and a log of the operator's calls."""
    calls = []
    with fake.installed() as tnpu:
        real = tnpu.npu_fusion_attention

        def logged(*args, **kwargs):
            calls.append((args, kwargs))
            return real(*args, **kwargs)
        monkeypatch.setattr(tnpu, "npu_fusion_attention", logged)
        monkeypatch.setattr(shim, "BACKEND", "npu_fusion_attention")
        yield calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_npu_branch_matches_sdpa_branch(npu_shim, dtype):
    docs = _docs(512, 4, seed=17)
    bm = _hand_block_mask(docs, window_blocks=2)
    base = _qkv(1, 4, 512, 32, dtype, seed=5, h_kv=2)
    leaves = [t.clone().requires_grad_() for t in base]
    out = shim.flex_attention(*leaves, block_mask=bm, scale=0.12, enable_gqa=True)
    out.float().square().sum().backward()
    args, kwargs = npu_shim[-1]
    assert args[3:5] == (4, "BNSD") and kwargs["scale"] == 0.12 and kwargs["sparse_mode"] == 0
    assert kwargs["atten_mask"].dtype == torch.bool
    assert torch.equal(kwargs["atten_mask"], ~shim.visible_mask(bm))  # True = masked out on the NPU

    shim.BACKEND = "sdpa"
    ref_leaves = [t.clone().requires_grad_() for t in base]
    ref = shim.flex_attention(*ref_leaves, block_mask=bm, scale=0.12, enable_gqa=True)
    ref.float().square().sum().backward()
    _close(out, ref, dtype)
    for g, r in zip(leaves, ref_leaves):
        torch.testing.assert_close(g.grad.float(), r.grad.float(), atol=TOL[dtype][0] * 5, rtol=TOL[dtype][1] * 5)


def test_npu_branch_rows_without_keys_are_zero(npu_shim):
    bm = shim.create_block_mask(lambda b, h, q, kv: (q >= kv) & (q >= 100), None, None, 256, 256)
    q, k, v = _qkv(1, 2, 256, 16, torch.float32, seed=6)
    out = shim.flex_attention(q, k, v, block_mask=bm)
    assert npu_shim and not out.isnan().any() and torch.equal(out[:, :, :100], torch.zeros_like(out[:, :, :100]))


# --------------------------------------------------------------------- programs ----
# Small training programs in the records' FlexAttention forms (written for these tests).

_MODEL = '''
class Attn(nn.Module):
    def __init__(self, dim=64, heads=4, kv_heads=4):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x, block_mask):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.heads, self.hd)
        k, v = self.kv(x).view(B, T, 2 * self.kv_heads, self.hd).chunk(2, dim=2)
        y = ATTENTION_CALL
        return self.o(y.contiguous().view(B, T, -1))


class Net(nn.Module):
    def __init__(self, vocab=64, dim=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList([Attn(dim, 4, KV_HEADS) for _ in range(2)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx, target, window_blocks):
        block_mask = BUILD_MASK
        x = self.emb(idx[None])
        for blk in self.blocks:
            x = x + blk(F.rms_norm(x, (x.size(-1),)), block_mask)
        return F.cross_entropy(self.head(x).view(-1, 64).float(), target)


torch.manual_seed(0)
device = "cuda"
model = Net().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randint(1, 64, (257,), device=device)
data[::97] = 0
losses = []
for step in range(3):
    loss = model(data[:-1], data[1:], torch.tensor(1 + step, dtype=torch.int32, device=device))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
'''

_ERA_CREATE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
flex_attention = torch.compile(flex_attention, dynamic=False)
create_block_mask = torch.compile(create_block_mask, dynamic=False)

def make_mask(idx, window_blocks):
    docs = (idx == 0).cumsum(0)
    def document_causal_mask(b, h, q_idx, kv_idx):
        causal_mask = q_idx >= kv_idx
        document_mask = docs[q_idx] == docs[kv_idx]
        window_mask = q_idx - kv_idx < 96
        return causal_mask & document_mask & window_mask
    S = len(idx)
    return create_block_mask(document_causal_mask, None, None, S, S, device="cuda", _compile=True)
''' + _MODEL.replace("BUILD_MASK", "make_mask(idx, window_blocks)").replace(
    "ATTENTION_CALL", "flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
                      "block_mask=block_mask).transpose(1, 2)").replace("KV_HEADS", "4")

_BLOCK_LISTS = '''
def make_mask(idx, window_blocks):
    BLOCK_SIZE = 128
    docs = (idx == 0).cumsum(0)
    def document_causal(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (docs[q_idx] == docs[kv_idx])
    def dense_to_ordered(dense):
        num_blocks = dense.sum(dim=-1, dtype=torch.int32)
        indices = dense.argsort(dim=-1, descending=False, stable=True).flip(-1).to(torch.int32)
        return num_blocks[None, None].contiguous(), indices[None, None].contiguous()
    n = len(idx) // BLOCK_SIZE
    bi = torch.arange(n, dtype=torch.int32, device="cuda")
    lo = docs.view(-1, BLOCK_SIZE)[:, 0].contiguous()
    hi = docs.view(-1, BLOCK_SIZE)[:, -1].contiguous()
    any_bm = (bi[:, None] >= bi) & (lo[:, None] <= hi) & (hi[:, None] >= lo)
    all_bm = (bi[:, None] > bi) & (lo[:, None] == hi) & (hi[:, None] == lo)
    p_num, p_idx = dense_to_ordered(any_bm & ~all_bm)
    f_num, f_idx = dense_to_ordered(all_bm)
    def build_bm(window_size_blocks: Tensor) -> BlockMask:
        return BlockMask.from_kv_blocks(
            torch.clamp_max(p_num, torch.clamp_min(window_size_blocks - f_num, 1)),
            p_idx,
            torch.clamp_max(f_num, window_size_blocks - 1),
            f_idx,
            BLOCK_SIZE=BLOCK_SIZE,
            mask_mod=document_causal,
        )
    return build_bm(window_blocks)
'''

_ERA_BLOCKS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention
''' + _BLOCK_LISTS + _MODEL.replace("BUILD_MASK", "make_mask(idx, window_blocks)").replace(
    "ATTENTION_CALL", "flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
                      "block_mask=block_mask, scale=0.12).transpose(1, 2)").replace("KV_HEADS", "4")

_ERA_GQA_ALIAS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
import torch.nn.attention.flex_attention as fa
BlockMask = fa.BlockMask
''' + _BLOCK_LISTS + _MODEL.replace("BUILD_MASK", "make_mask(idx, window_blocks)").replace(
    "ATTENTION_CALL", "fa.flex_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "
                      "block_mask=block_mask, enable_gqa=True).transpose(1, 2)").replace("KV_HEADS", "2")

_ERA_DOTTED = _ERA_GQA_ALIAS.replace("import torch.nn.attention.flex_attention as fa\n",
                                     "import torch.nn.attention.flex_attention\n").replace(
    "fa.", "torch.nn.attention.flex_attention.")

_SCORE_MOD = '''
import torch
from torch.nn.attention.flex_attention import flex_attention, create_block_mask

def softcap(score, b, h, q_idx, kv_idx):
    return 30 * torch.tanh(score / 30)

def attend(q, k, v, bm):
    return flex_attention(q, k, v, softcap, block_mask=bm)
'''


def _exec(files: dict[str, str], tmp_path, shim_names=("_tb_flex_attention",)) -> dict:
    """Run train_gpt.py in-process with the program's folder on sys.path (as `python train_gpt.py` would)."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        ns = {"__name__": "__main__"}
        exec(compile(files["train_gpt.py"], str(tmp_path / "train_gpt.py"), "exec"), ns)
        return ns
    finally:
        sys.path.remove(str(tmp_path))
        for name in shim_names:
            sys.modules.pop(name, None)


def _ported(source: str, target: str):
    """The naive port, then this feature's port: the order `port_program` runs them in."""
    naive = port_naive({"train_gpt.py": source}, target)
    return feature.port(naive.files, target)


@pytest.mark.parametrize("source", [_ERA_CREATE, _ERA_BLOCKS, _ERA_GQA_ALIAS, _ERA_DOTTED],
                         ids=["create_block_mask", "from_kv_blocks", "alias_gqa", "dotted"])
def test_ported_program_runs_on_cpu(source, tmp_path):
    res = _ported(source, "cpu")
    assert not res.blockers
    prog = res.files["train_gpt.py"]
    assert "_tb_flex_attention" in prog and "_tb_flex_attention.py" in res.files
    kinds = [c.kind for c in res.changes]
    assert kinds.count("shim_added") == 1 and "attention_replaced" in kinds
    assert 'BACKEND = "sdpa"' in res.files["_tb_flex_attention.py"]
    ns = _exec(res.files, tmp_path)
    assert len(ns["losses"]) == 3 and all(math.isfinite(x) for x in ns["losses"])


def test_changes_name_each_edit_of_the_create_block_mask_era():
    res = feature.port({"train_gpt.py": _ERA_CREATE}, "cpu")  # before the naive port: every form still there
    lines = _ERA_CREATE.splitlines()
    by_kind = {}
    for c in res.changes:
        by_kind.setdefault(c.kind, []).append(c)
    (imp,) = by_kind["attention_replaced"]
    assert "torch.nn.attention.flex_attention" in lines[imp.line - 1]
    assert imp.after == "from _tb_flex_attention import flex_attention, create_block_mask"
    compiles = by_kind["compile_removed"]
    assert len(compiles) == 3  # two torch.compile wrappers and one _compile=True
    assert {c.after for c in compiles[:2]} == {"flex_attention", "create_block_mask"}
    assert "_compile" in lines[compiles[2].line - 1] and "_compile" not in compiles[2].after
    assert compiles[2].after.endswith('device="cuda")')
    assert [c.file for c in by_kind["shim_added"]] == ["_tb_flex_attention.py"]
    compile(res.files["train_gpt.py"], "train_gpt.py", "exec")


def test_port_program_runs_this_porter():
    whole = port_program({"train_gpt.py": _ERA_CREATE}, "cpu")
    assert whole.files["train_gpt.py"] == _ported(_ERA_CREATE, "cpu").files["train_gpt.py"]
    assert whole.files["_tb_flex_attention.py"] == _ported(_ERA_CREATE, "cpu").files["_tb_flex_attention.py"]
    assert not whole.blockers


def test_feature_port_before_naive_port_gives_the_same_program(tmp_path):
    first = feature.port({"train_gpt.py": _ERA_BLOCKS}, "cpu")
    both = port_naive(first.files, "cpu")
    assert both.files["_tb_flex_attention.py"] == first.files["_tb_flex_attention.py"]  # the naive port leaves it
    assert both.files["train_gpt.py"] == _ported(_ERA_BLOCKS, "cpu").files["train_gpt.py"]
    ns = _exec(both.files, tmp_path)
    assert all(math.isfinite(x) for x in ns["losses"])


def test_ported_program_dry_runs_on_npu(tmp_path, monkeypatch):
    res = _ported(_ERA_BLOCKS, "npu")
    assert 'BACKEND = "npu_fusion_attention"' in res.files["_tb_flex_attention.py"]
    dry = {n: fake.npu_to_cpu_for_dry_run(t) for n, t in res.files.items()}
    assert 'BACKEND = "npu_fusion_attention"' in dry["_tb_flex_attention.py"]  # survives the dry-run rewrite
    calls = []
    with fake.installed() as tnpu:
        real = tnpu.npu_fusion_attention
        monkeypatch.setattr(tnpu, "npu_fusion_attention", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
        ns = _exec(dry, tmp_path)
    assert calls and set(calls) == {"BNSD"} and all(math.isfinite(x) for x in ns["losses"])


def test_score_mod_is_a_blocker_not_an_exception():
    res = feature.port({"train_gpt.py": _SCORE_MOD}, "cpu")
    (blocker,) = res.blockers
    assert "score_mod=softcap" in blocker.construct and blocker.file == "train_gpt.py"
    assert "flex_attention(q, k, v, softcap" in _SCORE_MOD.splitlines()[blocker.line - 1]


def test_unsupported_import_name_is_a_blocker():
    src = "from torch.nn.attention.flex_attention import flex_attention, FlexKernelOptions\n"
    res = feature.port({"train_gpt.py": src}, "cpu")
    assert res.blockers and "FlexKernelOptions" in res.blockers[0].construct and res.blockers[0].line == 1
    assert res.files["train_gpt.py"] == src


def test_cuda_target_and_programs_without_flex_are_unchanged():
    files = {"train_gpt.py": _ERA_CREATE, "notes.txt": "x"}
    assert feature.port(files, "cuda").files == files and not feature.port(files, "cuda").changes
    plain = {"train_gpt.py": "import torch\nx = torch.ones(2)\n"}
    res = feature.port(plain, "cpu")
    assert res.files == plain and not res.changes and not res.blockers


def test_shim_runs_standalone_beside_the_program(tmp_path):
    """The copied shim needs torch only: run a ported program as a script in a fresh interpreter."""
    res = _ported(_ERA_CREATE, "cpu")
    assert "trainbridge" not in res.files["_tb_flex_attention.py"].split('"""', 2)[2]
    for name, text in res.files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "train_gpt.py").write_text(res.files["train_gpt.py"] + "\nprint('LOSSES', losses)\n")
    out = subprocess.run([sys.executable, "-W", "ignore", "train_gpt.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LOSSES" in out.stdout
