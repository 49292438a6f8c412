"""The optimization loop as a LangGraph state graph, checkpointed to SQLite.

port -> baseline -> collect -> plan -> rewrite -> validate -> measure -> decide -> plan ...
-> report. A checkpoint is written after every node, so `trainbridge run --resume
runs/<id>` continues at the first unfinished node and never repeats a finished candidate.
"""

from __future__ import annotations

import sqlite3
from typing import Literal

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from .candidate import Candidate, Stage
from .context import RunContext
from .nodes import NODES
from .state import RunState


class UndeclaredStateKey(KeyError):
    """A node returned a key that is not a RunState channel (LangGraph would drop it silently)."""


def _declared_keys_only(name: str, node):
    """The node, refusing any update key RunState does not declare."""
    channels = set(RunState.__annotations__)

    def checked(state: RunState, runtime) -> dict:
        update = node(state, runtime)
        unknown = set(update or {}) - channels
        if unknown:
            raise UndeclaredStateKey(f"node {name!r} returned keys RunState does not declare: {sorted(unknown)}")
        return update

    checked.__name__ = name
    return checked


def _stage(state: RunState) -> Stage | None:
    cur = state.get("current")
    return Candidate.model_validate(cur).stage if cur else None


def _after_plan(state: RunState) -> Literal["rewrite", "report"]:
    return "rewrite" if state.get("current") else "report"


def _after_rewrite(state: RunState) -> Literal["validate", "plan"]:
    return "validate" if state.get("current") else "plan"


def _after_validate(state: RunState) -> Literal["measure", "rewrite", "plan", "decide"]:
    stage = _stage(state)
    if stage is None:
        return "plan"
    if stage == Stage.REPAIR:
        return "rewrite"
    # a dry run (npu references on the CPU) validates but never measures
    return "decide" if stage == Stage.VALIDATED_DRY_RUN else "measure"


def _after_measure(state: RunState) -> Literal["decide", "rewrite", "plan"]:
    """The clock's own rejections (every timing run failed, a timed run that did other work than
    validation saw) are decided in measure: nothing is left for decide then."""
    stage = _stage(state)
    if stage is None:
        return "plan"
    return "rewrite" if stage == Stage.REPAIR else "decide"


def _after_decide(state: RunState) -> Literal["rewrite", "plan"]:
    return "rewrite" if _stage(state) == Stage.REPAIR else "plan"


def build_graph(checkpointer=None):
    """The loop's graph; run it with `context=RunContext(...)` (LangGraph's runtime context)."""
    g = StateGraph(RunState, context_schema=RunContext)
    for name, node in NODES.items():
        g.add_node(name, _declared_keys_only(name, node))
    # port: naive port, the baseline program; baseline: reference losses, A/A timing, profile;
    # collect: GPU evidence -> intents; plan: next (recipe, intent) by predicted saving;
    # rewrite: one-mechanism candidate; validate: parse, guard, run, loss, work, mechanism;
    # measure: interleaved timing vs the incumbent; decide: accept -> new incumbent, else
    # reject (a model's candidate may go back for repair); report: final program, diffs,
    # end-to-end measurement.
    g.add_edge(START, "port")
    g.add_edge("port", "baseline")
    g.add_edge("baseline", "collect")
    g.add_edge("collect", "plan")
    g.add_conditional_edges("plan", _after_plan)
    g.add_conditional_edges("rewrite", _after_rewrite)
    g.add_conditional_edges("validate", _after_validate)
    g.add_conditional_edges("measure", _after_measure)
    g.add_conditional_edges("decide", _after_decide)
    g.add_edge("report", END)
    return g.compile(checkpointer=checkpointer)


def open_checkpointer(path) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
