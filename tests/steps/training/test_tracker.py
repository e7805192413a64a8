"""The pieces train_moe adds to Levanter: the metrics tracker, the spike guard, the Mixtral fix."""

from __future__ import annotations

import json

import pytest

from pipeline.core.records import Event
from pipeline.processes import current_owner
from pipeline.run.in_step import step_events
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from steps.training.levanter_fixes import jit_log_breaks_grad
from steps.training.metrics_file import read_events, read_metrics
from steps.training.spikes import RewindNeeded, SpikePolicy
from steps.training.tracker import JsonlTracker


def test_tracker_writes_at_once_merges_by_step_and_warns_into_the_status(tmp_path):
    step_dir = str(tmp_path / "step")
    store = StepStore(LocalStorage())
    owner = current_owner()
    token = store.acquire(step_dir, owner, ttl=60).token
    path = str(tmp_path / "metrics.jsonl")
    with step_events.bind(step_events.StepContext(step_dir, owner.run_id, token)):
        tracker = JsonlTracker(path, SpikePolicy(factor=3.0, window=50))
    for step in range(12):
        tracker.log({"moe": {"layer0": {"load": 0.5}}}, step=None)  # from inside jit: joins the next step
        tracker.log({"train/loss": 2.0 if step < 11 else 9.0}, step=step)
        tracker.log({"throughput/tokens_per_second": 1000.0 + step}, step=step)
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == 25  # written at once: nothing waits for the next step (+1 event line)
    records = read_metrics(path)
    assert [r["step"] for r in records] == list(range(12))
    assert records[11]["spike"] == "spike" and "spike" not in records[10]
    assert [(e["event"], e["step"], e["median"]) for e in read_events(path)] == [("spike", 11, 2.0)]
    assert records[3]["loss"] == 2.0 and records[3]["tokens_per_second"] == 1003.0
    assert records[3]["moe/layer0/load"] == 0.5
    assert [r["step"] for r in read_metrics(path, up_to=4)] == [0, 1, 2, 3, 4]
    events = store.events(step_dir)
    assert [e.event for e in events] == [Event.RUNNING, "WARNING"]
    assert events[1].message.startswith("loss spike at step 11: 9.0000 is 4.5x the recent median 2.0000")
    # A torn last line (a kill mid-write) is skipped.
    with open(path, "a") as f:
        f.write('{"step": 12, "train/lo')
    assert len(read_metrics(path)) == 12
    json.loads(lines[0])


def test_under_rewind_the_tracker_writes_the_step_then_stops_training(tmp_path):
    path = str(tmp_path / "metrics.jsonl")
    tracker = JsonlTracker(path, SpikePolicy(action="rewind", patience=2, min_history=3))
    for step in range(5):
        tracker.log({"train/loss": 2.0}, step=step)
    tracker.log({"train/loss": 9.0}, step=5)  # one spike: not yet
    with pytest.raises(RewindNeeded) as raised:
        tracker.log({"train/loss": 8.0}, step=6)
    assert (raised.value.first_step, raised.value.trigger_step, raised.value.reason) == (5, 6, "spike")
    assert raised.value.losses == {5: 9.0, 6: 8.0}
    assert read_metrics(path)[-1]["spike"] == "spike"  # the trigger step's record was written first
    with pytest.raises(RewindNeeded) as raised:
        tracker.log({"train/loss": float("nan")}, step=7)
    assert raised.value.reason == "nan" and raised.value.first_step == 7


def test_levanter_mixtral_logging_bug_is_still_present():
    # Mixtral calls levanter.tracker.jit_log inside the differentiated loss, which fails with
    # "IO callbacks do not support JVP"; train_moe swaps its transport (fix_mixtral_jit_log). If this
    # fails after a Levanter upgrade, the bug is fixed upstream: the fix then switches itself off,
    # and it can be deleted.
    assert jit_log_breaks_grad(), (
        "Levanter fixed jit_log under grad: remove steps.training.levanter_fixes.fix_mixtral_jit_log"
    )


def test_an_evaluation_reports_progress_again_so_the_watchdog_sees_the_training_alive(tmp_path, monkeypatch):
    """Regression: nothing reported during an in-training evaluation, so one of a whole validation
    set outlasting the watchdog's bound (a tiny gang's 20 s) was taken for a hang."""
    import time

    from steps.training.tracker import evaluating

    monkeypatch.setattr(step_events, "PROGRESS_INTERVAL", 0.0)
    step_dir = str(tmp_path / "step")
    store = StepStore(LocalStorage())
    owner = current_owner()
    token = store.acquire(step_dir, owner, ttl=60).token
    with step_events.bind(step_events.StepContext(step_dir, owner.run_id, token)):
        tracker = JsonlTracker(str(tmp_path / "metrics.jsonl"))
    tracker.log({"train/loss": 2.0, "run_progress": 0.5}, step=9)
    before = store.read_progress(step_dir)
    assert before["done"] == 10
    with evaluating(every=0.05):
        time.sleep(0.4)  # the evaluation
    after = store.read_progress(step_dir)
    assert after["done"] == 10 and after["time"] > before["time"]  # the same step, a sign of life
    assert after["data"]["loss"] == 2.0
    time.sleep(0.2)
    assert store.read_progress(step_dir) == after  # no report once the evaluation is over
