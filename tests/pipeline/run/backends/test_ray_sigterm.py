"""SIGTERM to a step's Ray worker (a node drained, a pod deleted, a spot VM preempted) ends the
attempt as PREEMPTED and the runner retries it; Ray's own handler would have made it a failure
("the step function called sys.exit(1)")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[4]

EXPERIMENT = """
from pipeline import Step, executor_main, this_output
from tests.pipeline.run.backends.rayfns import StoppableConfig, stop_me_once

step = Step("stoppable", stop_me_once, StoppableConfig(this_output(), {scratch!r}))
if __name__ == "__main__":
    executor_main([step])
"""


def test_sigterm_to_a_steps_worker_is_a_preemption_and_the_step_is_retried(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT.format(scratch=str(scratch)))
    prefix = tmp_path / "prefix"
    runner = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), "--ray.num_cpus", "1"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (scratch / "pid").exists():
        assert runner.poll() is None and time.monotonic() < deadline, "the step never started"
        time.sleep(0.1)
    os.kill(int((scratch / "pid").read_text()), signal.SIGTERM)
    out, _ = runner.communicate(timeout=180)
    assert runner.returncode == 0, out[-3000:]
    (step,) = prefix.glob("stoppable-*")
    events = [json.loads(line) for line in (step / ".status").read_text().splitlines()]
    assert [e["event"] for e in events] == ["RUNNING", "PREEMPTED", "RUNNING", "SUCCESS"], events
    assert "SIGTERM" in events[1]["message"], events[1]
    assert (step / "done.txt").read_text() == "done"
