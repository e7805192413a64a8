"""Spike-policy benchmark: what a corrupt stretch of data does to the tiny MoE under each policy.

    .venv/bin/python benchmarks/spikes.py [--repeats 1]

Trains the tiny MoE (100 steps, batch 8 x 64 tokens, checkpoints every 10 steps) four ways, each
in its own `drydock run` on a fresh prefix: on clean data, and with steps 60-65 reading nothing
but random characters under `warn`, `skip` and `rewind` (the experiment of
`tests/steps/training/test_spike_recovery.py`). Prints per run the mean training loss of the last 10 steps,
its distance from the clean run, the interventions counted in train_result.json, and the
training's wall time (so the cost of a rewind), with the load average; asserts nothing.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ must leave sys.path: its tokenize.py would shadow the standard library's.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNS = (
    ("clean", False, {}),
    ("warn", True, {"action": "warn", "factor": 1.5}),
    ("skip", True, {"action": "skip", "factor": 1.5, "skip_window": 16}),
    ("rewind", True, {"action": "rewind", "factor": 1.5, "patience": 2, "skip_batches": 6}),
)


def train(tmp: Path, name: str, corrupt: bool, policy: dict) -> dict:
    from steps.training.metrics_file import read_metrics
    from tests.steps.training.test_spike_recovery import write_experiment

    exp = write_experiment(tmp, name, corrupt=corrupt, policy=policy)
    prefix = tmp / f"{name}-prefix"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    command = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        str(exp),
        "--prefix",
        str(prefix),
        "--backend",
        "local",
    ]
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{name}: the run failed:\n{result.stderr[-3000:]}")
    (out,) = prefix.glob("train-*")
    outcome = json.loads((out / "train_result.json").read_text())
    losses = [r["loss"] for r in read_metrics(str(out / "metrics.jsonl")) if "loss" in r]
    return {
        "final": statistics.fmean(losses[-10:]),
        "wall": outcome["wall_seconds"],
        "interventions": {k: v for k, v in outcome["interventions"].items() if v},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name, _c, _p in RUNS}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-spikes-") as tmp:
            for name, corrupt, policy in RUNS:
                results[name].append(train(Path(tmp), name, corrupt, policy))
    clean = statistics.median(r["final"] for r in results["clean"])
    print(f"{'run':<8} {'final loss':>10} {'vs clean':>9} {'training s':>11}  interventions")
    for name, runs in results.items():
        final = statistics.median(r["final"] for r in runs)
        wall = statistics.median(r["wall"] for r in runs)
        change = 100 * (final - clean) / clean
        print(f"{name:<8} {final:>10.3f} {change:>+8.1f}% {wall:>11.1f}  {runs[-1]['interventions']}")
    print(f"medians of {args.repeats}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
