"""A runner frozen past its lease while its Ray worker keeps writing: the worker's fence.

Real processes: two `python -m pipeline run` executors, each with its own private Ray instance.
Runner A's driver is frozen with SIGSTOP mid-step; its Ray worker, which SIGSTOP does not reach,
keeps writing a file every 0.2 s. Runner B waits for A's lease to expire, takes the step over and
commits. A's worker must write nothing after the lease's expiry (`pipeline/fence.py`), and A,
once resumed, must count the step as done by B.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from pipeline.core.records import Event
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore

ROOT = Path(__file__).resolve().parents[4]

EXPERIMENT = """
from pipeline import Step, executor_main, this_output
from tests.pipeline.run.backends.fencefns import TicksConfig, write_ticks

step = Step("slow/ticks", write_ticks, TicksConfig(this_output(), {claim!r}, {stop!r}))

if __name__ == "__main__":
    executor_main([step])
"""

LEASES = ("--lease_timeout", "3", "--heartbeat_interval", "0.5", "--wait_poll_interval", "0.2")


def _start(tmp_path: Path, name: str) -> subprocess.Popen:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    env.pop("DRYDOCK_PREFIX", None)
    env.pop("RAY_ADDRESS", None)
    command = [sys.executable, "-m", "pipeline", "run", str(tmp_path / "experiment.py")]
    command += ["--prefix", str(tmp_path / "prefix"), "--backend", "ray", *LEASES]
    with open(tmp_path / f"{name}.out", "wb") as out, open(tmp_path / f"{name}.err", "wb") as err:
        return subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT)


def _wait_for(what: str, found, timeout: float = 300):
    """Poll (another process changes the state) until `found()` returns something."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := found():
            return result
        time.sleep(0.05)
    raise TimeoutError(f"no {what} within {timeout}s")


def _state(pid: int) -> str:
    """The process's state letter from /proc (`T`: stopped by a signal)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _finish(proc: subprocess.Popen, tmp_path: Path, name: str) -> None:
    try:
        code = proc.wait(300)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, f"runner {name} exited {code}: {(tmp_path / f'{name}.err').read_text()[-3000:]}"


@pytest.mark.slow
def test_a_frozen_drivers_ray_worker_writes_nothing_after_the_lease_expires(tmp_path):
    stop = tmp_path / "stop"
    (tmp_path / "experiment.py").write_text(
        textwrap.dedent(EXPERIMENT.format(claim=str(tmp_path / "claim"), stop=str(stop)))
    )
    prefix = tmp_path / "prefix"
    paused = _start(tmp_path, "paused")
    taker = None
    try:
        first = _wait_for("tick from runner A", lambda: next(prefix.rglob("tick-*"), None))
        paused.send_signal(signal.SIGSTOP)
        # The signal is delivered asynchronously: until the kernel shows A stopped, its heartbeat
        # may still renew the lease (a busy CI machine once read the expiry before a last renewal).
        _wait_for("runner A stopped", lambda: _state(paused.pid) == "T", timeout=30)
        step_dir = first.parent
        lease = StepStore(LocalStorage()).lease(str(step_dir))
        assert lease is not None and not lease.released
        # Frozen: A's driver renews nothing from here on; this is the expiry A's worker knows.
        a_token, a_expires = lease.token, lease.expires
        taker = _start(tmp_path, "taker")
        _finish(taker, tmp_path, "taker")
    finally:
        paused.send_signal(signal.SIGCONT)
        stop.touch()  # without a fence A's worker ticks until now
        if taker is not None and taker.poll() is None:
            taker.kill()
    _finish(paused, tmp_path, "paused")

    events = StepStore(LocalStorage()).events(str(step_dir))
    successes = [e for e in events if e.event == Event.SUCCESS]
    assert len(successes) == 1 and successes[0].token > a_token, events
    ticks = sorted(step_dir.glob(f"tick-{a_token}-*"))
    assert ticks, "runner A wrote nothing before its pause"
    late = [p.name for p in ticks if float(p.read_text()) >= a_expires]
    assert late == [], f"runner A's worker wrote after its lease expired at {a_expires}: {late}"
    assert len(list(step_dir.glob(f"tick-{successes[0].token}-*"))) == 5
    assert "by another runner" in (tmp_path / "paused.err").read_text()


def test_the_worker_reads_its_deadline_from_the_lease(tmp_path):
    from pipeline.processes import current_owner
    from pipeline.run.in_step.call_step import _lease_deadline
    from pipeline.run.in_step.step_events import StepContext

    store = StepStore(LocalStorage(), clock=lambda: 1000.0)
    owner = current_owner()
    step_dir = str(tmp_path / "step")
    token = store.acquire(step_dir, owner, 3.0).token
    read = _lease_deadline(StepContext(step_dir, owner.run_id, token))
    assert read() == 1003.0
    assert _lease_deadline(StepContext(step_dir, owner.run_id, token + 1))() == float("-inf")
    assert _lease_deadline(StepContext(step_dir, "another-run", token))() == float("-inf")
    (tmp_path / "step" / ".lease").write_bytes(b'{"token": ')  # caught mid-rewrite: tells nothing
    assert read() is None
    store.acquire(step_dir, owner, 3.0)  # a fresh lease (the partial one counts as absent)
    store.release(step_dir, owner, token + 1)
    assert read() == float("-inf")
