"""The once-per-run nodes (port, baseline, evidence) after a kill that fell between their ledger
event and their checkpoint: resumed, each returns what it returned then, without redoing the work
or logging it twice (test_kill_at_every_node found a second `baseline_measured` this way)."""

import pytest
from langgraph.runtime import Runtime

from trainbridge.agent import nodes
from trainbridge.agent.context import RunContext
from trainbridge.agent.state import RunConfig, RunPaths
from trainbridge.ledger import models as ev
from trainbridge.ledger.store import Ledger
from trainbridge.workload import load_workload

from tests.kits.paths import FIXTURES

MINIGPT = FIXTURES / "loop" / "minigpt"


def _ctx(tmp_path):
    wl = load_workload(MINIGPT)
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir(parents=True)
    ledger = Ledger(paths.ledger)
    cfg = RunConfig(run_id="t", workload=str(wl.root))
    return RunContext(cfg=cfg, workload=wl, paths=paths, ledger=ledger, rewriter=None,
                      report=lambda phase, **kw: None)


def _must_not_run(*a, **k):
    raise AssertionError("the node redid its work on resume")


@pytest.mark.parametrize("node, event, patched, expected", [
    ("port", ev.PortApplied(run_id="t", time_utc=ev.utc_now(), target="cpu", changes=[]), "port_workload", {"phase": "baseline"}),
    ("baseline", ev.BaselineMeasured(run_id="t", time_utc=ev.utc_now(), runs_ms=[[10.0]], losses=[1.0],
                                     flops_per_step=None, work_items_per_step=[1], median_ms=10.0, min_effect=0.03),
     "reference_run", {"phase": "collect", "baseline_median_ms": 10.0, "min_effect": 0.03}),
    ("collect", ev.EvidenceLoaded(run_id="t", time_utc=ev.utc_now(), path=None, intents=0, note="", source="skipped",
                                  required=False), None, {"phase": "plan"}),
])
def test_a_resumed_once_per_run_node_returns_what_it_logged(tmp_path, monkeypatch, node, event, patched, expected):
    ctx = _ctx(tmp_path)
    ctx.ledger.append(event)
    if patched:
        monkeypatch.setattr(nodes, patched, _must_not_run)
    monkeypatch.setattr("trainbridge.evidence.collect.collect_workload", _must_not_run)
    out = getattr(nodes, node)({}, Runtime(context=ctx))
    assert {k: out[k] for k in expected} == expected
    assert [type(e) for e in ctx.ledger.events()] == [type(event)], "logged twice"


def test_a_port_that_was_blocked_is_refused_again_on_resume(tmp_path, monkeypatch):
    ctx = _ctx(tmp_path)
    ctx.ledger.append(ev.PortApplied(run_id="t", time_utc=ev.utc_now(), target="cpu", changes=[],
                                     blockers=["torch.distributed.init_process_group: no backend"]))
    monkeypatch.setattr(nodes, "port_workload", _must_not_run)
    with pytest.raises(nodes.PortBlocked, match="no backend"):
        nodes.port({}, Runtime(context=ctx))
    assert len(list(ctx.ledger.events())) == 1
