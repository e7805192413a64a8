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


def followed():
    """tok -> train; eval and tasks follow train (blocking=False), and are declared first."""
    tok = Step("tok", write_value, WriteConfig(output=this_output(), value=versioned(1)))
    train = Step("train", write_value, WriteConfig(output=this_output(), inputs=[output_of(tok)]))
    followers = [
        Step(name, write_value, WriteConfig(output=this_output(), inputs=[output_of(train, blocking=False)]))
        for name in ("eval", "tasks")
    ]
    dag = build_dag([*followers, train], "/p")
    labels = {node.name: label for label, node in dag.nodes.items()}
    return make_plan(dag, {}, now=0, local_host="h"), labels


def test_followers_are_taken_only_once_what_they_follow_has_started():
    plan, n = followed()
    state = RunState(plan)
    # Ready at once (no blocking inputs), but held back while train has not even been taken.
    assert state.take_ready(10) == [n["tok"]]
    assert sorted(state.held_back()) == sorted([n["eval"], n["tasks"]])
    state.mark_succeeded(n["tok"])
    assert state.take_ready(10) == [n["train"]]  # taken first, whatever the declaration order
    assert state.awaited_starts() == [n["train"]]
    state.mark_started(n["train"])
    assert sorted(state.take_ready(10)) == sorted([n["eval"], n["tasks"]])
    assert state.followers_in_flight(n["train"]) == sorted([n["eval"], n["tasks"]])


def test_a_retried_step_holds_back_its_followers_again():
    plan, n = followed()
    state = RunState(plan)
    state.take_ready(10)
    state.mark_succeeded(n["tok"])
    state.take_ready(10)
    state.mark_started(n["train"])
    state.take_ready(1)  # one follower
    state.mark_retry(n["train"])  # preempted: it starts over, and is not running now
    assert state.take_ready(10) == [n["train"]]
    assert state.held_back()  # the other follower waits for the new attempt to start
    state.mark_started(n["train"])
    assert len(state.take_ready(10)) == 1


def test_followers_of_a_failed_or_cached_step_are_not_held():
    plan, n = followed()
    state = RunState(plan)
    state.take_ready(10)
    state.mark_failed(n["tok"])  # train is blocked: its followers run (and find nothing to follow)
    assert sorted(state.take_ready(10)) == sorted([n["eval"], n["tasks"]])
