"""The spike policy's pure parts: detection, data positions after rewinds, learning-rate windows,
the rewind record and the counters; and that the policy enters identity only when it acts."""

from __future__ import annotations

import json
import math
import re

import pytest

from pipeline.observe.metrics import parse_events, parse_metrics
from steps.training.metrics_file import begin_metrics, read_events, read_metrics, write_metrics
from steps.training.spikes import (
    Rewind,
    RewindNeeded,
    SpikeDetector,
    SpikePolicy,
    Stability,
    TrainingDiverged,
    count_interventions,
    data_batch,
    lr_multiplier,
    read_rewinds,
    skipped_ranges,
)


def rewind(number: int, first: int, trigger: int, skipped: tuple[int, int], **more) -> Rewind:
    return Rewind(number, trigger, first, first - 10, skipped, "spike", **more)


def test_a_spike_is_far_above_the_median_of_the_recent_ok_losses():
    detector = SpikeDetector(SpikePolicy(factor=3.0, window=20, min_history=5))
    assert [detector.observe(i, x) for i, x in enumerate([2.0, 1.9, 2.1, 2.0, 1.8])] == ["ok"] * 5
    assert detector.observe(5, 5.0) == "ok"  # 2.5x: not a spike
    assert detector.observe(6, 7.0) == "spike" and detector.median == pytest.approx(2.0)
    # Spikes stay out of the history: a plateau of bad losses never becomes the new normal.
    assert [detector.observe(7 + i, 7.0) for i in range(30)] == ["spike"] * 30
    assert detector.observe(40, float("inf")) == "inf"  # warn: classified, never raised


def test_rewind_triggers_after_patience_spikes_in_a_row_or_at_once_on_nan():
    detector = SpikeDetector(SpikePolicy(action="rewind", patience=3, min_history=2))
    for i in range(3):
        detector.observe(i, 2.0)
    assert detector.observe(3, 9.0) == "spike"
    assert detector.observe(4, 2.0) == "ok"  # the streak is broken
    detector.observe(5, 9.0)
    detector.observe(6, 9.5)
    with pytest.raises(RewindNeeded) as raised:
        detector.observe(7, 9.9)
    assert (raised.value.first_step, raised.value.trigger_step) == (5, 7)
    assert raised.value.losses == {5: 9.0, 6: 9.5, 7: 9.9} and raised.value.median == 2.0
    with pytest.raises(RewindNeeded) as raised:
        detector.observe(8, float("nan"))  # before any history too
    assert raised.value.reason == "nan" and raised.value.first_step == 8


def test_skip_fails_the_run_after_patience_non_finite_losses():
    detector = SpikeDetector(SpikePolicy(action="skip", patience=2))
    assert detector.observe(0, float("nan")) == "nan"
    assert detector.observe(1, 2.0) == "ok"
    assert detector.observe(2, float("nan")) == "nan"
    with pytest.raises(TrainingDiverged, match="loss nan for 2 steps in a row"):
        detector.observe(3, float("nan"))


def test_steps_read_the_batches_no_rewind_skipped():
    first = rewind(1, 60, 61, (60, 67))
    assert [data_batch(skipped_ranges([first]), s) for s in (0, 59, 60, 61)] == [0, 59, 68, 69]
    # A second rewind over the same steps skips the batches those steps read now.
    second = rewind(2, 60, 62, (68, 70))
    ranges = skipped_ranges([first, second])
    assert ranges == [(60, 70)]
    assert data_batch(ranges, 60) == 71
    # An earlier rewind later on: steps before it read what they read before.
    third = rewind(3, 30, 30, (30, 31))
    ranges = skipped_ranges([first, second, third])
    assert [data_batch(ranges, s) for s in (29, 30, 57, 58)] == [29, 32, 59, 71]


def test_learning_rate_windows_multiply():
    a = rewind(1, 60, 61, (60, 61), lr_factor=0.5, lr_from_step=51, lr_until_step=71)
    b = rewind(2, 65, 66, (65, 66), lr_factor=0.5, lr_from_step=61, lr_until_step=81)
    assert [lr_multiplier([a, b], s) for s in (50, 51, 61, 71, 81)] == [1.0, 0.5, 0.25, 0.5, 1.0]


def test_a_rewind_round_trips_and_says_what_it_did():
    r = Rewind(
        1,
        123,
        118,
        100,
        (118, 131),
        "spike",
        {"118": 9.8, "123": 9.9},
        median=2.1,
        lr_factor=0.5,
        lr_from_step=101,
        lr_until_step=201,
    )
    assert read_rewinds(json.dumps({"rewinds": [r.to_json()]})) == [r]
    assert r.describe() == (
        "rewind 1: loss 9.9 vs median 2.1 at step 123 (spiking since step 118): rewound to step 100, "
        "skipped batches 118-131; learning rate x0.5 for steps 101-200"
    )
    assert read_rewinds(None) == []


def test_counters_come_from_the_events_kept_and_the_rewinds():
    r = Rewind(1, 61, 60, 50, (60, 67), "spike", {"60": 9.0, "61": "nan"})
    events = [
        {"event": "spike", "step": 5},
        {"event": "skipped_update", "step": 9},
        {"event": "rewind", "step": 61, **r.to_json()},
        {"event": "rewind", "step": 70, "number": "damaged"},
    ]
    assert count_interventions(events) == {
        "nan_steps": 1,
        "inf_steps": 0,
        "spike_steps": 2,
        "skipped_updates": 1,
        "rewinds": 1,
        "batches_skipped": 8,
    }


def test_event_lines_are_not_step_records_and_survive_a_resume(tmp_path):
    lines = [
        '{"step": 1, "train/loss": 2.0}',
        '{"event": "spike", "step": 2, "loss": 9.0}',
        '{"step": 2, "train/loss": 9.0, "spike": "spike"}',
        '{"event": "spike", "step": 7}',
    ]
    assert [r["step"] for r in parse_metrics(lines)] == [1, 2]
    assert [e["step"] for e in parse_events(lines)] == [2, 7]
    path = str(tmp_path / "metrics.jsonl")
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    rewind_line = {"event": "rewind", "step": 9, "number": 1}
    begin_metrics(path, path, resumed_from=5, rewinds=[rewind_line])
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    # The spike of step 7 will be logged again by the resumed run; the rewind is the run's record.
    assert [(e["event"], e["step"]) for e in read_events(path)] == [("spike", 2), ("rewind", 9)]
    write_metrics(path, read_metrics(path) + read_events(path))
    assert len(read_events(path)) == 2


def test_policies_that_change_training_are_versioned_warn_is_not():
    from pipeline.core.dag import build_dag
    from tests.steps.tiny import train

    def label(**kwargs) -> str:
        (found,) = [k for k in build_dag([train(**kwargs)], "/prefix").nodes if k.startswith("train/tiny-")]
        return found

    base = label()
    assert label(spike_policy=SpikePolicy(action="warn", factor=5.0)) == base
    assert label(stability=Stability()) == base
    assert label(spike_policy=SpikePolicy(action="rewind")) != base
    assert label(spike_policy=SpikePolicy(action="skip")) != label(spike_policy=SpikePolicy(action="rewind"))
    assert label(stability=Stability(z_loss=1e-4)) != base


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (SpikePolicy(factor=1.0), "factor"),
        (SpikePolicy(patience=0), "patience"),
        (SpikePolicy(lr_factor=2.0), "lr_factor"),
        (SpikePolicy(max_rewinds=-1), "max_rewinds"),
        (SpikePolicy(factor=math.nan), "factor"),
    ],
)
def test_bad_policies_name_their_field(policy, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        policy.check()


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("not json", "is damaged: Expecting value"),
        ('{"rewinds": [{"number": 1}]}', "rewinds[0] has no `trigger_step`"),
        ('{"nothing": []}', "is damaged: no 'rewinds'"),
        (
            '{"rewinds": [{"number": 1, "trigger_step": 5, "first_step": 4, "restored_step": null, '
            '"skipped": [9, 3], "reason": "spike"}]}',
            "its first batch is after its last",
        ),
        (
            '{"rewinds": [{"number": 1, "trigger_step": 5, "first_step": 4, "restored_step": 1e999, '
            '"skipped": [4, 5], "reason": "spike"}]}',
            "restored_step is inf, not a step number",
        ),
    ],
)
def test_a_damaged_rewinds_file_is_one_error_naming_it(text, expect):
    from steps.training.spikes import RewindsFileError

    with pytest.raises(RewindsFileError, match=re.escape("/run/rewinds.json is damaged: ")) as info:
        read_rewinds(text, "/run/rewinds.json")
    assert expect in str(info.value)


def test_a_rewind_of_a_nan_loss_reads_back():
    r = Rewind(1, 41, 41, 30, (41, 41), "nan", {"41": "nan", "42": "inf"}, None, 0.5, 31, 51)
    assert read_rewinds(json.dumps({"rewinds": [r.to_json()]}), "x/rewinds.json") == [r]
