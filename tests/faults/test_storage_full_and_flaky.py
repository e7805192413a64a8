"""Storage faults during whole runs: transient failures everywhere, and a store that fills up."""

from __future__ import annotations

import errno
import os

from pipeline.core.plan import State
from tests.faults.storage_trials import failed_states, flaky_trial, full_trial
from tests.faults.trials import Counts


def test_transient_storage_faults_during_runs_never_half_commit(tmp_path):
    counts = Counts()
    for seed in range(5):
        counts = counts + flaky_trial(tmp_path / f"flaky-{seed}", seed)
    assert counts.clean, "\n".join(counts.problems)
    assert counts.faults >= 10  # errors, lost replies, delays and partial writes all happened
    assert counts.committed == 5 * 6


def test_a_full_store_fails_the_step_clearly_and_a_rerun_with_space_finishes(tmp_path):
    counts, first = full_trial(tmp_path, budget=40_000)
    assert counts.faults >= 1, "the store never ran out of space"
    assert not first.ok and first.exit_code == 1
    failed = failed_states(first)
    errors = [error for state, error in failed.values() if state == State.FAILED]
    assert errors and all(os.strerror(errno.ENOSPC) in error for error in errors), failed
    assert {state for state, _ in failed.values()} <= {State.FAILED, State.BLOCKED}
    # Nothing half committed by the full store; the rerun redid only what had not committed.
    assert counts.clean, "\n".join(counts.problems)
    assert counts.committed == 6
