"""The pieces train_moe adds to Levanter: the metrics tracker, the spike guard, the Mixtral fix."""

from __future__ import annotations

import json

import pytest

from pipeline.core.lease import Owner
from pipeline.core.records import Event
from pipeline.run import step_events
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from steps.training_hooks import JsonlTracker, SpikeGuard, jit_log_breaks_grad, read_metrics


def test_spike_guard_flags_a_loss_far_above_the_recent_median():
    guard = SpikeGuard(factor=3.0, window=20, min_history=5)
    assert [guard.check(x) for x in [2.0, 1.9, 2.1, 2.0, 1.8]] == [None] * 5  # not enough history yet
    assert guard.check(5.0) is None  # 2.5x: not a spike
    assert guard.check(7.0) == pytest.approx(2.0)  # the median of what came before
    assert guard.check(2.0) is None


def test_tracker_writes_at_once_merges_by_step_and_warns_into_the_status(tmp_path):
    step_dir = str(tmp_path / "step")
    store = StepStore(LocalStorage())
    owner = Owner.current()
    token = store.acquire(step_dir, owner, ttl=60).token
    path = str(tmp_path / "metrics.jsonl")
    with step_events.bind(step_events.StepContext(step_dir, owner.run_id, token)):
        tracker = JsonlTracker(path, spike_factor=3.0, spike_window=50)
    for step in range(12):
        tracker.log({"moe": {"layer0": {"load": 0.5}}}, step=None)  # from inside jit: joins the next step
        tracker.log({"train/loss": 2.0 if step < 11 else 9.0}, step=step)
        tracker.log({"throughput/tokens_per_second": 1000.0 + step}, step=step)
    with open(path) as f:
        lines = f.read().splitlines()
    assert len(lines) == 24  # written at once: nothing waits for the next step
    records = read_metrics(path)
    assert [r["step"] for r in records] == list(range(12))
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


def test_levanter_mixtral_logging_bug_is_still_present():
    # Mixtral calls levanter.tracker.jit_log inside the differentiated loss, which fails with
    # "IO callbacks do not support JVP"; train_moe swaps its transport (fix_mixtral_jit_log). If this
    # fails after a Levanter upgrade, the bug is fixed upstream: the fix then switches itself off,
    # and it can be deleted.
    assert jit_log_breaks_grad(), (
        "Levanter fixed jit_log under grad: remove steps.training_hooks.fix_mixtral_jit_log"
    )
