"""A fake multi-host TPU cluster on this machine: `ray start --head` plus worker nodes that
advertise TPU chips, slice head resources and slice labels, all on 127.0.0.1.

    head   CPU 1                                                      (127.0.0.2)
    w1     CPU 1, TPU 4, TPU-v4-16-head 1, slice "slice-a"   } one v4-16 slice (2 hosts)
    w2     CPU 1, TPU 4,                    slice "slice-a"   }
    w3     CPU 1, TPU 4, TPU-v4-8-head 1,   slice "slice-b", zone 1   a v4-8 slice (1 host)
    w4     CPU 1, TPU 4, TPU-v4-8-head 1,   slice "slice-c", zone 1   another v4-8 slice

Each node has its own loopback address (127.0.0.2, .3, ...), like separate hosts; Ray rewrites
127.0.0.1 itself to the machine's network address, but not the rest of 127/8. Tests run in file
order: the last ones kill nodes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from pipeline import ExecutorMainConfig, Resources, Step, run_experiment, this_output, versioned
from pipeline.core.records import Event
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from tests.pipeline.run.backends.rayfns import CrashConfig, ProbeConfig, probe, segfault
from tests.raycluster import ray_cluster, ray_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[4]

NODES = {
    "w1": ({"TPU": 4, "TPU-v4-16-head": 1}, "slice-a"),
    "w2": ({"TPU": 4}, "slice-a"),
    "w3": ({"TPU": 4, "TPU-v4-8-head": 1, "zone": 1}, "slice-b"),
    "w4": ({"TPU": 4, "TPU-v4-8-head": 1, "zone": 1}, "slice-c"),
}


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(list(NODES.values())) as address:
        yield address


def run(steps, prefix, address, **options) -> RunReport:
    report = run_experiment(
        steps, ExecutorMainConfig(prefix=str(prefix), backend="ray", ray_address=address, **options)
    )
    assert isinstance(report, RunReport)
    return report


def probes(step_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(step_dir.glob("probe-*.json"))]


def node_labels(address: str) -> dict[str, str]:
    code = textwrap.dedent(f"""
        import json, ray
        ray.init(address={address!r}, logging_level="ERROR")
        print(json.dumps({{n["NodeID"]: (n.get("Labels") or {{}}).get("ray.io/tpu-slice-name")
                          for n in ray.nodes() if n["Alive"]}}))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], env=ray_env(address), capture_output=True, text=True, check=True
    )
    # The driver's own line; Ray may print others around it.
    found = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert found, (out.stdout, out.stderr[-3000:])
    return json.loads(found[-1])


def test_v4_16_slice_is_gang_scheduled_on_both_hosts(cluster, tmp_path):
    step = Step(
        "train/slice",
        probe,
        ProbeConfig(this_output(), tags=versioned(["v4-16"])),
        resources=Resources(tpu="v4-16", env={"PROBE_RUN": "1"}),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix, cluster)
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = prefix.glob("train/slice-*")
    hosts = probes(step_dir)
    assert len(hosts) == 2
    labels = node_labels(cluster)
    assert {labels[h["node_id"]] for h in hosts} == {"slice-a"}
    assert len({h["node_id"] for h in hosts}) == 2, "both hosts of the slice, one task each"
    assert sorted(h["env"]["DRYDOCK_TPU_HOST_ID"] for h in hosts) == ["0", "1"]
    assert all(h["resources"]["TPU"] == 4 for h in hosts)
    assert all(h["env"]["PROBE_RUN"] == "1" and h["env"]["DRYDOCK_TPU_TYPE"] == "v4-16" for h in hosts)
    logs = sorted(p.name for p in (step_dir / ".logs").iterdir())
    assert logs == ["attempt-1-slice-0-host-0.log", "attempt-1-slice-0-host-1.log", "attempt-1.started"]


def test_multislice_gets_megascale_coordinates(cluster, tmp_path):
    step = Step(
        "train/multislice", probe, ProbeConfig(this_output()), resources=Resources(tpu="v4-8", slices=2)
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix, cluster)
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = prefix.glob("train/multislice-*")
    hosts = probes(step_dir)
    assert len(hosts) == 2
    labels = node_labels(cluster)
    assert {labels[h["node_id"]] for h in hosts} == {"slice-b", "slice-c"}
    assert sorted(h["env"]["MEGASCALE_SLICE_ID"] for h in hosts) == ["0", "1"]
    assert {h["env"]["MEGASCALE_NUM_SLICES"] for h in hosts} == {"2"}
    assert len({h["env"]["MEGASCALE_COORDINATOR_ADDRESS"] for h in hosts}) == 1
    coordinator = hosts[0]["env"]["MEGASCALE_COORDINATOR_ADDRESS"]
    assert coordinator.startswith("127.0.0.") and coordinator.endswith(":8081")


def test_a_gang_of_two_hosts_runs_one_process_on_each_with_one_coordinator(cluster, tmp_path):
    # w3 and w4 carry the custom resource `zone`: the gang's two bundles land one on each.
    step = Step(
        "train/gang",
        probe,
        ProbeConfig(this_output(), tags=versioned(["gang"])),
        resources=Resources(cpus=1, hosts=2, custom={"zone": 1}),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix, cluster)
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = prefix.glob("train/gang-*")
    hosts = probes(step_dir)
    assert len(hosts) == 2 and len({h["node_id"] for h in hosts}) == 2, "one process per node"
    assert labels_of(cluster, hosts) == {"slice-b", "slice-c"}
    assert [h["gang"]["index"] for h in hosts] == [0, 1] and {h["gang"]["size"] for h in hosts} == {2}
    assert [h["gang"]["leader"] for h in hosts] == [True, False]
    (coordinator,) = {h["gang"]["coordinator"] for h in hosts}
    assert coordinator == hosts[0]["env"]["DRYDOCK_GANG_COORDINATOR"]
    host0_ip, port = coordinator.rsplit(":", 1)
    assert host0_ip.startswith("127.0.0.") and int(port) > 0
    assert sorted(h["env"]["DRYDOCK_GANG_INDEX"] for h in hosts) == ["0", "1"]
    logs = sorted(p.name for p in (step_dir / ".logs").iterdir())
    assert logs == ["attempt-1-host-0.log", "attempt-1-host-1.log", "attempt-1.started"]


def labels_of(address: str, hosts: list[dict]) -> set[str]:
    labels = node_labels(address)
    return {labels[h["node_id"]] for h in hosts}


def test_a_gang_the_cluster_cannot_hold_is_refused_before_anything_runs(cluster, tmp_path):
    from pipeline.errors import StepDeclarationError

    step = Step(
        "train/gang3",
        probe,
        ProbeConfig(this_output(), tags=versioned(["gang3"])),
        resources=Resources(cpus=1, hosts=3, custom={"zone": 1}),
    )
    with pytest.raises(StepDeclarationError) as info:
        run([step], tmp_path / "prefix", cluster)
    assert info.value.field == "resources"
    assert "asks for 3 hosts of CPU 1, zone 1 each (a gang" in str(info.value)
    assert "the cluster has 2 such node(s)" in str(info.value)
    assert not (tmp_path / "prefix" / "train").exists()


def test_one_host_failing_ends_the_whole_gang_at_once(cluster, tmp_path):
    # Process 1 raises at once; process 0 would sleep two minutes: it is cancelled instead.
    step = Step(
        "train/gang-fails",
        probe,
        ProbeConfig(this_output(), sleep=120, pid_file=str(tmp_path / "pids"), fail_index=1),
        resources=Resources(cpus=1, hosts=2, custom={"zone": 1}),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix, cluster)
    (outcome,) = report.outcomes.values()
    assert not report.ok and "RuntimeError: process 1 of the gang fails on purpose" in (outcome.error or "")
    sleeper = int(wait_for_lines(tmp_path / "pids", 1)[0].split()[0])
    assert pid_gone(sleeper), "the other host's process was not stopped"
    (step_dir,) = prefix.glob("train/gang-fails-*")
    events = StepStore(LocalStorage()).events(str(step_dir))
    assert [e.event for e in events] == [Event.RUNNING, Event.FAILED]  # a failure, not a preemption


def test_the_same_crash_again_and_again_is_a_failure_not_a_preemption(cluster, tmp_path):
    step = Step(
        "crash/loop",
        segfault,
        CrashConfig(this_output(), tags=versioned(["crash"])),
        resources=Resources(custom={"zone": 1}, preemption_retries=1000),
    )
    prefix = tmp_path / "prefix"
    report = run([step], prefix, cluster)
    (outcome,) = report.outcomes.values()
    assert not report.ok
    error = outcome.error or ""
    assert "the same crash 3 times in a row (WorkerCrashedError" in error, error
    assert "WorkerCrashedError before reporting progress" in error
    assert "a deterministic crash, not a lost machine" in error
    (step_dir,) = prefix.glob("crash/loop-*")
    events = [e.event for e in StepStore(LocalStorage()).events(str(step_dir))]
    assert events == [Event.RUNNING, Event.PREEMPTED] * 2 + [Event.RUNNING, Event.FAILED]


EXPERIMENT = """
from pipeline import Resources, Step, executor_main, this_output, versioned
from tests.pipeline.run.backends.rayfns import ProbeConfig, probe

config = ProbeConfig(this_output(), sleep=120, pid_file={pid_file!r}, tags=versioned(["cancel"]))
step = Step("long/step", probe, config, resources=Resources(custom={{"zone": 1}}))
if __name__ == "__main__":
    executor_main([step])
"""


def wait_for_lines(path: Path, n: int, timeout: float = 120) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(lines := path.read_text().split("\n")[:-1]) >= n:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines")


def pid_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


SWEEP = """
from pipeline import Step, executor_main, grid, sweep, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

template = Step("train/sweep", write_value, WriteConfig(this_output(), versioned(0), {counter!r}, sleep=1.0))

if __name__ == "__main__":
    executor_main(sweep(template, grid(value=[1, 2, 3, 4, 5, 6])))
"""


@pytest.mark.timeout(420)
def test_three_runners_of_one_sweep_file_run_each_point_once(cluster, tmp_path):
    """N machines start the same sweep file on one prefix: the leases share the points out, each
    runs once, and every runner ends with the whole sweep done (no claim_and_run needed)."""
    counter, prefix, exp = tmp_path / "calls", tmp_path / "prefix", tmp_path / "sweep.py"
    exp.write_text(SWEEP.format(counter=str(counter)))
    command = [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix)]
    command += ["--ray_address", cluster, "--wait_poll_interval", "0.5"]
    runners = [
        subprocess.Popen(
            command, env=ray_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    ended = [runner.communicate(timeout=360) for runner in runners]
    for runner, (_out, err) in zip(runners, ended, strict=True):
        assert runner.returncode == 0, err
    # Each point's function ran once, in one runner, under one lease; every runner saw it done.
    assert sorted(p.name for p in counter.iterdir()) == ["write.calls"]
    assert len((counter / "write.calls").read_text().split()) == 6
    store = StepStore(LocalStorage())
    points = sorted((prefix / "train" / "sweep").glob("value=*"))
    assert [p.name.rsplit("-", 1)[0] for p in points] == [f"value={v}" for v in range(1, 7)]
    for point in points:
        assert [e.event for e in store.events(str(point))] == [Event.RUNNING, Event.SUCCESS], point
    assert all("FAILED" not in err for _out, err in ended)


def test_ctrl_c_cancels_the_ray_task_and_releases_the_lease(cluster, tmp_path):
    pid_file = tmp_path / "pids"
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT.format(pid_file=str(pid_file)))
    prefix = tmp_path / "prefix"
    env = ray_env()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            str(exp),
            "--prefix",
            str(prefix),
            "--ray_address",
            cluster,
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker_pid = int(wait_for_lines(pid_file, 1)[0].split()[0])
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    (step_dir,) = prefix.glob("long/step-*")
    store = StepStore(LocalStorage())
    assert [e.event for e in store.events(str(step_dir))] == [Event.RUNNING, Event.CANCELLED]
    assert store.lease(str(step_dir)).released
    assert pid_gone(worker_pid), "the Ray worker running the step was not stopped"


def test_killed_node_is_preempted_and_the_step_retried_elsewhere(cluster, tmp_path):
    pid_file = tmp_path / "pids"
    step = Step(
        "long/preempt",
        probe,
        ProbeConfig(this_output(), sleep=120, pid_file=str(pid_file)),
        resources=Resources(custom={"zone": 1}),
    )
    prefix = tmp_path / "prefix"
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(report=run([step], prefix, cluster)), daemon=True)
    thread.start()
    _worker, raylet = map(int, wait_for_lines(pid_file, 1)[0].split())
    os.kill(raylet, signal.SIGKILL)  # the node running the step dies
    thread.join(240)
    assert not thread.is_alive(), "the run did not finish after the node died"
    report = box["report"]
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = prefix.glob("long/preempt-*")
    events = StepStore(LocalStorage()).events(str(step_dir))
    assert [e.event for e in events] == [Event.RUNNING, Event.PREEMPTED, Event.RUNNING, Event.SUCCESS]
    # On a cluster the step may run on another host than the driver: a rerun after the driver is
    # killed waits for the lease to expire rather than trusting the driver's pid alone.
    assert [e.data for e in events if e.event == Event.RUNNING] == [
        {"attempt": 1, "remote_workers": True, "announces_start": True},
        {"attempt": 2, "remote_workers": True, "announces_start": True},
    ]
    hosts = probes(step_dir)
    assert len(hosts) == 1
    assert len(wait_for_lines(pid_file, 2)) == 2
