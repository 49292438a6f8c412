"""Recognise patterns by the dataflow of the post-grad ATen graph, not by how the source spells them.

The kernel-level recogniser (`recognize`) looks at the set of ops one Inductor kernel fused and
at the words on its lines; a program that names its scores `w` and has no mask, or whose
products Inductor left in library calls apart from the softmax, shows it little. The captured
graph says more: which node reads which. Here each pattern is a walk over those edges:

- **attention**: a softmax (ATen's, or written out: exp over a max-shifted input divided by its
  sum) whose input reaches a matrix product (bmm / mm / baddbmm / addmm / matmul: einsum and `@`
  arrive as these) through scaling, masking, casts and views only, and whose output reaches
  another matrix product through views, casts and dropout only. Roles come with it: the scale
  (a number multiplied or divided in, or baddbmm's alpha), the mask (where / masked_fill /
  an added tensor), dropout, an upcast.
- **rms_norm**: rsqrt of (mean of x squared [+ eps]) multiplied back into x.
- **layer_norm**: rsqrt/sqrt of a variance (var, var_mean, or the mean of squared deviations
  from the mean) [+ eps], applied to the deviations.
- **gelu**: tanh of an input built with 0.044715 (tanh form) or erf of x/sqrt(2) (erf form).

A match maps back to source lines through the nodes' provenance (their user stack), so the
spans cover every statement of the computation (first product to second product), which is
what a rewrite replaces. Each registry row with a `graph_signature` has a matcher here, and
the other way round (a test checks). Captures older than the graph's edges match nothing.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterable

from ..aten_ops import MODEL_RANDOM
from .bundle import GraphMatch, SourceLoc, SourceSpan
from .codeparse import short_op
from .raw import RawCapture, RawGraph, RawNode
from .supernodes import spans_from_locs

PRODUCTS = {"bmm", "mm", "baddbmm", "addmm", "matmul", "addbmm", "_scaled_mm"}
LAYOUT = {"view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "clone", "contiguous",
          "squeeze", "unsqueeze", "select", "slice", "alias", "as_strided", "getitem", "_to_copy",
          "convert_element_type", "to", "type_as"}
CONSTANTS = {"full", "full_like", "scalar_tensor", "iota", "arange", "ones", "zeros", "empty", "ones_like",
             "zeros_like", "tril", "triu", "logical_not", "bitwise_not", "ge", "gt", "le", "lt", "eq", "ne",
             "sub", "add", "unsqueeze", "expand", "view", "reshape", "slice", "_to_copy", "convert_element_type",
             "lift_fresh_copy", "abs", "any", "mul", "logical_and", "logical_or"}
# between the first product and the softmax: scaling, masking, the max shift and a softmax's own guards
SCORE_PATH = LAYOUT | {"mul", "div", "add", "sub", "where", "masked_fill", "amax", "prepare_softmax_online",
                       "abs", "ne", "eq", "logical_not", "any", "tanh", "neg", "fill"}
# between the softmax and the second product: casts, views and dropout
PROB_PATH = LAYOUT | {"native_dropout", "mul", "div", "bernoulli", "gt", "lt", "rand", "rand_like",
                      "inductor_random", "inductor_seeds", "inductor_lookup_seed"}
# a model's random draws (aten_ops.MODEL_RANDOM) and the forms they take in a post-grad graph
DROPOUT = MODEL_RANDOM | {"rand", "rand_like", "randn", "randn_like", "inductor_random"}
MAX_SCORE_DEPTH = 14
MAX_PROB_DEPTH = 8
_UPCASTS = {"_to_copy", "convert_element_type"}

Matcher = Callable[["_Graph"], list[GraphMatch]]
MATCHERS: dict[str, Matcher] = {}


def matcher(pattern: str):
    def register(fn: Matcher) -> Matcher:
        MATCHERS[pattern] = fn
        return fn
    return register


class _Graph:
    """One forward graph with its edges both ways."""

    def __init__(self, g: RawGraph):
        self.id, self.nodes = g.id, g.nodes
        self.users: dict[str, list[str]] = defaultdict(list)
        for name, n in g.nodes.items():
            for i in n.inputs:
                self.users[i].append(name)

    def op(self, name: str) -> str:
        n = self.nodes.get(name)
        return short_op(n.target) if n is not None else ""

    def inputs(self, name: str) -> list[str]:
        n = self.nodes.get(name)
        return [i for i in n.inputs if i in self.nodes] if n is not None else []

    def of_op(self, *ops: str) -> Iterable[str]:
        return (name for name in self.nodes if self.op(name) in ops)


def _walk(g: _Graph, start: str, step: Callable[[str], list[str]], through: set[str], stop: set[str],
          depth: int) -> tuple[str | None, list[str]]:
    """Breadth-first from `start` along `step` edges through ops in `through`, to the nearest op in
    `stop`: (that node, the nodes on the way to it)."""
    parent: dict[str, str | None] = {start: None}
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for name in frontier:
            for other in step(name):
                if other in parent:
                    continue
                parent[other] = name
                op = g.op(other)
                if op in stop:
                    path, cur = [], name
                    while cur is not None and cur != start:
                        path.append(cur)
                        cur = parent[cur]
                    return other, path[::-1]
                if op in through:
                    nxt.append(other)
        frontier = nxt
    return None, []


def _softmax_outputs(g: _Graph) -> list[tuple[str, list[str]]]:
    """(the node holding the probabilities, the softmax's own nodes) for every softmax in the graph."""
    out = [(name, [name]) for name in g.of_op("_softmax", "softmax")]
    for name in g.of_op("div"):
        ins = g.inputs(name)
        if len(ins) != 2 or g.op(ins[0]) != "exp":
            continue
        e, s = ins
        own = [e, name]
        if g.op(s) == "sum" and e in g.inputs(s):
            own.append(s)
        elif g.op(s) == "getitem" and any(g.op(p) == "prepare_softmax_online" for p in g.inputs(s)):
            own += [s] + [p for p in g.inputs(s) if g.op(p) == "prepare_softmax_online"]
        else:
            continue
        out.append((name, own))
    return out


@matcher("attention")
def match_attention(g: _Graph) -> list[GraphMatch]:
    found = []
    for probs, own in _softmax_outputs(g):
        first_in = g.inputs(own[0])[0] if g.inputs(own[0]) else None
        if first_in is None:
            continue
        if g.op(first_in) in PRODUCTS:
            first, score_path = first_in, []
        else:
            first, score_path = _walk(g, own[0], g.inputs, SCORE_PATH, PRODUCTS, MAX_SCORE_DEPTH)
        if first is None:
            continue
        second, prob_path = _walk(g, probs, lambda n: g.users.get(n, []), PROB_PATH, PRODUCTS, MAX_PROB_DEPTH)
        if second is None:
            continue
        path = score_path + own + prob_path
        roles = {"first_product": g.op(first), "second_product": g.op(second),
                 "softmax": "aten softmax" if g.op(own[0]) in ("_softmax", "softmax") else "written out"}
        scale = [f"{'x' if g.op(n) == 'mul' else '/'} {v:g}" for n in path if g.op(n) in ("mul", "div")
                 for v in g.nodes[n].scalars if v not in (1.0, -1.0, 0.0)]
        if g.op(first) == "baddbmm":
            scale += [f"alpha {v:g}" for v in g.nodes[first].scalars if v not in (0.0, 1.0)][:1]  # beta is 0 or 1
        if scale:
            roles["scale"] = ", ".join(scale[:2])
        mask_nodes = [n for n in path if g.op(n) == "masked_fill" or (g.op(n) == "where" and _fills(g, n))]
        added = [n for n in path if g.op(n) == "add" and len(g.inputs(n)) == 2]
        if mask_nodes:
            roles["mask"] = g.op(mask_nodes[0])
        elif added:
            roles["mask"] = "added tensor"
        else:
            roles["mask"] = "none"
        if any(g.op(n) in DROPOUT for n in prob_path) or any(
                g.op(u) in DROPOUT for n in prob_path for u in g.inputs(n)):
            roles["dropout"] = "yes"
        if any(g.op(n) in _UPCASTS for n in path):
            roles["casts"] = "yes"
        # the mask's own statement: what feeds a where / masked_fill / add on the path
        mask_src = [i for n in mask_nodes + added for i in g.inputs(n) if i not in path and i != first]
        found.append(_match(g, "attention", [first, *path, second, *mask_src], roles))
    return found


def _fills(g: _Graph, where: str) -> bool:
    """A masking `where`: one of its values is a constant (-inf, finfo.min, 0). The `where` a
    decomposed softmax adds to guard fully masked rows picks between two computed tensors."""
    n = g.nodes[where]
    return bool(n.scalars) or any(g.op(i) in ("full", "full_like", "scalar_tensor") for i in n.inputs[1:])


def _square_of(g: _Graph, name: str) -> str | None:
    """x when `name` computes x squared (pow 2, x * x, square)."""
    n = g.nodes.get(name)
    if n is None:
        return None
    op, ins = g.op(name), n.inputs  # x may be a graph input (a placeholder), not a node of its own
    if op == "pow" and 2.0 in n.scalars and len(ins) == 1:
        return ins[0]
    if op == "mul" and len(ins) == 1 and n.tensor_args == 2:  # x * x: FX lists an input once
        return ins[0]
    if op == "square" and ins:
        return ins[0]
    return None


def _through_eps(g: _Graph, name: str) -> tuple[str, list[float]]:
    """Below an `add(v, eps)`: (v, [eps]); else (name, [])."""
    if g.op(name) == "add" and len(g.inputs(name)) == 1 and g.nodes[name].scalars:
        return g.inputs(name)[0], list(g.nodes[name].scalars)
    return name, []


def _strip_layout(g: _Graph, name: str) -> str:
    while g.op(name) in LAYOUT and len(g.inputs(name)) == 1:
        name = g.inputs(name)[0]
    return name


@matcher("rms_norm")
def match_rms_norm(g: _Graph) -> list[GraphMatch]:
    found = []
    for r in g.of_op("rsqrt"):
        if not g.inputs(r):
            continue
        below, eps = _through_eps(g, g.inputs(r)[0])
        if g.op(below) != "mean" or not g.inputs(below):
            continue
        sq = g.inputs(below)[0]
        x = _square_of(g, sq)
        if x is None:
            continue
        x_root = _strip_layout(g, x)
        if g.op(x_root) == "sub":  # mean of squared deviations: a LayerNorm's variance
            continue
        users = [u for u in g.users.get(r, []) if g.op(u) == "mul"]
        if not users:
            continue
        roles = {"eps": f"{eps[0]:g}" if eps else "none"}
        found.append(_match(g, "rms_norm", [sq, below, *([g.inputs(r)[0]] if eps else []), r, *users], roles))
    return found


@matcher("layer_norm")
def match_layer_norm(g: _Graph) -> list[GraphMatch]:
    found = []
    for r in g.of_op("rsqrt", "sqrt"):
        if not g.inputs(r):
            continue
        below, eps = _through_eps(g, g.inputs(r)[0])
        nodes = [below, r] + ([g.inputs(r)[0]] if eps else [])
        var = below
        if g.op(var) == "getitem" and g.inputs(var) and g.op(g.inputs(var)[0]) == "var_mean":
            var = g.inputs(var)[0]
            nodes.append(var)
        if g.op(var) in ("var", "var_mean"):
            how = "var"
        elif g.op(var) == "mean" and g.inputs(var):
            x = _square_of(g, g.inputs(var)[0])
            if x is None or g.op(_strip_layout(g, x)) != "sub":
                continue
            dev = _strip_layout(g, x)
            nodes += [g.inputs(var)[0], dev, *[i for i in g.inputs(dev) if g.op(i) == "mean"]]
            how = "mean of squared deviations"
        else:
            continue
        users = [u for u in g.users.get(r, []) if g.op(u) in ("mul", "div")]
        if not users:
            continue
        nodes += users
        found.append(_match(g, "layer_norm", nodes, {"variance": how, "eps": f"{eps[0]:g}" if eps else "none"}))
    return found


def _near(v: float, target: float, rel: float = 1e-3) -> bool:
    return abs(v - target) <= rel * abs(target)


def _ancestors(g: _Graph, name: str, depth: int) -> list[str]:
    seen, frontier = [], [name]
    for _ in range(depth):
        frontier = [i for n in frontier for i in g.inputs(n) if i not in seen]
        seen += frontier
    return seen


@matcher("gelu")
def match_gelu(g: _Graph) -> list[GraphMatch]:
    found = []
    for t in g.of_op("tanh"):
        up = _ancestors(g, t, 4)
        if any(_near(v, 0.044715) for n in up for v in g.nodes[n].scalars):
            nodes = [t, *[n for n in up if g.op(n) in ("mul", "add", "pow")]]
            nodes += [u for u in g.users.get(t, []) if g.op(u) in ("add", "mul")]
            found.append(_match(g, "gelu", nodes, {"form": "tanh approximation"}))
    for e in g.of_op("erf"):
        ins = g.inputs(e)
        if not ins:
            continue
        n = g.nodes[ins[0]]
        if (g.op(ins[0]) == "mul" and any(_near(v, 0.70710678) for v in n.scalars)) or (
                g.op(ins[0]) == "div" and any(_near(v, 1.41421356) for v in n.scalars)):
            nodes = [ins[0], e, *[u for u in g.users.get(e, []) if g.op(u) in ("add", "mul")]]
            found.append(_match(g, "gelu", nodes, {"form": "erf"}))
    return found


def _loc(n: RawNode) -> SourceLoc | None:
    return n.stack[-1] if n.stack else None


def _match(g: _Graph, pattern: str, names: list[str], roles: dict[str, str]) -> GraphMatch:
    names = list(dict.fromkeys(n for n in names if n in g.nodes))
    locs = [loc for n in names if (loc := _loc(g.nodes[n])) is not None]
    modules = [m.rsplit(":", 1)[-1] for n in names for m in g.nodes[n].modules[-1:]]
    return GraphMatch(pattern=pattern, graph_id=g.id, nodes=names, ops=[g.op(n) for n in names],
                      spans=spans_from_locs(_one_function(locs)) if locs else [],
                      module=max(set(modules), key=modules.count) if modules else "", roles=roles)


def _one_function(locs: list[SourceLoc]) -> list[SourceLoc]:
    """The lines in the function most of the match's nodes came from (a helper the program calls
    for its mask, say, stays out of the span to rewrite)."""
    fns = [(l.file, l.function) for l in locs]
    best = max(set(fns), key=fns.count)
    return [l for l in locs if (l.file, l.function) == best]


def _library_module(g: _Graph, m: GraphMatch) -> str:
    """torch's module class most of the match's nodes ran in ('torch.nn.modules.activation.GELU'), or ''."""
    libs = [g.nodes[n].library_module for n in m.nodes]
    top = max(set(libs), key=libs.count) if libs else ""
    return top if top and libs.count(top) * 2 > len(libs) else ""


def is_library(m: GraphMatch) -> bool:
    return "library" in m.roles


def match_graphs(raw: RawCapture) -> list[GraphMatch]:
    """Every registered pattern's matches in the capture's forward graphs, in graph order; a
    match with no source line is dropped, as is a second match of the same lines. A match inside
    one of torch's own modules carries the module's class as its `library` role."""
    out: list[GraphMatch] = []
    seen: set[tuple] = set()
    for rg in raw.graphs:
        if rg.phase not in ("forward", "inference") or not any(n.inputs for n in rg.nodes.values()):
            continue
        g = _Graph(rg)
        for pattern, fn in MATCHERS.items():
            for m in fn(g):
                lib = _library_module(g, m)
                if lib:  # nn.LayerNorm / nn.GELU decomposed by the compiler: the program calls the fused op
                    m.roles["library"] = lib
                key = (m.pattern, tuple((s.file, s.start_line, s.end_line) for s in m.spans))
                if m.spans and key not in seen:
                    seen.add(key)
                    out.append(m)
    return out


def overlaps(a: list[SourceSpan], b: list[SourceSpan]) -> bool:
    return any(x.file == y.file and x.start_line <= y.end_line and y.start_line <= x.end_line for x in a for y in b)
