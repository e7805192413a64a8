"""A storage outage during a long step, on local disk (issue 31, part 4): the runner's store stops
answering (every call hangs, as on a hung network mount) for longer than the lease, or shorter.
The runner and a resumable step run in this process (local backend); the runner's metadata goes
through `tests.faultfs.FaultFS` over the real local filesystem, whose `outage` switch is the
outage; the step writes its own files to the same disk, through its write fence.

Longer than the lease: the lease counts as lost, the step's next write is refused, the attempt
ends without committing, and once the store answers again the runner takes its own step back and
the step resumes from its last checkpoint: every step's metrics line once, none lost. Shorter:
the attempt goes on as if nothing had happened."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pytest

from pipeline import Step, step_events, step_function, this_output, versioned
from pipeline.core.records import Event
from pipeline.storage.files import Storage
from pipeline.storage.object_stores import RetryPolicy
from pipeline.storage.step_store import StepStore
from tests.faultfs import FaultFS
from tests.faults.storage_trials import run_in_process


@dataclass(frozen=True)
class CountConfig:
    output: str
    steps: int = 40
    every: int = 5
    calls: str = ""


@step_function
def count_steps(config: CountConfig) -> None:
    """A resumable step: one metrics line per step, a checkpoint every `every` steps; a rerun
    resumes after its latest checkpoint and keeps the lines up to it."""
    out = Path(config.output)
    out.mkdir(parents=True, exist_ok=True)
    with open(config.calls, "a") as f:
        f.write("called\n")
    done = sorted(int(p.name[5:]) for p in out.glob("ckpt-*"))
    start = done[-1] + 1 if done else 0
    metrics = out / "metrics.jsonl"
    kept = (
        [line for line in metrics.read_text().splitlines() if json.loads(line)["step"] < start]
        if metrics.exists()
        else []
    )
    metrics.write_text("".join(line + "\n" for line in kept))
    for step in range(start, config.steps):
        with open(metrics, "a") as f:
            f.write(json.dumps({"step": step}) + "\n")
        if step % config.every == 0:
            (out / f"ckpt-{step}").write_text("state\n")
        step_events.progress(step + 1, config.steps, "steps")
        time.sleep(0.1)


@pytest.mark.parametrize(("outage", "lost"), [(6.0, True), (0.5, False)])
def test_an_outage_of_the_local_store_longer_than_the_lease_ends_the_attempt_and_it_resumes(
    tmp_path, outage, lost
):
    prefix = str(tmp_path / "prefix")
    fs = FaultFS(fsspec.filesystem("file"))
    storage = Storage(fs, retry=RetryPolicy(tries=3, base=0.01, cap=0.05))
    calls = tmp_path / "calls"
    step = Step("count/x", count_steps, CountConfig(this_output(), steps=versioned(40), calls=str(calls)))

    def outage_after_the_first_checkpoints() -> None:
        deadline = time.monotonic() + 60
        while not list(Path(prefix).glob("count/x-*/ckpt-10")) and time.monotonic() < deadline:
            time.sleep(0.01)
        fs.outage.set()
        time.sleep(outage)
        fs.outage.clear()

    thread = threading.Thread(target=outage_after_the_first_checkpoints)
    thread.start()
    report = run_in_process([step], prefix, storage)  # lease 3 s, heartbeat 0.5 s
    thread.join()
    assert report.ok, {k: o.error for k, o in report.outcomes.items()}
    (step_dir,) = Path(prefix).glob("count/x-*")
    events = [e.event for e in StepStore(Storage(fsspec.filesystem("file"))).events(str(step_dir))]
    expected = [Event.RUNNING, Event.RUNNING, Event.SUCCESS] if lost else [Event.RUNNING, Event.SUCCESS]
    assert events == expected
    assert len(calls.read_text().splitlines()) == (2 if lost else 1)
    steps = [json.loads(line)["step"] for line in (step_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(40))  # none lost, none twice
    assert os.path.exists(step_dir / "ckpt-35")
