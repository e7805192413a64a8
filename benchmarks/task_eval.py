"""Task-evaluation benchmark: examples per second of the demo task suite on the tiny MoE, on CPU.

    .venv/bin/python benchmarks/task_eval.py [--prefix drydock-runs] [--repeats 3]

Needs a finished `make run` (the tiny MoE's training) under `--prefix`. Runs the `task_eval` step's
evaluator in this process on the final checkpoint, the whole demo suite (sums and stories, 300
examples each, 4 choices, so 2,400 log-likelihood requests): once cold (tasks built, model loaded,
scoring compiled) and `--repeats` times warm (the model reloaded from the checkpoint each time, as
a follower does per checkpoint). Prints the figures and the load average; asserts nothing.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ must leave sys.path: its tokenize.py would shadow the standard library's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import glob
import statistics
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", default=os.path.join(ROOT, "drydock-runs"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trains = sorted(glob.glob(os.path.join(args.prefix, "train", "tiny-qwen3-moe-*")))
    mixtures = sorted(glob.glob(os.path.join(args.prefix, "mixture", "tiny-*")))
    if not trains or not mixtures:
        print(f"no tiny MoE training under {args.prefix}: run `make run` first", file=sys.stderr)
        return 2
    os.environ.setdefault("MARIN_PREFIX", tempfile.mkdtemp(prefix="bench-marin-"))
    from steps.evaluation.demo_tasks import DEMO_TASKS
    from steps.evaluation.eval_tasks import check_tasks
    from steps.evaluation.harness import Evaluator, build_tasks, local_task_files, offline
    from steps.evaluation.task_eval import TaskEvalConfig
    from steps.training.checkpoints import checkpoints_dir, latest_checkpoint

    train = trains[-1]
    checkpoint, step = latest_checkpoint(checkpoints_dir(train))
    config = TaskEvalConfig(
        train=train,
        data=mixtures[-1],
        output=tempfile.mkdtemp(prefix="bench-tasks-"),
        tasks=DEMO_TASKS,
        max_length=128,
        batch_size=8,
        data_root=ROOT,
    )
    started = time.perf_counter()
    with offline(None), local_task_files(check_tasks(DEMO_TASKS, ROOT, None), config) as files:
        task_dict, chances, names = build_tasks(DEMO_TASKS, files, config)
        built = time.perf_counter() - started
        evaluator = Evaluator(config, task_dict, chances, DEMO_TASKS, names)
        timings = []
        for _ in range(1 + args.repeats):
            t = time.perf_counter()
            result = evaluator.evaluate(step, checkpoint)
            timings.append(time.perf_counter() - t)
    examples = sum(entry["examples"] for entry in result["tasks"].values())
    requests = examples * 4
    warm = statistics.median(timings[1:]) if len(timings) > 1 else timings[0]
    load = os.getloadavg()
    print(f"checkpoint: step {step} of {train}")
    print(f"tasks built (lm-eval TaskManager + data): {built:.2f} s")
    print(f"examples: {examples} ({requests} log-likelihood requests)")
    cold = timings[0]
    print(f"cold evaluation (load + compile + score): {cold:.2f} s = {examples / cold:.0f} examples/s")
    print(
        f"warm evaluation, median of {len(timings) - 1}: {warm:.2f} s = {examples / warm:.0f} examples/s "
        f"({requests / warm:.0f} requests/s); runs: {', '.join(f'{x:.2f}' for x in timings[1:])}"
    )
    for name, entry in result["tasks"].items():
        metrics = entry["metrics"]
        print(
            f"  {name}: acc {metrics['acc']:.3f} ± {metrics['acc_stderr']:.3f} (chance {entry['chance']:.3f})"
        )
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
