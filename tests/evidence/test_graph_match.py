"""Patterns found by the post-grad graph's dataflow (`evidence.graph_match`), on a real capture
of a program that spells each one in another house style (tests/fixtures/evidence/house_styles.py)."""

import json
import shutil
import sys

import pytest

from trainbridge.evidence import collect_inprocess
from trainbridge.evidence.build import bundle_from_raw
from trainbridge.evidence.graph_match import MATCHERS
from trainbridge.evidence.intents import _Ctx, graph_intents
from trainbridge.evidence.raw import RawCapture
from trainbridge.patterns import PATTERNS

from tests.kits.paths import FIXTURES

SOURCE = FIXTURES / "evidence" / "house_styles.py"
LINES = SOURCE.read_text().splitlines()


def line(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(LINES) if f"# <{marker}>" in text]
    assert len(hits) == 1, marker
    return hits[0]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    root = tmp_path_factory.mktemp("house_styles")
    shutil.copy(SOURCE, root / SOURCE.name)  # the source scan reads the program's folder: this file only
    sys.path.insert(0, str(root))
    try:
        import house_styles
        model, opts, step = house_styles.make()
        bundle = collect_inprocess(model, opts, step, device="cuda", source_root=root, workload_name="house_styles",
                                   raw_out=root / "raw.json")
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("house_styles", None)
    return bundle, RawCapture.load(root / "raw.json"), root


def matches(bundle, pattern):
    """The hand-written ones: a match inside torch's own module (nn.LayerNorm) says so in its roles."""
    return [m for m in bundle.graph_matches if m.pattern == pattern and "library" not in m.roles]


def covers(spans, first: int, last: int) -> bool:
    return any(s.start_line <= first and last <= s.end_line for s in spans)


@pytest.mark.parametrize("style,module,mask,scale", [
    ("baddbmm", "FusedQkvBaddbmm", "where", "alpha 0.25"),
    ("einsum", "EinsumAdditive", "added tensor", "x 0.25"),
    ("plain", "Unmasked", "none", "/ 4"),
])
def test_each_attention_spelling_is_matched_from_its_first_product_to_its_second(captured, style, module, mask, scale):
    bundle, _, _ = captured
    first, second = line(f"{style} first"), line(f"{style} second")
    found = [m for m in matches(bundle, "attention") if covers(m.spans, first, second)]
    assert len(found) == 1, [(m.module, m.spans) for m in matches(bundle, "attention")]
    m = found[0]
    assert m.module == module
    assert m.roles["mask"] == mask and m.roles["scale"] == scale, m.roles
    assert m.ops[0] in ("bmm", "baddbmm") and m.ops.count("bmm") + m.ops.count("baddbmm") >= 2
    # the span is the computation, not the whole forward: it starts at the first product (or its mask)
    assert min(s.start_line for s in m.spans) >= first - 1


def test_a_program_with_dropout_gets_its_forward_graph_on_the_fake_cuda_route(captured):
    # Inductor seeds its own random kernels with a GPU tensor: without fallback_random the whole
    # forward graph of a dropout program failed to generate (no kernel, no intent from it)
    bundle, raw, _ = captured
    fwd = next(g for g in raw.graphs if g.phase == "forward")
    assert fwd.codegen_error is None and fwd.launches
    plain = [m for m in matches(bundle, "attention") if m.module == "Unmasked"]
    assert plain and plain[0].roles.get("dropout") == "yes"
    assert any("random ops (dropout)" in lim for lim in bundle.limitations)


def test_a_softmax_without_a_second_product_is_no_attention(captured):
    bundle, _, _ = captured
    router, loss = line("router"), line("loss")
    for m in matches(bundle, "attention"):
        assert not covers(m.spans, router, router) and not covers(m.spans, loss, loss)
    assert len(matches(bundle, "attention")) == 3


def test_hand_written_norms_and_gelus_are_matched_and_told_apart(captured):
    bundle, _, _ = captured
    rms = matches(bundle, "rms_norm")
    assert [(s.start_line, s.end_line) for m in rms for s in m.spans] == [(line("rms"), line("rms"))]
    assert rms[0].roles["eps"] == "1e-06"
    ln = matches(bundle, "layer_norm")
    assert len(ln) == 1 and covers(ln[0].spans, line("ln first"), line("ln last"))
    assert ln[0].roles["variance"] == "mean of squared deviations" and ln[0].roles["eps"] == "1e-05"
    forms = {m.roles["form"]: m for m in matches(bundle, "gelu")}
    assert set(forms) == {"tanh approximation", "erf"}
    assert covers(forms["tanh approximation"].spans, line("gelu tanh"), line("gelu tanh"))
    assert covers(forms["erf"].spans, line("gelu erf"), line("gelu erf"))


def test_a_library_module_the_compiler_decomposed_is_not_a_hand_written_pattern(captured):
    bundle, raw, _ = captured
    lib = line("library norm")
    fwd = next(g for g in raw.graphs if g.phase == "forward")
    # Inductor lowered nn.LayerNorm to the same var_mean / rsqrt a hand-written one has ...
    assert any(n.library_module.endswith("LayerNorm") and n.stack and n.stack[-1].line == lib
               for n in fwd.nodes.values())
    # ... but the program already calls the library op there: no hand-written pattern, and the
    # kernel-level intent on that line (its kernel fused LayerNorm's ops) is demoted, saying why
    found = [m for m in bundle.graph_matches if covers(m.spans, lib, lib)]
    assert found and all(m.roles["library"].endswith("LayerNorm") for m in found)
    on_line = [i for i in bundle.intents if i.pattern == "layer_norm" and covers(i.spans, lib, lib)]
    assert on_line and all(i.confidence <= 0.3 and "torch.nn" in i.evidence.notes[-1] for i in on_line)
    hand = [i for i in bundle.intents
            if i.pattern == "layer_norm" and covers(i.spans, line("ln first"), line("ln last"))]
    assert hand and all(i.confidence >= 0.9 for i in hand), hand


def test_matches_become_or_confirm_intents_with_their_spans(captured):
    bundle, _, _ = captured
    attention = [i for i in bundle.intents if i.pattern == "attention"]
    for style in ("baddbmm", "einsum", "plain"):
        assert any(covers(i.spans, line(f"{style} first"), line(f"{style} second")) for i in attention), style
    assert all(i.confidence >= 0.9 for i in attention)
    assert any("post-grad graph match" in n for i in attention for n in i.evidence.notes)
    gelu = [i for i in bundle.intents if i.pattern == "gelu"]
    assert any(covers(i.spans, line("gelu erf"), line("gelu erf")) for i in gelu)


def test_a_match_no_kernel_intent_covers_becomes_an_intent_of_its_own(captured):
    bundle, raw, root = captured
    ctx = _Ctx(bundle.kernels, bundle.eager, str(root))
    new = graph_intents(matches(bundle, "attention"), [], ctx)
    assert len(new) == 3 and all(i.pattern == "attention" and i.level == PATTERNS["attention"].level for i in new)
    assert {i.summary.rsplit(" ", 1)[-1].rstrip(")") for i in new} == {"FusedQkvBaddbmm", "EinsumAdditive", "Unmasked"}
    assert all(i.target_ops.get("npu") and i.eager_ops_removed > 0 for i in new)  # eager ops on those lines counted


def test_the_raw_capture_keeps_edges_and_infinite_scalars(captured):
    _, raw, root = captured
    text = (root / "raw.json").read_text()
    json.loads(text)  # valid JSON: -inf is written as a string
    fwd = next(g for g in raw.graphs if g.phase == "forward")
    assert any(float("-inf") in n.scalars for n in fwd.nodes.values())
    # every edge leads to a node of the graph or to one of its inputs (the parameters and batch)
    assert sum(len(n.inputs) for n in fwd.nodes.values()) > len(fwd.nodes) // 2
    assert all(i in fwd.nodes or i.startswith(("primals", "tangents", "arg")) for n in fwd.nodes.values()
               for i in n.inputs), sorted({i for n in fwd.nodes.values() for i in n.inputs} - set(fwd.nodes))[:10]
    # and a concrete one: the written-out softmax divides exp by a sum computed from that exp
    div = [n for n in fwd.nodes.values() if n.target == "aten.div.Tensor" and len(n.inputs) == 2
           and fwd.nodes.get(n.inputs[0]) is not None and fwd.nodes[n.inputs[0]].target == "aten.exp.default"]
    assert div, "no exp / sum division in the forward graph"


def test_a_capture_without_edges_matches_nothing_and_still_builds(captured):
    _, raw, root = captured
    old = raw.model_copy(deep=True)
    for g in old.graphs:
        for n in g.nodes.values():
            n.inputs = []
    bundle = bundle_from_raw(old, source_root=root)
    assert bundle.graph_matches == [] and any(i.pattern == "attention" for i in bundle.intents)


def test_every_graph_signature_in_the_registry_has_a_matcher_and_back():
    assert {name for name, spec in PATTERNS.items() if spec.graph_signature} == set(MATCHERS)


def test_every_attention_the_graph_found_is_a_site_the_recipe_rewrites(captured):
    """The graph finds attention by dataflow; the sdpa recipe must then realise each one (the
    heads-third einsum form was found by the graph first, and the recipe learned it)."""
    from trainbridge.agent.rewriters.recipes import RECIPES

    bundle, _, root = captured
    files = {SOURCE.name: (root / SOURCE.name).read_text()}
    sites = RECIPES["sdpa_attention"].find(files, "cpu")
    for m in matches(bundle, "attention"):
        assert any(covers(m.spans, s.line, s.line) for s in sites), (m.module, m.spans, [s.line for s in sites])
