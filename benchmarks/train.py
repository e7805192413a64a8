"""Tokens per second of the train_moe step vs Levanter's `train_lm` called directly.

Both train the same tiny Qwen3-MoE (2 layers, d=64, 4 experts, top-2, seq 128, batch 8) on the
demo corpus with the same `TrainLmConfig`. The differences are what train_moe adds: its
metrics.jsonl tracker and its router-statistics watch every 10 steps (direct: Levanter's
default watch, and a tracker that only notes the time). Each run is a fresh process. The figure
is the steady state: the median time between consecutive steps' loss logs, after step 20 (so
compilation is not in it), over the whole run; the mean is printed too, since periodic work
(router statistics every 10 steps) shows in the mean, not the median.

Runs come in `--pairs` pairs, one of each, alternating which goes first (the first pair direct
first, the next the step first, ...), so a drift in the machine's load touches both alike. The
overhead is taken within each pair (step / direct - 1) and reported as the median of the pairs
with their range: one pair of single runs measured +2.8%, +13.5% and -5.3% on three tries.

    .venv/bin/python benchmarks/train.py [--steps 300] [--pairs 5] [--out results.json]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (used by `inspect` and
# `traceback`) for scripts run from this directory: take the directory off the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BATCH, SEQ = 8, 128


def prepare(prefix: str) -> str:
    """Tokenize the demo corpus and build a mixture (cached in `prefix`); return the mixture output."""
    from pipeline import ExecutorMainConfig, run_experiment
    from steps.data.mixture import mixture_step
    from steps.data.tokenize import tokenize_step

    parts = {
        d: tokenize_step(
            f"tokenized/{d}",
            train=[f"data/corpus/{d}/train-*.jsonl"],
            validation=[f"data/corpus/{d}/validation-*.jsonl"],
            tokenizer="data/tokenizer",
            input_root=str(ROOT),
        )
        for d in ("prose", "arithmetic")
    }
    mix = mixture_step(
        "mixture/bench",
        components=parts,
        weights={"prose": 0.5, "arithmetic": 0.5},
        target_tokens=1000 * BATCH * SEQ,
        batch_size=BATCH,
        seq_len=SEQ,
        validation=["prose"],
    )
    report = run_experiment([mix], ExecutorMainConfig(prefix=prefix, backend="local"))
    return report.plan.dag.nodes[report.plan.dag.roots[0]].output_path


def child(mode: str, data: str, steps: int, out: str) -> None:
    """One training run (in its own process); prints the wall time of each step's loss log."""
    from steps.data.mixture import load_data_config
    from steps.models import TINY_MOE, to_levanter
    from steps.training.levanter_config import levanter_train_config
    from steps.training.train_moe import TrainMoeConfig, train_moe

    config = TrainMoeConfig(
        data=data,
        output=out,
        model=TINY_MOE,
        batch_size=BATCH,
        seq_len=SEQ,
        num_steps=steps,
        checkpoint_interval=10**6,
        checkpoint_minutes=10**6,
        eval_interval=10**6,
        hf_export=False,
        router_stats_interval=10,
    )
    if mode == "step":
        train_moe(config)
        times = {}
        with open(os.path.join(out, "metrics.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                if "train/loss" in record:
                    times[record["step"]] = record["wall_time"]
    else:
        from levanter.callbacks.watch import WatchConfig
        from levanter.main import train_lm

        data_config = load_data_config(data)
        levanter = levanter_train_config(
            config, data_config, to_levanter(config.model, SEQ, data_config.tokenizer)
        )
        timing = TimingTrackerConfig()
        trainer = dataclasses.replace(levanter.trainer, tracker=timing, watch=WatchConfig())
        train_lm.main(dataclasses.replace(levanter, trainer=trainer))
        times = TIMES
    print(json.dumps({"times": {str(k): v for k, v in sorted(times.items())}}))


TIMES: dict[int, float] = {}


def _timing_tracker_config() -> type:
    from levanter.tracker.tracker import Tracker, TrackerConfig

    class TimingTracker(Tracker):
        name = "timing"

        def log_hyperparameters(self, hparams):  # type: ignore[no-untyped-def]
            pass

        def log(self, metrics, *, step, commit=None):  # type: ignore[no-untyped-def]
            if step is not None and "train/loss" in metrics:
                TIMES[int(step)] = time.time()

        def log_summary(self, metrics):  # type: ignore[no-untyped-def]
            pass

        def log_artifact(self, artifact_path, *, name=None, type=None):  # type: ignore[no-untyped-def]
            pass

        def finish(self) -> None:
            pass

    @TrackerConfig.register_subclass("bench_timing")
    @dataclasses.dataclass
    class TimingTrackerConfig(TrackerConfig):
        def init(self, run_id):  # type: ignore[no-untyped-def]
            return TimingTracker()

    return TimingTrackerConfig


def TimingTrackerConfig() -> object:
    return _timing_tracker_config()()


def timed(mode: str, data: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"drydock-bench-train-{mode}-") as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MARIN_PREFIX": os.path.join(out, "marin")}
        result = subprocess.run(
            [sys.executable, __file__, "--child", mode, data, str(steps), out],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
    times = {int(k): v for k, v in json.loads(result.stdout.strip().splitlines()[-1])["times"].items()}
    gaps = [times[s] - times[s - 1] for s in sorted(times) if s > 20 and s - 1 in times]
    return {"median_s": statistics.median(gaps), "mean_s": statistics.mean(gaps), "steps_timed": len(gaps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, data, steps, out = args.child
        child(mode, data, int(steps), out)
        return
    load_before = os.getloadavg()
    pairs: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="drydock-bench-train-data-") as prefix:
        data = prepare(prefix)
        for i in range(args.pairs):
            order = ("direct", "step") if i % 2 == 0 else ("step", "direct")
            pairs.append({mode: timed(mode, data, args.steps) for mode in order})
    load_after = os.getloadavg()
    rows = {
        mode: {key: statistics.median(p[mode][key] for p in pairs) for key in ("median_s", "mean_s")}
        for mode in ("direct", "step")
    }
    for row in rows.values():
        row["tokens_per_s"] = BATCH * SEQ / row["median_s"]
    overheads = {
        kind: sorted(p["step"][f"{kind}_s"] / p["direct"][f"{kind}_s"] - 1 for p in pairs)
        for kind in ("median", "mean")
    }
    print(
        f"tiny Qwen3-MoE, batch {BATCH} x seq {SEQ}; {os.cpu_count()} cores; {args.steps} steps, "
        f"timed after step 20; {args.pairs} pairs; "
        f"load {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(f"{'':28} {'median ms':>10} {'mean ms':>9} {'tokens/s':>10}   (medians over the pairs)")
    for name, label in (("direct", "levanter train_lm directly"), ("step", "drydock train_moe step")):
        r = rows[name]
        print(f"{label:28} {1000 * r['median_s']:10.1f} {1000 * r['mean_s']:9.1f} {r['tokens_per_s']:10,.0f}")
    for kind in ("median", "mean"):
        values = overheads[kind]
        shown = ", ".join(f"{v:+.1%}" for v in values)
        print(
            f"train_moe overhead per step ({kind} step time), paired: "
            f"median {statistics.median(values):+.1%} (pairs: {shown})"
        )
    if args.out:
        result = {"pairs": pairs, "rows": rows, "overheads": overheads}
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
