"""Storage under injected faults: the retry policy, transient vs permanent errors, lost replies and
partial writes (which must never become a committed `.status`). Faults come from `tests/faultfs.py`
wrapping a real fsspec filesystem (memory://); the same wrapper over a real S3 server is exercised
in test_storage_s3.py."""

from __future__ import annotations

import errno
import uuid

import fsspec
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from gcsfs.retry import HttpError
from s3fs.errors import translate_boto_error

from pipeline.core.records import Event, parse_status
from pipeline.errors import StorageAccessDenied, StorageError
from pipeline.processes import current_owner
from pipeline.storage.files import Storage
from pipeline.storage.object_stores import RetryPolicy, backoff_delay, is_transient, retrying
from pipeline.storage.step_store import Acquired, StepStore
from tests.faultfs import Fault, FaultFS


def client_error(code: str, status: int) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": f"{code} said the server"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "PutObject")  # type: ignore[arg-type]


class Sleeps:
    """A sleep that records instead of waiting: the policy's delays become assertable values."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def faulty_storage(faults: list[Fault], sleeps: Sleeps, **kwargs) -> tuple[Storage, FaultFS, str]:
    fs = FaultFS(fsspec.filesystem("memory"), faults, **kwargs)
    return Storage(fs, sleep=sleeps, uniform=lambda: 1.0), fs, f"memory://faults-{uuid.uuid4().hex}"


# -- the policy: a pure function -------------------------------------------------------------


def test_backoff_doubles_up_to_the_cap_and_jitter_scales_it():
    policy = RetryPolicy(tries=8, base=0.1, cap=1.0)
    ceilings = [backoff_delay(n, policy, 1.0) for n in range(1, 8)]
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff_delay(3, policy, 0.0) == 0.0
    assert backoff_delay(3, policy, 0.5) == pytest.approx(0.2)


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        ConnectionResetError(errno.ECONNRESET, "reset by peer"),
        OSError(errno.ETIMEDOUT, "timed out"),
        client_error("SlowDown", 503),
        client_error("InternalError", 500),
        client_error("TooManyRequests", 429),
        client_error("RequestTimeout", 400),
        translate_boto_error(client_error("ServiceUnavailable", 503)),  # as s3fs raises it
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
        HttpError({"code": 503, "message": "backend error"}),
        HttpError({"code": 429, "message": "rate limit"}),
    ],
    ids=repr,
)
def test_transient_errors(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        client_error("AccessDenied", 403),
        client_error("NoSuchBucket", 404),
        client_error("NotImplemented", 501),
        translate_boto_error(client_error("AccessDenied", 403)),
        translate_boto_error(client_error("NoSuchBucket", 404)),
        PermissionError(errno.EACCES, "denied"),
        FileNotFoundError("nope"),
        HttpError({"code": 403, "message": "forbidden"}),
        ValueError("bad request"),
    ],
    ids=repr,
)
def test_permanent_errors(error):
    assert not is_transient(error)


def test_retrying_waits_by_the_policy_and_then_succeeds(sleeps):
    failures = [TimeoutError("t1"), ConnectionResetError("t2")]

    def op() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    policy = RetryPolicy(tries=8, base=0.1, cap=10)
    assert retrying("read", "s3://b/x", op, policy, sleep=sleeps, uniform=lambda: 0.5) == "done"
    assert sleeps.waits == pytest.approx([0.05, 0.1])


def test_retrying_gives_up_after_the_last_try_naming_path_and_cause(sleeps):
    def op() -> None:
        raise client_error("SlowDown", 503)

    with pytest.raises(StorageError) as info:
        retrying("write", "s3://b/step/.status", op, RetryPolicy(tries=4), sleep=sleeps, uniform=lambda: 1.0)
    message = str(info.value)
    assert message.startswith("cannot write s3://b/step/.status: still failing after 4 tries")
    assert "SlowDown" in message
    assert len(sleeps.waits) == 3  # no wait after the last try


def test_retrying_stops_at_once_on_a_permanent_error(sleeps):
    calls = []

    def op() -> None:
        calls.append(1)
        raise translate_boto_error(client_error("AccessDenied", 403))

    # A refusal is named as one, never taken for corrupt metadata (StorageAccessDenied).
    with pytest.raises(
        StorageAccessDenied, match=r"cannot read s3://b/x: permission denied \(PermissionError.*AccessDenied"
    ):
        retrying("read", "s3://b/x", op, RetryPolicy(), sleep=sleeps)
    assert calls == [1] and sleeps.waits == []


# -- storage operations through the fault-injecting filesystem -------------------------------


@pytest.mark.parametrize("op", ["cat_file", "pipe_file", "ls", "makedirs"])
def test_every_operation_is_retried_through_transient_errors(op, sleeps):
    storage, fs, root = faulty_storage([Fault(op, times=3)], sleeps)
    storage.write(f"{root}/a", b"one")
    assert storage.read(f"{root}/a") == b"one"
    assert storage.listdir(root) == ["a"]
    assert storage.update(f"{root}/a", lambda old: old + b" two") == b"one two"
    assert storage.read(f"{root}/a") == b"one two"
    assert [kind for _, _, kind in fs.injected] == ["error"] * 3
    assert len(sleeps.waits) == 3


def test_a_permanent_error_is_one_storage_error_and_writes_nothing(sleeps):
    denied = Fault("pipe_file", error=lambda: PermissionError(errno.EACCES, "Access Denied"), times=-1)
    storage, _, root = faulty_storage([denied], sleeps)
    with pytest.raises(
        StorageAccessDenied,
        match=rf"cannot write {root}/a: permission denied \(PermissionError: .*Access Denied",
    ):
        storage.write(f"{root}/a", b"x")
    assert storage.read(f"{root}/a") is None
    assert sleeps.waits == []


def test_a_lost_reply_is_not_applied_twice(sleeps):
    storage, fs, root = faulty_storage([Fault("pipe_file", "lost_reply", path="*/counter")], sleeps)
    calls = []

    def increment(old: bytes | None) -> bytes:
        calls.append(old)
        return str(int(old or b"0") + 1).encode()

    assert storage.update(f"{root}/counter", increment) == b"1"
    assert storage.read(f"{root}/counter") == b"1"
    assert calls == [None], "the retry saw its own write in place and did not compute again"
    assert fs.injected == [("pipe_file", f"{root.split('://')[1]}/counter", "lost_reply")]


def test_delays_only_slow_things_down(sleeps):
    storage, fs, root = faulty_storage([Fault("*", "delay", seconds=0.01, times=-1)], sleeps)
    storage.write(f"{root}/a", b"x")
    assert storage.update(f"{root}/a", lambda old: old + b"y") == b"xy"
    assert sleeps.waits == [] and {kind for *_, kind in fs.injected} == {"delay"}


def _commit_once(storage: Storage, step_dir: str, store: StepStore | None = None) -> bool:
    store = store or StepStore(storage)
    me = current_owner()
    taken = store.acquire(step_dir, me, ttl=60)
    assert isinstance(taken, Acquired)
    storage.write(f"{step_dir}/payload", b"x")
    return store.commit(step_dir, me, taken.token)


# A RUNNING line is about 105 bytes and a SUCCESS line about 85: these fractions of the two
# together cut the SUCCESS line short, as an interrupted append or upload would.
@pytest.mark.parametrize("keep", [0.6, 0.8, 0.97])
def test_a_partial_status_write_then_retry_commits_cleanly(keep, sleeps):
    # The SUCCESS write is cut short (then reported as a timeout); the retry must not build on
    # the fragment, and readers never see SUCCESS before the whole line is there.
    partial = Fault("pipe_file", "partial", path="*/.status", skip=1, keep=keep)
    storage, _, root = faulty_storage([partial], sleeps)
    step_dir = f"{root}/step"
    assert _commit_once(storage, step_dir)
    events = parse_status(storage.read(f"{step_dir}/.status"))
    assert [e.event for e in events] == [Event.RUNNING, Event.SUCCESS]


def test_a_partial_write_that_cut_earlier_lines_is_healed_by_the_retry(sleeps):
    # Cut inside the RUNNING line: the retry writes the whole content again, both lines return.
    partial = Fault("pipe_file", "partial", path="*/.status", skip=1, keep=0.3)
    storage, _, root = faulty_storage([partial], sleeps)
    step_dir = f"{root}/step"
    assert _commit_once(storage, step_dir)
    assert [e.event for e in StepStore(storage).events(step_dir)] == [Event.RUNNING, Event.SUCCESS]


@pytest.mark.parametrize("keep", [0.6, 0.8, 0.97])
def test_a_partial_status_write_that_fails_for_good_is_never_a_success(keep, sleeps):
    broken = Fault(
        "pipe_file", "partial", path="*/.status", skip=1, keep=keep, error=lambda: PermissionError("revoked")
    )
    storage, _, root = faulty_storage([broken], sleeps)
    step_dir = f"{root}/step"
    now = [1000.0]
    store = StepStore(storage, clock=lambda: now[0])
    with pytest.raises(
        StorageError, match=r"cannot update .*/\.status: permission denied \(PermissionError: revoked\)"
    ):
        _commit_once(storage, step_dir, store)
    record = store.record(step_dir)
    assert record.corrupt is None and not record.succeeded
    # Once the crashed runner's lease expires, the next runner appends after the fragment
    # without gluing onto it.
    now[0] += 3600
    assert _commit_once(storage, step_dir, store)
    assert [(e.event, e.token) for e in store.events(step_dir)] == [
        (Event.RUNNING, 1),
        (Event.RUNNING, 2),
        (Event.SUCCESS, 2),
    ]


@pytest.mark.parametrize("seed", range(6))
def test_random_faults_never_half_commit(seed, sleeps):
    # Every storage call fails at random (error, lost reply, delay, partial write) with
    # probability 0.3: each commit either lands whole or raises, and `.status` always parses.
    storage, fs, root = faulty_storage(
        [], sleeps, rate=0.3, seed=seed, random_kinds=("error", "lost_reply", "partial")
    )
    storage.retry_policy = RetryPolicy(tries=30)
    outcomes = []
    for i in range(5):
        step_dir = f"{root}/step{i}"
        try:
            outcomes.append(_commit_once(storage, step_dir))
        except StorageError:
            outcomes.append(None)
        events = parse_status(fsspec.filesystem("memory").cat_file(f"{step_dir}/.status"))
        succeeded = [e for e in events if e.event == Event.SUCCESS]
        assert len(succeeded) <= 1
        if outcomes[-1]:
            assert [e.event for e in events] == [Event.RUNNING, Event.SUCCESS]
        elif succeeded:
            pytest.fail(f"commit reported {outcomes[-1]} but .status holds SUCCESS: {events}")
    assert fs.injected, "the seed injected no fault at all"
