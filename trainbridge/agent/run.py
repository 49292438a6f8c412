"""Start or resume one optimization run: folder, config, ledger, checkpointed graph."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path

import torch

from ..ledger import models as ev
from ..ledger.store import Ledger
from ..workload import load_workload
from .graph import build_graph, open_checkpointer
from .context import RunContext, active_seconds
from .state import RunConfig, RunPaths


def new_run_id(workload_name: str, target: str) -> str:
    return f"{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}-{workload_name}-{target}"


LLM_BACKOFF_ENV = "TRAINBRIDGE_LLM_BACKOFF_S"


def llm_backoff_s() -> float:
    """The first wait before retrying an unusable model answer (doubling each retry): 1 s unless
    TRAINBRIDGE_LLM_BACKOFF_S says otherwise (a local server with scripted answers needs none)."""
    raw = os.environ.get(LLM_BACKOFF_ENV)
    if raw is None:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{LLM_BACKOFF_ENV}={raw!r}: expected seconds, e.g. 0.5") from None
    if not value >= 0:
        raise ValueError(f"{LLM_BACKOFF_ENV}={raw!r}: expected seconds >= 0")
    return value


def make_rewriter(cfg: RunConfig):
    from .rewriters.recipe_rewriter import RecipeRewriter

    if cfg.agent == "recipes":
        return RecipeRewriter()
    from .rewriters.llm import LLMRewriter  # issue 5

    llm = LLMRewriter(model=cfg.llm_model, base_url=cfg.llm_base_url, backoff_s=llm_backoff_s())
    if cfg.agent == "llm+recipes":
        from .rewriters.llm import WithFallback

        return WithFallback(llm, RecipeRewriter())
    return llm


def start_run(cfg: RunConfig, runs_root: Path, reporter=None) -> Path:
    if cfg.agent != "recipes":
        llm_backoff_s()  # a bad setting is a usage error before any run folder exists
    paths = RunPaths(runs_root / cfg.run_id)
    paths.root.mkdir(parents=True, exist_ok=False)
    paths.config.write_text(cfg.model_dump_json(indent=1))
    ledger = Ledger(paths.ledger)
    ledger.append(ev.RunStarted(
        run_id=cfg.run_id, time_utc=ev.utc_now(), workload=cfg.workload, target=cfg.target, agent=cfg.agent,
        budget_candidates=cfg.budget_candidates, budget_minutes=cfg.budget_minutes, argv=sys.argv,
        environment={"python": platform.python_version(), "torch": torch.__version__,
                     "machine": platform.machine(), "node": platform.node()},
    ))
    _drive(cfg, paths, ledger, reporter, initial={"run_dir": str(paths.root), "started_at": time.time(),
                                                  "incumbent_speedup": 1.0})
    return paths.root


def resume_run(run_dir: Path, reporter=None) -> Path:
    paths = RunPaths(run_dir)
    if not paths.config.exists():
        raise FileNotFoundError(f"{run_dir}: not a run folder (no config.json)")
    cfg = RunConfig.model_validate_json(paths.config.read_text())
    ledger = Ledger(paths.ledger)
    ledger.append(ev.RunResumed(run_id=cfg.run_id, time_utc=ev.utc_now(), argv=sys.argv))
    _drive(cfg, paths, ledger, reporter, initial=None)
    return paths.root


def _drive(cfg: RunConfig, paths: RunPaths, ledger: Ledger, reporter, initial) -> None:
    workload = load_workload(cfg.workload)
    ctx = RunContext(cfg=cfg, workload=workload, paths=paths, ledger=ledger, rewriter=make_rewriter(cfg),
                     report=reporter or (lambda phase, **kw: None), active_s_before=active_seconds(ledger.events()))
    saver = open_checkpointer(paths.checkpoints)
    graph = build_graph(checkpointer=saver)
    config = {"configurable": {"thread_id": cfg.run_id}, "recursion_limit": 10_000}
    # durability="sync": each checkpoint is on disk before the next node starts, so a kill
    # loses at most the node that was running (whose own ledger events make it idempotent).
    if initial is None:
        if any(isinstance(e, ev.RunFinished) for e in ledger.events()):
            return  # already finished
        if not has_pending_work(graph, config):
            raise RuntimeError(f"{paths.root}: checkpoint has no pending node but the run never finished")
        graph.invoke(None, config=config, context=ctx, durability="sync")
    else:
        graph.invoke(initial, config=config, context=ctx, durability="sync")


def has_pending_work(graph, config) -> bool:
    """Whether the checkpoint can be continued.

    A kill can land after a node finished and its writes were saved but before the step's
    checkpoint was: LangGraph then lists that node in `tasks` (with its writes) and not in
    `next`, which names only nodes still to run. `invoke(None)` applies the saved writes and
    goes on, so such a checkpoint is resumable even though `next` is empty.
    """
    snapshot = graph.get_state(config)
    if snapshot.created_at is None:  # no checkpoint for this thread at all
        return False
    return bool(snapshot.next or snapshot.tasks)
