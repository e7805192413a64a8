"""The Ray backend on a real local Ray instance (started once for this module)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from pipeline import (  # noqa: E402
    ExecutorMainConfig,
    Resources,
    Step,
    output_of,
    run_experiment,
    this_output,
    versioned,
)
from pipeline.core.plan import State  # noqa: E402
from pipeline.core.records import Event  # noqa: E402
from pipeline.errors import StepDeclarationError  # noqa: E402
from pipeline.run.scheduler.executor import RunReport  # noqa: E402
from pipeline.storage.files import LocalStorage  # noqa: E402
from pipeline.storage.step_store import StepStore  # noqa: E402
from tests.pipeline.run.backends.rayfns import (  # noqa: E402
    FollowConfig,
    MeetConfig,
    ProbeConfig,
    ProduceConfig,
    follow_items,
    meet,
    probe,
    produce,
)

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    ray.init(
        address="local",
        num_cpus=2,
        resources={"special": 1},
        labels={"region": "europe-west4"},
        include_dashboard=False,
        _node_ip_address="127.0.0.2",
    )  # loopback: Ray rewrites 127.0.0.1 to the machine address
    yield
    ray.shutdown()


def run(steps, prefix, **options) -> RunReport:
    report = run_experiment(steps, ExecutorMainConfig(prefix=str(prefix), backend="ray", **options))
    assert isinstance(report, RunReport)
    return report


def only_dir(prefix: Path, name: str) -> Path:
    (found,) = prefix.glob(f"{name}-*")
    return found


def read_probe(step_dir: Path, slice_id: int = 0, host: int = 0) -> dict:
    return json.loads((step_dir / f"probe-{slice_id}-{host}.json").read_text())


def test_independent_steps_run_concurrently_on_ray(tmp_path):
    rv = str(tmp_path / "rendezvous")
    a = Step("meet/a", meet, MeetConfig(this_output(), rv, versioned("a"), "b"))
    b = Step("meet/b", meet, MeetConfig(this_output(), rv, versioned("b"), "a"))
    report = run([a, b], tmp_path / "prefix")
    assert report.ok, {label: o.error for label, o in report.outcomes.items()}


def test_resources_env_and_logs_reach_the_task(tmp_path):
    step = Step(
        "probe/custom",
        probe,
        ProbeConfig(this_output(), message="hello from a ray step"),
        resources=Resources(cpus=1, custom={"special": 1}, env={"PROBE_COLOR": "teal"}),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix)
    assert report.ok
    step_dir = only_dir(prefix, "probe/custom")
    info = read_probe(step_dir)
    assert info["resources"]["special"] == 1
    assert info["resources"]["CPU"] == 1
    assert info["env"]["PROBE_COLOR"] == "teal"
    # The node's region label is the step's region (which mirror of a raw dataset it reads).
    assert info["env"]["DRYDOCK_REGION"] == "europe-west4"
    assert info["pid"] != os.getpid()  # ran in a Ray worker, not in the driver
    log = (step_dir / ".logs" / "attempt-1.log").read_text()
    assert "hello from a ray step" in log


def test_exception_is_failed_with_remote_traceback_and_retried_on_its_budget(tmp_path):
    marker = str(tmp_path / "failed-once")
    step = Step(
        "probe/flaky",
        probe,
        ProbeConfig(this_output(), fail_first=marker),
        resources=Resources(failure_retries=1),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix)
    assert report.ok
    (outcome,) = report.outcomes.values()
    assert outcome.attempts == 2
    events = StepStore(LocalStorage()).events(str(only_dir(prefix, "probe/flaky")))
    assert [e.event for e in events] == [Event.RUNNING, Event.FAILED, Event.RUNNING, Event.SUCCESS]
    assert events[1].message == "RuntimeError: first attempt fails on purpose"
    assert "first attempt fails on purpose" in events[1].data["traceback"]
    assert "rayfns.py" in events[1].data["traceback"]  # the worker's traceback, not the driver's
    # A private instance's workers are on this host (they stop when the driver exits): a rerun
    # after a killed driver may take over at once, so nothing says otherwise. A Ray task may
    # queue after its lease is taken: it announces its start (status shows QUEUED until then).
    assert [e.data for e in events if e.event == Event.RUNNING] == [
        {"attempt": 1, "announces_start": True},
        {"attempt": 2, "announces_start": True},
    ]


def test_exception_without_budget_fails_the_run(tmp_path):
    step = Step("probe/bad", probe, ProbeConfig(this_output(), fail_first=str(tmp_path / "m")))
    report = run([step], tmp_path / "prefix")
    (outcome,) = report.outcomes.values()
    assert outcome.state == State.FAILED and outcome.error == "RuntimeError: first attempt fails on purpose"
    assert report.exit_code == 1


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (Resources(gpus=4), "asks for CPU 1, GPU 4 on one node; no node has that"),
        (Resources(custom={"TPU": 8}), "TPU 8"),
        (Resources(tpu="v4-16"), "asks for 1 x v4-16 (2 hosts of 4 chips each"),
        (Resources(tpu="v9-16"), "unknown TPU type 'v9-16'"),
    ],
)
def test_unsatisfiable_requests_fail_fast_naming_the_step(tmp_path, resources, message):
    step = Step("train/huge", probe, ProbeConfig(this_output()), resources=resources)
    prefix = tmp_path / "prefix"
    with pytest.raises(StepDeclarationError) as err:
        run([step], prefix)
    assert "step 'train/huge', field `resources`" in str(err.value)
    assert message in str(err.value)
    assert not prefix.exists()


def test_cached_steps_need_no_resources(tmp_path):
    # Validation only looks at steps that will run: a finished step on a smaller cluster is fine.
    prefix = tmp_path / "prefix"
    step = Step("probe/plain", probe, ProbeConfig(this_output()))
    assert run([step], prefix).ok
    again = run([step], prefix)
    assert [o.state for o in again.outcomes.values()] == [State.CACHED]


def test_sys_exit_is_a_failure_not_a_lost_node_and_failed_attempts_keep_their_log(tmp_path):
    from tests.pipeline.run.backends.rayfns import exit_now

    prefix = tmp_path / "prefix"
    step = Step("probe/exits", exit_now, ProbeConfig(this_output()))
    report = run([step], prefix)
    (outcome,) = report.outcomes.values()
    assert outcome.state == State.FAILED and outcome.attempts == 1
    assert outcome.error == "RuntimeError: the step function called sys.exit(3)"
    step_dir = only_dir(prefix, "probe/exits")
    events = StepStore(LocalStorage()).events(str(step_dir))
    assert [e.event for e in events] == [Event.RUNNING, Event.FAILED]
    assert "\x1b[" not in events[-1].data["traceback"]  # no terminal colours in stored tracebacks
    (log,) = (step_dir / ".logs").glob("*.log")
    assert "about to exit" in log.read_text() and "SystemExit" in log.read_text()
    assert (step_dir / ".logs" / "attempt-1.started").exists()  # a Ray task says when it starts


def test_an_unreachable_cluster_address_fails_fast(tmp_path):
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from pipeline.run.backends.ray_support import check_reachable

    started = time.monotonic()
    with pytest.raises(
        StepDeclarationError, match=r"field `--ray_address`: cannot reach a Ray cluster at '127\.0\.0\.1"
    ):
        check_reachable(f"127.0.0.1:{port}", timeout=5)
    assert time.monotonic() - started < 5


def test_a_ray_step_reports_a_warning_note(tmp_path):
    from tests.pipeline.stepfns import WriteConfig, warn_then_write

    prefix = tmp_path / "prefix"
    report = run([Step("warns", warn_then_write, WriteConfig(this_output(), versioned(2)))], prefix)
    assert report.ok
    events = StepStore(LocalStorage()).events(str(only_dir(prefix, "warns")))
    assert [e.event for e in events] == [Event.RUNNING, "WARNING", Event.SUCCESS]


def test_fresh_process_steps_never_share_a_worker(tmp_path):
    from tests.pipeline.run.backends.rayfns import fresh_probe

    prefix = tmp_path / "prefix"
    steps = [
        Step(f"fresh/{i}", fresh_probe, ProbeConfig(this_output(), tags=versioned([str(i)])))
        for i in range(3)
    ]
    assert run(steps, prefix, max_concurrent=1).ok
    pids = {read_probe(only_dir(prefix, f"fresh/{i}"))["pid"] for i in range(3)}
    assert len(pids) == 3


def test_parallel_work_inside_a_step_becomes_ray_tasks(tmp_path):
    from tests.pipeline.run.backends.rayfns import FanConfig, fan_out

    step = Step("fan", fan_out, FanConfig(this_output(), versioned(3)))
    report = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="ray"))
    assert isinstance(report, RunReport) and report.ok
    (out,) = (tmp_path / "p").glob("fan-*/fan.json")
    assert json.loads(out.read_text()) == [[0, True], [1, True], [4, True]]


def followed(tmp_path: Path, die_once: bool) -> tuple[Step, list[Step]]:
    """A training in miniature (1 CPU) and two evaluations that follow it (1 CPU each): on this
    2-CPU Ray, followers that started first would hold both CPUs while the training waits for one."""
    train = Step(
        "train/followed",
        produce,
        ProduceConfig(this_output(), die_once_in=str(tmp_path / "scratch") if die_once else None),
        resources=Resources(cpus=1),
    )
    # Declared (and so planned) before the training: the order that starved it.
    followers = [
        Step(
            f"evaluate/{kind}",
            follow_items,
            FollowConfig(this_output(), output_of(train, blocking=False)),
            resources=Resources(cpus=1),
        )
        for kind in ("loss", "tasks")
    ]
    return train, followers


@pytest.mark.timeout(240)
def test_followers_never_take_the_cpus_the_training_they_follow_needs_to_start(tmp_path):
    train, followers = followed(tmp_path, die_once=False)
    prefix = tmp_path / "prefix"
    report = run([*followers, train], prefix)
    assert report.ok, {label: o.error for label, o in report.outcomes.items()}
    train_dir = only_dir(prefix, "train/followed")
    assert (train_dir / ".logs" / "attempt-1.started").exists()
    started = json.loads((train_dir / ".logs" / "attempt-1.started").read_text())["time"]
    for follower in ("evaluate/loss", "evaluate/tasks"):
        step_dir = only_dir(prefix, follower)
        assert json.loads((step_dir / "seen.json").read_text())["seen"] == ["item-0", "item-1", "item-2"]
        # Each follower's attempt began only after the training's function had started.
        (running,) = [e for e in StepStore(LocalStorage()).events(str(step_dir)) if e.event == Event.RUNNING]
        assert running.time >= started - 1.0


@pytest.mark.timeout(240)
def test_a_retried_training_gets_its_cpu_back_from_its_followers(tmp_path):
    # The training's first worker dies after its first item, with both followers running on the
    # other CPU and queued: they are stopped, and start again once the retry has started.
    train, followers = followed(tmp_path, die_once=True)
    prefix = tmp_path / "prefix"
    report = run([*followers, train], prefix)
    assert report.ok, {label: o.error for label, o in report.outcomes.items()}
    train_dir = only_dir(prefix, "train/followed")
    events = [e.event for e in StepStore(LocalStorage()).events(str(train_dir))]
    assert events == [Event.RUNNING, Event.PREEMPTED, Event.RUNNING, Event.SUCCESS]
    for follower in ("evaluate/loss", "evaluate/tasks"):
        assert (only_dir(prefix, follower) / "seen.json").exists()


def test_a_private_instance_starts_without_rays_token_notice(tmp_path):
    """`make run` on a fresh machine: no RAY_AUTH_MODE set, no token yet. Ray turns token
    authentication on for the new instance (it stays on) and its notice is not printed."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    env.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / "hello.py"), "--prefix", str(tmp_path / "prefix")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "ray: private local instance" in done.stderr
    assert "Token authentication" not in done.stderr, done.stderr
    assert (tmp_path / "home" / ".ray" / "auth_token").exists()  # the instance used a token


PIPED = """
from pipeline import Resources, Step, executor_main, output_of, this_output
from tests.pipeline.run.backends.rayfns import FollowConfig, ProduceConfig, follow_items, produce

train = Step("train/long", produce, ProduceConfig(this_output(), count=600, every=0.1),
             resources=Resources(cpus=1))
follower = Step("evaluate/long", follow_items,
                FollowConfig(this_output(), output_of(train, blocking=False), timeout=600),
                resources=Resources(cpus=1))

if __name__ == "__main__":
    executor_main([train, follower])
"""


@pytest.mark.timeout(240)
def test_ctrl_c_with_the_output_in_a_pipe_cancels_and_closes_the_run(tmp_path):
    """`drydock run FILE 2>&1 | tee log`, then Ctrl-C: it reaches `tee` too, so the run's output
    has no reader while it cancels. Its steps end CANCELLED (not FAILED) and its record is closed."""
    import signal
    import subprocess
    import sys
    import time

    exp, prefix = tmp_path / "piped.py", tmp_path / "prefix"
    exp.write_text(PIPED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    read, write = os.pipe()
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            str(exp),
            "--prefix",
            str(prefix),
            "--wait_poll_interval",
            "0.2",
        ],
        stdout=write,
        stderr=write,
        env=env,
        cwd=ROOT,
    )
    os.close(write)
    reader = os.fdopen(read, "rb")
    seen = b""
    deadline = time.monotonic() + 180
    while b"RUNNING    evaluate/long" not in seen and time.monotonic() < deadline:
        line = reader.readline()
        assert line, seen.decode()  # the runner ended early
        seen += line
    # The follower is inside its function, waiting on the training's items.
    while not list(prefix.glob("evaluate/long-*/.logs/attempt-*.started")):
        assert time.monotonic() < deadline and runner.poll() is None, seen.decode()
        time.sleep(0.05)
    reader.close()  # `tee` is gone: every later write to the pipe fails
    runner.send_signal(signal.SIGINT)
    code = runner.wait(timeout=120)
    store = StepStore(LocalStorage())
    for name in ("train/long", "evaluate/long"):
        (step_dir,) = prefix.glob(f"{name}-*")
        events = [e.event for e in store.events(str(step_dir))]
        assert events[-1] == Event.CANCELLED, (name, events)
        assert store.lease(str(step_dir)).released
    (record,) = prefix.glob("experiments/runs/*/*.json")
    assert json.loads(record.read_text())["finished"] is True
    assert code == 130  # interrupted, as without the pipe (not 141, a reader gone)
