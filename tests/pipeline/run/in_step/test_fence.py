"""The write fence (pipeline/fence.py) and the local backend's use of it, on real files and threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned
from pipeline.core.lease import Owner
from pipeline.core.plan import State
from pipeline.errors import StepCancelled
from pipeline.processes import current_owner, host_id, process_start_time
from pipeline.run.backends.base import StepTask
from pipeline.run.backends.local import LocalBackend
from pipeline.run.in_step.call_step import lease_fence
from pipeline.run.in_step.fence import Fence, LeaseExpired, fenced_process, fenced_thread, watch_lease
from pipeline.run.in_step.step_events import StepContext
from pipeline.run.scheduler.executor import RunReport
from pipeline.run.scheduler.heartbeat import Heartbeat
from pipeline.step import Resources
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import Acquired, Held, StepStore
from tests.pipeline.stepfns import WriteConfig, write_value

EXPIRED = -1.0
"""A `remaining()` value: the lease may have expired."""


def _open(path: Path, mode: str) -> None:
    with open(path, mode):
        pass


def _in_thread(fn) -> BaseException | None:
    """Run `fn` in a new thread; what it raised, or None."""
    raised: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as e:
            raised.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return raised[0] if raised else None


def test_a_fence_refuses_once_the_deadline_has_passed_and_remembers_the_first_refusal():
    left = [5.0]
    fence = Fence(lambda: left[0], "src/a")
    fence.check("open 'x'")  # time left: allowed
    assert not fence.tripped
    left[0] = 0.0  # exactly at the deadline: the lease may already be another runner's
    with pytest.raises(LeaseExpired, match=r"step src/a: the lease may have expired; refused open 'y'"):
        fence.check("open 'y'")
    with pytest.raises(LeaseExpired):
        fence.check("open 'z'")
    assert fence.tripped and fence.refused == "open 'y'"
    assert issubclass(LeaseExpired, StepCancelled)  # a step's `except Exception` does not swallow it


def test_a_fenced_thread_cannot_create_change_or_remove_files_but_can_read(tmp_path):
    existing = tmp_path / "existing"
    existing.write_text("before")
    fence = Fence(lambda: EXPIRED)

    def attempts() -> list[str]:
        refused = []
        with fenced_thread(fence):
            assert existing.read_text() == "before"  # reading is always allowed
            for name, write in [
                ("open w", lambda: _open(tmp_path / "new", "w")),
                ("open a", lambda: _open(existing, "a")),
                ("open r+", lambda: _open(existing, "r+")),
                ("os.open", lambda: os.open(tmp_path / "new", os.O_WRONLY | os.O_CREAT)),
                ("replace", lambda: os.replace(existing, tmp_path / "moved")),
                ("remove", lambda: os.remove(existing)),
                ("mkdir", lambda: os.mkdir(tmp_path / "dir")),
            ]:
                try:
                    write()
                except LeaseExpired:
                    refused.append(name)
        return refused

    result: list[list[str]] = []
    assert _in_thread(lambda: result.append(attempts())) is None
    assert len(result[0]) == 7, result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing"]
    assert existing.read_text() == "before"


def test_outside_a_fence_and_in_other_threads_writes_are_unaffected(tmp_path):
    inside = threading.Event()
    release = threading.Event()

    def fenced_step() -> None:
        with fenced_thread(Fence(lambda: EXPIRED)):
            inside.set()
            release.wait()

    thread = threading.Thread(target=fenced_step)
    thread.start()
    inside.wait()
    try:
        # The executor's own writes happen in other threads while a fenced step runs.
        (tmp_path / "executor-write").write_text("ok")
        os.replace(tmp_path / "executor-write", tmp_path / "renamed")
    finally:
        release.set()
        thread.join()
    # After the fence is lifted the same thread (a reused worker thread) writes freely again.
    assert _in_thread(lambda: (tmp_path / "later").write_text("ok")) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["later", "renamed"]


def test_the_deadline_is_read_at_each_write(tmp_path):
    left = [10.0]
    fence = Fence(lambda: left[0])

    def step() -> None:
        with fenced_thread(fence):
            (tmp_path / "part-0").write_text("in time")
            left[0] = EXPIRED  # the lease ran out (what a heartbeat that stops renewing means)
            (tmp_path / "part-1").write_text("too late")

    assert isinstance(_in_thread(step), LeaseExpired)
    assert [p.name for p in tmp_path.iterdir()] == ["part-0"]


def test_a_process_fence_covers_threads_started_inside_it_but_not_those_already_running(tmp_path):
    host_go = threading.Event()
    host_done = threading.Event()
    host_result: list[BaseException | None] = []

    def host_thread() -> None:  # e.g. Ray's own threads in a worker: already running
        host_go.wait()
        host_result.append(_try(lambda: (tmp_path / "host").write_text("ok")))
        host_done.set()

    host = threading.Thread(target=host_thread)
    host.start()
    fence = Fence(lambda: EXPIRED)
    with fenced_process(fence):
        own = _try(lambda: (tmp_path / "own").write_text("x"))
        spawned = _in_thread(lambda: (tmp_path / "spawned").write_text("x"))
        host_go.set()
        host_done.wait()
    host.join()
    assert isinstance(own, LeaseExpired) and isinstance(spawned, LeaseExpired)
    assert host_result == [None]
    # Lifted when the task ends: a reused worker is not left fenced.
    assert _try(lambda: (tmp_path / "after").write_text("ok")) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["after", "host"]


def test_check_lease_guards_writes_the_hook_cannot_see_in_the_threads_the_step_chooses():
    from pipeline.run.in_step import step_events
    from pipeline.run.in_step.fence import current_fence

    left = [5.0]
    fence = Fence(lambda: left[0], "train/x")
    step_events.check_lease("upload of s3://b/x")  # outside a fence: nothing to check
    assert current_fence() is None
    with fenced_thread(fence):
        assert current_fence() is fence
        step_events.check_lease("upload of s3://b/x")  # time left
        guard = step_events.lease_guard()  # captured in the step's thread...
        assert _in_thread(lambda: step_events.check_lease("unseen")) is None  # (a new thread has no fence)
        left[0] = 0.0
        raised = _in_thread(
            lambda: guard("upload of s3://b/x/metrics/part-000001.jsonl")
        )  # ...checked in another
        assert isinstance(raised, LeaseExpired)
        assert "train/x: the lease may have expired; refused upload of s3://b/x/metrics" in str(raised)
    assert fence.refused == "upload of s3://b/x/metrics/part-000001.jsonl"
    with fenced_process(Fence(lambda: 5.0)) as process_fence:
        assert current_fence() is process_fence
        assert _in_thread(lambda: None) is None and _in_thread(current_fence) is None  # returns, not raises


def test_lease_lost_marks_the_fence_so_the_attempt_is_reported_lost_however_it_ends():
    from pipeline.run.in_step import step_events

    fence = Fence(lambda: 60.0, "train/x")  # the deadline has not passed: the step found out otherwise
    with fenced_thread(fence), pytest.raises(LeaseExpired, match="another attempt saved it; refused ckpt 9"):
        step_events.lease_lost("ckpt 9", "another attempt saved it")
    assert fence.tripped and fence.refused == "ckpt 9"
    with pytest.raises(LeaseExpired, match="outside; refused w"):  # no fence: still stops the caller
        step_events.lease_lost("w", "outside")


def _try(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as e:
        return e
    return None


def test_watch_lease_refreshes_the_deadline_and_stops_its_thread():
    go, refreshed = threading.Event(), threading.Event()
    reads: list[int] = []

    def read() -> float:
        reads.append(1)
        if len(reads) == 1:
            return 105.0  # read before the step starts: the lease is ours until 105
        if len(reads) == 2:
            go.wait()
            return float("-inf")  # then another attempt's (or released)
        refreshed.set()  # a third read starts only after the second one's value was stored
        return float("-inf")

    with watch_lease(read, 0.01, "src/a", clock=lambda: 100.0) as fence:
        assert fence.remaining() == 5.0
        fence.check("open 'x'")
        go.set()
        refreshed.wait()
        with pytest.raises(LeaseExpired):
            fence.check("open 'x'")
    assert not any(t.name == "drydock-fence" for t in threading.enumerate())


@pytest.mark.parametrize("unreadable", ["raises", "partial record"])
def test_watch_lease_keeps_the_last_deadline_while_the_lease_cannot_be_read(unreadable):
    reads: list[int] = []
    failed = threading.Event()

    def read() -> float | None:
        reads.append(1)
        if len(reads) == 1:
            return 200.0
        if len(reads) > 2:
            failed.set()  # the second read has been handled
        if unreadable == "raises":
            raise OSError("storage unreachable")
        return None

    with watch_lease(read, 0.01, clock=lambda: 150.0) as fence:
        failed.wait()
        assert fence.remaining() == 50.0


def test_watch_lease_starts_from_the_submitters_deadline_until_a_read_tells():
    with watch_lease(lambda: None, 60.0, clock=lambda: 10.0, initial=12.0) as fence:
        assert fence.remaining() == 2.0
    with watch_lease(lambda: None, 60.0, clock=lambda: 10.0) as fence:  # no initial: refuse
        assert fence.remaining() == float("-inf")


# -- a Ray worker and its driver ----------------------------------------------------------------


def _leased_to(step_dir: Path, pid: int, host: str) -> StepContext:
    """A step directory whose lease (valid for an hour) is held by process `pid` on `host`."""
    store = StepStore(LocalStorage())
    owner = Owner("driver00run0", host, pid, process_start_time(pid))
    taken = store.acquire(str(step_dir), owner, ttl=3600)
    assert isinstance(taken, Acquired)
    return StepContext(str(step_dir), owner.run_id, taken.token, backend="ray")


def test_a_worker_on_its_drivers_host_stops_writing_as_soon_as_the_driver_exits(tmp_path):
    """A killed driver's Ray worker lives on for a second or two, and a rerun on the driver's
    host takes the step over at once (the driver's pid is gone): the worker must not write
    meanwhile, although the lease it goes by has an hour left and is re-read only every minute."""
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        context = _leased_to(tmp_path / "step", driver.pid, host_id())
        with lease_fence(context, 60.0, time.time() + 3600, "step") as fence, fenced_thread(fence):
            _open(tmp_path / "step" / "before.txt", "w")
            driver.kill()
            driver.wait()
            with pytest.raises(LeaseExpired, match="refused open"):
                _open(tmp_path / "step" / "after.txt", "w")
    finally:
        driver.kill()
        driver.wait()
    assert (tmp_path / "step" / "before.txt").exists()
    assert not (tmp_path / "step" / "after.txt").exists()


def test_a_worker_on_another_host_goes_by_the_lease_alone(tmp_path):
    """Another host's pid means nothing here: a dead local process with the driver's pid must not
    close the fence of a worker whose driver runs elsewhere."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    context = _leased_to(tmp_path / "step", gone.pid, "elsewhere/0000")
    with lease_fence(context, 60.0, time.time() + 3600, "step") as fence, fenced_thread(fence):
        _open(tmp_path / "step" / "written.txt", "w")
    assert (tmp_path / "step" / "written.txt").exists()


# -- the local backend --------------------------------------------------------------------------


@dataclass(frozen=True)
class _TicksConfig:
    output: str
    expire_after: int
    """Parts written before the lease runs out."""
    swallow: bool = False
    """Catch the refusal and return normally (a step that hides errors)."""


_LEFT: dict[str, float] = {}


def _ticks(config: _TicksConfig) -> None:
    os.makedirs(config.output, exist_ok=True)
    for i in range(4):
        if i == config.expire_after:
            _LEFT[config.output] = EXPIRED
        try:
            Path(config.output, f"part-{i}").write_text(str(i))
        except LeaseExpired:
            if not config.swallow:
                raise
            return


def _task(tmp_path: Path, **kwargs) -> StepTask:
    output = str(tmp_path / "out")
    _LEFT[output] = 10.0
    config = _TicksConfig(output, **kwargs)
    return StepTask("s", "s", _ticks, config, Resources(), output, lease_remaining=lambda: _LEFT[output])


@pytest.mark.parametrize("swallow", [False, True])
def test_the_local_backend_stops_a_step_at_its_lease_deadline(tmp_path, swallow):
    task = _task(tmp_path, expire_after=2, swallow=swallow)
    # Even a step that catches the refusal and returns is reported as fenced: its output is partial.
    with pytest.raises(LeaseExpired, match="refused open"):
        LocalBackend().run(task)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["part-0", "part-1"]


def test_the_local_backend_does_not_fence_a_task_without_a_deadline(tmp_path):
    output = str(tmp_path / "out")
    LocalBackend().run(StepTask("s", "s", _ticks, _TicksConfig(output, 99), Resources(), output))
    assert len([p for p in (tmp_path / "out").iterdir() if not p.name.startswith(".")]) == 4
    assert not (tmp_path / "out" / ".logs").exists()  # the attempt printed nothing: no log file


def test_the_executor_commits_fenced_steps_normally(tmp_path):
    # Every step runs fenced; the executor's own writes (.step.json, .status, SUCCESS) are not.
    counter = str(tmp_path / "calls")
    steps = [
        Step(f"data/d{i}", write_value, WriteConfig(this_output(), versioned(i), counter, f"d{i}"))
        for i in range(3)
    ]
    report = run_experiment(steps, ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local"))
    assert isinstance(report, RunReport) and report.ok
    assert len(report.labels(State.SUCCEEDED)) == 3


def test_the_heartbeat_deadline_follows_renewals_and_ends_with_the_lease(tmp_path):
    now = [1000.0]
    store = StepStore(LocalStorage(), clock=lambda: now[0])
    owner, other = current_owner(), Owner("other", "elsewhere/boot", 1, None)
    step_dir = str(tmp_path / "step")
    lost: list[str] = []
    beat = Heartbeat(store, owner, ttl=3.0, interval=1.0, on_lost=lost.append, clock=lambda: now[0])
    token = store.acquire(step_dir, owner, 3.0).token
    beat.add(step_dir, "s", token, since=999.5)  # asked for the lease at 999.5
    assert beat.valid_until(step_dir) == 1002.5  # never later than `.lease` says (1003)
    now[0] = 1001.0
    beat.beat()
    assert beat.valid_until(step_dir) == 1004.0 == store.lease(step_dir).expires
    beat.remove(step_dir)  # the attempt ended: a step thread still running may write no more
    assert beat.valid_until(step_dir) == float("-inf")
    beat.add(step_dir, "s", token)
    now[0] = 1005.0  # expired; another runner takes it over
    assert not isinstance(store.acquire(step_dir, other, 3.0), Held)
    beat.beat()
    assert lost == ["s"] and beat.valid_until(step_dir) == float("-inf")
