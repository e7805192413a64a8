"""A learning-rate sweep of the tiny MoE, declared as one: three runs named by their rate, each
followed by its loss evaluation and the demo tasks while it trains.

    train/lr-sweep/learning_rate=0.001      tiny_moe.py's model and mixture, 160 steps, AdamW at
    train/lr-sweep/learning_rate=0.003      the rate its name says (everything else the same);
    train/lr-sweep/learning_rate=0.01       a checkpoint every 40 steps
    evaluate/lr-sweep/learning_rate=...     each checkpoint's loss per validation set, as it lands
    tasks/lr-sweep/learning_rate=...        each checkpoint's demo task scores, as it lands

The data steps are tiny_moe.py's (same identities): after `make run` they are cached. Then:

    drydock run experiments/lr_sweep.py
    drydock compare experiments/lr_sweep.py --sort eval/loss      # the winner first
    drydock explain experiments/lr_sweep.py train/lr-sweep/learning_rate=0.01   # vs the other rates

Several machines may run this file on one prefix at once: each point runs once (leases).
"""

from __future__ import annotations

from experiments.tiny_moe import BATCH_SIZE, ROOT, SEQ_LEN, mixture, model
from pipeline import Resources, executor_main, grid, sweep
from steps.evaluation.demo_tasks import DEMO_TASKS
from steps.evaluation.evaluate import evaluate_step
from steps.evaluation.task_eval import task_eval_step
from steps.training.train_moe import OptimizerSpec, train_moe_step

RATES = [1e-3, 3e-3, 1e-2]
NUM_STEPS = 160
FOLLOWER = Resources(cpus=0.5)
"""A follower mostly waits for the next checkpoint: half a CPU each, so that a training and its two
followers fit in the 2 CPUs of a small machine at once (`drydock plan` warns when they do not)."""

template = train_moe_step(
    "train/lr-sweep",
    data=mixture,
    model=model,
    optimizer=OptimizerSpec(name="adamw", learning_rate=3e-3, warmup=0.05),
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    num_steps=NUM_STEPS,
    checkpoint_interval=40,
    eval_interval=40,
    resources=Resources(cpus=1),
)

points = grid({"optimizer.learning_rate": RATES})
trainings = sweep(template, points)
followers = []
for point, train in zip(points, trainings, strict=True):
    followers.append(
        evaluate_step(
            point.name("evaluate/lr-sweep"),
            train=train,
            data=mixture,
            seq_len=SEQ_LEN,
            batch_size=BATCH_SIZE,
            follow=True,
            resources=FOLLOWER,
        )
    )
    followers.append(
        task_eval_step(
            point.name("tasks/lr-sweep"),
            train=train,
            tasks=DEMO_TASKS,
            data_root=ROOT,
            follow=True,
            resources=FOLLOWER,
        )
    )

if __name__ == "__main__":
    executor_main(followers, description="tiny MoE: three learning rates, each followed by its evaluations")
