"""What each known GPU kernel computes, and the PyTorch function that replaces its launcher.

Written by us from what the Modded-NanoGPT record kernels compute; no kernel code is copied.
An entry names the launcher it replaces as the records call it (names, parameters), the
fingerprints of every kernel variant it has been checked against (`fingerprint.py`: a kernel
whose fingerprint is missing here is never taken for a known one), the replacement in the
`_tb_kernels.py` shim (`targets/shims/kernels.py`), how the porter installs it, and the cases
the check runs. The entries' replacement functions keep the launcher's signature, return values
and in-place writes, so the program's other code is untouched.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class CheckCase(BaseModel):
    builder: str = Field(..., description="a builder in kernels/cases.py (or in a given cases file)")
    params: dict = Field(default_factory=dict)
    seed: int = 0
    name: str = ""

    def label(self) -> str:
        return self.name or self.builder


class CatalogEntry(BaseModel):
    id: str
    what: str = Field(..., description="what the launcher computes, in words")
    launcher_names: list[str]
    launcher_kind: Literal["function", "autograd_function"]
    params: list[str] = Field(..., description="the launcher's parameter names (forward's, without ctx)")
    kernel_fingerprints: dict[str, str] = Field(..., description="fingerprint -> the kernel variant and records")
    replacement: str = Field(..., description="name in the _tb_kernels shim")
    install: Literal["rebind", "body"] = Field(
        "rebind", description="rebind: the launcher's definition becomes `name = _tb_kernels.x`; body: the "
                              "definition (and its decorators, e.g. torch.library.custom_op) stays, its body calls x")
    companions: dict[str, str] = Field(default_factory=dict, description="helpers in the same file rebound "
                                       "with the launcher (name -> shim name), e.g. device guards")
    nvrtc_reference: str | None = Field(None, description="module:function checked against when the kernel is "
                                        "CUDA source compiled at run time (it cannot run here)")
    cases: list[CheckCase]
    records: str = Field(..., description="which records use it")


def _cases(builder: str, *variants: dict) -> list[CheckCase]:
    return [CheckCase(builder=builder, params=v.get("params", {}), seed=i, name=v.get("name", ""))
            for i, v in enumerate(variants or ({},))]


ENTRIES: list[CatalogEntry] = [
    CatalogEntry(
        id="symmetric_xxt", what="out = A @ A.mT for one matrix or a batch, written into out (symmetric: "
        "the kernel computes one triangle of blocks and mirrors it); returns out",
        launcher_names=["XXT", "ns_line_1"], launcher_kind="function", params=["A", "out"],
        kernel_fingerprints={"5721eb608be79ec7": "ns_line_1_kernel / XXT_kernel, records 27-73 but 69 (autotuned "
                                                 "to 65)",
                             "cbee87143f3d762b": "XXT_kernel with coalesced A.T loads, records 69, 75-89"},
        replacement="xxt",
        cases=_cases("xxt", {"name": "2d", "params": {"shape": [128, 192]}},
                     {"name": "batched", "params": {"shape": [2, 96, 160]}}),
        records="27-89 (Muon Newton-Schulz; Polar Express from 38)"),
    CatalogEntry(
        id="symmetric_ba_plus_caa", what="out = alpha * A @ A.mT + beta * A for square A (the Newton-Schulz "
        "polynomial step b*A + c*A@A), written into out; returns out",
        launcher_names=["ba_plus_cAA", "ns_line_2"], launcher_kind="function", params=["A", "alpha", "beta", "out"],
        kernel_fingerprints={"b7b14b7436fddbd7": "ns_line_2_kernel / ba_plus_cAA_kernel, records 27-73 but 69",
                             "4b96ce26c6ceac70": "ba_plus_cAA_kernel with coalesced loads, records 69, 75-89"},
        replacement="ba_plus_caa",
        cases=_cases("ba_plus_caa", {"name": "2d", "params": {"shape": [128, 128]}},
                     {"name": "batched", "params": {"shape": [2, 96, 96]}}),
        records="27-89"),
    CatalogEntry(
        id="symmetric_xtx", what="out = A.mT @ A (tall A, (K, K) result), written into out; returns out",
        launcher_names=["XTX"], launcher_kind="function", params=["A", "out"],
        kernel_fingerprints={"c79266d3efb19627": "XTX_kernel, records 75-89"},
        replacement="xtx",
        cases=_cases("xtx", {"name": "2d", "params": {"shape": [256, 128]}},
                     {"name": "batched", "params": {"shape": [2, 160, 96]}}),
        records="75-89"),
    CatalogEntry(
        id="linear_relu_square", what="forward (aux None): pre = a @ b.T and post = relu(pre)^2, both bf16; "
        "backward (aux = pre): 2 * (a @ b.T) * relu(aux) in bf16",
        launcher_names=["linear_relu_square"], launcher_kind="function", params=["a", "b", "aux"],
        kernel_fingerprints={"59cf7839b14774cd": "linear_relu_square_kernel (TMA descriptors, persistent), "
                                                 "records 59-83, 85 (v1, v2)"},
        replacement="linear_relu_square",
        cases=_cases("linear_relu_square", {"name": "forward"}, {"name": "backward", "params": {"backward": True}}),
        records="59-83, 85 (FusedLinearReLUSquareFunction)"),
    CatalogEntry(
        id="linear_relu_square_post_only", what="forward (aux None): post = relu(a @ b.T)^2 only, bf16; "
        "backward (aux = post): 2 * (a @ b.T) * sqrt(post) in fp32, rounded to bf16",
        launcher_names=["linear_relu_square"], launcher_kind="function", params=["a", "b", "aux"],
        kernel_fingerprints={"b6c020e63d5045e8": "linear_relu_square_kernel storing post only, record 87"},
        replacement="linear_relu_square_post_only",
        cases=_cases("linear_relu_square_post_only", {"name": "forward"},
                     {"name": "backward", "params": {"backward": True}}),
        records="87 (FusedLinearReLUSquareFunction without pre)"),
    CatalogEntry(
        id="linear_relu_square_fp8_up", what="linear_relu_square whose forward product may come from fp8 "
        "operands a_f8 @ b_f8.T times a one-element dequantisation scale",
        launcher_names=["linear_relu_square"], launcher_kind="function",
        params=["a", "b", "aux", "a_f8", "b_f8", "dequant_scale_ptr"],
        kernel_fingerprints={"d90be9fb16ee3d2a": "linear_relu_square_kernel with USE_FP8, records 84, 85 (v3), 88"},
        replacement="linear_relu_square_fp8_up",
        cases=_cases("linear_relu_square_fp8_up", {"name": "fp8-forward"}) + [
            CheckCase(builder="linear_relu_square", name="bf16-forward", seed=1),
            CheckCase(builder="linear_relu_square", name="backward", params={"backward": True}, seed=2)],
        records="84, 85, 88 (FP8 MLP up projection)"),
    CatalogEntry(
        id="linear_relu_square_fp8_up_down", what="linear_relu_square_fp8_up that can also emit post quantised "
        "to e4m3 by an activation scale and the largest post value (per-SM partial maxima)",
        launcher_names=["linear_relu_square"], launcher_kind="function",
        params=["a", "b", "aux", "a_f8", "b_f8", "dequant_scale_ptr", "activation_scale", "partial_amax"],
        kernel_fingerprints={"ea1ec7d91acb05c6": "linear_relu_square_kernel with USE_FP8 and EMIT_FP8, record 89"},
        replacement="linear_relu_square_fp8_up_down",
        cases=_cases("linear_relu_square_fp8_up_down", {"name": "fp8-emit"}) + [
            CheckCase(builder="linear_relu_square_fp8_up", name="fp8-forward", seed=1),
            CheckCase(builder="linear_relu_square", name="backward", params={"backward": True}, seed=2)],
        records="89 (FP8 MLP down projection)"),
    CatalogEntry(
        id="reduce_mlp_activation_scales", what="scales[l] = max(max_j partial_amax[l, j], 1e-12) * headroom / "
        "448, written into scales",
        launcher_names=["reduce_mlp_activation_scales"], launcher_kind="function",
        params=["partial_amax", "scales", "headroom"],
        kernel_fingerprints={"d7540adf960309ba": "reduce_mlp_activation_scales_kernel, record 89"},
        replacement="reduce_mlp_activation_scales", cases=_cases("reduce_mlp_activation_scales"), records="89"),
    CatalogEntry(
        id="quantize_transpose_mlp_down_weights", what="per layer: e4m3(clamp(W / next_scale, +-448)).T into "
        "output_storage, used_scales = next_scales, 64x64-tile max |W| into partial_amax, then next_scales from "
        "those maxima",
        launcher_names=["quantize_transpose_mlp_down_weights"], launcher_kind="function",
        params=["weights", "output_storage", "next_scales", "used_scales", "partial_amax", "headroom"],
        kernel_fingerprints={"7ee96678a1bb8921": "quantize_transpose_mlp_down_weights_kernel, record 89",
                             "d7540adf960309ba": "reduce_mlp_activation_scales_kernel (called through "
                                                 "reduce_mlp_activation_scales), record 89"},
        replacement="quantize_transpose_mlp_down_weights", cases=_cases("quantize_transpose_mlp_down_weights"),
        records="89"),
    CatalogEntry(
        id="transpose_copy", what="dst = src.T (2-D, any dtype including fp8); returns None",
        launcher_names=["transpose_copy"], launcher_kind="function", params=["src", "dst"],
        kernel_fingerprints={"749fcaeb5d241ab2": "_transpose_copy_kernel, records 75, 77",
                             "e43c95966854d71f": "_transpose_copy_kernel with 64-bit offsets, records 76, 79-89"},
        replacement="transpose_copy",
        cases=_cases("transpose_copy", {"name": "fp32"},
                     {"name": "fp8", "params": {"shape": [96, 64], "dtype": "float8_e4m3fn"}},
                     {"name": "bf16", "params": {"shape": [64, 130], "dtype": "bfloat16"}}),
        records="75-89"),
    CatalogEntry(
        id="transpose_add", what="dst += src.T (2-D); returns None",
        launcher_names=["transpose_add"], launcher_kind="function", params=["src", "dst"],
        kernel_fingerprints={"21bb6292a3d95333": "_transpose_add_kernel, records 75-89"},
        replacement="transpose_add",
        cases=_cases("transpose_add", {"name": "fp32"}, {"name": "bf16", "params": {"dtype": "bfloat16"}}),
        records="75-89"),
    CatalogEntry(
        id="softcapped_cross_entropy", what="autograd.Function: per-row loss sum_k w_k (lse - z[t_{r+k}]) with "
        "z = A sigmoid((x + B) / C) (multi-token prediction weights); backward: the bf16 logit gradient",
        launcher_names=["FusedSoftcappedCrossEntropy"], launcher_kind="autograd_function",
        params=["logits", "targets", "mtp_weights", "A", "B", "C"],
        kernel_fingerprints={"5a28c428b982f783": "fused_softcapped_entropy_fwd_kernel, records 60-71 but 69",
                             "7391569ff106689b": "fused_softcapped_entropy_bwd_kernel, records 60-71 but 69",
                             "da148918a067cd26": "fwd kernel with 1/C precomputed, record 69",
                             "e6fb48db7e96e3dc": "bwd kernel with 1/C precomputed, record 69"},
        replacement="SoftcappedCrossEntropy",
        cases=_cases("softcapped_ce", {"name": "mtp3"}, {"name": "no-weights", "params": {"weights": None}}),
        records="60-71"),
    CatalogEntry(
        id="softcapped_cross_entropy_fp8", what="autograd.Function: lm-head logits through fp8 (x/x_s, w/w_s in "
        "e4m3, bf16 result), the softcapped multi-token loss; backward: e5m2 logit gradient / grad_s, then "
        "grad_x (bf16) and grad_w (fp32) through fp8 products",
        launcher_names=["FusedSoftcappedCrossEntropy"], launcher_kind="autograd_function",
        params=["x", "targets", "mtp_weights", "lm_head_weight", "x_s", "w_s", "grad_s", "A", "B", "C"],
        kernel_fingerprints={"5a28c428b982f783": "fwd kernel, records 72-73",
                             "c9757ce63b5653dd": "bwd kernel with e5m2 output / grad_s, records 72-73",
                             "da148918a067cd26": "fwd kernel with 1/C precomputed, records 75-77, 80",
                             "4c8d6238e5406483": "bwd kernel with the three targets preloaded, records 75, 77, 80",
                             "560c72adfe03ff49": "bwd kernel, e5m2 output, record 76",
                             "749fcaeb5d241ab2": "_transpose_copy_kernel (backward), records 75, 77",
                             "e43c95966854d71f": "_transpose_copy_kernel (backward), record 76"},
        replacement="SoftcappedCrossEntropyFp8", cases=_cases("softcapped_ce_fp8"),
        records="72-77, 80 (79 and 81 on: the NVRTC kernel computes the loss)"),
    CatalogEntry(
        id="ce_fwd_bwd_nvrtc", what="custom op: softcapped multi-token cross-entropy forward and backward in "
        "one CUDA kernel (NVRTC): per-row losses and the e5m2 logit gradient scaled by grad_scale / grad_s, "
        "written into losses and grad_input",
        launcher_names=["ce_fwd_bwd"], launcher_kind="function",
        params=["logits", "targets", "mtp_weights", "losses", "grad_input", "n_rows", "n_predict", "A", "B", "C",
                "grad_s", "grad_scale"],
        kernel_fingerprints={"11c40e491daec60e": "ce_fwd_bwd_kernel CUDA source, records 79, 81-87, 89"},
        replacement="ce_fwd_bwd", install="body",
        nvrtc_reference="trainbridge.targets.kernels.nvrtc_reference:ce_fwd_bwd",
        cases=_cases("ce_fwd_bwd", {"name": "mtp3"}, {"name": "mtp1", "params": {"n_predict": 1}}),
        records="79, 81-87, 89"),
    CatalogEntry(
        id="ce_fwd_bwd_prefix_nvrtc", what="ce_fwd_bwd_nvrtc with a prefix-token prediction per row "
        "(prefix_targets, one-element prefix_weight): one more loss term, S_w and target-column term",
        launcher_names=["ce_fwd_bwd"], launcher_kind="function",
        params=["logits", "targets", "mtp_weights", "prefix_targets", "prefix_weight", "losses", "grad_input",
                "n_rows", "n_predict", "A", "B", "C", "grad_s", "grad_scale"],
        kernel_fingerprints={"acd06bec82719cb9": "ce_fwd_bwd_kernel CUDA source with prefix targets, record 88"},
        replacement="ce_fwd_bwd_prefix", install="body",
        nvrtc_reference="trainbridge.targets.kernels.nvrtc_reference:ce_fwd_bwd_prefix",
        cases=_cases("ce_fwd_bwd_prefix", {"name": "mtp3+prefix"},
                     {"name": "mtp1+prefix", "params": {"n_predict": 1}}),
        records="88"),
    CatalogEntry(
        id="dc_doc_bounds_tables", what="(doc_start[t], doc_end[t]) int32: the document of each position t "
        "in cu_seqlens (binary search)",
        launcher_names=["_build_doc_bounds_tables"], launcher_kind="function",
        params=["cu_seqlens", "T", "n_docs", "cu_search_iters"],
        kernel_fingerprints={"bd4e5f6cd3f96035": "_dc_postonly_build_doc_bounds_table_kernel, record 85"},
        replacement="dc_build_doc_bounds_tables", cases=_cases("dc_doc_bounds"), records="85"),
    CatalogEntry(
        id="dc_correction_forward", what="base_out + post-only dynamically composable attention correction over "
        "a sliding window within documents (6 heads mixed by post_w1, re-weighted by post_w2); with "
        "return_aux also the per-head log-sum-exp and the document tables",
        launcher_names=["_dc_attention_postonly_correction_add_base_forward_impl"], launcher_kind="function",
        params=["q", "k", "v", "post_w1", "post_w2", "cu_seqlens", "scaling", "window", "block_m", "return_aux",
                "base_out"],
        kernel_fingerprints={"34e31600531e28fd": "_dc_postonly_corr_fwd_wsmall_cached_kernel, record 85",
                             "bd4e5f6cd3f96035": "_dc_postonly_build_doc_bounds_table_kernel, record 85"},
        replacement="dc_correction_forward",
        companions={"_is_supported_postonly_triton": "dc_is_supported_postonly"},
        cases=_cases("dc_forward", {"name": "aux"}, {"name": "4d-base", "params": {"aux": False, "base_4d": True}}),
        records="85"),
    CatalogEntry(
        id="dc_correction_backward", what="gradients of the DC correction: dq, dk (None when skipped), dv, "
        "d post_w1, d post_w2",
        launcher_names=["_dc_attention_postonly_correction_add_base_backward_impl"], launcher_kind="function",
        params=["q", "k", "v", "post_w1", "post_w2", "cu_seqlens", "doc_start_table", "doc_end_table",
                "softmax_lse", "grad_out", "scaling", "window", "skip_qk_grad_requested"],
        kernel_fingerprints={"709bc54a834e15c8": "_dc_postonly_corr_bwd_pre_wsmall_kernel, record 85",
                             "a50d64aea582f48e": "_dc_postonly_corr_bwd_qk_wsmall_kernel, record 85"},
        replacement="dc_correction_backward",
        cases=_cases("dc_backward", {"name": "full"}, {"name": "skip-qk", "params": {"skip_qk": True}}),
        records="85"),
]

BY_ID = {e.id: e for e in ENTRIES}


class Match(BaseModel):
    entry: CatalogEntry | None = None
    renamed: bool = False
    reason: str = ""


def match_launcher(name: str, params: list[str], fingerprints: list[str],
                   entries: list[CatalogEntry] | None = None) -> Match:
    """The entry whose parameters and kernel fingerprints this launcher has; a launcher with a
    known name but an unknown kernel fingerprint or other parameters gets no entry, with why."""
    entries = ENTRIES if entries is None else entries
    same_params = [e for e in entries if e.params == params]
    for e in same_params:
        if fingerprints and all(f in e.kernel_fingerprints for f in fingerprints):
            return Match(entry=e, renamed=name not in e.launcher_names)
    named = [e for e in entries if name in e.launcher_names]
    if named:
        close = next((e for e in named if e.params == params), None)
        if close is not None:
            unknown = [f for f in fingerprints if f not in close.kernel_fingerprints]
            return Match(reason=f"kernel changed: fingerprint {', '.join(unknown)} is not among the variants of "
                                f"catalog entry {close.id} ({', '.join(close.kernel_fingerprints)})")
        return Match(reason=f"launcher {name}({', '.join(params)}) has parameters no catalog entry named {name} has "
                            f"({'; '.join(', '.join(e.params) for e in named)})")
    return Match(reason="no catalog entry for this launcher (name, parameters and kernel fingerprint unknown)")
