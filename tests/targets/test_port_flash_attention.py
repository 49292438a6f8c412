"""FlashAttention-3 port: the varlen shim against a float64 reference, its npu branch, and the porter.

The reference is written here: for each document of the packed sequence, a float64 masked
softmax with FA3's rules (causal, window [i - left, i + right] inclusive, positions aligned at
the bottom right when query and key lengths differ, zero output for a row with no key).
cu_seqlens are random and shaped like the records' loaders make them: a leading 0, cumulative
ends, empty documents, and the last value repeated to a fixed length.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from trainbridge.npu_reference import fake_torch_npu as fake
from trainbridge.targets.features import flash_attention as feature
from trainbridge.targets.port_source import port_naive, port_program
from trainbridge.targets.shims import flash_attention as shim

TOL = {torch.float32: (3e-5, 3e-5), torch.bfloat16: (2e-2, 2e-2)}
GRAD_TOL = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (6e-2, 6e-2)}


def _cu_seqlens(total: int, n_docs: int, pad_to: int, seed: int) -> torch.Tensor:
    """[0, ends..., total, total, ...] (int32, length pad_to), with an empty document in the middle."""
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=g)[: n_docs - 1].add(1).tolist())
    ends = [0, *cuts[: len(cuts) // 2], *cuts[len(cuts) // 2 - 1: len(cuts) // 2], *cuts[len(cuts) // 2:], total]
    ends += [total] * (pad_to - len(ends))
    return torch.tensor(ends, dtype=torch.int32)


def _reference(q, k, v, cu_q, cu_k, scale, causal, left, right):
    """Float64 FA3 semantics, document by document (module doc); (out, lse)."""
    right = 0 if causal else right
    out = torch.zeros(q.size(0), q.size(1), v.size(-1), dtype=torch.float64)
    lse = torch.full((q.size(1), q.size(0)), -math.inf, dtype=torch.float64)
    rep = q.size(1) // k.size(1)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for qs, qe, ks, ke in zip(cq, cq[1:], ck, ck[1:]):
        if qe == qs or ke == ks:
            continue
        lq, lk = qe - qs, ke - ks
        i = torch.arange(lq).view(-1, 1) + (lk - lq)
        j = torch.arange(lk).view(1, -1)
        visible = torch.ones(lq, lk, dtype=torch.bool)
        if right >= 0:
            visible &= j <= i + right
        if left >= 0:
            visible &= j >= i - left
        kk = k[ks:ke].double().repeat_interleave(rep, dim=1)
        vv = v[ks:ke].double().repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[qs:qe].double(), kk) * scale
        s = s.masked_fill(~visible, -math.inf)
        p = torch.nan_to_num(torch.softmax(s, dim=-1), nan=0.0)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", p, vv)
        lse[:, qs:qe] = torch.logsumexp(s, dim=-1)
    return out, lse


def _qkv(total, h, d, dtype, seed, h_kv=None, total_k=None):
    g = torch.Generator().manual_seed(seed)
    tk = total_k or total
    return (torch.randn(total, h, d, generator=g).to(dtype), torch.randn(tk, h_kv or h, d, generator=g).to(dtype),
            torch.randn(tk, h_kv or h, d, generator=g).to(dtype))


def _check(dtype, q, k, v, cu_q, cu_k, *, scale, causal, window, path="auto", monkeypatch=None, **kw):
    """Forward and backward of the shim against the float64 reference."""
    dense_calls = []
    if path != "auto":  # a huge per-call cost makes one block-diagonal SDPA cheaper, zero makes the loop cheaper
        monkeypatch.setattr(shim, "_CALL_COST_SCORES", 10 ** 12 if path == "dense" else 0)
        real = shim._block_diagonal
        monkeypatch.setattr(shim, "_block_diagonal", lambda *a: dense_calls.append(1) or real(*a))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = shim.flash_attn_varlen_func(*leaves, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=512,
                                      max_seqlen_k=512, causal=causal, softmax_scale=scale, window_size=window, **kw)
    if path != "auto":
        assert bool(dense_calls) == (path == "dense")
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == (q.size(0), q.size(1), v.size(-1))
    assert out.is_contiguous(), "FA3 returns a contiguous (total, heads, dim): record 85 `.view()`s it"
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _ = _reference(*leaves64, cu_q, cu_k, scale, causal, *window)
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    out.backward(dout)
    ref.backward(dout.double())
    atol, rtol = GRAD_TOL[dtype]
    for a, b in zip(leaves, leaves64):
        assert a.grad.isfinite().all()
        torch.testing.assert_close(a.grad.double(), b.grad, atol=atol, rtol=rtol)


# ------------------------------------------------------------------------ shim ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [(-1, 0), (0, 0), (37, 0), (128, 0), (10_000, 0)])
@pytest.mark.parametrize("path", ["per_document", "dense"])
def test_causal_windows_match_float64(dtype, window, path, monkeypatch):
    total = 640
    cu = _cu_seqlens(total, 6, pad_to=12, seed=hash(window) % 1000)
    q, k, v = _qkv(total, 3, 32, dtype, seed=1)
    _check(dtype, q, k, v, cu, cu, scale=0.12, causal=True, window=window, path=path, monkeypatch=monkeypatch)


@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (False, (20, 5)), (True, (20, 7))])
def test_non_causal_and_right_windows(causal, window, monkeypatch):
    total = 400
    cu = _cu_seqlens(total, 4, pad_to=8, seed=4)
    q, k, v = _qkv(total, 2, 16, torch.float32, seed=2)
    for path in ("per_document", "dense"):
        _check(torch.float32, q, k, v, cu, cu, scale=0.2, causal=causal, window=window, path=path,
               monkeypatch=monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gqa_and_default_scale(dtype, monkeypatch):
    total = 384
    cu = _cu_seqlens(total, 3, pad_to=6, seed=5)
    q, k, v = _qkv(total, 6, 64, dtype, seed=3, h_kv=2)
    _check(dtype, q, k, v, cu, cu, scale=64 ** -0.5, causal=True, window=(100, 0))
    out = shim.flash_attn_varlen_func(q, k, v, cu, cu, 384, 384, causal=True)
    ref, _ = _reference(q, k, v, cu, cu, 64 ** -0.5, True, -1, 0)
    torch.testing.assert_close(out.double(), ref, atol=TOL[dtype][0], rtol=TOL[dtype][1])


def test_bottom_right_alignment_and_rows_without_keys():
    """Queries longer than keys in a document: the first rows see nothing and return zeros, as in FA3."""
    cu_q = torch.tensor([0, 50, 80, 200], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 90, 150], dtype=torch.int32)
    q, k, v = _qkv(200, 2, 16, torch.float32, seed=6, total_k=150)
    _check(torch.float32, q, k, v, cu_q, cu_k, scale=0.25, causal=True, window=(-1, -1))
    _check(torch.float32, q, k, v, cu_q, cu_k, scale=0.25, causal=False, window=(10, 3))
    out = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 60, causal=True)
    assert torch.equal(out[:20], torch.zeros_like(out[:20]))  # doc 0: 50 queries, 30 keys


def test_tokens_outside_the_documents_are_zero():
    cu = torch.tensor([10, 60, 100], dtype=torch.int32)
    q, k, v = _qkv(128, 2, 16, torch.float32, seed=7)
    out = shim.flash_attn_varlen_func(q, k, v, cu, cu, 50, 50, causal=True)
    assert torch.equal(out[:10], torch.zeros_like(out[:10])) and torch.equal(out[100:], torch.zeros_like(out[100:]))
    torch.testing.assert_close(out.double(), _reference(q, k, v, cu, cu, 0.25, True, -1, 0)[0], atol=3e-5, rtol=3e-5)


def test_return_attn_probs_gives_out_and_lse():
    total = 300
    cu = _cu_seqlens(total, 4, pad_to=7, seed=8)
    q, k, v = _qkv(total, 2, 16, torch.float32, seed=8)
    out, lse = shim.flash_attn_varlen_func(q, k, v, cu, cu, 300, 300, causal=True, softmax_scale=0.3,
                                           window_size=(40, 0), return_attn_probs=True)
    ref, ref_lse = _reference(q, k, v, cu, cu, 0.3, True, 40, 0)
    assert lse.dtype == torch.float32 and lse.shape == (2, total)
    torch.testing.assert_close(out.double(), ref, atol=3e-5, rtol=3e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=3e-5, rtol=3e-5)


def test_window_keyword_spelling_and_tensor_bounds():
    total = 256
    cu = _cu_seqlens(total, 3, pad_to=5, seed=9)
    q, k, v = _qkv(total, 2, 16, torch.float32, seed=9)
    a = shim.flash_attn_varlen_func(q, k, v, cu, cu, 256, 256, causal=True, window_size=(30, 0))
    b = shim.flash_attn_varlen_func(q, k, v, cu, cu, 256, 256, causal=True, window_size_left=torch.tensor(30),
                                    window_size_right=torch.tensor(0))
    torch.testing.assert_close(a, b)


def test_fixed_length_flash_attn_func():
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(2, 64, 4, 16, generator=g) for _ in range(3))
    out = shim.flash_attn_func(q, k, v, causal=True, window_size=(20, 0))
    cu = torch.tensor([0, 64, 128], dtype=torch.int32)
    ref, _ = _reference(q.reshape(128, 4, 16), k.reshape(128, 4, 16), v.reshape(128, 4, 16), cu, cu, 0.25, True, 20, 0)
    torch.testing.assert_close(out.double(), ref.view(2, 64, 4, 16), atol=3e-5, rtol=3e-5)


def test_unsupported_arguments_raise():
    q, k, v = _qkv(64, 2, 16, torch.float32, seed=0)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    for kwargs in ({"softcap": 30.0}, {"seqused_q": cu}, {"attention_chunk": 16}, {"q_descale": torch.ones(1)}):
        with pytest.raises(NotImplementedError):
            shim.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, causal=True, **kwargs)


def test_the_module_is_its_own_interface():
    assert shim.flash_attn_interface is shim
    assert getattr(shim, "flash_attn_interface", None).flash_attn_varlen_func is shim.flash_attn_varlen_func


# ------------------------------------------------------------------------- npu ----

@pytest.fixture
def npu_calls(monkeypatch):
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
@pytest.mark.parametrize("window,sparse_mode", [((-1, 0), 3), ((60, 0), 4)])
def test_npu_branch_tnd_matches_float64(npu_calls, dtype, window, sparse_mode):
    total = 512
    cu = _cu_seqlens(total, 5, pad_to=10, seed=11)
    q, k, v = _qkv(total, 4, 32, dtype, seed=11, h_kv=2)
    _check(dtype, q, k, v, cu, cu, scale=0.12, causal=True, window=window)
    args, kwargs = npu_calls[0]
    ends = sorted(set(cu.tolist()) - {0})
    assert args[3:5] == (4, "TND") and kwargs["scale"] == 0.12 and kwargs["sparse_mode"] == sparse_mode
    assert kwargs["actual_seq_qlen"] == ends and kwargs["actual_seq_kvlen"] == ends  # cumulative, no empty docs
    assert kwargs["atten_mask"].shape == (2048, 2048) and kwargs["atten_mask"].dtype == torch.bool
    if sparse_mode == 4:
        assert (kwargs["pre_tockens"], kwargs["next_tockens"]) == (60, 0)


def test_npu_branch_lse_and_zero_rows(npu_calls):
    cu_q = torch.tensor([0, 50, 80, 200], dtype=torch.int32)
    cu_k = torch.tensor([0, 30, 90, 150], dtype=torch.int32)
    q, k, v = _qkv(200, 2, 16, torch.float32, seed=12, total_k=150)
    out, lse = shim.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 60, causal=True, softmax_scale=0.25,
                                           return_attn_probs=True)
    ref, ref_lse = _reference(q, k, v, cu_q, cu_k, 0.25, True, -1, 0)
    assert npu_calls[0][1]["inner_precise"] == 2  # rows with no key: the NPU's zeroing mode
    torch.testing.assert_close(out.double(), ref, atol=3e-5, rtol=3e-5)
    seen = ~torch.isneginf(ref_lse)
    torch.testing.assert_close(lse.double()[seen], ref_lse[seen], atol=3e-5, rtol=3e-5)


# -------------------------------------------------------------------- programs ----
# Small programs in the records' FA3 forms (written for these tests).

_BODY = '''
class Attn(nn.Module):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x, seqlens, bm_size):
        B, T, _ = x.shape
        assert B == 1, "varlen sequences requires B == 1"
        q, k, v = self.qkv(x).view(B, T, 3 * self.heads, self.hd).chunk(3, dim=2)
        max_len = 128
        y = ATTN(q[0], k[0], v[0], cu_seqlens_q=seqlens, cu_seqlens_k=seqlens, max_seqlen_q=max_len,
                 max_seqlen_k=max_len, causal=True, softmax_scale=0.12, window_size=(bm_size, 0))
        y = y.view(B, T, self.heads, self.hd)
        return self.o(y.contiguous().view(B, T, self.heads * self.hd))


torch.manual_seed(0)
device = "cuda"
emb, attn, head = nn.Embedding(64, 64).to(device), Attn().to(device), nn.Linear(64, 64).to(device)
params = [*emb.parameters(), *attn.parameters(), *head.parameters()]
opt = torch.optim.SGD(params, lr=0.1)
tokens = torch.randint(1, 64, (257,), device=device)
tokens[::61] = 0
starts = torch.nonzero(tokens[:-1] == 0)[:, 0]
seqlens = torch.full((16,), 256, dtype=torch.int32)
seqlens[: len(starts)] = starts
seqlens = seqlens.to(device)
losses = []
for step, window in enumerate((32, 64, 128)):
    x = emb(tokens[None, :-1])
    loss = F.cross_entropy(head(x + attn(x, seqlens, window)).view(-1, 64), tokens[1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
'''

_HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"

_ERA_IMPORT = (_HEAD + "from flash_attn_interface import flash_attn_varlen_func\n"
               + _BODY.replace("ATTN(", "flash_attn_varlen_func("))
_ERA_GET_KERNEL = (_HEAD + "from kernels import get_kernel\n\n"
                   "flash_attn_interface = get_kernel('varunneal/flash-attention-3').flash_attn_interface\n"
                   + _BODY.replace("ATTN(", "flash_attn_interface.flash_attn_varlen_func("))
_ERA_COMMUNITY = (_HEAD + "from kernels import get_kernel\n\n"
                  "flash_attn_interface = get_kernel('kernels-community/flash-attn3', version=1).flash_attn_interface\n"
                  + _BODY.replace("ATTN(", "flash_attn_interface.flash_attn_varlen_func("))
_ERA_FALLBACK = (_HEAD + "from kernels import get_kernel\n\n"
                 "try:\n"
                 "    _fa3 = get_kernel(\"kernels-community/flash-attn3\")\n"
                 "except BaseException as exc:\n"
                 "    print(f\"load failed: {exc}\")\n"
                 "    _fa3 = get_kernel(\"varunneal/flash-attention-3\", trust_remote_code=True)\n"
                 "flash_attn_interface = getattr(_fa3, \"flash_attn_interface\", _fa3)\n"
                 + _BODY.replace("ATTN(", "flash_attn_interface.flash_attn_varlen_func("))
_ERAS = {"import": _ERA_IMPORT, "get_kernel": _ERA_GET_KERNEL, "community_v1": _ERA_COMMUNITY,
         "try_fallback": _ERA_FALLBACK}


def _exec(files: dict[str, str], tmp_path) -> dict:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        ns = {"__name__": "__main__"}
        exec(compile(files["train_gpt.py"], str(tmp_path / "train_gpt.py"), "exec"), ns)
        return ns
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("_tb_flash_attention", None)


def _ported(source: str, target: str):
    """The naive port, then this feature's port: the order `port_program` runs them in."""
    return feature.port(port_naive({"train_gpt.py": source}, target).files, target)


@pytest.mark.parametrize("era", list(_ERAS))
def test_ported_program_runs_on_cpu_without_kernels(era, tmp_path, monkeypatch):
    res = _ported(_ERAS[era], "cpu")
    assert not res.blockers
    prog = res.files["train_gpt.py"]
    assert "kernels" not in prog and "get_kernel" not in prog and "from flash_attn_interface" not in prog
    assert 'BACKEND = "sdpa"' in res.files["_tb_flash_attention.py"]
    monkeypatch.setitem(sys.modules, "kernels", None)  # importing the kernels package would now fail
    ns = _exec(res.files, tmp_path)
    assert len(ns["losses"]) == 3 and all(math.isfinite(x) for x in ns["losses"])


def test_changes_name_each_edit():
    res = feature.port({"train_gpt.py": _ERA_FALLBACK}, "cpu")
    lines = _ERA_FALLBACK.splitlines()
    edits = [(c.kind, lines[c.line - 1].strip() if c.file == "train_gpt.py" else c.file) for c in res.changes]
    assert edits == [
        ("attention_replaced", "from kernels import get_kernel"),
        ("attention_replaced", '_fa3 = get_kernel("kernels-community/flash-attn3")'),
        ("attention_replaced", '_fa3 = get_kernel("varunneal/flash-attention-3", trust_remote_code=True)'),
        ("shim_added", "_tb_flash_attention.py"),
    ]
    assert res.changes[0].after == "import _tb_flash_attention" and res.changes[1].after == "_tb_flash_attention"
    res = feature.port({"train_gpt.py": _ERA_IMPORT}, "cpu")
    assert [c.after for c in res.changes] == ["from _tb_flash_attention import flash_attn_varlen_func",
                                              "_tb_flash_attention.py"]


def test_port_program_runs_this_porter():
    whole = port_program({"train_gpt.py": _ERA_GET_KERNEL}, "cpu")
    assert whole.files["train_gpt.py"] == _ported(_ERA_GET_KERNEL, "cpu").files["train_gpt.py"]
    assert not whole.blockers


def test_ported_program_dry_runs_on_npu(tmp_path, monkeypatch):
    res = _ported(_ERA_GET_KERNEL, "npu")
    dry = {n: fake.npu_to_cpu_for_dry_run(t) for n, t in res.files.items()}
    assert 'BACKEND = "npu_fusion_attention"' in dry["_tb_flash_attention.py"]
    layouts = []
    with fake.installed() as tnpu:
        real = tnpu.npu_fusion_attention
        monkeypatch.setattr(tnpu, "npu_fusion_attention", lambda *a, **k: layouts.append(a[4]) or real(*a, **k))
        ns = _exec(dry, tmp_path)
    assert layouts == ["TND"] * 3 and all(math.isfinite(x) for x in ns["losses"])


def test_unsupported_forms_are_blockers_not_exceptions():
    src = _HEAD + (
        "from kernels import get_kernel\n"
        "fa = get_kernel('varunneal/flash-attention-3').flash_attn_interface\n"
        "act = get_kernel('someone/fused-activation')\n"
        "def attend(q, k, v, cu):\n"
        "    return fa.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, causal=True, softcap=30.0)\n"
        "def attend_fp8(q, k, v, cu, s):\n"
        "    return fa.flash_attn_varlen_func(q, k, v, cu, cu, 64, 64, None, None, None, True, None, s)\n"
        "def other(q):\n"
        "    return fa.flash_attn_with_kvcache(q, q, q)\n")
    res = feature.port({"train_gpt.py": src}, "cpu")
    lines = src.splitlines()
    found = {(b.construct.split("(")[0], lines[b.line - 1].strip()[:30]) for b in res.blockers}
    assert ("get_kernel", "act = get_kernel('someone/fuse") in found
    assert any("softcap=30.0" in b.construct for b in res.blockers)
    assert any("q_descale=s" in b.construct for b in res.blockers)
    assert any("flash_attn_with_kvcache" in b.construct for b in res.blockers)
    assert "from kernels import get_kernel" in res.files["train_gpt.py"]  # still needed by the other kernel
    compile(res.files["train_gpt.py"], "train_gpt.py", "exec")


def test_flash_attention_2_package_is_a_blocker():
    res = feature.port({"train_gpt.py": "from flash_attn import flash_attn_varlen_func\n"}, "cpu")
    assert res.blockers and res.blockers[0].line == 1 and "FlashAttention-2" in res.blockers[0].reason


def test_cuda_target_and_programs_without_fa3_are_unchanged():
    files = {"train_gpt.py": _ERA_GET_KERNEL}
    assert feature.port(files, "cuda").files == files and not feature.port(files, "cuda").changes
    plain = {"train_gpt.py": _HEAD + "x = torch.ones(2)\n"}
    res = feature.port(plain, "cpu")
    assert res.files == plain and not res.changes and not res.blockers
