"""Runners whose clocks disagree: a lease is judged by watching it, not by comparing two clocks.

Each runner here is a real executor on the local backend, in a thread of this process, on one
prefix on disk. One runner's clock is set 60 s ahead or behind (its `StepStore`, heartbeat and
executor all read it), as a host out of NTP sync would be.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, this_output
from pipeline.core.lease import Owner
from pipeline.core.plan import State
from pipeline.processes import current_owner, host_id
from pipeline.run.backends.local import LocalBackend
from pipeline.run.console.reporter import Reporter
from pipeline.run.experiment import prepare
from pipeline.run.scheduler.executor import ExecutionOptions, RunReport, execute
from pipeline.storage.step_store import StepStore
from tests.pipeline.stepfns import SleepConfig, calls, sleep_then_write

LEASE, HEARTBEAT, POLL = 1.5, 0.25, 0.1


def _step(tmp_path: Path, seconds: float) -> Step:
    return Step("slow/step", sleep_then_write, SleepConfig(this_output(), seconds, str(tmp_path / "calls")))


def _runner(step: Step, prefix: Path, offset: float, skew: float, lines: list[str]) -> RunReport:
    """Plan and run `step` with a clock `offset` seconds off and a clock-skew allowance `skew`."""
    config = ExecutorMainConfig(
        prefix=str(prefix),
        backend="local",
        lease_timeout=LEASE,
        heartbeat_interval=HEARTBEAT,
        wait_poll_interval=POLL,
        clock_skew=skew,
    )
    _, store, plan = prepare([step], config)
    clock: Callable[[], float] = lambda: time.time() + offset  # noqa: E731
    options = ExecutionOptions(
        max_concurrent=2,
        lease_timeout=LEASE,
        heartbeat_interval=HEARTBEAT,
        wait_poll_interval=POLL,
        clock_skew=skew,
    )
    skewed = StepStore(store.storage, clock=clock)
    return execute(
        plan, skewed, LocalBackend(), current_owner(), options, Reporter(lines.append), clock=clock
    )


def _in_thread(fn: Callable[[], RunReport]) -> tuple[threading.Thread, dict[str, RunReport]]:
    box: dict[str, RunReport] = {}
    thread = threading.Thread(target=lambda: box.setdefault("report", fn()), daemon=True)
    thread.start()
    return thread, box


def _wait_for_call(counter: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while calls(str(counter), "sleep") == 0:
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.02)


@pytest.mark.parametrize("offset", [60.0, -60.0])
def test_a_runner_60s_off_never_takes_a_live_step_over(tmp_path, offset):
    step, prefix = _step(tmp_path, seconds=4 * LEASE), tmp_path / "prefix"
    holder_lines: list[str] = []
    holder, holder_box = _in_thread(lambda: _runner(step, prefix, 0.0, 60.0, holder_lines))
    _wait_for_call(tmp_path / "calls")
    lines: list[str] = []
    other = _runner(step, prefix, offset, 60.0, lines)  # starts while the step runs; waits for it
    holder.join(60)
    assert holder_box["report"].ok and other.ok
    assert calls(str(tmp_path / "calls"), "sleep") == 1, lines
    assert not any("TAKEOVER" in line for line in lines), lines
    (outcome,) = other.outcomes.values()
    assert outcome.state == State.SUCCEEDED and outcome.attempts <= 1


def test_without_the_allowance_the_fast_clock_takes_a_live_step_over(tmp_path):
    """Why `--clock_skew` exists: judged by `expires` alone, a clock 60 s ahead sees every live
    lease as long expired and runs the step a second time."""
    step, prefix = _step(tmp_path, seconds=4 * LEASE), tmp_path / "prefix"
    holder, _ = _in_thread(lambda: _runner(step, prefix, 0.0, 0.0, []))
    _wait_for_call(tmp_path / "calls")
    lines: list[str] = []
    _runner(step, prefix, 60.0, 0.0, lines)
    holder.join(60)
    assert calls(str(tmp_path / "calls"), "sleep") == 2


def _dead_holder(step: Step, prefix: Path, offset: float) -> float:
    """A runner on another host took the step with its clock `offset` seconds off, then died.
    Returns the real time its lease ran out."""
    config = ExecutorMainConfig(prefix=str(prefix), backend="local")
    dag, store, _ = prepare([step], config)
    (node,) = dag.nodes.values()
    ghost = Owner("ghost0000000", "elsewhere/" + host_id().split("/", 1)[-1], 1, None)
    StepStore(store.storage, clock=lambda: time.time() + offset).acquire(node.output_path, ghost, LEASE)
    return time.time() + LEASE


@pytest.mark.parametrize("offset", [60.0, -60.0, 1000.0])
def test_a_dead_runners_step_is_taken_over_once_its_lease_stops_changing_whatever_its_clock(tmp_path, offset):
    step, prefix = _step(tmp_path, seconds=0.1), tmp_path / "prefix"
    ran_out = _dead_holder(step, prefix, offset)
    lines: list[str] = []
    report = _runner(step, prefix, 0.0, 60.0, lines)
    # Started after the lease really ran out (the watch began after its last renewal)...
    assert report.ok and calls(str(tmp_path / "calls"), "sleep") == 1
    started = (tmp_path / "calls" / "sleep.calls").stat().st_mtime
    assert started >= ran_out - 0.05, (started, ran_out)
    # ...and within a lease timeout or so of it, not at its `expires` (up to 1000 s away).
    assert started < ran_out + LEASE + 5, lines
    assert any("TAKEOVER" in line for line in lines), lines


def test_a_runner_60s_ahead_does_not_take_a_just_dead_runners_step_early(tmp_path):
    """Its clock says the lease ran out a minute ago; it waits until it has seen it unchanged."""
    step, prefix = _step(tmp_path, seconds=0.1), tmp_path / "prefix"
    ran_out = _dead_holder(step, prefix, 0.0)
    report = _runner(step, prefix, 60.0, 60.0, [])
    assert report.ok
    assert (tmp_path / "calls" / "sleep.calls").stat().st_mtime >= ran_out - 0.05


@pytest.mark.parametrize("remote", [False, True])
def test_a_killed_runners_step_waits_for_its_lease_only_if_its_workers_may_be_elsewhere(tmp_path, remote):
    """A dead process on this host frees its lease at once, unless its step ran on a Ray cluster,
    where a worker on another host outlives it until the lease expires (its fence)."""
    import multiprocessing
    import os

    step, prefix = _step(tmp_path, seconds=0.1), tmp_path / "prefix"
    dag, store, _ = prepare([step], ExecutorMainConfig(prefix=str(prefix), backend="local"))
    (node,) = dag.nodes.values()
    proc = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    proc.start()
    proc.join()
    dead = Owner("deadbeef0000", host_id(), proc.pid, None)
    store.acquire(node.output_path, dead, LEASE, remote_workers=remote)
    ran_out = time.time() + LEASE
    report = _runner(step, prefix, 0.0, 0.5, [])
    started = (tmp_path / "calls" / "sleep.calls").stat().st_mtime
    assert report.ok and calls(str(tmp_path / "calls"), "sleep") == 1
    if remote:
        assert started >= ran_out  # after the lease (and so the workers' fence) ran out
    else:
        assert started < ran_out - 0.5  # at once
