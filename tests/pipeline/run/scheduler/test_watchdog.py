"""The runner's watchdog (issue 31, part 1): the bound, what it reads, how it names a suspect, and
a real hang on the local backend, detected, stacks saved, retried, finished."""

from __future__ import annotations

import json
import threading
import time

import pytest

from pipeline import ExecutorMainConfig, HangPolicy, Resources, Step, run_experiment, this_output
from pipeline.core.ledger import step_ledger
from pipeline.core.records import Event
from pipeline.run.in_step.pulse import dump_stacks
from pipeline.run.scheduler.watchdog import Hang, Watchdog, describe_stacks
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from tests.pipeline.run.hangfns import HangConfig, hanging


def test_the_bound_follows_the_pace_with_a_floor_a_startup_and_an_override():
    policy = HangPolicy(factor=10.0, floor=60.0, startup=900.0)
    assert policy.bound(None) == 900.0  # before the first report
    assert policy.bound(2.0) == 60.0  # 10 x 2 s is under the floor
    assert policy.bound(30.0) == 300.0
    assert policy.bound(30.0, fixed=45.0) == 45.0  # Resources.hang_timeout
    assert policy.bound(None, fixed=4000.0) == 4000.0
    assert policy.bound(None, fixed=45.0, reported=True) == 45.0  # reported, pace not known yet
    assert policy.bound(None, reported=True) == 900.0


def waiting_in_sleep(ready: threading.Event, stop: threading.Event) -> None:
    ready.set()
    while not stop.is_set():
        time.sleep(0.01)


def test_stacks_name_where_the_step_thread_is():
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=waiting_in_sleep, args=(ready, stop))
    thread.start()
    ready.wait()
    try:
        text = dump_stacks(thread.ident, "host 1 of 2, pid 1 on h")
    finally:
        stop.set()
        thread.join()
    in_jax, where = describe_stacks(text)
    assert not in_jax and where.startswith("is in waiting_in_sleep at test_watchdog.py:")
    # A step thread inside JAX's collectives waits for someone.
    collective = text.replace("waiting_in_sleep", "process_allgather").replace(
        "test_watchdog.py", "jax/experimental/multihost_utils.py"
    )
    assert describe_stacks(collective) == (True, "waits in a collective (process_allgather)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_stalled_attempt_is_asked_for_stacks_then_reported_naming_the_odd_host(tmp_path):
    step_dir = tmp_path / "train-0123456789ab"
    logs = step_dir / ".logs"
    logs.mkdir(parents=True)
    store, clock, hangs = StepStore(LocalStorage()), Clock(), []
    dog = Watchdog(store, lambda label, hang: hangs.append((label, hang)), clock=clock, dump_wait=20.0)
    dog.watch("train", str(step_dir), 7, HangPolicy(factor=10.0, floor=5.0, startup=100.0), None)

    def report(done: int, at: float) -> None:
        record = {"done": done, "total": 100, "unit": "steps", "time": at, "token": 7}
        (step_dir / ".progress").write_text(json.dumps(record))

    for done in range(1, 11):  # one step every 2 s: the bound is 10 x 2 s = 20 s
        report(done, 2000.0 + 2 * done)
        clock.now += 2
        dog.check()
    for host in (0, 1):
        (logs / f"attempt-7-host-{host}.pulse").write_text("{}")
    clock.now += 19
    dog.check()
    assert not (logs / "attempt-7.dump").exists() and not hangs
    clock.now += 2  # 21 s without progress
    dog.check()
    assert (logs / "attempt-7.dump").exists() and not hangs  # asked; waits for the stacks
    frames = {
        0: 'File "/venv/jax/experimental/multihost_utils.py", line 300 in process_allgather',
        1: 'File "/work/tests/gangfns.py", line 42 in _stuck',
    }
    for host, frame in frames.items():
        (logs / f"attempt-7-host-{host}-stacks.log").write_text(
            f"host {host} of 2\nstep thread: 0x00000000000000aa\n\n"
            f"Thread 0x00000000000000aa (most recent call first):\n  {frame}\n"
        )
    clock.now += 5
    dog.check()
    ((label, hang),) = hangs
    assert label == "train" and isinstance(hang, Hang)
    assert hang.message.startswith("HUNG: no progress for 26 s (bound 20 s) after 10 steps; ")
    assert (
        "host 1 is in _stuck at gangfns.py:42; host 0 waits in a collective (process_allgather)"
        in hang.message
    )
    assert hang.data["suspects"] == [1] and hang.data["done"] == 10
    dog.check()  # reported once: the attempt is no longer watched
    assert len(hangs) == 1


def test_each_new_report_is_passed_on_and_the_last_one_too_when_the_attempt_ends(tmp_path):
    step_dir = tmp_path / "train-0123456789ab"
    step_dir.mkdir()
    store, clock, seen = StepStore(LocalStorage()), Clock(), []
    dog = Watchdog(
        store, lambda label, hang: None, on_report=lambda label, r: seen.append(r["done"]), clock=clock
    )
    dog.watch("train", str(step_dir), 7, HangPolicy(), None)

    def report(done: int, token: int = 7) -> None:
        record = {"done": done, "total": 9, "unit": "steps", "time": 100.0 + done, "token": token}
        (step_dir / ".progress").write_text(json.dumps(record))

    report(1)
    dog.check()
    dog.check()  # the same report: not passed on again
    report(2)
    dog.check()
    report(3)  # written after the last look, just before the attempt ended
    dog.finish("train")
    assert seen == [1, 2, 3]
    report(4)
    dog.check()
    dog.finish("train")  # no longer watched: nothing more
    assert seen == [1, 2, 3]
    dog.watch("train", str(step_dir), 8, HangPolicy(), None)
    dog.finish("train")  # another attempt's report (token 7) is not this one's
    assert seen == [1, 2, 3]


def test_a_hung_step_is_stopped_its_stacks_saved_and_retried(tmp_path, webhook):
    step = Step(
        "hang/once",
        hanging,
        HangConfig(this_output(), steps=6, hang_at=3, marker=str(tmp_path / "hung-once")),
        resources=Resources(hang_timeout=2.0),
    )
    prefix = tmp_path / "prefix"
    url, received = webhook
    report = run_experiment([step], ExecutorMainConfig(prefix=str(prefix), backend="local", notify=url))
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = prefix.glob("hang/once-*")
    assert (step_dir / "done").exists()
    events = StepStore(LocalStorage()).events(str(step_dir))
    kinds = [e.event for e in events]
    assert kinds == [Event.RUNNING, Event.WARNING, Event.PREEMPTED, Event.RUNNING, Event.SUCCESS], kinds
    warning, preempted = events[1], events[2]
    # The reports are written every 2 s at most: the last one written was of step 1, 2 or 3.
    assert warning.message.startswith("HUNG: no progress for ") and warning.data["done"] in (1, 2, 3)
    assert "its step is in _stuck at hangfns.py:" in warning.message
    assert warning.data["hung"] is True and warning.data["bound_seconds"] == 2.0
    assert warning.data["stalled_seconds"] < 2.0 + 3 * 5.0  # the bound, plus the watchdog's polls
    assert preempted.message.startswith("hung: no progress for ")
    # The ledger: the time from the hang to the watchdog's stop is lost; the steps before it are not.
    token = events[0].token
    account = json.loads((step_dir / ".logs" / f"attempt-{token}.ledger.json").read_text())
    (hung_attempt, _) = step_ledger(events, {}, {token: account}, None, now=events[-1].time).attempts
    assert hung_attempt.ending == "PREEMPTED" and account["data"]["last_step"] == 3
    lost = hung_attempt.seconds["lost"]
    assert warning.data["stalled_seconds"] - 2.5 <= lost <= preempted.time - events[0].time, (
        lost,
        warning.data,
    )
    assert hung_attempt.seconds["steps"] < 2.0 and sum(hung_attempt.seconds.values()) == pytest.approx(
        hung_attempt.held
    )
    stacks = (step_dir / ".logs" / f"attempt-{events[0].token}-stacks.log").read_text()
    assert "step thread: 0x" in stacks and "_stuck" in stacks
    # The alert promises no checkpoint the step never reported (it said "retrying from its
    # checkpoint" of every step); a training's names the step it resumes from (test_multihost).
    (hung,) = [m["body"]["text"] for m in received if m["body"]["drydock"]["kind"] == "hung"]
    assert hung.endswith("; retrying it") and "checkpoint" not in hung, hung


def test_the_same_hang_crash_limit_times_in_a_row_fails_the_step(tmp_path):
    """A step that hangs at the same place on every attempt is not a lost machine: after
    `crash_limit` hangs in a row it fails, saying so, instead of spending its preemption budget."""
    step = Step(
        "hang/always",
        hanging,
        HangConfig(this_output(), steps=6, hang_at=2, always=True),
        resources=Resources(hang_timeout=1.0, crash_limit=2),
    )
    prefix = tmp_path / "prefix"
    report = run_experiment([step], ExecutorMainConfig(prefix=str(prefix), backend="local"))
    assert not report.ok
    (step_dir,) = prefix.glob("hang/always-*")
    events = StepStore(LocalStorage()).events(str(step_dir))
    kinds = [e.event for e in events]
    assert kinds == [
        Event.RUNNING,
        Event.WARNING,
        Event.PREEMPTED,
        Event.RUNNING,
        Event.WARNING,
        Event.FAILED,
    ], kinds
    failed = events[-1]
    assert failed.message.startswith("the same crash 2 times in a row (hung: no progress for "), failed

    assert failed.data["cause"] == "hung"
    assert not (step_dir / "done").exists()
