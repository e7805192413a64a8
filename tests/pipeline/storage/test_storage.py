"""The commit protocol on real local disk and on memory://: leases, fencing, conditional commits."""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
import uuid

import pytest

from pipeline.core.lease import LeaseRecord, Owner
from pipeline.core.records import Event, parse_status
from pipeline.errors import StorageError
from pipeline.processes import current_owner
from pipeline.storage.files import LocalStorage, Storage
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, AlreadyDone, Held, StepStore


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def other_owner(host: str = "elsewhere/0000") -> Owner:
    # A runner on another host: its liveness cannot be checked, only its lease expiry.
    return Owner(uuid.uuid4().hex[:12], host, 4242, None)


@pytest.fixture(params=["local", "memory"])
def step_dir(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "prefix" / "step-abc")
    return f"memory://test-{uuid.uuid4().hex}/step-abc"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(step_dir, clock) -> StepStore:
    return StepStore(open_storage(step_dir), clock)


def test_acquire_records_running_and_commit_writes_success(store, step_dir):
    me = current_owner()
    taken = store.acquire(step_dir, me, ttl=60)
    assert taken == Acquired(1)
    assert [e.event for e in store.events(step_dir)] == [Event.RUNNING]
    store.storage.write(f"{step_dir}/payload.txt", b"x")
    assert store.commit(step_dir, me, 1)
    record = store.record(step_dir)
    assert record.succeeded
    assert record.events[-1].token == 1
    assert store.lease(step_dir).released


def test_second_runner_sees_live_lease_as_held(store, step_dir):
    a, b = other_owner("host-a/1"), other_owner("host-b/1")
    assert isinstance(store.acquire(step_dir, a, ttl=60), Acquired)
    held = store.acquire(step_dir, b, ttl=60)
    assert isinstance(held, Held)
    assert held.lease.run_id == a.run_id


def test_expired_lease_is_taken_over_with_a_higher_token(store, step_dir, clock):
    a, b = other_owner("host-a/1"), other_owner("host-b/1")
    assert store.acquire(step_dir, a, ttl=60) == Acquired(1)
    clock.now += 61
    assert store.acquire(step_dir, b, ttl=60) == Acquired(2)
    # The old holder can neither renew, nor commit, nor record a failure.
    assert not store.renew(step_dir, a, 1, ttl=60)
    assert not store.commit(step_dir, a, 1)
    assert not store.append(step_dir, a, 1, Event.FAILED, "late")
    assert [(e.event, e.token) for e in store.events(step_dir)] == [(Event.RUNNING, 1), (Event.RUNNING, 2)]
    assert store.commit(step_dir, b, 2)
    assert store.record(step_dir).succeeded


def test_commit_refused_when_own_lease_expired_even_if_nobody_took_it(store, step_dir, clock):
    a = other_owner("host-a/1")
    store.acquire(step_dir, a, ttl=60)
    clock.now += 61
    assert not store.commit(step_dir, a, 1)
    assert not store.record(step_dir).succeeded


def test_renew_extends_the_lease(store, step_dir, clock):
    a, b = other_owner("host-a/1"), other_owner("host-b/1")
    store.acquire(step_dir, a, ttl=60)
    clock.now += 50
    assert store.renew(step_dir, a, 1, ttl=60)
    clock.now += 50  # 100 s after acquiring, 50 s after renewing
    assert isinstance(store.acquire(step_dir, b, ttl=60), Held)


def test_acquire_after_success_reports_done(store, step_dir):
    me = current_owner()
    store.acquire(step_dir, me, ttl=60)
    store.commit(step_dir, me, 1)
    assert isinstance(store.acquire(step_dir, other_owner(), ttl=60), AlreadyDone)


def test_forced_rerun_runs_once_over_the_success_seen_at_plan_time(store, step_dir):
    me = current_owner()
    store.acquire(step_dir, me, ttl=60)
    store.commit(step_dir, me, 1)
    seen = len(store.events(step_dir))
    assert store.acquire(step_dir, me, ttl=60, rerun_after=seen) == Acquired(2)
    store.commit(step_dir, me, 2)
    # A second forced runner that planned from the same snapshot finds the newer SUCCESS.
    assert isinstance(store.acquire(step_dir, other_owner(), ttl=60, rerun_after=seen), AlreadyDone)


def test_token_survives_a_lost_lease_file(store, step_dir, clock):
    a = other_owner("host-a/1")
    store.acquire(step_dir, a, ttl=60)
    store.storage.write(f"{step_dir}/.lease", b"")  # truncated by a crash
    clock.now += 1
    taken = store.acquire(step_dir, other_owner("host-b/1"), ttl=60)
    assert taken == Acquired(2), "the next token must still exceed every token in .status"


def dead_owner_here() -> Owner:
    """An owner on this host whose process has exited."""
    proc = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    proc.start()
    proc.join()
    return Owner("deadbeef0000", current_owner().host, proc.pid, None)


def test_lease_of_a_dead_process_on_this_host_is_stale_at_once(store, step_dir):
    me = current_owner()
    store.acquire(step_dir, dead_owner_here(), ttl=3600)
    assert store.acquire(step_dir, me, ttl=60) == Acquired(2)


def test_a_dead_runner_whose_workers_may_be_elsewhere_is_taken_over_only_once_its_lease_expires(
    store, step_dir, clock
):
    """A runner on a Ray cluster is killed: its workers on other hosts live on until their fence
    closes at the lease's expiry, so its process being gone does not free the step."""
    me = current_owner()
    assert store.acquire(step_dir, dead_owner_here(), ttl=60, remote_workers=True) == Acquired(1)
    (running,) = store.events(step_dir)
    assert running.data == {"attempt": 1, "remote_workers": True}
    assert isinstance(store.acquire(step_dir, me, ttl=60), Held)  # its pid is gone, its lease is not
    clock.now += 60
    assert store.acquire(step_dir, me, ttl=60) == Acquired(2)


def test_partial_last_status_line_is_ignored_and_corruption_is_reported(tmp_path):
    good = b'{"event": "RUNNING", "token": 1, "time": 1.0}\n'
    assert [e.event for e in parse_status(good + b'{"event": "SUC')] == [Event.RUNNING]
    with pytest.raises(StorageError, match=r"line 2 is corrupt.*--force"):
        parse_status(good + b"not json\n" + good, "x/.status")


RUN = '{"event": "RUNNING", "token": 1, "time": 1.0, "run_id": "r"}'
SUCCESS = '{"data": {"drift": "d"}, "event": "SUCCESS", "time": 2, "token": 1}'


@pytest.mark.parametrize(
    "lines, expected",
    [
        ([RUN, SUCCESS], ["RUNNING", "SUCCESS"]),
        ([RUN, "", "  ", SUCCESS], ["RUNNING", "SUCCESS"]),  # blank lines are skipped
        ([RUN + "\r", SUCCESS], ["RUNNING", "SUCCESS"]),
        ([RUN, f"{RUN},{SUCCESS}"], "line 2 is corrupt"),  # two events on one line
        ([RUN, "[" + SUCCESS, "1]"], "line 2 is corrupt"),  # one value over two lines
        ([RUN, '{"event": "SUCCESS", "token": true, "time": 1}'], "line 2 is corrupt.*token"),
        (['{"event": "RUNNING", "token": 1, "time": 1.0, "data": []}'], "line 1 is corrupt.*data"),
        ([RUN, '{"event": "DONE", "token": 1, "time": 1}'], "line 2 is corrupt.*unknown event"),
    ],
)
def test_status_parsed_whole_and_line_by_line_agree(lines, expected):
    """`.status` is parsed as one JSON array when it can be (one decoder call per file); a file
    that does not give exactly one valid event per line is parsed line by line, which names
    the line at fault, as before."""
    data = "".join(f"{line}\n" for line in lines).encode()
    if isinstance(expected, str):
        with pytest.raises(StorageError, match=expected):
            parse_status(data, "x/.status")
    else:
        assert [e.event for e in parse_status(data)] == expected
        assert [e.event for e in parse_status(data + b'{"event": "FAI')] == expected


def test_status_is_append_only_on_local_disk(tmp_path):
    step_dir = str(tmp_path / "s")
    store = StepStore(LocalStorage())
    me = current_owner()
    store.acquire(step_dir, me, ttl=60)
    inode = os.stat(f"{step_dir}/.status").st_ino
    store.commit(step_dir, me, 1)
    assert os.stat(f"{step_dir}/.status").st_ino == inode
    with open(f"{step_dir}/.status") as f:
        lines = f.read().splitlines()
    assert [json.loads(line)["event"] for line in lines] == [Event.RUNNING, Event.SUCCESS]


def _race(step_dir: str, results: multiprocessing.Queue) -> None:
    store = StepStore(LocalStorage())
    me = current_owner()
    taken = store.acquire(step_dir, me, ttl=60)
    if isinstance(taken, Acquired):
        store.storage.write(f"{step_dir}/out-{os.getpid()}", b"x")
        store.commit(step_dir, me, taken.token)
    results.put(type(taken).__name__)


def test_many_processes_race_for_one_lease_exactly_one_wins(tmp_path):
    step_dir = str(tmp_path / "race")
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(step_dir, results)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    outcomes = sorted(results.get() for _ in procs)
    assert outcomes.count("Acquired") == 1, outcomes
    events = StepStore(LocalStorage()).events(step_dir)
    assert [e.event for e in events] == [Event.RUNNING, Event.SUCCESS]


def test_unwritable_prefix_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match="cannot be created"):
        LocalStorage().check_writable(str(blocker / "prefix"))


def test_lease_record_parse_tolerates_garbage():
    assert LeaseRecord.parse(b"") is None
    assert LeaseRecord.parse(b'{"token": 1') is None
    assert LeaseRecord.parse(b'{"unexpected": 1}') is None


def test_a_lease_read_while_its_heartbeat_rewrites_it_is_never_empty(tmp_path):
    """Issue 19: the commit read `.lease` without the lock while the heartbeat rewrote it in place
    (truncate, then write); reading the empty file, a lone run discarded its own result."""
    store = StepStore(LocalStorage())
    step_dir = str(tmp_path / "step")
    me = current_owner()
    token = store.acquire(step_dir, me, 60).token
    stop = threading.Event()

    def heartbeat() -> None:
        ttl = 60.0
        while not stop.is_set():
            ttl += 1e-3  # a different length each time: rewritten, not appended
            store.renew(step_dir, me, token, ttl)

    thread = threading.Thread(target=heartbeat)
    thread.start()
    try:
        seen = [store.lease(step_dir) for _ in range(3000)]
    finally:
        stop.set()
        thread.join()
    assert all(lease is not None and lease.held_by(me, token) for lease in seen)


def test_a_store_that_rewrites_files_in_place_never_shows_a_commit_a_lease_half_written(tmp_path):
    """The same race on `Storage` (process-local locking) over a filesystem that truncates a file
    before writing it: a commit reading `.lease` mid-renewal found it empty and threw its own
    result away (tests/faults/test_outage.py, one run in ~30). Here the renewal stops half-way
    until the read has been made (half a second at most), so the read sees the half-written file
    unless it waits."""
    from fsspec.implementations.local import LocalFileSystem

    halfway, read_made = threading.Event(), threading.Event()

    class InPlace(LocalFileSystem):
        """Writes a file as plain `open(path, "wb")` does: emptied first, then filled."""

        slow = False

        def pipe_file(self, path, value, mode="overwrite", **kwargs):
            with open(self._strip_protocol(path), "wb") as f:
                f.write(value[: len(value) // 2])
                f.flush()
                if self.slow:
                    halfway.set()
                    read_made.wait(timeout=0.5)  # a read that waits for the lock waits this out
                f.write(value[len(value) // 2 :])

    fs = InPlace(skip_instance_cache=True)
    store = StepStore(Storage(fs))
    step_dir = str(tmp_path / "step")
    me = current_owner()
    token = store.acquire(step_dir, me, 60).token
    fs.slow = True
    renewal = threading.Thread(target=store.renew, args=(step_dir, me, token, 120))
    renewal.start()
    assert halfway.wait(timeout=10)
    try:
        lease = store.lease(step_dir)
    finally:
        read_made.set()
        renewal.join()
    assert lease is not None and lease.held_by(me, token)
    assert lease.expires > time.time() + 100  # it waited for the renewal, and read it whole
