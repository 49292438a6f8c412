"""sdpa_attention: sites on nanogpt and other attention idioms, mask kinds, same math, the npu
variant (npu_fusion_attention), clear refusals."""

import textwrap

import pytest
import torch

from trainbridge.agent.rewriters.recipes import RECIPES, NotApplicable

from tests.kits import recipe_testkit as kit
from tests.kits.recipe_testkit import applied as _apply
from tests.kits.recipe_testkit import exec_ns as _ns
from tests.kits.recipe_testkit import needs_nanogpt
from tests.kits.recipe_testkit import output_and_grads as _run

torch.manual_seed(0)

IDIOMS = kit.read("idioms_gpt.py")
NANO = kit.nanogpt_source()


ATTENTION_IDIOMS = {
    "operator_matmul_masked_fill_buffer": """
        import math, torch
        def attn(q, k, v, mask):
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            y = att @ v
            return y
    """,
    "torch_matmul_divide_tril_chained_output": """
        import torch
        import torch.nn.functional as F
        def attn(q, k, v, mask):
            scores = torch.matmul(q, k.transpose(-1, -2)) / (k.size(-1) ** 0.5)
            scores = scores.masked_fill(~mask, float("-inf"))
            probs = F.softmax(scores, dim=-1)
            return_value = torch.matmul(probs, v).transpose(1, 2)
            return return_value
    """,
}


@pytest.mark.parametrize("idiom", ATTENTION_IDIOMS)
def test_attention_recipe_on_idioms(idiom):
    src = textwrap.dedent(ATTENTION_IDIOMS[idiom])
    out = RECIPES["sdpa_attention"].apply({"p.py": src}, "cpu")
    assert not isinstance(out, NotApplicable), out
    new = out.files["p.py"]
    assert "scaled_dot_product_attention" in new and "softmax" not in new
    a, b = _ns(src), _ns(new)
    q, k, v = (torch.randn(2, 3, 8, 4, requires_grad=True) for _ in range(3))
    T = 8
    triu = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    mask = triu if "buffer" in idiom else ~triu  # second idiom masks where the tril mask is False
    ya, yb = a["attn"](q, k, v, mask), b["attn"](q, k, v, mask)
    torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)


def test_dropout_through_a_function_argument_is_not_rewritten():
    src = textwrap.dedent("""
        import torch
        def attn(q, k, v, mask, drop):
            att = (q @ k.transpose(-2, -1)) * 0.5
            att = att.masked_fill(mask, float("-inf"))
            att = att.softmax(dim=-1)
            att = drop(att)
            y = att @ v
            return y
    """)
    out = RECIPES["sdpa_attention"].apply({"p.py": src}, "cpu")
    assert isinstance(out, NotApplicable) and "drop(att): a module not set on self" in out.reason


ATTENTION_DROPOUT = {  # the dropout forms real programs use on the attention weights
    "module": ("self.attn_dropout = nn.Dropout(p)", "att = self.attn_dropout(att)"),
    "functional": ("self.p = p", "att = F.dropout(att, p=self.p, training=self.training)"),
    "functional_positional": ("self.p = p", "att = nn.functional.dropout(att, self.p, self.training)"),
}
ATTENTION_DROPOUT_PROGRAM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, p):
        super().__init__()
        {init}

    def forward(self, q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
        att = F.softmax(att, dim=-1)
        {drop}
        return att @ v
"""


@pytest.mark.parametrize("form", ATTENTION_DROPOUT)
def test_dropout_on_the_attention_weights_moves_inside_the_fused_call(form):
    init, drop = ATTENTION_DROPOUT[form]
    src = ATTENTION_DROPOUT_PROGRAM.format(init=init, drop=drop)
    new, out = _apply("sdpa_attention", src, "cpu")
    assert "softmax" not in new and "dropout(" not in new.split("def forward")[1].split("scaled_dot")[0]
    assert "dropout_p=(self.attn_dropout.p if self.attn_dropout.training else 0.0)" in new if form == "module" \
        else "dropout_p=(self.p if self.training else 0.0)" in new
    assert any("moves inside the fused call" in n and "math path on the CPU" in n for n in out.notes), out.notes
    a, b = kit.load(src), kit.load(new)
    q, k, v = _qkv(T=16)
    for p, train in ((0.0, True), (0.3, False), (0.3, True)):
        ma, mb = a["Attn"](p), b["Attn"](p)
        ma.train(train), mb.train(train)
        torch.manual_seed(7)
        ya = ma(q, k, v)
        torch.manual_seed(7)
        yb = mb(q, k, v)
        # on the CPU a dropout_p > 0 takes SDPA's math path, which draws eager's mask: equal in training too
        torch.testing.assert_close(yb, ya, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ya, ma.eval()(q, k, v))  # the dropout did drop something


def test_dropout_on_the_attention_weights_is_refused_with_reasons_it_cannot_say():
    drop_path = ATTENTION_DROPOUT_PROGRAM.format(init="self.drop = DropPath(p)", drop="att = self.drop(att)")
    out = RECIPES["sdpa_attention"].apply({"p.py": drop_path}, "cpu")
    assert isinstance(out, NotApplicable) and "self.drop is not set to nn.Dropout(...)" in out.reason
    module = ATTENTION_DROPOUT_PROGRAM.format(init=ATTENTION_DROPOUT["module"][0], drop=ATTENTION_DROPOUT["module"][1])
    out = RECIPES["sdpa_attention"].apply({"p.py": module}, "npu")
    assert isinstance(out, NotApplicable) and "keep_prob is not written here" in out.reason


def _qkv(B=2, H=2, T=8, D=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(B, H, T, D, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


def test_attention_sites_and_mask_kinds_on_other_idioms():
    new, out = _apply("sdpa_attention", IDIOMS, "cpu")
    kinds = {s.qualname: s.detail["mask"] for s in out.sites}
    assert kinds["Attn.forward"] == "tril(ones) == 0"  # registered tril buffer, sliced [:, :, :T, :T]
    assert kinds["attn_additive"].startswith("triu(full(-inf)")
    assert kinds["attn_padded"].startswith("explicit bool")  # not causal: passed as an explicit mask
    assert kinds["AttnDrop.forward"].startswith("triu(ones")  # dropout between softmax and @ v: moved inside
    assert "is_causal=True" in new and "attn_mask=~pad[:, None, None, :]" in new
    assert "softmax(" not in new and "dropout_p=(self.drop.p if self.drop.training else 0.0)" in new


@pytest.mark.parametrize("fn", ["attn_additive", "attn_padded", "Attn"])
def test_attention_rewrites_compute_the_same(fn):
    new, _ = _apply("sdpa_attention", IDIOMS, "cpu")
    a, b = kit.load(IDIOMS), kit.load(new)
    q, k, v = _qkv()
    if fn == "Attn":
        torch.manual_seed(0); ma = a["Attn"]()
        torch.manual_seed(0); mb = b["Attn"]()
        x = torch.randn(2, 8, 32, requires_grad=True)
        kit.assert_close_and_aligned(_run(ma, x), _run(mb, x))
        return
    args = (q, k, v) if fn == "attn_additive" else (q, k, v, torch.tensor([[False] * 6 + [True] * 2, [False] * 8]))
    kit.assert_close_and_aligned(_run(a[fn], *args), _run(b[fn], *args))


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_attention_npu_variant_uses_the_compressed_causal_mask(npu):
    new, out = _apply("sdpa_attention", IDIOMS, "npu")
    assert 'sparse_mode=2' in new and "_tb_npu_causal_mask(q.device)" in new and "sparse_mode=0" in new
    a = kit.load(IDIOMS)
    q, k, v = _qkv()
    pad = torch.tensor([[False] * 6 + [True] * 2, [False] * 8])
    with kit.fake_npu(npu):
        b = kit.load(new)
        kit.assert_close_and_aligned(_run(a["attn_additive"], q, k, v), _run(b["attn_additive"], q, k, v))
        kit.assert_close_and_aligned(_run(a["attn_padded"], q, k, v, pad), _run(b["attn_padded"], q, k, v, pad))
        mask = b["_tb_npu_causal_mask"](q.device)
        assert mask.shape == (2048, 2048) and mask.dtype == torch.bool and mask[0, 1] and not mask[1, 0]


@needs_nanogpt
@pytest.mark.parametrize("target", ["cpu", "npu"])
def test_attention_on_nanogpt_whole_model(target):
    new, out = _apply("sdpa_attention", NANO, target, "train_gpt.py")
    assert len(out.sites) == 1 and out.sites[0].qualname == "CausalSelfAttention.forward"
    if target == "cpu":
        assert "is_causal=True" in new
    la, ga = kit.nanogpt_loss_and_grads(NANO)
    lb, gb = kit.nanogpt_loss_and_grads(new, npu="standin" if target == "npu" else None)
    kit.assert_close_and_aligned([la, *ga], [lb, *gb], atol=2e-5, rtol=2e-4)


def test_attention_not_applicable_reasons():
    drop = ("import torch\ndef f(q, k, v, drop):\n    s = (q @ k.transpose(-2, -1)) * 0.5\n"
            "    T = q.size(-2)\n    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf'))\n"
            "    return drop(s.softmax(-1)) @ v\n")
    out = RECIPES["sdpa_attention"].apply({"p.py": drop}, "cpu")
    assert isinstance(out, NotApplicable) and "dropout call drop(" in out.reason
    zero_fill = ("import torch\ndef f(q, k, v, m):\n    s = (q @ k.transpose(-2, -1)) * 0.5\n"
                 "    s = s.masked_fill(m, 0.0)\n    return s.softmax(-1) @ v\n")
    out = RECIPES["sdpa_attention"].apply({"p.py": zero_fill}, "cpu")
    assert isinstance(out, NotApplicable) and "not -inf" in out.reason
    kept = ("import torch\ndef f(q, k, v):\n    s = (q @ k.transpose(-2, -1)) * 0.5\n    T = q.size(-2)\n"
            "    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf'))\n"
            "    p = s.softmax(-1)\n    return p @ v, p\n")  # the weights are returned too
    out = RECIPES["sdpa_attention"].apply({"p.py": kept}, "cpu")
    assert isinstance(out, NotApplicable) and "also used elsewhere" in out.reason
    out = RECIPES["sdpa_attention"].apply({"p.py": kit.read("plain_mlp.py")}, "cpu")
    assert isinstance(out, NotApplicable) and "no hand-written" in out.reason


CLIP_STYLE = """import torch
import torch.nn.functional as F


def attn_optional(q, k, v, scale, mask=None):
    att = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        att = att + mask
    att = att.softmax(dim=-1)
    return att @ v


def attn_full(q, k, v):
    s = q @ k.transpose(-2, -1) / q.size(-1) ** 0.5
    return torch.softmax(s, dim=-1) @ v


def attn_optional_scores_kept(q, k, v, mask=None):
    att = q @ k.transpose(-2, -1)
    if mask is not None:
        att = att + mask
    raw = att
    att = att.softmax(dim=-1)
    return att @ v, raw
"""


def test_attention_optional_additive_mask_and_full_attention_compute_the_same():
    """A CLIP/ViT tower: `if mask is not None: att = att + mask`, and attention with no mask."""
    new, out = _apply("sdpa_attention", CLIP_STYLE, "cpu")
    kinds = {s.qualname: s.detail["mask"] for s in out.sites}
    assert kinds == {"attn_optional": "explicit optional additive: mask", "attn_full": "none (full attention)"}
    assert "if mask is not None" in new.split("def attn_optional_scores_kept")[1]  # the kept scores stay eager
    assert "if mask is not None" not in new.split("def attn_full")[0]  # the optional `if` is gone
    assert "attn_mask=mask" in new and "is_causal" not in new
    a, b = kit.load(CLIP_STYLE), kit.load(new)
    q, k, v = _qkv()
    causal = torch.full((8, 8), float("-inf")).triu(1)
    for mask in (None, causal):
        kit.assert_close_and_aligned(_run(a["attn_optional"], q, k, v, 0.3, mask),
                                     _run(b["attn_optional"], q, k, v, 0.3, mask))
    kit.assert_close_and_aligned(_run(a["attn_full"], q, k, v), _run(b["attn_full"], q, k, v))


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_attention_full_on_npu_and_additive_mask_refused(npu):
    new, out = _apply("sdpa_attention", CLIP_STYLE, "npu")
    assert [s.qualname for s in out.sites] == ["attn_full"]
    assert 'npu_fusion_attention(q, k, v, q.size(1), "BNSD", scale=' in new and "atten_mask" not in new
    a = kit.load(CLIP_STYLE)
    q, k, v = _qkv()
    with kit.fake_npu(npu):
        b = kit.load(new)
        kit.assert_close_and_aligned(_run(a["attn_full"], q, k, v), _run(b["attn_full"], q, k, v))
    only_optional = CLIP_STYLE.split("def attn_full")[0]
    refused = RECIPES["sdpa_attention"].apply({"p.py": only_optional}, "npu")
    assert isinstance(refused, NotApplicable) and "bool masks only" in refused.reason


BMM_STYLE = """import math
import torch


def attn_baddbmm(q, k, v):
    T = q.size(1)
    s = torch.baddbmm(torch.empty(q.size(0), T, T, dtype=q.dtype), q, k.transpose(1, 2), beta=0,
                      alpha=1 / math.sqrt(q.size(-1)))
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), float("-inf"))
    return torch.bmm(torch.softmax(s, dim=-1), v)


def attn_bmm_divided(q, k, v):
    s = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.size(-1))
    return torch.bmm(s.softmax(-1), v)


def attn_baddbmm_adds_its_input(q, k, v, bias):
    s = torch.baddbmm(bias, q, k.transpose(1, 2))
    return torch.bmm(s.softmax(-1), v)
"""


def _qkv3(BH=4, T=8, D=16):
    g = torch.Generator().manual_seed(5)
    return [torch.randn(BH, T, D, generator=g).requires_grad_() for _ in range(3)]


def test_bmm_and_baddbmm_attention_over_3d_operands_compute_the_same():
    """Attention written with torch.baddbmm (beta=0, alpha = the scale; its first argument an
    uninitialised torch.empty that beta=0 ignores) and torch.bmm, over (batch x heads, T, D)."""
    new, out = _apply("sdpa_attention", BMM_STYLE, "cpu")
    kinds = {s.qualname: s.detail for s in out.sites}
    assert set(kinds) == {"attn_baddbmm", "attn_bmm_divided"}, kinds
    assert kinds["attn_baddbmm"]["mask"] == "triu(ones, diagonal=1)" and "is_causal=True" in new
    assert new.count("q.unsqueeze(0)") == 2 and new.count(".squeeze(0)") == 2  # 4-D: the fused cpu kernel
    assert "baddbmm(torch.empty" not in new  # the scores statement went with the softmax
    assert "baddbmm(bias" in new  # beta=1 adds `bias`: left alone
    a, b = kit.load(BMM_STYLE), kit.load(new)
    q, k, v = _qkv3()
    for fn in ("attn_baddbmm", "attn_bmm_divided"):
        kit.assert_close_and_aligned(_run(a[fn], q, k, v), _run(b[fn], q, k, v))


def test_baddbmm_that_adds_its_input_is_explained_not_rewritten():
    misses = RECIPES["sdpa_attention"].explain({"p.py": BMM_STYLE}, "cpu")
    assert any("attn_baddbmm_adds_its_input" in m and "beta=1" in m for m in misses), misses


@pytest.mark.parametrize("npu", kit.NPU_KINDS)
def test_bmm_attention_on_npu_runs_as_bnsd_with_a_batch_of_one(npu):
    new, out = _apply("sdpa_attention", BMM_STYLE, "npu")
    assert "q.unsqueeze(0)" in new and ".squeeze(0)" in new and "sparse_mode=2" in new
    a = kit.load(BMM_STYLE)
    q, k, v = _qkv3()
    with kit.fake_npu(npu):
        b = kit.load(new)
        for fn in ("attn_baddbmm", "attn_bmm_divided"):
            kit.assert_close_and_aligned(_run(a[fn], q, k, v), _run(b[fn], q, k, v))


# Forms from other house styles: einsum products, a model-hub `torch.where(keep, scores, min)`
# over a bottom-aligned slice of a registered tril buffer, and a padding mask passed through.
HUB_STYLE = """import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def attn_einsum(q, k, v):
    T = q.size(-2)
    sim = torch.einsum("bhid,bhjd->bhij", q, k) * q.size(-1) ** -0.5
    sim = sim + torch.full((T, T), float("-inf")).triu(1)
    return torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)


def attn_einsum_3d(q, k, v):
    q, k, v = (t.flatten(0, 1) for t in (q, k, v))
    s = torch.einsum("bid,bjd->bij", q, k) / math.sqrt(q.size(-1))
    return torch.einsum("bij,bjd->bid", F.softmax(s, dim=-1), v)


class HubAttention(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))

    def forward(self, query, key, value):
        w = torch.matmul(query, key.transpose(-1, -2))
        w = w / math.sqrt(value.size(-1))
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length:key_length, :key_length]
        mask_value = torch.finfo(w.dtype).min
        mask_value = torch.full([], mask_value, dtype=w.dtype, device=w.device)
        w = torch.where(causal_mask, w, mask_value)
        w = nn.functional.softmax(w, dim=-1)
        return torch.matmul(w, value)


def attn_where_padding(q, k, v, keep):
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = torch.where(keep, s, float("-inf"))
    return s.softmax(-1) @ v


def attn_where_zero_fill(q, k, v, keep):
    s = q @ k.transpose(-2, -1)
    s = torch.where(keep, s, 0.0)
    return s.softmax(-1) @ v
"""


def test_einsum_and_where_masked_attention_compute_the_same():
    new, out = _apply("sdpa_attention", HUB_STYLE, "cpu")
    kinds = {s.qualname: s.detail["mask"] for s in out.sites}
    assert kinds == {"attn_einsum": "triu(full(-inf), diagonal=1) added", "attn_einsum_3d": "none (full attention)",
                     "HubAttention.forward": "tril(ones) kept by torch.where",
                     "attn_where_padding": "explicit keep: keep"}, kinds
    assert "torch.einsum" not in new  # both products of both einsum forms went
    assert "attn_mask=keep" in new  # the kept positions, as SDPA's bool mask means them
    # the scores, the dtype's minimum and the mask statements all went with the softmax
    assert "torch.where(causal_mask" not in new and "finfo" not in new and "mask_value" not in new
    notes = " ".join(out.notes)
    assert "query and key lengths are equal" in notes, notes
    a, b = kit.load(HUB_STYLE), kit.load(new)
    q, k, v = _qkv()
    for fn in ("attn_einsum", "attn_einsum_3d"):
        kit.assert_close_and_aligned(_run(a[fn], q, k, v), _run(b[fn], q, k, v))
    ha, hb = a["HubAttention"](8), b["HubAttention"](8)
    kit.assert_close_and_aligned(_run(ha, q, k, v), _run(hb, q, k, v))
    keep = torch.rand(8, 8, generator=torch.Generator().manual_seed(2)) > 0.3
    keep |= torch.eye(8, dtype=torch.bool)  # no row without a kept position
    kit.assert_close_and_aligned(_run(a["attn_where_padding"], q, k, v, keep),
                                 _run(b["attn_where_padding"], q, k, v, keep))


def test_where_filled_with_a_finite_value_is_explained_not_rewritten():
    misses = RECIPES["sdpa_attention"].explain({"p.py": HUB_STYLE}, "cpu")
    assert any("attn_where_zero_fill" in m and "not -inf" in m for m in misses), misses


def test_a_bottom_aligned_mask_slice_is_said_in_the_notes_for_every_mask_form():
    """`mask[..., K - Q:K, :K]` is the causal mask only when query and key lengths are equal
    (training): accepted for a masked_fill mask too, and the assumption written in the notes."""
    src = """import torch


def attn(q, k, v):
    Q, K = q.size(-2), k.size(-2)
    mask = torch.tril(torch.ones(K, K)).view(1, 1, K, K)
    s = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
    s = s.masked_fill(mask[:, :, K - Q:K, :K] == 0, float("-inf"))
    return s.softmax(-1) @ v
"""
    new, out = _apply("sdpa_attention", src, "cpu")
    assert "is_causal=True" in new and any("query and key lengths are equal" in n for n in out.notes), out.notes
    a, b = kit.load(src), kit.load(new)
    q, k, v = _qkv()
    kit.assert_close_and_aligned(_run(a["attn"], q, k, v), _run(b["attn"], q, k, v))


# einsum attention over a (batch, T, heads, D) layout: heads third, as projections come out of a
# Linear before any transpose (found by the graph matcher in tests/fixtures/evidence/house_styles.py;
# the recipe knew only heads-second einsums)
HEADS_THIRD = """import torch


def attn_heads_third(q, k, v):
    T = q.size(1)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.size(-1) ** -0.5
    s = s + torch.full((T, T), float("-inf")).triu(1)
    p = s.float().softmax(-1).type_as(s)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def attn_heads_third_padding(q, k, v, keep):
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.size(-1) ** 0.5
    s = torch.where(keep, s, float("-inf"))
    return torch.einsum("bhqk,bkhd->bhqd", s.softmax(-1), v)


def attn_mixed_layouts(q, k, v):
    s = torch.einsum("bqhd,bkhd->bhqk", q, k)
    return s.softmax(-1) @ v
"""


def test_einsum_attention_with_heads_third_is_permuted_into_sdpa_and_back():
    new, out = _apply("sdpa_attention", HEADS_THIRD, "cpu")
    kinds = {s.qualname: s.detail["mask"] for s in out.sites}
    assert kinds == {"attn_heads_third": "triu(full(-inf), diagonal=1) added",
                     "attn_heads_third_padding": "explicit keep: keep"}, kinds
    assert "q.permute(0, 2, 1, 3)" in new and "v.permute(0, 2, 1, 3)" in new
    assert new.count("torch.einsum") == 1  # only attn_mixed_layouts' product is left
    assert any("another layout" in n for n in out.notes)
    a, b = kit.load(HEADS_THIRD), kit.load(new)
    q, k, v = (t.transpose(1, 2).contiguous().requires_grad_() for t in _qkv())  # (B, T, H, D)
    kit.assert_close_and_aligned(_run(a["attn_heads_third"], q, k, v), _run(b["attn_heads_third"], q, k, v))
    keep = torch.rand(8, 8, generator=torch.Generator().manual_seed(3)) > 0.3
    keep |= torch.eye(8, dtype=torch.bool)
    kit.assert_close_and_aligned(_run(a["attn_heads_third_padding"], q, k, v, keep),
                                 _run(b["attn_heads_third_padding"], q, k, v, keep))
    # a heads-third product followed by a plain `@` (shapes that do not line up as SDPA's): left alone
    assert "attn_mixed_layouts" not in kinds
