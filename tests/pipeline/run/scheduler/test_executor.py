"""Executing plans in-process on the local backend, against a real prefix on disk."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.core.lease import LeaseRecord, Owner
from pipeline.core.plan import Plan, State
from pipeline.core.records import Event
from pipeline.errors import StepDeclarationError, StorageError
from pipeline.processes import current_owner
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from tests.pipeline import stepfns
from tests.pipeline.stepfns import (
    FailConfig,
    GateConfig,
    WriteConfig,
    calls,
    fail,
    wait_for_gate,
    write_nothing,
    write_value,
    write_value_fsspec,
)


def chain(counter: str, a_value: int = 1, b_value: int = 10, log_every: int = 10) -> list[Step]:
    """a -> b -> c, plus c reads a directly too."""
    a = Step(
        "data/a",
        write_value,
        WriteConfig(this_output(), versioned(a_value), counter, "a", log_every=log_every),
    )
    b = Step(
        "data/b", write_value, WriteConfig(this_output(), versioned(b_value), counter, "b", [output_of(a)])
    )
    c = Step(
        "train/c", write_value, WriteConfig(this_output(), versioned(100), counter, "c", [a / "", b / ""])
    )
    return [c]


def run(steps, prefix, **options) -> RunReport:
    result = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), backend="local", **options))
    assert isinstance(result, RunReport)
    return result


def value_of(report: RunReport, name: str) -> int:
    label = next(label for label, node in report.plan.dag.nodes.items() if node.name == name)
    with open(f"{report.plan.dag.nodes[label].output_path}/value.json") as f:
        return json.load(f)["value"]


def states(report: RunReport) -> dict[str, State]:
    return {report.plan.dag.nodes[label].name: o.state for label, o in report.outcomes.items()}


def test_run_then_rerun_does_nothing(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    first = run(chain(counter), prefix)
    assert first.ok and first.exit_code == 0
    assert states(first) == {"data/a": State.SUCCEEDED, "data/b": State.SUCCEEDED, "train/c": State.SUCCEEDED}
    assert value_of(first, "train/c") == 100 + 1 + (10 + 1)
    second = run(chain(counter), prefix)
    assert set(states(second).values()) == {State.CACHED}
    assert [calls(counter, n) for n in "abc"] == [1, 1, 1]


def test_changing_a_versioned_value_reruns_that_step_and_dependents_only(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    run(chain(counter), prefix)
    report = run(chain(counter, b_value=20), prefix)
    assert states(report) == {"data/a": State.CACHED, "data/b": State.SUCCEEDED, "train/c": State.SUCCEEDED}
    assert [calls(counter, n) for n in "abc"] == [1, 2, 2]
    assert value_of(report, "train/c") == 100 + 1 + 21


def test_unversioned_change_is_cached_with_a_drift_note(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    run(chain(counter), prefix)
    plan = run_experiment(chain(counter, log_every=50), ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert isinstance(plan, Plan)
    a = next(sp for sp in plan.steps.values() if sp.name == "data/a")
    assert a.state == State.CACHED
    assert "unversioned field `log_every` 10→50" in a.notes
    assert a.reason.startswith("cached; unversioned field `log_every`")


def test_code_change_is_noted_for_cached_steps(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    first = run(chain(counter), prefix)
    label = next(label for label, node in first.plan.dag.nodes.items() if node.name == "data/a")
    store = StepStore(LocalStorage())
    step_dir = first.plan.dag.nodes[label].output_path
    info = dict(store.read_step_json(step_dir))
    # As if produced by older code: its .step.json and the drift digest its SUCCESS recorded.
    info["fn"] = {**info["fn"], "fingerprint": "0000000000000000"}
    store.write_step_json(step_dir, info)
    status = Path(step_dir) / ".status"
    drift = store.events(step_dir)[-1].data["drift"]
    status.write_text(status.read_text().replace(drift, "0000000000000000"))
    plan = run_experiment(chain(counter), ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert "code of `write_value` changed since" in plan.steps[label].notes


def test_failure_blocks_dependents_and_independent_branches_finish(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    bad = Step("bad", fail, FailConfig(this_output(), counter, "kaput"))
    after_bad = Step(
        "after_bad", write_value, WriteConfig(this_output(), counter=counter, inputs=[output_of(bad)])
    )
    after_after = Step("after_after", write_value, WriteConfig(this_output(), inputs=[output_of(after_bad)]))
    good = Step("good", write_value, WriteConfig(this_output(), versioned(7), counter, "good"))
    report = run([after_after, good], prefix)
    assert not report.ok and report.exit_code == 1
    assert states(report) == {
        "bad": State.FAILED,
        "after_bad": State.BLOCKED,
        "after_after": State.BLOCKED,
        "good": State.SUCCEEDED,
    }
    bad_label = next(label for label, n in report.plan.dag.nodes.items() if n.name == "bad")
    assert report.outcomes[bad_label].error == "ValueError: kaput"
    events = StepStore(LocalStorage()).events(report.plan.dag.nodes[bad_label].output_path)
    assert [e.event for e in events] == [Event.RUNNING, Event.FAILED]
    assert "ValueError: kaput" in events[-1].data["traceback"]
    # A rerun retries the failed step (reason given) and leaves the good one cached.
    plan = run_experiment([after_after, good], ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert plan.steps[bad_label].reason == "previous attempt failed: ValueError: kaput"


def test_a_step_that_writes_nothing_fails(tmp_path):
    step = Step("nothing", write_nothing, FailConfig(this_output(), str(tmp_path / "calls")))
    report = run([step], tmp_path / "prefix")
    (outcome,) = report.outcomes.values()
    assert outcome.state == State.FAILED
    assert "returned without writing anything" in outcome.error


def test_only_runs_selected_steps_and_their_dependencies(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    report = run(chain(counter), prefix, only="^data/b$")
    assert states(report) == {"data/a": State.SUCCEEDED, "data/b": State.SUCCEEDED, "train/c": State.SKIPPED}
    assert calls(counter, "c") == 0


def test_force_redoes_a_cached_step_from_nothing_and_everything_downstream(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    run(chain(counter), prefix)
    (b_dir,) = prefix.glob("data/b-*")
    (b_dir / "left-by-the-last-run.txt").write_text("a checkpoint the forced rerun must not resume from")
    report = run(chain(counter), prefix, force="^data/b$")
    # b is redone, and c, which reads it; a, upstream, stays cached.
    assert states(report) == {"data/a": State.CACHED, "data/b": State.SUCCEEDED, "train/c": State.SUCCEEDED}
    assert [calls(counter, n) for n in "abc"] == [1, 2, 2]
    assert report.plan.steps[next(k for k in report.plan.steps if k.startswith("train/c"))].reason == (
        "forced: downstream of a --force step"
    )
    # The forced step started from an empty output directory (Drydock's own files kept).
    assert not (b_dir / "left-by-the-last-run.txt").exists()
    assert (b_dir / ".status").exists() and (b_dir / ".step.json").exists()


def test_only_matching_nothing_is_an_error(tmp_path):
    with pytest.raises(StepDeclarationError, match="--only 'nope' matches no step"):
        run(chain(str(tmp_path / "c")), tmp_path / "prefix", only="nope")


def _gate_step(name: str, gate: str, counter: str) -> Step:
    return Step(name, wait_for_gate, GateConfig(this_output(), versioned(gate), counter))


def _in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as e:
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_independent_steps_run_concurrently(tmp_path):
    counter = str(tmp_path / "calls")
    g1, g2 = f"par1-{tmp_path.name}", f"par2-{tmp_path.name}"
    for g in (g1, g2):
        stepfns.STARTED[g] = threading.Event()
        stepfns.GATES[g] = threading.Event()
    steps = [_gate_step("p1", g1, counter), _gate_step("p2", g2, counter)]
    thread, box = _in_thread(run, steps, tmp_path / "prefix", max_concurrent=2)
    # Both functions are inside their bodies at the same time before either may finish.
    assert stepfns.STARTED[g1].wait(10) and stepfns.STARTED[g2].wait(10)
    stepfns.GATES[g1].set()
    stepfns.GATES[g2].set()
    thread.join(20)
    assert box["result"].ok


def test_max_concurrent_one_serializes(tmp_path):
    counter = str(tmp_path / "calls")
    g1, g2 = f"ser1-{tmp_path.name}", f"ser2-{tmp_path.name}"
    for g in (g1, g2):
        stepfns.STARTED[g] = threading.Event()
        stepfns.GATES[g] = threading.Event()
    steps = [_gate_step("s1", g1, counter), _gate_step("s2", g2, counter)]
    thread, box = _in_thread(run, steps, tmp_path / "prefix", max_concurrent=1)
    assert stepfns.STARTED[g1].wait(10)
    assert not stepfns.STARTED[g2].wait(0.3)  # the second cannot start while the first runs
    stepfns.GATES[g1].set()
    assert stepfns.STARTED[g2].wait(10)
    stepfns.GATES[g2].set()
    thread.join(20)
    assert box["result"].ok


def test_lost_lease_stops_the_step_and_discards_its_result(tmp_path):
    counter = str(tmp_path / "calls")
    gate = f"lost-{tmp_path.name}"
    stepfns.STARTED[gate] = threading.Event()
    stepfns.GATES[gate] = threading.Event()
    step = _gate_step("held", gate, counter)
    thread, box = _in_thread(
        run, [step], tmp_path / "prefix", heartbeat_interval=0.05, lease_timeout=5, wait_poll_interval=0.05
    )
    assert stepfns.STARTED[gate].wait(10)
    stepfns.STARTED[gate].clear()
    step_dir = next((tmp_path / "prefix").glob("held-*"))
    # Another runner (on another host) takes the lease over with a newer fencing token.
    thief = LeaseRecord(2, "thief0000000", "elsewhere/0", 1, None, expires=time.time() + 0.5)
    (step_dir / ".lease").write_bytes(thief.dump())
    # Our heartbeat notices, stops the function; when the thief's lease expires we take over.
    assert stepfns.STARTED[gate].wait(20), "the step was not retried after the thief's lease expired"
    stepfns.GATES[gate].set()
    thread.join(20)
    report = box["result"]
    assert report.ok
    events = StepStore(LocalStorage()).events(str(step_dir))
    assert [(e.event, e.token) for e in events] == [
        (Event.RUNNING, 1),
        (Event.RUNNING, 3),
        (Event.SUCCESS, 3),
    ]
    assert calls(counter, f"gate-{gate}") == 2


def test_steps_held_elsewhere_are_awaited_then_counted_done(tmp_path, capfd):
    counter = str(tmp_path / "calls")
    prefix = tmp_path / "prefix"
    steps = chain(counter)
    plan = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    a_label = next(label for label, n in plan.dag.nodes.items() if n.name == "data/a")
    a_dir = plan.dag.nodes[a_label].output_path
    # Another live runner holds data/a.
    other = Owner("other0000000", "elsewhere/0", 1, None)
    store = StepStore(LocalStorage())
    store.acquire(a_dir, other, ttl=60)
    thread, box = _in_thread(run, steps, prefix, wait_poll_interval=0.05)
    # The runner found data/a held and waits for it, with b not started.
    deadline, said = time.monotonic() + 20, ""
    while f"WAIT       {a_label}  running in run other0000000" not in said:
        assert time.monotonic() < deadline and thread.is_alive(), said
        time.sleep(0.02)
        said += capfd.readouterr().err
    assert thread.is_alive() and calls(counter, "b") == 0  # b waits for a
    with open(f"{a_dir}/value.json", "w") as f:
        json.dump({"value": 1}, f)
    assert store.commit(a_dir, other, 1)
    thread.join(20)
    report = box["result"]
    assert report.ok
    assert calls(counter, "a") == 0 and calls(counter, "b") == 1
    assert report.outcomes[a_label].state == State.SUCCEEDED


def test_memory_prefix_works_end_to_end(tmp_path):
    counter = str(tmp_path / "calls")
    prefix = f"memory://drydock-{tmp_path.name}"

    # The step writes through fsspec: its output directory is memory://, not a local path.
    steps = [Step("mem/one", write_value_fsspec, WriteConfig(this_output(), versioned(3), counter, "mem"))]
    assert run(steps, prefix).ok
    assert set(states(run(steps, prefix)).values()) == {State.CACHED}
    assert calls(counter, "mem") == 1


def test_cancelled_status_is_not_success(tmp_path):
    # CANCELLED (e.g. Ctrl-C) leaves the step to be rerun, with a reason.
    counter = str(tmp_path / "calls")
    prefix = tmp_path / "prefix"
    steps = chain(counter)
    plan = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    label = next(iter(plan.dag.nodes))
    me = current_owner()
    store = StepStore(LocalStorage())
    store.acquire(plan.dag.nodes[label].output_path, me, ttl=60)
    store.append(plan.dag.nodes[label].output_path, me, 1, Event.CANCELLED, "interrupted")
    store.release(plan.dag.nodes[label].output_path, me, 1)
    plan = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), dry_run=True))
    assert plan.steps[label].state == State.RUN
    assert plan.steps[label].reason == "previous attempt was cancelled"


def test_a_step_calling_sys_exit_fails_and_releases_its_lease(tmp_path):
    step = Step("exits", stepfns.exit_early, FailConfig(this_output(), str(tmp_path / "calls")))
    report = run([step], tmp_path / "prefix")
    ((label, outcome),) = report.outcomes.items()
    assert outcome.state == State.FAILED and outcome.error == "SystemExit: 3"
    store = StepStore(LocalStorage())
    step_dir = report.plan.dag.nodes[label].output_path
    assert [e.event for e in store.events(step_dir)] == [Event.RUNNING, Event.FAILED]
    assert store.lease(step_dir).released


def test_corrupt_status_is_a_clear_error_and_force_reruns_it(tmp_path):
    counter, prefix = str(tmp_path / "calls"), tmp_path / "prefix"
    first = run(chain(counter), prefix)
    label = next(label for label, node in first.plan.dag.nodes.items() if node.name == "data/b")
    status = Path(first.plan.dag.nodes[label].output_path) / ".status"
    status.write_bytes(status.read_bytes() + b"garbage\n")
    with pytest.raises(StorageError, match=r"step 'data/b': .*\.status line 3 is corrupt.*--force"):
        run(chain(counter), prefix)
    report = run(chain(counter), prefix, force="^data/b$")
    assert report.ok
    assert states(report)["data/b"] == State.SUCCEEDED
    assert [e.event for e in StepStore(LocalStorage()).events(str(status.parent))] == [
        Event.RUNNING,
        Event.SUCCESS,
    ]
    (aside,) = status.parent.glob(".status.corrupt-*")
    assert aside.read_bytes().endswith(b"garbage\n")
    assert calls(counter, "b") == 2


def test_a_step_reports_a_warning_note_without_changing_its_state(tmp_path):
    step = Step("warns", stepfns.warn_then_write, WriteConfig(this_output(), versioned(1)))
    report = run([step], tmp_path / "prefix")
    assert report.ok
    (label,) = report.outcomes
    events = StepStore(LocalStorage()).events(report.plan.dag.nodes[label].output_path)
    assert [e.event for e in events] == [Event.RUNNING, "WARNING", Event.SUCCESS]
    assert events[1].message.startswith("loss spiked") and events[1].data == {"step": 7}
    assert set(states(run([step], tmp_path / "prefix")).values()) == {State.CACHED}


def test_an_attempt_always_reports_even_when_describing_its_error_fails(tmp_path):
    # The loop waits for one event per attempt; an error in the error path must not hang the run.
    step = Step("weird", stepfns.fail_unprintably, FailConfig(this_output()))
    (outcome,) = run([step], tmp_path / "prefix").outcomes.values()
    assert outcome.state == State.FAILED and outcome.error.startswith("internal error")
