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

from .cstutil import (Positions, Ref, call_name, code, defines, dotted, ensure_imports, expr, is_module_call, kwarg,
                      load_names, method_receiver, module_aliases, num, parens, positional, strip_parens, walk,
                      iter_functions, assigned_names, function_params, Edits)
from .expr_engine import Env, ExprRecipe, Match
from .recipe_base import NotApplicable, Recipe, Site, shorten

_IMPURE_CALLS = {"print", "print0", "open", "input", "item", "tolist", "backward", "step", "zero_grad", "save", "load",
                 "numpy", "cpu", "synchronize", "barrier", "all_reduce", "broadcast", "exit", "sleep", "perf_counter",
                 "time", "register_buffer", "register_parameter"}


def _tensor_work(fn: cst.FunctionDef) -> int:
    n = 0
    for node in walk(fn.body):
        if isinstance(node, cst.BinaryOperation) and not isinstance(node.operator, (cst.BitOr, cst.BitAnd)):
            n += 1
        elif isinstance(node, cst.Call):
            d = dotted(node.func) or ""
            if d.startswith(("torch.", "F.")) or isinstance(node.func, cst.Attribute):
                n += 1
    return n


def compile_ineligible(fi, module: cst.Module) -> str | None:
    """Why a function is not a compile region candidate (None: it is one)."""
    fn, q = fi.node, fi.qualname
    last = q.split(".")[-1]
    if fi.parent_function is not None:
        return "nested function"
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
        if isinstance(node, cst.While):
            return "contains a while loop"
        if isinstance(node, cst.For):
            it = node.iter
            if not (isinstance(it, cst.Call) and call_name(it) == "range"):
                return "loops over something other than range(n)"
    if _tensor_work(fn) < 2:
        return "too little tensor work to be worth a graph"
    return None


class CompileRegionRecipe(Recipe):
    def _decorator(self, target: str) -> str:
        if target == "npu":
            return 'torch.compile(backend="npu", dynamic=False)'
        return "torch.compile(dynamic=False)"

    def _find_file(self, rel, text, target):
        pos = Positions(text)
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
        pos = Positions(text)
        want = {s.qualname for s in sites}
        edits, done = Edits(), []
        for fi in iter_functions(pos.module):
            if fi.qualname in want:
                dec = cst.Decorator(decorator=expr(self._decorator(target)))
                edits.sub(fi.node, fi.node.with_changes(decorators=[*fi.node.decorators, dec]))
                done.extend(s for s in sites if s.qualname == fi.qualname)
        module = edits.apply(pos.module)
        module = ensure_imports(module, ["import torch"] + (["import torch_npu"] if target == "npu" else []))
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
            new = expr(f"torch_npu.npu_cross_entropy_loss({code(pos[0])}, {code(pos[1])}{extra})[0]")
            return Match(node=node, new=new, used=set(), imports=["import torch_npu"],
                         notes=["npu_cross_entropy_loss: input [N, C], targets int64 [N]; returns (loss, log_prob, "
                                "zloss, lse), the loss first; the tanh softcap stays eager (compile_region covers it)"],
                         detail={"softcap": code(sc_ref.node), "form": "npu_cross_entropy_loss"})
        return self._compiled(node, env, here, used, logits_ref, cap_ref, sc_ref)

    def _compiled(self, node, env, here, used, logits_ref, cap_ref, sc_ref):
        scope = env.scope
        # the helper's body: the loss call with every name on the path to the softcap inlined,
        # the softcap itself written over the helper's parameters
        sc_node = strip_parens(sc_ref.node)
        path = _path_inline(here, scope, sc_node, used)
        if path is None:
            return None
        body_expr = path
        module_names = assigned_names(env.module)
        free = [n for n in dict.fromkeys(load_names(body_expr)) if n not in ("logits", "cap") and n not in module_names
                and n not in _BUILTINS]
        # where the call site reads logits/cap/free names: they must mean at the loss statement what
        # they meant where the chain read them, once the chain's assignments are deleted
        deleted = {k for k in used}
        for ref, names in ((logits_ref, load_names(logits_ref.node)), (cap_ref, load_names(cap_ref.node))):
            if not _stable(names, ref, here, deleted):
                return None
        name = "_tb_softcap_cross_entropy"
        params = ", ".join(["logits", "cap", *free])
        helper = (f"\n\n@torch.compile(dynamic=False)\ndef {name}({params}):\n"
                  f'    """Softcap + cross-entropy as one compiled region (trainbridge softcap_ce_fused)."""\n'
                  f"    return {code(body_expr)}\n")
        args = ", ".join([code(logits_ref.node), code(cap_ref.node), *free])
        return Match(node=node, new=expr(f"{name}({args})"), used=used, helpers=[(name, helper)],
                     notes=["softcap and loss compiled together (Inductor); the first call per shape compiles"],
                     detail={"softcap": code(sc_node), "form": "compiled helper", "free": ", ".join(free)})

    def _rewrite_file(self, rel, text, target, sites):
        out = super()._rewrite_file(rel, text, target, sites)
        new_text, done, notes = out
        if not done or target == "npu":
            return out
        # the chain's assignments must all be gone: otherwise the softcap is computed twice
        mod = cst.parse_module(new_text)
        for fi in iter_functions(mod):
            if fi.qualname in {s.qualname for s in done}:
                if any(isinstance(n, cst.Call) and call_name(n) == "tanh" for n in walk(fi.node.body)):
                    return NotApplicable(reason="softcap_ce_fused: the softcapped logits are also used outside the "
                                                "loss; compiling the loss alone would compute the softcap twice")
        return out

    def _no_site_reason(self, files, target):
        extra = " with a [N, C] (.view(-1, C)) input" if target == "npu" else ""
        return f"softcap_ce_fused: no F.cross_entropy of c * tanh(logits / c){extra} found"


_BUILTINS = set(dir(builtins))


def _path_inline(ref: Ref, scope, sc_node, used: set):
    """The expression at ref with names leading to the softcap inlined; the softcap as
    `cap * torch.tanh(logits / cap)`. None if the softcap is not reached."""
    reached = []

    def rec(r: Ref, depth=0):
        if depth > 10:
            return r.node
        node = r.node
        if strip_parens(node) is sc_node or node is sc_node:
            reached.append(True)
            return expr("(cap * torch.tanh(logits / cap))")
        targets = {}
        for n in _names(node):
            hit = r.scope.lookup(n.value, r.at)
            if hit is None or hit[0].value is None:
                continue
            d, sc = hit
            if (id(sc), d.index) not in used:
                continue
            targets[id(n)] = parens(rec(Ref(d.value, sc, d.index), depth + 1))
        # the softcap may also be nested directly in this expression
        inner = _find_identity(node, sc_node)
        if inner is not None:
            reached.append(True)
            targets[id(inner)] = expr("(cap * torch.tanh(logits / cap))")
        if not targets:
            return node
        from .cstutil import _ReplaceIds
        return node.visit(_ReplaceIds(targets))

    out = rec(ref)
    return out if reached else None


def _names(node):
    from .cstutil import load_name_nodes
    return load_name_nodes(node)


def _find_identity(node, target):
    for n in walk(node):
        if n is target and n is not node:
            return n
    return None


def _stable(names, ref: Ref, here: Ref, deleted: set) -> bool:
    """Names read at ref still mean the same at `here` once the `deleted` assignments are gone."""
    if ref.scope is not here.scope:
        return False
    for n in names:
        for d in ref.scope.defs.get(n, []):
            if ref.at <= d.index < here.at and (id(ref.scope), d.index) not in deleted:
                return False
    return True
