"""The offline recipe library: one mechanism per recipe, as libcst rewrites.

Recipes match the *shape* of the code (expressions resolved through simple local
assignments), not nanogpt's text, so they apply to the same idiom written differently:
`x.pow(2)` / `x * x` / `x ** 2` / `torch.square(x)`, `torch.rsqrt(v)` / `v.rsqrt()`,
`mean(-1, keepdim=True)` / `mean(dim=-1, keepdim=True)`, method or function, chained or
split statements. Each recipe says which targets it supports and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from pydantic import BaseModel, Field

from ...patterns import GapClass, Level, Pattern


class Site(BaseModel):
    file: str
    qualname: str
    line: int = 0
    text: str = ""


class RewriteProposal(BaseModel):
    recipe: str
    files: dict[str, str]
    changed_files: list[str]
    description: str
    sites: list[Site]
    ops_removed_estimate: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class NotApplicable(BaseModel):
    reason: str


def code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# ------------------------------------------------------------ expression shapes ----

def _num(node) -> float | None:
    if isinstance(node, (cst.Integer, cst.Float)):
        return float(node.value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        v = _num(node.expression)
        return -v if v is not None else None
    return None


def _call_name(node) -> str | None:
    if isinstance(node, cst.Call):
        f = node.func
        if isinstance(f, cst.Attribute):
            return f.attr.value
        if isinstance(f, cst.Name):
            return f.value
    return None


def _kw(call: cst.Call, name: str):
    for a in call.args:
        if a.keyword and a.keyword.value == name:
            return a.value
    return None


def _same(a, b) -> bool:
    return a is not None and b is not None and code(a).strip() == code(b).strip()


def _square_of(node):
    """X for X.pow(2), X**2, X*X, torch.square(X), X.square(); else None."""
    if isinstance(node, cst.BinaryOperation):
        if isinstance(node.operator, cst.Power) and _num(node.right) == 2:
            return node.left
        if isinstance(node.operator, cst.Multiply) and _same(node.left, node.right):
            return node.left
    if isinstance(node, cst.Call):
        name = _call_name(node)
        if name == "pow" and isinstance(node.func, cst.Attribute) and node.args and _num(node.args[0].value) == 2:
            return node.func.value
        if name == "square":
            if isinstance(node.func, cst.Attribute) and not node.args:
                return node.func.value
            if node.args:
                return node.args[0].value
    if isinstance(node, cst.Call) and _call_name(node) in ("float",) and isinstance(node.func, cst.Attribute):
        return None
    return None


def _mean_last_dim(node):
    """The argument X of X.mean(-1, keepdim=True) / torch.mean(X, dim=-1, keepdim=True)."""
    if not (isinstance(node, cst.Call) and _call_name(node) == "mean"):
        return None
    keep = _kw(node, "keepdim")
    if not m.matches(keep, m.Name("True")):
        return None
    f = node.func
    positional = [a.value for a in node.args if a.keyword is None]
    if isinstance(f, cst.Attribute) and not m.matches(f.value, m.Name("torch")):
        x, dims = f.value, positional
    elif positional:
        x, dims = positional[0], positional[1:]
    else:
        return None
    dim = _kw(node, "dim") if _kw(node, "dim") is not None else (dims[0] if dims else None)
    return x if _num(dim) == -1 else None


def _flatten_mul(node) -> list:
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _flatten_mul(node.left) + _flatten_mul(node.right)
    return [node]


class _Inliner:
    """Resolve names assigned once in a function body, so split statements match like chained ones."""

    def __init__(self, body: list[cst.BaseStatement]):
        self.defs: dict[str, cst.BaseExpression] = {}
        for stmt in body:
            if m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
                a = stmt.body[0]
                self.defs[a.targets[0].target.value] = a.value

    def __call__(self, node):
        while isinstance(node, cst.Name) and node.value in self.defs:
            node = self.defs[node.value]
        return node


def _rsqrt_arg(node, inline):
    node = inline(node)
    name = _call_name(node)
    if name == "rsqrt":
        if isinstance(node.func, cst.Attribute) and not m.matches(node.func.value, m.Name("torch")) and not node.args:
            return node.func.value
        if node.args:
            return node.args[0].value
    return None


def match_rms_norm(expr, inline):
    """(x, weight|None, eps) when expr is x * rsqrt(mean(x^2, -1) + eps) [* w] (any order)."""
    expr = inline(expr)
    # x / sqrt(mean + eps)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Divide) and _call_name(inline(expr.right)) == "sqrt":
        inner = inline(expr.right)
        factors, var = _flatten_mul(expr.left), inner.args[0].value if inner.args else None
    else:
        factors = [inline(f) for f in _flatten_mul(expr)]
        var = None
        for f in factors:
            var = _rsqrt_arg(f, inline)
            if var is not None:
                factors = [g for g in factors if g is not f]
                break
    if var is None:
        return None
    var = inline(var)
    if not (isinstance(var, cst.BinaryOperation) and isinstance(var.operator, cst.Add)):
        return None
    mean, eps = inline(var.left), var.right
    if _mean_last_dim(mean) is None:
        mean, eps = inline(var.right), var.left
    x_sq = _mean_last_dim(mean)
    if x_sq is None:
        return None
    x = _square_of(inline(x_sq))
    if x is None:
        return None
    rest = [f for f in factors if not _same(f, x)]
    if len(rest) == len(factors):
        return None  # x itself is not a factor
    if len(rest) > 1:
        return None
    return x, (rest[0] if rest else None), eps


# ------------------------------------------------------------------- recipes ----

@dataclass
class Recipe:
    name: str
    pattern: Pattern
    level: Level
    gap_class: GapClass
    targets: set[str]
    mechanism: str
    per_site: bool = False
    notes: list[str] = field(default_factory=list)

    def find(self, files: dict[str, str], target: str) -> list[Site]:
        raise NotImplementedError

    def apply(self, files: dict[str, str], target: str, site: str | None = None) -> RewriteProposal | NotApplicable:
        raise NotImplementedError

    # shared helpers
    def _transform(self, files, target, make, site=None) -> RewriteProposal | NotApplicable:
        new, changed, sites = dict(files), [], []
        for rel, text in files.items():
            if not rel.endswith(".py"):
                continue
            t = make(rel, target, site)
            mod = cst.parse_module(text)
            out = mod.visit(t)
            if t.sites:
                out = _ensure_imports(out, t.imports)
                new[rel] = out.code
                changed.append(rel)
                sites.extend(t.sites)
        if not sites:
            return NotApplicable(reason=f"{self.name}: no {self.pattern} site found")
        return RewriteProposal(recipe=self.name, files=new, changed_files=changed, sites=sites,
                               description=f"{self.mechanism} at " + ", ".join(f"{s.file}:{s.qualname}" for s in sites),
                               notes=list(self.notes))


def _ensure_imports(module: cst.Module, imports: list[str]) -> cst.Module:
    have = module.code
    add = [imp for imp in imports if imp not in have]
    if not add:
        return module
    body = list(module.body)
    # after the last top-level import
    idx = 0
    for i, stmt in enumerate(body):
        if m.matches(stmt, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
            idx = i + 1
    for imp in reversed(add):
        body.insert(idx, cst.parse_statement(imp + "\n"))
    return module.with_changes(body=body)


class _SiteTransformer(cst.CSTTransformer):
    def __init__(self, rel: str, target: str, site: str | None):
        super().__init__()
        self.rel, self.target, self.only = rel, target, site
        self.sites: list[Site] = []
        self.imports: list[str] = []
        self.scope: list[str] = []

    def qual(self, name: str) -> str:
        return ".".join([*self.scope, name])

    def visit_ClassDef(self, node):
        self.scope.append(node.name.value)

    def leave_ClassDef(self, original, updated):
        self.scope.pop()
        return updated


# --- L0: re-apply the GPU program's bf16 autocast on the target ---------------------------

class _Autocast(_SiteTransformer):
    def leave_Call(self, original, updated):
        if not m.matches(original.func, m.Attribute(attr=m.Name("autocast")) | m.Name("autocast")):
            return updated
        dev = _kw(original, "device_type")
        dtype = _kw(original, "dtype")
        if not (isinstance(dev, cst.SimpleString) and dev.value[1:-1] == "cuda"):
            return updated
        if dtype is not None and not m.matches(dtype, m.Attribute(attr=m.Name("bfloat16")) | m.Attribute(attr=m.Name("float16"))):
            return updated
        q = dev.value[0]
        self.sites.append(Site(file=self.rel, qualname=".".join(self.scope) or "<module>", text=code(original)))
        args = [a.with_changes(value=cst.SimpleString(f"{q}{self.target}{q}")) if a.keyword and a.keyword.value == "device_type" else a
                for a in updated.args]
        if self.target == "cpu" and m.matches(dtype, m.Attribute(attr=m.Name("float16"))):
            args = [a.with_changes(value=cst.parse_expression("torch.bfloat16")) if a.keyword and a.keyword.value == "dtype" else a
                    for a in args]
        return updated.with_changes(args=args)


class AutocastRecipe(Recipe):
    """The port kept `autocast(device_type="cuda")`, a no-op on target tensors: the GPU ran its
    matmuls in bf16, the port in fp32. Point autocast at the target device (cpu and npu
    support bf16 autocast), restoring the GPU program's precision - not lowering it."""

    def find(self, files, target):
        out = []
        for rel, text in files.items():
            if rel.endswith(".py") and "autocast" in text:
                t = _Autocast(rel, target, None)
                cst.parse_module(text).visit(t)
                out += t.sites
        return out

    def apply(self, files, target, site=None):
        return self._transform(files, target, _Autocast)


# --- L2: hand-written RMSNorm -> fused RMSNorm ----------------------------------------------

class _RmsNorm(_SiteTransformer):
    def __init__(self, rel, target, site):
        super().__init__(rel, target, site)
        self.func_scope: list[cst.FunctionDef] = []

    def leave_FunctionDef(self, original, updated):
        qual = self.qual(original.name.value)
        if self.only and qual != self.only:
            return updated
        body = list(original.body.body)
        if not body or not m.matches(body[-1], m.SimpleStatementLine(body=[m.Return()])):
            return updated
        ret = body[-1].body[0].value
        inline = _Inliner(body[:-1])
        found = match_rms_norm(ret, inline)
        if not found:
            return updated
        x, w, eps = found
        # every statement before the return must only feed the norm (no side effects)
        if any(not m.matches(s, m.SimpleStatementLine(body=[m.Assign()])) and not m.matches(
                s, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])) for s in body[:-1]):
            return updated
        xs = code(x).strip()
        if self.target == "npu":
            # npu_rms_norm wants gamma in the activation dtype (bf16 under autocast)
            gamma = (f"{code(w).strip()}.to({xs}.dtype)" if w is not None
                     else f"torch.ones({xs}.size(-1), dtype={xs}.dtype, device={xs}.device)")
            new = f"return torch_npu.npu_rms_norm({xs}, {gamma}, epsilon={code(eps).strip()})[0]"
            self.imports.append("import torch_npu")
        else:
            weight = code(w).strip() if w is not None else "None"
            new = f"return torch.nn.functional.rms_norm({xs}, ({xs}.size(-1),), {weight}, {code(eps).strip()})"
        doc = [s for s in body[:-1] if m.matches(s, m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())]))]
        self.sites.append(Site(file=self.rel, qualname=qual, text=code(ret).strip()))
        return updated.with_changes(body=updated.body.with_changes(body=[*doc, cst.parse_statement(new + "\n")]))


class RmsNormRecipe(Recipe):
    """x * rsqrt(mean(x^2) + eps) [* w] as one fused operator (eps passed explicitly:
    F.rms_norm's default eps is the dtype's machine epsilon, not the program's)."""

    def find(self, files, target):
        out = []
        for rel, text in files.items():
            if rel.endswith(".py"):
                t = _RmsNorm(rel, target, None)
                cst.parse_module(text).visit(t)
                out += t.sites
        return out

    def apply(self, files, target, site=None):
        return self._transform(files, target, _RmsNorm, site)


# --- L2: hand-written attention -> SDPA / npu_fusion_attention -------------------------------

def _matmul_operands(node):
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
        return node.left, node.right
    if isinstance(node, cst.Call) and _call_name(node) in ("matmul", "bmm") and len(node.args) == 2:
        return node.args[0].value, node.args[1].value
    return None


def _transposed_last_two(node):
    """K for K.transpose(-2, -1) / K.transpose(-1, -2) / K.mT."""
    if isinstance(node, cst.Call) and _call_name(node) == "transpose" and isinstance(node.func, cst.Attribute):
        dims = sorted(_num(a.value) for a in node.args)
        if dims in ([-2, -1], [2, 3]):
            return node.func.value
    if isinstance(node, cst.Attribute) and node.attr.value == "mT":
        return node.value
    return None


def _find_matmul_of(expr, name: str):
    """The matmul node inside expr whose left operand is Name(name), if any."""
    found = []

    class V(cst.CSTVisitor):
        def on_visit(self, node):
            ops = _matmul_operands(node) if isinstance(node, (cst.BinaryOperation, cst.Call)) else None
            if ops and m.matches(ops[0], m.Name(name)) and not found:
                found.append(node)
            return not found

    expr.visit(V())
    return found[0] if found else None


class _ReplaceNode(cst.CSTTransformer):
    def __init__(self, target, replacement):
        super().__init__()
        self.target, self.replacement = target, replacement

    def on_leave(self, original, updated):
        return self.replacement if original is self.target else updated


class _Attention(_SiteTransformer):
    """Find, in one function body: S = (Q @ K^T) [*|/] s ; S = S.masked_fill(mask, -inf) ;
    P = softmax(S, -1) ; Y = P @ V. Replace those statements by one fused call."""

    def leave_FunctionDef(self, original, updated):
        qual = self.qual(original.name.value)
        if self.only and qual != self.only:
            return updated
        stmts = list(updated.body.body)
        simple = [(i, s.body[0]) for i, s in enumerate(stmts)
                  if m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])]))]
        for k, (i, a) in enumerate(simple):
            got = self._scores(a.value)
            if got is None:
                continue
            q, kk, scale = got
            scores = a.targets[0].target.value
            rest = simple[k + 1:]
            mask_idx = soft_idx = out_idx = None
            mask_expr = None
            cur = scores
            for j, b in rest:
                val = b.value
                name = _call_name(val)
                if mask_idx is None and name == "masked_fill" and isinstance(val.func, cst.Attribute) \
                        and m.matches(val.func.value, m.Name(cur)):
                    fill = val.args[1].value if len(val.args) > 1 else None
                    if not (isinstance(fill, cst.Call) and "inf" in code(fill)) and "inf" not in code(fill or cst.Name("x")):
                        break
                    mask_expr, mask_idx, cur = val.args[0].value, j, b.targets[0].target.value
                elif soft_idx is None and name == "softmax" and self._is_softmax_of(val, cur):
                    soft_idx, cur = j, b.targets[0].target.value
                elif soft_idx is not None and _find_matmul_of(val, cur) is not None:
                    out_idx = j
                    v = _matmul_operands(_find_matmul_of(val, cur))[1]
                    break
                elif soft_idx is not None and b.targets[0].target.value == cur:
                    break  # the probabilities are transformed (dropout, ...) before use
            if mask_idx is None or soft_idx is None or out_idx is None:
                continue
            if "dropout" in "".join(code(stmts[x]) for x in range(i, out_idx + 1)):
                continue
            q_s, k_s, v_s = code(q).strip(), code(kk).strip(), code(v).strip()
            scale_s = code(scale).strip() if scale is not None else "None"
            if self.target == "npu":
                call = (f"torch_npu.npu_fusion_attention({q_s}, {k_s}, {v_s}, {q_s}.size(1), 'BNSD', "
                        f"atten_mask=torch.triu(torch.ones({q_s}.size(-2), {k_s}.size(-2), dtype=torch.bool, "
                        f"device={q_s}.device), diagonal=1), scale={scale_s if scale is not None else '1.0'}, "
                        f"sparse_mode=0)[0]")
                self.imports.append("import torch_npu")
            else:
                call = (f"torch.nn.functional.scaled_dot_product_attention("
                        f"{q_s}, {k_s}, {v_s}, is_causal=True, scale={scale_s})")
            self.sites.append(Site(file=self.rel, qualname=qual, text=code(stmts[i]).strip()))
            out_stmt = stmts[out_idx]
            target_mm = _find_matmul_of(out_stmt.body[0].value, cur)
            out_stmt = out_stmt.visit(_ReplaceNode(target_mm, cst.parse_expression(call)))
            new_stmts = stmts[:i] + [
                s for x, s in enumerate(stmts[i + 1: out_idx], start=i + 1) if x not in (mask_idx, soft_idx)
            ] + [out_stmt] + stmts[out_idx + 1:]
            self._mask_text = code(mask_expr)
            return updated.with_changes(body=updated.body.with_changes(body=new_stmts))
        return updated

    @staticmethod
    def _is_softmax_of(val: cst.Call, name: str) -> bool:
        f = val.func
        if isinstance(f, cst.Attribute) and m.matches(f.value, m.Name(name)):
            dims = [a.value for a in val.args if a.keyword is None] + [a.value for a in val.args if a.keyword and a.keyword.value == "dim"]
        else:
            if not val.args or not m.matches(val.args[0].value, m.Name(name)):
                return False
            dims = [a.value for a in val.args[1:] if a.keyword is None] + [a.value for a in val.args if a.keyword and a.keyword.value == "dim"]
        return bool(dims) and _num(dims[0]) == -1

    @staticmethod
    def _scores(expr):
        scale = None
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.Multiply, cst.Divide)):
            for mm, other in ((expr.left, expr.right), (expr.right, expr.left)):
                mm = mm.with_changes(lpar=[], rpar=[]) if hasattr(mm, "lpar") else mm
                ops = _matmul_operands(mm)
                if ops and (isinstance(expr.operator, cst.Multiply) or mm is not expr.right):
                    kk = _transposed_last_two(ops[1])
                    if kk is None:
                        continue
                    o = code(other).strip()
                    scale = cst.parse_expression(o) if isinstance(expr.operator, cst.Multiply) else cst.parse_expression(f"1.0 / ({o})")
                    return ops[0], kk, scale
            return None
        ops = _matmul_operands(expr)
        if ops and _transposed_last_two(ops[1]) is not None:
            return ops[0], _transposed_last_two(ops[1]), cst.parse_expression("1.0")
        return None


class AttentionRecipe(Recipe):
    """softmax(Q K^T * s + causal mask) V materialises a T x T score tensor per head and
    launches ~6 kernels forward and more backward; the fused attention operator does it in
    one (flash attention on CPU/CUDA, npu_fusion_attention on Ascend: mask True = masked,
    scale passed explicitly since its default is 1)."""

    def find(self, files, target):
        out = []
        for rel, text in files.items():
            if rel.endswith(".py") and ("softmax" in text):
                t = _Attention(rel, target, None)
                cst.parse_module(text).visit(t)
                out += t.sites
        return out

    def apply(self, files, target, site=None):
        return self._transform(files, target, _Attention, site)


# --- L2: fused / foreach optimizers ----------------------------------------------------------

_OPTIMIZERS = {"AdamW", "Adam", "SGD", "RMSprop", "Adagrad"}


class _FusedOpt(_SiteTransformer):
    def leave_Call(self, original, updated):
        f = original.func
        if not (m.matches(f, m.Attribute(value=m.Attribute(attr=m.Name("optim")))) and f.attr.value in _OPTIMIZERS):
            return updated
        if _kw(original, "fused") is not None or _kw(original, "foreach") is not None:
            return updated
        self.sites.append(Site(file=self.rel, qualname=".".join(self.scope) or "<module>", text=code(original)[:200]))
        if self.target == "npu" and f.attr.value in ("AdamW", "Adam", "SGD"):
            self.imports.append("import torch_npu")
            return updated.with_changes(func=cst.parse_expression(f"torch_npu.optim.NpuFused{f.attr.value}"))
        kw = "fused" if f.attr.value in ("AdamW", "Adam", "SGD") else "foreach"
        return updated.with_changes(args=[*updated.args, cst.Arg(keyword=cst.Name(kw), value=cst.Name("True"),
                                                              equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))])


class FusedOptimizerRecipe(Recipe):
    """The default optimizer loops over parameters, ~10 kernels each; the fused kernel
    updates all parameters in one pass. On npu, NpuFused* optimizers (caveat: they reject
    zero_grad(set_to_none=True) on the optimizer)."""

    def find(self, files, target):
        out = []
        for rel, text in files.items():
            if rel.endswith(".py") and "optim." in text:
                t = _FusedOpt(rel, target, None)
                cst.parse_module(text).visit(t)
                out += t.sites
        return out

    def apply(self, files, target, site=None):
        return self._transform(files, target, _FusedOpt)


# --- L4: selective torch.compile of one function ---------------------------------------------

_COMPILE_HINTS = ("newtonschulz", "zeropower", "rotary", "rope", "norm", "mlp", "swiglu", "gelu", "softcap", "loss")


class _Compile(_SiteTransformer):
    def __init__(self, rel, target, site, enumerate_only=False):
        super().__init__(rel, target, site)
        self.enumerate_only = enumerate_only

    def leave_FunctionDef(self, original, updated):
        qual = self.qual(original.name.value)
        if any("compile" in code(d.decorator) for d in original.decorators):
            return updated
        if self.only is not None and qual != self.only:
            return updated
        name = qual.lower()
        eligible = any(h in name for h in _COMPILE_HINTS) or (qual.endswith(".forward") and any(
            h in name for h in ("mlp", "norm", "rotary")))
        if not eligible or "step" in name.split(".")[-1] or name.split(".")[-1] in ("__init__", "main"):
            return updated
        self.sites.append(Site(file=self.rel, qualname=qual, text=f"def {original.name.value}(...)"))
        if self.enumerate_only:
            return updated
        backend = '"npu"' if self.target == "npu" else '"inductor"'
        dec = cst.Decorator(decorator=cst.parse_expression(f"torch.compile(backend={backend}, dynamic=False)"))
        return updated.with_changes(decorators=[*updated.decorators, dec])


class CompileRegionRecipe(Recipe):
    """torch.compile of exactly one supernode's function (Inductor on cpu/cuda, the npu
    backend on Ascend): fuses its elementwise chain into one kernel, leaving the rest eager."""

    def find(self, files, target):
        out = []
        for rel, text in files.items():
            if rel.endswith(".py"):
                t = _Compile(rel, target, None, enumerate_only=True)
                cst.parse_module(text).visit(t)
                out += t.sites
        return out

    def apply(self, files, target, site=None):
        if site is None:
            sites = self.find(files, target)
            if not sites:
                return NotApplicable(reason="no function to compile")
            site = sites[0].qualname
        return self._transform(files, target, lambda rel, tg, s: _Compile(rel, tg, site), site)


RECIPES: dict[str, Recipe] = {r.name: r for r in [
    AutocastRecipe("autocast_reapply", "precision", "L0", "porting_artifact", {"cpu", "npu"},
                   "point the GPU program's bf16 autocast at the target device"),
    AttentionRecipe("sdpa_attention", "attention", "L2", "fusion", {"cpu", "cuda", "npu"},
                    "replace hand-written causal softmax attention by the fused attention operator"),
    RmsNormRecipe("rms_norm_fused", "rms_norm", "L2", "fusion", {"cpu", "cuda", "npu"},
                  "replace hand-written RMSNorm by the fused RMSNorm operator"),
    FusedOptimizerRecipe("fused_optimizer", "optimizer_update", "L2", "fusion", {"cpu", "cuda", "npu"},
                         "use the fused multi-tensor optimizer kernel instead of the per-parameter loop"),
    CompileRegionRecipe("compile_region", "compile_region", "L4", "fusion", {"cpu", "cuda", "npu"},
                        "torch.compile exactly one supernode function", per_site=True),
]}


def recipes_for(pattern: str, target: str) -> list[Recipe]:
    return [r for r in RECIPES.values() if r.pattern == pattern and target in r.targets]
