"""A Ray step's log survives its runner being stopped: Ctrl-C (which cancels the step by killing its
worker) and SIGKILL of the runner. The log copy is written out as the step goes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[4]

EXPERIMENT = """
from pipeline import Step, executor_main, this_output
from tests.pipeline.run.backends.rayfns import TalkConfig, talk_then_sleep

step = Step("talk", talk_then_sleep, TalkConfig(this_output()))
if __name__ == "__main__":
    executor_main([step])
"""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_the_log_of_an_attempt_stopped_by_its_runner_is_kept(tmp_path, stop):
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT)
    prefix = tmp_path / "prefix"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    runner = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), "--ray.num_cpus", "1"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the test can clean Ray up after a SIGKILL
    )
    try:
        deadline = time.monotonic() + 120
        logs: list[Path] = []
        # While the step still runs, its log is already in the step directory.
        while not any("step says hello" in p.read_text() for p in logs):
            assert runner.poll() is None and time.monotonic() < deadline, "the step's log never appeared"
            time.sleep(0.2)
            logs = list(prefix.glob("talk-*/.logs/attempt-*.log"))
        runner.send_signal(stop)
        runner.wait(60)
        (log,) = logs
        assert "step says hello" in log.read_text()
        if stop == signal.SIGINT:
            assert runner.returncode == 130
    finally:
        if runner.poll() is None:
            runner.kill()
        # Whatever the runner left behind (its private Ray instance after a SIGKILL) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(30)
