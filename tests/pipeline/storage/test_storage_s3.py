"""The commit protocol and the engine on S3: moto's standalone server, a real subprocess on 127.0.0.1.

Drydock is pointed at it the way a user points it at any S3-protocol store: environment variables
(AWS_ENDPOINT_URL_S3 and credentials), then an `s3://bucket/...` prefix. The protocol tests of
test_storage.py run here again with an s3:// step directory (imported, not copied); the engine's
behaviours (caching, versioned reruns) run on both local disk and S3; concurrent runners, a killed
runner and an eight-process lease race run as real processes against the server.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.core.plan import State
from pipeline.core.records import Event
from pipeline.errors import StorageError
from pipeline.processes import current_owner
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.files import ConditionalStorage
from pipeline.storage.object_stores import S3Objects
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, StepStore
from tests.faultfs import Fault, FaultFS
from tests.pipeline.cli.test_cli import ROOT, env, wait_for_file
from tests.pipeline.objstepfns import add_values
from tests.pipeline.stepfns import WriteConfig, calls
from tests.pipeline.storage.test_storage import (  # noqa: F401  (re-run here with an s3:// step_dir)
    clock,
    store,
    test_acquire_after_success_reports_done,
    test_acquire_records_running_and_commit_writes_success,
    test_commit_refused_when_own_lease_expired_even_if_nobody_took_it,
    test_expired_lease_is_taken_over_with_a_higher_token,
    test_forced_rerun_runs_once_over_the_success_seen_at_plan_time,
    test_lease_of_a_dead_process_on_this_host_is_stale_at_once,
    test_renew_extends_the_lease,
    test_second_runner_sees_live_lease_as_held,
    test_token_survives_a_lost_lease_file,
)
from tests.s3server import s3_bucket_environment

BUCKET = "drydock-test"


@pytest.fixture(scope="session")
def s3_bucket() -> Iterator[str]:
    """A bucket on a moto server started for this session; the environment points at it."""
    with s3_bucket_environment(BUCKET):
        yield BUCKET


def s3_prefix(bucket: str) -> str:
    return f"s3://{bucket}/run-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def step_dir(s3_bucket) -> str:
    """Overrides test_storage.py's step_dir for the protocol tests imported above."""
    return f"{s3_prefix(s3_bucket)}/step-abc"


@pytest.fixture(params=["local", "s3"])
def prefix(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "prefix")
    return s3_prefix(request.getfixturevalue("s3_bucket"))


# -- the steps itself -------------------------------------------------------------------------


def test_s3_prefixes_get_conditional_writes_and_no_warning(s3_bucket, caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline.storage.files"):
        storage = open_storage(f"s3://{s3_bucket}/x")
    assert isinstance(storage, ConditionalStorage) and isinstance(storage.objects, S3Objects)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="pipeline.storage.files"):
        open_storage("http://127.0.0.1:1/x")
    assert "no conditional writes" in caplog.text


def test_the_server_refuses_a_write_conditioned_on_a_stale_version(s3_bucket):
    objects = open_storage(f"s3://{s3_bucket}").objects
    path = f"{s3_prefix(s3_bucket)}/obj"
    assert objects.get(path) == (None, None)
    assert objects.put_if(path, b"first", None)
    assert not objects.put_if(path, b"again", None), "If-None-Match: * must refuse an existing object"
    data, etag = objects.get(path)
    assert data == b"first"
    assert objects.put_if(path, b"second", etag)
    assert not objects.put_if(path, b"third", etag), "If-Match with the old ETag must be refused"
    assert objects.get(path)[0] == b"second"


def test_updates_from_many_threads_are_all_applied(s3_bucket):
    storage = open_storage(f"s3://{s3_bucket}")
    path = f"{s3_prefix(s3_bucket)}/counter"

    def increment(_: int) -> None:
        storage.update(path, lambda old: str(int(old or b"0") + 1).encode())

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(increment, range(40)))
    assert storage.read(path) == b"40"


def test_a_lost_reply_to_a_conditional_put_is_applied_once(s3_bucket):
    inner = fsspec.filesystem("s3")
    faulty = FaultFS(inner, [Fault("s3.put_object", "lost_reply", path="*/.status", skip=1)])
    storage = ConditionalStorage(faulty, S3Objects(faulty), sleep=lambda s: None)
    steps = StepStore(storage)
    step = f"{s3_prefix(s3_bucket)}/step"
    me = current_owner()
    assert steps.acquire(step, me, ttl=60) == Acquired(1)
    storage.write(f"{step}/payload", b"x")
    assert steps.commit(step, me, 1), "the SUCCESS write landed; losing its reply must not undo it"
    assert [e.event for e in steps.events(step)] == [Event.RUNNING, Event.SUCCESS]
    assert ("s3.put_object", f"{step[5:]}/.status", "lost_reply") in faulty.injected


def test_throttling_is_retried_and_a_missing_bucket_is_not(s3_bucket):
    from botocore.exceptions import ClientError

    def slow_down() -> BaseException:
        return ClientError(
            {
                "Error": {"Code": "SlowDown", "Message": "Reduce your request rate"},
                "ResponseMetadata": {"HTTPStatusCode": 503},
            },
            "GetObject",
        )

    inner = fsspec.filesystem("s3")
    faulty = FaultFS(inner, [Fault("s3.get_object", error=slow_down, times=3)])
    waits: list[float] = []
    storage = ConditionalStorage(faulty, S3Objects(faulty), sleep=waits.append)
    path = f"{s3_prefix(s3_bucket)}/x"
    assert storage.update(path, lambda old: b"v1") == b"v1"
    assert len(waits) == 3 and len(faulty.injected) == 3
    with pytest.raises(StorageError, match=r"cannot read s3://no-such-bucket-dd/x: .*NoSuchBucket"):
        open_storage("s3://no-such-bucket-dd").update("s3://no-such-bucket-dd/x", lambda old: b"x")
    with pytest.raises(StorageError, match=r"prefix 's3://no-such-bucket-dd/run' is not writable: .*bucket"):
        open_storage("s3://no-such-bucket-dd").check_writable("s3://no-such-bucket-dd/run")


def _race(step_dir: str, start: multiprocessing.Barrier, results: multiprocessing.Queue) -> None:
    steps = StepStore(open_storage(step_dir))
    me = current_owner()
    start.wait()
    taken = steps.acquire(step_dir, me, ttl=60)
    if isinstance(taken, Acquired):
        steps.storage.write(f"{step_dir}/out-{os.getpid()}", b"x")
        steps.commit(step_dir, me, taken.token)
    results.put(type(taken).__name__)


def test_eight_processes_race_for_one_lease_exactly_one_wins(s3_bucket):
    step_dir = f"{s3_prefix(s3_bucket)}/race"
    ctx = multiprocessing.get_context("fork")
    start, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_race, args=(step_dir, start, results)) for _ in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in procs)
    assert outcomes.count("Acquired") == 1, outcomes
    assert [e.event for e in StepStore(open_storage(step_dir)).events(step_dir)] == [
        Event.RUNNING,
        Event.SUCCESS,
    ]


# -- the engine on S3 -------------------------------------------------------------------------


def chain(counter: str, b_value: int = 10) -> list[Step]:
    """a -> b -> c, and c reads a too (test_executor.chain, with steps that write through fsspec)."""
    a = Step("data/a", add_values, WriteConfig(this_output(), versioned(1), counter, "a"))
    b = Step(
        "data/b", add_values, WriteConfig(this_output(), versioned(b_value), counter, "b", [output_of(a)])
    )
    c = Step(
        "train/c", add_values, WriteConfig(this_output(), versioned(100), counter, "c", [a / "", b / ""])
    )
    return [c]


def run(steps: list[Step], prefix: str) -> RunReport:
    report = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local"))
    assert isinstance(report, RunReport)
    return report


def outcome_by_name(report: RunReport) -> dict[str, State]:
    return {report.plan.dag.nodes[label].name: o.state for label, o in report.outcomes.items()}


def value_of(report: RunReport, name: str) -> int:
    node = next(n for n in report.plan.dag.nodes.values() if n.name == name)
    with fsspec.open(f"{node.output_path}/value.json") as f:
        return json.load(f)["value"]


def test_rerun_does_nothing(prefix, tmp_path):
    counter = str(tmp_path / "calls")
    first = run(chain(counter), prefix)
    assert first.ok and set(outcome_by_name(first).values()) == {State.SUCCEEDED}
    assert value_of(first, "train/c") == 100 + 1 + (10 + 1)
    second = run(chain(counter), prefix)
    assert set(outcome_by_name(second).values()) == {State.CACHED}
    assert [calls(counter, n) for n in "abc"] == [1, 1, 1]


def test_a_versioned_change_reruns_that_step_and_downstream(prefix, tmp_path):
    counter = str(tmp_path / "calls")
    run(chain(counter), prefix)
    report = run(chain(counter, b_value=20), prefix)
    assert outcome_by_name(report) == {
        "data/a": State.CACHED,
        "data/b": State.SUCCEEDED,
        "train/c": State.SUCCEEDED,
    }
    assert [calls(counter, n) for n in "abc"] == [1, 2, 2]
    assert value_of(report, "train/c") == 100 + 1 + 21


EXPERIMENT = """
from pipeline import Step, executor_main, output_of, this_output, versioned
from tests.pipeline.objstepfns import add_values, sleep_then_add
from tests.pipeline.stepfns import SleepConfig, WriteConfig

COUNTER, SLEEP, STARTED = {counter!r}, {sleep!r}, {started!r}
layer1 = [
    Step(
        f"layer1/s{{i}}",
        sleep_then_add,
        SleepConfig(this_output(), versioned(SLEEP), COUNTER, f"l1-{{i}}", STARTED),
    )
    for i in range(3)
]
inputs = [output_of(s) for s in layer1]
a = Step("data/a", add_values, WriteConfig(this_output(), versioned(1), COUNTER, "a", inputs))

if __name__ == "__main__":
    executor_main([a], description="s3 runners")
"""


def experiment(tmp_path: Path, sleep: float) -> Path:
    path = tmp_path / "exp.py"
    source = EXPERIMENT.format(
        counter=str(tmp_path / "calls"), sleep=sleep, started=str(tmp_path / "started")
    )
    path.write_text(textwrap.dedent(source))
    return path


def runner(exp: Path, prefix: str, *extra: str) -> subprocess.Popen:
    """`drydock run` in its own process; the S3 settings reach it through the environment."""
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        str(exp),
        "--backend",
        "local",
        "--prefix",
        prefix,
        *extra,
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(), cwd=ROOT
    )


def step_dirs(prefix: str) -> list[str]:
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    return sorted(f"s3://{p.rsplit('/', 1)[0]}" for p in fs.glob(f"{prefix}/*/*/.status"))


def test_two_concurrent_runners_execute_every_step_once(s3_bucket, tmp_path):
    exp, prefix = experiment(tmp_path, sleep=0.5), s3_prefix(s3_bucket)
    procs = [runner(exp, prefix, "--wait_poll_interval", "0.05") for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    counter = str(tmp_path / "calls")
    assert {n: calls(counter, n) for n in ["l1-0", "l1-1", "l1-2", "a"]} == dict.fromkeys(
        ["l1-0", "l1-1", "l1-2", "a"], 1
    )
    steps = StepStore(open_storage(prefix))
    dirs = step_dirs(prefix)
    assert len(dirs) == 4
    for d in dirs:
        assert [e.event for e in steps.events(d)] == [Event.RUNNING, Event.SUCCESS], d


def test_a_killed_runner_is_taken_over_at_once_and_the_rerun_completes(s3_bucket, tmp_path):
    exp, prefix = experiment(tmp_path, sleep=1.0), s3_prefix(s3_bucket)
    proc = runner(exp, prefix, "--max_concurrent", "1")
    wait_for_file(tmp_path / "started", timeout=60)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    steps = StepStore(open_storage(prefix))
    (killed,) = [d for d in step_dirs(prefix) if steps.events(d)]
    assert [e.event for e in steps.events(killed)] == [Event.RUNNING]
    # The dead runner's 90 s lease does not hold the next run up: its process is gone.
    again = runner(exp, prefix)
    _out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert [(e.event, e.token) for e in steps.events(killed)] == [
        (Event.RUNNING, 1),
        (Event.RUNNING, 2),
        (Event.SUCCESS, 2),
    ]
    assert all(steps.record(d).succeeded for d in step_dirs(prefix))
