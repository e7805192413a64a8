"""What a run prints: where steps run first, one line per state change, the steps' own output
only in their attempt logs (unless --verbose), a failed step's log tail, plain lines when piped,
and the live progress of running steps (`pipeline.run.console.console`)."""

from __future__ import annotations

import io
import json
import re
import textwrap
import threading
import time
from pathlib import Path

from pipeline.run.console.console import RunConsole
from pipeline.storage.files import LocalStorage
from tests.pipeline.cli.test_cli import drydock

NOISY = """
import logging, sys, threading
from dataclasses import dataclass
from pipeline import Step, executor_main, this_output

@dataclass(frozen=True)
class Config:
    output: str
    fail: bool = False

def noisy(config):
    library = logging.getLogger("somelibrary.module")
    for i in range(30):
        print(f"library print {{i}}")
        library.warning("library warning %d", i)
    def background():
        print("printed from a thread the step started", file=sys.stderr)
        library.warning("logged from a thread the step started")
    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    if config.fail:
        raise RuntimeError("the step gave up")
    import os
    os.makedirs(config.output, exist_ok=True)
    open(os.path.join(config.output, "done"), "w").close()

if __name__ == "__main__":
    executor_main([Step("noisy/step", noisy, Config(this_output(), fail={fail}))])
"""


def write(tmp_path: Path, fail: bool = False) -> Path:
    path = tmp_path / "noisy.py"
    path.write_text(textwrap.dedent(NOISY.format(fail=fail)))
    return path


def test_a_run_prints_where_steps_run_and_its_states_and_the_steps_output_goes_to_their_log(tmp_path):
    result = drydock("run", str(write(tmp_path)), "--prefix", str(tmp_path / "p"))
    assert result.returncode == 0, result.stderr
    lines = (result.stderr + result.stdout).splitlines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d local threads \(\d+ CPUs\)", lines[0]), lines[0]
    assert "library" not in result.stderr + result.stdout and "started" not in result.stdout
    assert "\x1b[" not in result.stderr + result.stdout  # piped: no escape codes
    assert [line.split()[1] for line in lines[2:4]] == ["RUNNING", "SUCCEEDED"]
    (log,) = (tmp_path / "p").glob("noisy/step-*/.logs/attempt-1.log")
    text = log.read_text()
    assert "library print 29" in text and "library warning 29" in text
    assert (
        "printed from a thread the step started" in text and "logged from a thread the step started" in text
    )


def test_verbose_streams_the_steps_output_too(tmp_path):
    result = drydock("run", str(write(tmp_path)), "--prefix", str(tmp_path / "p"), "--verbose")
    assert result.returncode == 0, result.stderr
    assert "library print 29" in result.stdout + result.stderr
    assert "library warning 29" in result.stderr
    (log,) = (tmp_path / "p").glob("noisy/step-*/.logs/attempt-1.log")
    assert "library print 29" in log.read_text()


def test_a_failed_step_shows_the_tail_of_its_log_and_where_it_is(tmp_path):
    result = drydock("run", str(write(tmp_path, fail=True)), "--prefix", str(tmp_path / "p"))
    assert result.returncode == 1
    (log,) = (tmp_path / "p").glob("noisy/step-*/.logs/attempt-1.log")
    header = f"the last 20 lines of {log}"
    assert header in result.stderr, result.stderr
    tail = result.stderr[result.stderr.index(header) :].splitlines()[1:21]
    assert len(tail) == 20 and tail[-1].strip() == "RuntimeError: the step gave up"
    assert "library print 0" not in result.stderr  # only the tail


def _report(path: Path, run_id: str, done: int, total: int, **data: float) -> None:
    path.mkdir(parents=True, exist_ok=True)
    record = {"done": done, "total": total, "unit": "steps", "time": time.time(), "run_id": run_id}
    (path / ".progress").write_text(json.dumps({**record, "data": data}))


def test_plain_progress_lines_of_a_running_step_and_whole_lines_from_parallel_steps(tmp_path):
    stream = io.StringIO()
    paths = {"train/a-1": str(tmp_path / "a"), "train/b-2": str(tmp_path / "b")}
    console = RunConsole(LocalStorage(), paths, "run1", stream=stream, progress_every=0.2, poll=0.05)
    _report(tmp_path / "a", "run1", 30, 100, loss=2.5, tokens_per_second=24_468.0, eta_seconds=70.0)
    _report(tmp_path / "b", "an-older-run", 90, 100, loss=9.0)  # not this run's: never shown
    with console:
        console.state("train/a-1", "RUNNING")
        console.state("train/b-2", "RUNNING")

        def chatter(name: str) -> None:
            for i in range(200):
                console.line(f"{name} line {i} " + "x" * 50)

        threads = [threading.Thread(target=chatter, args=(n,)) for n in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 10
        while "progress" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        console.state("train/a-1", "SUCCEEDED")
    lines = stream.getvalue().splitlines()
    assert "\x1b[" not in stream.getvalue()
    # Every line whole: a time, then one writer's text.
    chat = [line for line in lines if " line " in line]
    assert len(chat) == 400 and all(
        re.fullmatch(r"\d\d:\d\d:\d\d [ab] line \d+ x{50}", line) for line in chat
    )
    progress = [line for line in lines if "progress" in line]
    assert progress and all("train/a-1" in line for line in progress)
    assert re.search(r"progress   train/a-1  30/100 steps loss 2\.5 24\.5k tok/s ETA 1m\d\ds", progress[0])


def test_on_a_terminal_running_steps_are_a_live_display_gone_at_the_end(tmp_path):
    stream = io.StringIO()
    paths = {"train/a-1": str(tmp_path / "a")}
    _report(tmp_path / "a", "run1", 30, 100, loss=2.5)
    console = RunConsole(LocalStorage(), paths, "run1", stream=stream, interactive=True, poll=0.05)
    with console:
        console.state("train/a-1", "RUNNING")
        console.line("RUNNING    train/a-1")
        time.sleep(0.6)
        assert "30/100 steps loss 2.5" in console.progress_text("train/a-1")
    out = stream.getvalue()
    assert "RUNNING    train/a-1" in out and "30/100 steps" in out  # drawn, then cleared


UNWRITABLE = """
import os, shutil
from dataclasses import dataclass
from pipeline import Step, executor_main, step_function, this_output

@dataclass(frozen=True)
class Config:
    output: str
    experiments: str

@step_function
def break_the_manifest_directory(config):
    os.makedirs(config.output, exist_ok=True)
    open(os.path.join(config.output, "done"), "w").close()
    # As a full disk would at the end of a run: the manifest cannot be written any more.
    shutil.rmtree(config.experiments)
    open(config.experiments, "w").close()

if __name__ == "__main__":
    executor_main([Step("data/a", break_the_manifest_directory, Config(this_output(), {experiments!r}))])
"""


def test_a_manifest_that_cannot_be_written_is_one_error_and_the_steps_stay_committed(tmp_path):
    prefix = tmp_path / "p"
    path = tmp_path / "unwritable.py"
    path.write_text(UNWRITABLE.format(experiments=str(prefix / "experiments")))
    result = drydock("run", str(path), "--prefix", str(prefix))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "could not write the run manifest" in errors[0], result.stderr
    assert "SUCCEEDED  data/a-" in result.stderr  # the end-of-run table is there
    (step,) = prefix.glob("data/a-*")
    assert '"SUCCESS"' in (step / ".status").read_text()


def test_a_retried_attempt_shows_no_progress_of_the_attempt_it_replaces(tmp_path):
    """Within one run, a training preempted at step 60 and retried: until the new attempt reports,
    its line does not show the stopped attempt's step and loss."""
    paths = {"train/a-1": str(tmp_path / "a")}
    console = RunConsole(LocalStorage(), paths, "run1", stream=io.StringIO())
    console.state("train/a-1", "RUNNING")  # the first attempt (token 1) reports step 60
    _report(tmp_path / "a", "run1", 60, 100, loss=2.5)
    report = json.loads((tmp_path / "a" / ".progress").read_text())
    (tmp_path / "a" / ".progress").write_text(json.dumps({**report, "token": 1}))
    assert console.progress_text("train/a-1").startswith("60/100 steps")
    console.state("train/a-1", "PREEMPTED")
    console.state("train/a-1", "RUNNING")  # the retry (token 2)
    assert console.progress_text("train/a-1") is None
    (tmp_path / "a" / ".progress").write_text(json.dumps({**report, "done": 12, "token": 2}))
    assert console.progress_text("train/a-1").startswith("12/100 steps")
