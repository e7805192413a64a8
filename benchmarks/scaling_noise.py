"""Seed noise of the scaling sweep: the same point trained with several seeds, and the spread of its loss.

    .venv/bin/python benchmarks/scaling_noise.py --prefix P [--points 64x1000 96x1000] [--seeds 0 1 2]

A prediction cannot be checked to better than the noise of the run it predicts. This trains each
point of `experiments/scaling_sweep.py` named by `--points` (`HIDDENxSTEPS`) once per seed (the
seed sets both the model's initialization and the data order) and evaluates it, as the sweep does,
on the local backend one training at a time. Seed 0 of a size's longest budget is the sweep's own
run, so with the sweep's prefix it is reused, not trained again; a shorter budget is trained from
scratch here (in the sweep it is a cooldown branch, the same run by construction). Prints each
point's average validation loss per seed, their mean, sample standard deviation and range,
relative to the mean. Figures only.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ must leave sys.path before anything else is imported: its tokenize.py would shadow
# the standard library's (see benchmarks/engine.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import statistics
import time

from experiments.scaling_sweep import sweep_mixture, sweep_run
from pipeline import ExecutorMainConfig, run_experiment
from pipeline.run.scheduler.executor import RunReport


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--points", nargs="+", default=["64x1000", "96x1000"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    mixture = sweep_mixture()
    runs = {
        (point, seed): sweep_run(mixture, *map(int, point.split("x")), seed=seed)
        for point in args.points
        for seed in args.seeds
    }
    started = time.time()
    report = run_experiment(
        [evaluation for _, evaluation in runs.values()],
        ExecutorMainConfig(prefix=args.prefix, backend="local", max_concurrent=1, experiment="scaling_noise"),
    )
    assert isinstance(report, RunReport)
    if not report.ok:
        sys.exit(f"the run failed: {[label for label, o in report.outcomes.items() if o.error]}")
    load = os.getloadavg()[0]
    print(f"{len(runs)} trainings and evaluations in {time.time() - started:.0f} s (load {load:.2f})")
    labels = {node.name: node.output_path for node in report.plan.dag.nodes.values()}
    for point in args.points:
        losses = []
        for seed in args.seeds:
            evaluation = runs[(point, seed)][1]
            with open(os.path.join(labels[evaluation.name], "results.json")) as f:
                losses.append(json.load(f)["average"]["loss"])
        mean = statistics.mean(losses)
        sd = statistics.stdev(losses) if len(losses) > 1 else 0.0
        spread = max(losses) - min(losses)
        print(
            f"{point:>9}  seeds {args.seeds}: "
            + ", ".join(f"{loss:.4f}" for loss in losses)
            + f"  mean {mean:.4f}  sd {sd:.4f} ({sd / mean:.1%})  range {spread:.4f} ({spread / mean:.1%})"
        )


if __name__ == "__main__":
    main()
