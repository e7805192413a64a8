"""The run state machine, fed made-up events: nothing runs."""

import dataclasses

from pipeline.core.dag import build_dag
from pipeline.core.plan import State, make_plan
from pipeline.core.run_state import RunState
from pipeline.step import Step, output_of, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value


def diamond():
    """a -> (b, c) -> d, and an independent e."""
    a = Step("a", write_value, WriteConfig(output=this_output(), value=versioned(1)))
    b = Step("b", write_value, WriteConfig(output=this_output(), inputs=[output_of(a)]))
    c = Step("c", write_value, WriteConfig(output=this_output(), inputs=[output_of(a)]))
    d = Step("d", write_value, WriteConfig(output=this_output(), inputs=[output_of(b), output_of(c)]))
    e = Step("e", write_value, WriteConfig(output=this_output(), value=versioned(5)))
    dag = build_dag([d, e], "/p")
    labels = {node.name: label for label, node in dag.nodes.items()}
    plan = make_plan(dag, {}, now=0, local_host="h")
    return plan, labels


def test_readiness_follows_dependencies():
    plan, n = diamond()
    state = RunState(plan)
    assert sorted(state.take_ready(10)) == sorted([n["a"], n["e"]])
    assert state.mark_succeeded(n["a"]) == [n["b"], n["c"]]
    state.take_ready(10)
    assert state.mark_succeeded(n["b"]) == []  # d still needs c
    assert state.mark_succeeded(n["c"]) == [n["d"]]
    state.take_ready(10)
    state.mark_succeeded(n["d"])
    assert not state.finished  # e is still in flight
    state.mark_succeeded(n["e"])
    assert state.finished


def test_take_ready_respects_the_limit():
    plan, _ = diamond()
    state = RunState(plan)
    assert len(state.take_ready(1)) == 1
    assert len(state.in_flight) == 1
    assert len(state.ready) == 1


def test_failure_blocks_only_dependents():
    plan, n = diamond()
    state = RunState(plan)
    state.take_ready(10)
    state.mark_succeeded(n["a"])
    state.take_ready(10)
    assert state.mark_failed(n["b"]) == [n["d"]]
    assert state.blocked == {n["d"]: n["b"]}
    state.mark_succeeded(n["c"])
    state.mark_succeeded(n["e"])
    assert state.finished
    assert state.final_state(n["d"]) == State.BLOCKED
    assert state.final_state(n["e"]) == State.SUCCEEDED


def test_waiting_then_retry_or_done_elsewhere():
    plan, n = diamond()
    state = RunState(plan)
    state.take_ready(10)
    state.mark_waiting(n["a"])  # another runner holds it
    assert not state.finished and n["a"] in state.waiting
    state.mark_retry(n["a"])  # that runner died
    assert state.take_ready(10) == [n["a"]]
    state.mark_waiting(n["a"])
    assert state.mark_succeeded(n["a"]) == [n["b"], n["c"]]  # finished elsewhere


def test_cancel_all_stops_scheduling():
    plan, n = diamond()
    state = RunState(plan)
    state.take_ready(10)
    state.cancel_all()
    assert state.ready == [] and state.pending == set()
    assert state.final_state(n["d"]) == State.CANCELLED
    state.mark_cancelled(n["a"])
    state.mark_cancelled(n["e"])
    assert state.finished


def test_cached_steps_count_as_done():
    plan, n = diamond()
    cached = {n["a"]}
    plan = plan.__class__(
        plan.dag,
        {
            label: (dataclasses.replace(sp, state=State.CACHED) if label in cached else sp)
            for label, sp in plan.steps.items()
        },
    )
    state = RunState(plan)
    assert sorted(state.take_ready(10)) == sorted([n["b"], n["c"], n["e"]])
