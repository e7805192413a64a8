"""`steps.evaluation.follow`: a follower on real checkpoint directories and a real `.status` written by the
engine's step store, with the clock and the sleep in the test's hands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import Step, StepDeclarationError, this_output
from pipeline.processes import current_owner
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore
from steps.evaluation.follow import FollowSettings, check_follow, follow_checkpoints, read_step_results
from steps.models import TINY_MOE
from steps.training.train_moe import train_moe_step
from tests.pipeline.stepfns import WriteConfig, write_value
from tests.steps.tiny import declared_training

SETTINGS = FollowSettings(poll_seconds=1.0, patience_seconds=30.0, failed_grace_seconds=5.0)


def checkpoint(train: Path, step: int) -> None:
    path = train / "checkpoints" / f"step-{step}"
    path.mkdir(parents=True)
    (path / "metadata.json").write_text(json.dumps({"step": step}))


class Training:
    """A training directory whose `.status` the engine's step store writes; checkpoints land on sleeps."""

    def __init__(self, root: Path, landing: list[list[int]], end: str | None = "SUCCESS") -> None:
        self.dir = root / "train-0123456789ab"
        self.dir.mkdir(parents=True)
        self.store = StepStore(open_storage(str(root)))
        self.owner = current_owner()
        acquired = self.store.acquire(str(self.dir), self.owner, ttl=3600)
        self.token = acquired.token
        self.landing = list(landing)
        self.end = end
        self.now = 0.0
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.landing:
            for step in self.landing.pop(0):
                checkpoint(self.dir, step)
            if not self.landing and self.end == "SUCCESS":
                self.store.commit(str(self.dir), self.owner, self.token)
            elif not self.landing and self.end is not None:
                self.store.append(str(self.dir), self.owner, self.token, self.end, "it broke")
        assert self.sleeps < 500, "the follower never ended"


def follow(training: Training, output: Path, calls: list[int], final: int = 39, fail_at: int | None = None):
    def evaluate_one(step: int, path: str) -> dict:
        if step == fail_at:
            raise KeyboardInterrupt  # the follower killed mid-way
        calls.append(step)
        return {"checkpoint_step": step, "checkpoint": path}

    return follow_checkpoints(
        str(training.dir),
        str(output),
        final_step=final,
        checkpoint_interval=10,
        evaluate_one=evaluate_one,
        series=lambda r: {"step": float(r["checkpoint_step"])},
        ylabel="the step",
        settings=SETTINGS,
        clock=training.clock,
        sleep=training.sleep,
    )


def test_each_kept_checkpoint_once_then_it_ends(tmp_path):
    # A time-based checkpoint (step 15) is not kept by the training: the follower leaves it alone.
    training = Training(tmp_path / "prefix", [[], [10], [15, 20], [], [30, 39]])
    calls: list[int] = []
    done = follow(training, tmp_path / "out", calls)
    assert calls == [10, 20, 30, 39] and sorted(done) == [10, 20, 30, 39]
    assert sorted(read_step_results(str(tmp_path / "out"))) == [10, 20, 30, 39]
    curve = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert curve == {
        "ylabel": "the step",
        "steps": [10, 20, 30, 39],
        "series": {"step": [10.0, 20.0, 30.0, 39.0]},
    }


def test_a_restarted_follower_resumes(tmp_path):
    training = Training(tmp_path / "prefix", [[10], [20], [30], [39]])
    calls: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        follow(training, tmp_path / "out", calls, fail_at=30)
    assert calls == [10, 20]
    first = (tmp_path / "out" / "results" / "step-10.json").stat().st_mtime_ns
    follow(training, tmp_path / "out", calls)
    assert calls == [10, 20, 30, 39]  # 10 and 20 were not evaluated again
    assert (tmp_path / "out" / "results" / "step-10.json").stat().st_mtime_ns == first


def test_a_training_that_fails_ends_the_follower_after_the_grace(tmp_path):
    training = Training(tmp_path / "prefix", [[10], []], end="FAILED")
    calls: list[int] = []
    with pytest.raises(
        RuntimeError, match=r"is FAILED \(for over 5 s\) before its final checkpoint \(step 39\)"
    ):
        follow(training, tmp_path / "out", calls)
    assert calls == [10]


def test_a_training_that_finishes_without_its_final_checkpoint_is_an_error(tmp_path):
    training = Training(tmp_path / "prefix", [[10], [20]])
    with pytest.raises(FileNotFoundError, match="finished without a checkpoint at its final step 39"):
        follow(training, tmp_path / "out", [])


def test_a_training_that_never_starts_runs_out_of_patience(tmp_path):
    training = Training(tmp_path / "prefix", [], end=None)
    training.store.release(str(training.dir), training.owner, training.token)  # no runner: STALE
    with pytest.raises(RuntimeError, match="is STALE"):
        follow(training, tmp_path / "out", [])


def test_which_checkpoint_a_non_blocking_evaluation_says():
    assert check_follow("e", None, True, None) is False
    assert check_follow("e", None, False, None) is True
    assert check_follow("e", False, False, 20) is False
    with pytest.raises(StepDeclarationError, match="field `blocking`: blocking=False evaluates a training"):
        check_follow("e", False, False, None)
    with pytest.raises(StepDeclarationError, match="field `follow`"):
        check_follow("e", None, True, 20)


def test_a_checkpoint_the_training_does_not_keep_is_refused():
    from steps.evaluation.evaluate import evaluate_step

    train = declared_training()
    assert evaluate_step("e", train=train, data=train, seq_len=64, checkpoint_step=39)
    with pytest.raises(
        StepDeclarationError,
        match=r"field `checkpoint_step`: .* every 10 steps and at its final step 39; step 15",
    ):
        evaluate_step("e", train=train, data=train, seq_len=64, checkpoint_step=15)


def test_retention_keeps_the_newest_the_every_nth_and_the_final_checkpoint(tmp_path):
    from steps.training.checkpoints import complete_checkpoints, prune_checkpoints, retained_steps

    root = tmp_path / "train" / "checkpoints"
    for step in (10, 20, 30, 40, 50, 55, 59):  # 55: a time-based checkpoint, Levanter's to delete
        path = root / f"step-{step}"
        path.mkdir(parents=True)
        (path / "metadata.json").write_text(json.dumps({"step": step}))
    deleted = prune_checkpoints(str(root), interval=10, keep=2, keep_every=30, final_step=59)
    assert deleted == [10, 20]
    assert sorted(complete_checkpoints(str(root))) == [30, 40, 50, 55, 59]
    assert retained_steps(59, 10, 2, 30) == {30, 40, 50, 59}
    assert retained_steps(59, 10, None, None) is None


def test_an_evaluation_of_a_checkpoint_retention_deletes_is_refused():
    from steps.evaluation.evaluate import evaluate_step

    data = Step("mixture/x", write_value, WriteConfig(this_output()))
    train = train_moe_step(
        "train/x",
        data=data,
        model=TINY_MOE,
        batch_size=8,
        seq_len=64,
        num_steps=40,
        checkpoint_interval=10,
        keep_checkpoints=1,
    )
    assert evaluate_step("e", train=train, data=data, seq_len=64, checkpoint_step=30)
    with pytest.raises(
        StepDeclarationError, match=r"field `checkpoint_step`: .*deletes the checkpoint of step 20"
    ):
        evaluate_step("e", train=train, data=data, seq_len=64, checkpoint_step=20)
    with pytest.raises(
        StepDeclarationError, match=r"field `follow`: the training deletes all but its newest 1"
    ):
        evaluate_step("e", train=train, data=data, seq_len=64, follow=True)


def test_a_follower_reports_how_many_checkpoints_it_has_evaluated(tmp_path):
    """`status` and the dashboard show "4/4 checkpoints", not just RUNNING."""
    from pipeline.run.in_step.step_events import StepContext, bind

    training = Training(tmp_path / "prefix", [[10], [20], [30, 39]])
    step_dir = tmp_path / "follower"
    step_dir.mkdir()
    with bind(StepContext(output_path=str(step_dir), run_id="r", token=1)):
        follow(training, tmp_path / "out", [])
    report = json.loads((step_dir / ".progress").read_text())
    assert (report["done"], report["total"], report["unit"]) == (4, 4, "checkpoints"), report


def test_a_task_curve_carries_each_points_standard_error_and_the_chance_level():
    """What the dashboard needs to draw error bars and the chance line beside a follower's scores."""
    from steps.evaluation.follow import curve

    done = {
        10: {"acc": {"sums": 0.28}, "se": {"sums": 0.026}, "chance": {"sums": 0.25}},
        20: {"acc": {"sums": 0.30}, "se": {"sums": 0.027}, "chance": {"sums": 0.25}},
    }
    drawn = curve(
        done, lambda r: r["acc"], "accuracy", errors=lambda r: r["se"], levels=lambda r: r["chance"]
    )
    assert drawn == {
        "ylabel": "accuracy",
        "steps": [10, 20],
        "series": {"sums": [0.28, 0.30]},
        "errors": {"sums": [0.026, 0.027]},
        "levels": {"sums": 0.25},
    }
