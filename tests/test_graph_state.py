"""Every key a loop node returns must be a channel of RunState: LangGraph drops the others
silently. (`low_precision` was missing, so after an accepted bf16 autocast the next
candidates were checked against the fp32 baseline with the fp32 tolerance and rejected.)"""

import ast
from pathlib import Path

from langgraph.graph import END, START, StateGraph

import trainbridge.agent.nodes as nodes
from trainbridge.agent.state import RunState


def _returned_keys(tree: ast.AST) -> set[str]:
    """String keys of dict literals returned by the nodes, or assigned to `update` and returned."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Return):
            value = node.value
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "update" for t in node.targets):
            value = node.value
        if isinstance(value, ast.Dict):
            keys |= {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            for k, v in zip(value.keys, value.values):  # **({"low_precision": True} if ... else {})
                if k is None and isinstance(v, ast.IfExp) and isinstance(v.body, ast.Dict):
                    keys |= {kk.value for kk in v.body.keys if isinstance(kk, ast.Constant)}
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "update" \
                and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
    return keys


def test_every_state_key_a_node_returns_is_a_channel():
    tree = ast.parse(Path(nodes.__file__).read_text())
    loop = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Nodes")
    # the methods that take the graph state are the nodes and the helpers that build their updates
    takes_state = [f for f in loop.body if isinstance(f, ast.FunctionDef) and any(a.arg == "state" for a in f.args.args)]
    keys = set().union(*(_returned_keys(f) for f in takes_state))
    assert "low_precision" in keys and "incumbent_dir" in keys  # the walk sees the updates
    missing = keys - set(RunState.__annotations__)
    assert not missing, f"node updates LangGraph would drop: {sorted(missing)}"


def test_langgraph_keeps_low_precision_between_nodes():
    g = StateGraph(RunState)
    g.add_node("accept", lambda s: {"low_precision": True, "accepted": ["c01"]})
    g.add_node("validate", lambda s: {"phase": "low" if s.get("low_precision") else "fp32"})
    g.add_edge(START, "accept")
    g.add_edge("accept", "validate")
    g.add_edge("validate", END)
    assert g.compile().invoke({"phase": "start"})["phase"] == "low"
