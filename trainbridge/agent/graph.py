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

from .nodes import Nodes, RunContext
from .state import RunState


def _after_plan(state: RunState) -> Literal["rewrite", "report"]:
    return "rewrite" if state.get("current") else "report"


def _after_rewrite(state: RunState) -> Literal["validate", "plan"]:
    return "validate" if state.get("current") else "plan"


def _after_validate(state: RunState) -> Literal["measure", "rewrite", "plan", "decide"]:
    cur = state.get("current")
    if not cur:
        return "plan"
    if cur.get("stage") == "repair":
        return "rewrite"
    # a dry run (npu references on the CPU) validates but never measures
    return "decide" if cur.get("stage") == "validated_dry_run" else "measure"


def _after_decide(state: RunState) -> Literal["rewrite", "plan"]:
    cur = state.get("current")
    return "rewrite" if cur and cur.get("stage") == "repair" else "plan"


def build_graph(ctx: RunContext, checkpointer=None):
    n = Nodes(ctx)
    g = StateGraph(RunState)
    g.add_node("port", n.port)            # naive port: the baseline program
    g.add_node("baseline", n.baseline)    # reference losses, A/A timing, profile
    g.add_node("collect", n.collect)      # GPU evidence -> intents
    g.add_node("plan", n.plan)            # next (recipe, intent) by predicted saving
    g.add_node("rewrite", n.rewrite)      # one-mechanism candidate program
    g.add_node("validate", n.validate)    # parse, guard, run, loss, work, mechanism
    g.add_node("measure", n.measure)      # interleaved timing vs the incumbent
    g.add_node("decide", n.decide)        # accept -> new incumbent, else reject
    g.add_node("report", n.report)        # final program, diff, end-to-end measurement
    g.add_edge(START, "port")
    g.add_edge("port", "baseline")
    g.add_edge("baseline", "collect")
    g.add_edge("collect", "plan")
    g.add_conditional_edges("plan", _after_plan)
    g.add_conditional_edges("rewrite", _after_rewrite)
    g.add_conditional_edges("validate", _after_validate)
    g.add_edge("measure", "decide")
    g.add_conditional_edges("decide", _after_decide)  # a model's slower candidate may be repaired
    g.add_edge("report", END)
    return g.compile(checkpointer=checkpointer)


def open_checkpointer(path) -> SqliteSaver:
    return SqliteSaver(sqlite3.connect(str(path), check_same_thread=False))
