"""sdpa_attention (L2): hand-written causal softmax attention as one fused operator.

Recognised (after following local names, so chained or split statements both match):

    P @ V   (or torch.matmul(P, V))   where
    P = softmax(S_masked, dim=-1)     (F.softmax / torch.softmax / S.softmax; an fp32 upcast
                                       inside and a cast back outside are accepted)
    S_masked = S.masked_fill(M, -inf) (M True = masked: causal when M is triu(ones, 1), or
                                       tril(ones) == 0 / ~tril / tril.logical_not(); the mask may
                                       be a registered buffer sliced [:T, :T] or [:, :, :T, :T])
             | torch.where(K, S, m)   (K True = kept: causal when K is tril(ones) as bool, sliced
                                       [:, :, L - Q:L, :L] too (top-left when query and key lengths
                                       are equal, as in training); m -inf or finfo.min, also
                                       through torch.full([], m); any other K goes as attn_mask)
             | S + A                  (A = triu(full(-inf), 1): an additive causal mask; any other
                                       additive or bool mask is passed explicitly as attn_mask)
             | `if M is not None: S = S + M` (an optional additive mask: attn_mask=M, None or not)
             | S                      (no mask: full, non-causal attention, as in a ViT)
    S = (Q @ K^T) * s | (Q @ K^T) / d | s * (Q @ K^T) | Q @ K^T
                                      (K^T: K.transpose(-2, -1), K.transpose(-1, -2), K.mT;
                                       K.transpose(2, 3) of 4-D B,H,T,D tensors)
      | torch.baddbmm(E, Q, K^T, beta=0, alpha=s)
                                      (E ignored at beta 0, or torch.zeros; 3-D operands,
                                       K.transpose(1, 2) accepted as K^T)
    `@` may be torch.matmul, torch.bmm on 3-D (batch x heads, T, D) operands, or torch.einsum
    ("bhqk,bhkd->bhqd"; Q @ K^T as "bhqd,bhkd->bhqk", no transpose), also over another layout
    ("bqhd,bkhd->bhqk" then "bhqk,bkhd->bqhd": heads third, as a Linear's output is viewed): the
    operands are permuted into SDPA's (batch, heads, T, D) and the result back (cpu / cuda).

Dropout between softmax and `@ V` (an `nn.Dropout` set on self, or `F.dropout(P, p, training)`)
moves inside the fused call as `dropout_p` (cpu / cuda; the npu form is not written). On the
CPU a `dropout_p > 0` takes SDPA's math path, which draws the eager mask (the losses match);
a GPU's fused kernel draws its own random numbers, which the loss check would see as a
difference (not handled yet: validation with dropout off in both programs).
Not applicable (with the reason) when the attention weights are used elsewhere (returned for
visualisation, say): the fused operator never materialises them. Masks that are not provably
causal keep their full form (no causal block skipping).

cpu / cuda: `F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=s)` (the program's
scale is passed: SDPA's default is 1/sqrt(head_dim), which may differ).
3-D operands (bmm, batch x heads folded) are passed as (1, B*H, T, D) and the result squeezed:
on the CPU a 3-D SDPA input takes the math path, no fewer operators than the eager form.
npu: `torch_npu.npu_fusion_attention(q, k, v, q.size(1), "BNSD", atten_mask=<2048x2048 bool,
True above the diagonal>, scale=s, sparse_mode=2)[0]` (leftUpCausal with the compressed mask,
so the kernel skips fully masked blocks; scale passed since its default is 1).

The recognisers of those forms live in `attention_forms.py`; this module is the recipe:
it matches through them, builds the replacement for each target (the npu mask helpers
below) and refuses files where the attention weights are still read afterwards.
"""

from __future__ import annotations

import libcst as cst

from ...pysource.scope import _has_effects
from ...pysource.shapes import call_name, method_receiver, positional, strip_parens
from ...pysource.sites import iter_functions, iter_statements, positions
from ...pysource.syntax import code, expr, parens, walk
from .attention_forms import (
    Miss,
    _is_dropout,
    _matmul,
    _neg_inf,
    _optional_additive_mask,
    _scores,
    _softmax_arg,
    _strip_casts,
    attention_dropout,
    causal_additive_mask,
    causal_bool_mask,
    causal_keep_mask,
    einsum_permuted,
    is_batched_3d,
    neg_fill,
    permuted,
)
from .expr_engine import Env, ExprRecipe, Match

NPU_MASK_HELPER = '''
_TB_NPU_CAUSAL_MASK = {}


def _tb_npu_causal_mask(device):
    """The compressed causal mask npu_fusion_attention's sparse_mode=2 expects (2048x2048, True = masked)."""
    mask = _TB_NPU_CAUSAL_MASK.get(device)
    if mask is None:
        mask = _TB_NPU_CAUSAL_MASK[device] = torch.triu(
            torch.ones(2048, 2048, dtype=torch.bool, device=device), diagonal=1)
    return mask
'''


NPU_FULL_MASK_HELPER = '''
def _tb_npu_atten_mask(mask, sq, skv):
    """A bool mask (True = masked) broadcast to the [..., Sq, Skv] shape npu_fusion_attention accepts."""
    while mask.dim() < 2:
        mask = mask.unsqueeze(0)
    return mask.expand(*mask.shape[:-2], sq, skv).contiguous()
'''


class AttentionRecipe(ExprRecipe):
    def match(self, node, env: Env):
        try:
            return self._match(node, env)
        except Miss:
            return None

    def explain(self, files: dict[str, str], target: str) -> list[str]:
        """Near misses: attention-shaped code this recipe refuses, and why."""
        out = []
        for rel, text in sorted(files.items()):
            if not rel.endswith(".py"):
                continue
            try:
                pos = positions(text)
            except Exception:
                continue
            from ...pysource.imports import functional_alias
            for fi in iter_functions(pos.module):
                for ss in iter_statements(fi.node, fi.qualname, fi.class_def):
                    env = Env(ss, target, functional_alias(pos.module), pos.module, rel)
                    for sub in walk(ss.stmt) if isinstance(ss.stmt, cst.SimpleStatementLine) else []:
                        if _matmul(sub) is None:
                            continue
                        try:
                            self._match(sub, env)
                        except Miss as e:
                            out.append(f"{rel}:{pos.line(sub)} {fi.qualname}: {e}")
        return out

    def _match(self, node, env: Env):
        mm = _matmul(node)
        pv_perms = None
        if mm is None:  # an einsum P @ V over another layout ("bhqk,bkhd->bqhd")
            pv = einsum_permuted(strip_parens(node), transposed=False)
            if pv is None:
                return None
            mm, pv_perms = (pv[0], pv[1]), pv[3]
        here = env.ref(node)
        scope = env.scope
        used: set = set()
        p_ref, v_node = here.with_node(mm[0]), mm[1]
        dropout_p, spent = None, set()
        if _is_dropout(p_ref, set()):
            inner = scope.follow(p_ref)
            if not any(_softmax_arg(inner.with_node(a.value), set())
                       for a in getattr(strip_parens(inner.node), "args", [])):
                return None
            if env.target == "npu":
                raise Miss("dropout between softmax and @ v: npu_fusion_attention's keep_prob is not written here")
            found = attention_dropout(p_ref, env, used, here)
            if found is None:
                return None
            p_ref, dropout_p, spent = found
        p_ref, cast_out = _strip_casts(p_ref, used)
        s_ref = _softmax_arg(p_ref, used)
        if s_ref is None:
            return None
        s_ref, cast_in = _strip_casts(s_ref, used)
        r = scope.follow(s_ref, used)
        n = strip_parens(r.node)
        mask_kind = None
        scored = None
        explicit = None
        drop: list = []
        mask_notes: list[str] = []
        if isinstance(n, cst.Call) and call_name(n) == "masked_fill":
            recv = method_receiver(n, {"masked_fill"})
            pos = positional(n)
            if recv is not None and len(pos) == 2:
                sc, mask, fill = recv, pos[0], pos[1]
            elif recv is None and len(pos) == 3:
                sc, mask, fill = pos
            else:
                return None
            scored = _scores(r.with_node(sc), used)
            if scored is None:
                return None
            if not _neg_inf(fill):
                raise Miss(f"masked_fill with {code(fill)}: not -inf, so masked positions keep weight")
            try:
                mask_kind = causal_bool_mask(r.with_node(mask), env, used, mask_notes)
            except Miss:
                mask_notes.clear()
                explicit = ("bool", scope.emit(r.with_node(mask), here))
        elif isinstance(n, cst.Call) and call_name(n) == "where" and method_receiver(n, {"where"}) is None \
                and len(positional(n)) == 3 and len(n.args) == 3:
            keep, sc, fill = positional(n)
            scored = _scores(r.with_node(sc), used)
            if scored is None:
                return None
            if not neg_fill(r.with_node(fill), used):
                raise Miss(f"torch.where(mask, scores, {code(fill)}): not -inf or the dtype's minimum")
            try:
                mask_kind = causal_keep_mask(r.with_node(keep), env, used, mask_notes)
            except Miss:
                mask_notes.clear()
                explicit = ("keep", scope.emit(r.with_node(keep), here))
        elif isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Add):
            for a, b in ((n.left, n.right), (n.right, n.left)):
                trial = set()
                scored = _scores(r.with_node(a), trial)
                if scored is not None:
                    used |= trial
                    try:
                        mask_kind = causal_additive_mask(r.with_node(b), env, used, mask_notes)
                    except Miss:
                        mask_notes.clear()
                        explicit = ("additive", scope.emit(r.with_node(b), here))
                    break
            if scored is None:
                return None
        elif (optional := _optional_additive_mask(r, used)) is not None:
            before_if, mask_ref, if_stmt = optional
            scored = _scores(before_if, used)
            if scored is None:
                return None
            explicit = ("optional additive", scope.emit(mask_ref, here))
            drop = [if_stmt]
        else:
            scored = _scores(r, used)
            if scored is None:
                return None
            mask_kind = "none (full attention)"
        q_ref, k_ref, scale, qk_perms = scored[0], scored[1], scored[2], scored[4]
        if (qk_perms is None) != (pv_perms is None):
            return None  # one product over another layout, the other not: not recognised
        if scored[3] is not None:
            s_expr = scope.emit(scored[3], here)
            if s_expr is None:
                return None
            st = code(parens(s_expr))
            scale = st if not scale.startswith("1.0 / ") else f"1.0 / {st}"
        q, k = scope.emit(q_ref, here), scope.emit(k_ref, here)
        v = v_node
        if q is None or k is None or (explicit is not None and explicit[1] is None):
            return None
        for t in (q, k, v):
            if _has_effects(t) and not isinstance(strip_parens(t), (cst.Name, cst.Attribute)):
                return None
        qs, ks, vs = code(q), code(k), code(v)
        notes = list(mask_notes)
        if qk_perms is not None:
            if is_batched_3d(node):
                return None  # 3-D (batch x heads folded) einsums in another order: not written
            if env.target == "npu":
                raise Miss("einsum attention over another layout: the npu form is not written")
            qs, ks = permuted(code(parens(q)), qk_perms[0]), permuted(code(parens(k)), qk_perms[1])
            vs = permuted(code(parens(v)), pv_perms[0])
            notes.append("einsum operands in another layout (heads not second): permuted into SDPA's "
                         "(batch, heads, T, D) and the result permuted back")
        batched = is_batched_3d(node)
        if explicit is not None and env.target == "npu" and explicit[0] not in ("bool", "keep"):
            raise Miss(f"an {explicit[0]} mask: npu_fusion_attention takes bool masks only (True = masked)")
        squeeze = ""
        if batched:
            if explicit is not None and env.target == "npu":
                raise Miss("bmm attention over 3-D (batch x heads, T, D) tensors with an explicit mask: the mask's "
                           "layout for npu_fusion_attention is not known here")
            # (B*N, S, D) as (1, B*N, S, D): the 4-D layout the fused kernels take (on the CPU a 3-D
            # input falls back to SDPA's math path, as many operators as the eager form)
            qs, ks, vs = (f"{code(parens(t))}.unsqueeze(0)" for t in (q, k, v))
            squeeze = ".squeeze(0)"
            notes.append("3-D bmm operands (batch x heads folded) passed 4-D with a batch of 1, the result "
                         "squeezed back")
        dp = ""
        if dropout_p is not None:
            dp = f", dropout_p={dropout_p}"
            notes.append(f"the dropout on the attention weights moves inside the fused call (dropout_p={dropout_p}); "
                         "with dropout on, SDPA takes its math path on the CPU (eager's mask, the same losses), "
                         "while a GPU's fused kernel draws other random numbers than the eager mask")
        if explicit is not None:
            done = self._explicit(node, env, used, qs, ks, vs, scale, explicit, cast_in or cast_out, drop, squeeze,
                                  dp)
            if done is not None:
                done.effects_spent = spent
                if pv_perms is not None and permuted("x", pv_perms[1]) != "x":
                    done.new = expr(permuted(code(parens(done.new)), pv_perms[1]))
            return done
        causal = mask_kind != "none (full attention)"
        if cast_in or cast_out:
            notes.append("the eager softmax ran in fp32 between casts; the fused kernel accumulates in fp32 itself")
        if env.target == "npu" and causal:
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", '
                       f"atten_mask=_tb_npu_causal_mask({qs}.device), scale={scale}, sparse_mode=2)[0]{squeeze}")
            imports, helpers = ["import torch_npu"], [("_tb_npu_causal_mask", NPU_MASK_HELPER)]
            notes.append("npu_fusion_attention: q/k/v must be 4-D (B, N, S, D) here (BNSD layout), D <= 768; "
                         "sparse_mode=2 (leftUpCausal) with the compressed 2048x2048 mask; numerics differ from "
                         "eager softmax within the dtype's precision")
        elif env.target == "npu":
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", scale={scale})'
                       f"[0]{squeeze}")
            imports, helpers = ["import torch_npu"], []
            notes.append("npu_fusion_attention without a mask (full attention): q/k/v 4-D (B, N, S, D), D <= 768")
        elif causal:
            new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, is_causal=True, scale={scale}{dp})"
                       f"{squeeze}")
            imports, helpers = [], []
        else:
            new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, scale={scale}{dp}){squeeze}")
            imports, helpers = [], []
            notes.append("no mask: full (non-causal) attention, as the eager softmax computed it")
        if pv_perms is not None and permuted("x", pv_perms[1]) != "x":
            new = expr(permuted(code(parens(new)), pv_perms[1]))
        return Match(node=node, new=parens(new) if getattr(node, "lpar", None) else new, used=used, imports=imports,
                     helpers=helpers, notes=notes, effects_spent=spent,
                     detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": mask_kind or ""})

    def _explicit(self, node, env, used, qs, ks, vs, scale, explicit, casts, drop=(), squeeze="", dp=""):
        """A mask that is not provably causal, passed explicitly (same math, less work skipped).

        masked_fill(M, -inf) with a bool M (True = masked): SDPA's bool attn_mask means True =
        attend, so it gets ~M; npu_fusion_attention's atten_mask means True = masked, so it gets
        M with sparse_mode=0; torch.where(K, S, -inf) keeps where K is True, so SDPA gets K and
        npu ~K. An additive mask goes to SDPA as a float attn_mask; npu takes no
        additive mask here, so that case is left alone there. An optional additive mask
        (`if mask is not None: s = s + mask`) goes to SDPA as `attn_mask=mask`, which is None
        exactly when the eager code skipped the addition; the `if` is dropped (`drop`).
        """
        kind, mask = explicit
        ms = code(parens(mask))
        notes = ["the mask is not provably causal: it is passed explicitly (no causal block skipping); rows with "
                 "every position masked give NaN in both forms"]
        if kind == "optional additive":
            notes.append(f"the mask is optional: attn_mask={ms} is None exactly when the eager `if` added nothing")
        if casts:
            notes.append("the eager softmax ran in fp32 between casts; the fused kernel accumulates in fp32 itself")
        if dp:
            notes.append(f"the dropout on the attention weights moves inside the fused call ({dp[2:]})")
        if env.target == "npu":
            if kind not in ("bool", "keep"):
                return None  # npu_fusion_attention takes bool masks only (True = masked)
            full = f"_tb_npu_atten_mask({'~' if kind == 'keep' else ''}{ms}, {qs}.size(-2), {ks}.size(-2))"
            new = expr(f'torch_npu.npu_fusion_attention({qs}, {ks}, {vs}, {qs}.size(1), "BNSD", atten_mask={full}, '
                       f"scale={scale}, sparse_mode=0)[0]")
            notes.append("npu_fusion_attention takes a mask shaped [B|1, N|1, Sq, Skv] (no broadcasting of the "
                         "query dim): the program's mask is expanded to it")
            return Match(node=node, new=new, used=used, imports=["import torch_npu"], notes=notes,
                         helpers=[("_tb_npu_atten_mask", NPU_FULL_MASK_HELPER)],
                         detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": f"explicit {kind}: {ms}"})
        attn = f"~{ms}" if kind == "bool" else ms  # SDPA's bool mask: True = attend ("keep" is that already)
        if kind == "bool" and isinstance(strip_parens(mask), cst.UnaryOperation) and \
                isinstance(strip_parens(mask).operator, cst.BitInvert):
            attn = code(parens(strip_parens(mask).expression))
        new = expr(f"{env.F}.scaled_dot_product_attention({qs}, {ks}, {vs}, attn_mask={attn}, scale={scale}{dp})"
                   f"{squeeze}")
        return Match(node=node, new=new, used=used, notes=notes, stmt_edits=[(s, None) for s in drop],
                     detail={"q": qs, "k": ks, "v": vs, "scale": scale, "mask": f"explicit {kind}: {ms}"})

    def _rewrite_file(self, rel, text, target, sites):
        out = super()._rewrite_file(rel, text, target, sites)
        new_text, done, notes = out
        if not done:
            return out
        # the attention weights must not survive: if an assignment of them is still read, the
        # fused call would add work instead of replacing it
        still = self._weights_still_used(new_text, done)
        if still:
            from .recipe_base import NotApplicable
            return NotApplicable(reason=f"sdpa_attention: the attention weights are also used elsewhere ({still}); "
                                        "the fused operator does not produce them")
        return out

    def _weights_still_used(self, new_text: str, done) -> str:
        mod = cst.parse_module(new_text)
        for fi in iter_functions(mod):
            if fi.qualname not in {s.qualname for s in done}:
                continue
            for s in walk(fi.node):
                if isinstance(s, cst.Call) and call_name(s) == "softmax":
                    return f"{fi.qualname}: {code(s)[:80]}"
        return ""

    def _no_site_reason(self, files, target):
        misses = self.explain(files, target)
        if misses:
            return "sdpa_attention: attention found but not rewritten: " + "; ".join(misses[:4])
        return "sdpa_attention: no hand-written softmax(q @ k^T) @ v attention found"
