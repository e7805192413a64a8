"""Checkpoint tiers on a real tiny training (issue 31, part 3): permanent checkpoints every
`checkpoint_interval` steps, temporary ones every `checkpoint_minutes` (here: every 0.6 s) with
only the newest kept; a run killed after a temporary checkpoint resumes from it, and its losses
and data order equal those of the same run never interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from steps.training.checkpoints import complete_checkpoints, kept_steps_of
from steps.training.metrics_file import read_metrics
from tests.steps.tiny import command

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
STEPS, EVERY = 100, 50

EXPERIMENT = """
from pipeline import executor_main
from steps.training.train_moe import OptimizerSpec
from tests.steps.tiny import mix, tok, train

data = mix("mixture/tiers", steps={steps}, components={{"prose": tok("prose", validation=()),
           "arithmetic": tok("arithmetic", validation=())}}, validation=())
training = train(OptimizerSpec(learning_rate=3e-3), "train/tiers", data=data, num_steps={steps},
                 checkpoint_interval={every}, checkpoint_minutes=0.01, eval_interval=1000,
                 router_stats_interval=0, hf_export=False)
if __name__ == "__main__":
    executor_main([training])
"""


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def train_dir(prefix: Path) -> Path:
    (found,) = prefix.glob("train/tiers-*")
    return found


def temporary(checkpoint: Path) -> bool:
    return json.loads((checkpoint / "metadata.json").read_text()).get("is_temporary", False)


def losses(train: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(str(train / "metrics.jsonl")) if "loss" in r}


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiers") / "tiers.py"
    path.write_text(EXPERIMENT.format(root=str(ROOT), steps=STEPS, every=EVERY))
    return path


def test_a_run_killed_after_a_temporary_checkpoint_resumes_from_it_as_if_never_interrupted(
    experiment, tmp_path
):
    straight = tmp_path / "straight"
    result = subprocess.run(
        command(experiment, straight), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = train_dir(straight)
    # The tiers at the end: every permanent checkpoint, and no temporary one (the final
    # checkpoint is permanent, and a permanent one removes the temporaries before it).
    assert sorted(complete_checkpoints(str(reference / "checkpoints"))) == [EVERY, STEPS - 1]
    levanter_log = "".join(p.read_text() for p in (reference / ".logs").glob("*.log"))
    assert "Saving temporary checkpoint at step" in levanter_log, "no temporary checkpoint was made"

    # The same run, killed once a temporary checkpoint newer than the last permanent one is there.
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        command(experiment, killed), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline, newest = time.monotonic() + 600, None
    while newest is None:
        assert time.monotonic() < deadline and proc.poll() is None, "no temporary checkpoint after step 50"
        for checkpoint in killed.glob("train/tiers-*/checkpoints/step-*"):
            step = int(checkpoint.name[5:])
            if step > EVERY and (checkpoint / "metadata.json").exists() and temporary(checkpoint):
                newest = step
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    train = train_dir(killed)
    kept = complete_checkpoints(str(train / "checkpoints"))
    temporaries = [s for s, path in kept.items() if temporary(Path(path))]
    assert len(temporaries) <= 1 and EVERY in kept and not temporary(Path(kept[EVERY]))
    resumed = subprocess.run(
        command(experiment, killed), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    outcome = json.loads((train / "train_result.json").read_text())
    # Resume takes the newest checkpoint of either tier.
    assert outcome["resumed_from_step"] == max(kept) > EVERY and outcome["final_step"] == STEPS - 1
    mine, theirs = losses(train), losses(reference)
    assert sorted(mine) == sorted(theirs) == list(range(2, STEPS))
    # A resume restores the exact weights and optimizer state and reads the same batches at the
    # same steps: the losses are equal (measured bit for bit; the bound allows the last digit).
    for step in theirs:
        assert abs(mine[step] - theirs[step]) <= 1e-6 * abs(theirs[step]), (step, mine[step], theirs[step])
    assert sorted(complete_checkpoints(str(train / "checkpoints"))) == [EVERY, STEPS - 1]
    # Followers and evaluations see the permanent tier only.
    sees = kept_steps_of(STEPS - 1, EVERY)
    assert [s for s in range(STEPS) if sees(s)] == [EVERY, STEPS - 1] and not sees(max(kept))
