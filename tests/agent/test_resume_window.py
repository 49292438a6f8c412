"""Resume after a kill that lands between a node's saved writes and the step's checkpoint.

LangGraph saves a finished node's writes first and the step's checkpoint second. A kill in
that window leaves a checkpoint whose `next` is empty (the node is done) although the run is
not: CI hit it once as "checkpoint has no pending node but the run never finished". The test
opens the window on purpose with a saver that dies on the step's checkpoint.
"""

from __future__ import annotations

import operator
import sqlite3
from typing import Annotated, TypedDict

import pytest
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

from trainbridge.agent.run import has_pending_work


class _State(TypedDict, total=False):
    ran: Annotated[list, operator.add]


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs in the process."""


class _DiesOnCheckpoint(SqliteSaver):
    def __init__(self, conn, die_at_put: int):
        super().__init__(conn)
        self.puts, self.die_at_put = 0, die_at_put

    def put(self, config, checkpoint, metadata, new_versions):
        self.puts += 1
        if self.puts == self.die_at_put:
            raise _Killed()
        return super().put(config, checkpoint, metadata, new_versions)


def _graph(saver, calls: list):
    def node(name):
        def run(state):
            calls.append(name)
            return {"ran": [name]}
        return run

    g = StateGraph(_State)
    for name in ("a", "b", "c"):
        g.add_node(name, node(name))
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", END)
    return g.compile(checkpointer=saver)


CONFIG = {"configurable": {"thread_id": "t"}}


# put 1 saves the input, put 2 the start step, puts 3-5 the steps after a, b and c
@pytest.mark.parametrize("die_at_put", [2, 3, 4, 5])
def test_a_kill_between_a_nodes_writes_and_its_checkpoint_resumes_without_rerunning_it(tmp_path, die_at_put):
    db = tmp_path / "ck.sqlite"
    first: list = []
    with pytest.raises(_Killed):
        _graph(_DiesOnCheckpoint(sqlite3.connect(db, check_same_thread=False), die_at_put), first).invoke(
            {"ran": []}, config=CONFIG, durability="sync")

    again: list = []
    graph = _graph(SqliteSaver(sqlite3.connect(db, check_same_thread=False)), again)
    snapshot = graph.get_state(CONFIG)
    assert not snapshot.next, "the window this test opens: the finished node is not in `next`"
    assert has_pending_work(graph, CONFIG)
    out = graph.invoke(None, config=CONFIG, durability="sync")
    assert out["ran"] == ["a", "b", "c"]
    assert not set(first) & set(again), f"a finished node ran twice: {first} then {again}"


def test_a_finished_graph_and_a_missing_checkpoint_have_no_pending_work(tmp_path):
    db = tmp_path / "ck.sqlite"
    graph = _graph(SqliteSaver(sqlite3.connect(db, check_same_thread=False)), [])
    assert not has_pending_work(graph, CONFIG)  # nothing saved for this thread yet
    graph.invoke({"ran": []}, config=CONFIG, durability="sync")
    assert not has_pending_work(graph, CONFIG)  # ran to END
