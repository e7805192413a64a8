"""`pipeline.run.worker`: a step's output is copied to its log, and nothing of the copy outlives it."""

from __future__ import annotations

import logging
import sys

from pipeline.run.step_events import StepContext
from pipeline.run.worker import Placement, call_step


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
