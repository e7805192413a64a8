"""Tokens per second of the train_moe step vs Levanter's `train_lm` called directly.

Both train the same tiny Qwen3-MoE (2 layers, d=64, 4 experts, top-2, seq 128, batch 8) on the
demo corpus with the same `TrainLmConfig`. The only differences are what train_moe adds: its
metrics.jsonl tracker (direct: Levanter's no-op tracker) and its router-statistics watch every
10 steps (direct: Levanter's default watch). Each run is a fresh process; compilation cancels
out by timing two lengths: steady-state seconds per step = (T(long) - T(short)) / (long - short).

    .venv/bin/python benchmarks/train.py [--short 40] [--long 240] [--out results.json]
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
    from steps.mixture import mixture_step
    from steps.tokenize import tokenize_step

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
    """One timed training run (in its own process)."""
    from steps.mixture import load_data_config
    from steps.moe import MoeModelConfig, to_levanter
    from steps.train_moe import TrainMoeConfig, levanter_train_config, train_moe

    config = TrainMoeConfig(
        data=data,
        output=out,
        model=MoeModelConfig(),
        batch_size=BATCH,
        seq_len=SEQ,
        num_steps=steps,
        checkpoint_interval=10**6,
        checkpoint_minutes=10**6,
        eval_interval=10**6,
        hf_export=False,
        router_stats_interval=10,
    )
    started = time.perf_counter()
    if mode == "step":
        train_moe(config)
    else:
        from levanter.callbacks.watch import WatchConfig
        from levanter.main import train_lm
        from levanter.tracker import NoopConfig

        data_config = load_data_config(data)
        levanter = levanter_train_config(
            config, data_config, to_levanter(config.model, SEQ, data_config.tokenizer)
        )
        trainer = dataclasses.replace(levanter.trainer, tracker=NoopConfig(), watch=WatchConfig())
        train_lm.main(dataclasses.replace(levanter, trainer=trainer))
    print(json.dumps({"seconds": time.perf_counter() - started}))


def timed(mode: str, data: str, steps: int) -> float:
    with tempfile.TemporaryDirectory(prefix=f"drydock-bench-train-{mode}-") as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MARIN_PREFIX": os.path.join(out, "marin")}
        result = subprocess.run(
            [sys.executable, __file__, "--child", mode, data, str(steps), out],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return json.loads(result.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=40)
    parser.add_argument("--long", type=int, default=240)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, data, steps, out = args.child
        child(mode, data, int(steps), out)
        return
    with tempfile.TemporaryDirectory(prefix="drydock-bench-train-data-") as prefix:
        data = prepare(prefix)
        rows = {}
        for mode in ("direct", "step"):
            short, long = timed(mode, data, args.short), timed(mode, data, args.long)
            per_step = (long - short) / (args.long - args.short)
            rows[mode] = {
                "short_s": short,
                "long_s": long,
                "s_per_step": per_step,
                "tokens_per_s": BATCH * SEQ / per_step,
            }
    overhead = rows["step"]["s_per_step"] / rows["direct"]["s_per_step"] - 1
    print(
        f"tiny Qwen3-MoE, batch {BATCH} x seq {SEQ}; {os.cpu_count()} cores; "
        f"steps {args.short} and {args.long}"
    )
    print(f"{'':28} {'T(short) s':>10} {'T(long) s':>10} {'ms/step':>9} {'tokens/s':>10}")
    for name, label in (("direct", "levanter train_lm directly"), ("step", "drydock train_moe step")):
        r = rows[name]
        print(
            f"{label:28} {r['short_s']:10.1f} {r['long_s']:10.1f} {1000 * r['s_per_step']:9.1f} "
            f"{r['tokens_per_s']:10,.0f}"
        )
    print(f"train_moe steady-state overhead: {overhead:+.1%} (target: under 2%)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "overhead": overhead}, indent=2))


if __name__ == "__main__":
    main()
