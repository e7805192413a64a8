"""Fault injection against real executor processes: SIGKILL, racing runners, a paused runner.

A few trials of each (the shared implementation is `tests.faults.trials`); `benchmarks/faults.py`
runs hundreds and docs/reliability.md has its figures.
"""

from __future__ import annotations

import json
import random

import pytest

from tests.faults.stepfns import MANIFEST
from tests.faults.trials import (
    Counts,
    Experiment,
    calibrate,
    kill_trial,
    pause_trial,
    race_trial,
    run_trials,
    verify,
)


def test_the_checks_catch_a_damaged_committed_output(tmp_path):
    # The trials count damage only if `verify` can see it: damage a clean prefix three ways.
    calibrate(tmp_path)
    exp = Experiment(tmp_path)
    clean = verify(exp)
    assert len(clean.committed) == 6 and clean.problems == ()
    dirs = {d.name.split("-")[0]: d for d in (p.parent for p in exp.prefix.rglob(MANIFEST))}
    (dirs["s0"] / "part-1").write_bytes(b"half a write")
    (dirs["s1"] / "part-3").unlink()
    manifest = json.loads((dirs["m0"] / MANIFEST).read_text())
    (dirs["m0"] / MANIFEST).write_text(json.dumps({**manifest, "token": manifest["token"] + 1}))
    problems = verify(exp).problems
    assert any("s0" in p and "part-1 is altered" in p for p in problems), problems
    assert any("s1" in p and "part-3 is missing" in p for p in problems), problems
    assert any("m0" in p and "committed by token" in p for p in problems), problems


def test_sigkill_at_random_moments_leaves_only_complete_commits_and_a_rerun_finishes(tmp_path):
    span = calibrate(tmp_path / "calibrate")
    counts = run_trials("kill", 4, tmp_path, seed=7, span=span)
    assert counts.clean, "\n".join(counts.problems)
    assert counts.trials == 4 and counts.faults >= 1
    assert counts.committed == 4 * 6


def test_four_racing_executors_run_each_step_function_exactly_once(tmp_path):
    counts = race_trial(tmp_path / "a") + race_trial(tmp_path / "b")
    assert counts.clean, "\n".join(counts.problems)
    assert counts.committed == 2 * 6 and counts.duplicates == 0


def test_a_paused_runner_loses_its_lease_never_commits_and_writes_nothing_after_it(tmp_path):
    counts = pause_trial(tmp_path, random.Random(3))
    # The taker committed its own attempt; the paused runner neither committed nor ran twice, and
    # once resumed its step function's writes were refused (pipeline/fence.py): no damage at all.
    assert counts.committed == 1 and counts.duplicates == 0 and counts.lost == 0
    assert counts.clean, "\n".join(counts.problems)


@pytest.mark.slow
def test_sigkill_with_the_ray_backend_leaves_only_complete_commits(tmp_path):
    # The kill lands within 1.5 s of the first step call (Ray's start takes most of a run).
    counts = kill_trial(tmp_path, random.Random(5), 1.5, backend="ray")
    assert counts.clean, "\n".join(counts.problems)
    assert counts.faults == 1 and counts.committed == 6


def test_sigkill_and_races_on_an_object_store_leave_only_complete_commits(tmp_path):
    """The same trials with the prefix on S3 (a moto server): conditional writes, not file locks,
    keep the commit protocol honest there."""
    from tests.s3server import s3_bucket_environment

    with s3_bucket_environment("drydock-faults"):
        store = "s3://drydock-faults"
        span = calibrate(tmp_path / "calibrate", store=store)
        counts = Counts()
        for i in range(3):
            counts = counts + kill_trial(tmp_path / f"kill-{i}", random.Random(11 + i), span, store=store)
        counts = counts + race_trial(tmp_path / "race", store=store)
        assert counts.clean, "\n".join(counts.problems)
        assert counts.trials == 4 and counts.committed == 4 * 6 and counts.duplicates == 0
        assert counts.faults >= 3 + 1  # three racing runners beyond the first, and a kill that landed
