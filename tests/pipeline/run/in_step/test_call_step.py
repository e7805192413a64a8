"""`pipeline.run.in_step.call_step`: a step's output is copied to its log, and nothing of the
copy outlives it."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from pipeline.run.in_step import step_logs
from pipeline.run.in_step.call_step import Placement, call_step
from pipeline.run.in_step.step_events import StepContext


def test_a_handler_the_step_made_outlives_its_log_copy(tmp_path, capfd):
    """Levanter adds a StreamHandler(sys.stderr) when training starts, inside the step, where
    sys.stderr is the step's tee: logging through it after the step must not hit a closed file."""
    logger = logging.getLogger("drydock.test.late")
    made: list[logging.Handler] = []

    def step(config: object) -> None:
        handler = logging.StreamHandler(sys.stderr)
        logger.addHandler(handler)
        made.append(handler)
        logger.warning("during the step")

    log = tmp_path / "step" / ".logs" / "attempt-1.log"
    context = StepContext(str(tmp_path / "step"), "run", 1)
    try:
        call_step(step, None, context, placement=Placement.PROCESS, log_path=str(log))
        logger.warning("after the step")
    finally:
        for handler in made:
            logger.removeHandler(handler)
    err = capfd.readouterr().err
    assert "Logging error" not in err and "closed file" not in err, err
    assert "after the step" in err
    # The log copy has what the step printed, and nothing written after it ended.
    text = log.read_text()
    assert "during the step" in text and "after the step" not in text


def _quiet(config: object) -> None:
    """Prints nothing."""


def _talks_late(config: float) -> None:
    print("first")
    time.sleep(config)
    print("second")


@pytest.mark.parametrize("placement", list(Placement))
def test_an_attempt_that_prints_nothing_leaves_no_log_file(tmp_path, placement):
    """An empty log would cost a file and the `.logs` directory per step (docs/performance.md)."""
    log = tmp_path / "step" / ".logs" / "attempt-1.log"
    context = StepContext(str(tmp_path / "step"), "run", 1)
    call_step(_quiet, None, context, placement=placement, log_path=str(log), echo=False)
    assert not log.parent.exists()


@pytest.mark.parametrize("placement", list(Placement))
def test_a_running_attempts_log_is_written_out_as_it_grows(tmp_path, placement):
    """The periodic copy (one thread per process for every attempt) writes what the step printed
    so far while it runs, and the final copy has all of it."""
    log = tmp_path / "step" / ".logs" / "attempt-1.log"
    seen: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not seen:
            if log.exists() and "first" in log.read_text():
                seen.append(log.read_text())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    if placement is Placement.PROCESS:
        with step_logs.captured(str(log), sync_every=0.05):
            _talks_late(0.5)
    else:
        with step_logs.captured_thread(str(log), echo=False, sync_every=0.05):
            _talks_late(0.5)
    watcher.join()
    assert seen and "second" not in seen[0]  # written out while the step still ran
    assert log.read_text().splitlines()[-2:] == ["first", "second"]
