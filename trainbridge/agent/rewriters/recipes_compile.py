"""compile_region (L4) and softcap_ce_fused (L4 on cpu/cuda, L2 on npu).

compile_region: `@torch.compile` on exactly one function or method, the source region of one
supernode (a qualname from the evidence, or one of `find`'s candidates): cpu/cuda with the
default Inductor backend, npu with `backend="npu"` (torchair's backend, registered by
torch_npu; `torchair.get_npu_backend(compiler_config=...)` is the configurable spelling).
Always `dynamic=False`: shapes in a training step are static, and a dynamic graph would
trade the fusion for shape guards. Candidates are pure tensor functions: no prints, I/O,
`.item()`, `.backward()`, optimizer steps, generators, Python loops other than
`for _ in range(n)` (unrolled), nor loops over a layer list (compiling the whole model at
once was slower or ran out of memory in the public record). Optimizer math such as Muon's
Newton-Schulz iteration is a candidate; optimizer `step` methods are not (Python loops over
parameters recompile per shape). Each distinct input shape compiles once (recompile limit 8).

softcap_ce_fused: `c * tanh(logits / c)` followed (through casts and views) by
`F.cross_entropy`. cpu/cuda: the softcap, the casts and the loss move into one module-level
function compiled with Inductor, so tanh, division, multiply, log-softmax and NLL fuse (and
the fp32 copy of the logits is never materialised in eager); the call site passes the
un-capped logits. npu: `torch_npu.npu_cross_entropy_loss(x, y, reduction=..., ignore_index=...,
label_smoothing=...)[0]` replaces `F.cross_entropy` after the (unchanged) softcap; its input must
be [N, C] (a `.view(-1, C)` / `.reshape(-1, C)` is required), targets int64 [N]; it returns
(loss, log_prob, zloss, lse), the loss first.
"""

from __future__ import annotations

import builtins

import libcst as cst
import libcst.matchers as m

from ...pysource.edits import Edits
from ...pysource.imports import ensure_imports
from ...pysource.names import assigned_names, load_names
from ...pysource.scope import Ref
from ...pysource.shapes import (
    call_name,
    dotted,
    is_module_call,
    kwarg,
    method_receiver,
    num,
    positional,
    strip_parens,
)
from ...pysource.sites import iter_functions, positions
from ...pysource.syntax import code, expr, walk
from ...targets.registry import target_spec
from .expr_engine import Env, ExprRecipe, Match
from .recipe_base import NotApplicable, Recipe, Site

_IMPURE_CALLS = {"print", "print0", "open", "input", "item", "tolist", "backward", "step", "zero_grad", "save", "load",
                 "numpy", "cpu", "synchronize", "barrier", "all_reduce", "broadcast", "exit", "sleep", "perf_counter",
                 "time", "register_buffer", "register_parameter"}


_TENSOR_METHODS = {"pow", "square", "mean", "sum", "rsqrt", "sqrt", "softmax", "log_softmax", "masked_fill", "transpose",
                   "view", "reshape", "relu", "gelu", "silu", "tanh", "sigmoid", "exp", "log", "float", "bfloat16",
                   "half", "type_as", "norm", "lerp", "lerp_", "add", "add_", "mul", "mul_", "div", "matmul", "bmm",
                   "mm", "addmm", "baddbmm", "cat", "stack", "chunk", "split", "unbind", "roll", "flip", "permute",
                   "contiguous", "clamp", "abs", "neg", "cos", "sin", "triu", "tril", "outer", "einsum", "where",
                   "max", "min", "amax", "rms_norm", "layer_norm", "scaled_dot_product_attention", "cross_entropy",
                   "dropout", "linear", "embedding", "addcmul", "addcdiv", "sign", "reciprocal", "unsqueeze",
                   "squeeze", "expand", "mT", "T"}


# names of the supernode regions the evidence clusters into (docs/method.md): always candidates
_REGION_HINTS = ("newtonschulz", "zeropower", "rotary", "rope", "norm", "mlp", "swiglu", "gelu", "softcap",
                 "attention", "attn", "polar")
_RANDOM_CALLS = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "dropout",
                 "bernoulli", "bernoulli_", "multinomial", "normal_", "uniform_", "Generator", "manual_seed"}


def _tensor_work(fn: cst.FunctionDef) -> int:
    """How many tensor operations a function body spells (matmuls, torch./F. ops, tensor methods)."""
    n = 0
    for node in walk(fn.body):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
            n += 1
        elif isinstance(node, cst.Call):
            d = dotted(node.func) or ""
            name = call_name(node) or ""
            if d.startswith(("torch.optim", "torch.nn.", "nn.", "torch.device", "torch.distributed")):
                continue
            if d.startswith(("torch.", "F.")) or (name in _TENSOR_METHODS and isinstance(node.func, cst.Attribute)
                                                  and not d.startswith("math.")):
                n += 1  # a torch function or a tensor method (a builtin max()/abs() is not tensor work)
            elif m.matches(node.func, m.Attribute(value=m.Name("self"))):
                n += 1  # a submodule call inside an nn.Module method (self.conv1(x))
    return n


def compile_ineligible(fi, module: cst.Module) -> str | None:
    """Why a function is not a compile region candidate (None: it is one)."""
    fn, q = fi.node, fi.qualname
    last = q.split(".")[-1]
    if fi.parent_function is not None:
        return "nested function"
    if last.startswith("_tb_"):
        return "a helper another recipe inserted"
    if last in ("__init__", "main", "step", "zero_grad", "__repr__", "extra_repr") or last.startswith("__"):
        return f"{last} is not a tensor region"
    if fi.class_def is not None:
        bases = " ".join(code(b.value) for b in fi.class_def.bases)
        if "Module" not in bases:
            return "method of a class that is not an nn.Module"
    for d in fn.decorators:
        t = code(d.decorator)
        if "compile" in t or "property" in t or "staticmethod" in t or "classmethod" in t or "jit" in t:
            return f"decorated with {t}"
    for node in walk(fn.body):
        if isinstance(node, (cst.Yield, cst.Global, cst.Nonlocal, cst.Try, cst.Raise, cst.Await)):
            return f"contains {type(node).__name__.lower()}"
        if isinstance(node, cst.Call) and call_name(node) in _IMPURE_CALLS:
            return f"calls {call_name(node)}()"
        if isinstance(node, cst.Call) and call_name(node) in _RANDOM_CALLS:
            return f"draws random numbers ({call_name(node)}): a compiled graph changes the random stream"
        if isinstance(node, cst.While):
            return "contains a while loop"
        if isinstance(node, cst.For):
            it = node.iter
            if not (isinstance(it, cst.Call) and call_name(it) == "range"):
                return "loops over something other than range(n)"
    if any(h in q.lower() for h in _REGION_HINTS):
        return None
    if _tensor_work(fn) < 2:
        return "too little tensor work to be worth a graph"
    return None


class CompileRegionRecipe(Recipe):
    def _decorator(self, target: str) -> str:
        if target == "npu":
            return 'torch.compile(backend="npu", dynamic=False)'
        return "torch.compile(dynamic=False)"

    def _find_file(self, rel, text, target):
        pos = positions(text)
        out = []
        for fi in iter_functions(pos.module):
            if compile_ineligible(fi, pos.module) is None:
                out.append(Site(file=rel, qualname=fi.qualname, line=pos.line(fi.node), end_line=pos.end_line(fi.node),
                                text=f"def {fi.node.name.value}({code(fi.node.params)[:80]})",
                                detail={"tensor_ops": str(_tensor_work(fi.node))}))
        return out

    def apply(self, files, target, sites=None, *, protected=None):
        if sites is None:
            found = self.find(files, target, protected=protected)
            return NotApplicable(reason="compile_region compiles exactly one region: name it (one of "
                                        f"{[s.qualname for s in found]})")
        spec = [sites] if isinstance(sites, (str, Site)) else list(sites)
        if len(spec) != 1:
            return NotApplicable(reason=f"compile_region compiles exactly one region, got {len(spec)}")
        want = spec[0]
        qual = want if isinstance(want, str) else want.qualname
        found = self.find(files, target, protected=protected)
        if not any(s.qualname == qual for s in found):
            why = self._why_not(files, qual)
            return NotApplicable(reason=f"compile_region: {qual!r} is not a compile candidate ({why})")
        return super().apply(files, target, [s for s in found if s.qualname == qual][:1], protected=protected)

    def _why_not(self, files, qual) -> str:
        for rel, text in files.items():
            if not rel.endswith(".py"):
                continue
            mod = cst.parse_module(text)
            for fi in iter_functions(mod):
                if fi.qualname == qual:
                    return compile_ineligible(fi, mod) or "excluded by the protected regions"
        return "no such function"

    def _rewrite_file(self, rel, text, target, sites):
        pos = positions(text)
        want = {s.qualname for s in sites}
        edits, done = Edits(), []
        for fi in iter_functions(pos.module):
            if fi.qualname in want:
                dec = cst.Decorator(decorator=expr(self._decorator(target)))
                edits.sub(fi.node, fi.node.with_changes(decorators=[*fi.node.decorators, dec]))
                done.extend(s for s in sites if s.qualname == fi.qualname)
        module = edits.apply(pos.module)
        module = ensure_imports(module, ["import torch", *target_spec(target).runtime_imports])
        notes = [f"compiles {', '.join(sorted(want))} only; first call per input shape pays the compile "
                 "(excluded by the harness's warm-up steps)"]
        if target == "cpu":
            notes.append("Inductor on cpu needs a C++ compiler at run time")
        return module.code, done, notes

    def _no_site_reason(self, files, target):
        return "compile_region: no pure tensor function or nn.Module method found"


# --------------------------------------------------------------- softcap + CE ----

def _tanh_arg(ref: Ref, used: set):
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if isinstance(n, cst.Call) and call_name(n) == "tanh":
        recv = method_receiver(n, {"tanh"})
        if recv is not None and not n.args:
            return r.with_node(recv)
        if is_module_call(n, {"tanh"}) and len(n.args) == 1:
            return r.with_node(n.args[0].value)
    return None


def softcap_of(ref: Ref, used: set):
    """(logits_ref, cap_ref, sc_ref) for cap * tanh(logits / cap) (either factor order)."""
    r = ref.scope.follow(ref, used)
    n = strip_parens(r.node)
    if not (isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Multiply)):
        return None
    for c, t in ((n.left, n.right), (n.right, n.left)):
        trial = set()
        inner = _tanh_arg(r.with_node(t), trial)
        if inner is None:
            continue
        d = inner.scope.follow(inner, trial)
        dn = strip_parens(d.node)
        if isinstance(dn, cst.BinaryOperation) and isinstance(dn.operator, cst.Divide) and \
                r.scope.same(d.with_node(dn.right), r.with_node(c)):
            used |= trial
            return d.with_node(dn.left), r.with_node(c), r
    return None


_SHAPING = {"view", "reshape", "float", "flatten", "contiguous", "to", "type_as", "bfloat16", "half", "double"}


def loss_input_chain(ref: Ref, used: set):
    """Follow the loss input through casts/views to a softcap: (softcap_match, two_d)."""
    two_d = False
    r = ref
    for _ in range(8):
        r = r.scope.follow(r, used)
        n = strip_parens(r.node)
        if isinstance(n, cst.Call) and method_receiver(n, _SHAPING) is not None:
            name = call_name(n)
            pos = positional(n)
            if name in ("view", "reshape") and len(pos) == 2 and num(pos[0]) == -1:
                two_d = True
            if name == "flatten" and (len(pos) == 2 and num(pos[0]) == 0 and num(pos[1]) in (-2, 1)
                                      or num(kwarg(n, "end_dim")) == -2):
                two_d = True
            r = r.with_node(n.func.value)
            continue
        break
    sc = softcap_of(r, used)
    return sc, two_d


class SoftcapCrossEntropyRecipe(ExprRecipe):
    def match(self, node, env: Env):
        if not (isinstance(node, cst.Call) and is_module_call(node, {"cross_entropy"})):
            return None
        pos = positional(node)
        if len(pos) != 2 or any(a.star for a in node.args):
            return None
        here = env.ref(node)
        used: set = set()
        sc, two_d = loss_input_chain(here.with_node(pos[0]), used)
        if sc is None:
            return None
        logits_ref, cap_ref, sc_ref = sc
        if env.target == "npu":
            if not two_d:
                return None
            kws = {a.keyword.value: code(a.value) for a in node.args if a.keyword is not None}
            if set(kws) - {"reduction", "ignore_index", "label_smoothing", "weight"}:
                return None
            extra = "".join(f", {k}={v}" for k, v in kws.items())
            # the op's loss is shaped [1] for mean/sum (F.cross_entropy's is 0-d): keep the program's shape
            tail = "" if kws.get("reduction", "'mean'").strip("'\"") == "none" else ".reshape(())"
            new = expr(f"torch_npu.npu_cross_entropy_loss({code(pos[0])}, {code(pos[1])}{extra})[0]{tail}")
            return Match(node=node, new=new, used=set(), imports=["import torch_npu"],
                         notes=["npu_cross_entropy_loss: input [N, C], targets int64 [N]; returns (loss, log_prob, "
                                "zloss, lse), the loss first, shaped [1] (reshaped to the 0-d loss F.cross_entropy "
                                "returned); the tanh softcap stays eager (compile_region covers it)"],
                         detail={"softcap": code(sc_ref.node), "form": "npu_cross_entropy_loss"})
        return self._compiled(node, env, here, used, logits_ref, cap_ref, sc_ref)

    def _compiled(self, node, env, here, used, logits_ref, cap_ref, sc_ref):
        """Move the softcap's statements and the loss into one compiled module-level function.

        The chain is every assignment the match followed, from the softcap's statement to the
        loss's statement, all in the loss's block; they move verbatim into the helper (which
        returns the loss call), and the call site passes the names the chain read first.
        """
        scope = here.scope
        if sc_ref.scope is not scope or any(k[0] != id(scope) for k in used):
            return None
        chain_idx = sorted(i for _, i in used if sc_ref.at <= i < here.at)
        if sc_ref.at not in chain_idx:
            return None
        chain = [scope.stmts[i] for i in chain_idx]
        for s in chain:
            if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and isinstance(s.body[0], cst.Assign)):
                return None
        written = set().union(*(assigned_names(s) for s in chain))
        # nothing outside the chain may read what the chain writes (between it, or after the loss)
        for i, s in enumerate(scope.stmts):
            if i in chain_idx or i < sc_ref.at:
                continue
            reads = set(load_names(s))
            if i == here.at:
                reads = set(load_names(_without(s, node)))
            if reads & written:
                return None
        body_src = [code(s) for s in chain] + [f"return {code(node)}"]
        params, seen = [], set()
        module_names = assigned_names(env.module)
        for text in body_src:
            piece = cst.parse_statement(text + "\n")
            reads = load_names(piece)
            for n in reads:
                if n not in seen and n not in params and n not in module_names and n not in _BUILTINS:
                    params.append(n)
            seen |= assigned_names(piece)
        # the names passed must mean at the loss statement what they meant where the chain read them
        deleted = {(id(scope), i) for i in chain_idx}
        if not _stable(params, Ref(sc_ref.node, scope, sc_ref.at), here, deleted):
            return None
        name = "_tb_softcap_cross_entropy"
        body = "\n".join("    " + line for t in body_src for line in t.splitlines())
        helper = (f"\n\n@torch.compile(dynamic=False)\ndef {name}({', '.join(params)}):\n"
                  f'    """Logit softcap + cross-entropy as one compiled region (trainbridge softcap_ce_fused)."""\n'
                  f"{body}\n")
        return Match(node=node, new=expr(f"{name}({', '.join(params)})"), used=set(), helpers=[(name, helper)],
                     stmt_edits=[(s, None) for s in chain],
                     notes=["softcap and loss compiled together (Inductor): tanh, div, mul, the fp32 cast, "
                            "log-softmax and NLL fuse; the first call per shape compiles"],
                     detail={"softcap": code(strip_parens(sc_ref.node)), "form": "compiled helper",
                             "params": ", ".join(params)})

    def _rewrite_file(self, rel, text, target, sites):
        out = super()._rewrite_file(rel, text, target, sites)
        new_text, done, notes = out
        if not done or target == "npu":
            return out
        # the chain's assignments must all be gone: otherwise the softcap is computed twice
        mod = cst.parse_module(new_text)
        for fi in iter_functions(mod):
            if fi.qualname in {s.qualname for s in done}:
                if fi.qualname != "_tb_softcap_cross_entropy" and any(
                        isinstance(n, cst.Call) and call_name(n) == "tanh" for n in walk(fi.node.body)):
                    return NotApplicable(reason="softcap_ce_fused: the softcapped logits are also used outside the "
                                                "loss; compiling the loss alone would compute the softcap twice")
        return out

    def _no_site_reason(self, files, target):
        extra = " with a [N, C] (.view(-1, C)) input" if target == "npu" else ""
        return f"softcap_ce_fused: no F.cross_entropy of c * tanh(logits / c){extra} found"


_BUILTINS = set(dir(builtins))


def _without(stmt_node, call):
    """The statement with `call` replaced by a placeholder (to see what else it reads)."""
    from ...pysource.scope import _ReplaceIds
    return stmt_node.visit(_ReplaceIds({id(call): cst.Name("_tb_placeholder")}))


def _stable(names, ref: Ref, here: Ref, deleted: set) -> bool:
    """Names read at ref still mean the same at `here` once the `deleted` assignments are gone."""
    if ref.scope is not here.scope:
        return False
    for n in names:
        for d in ref.scope.defs.get(n, []):
            if ref.at <= d.index < here.at and (id(ref.scope), d.index) not in deleted:
                return False
    return True
