"""Per-step dispatch overhead of the `ray` backend vs the `local` backend.

For N trivial independent steps (each writes one small file), runs the experiment on a fresh
prefix with each backend and prints wall time and time per step. Ray is started once, before
timing (its start-up is printed separately): the figure is the cost of a step, not of `ray.init`.

    .venv/bin/python benchmarks/ray_overhead.py [--sizes 100 1000] [--out results.json]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (used by `inspect` and
# `traceback`) for scripts run from this directory: take the directory off the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned


@dataclass(frozen=True)
class TouchConfig:
    output: str
    index: int


def touch(config: TouchConfig) -> None:
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "out.txt"), "w") as f:
        f.write(str(config.index))


def steps(n: int, tag: str) -> list[Step]:
    return [Step(f"bench/{tag}/s{i:05d}", touch, TouchConfig(this_output(), versioned(i))) for i in range(n)]


def timed_run(n: int, backend: str) -> float:
    prefix = tempfile.mkdtemp(prefix=f"drydock-bench-{backend}-")
    try:
        start = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):  # one console line per step is not the figure
            report = run_experiment(steps(n, backend), ExecutorMainConfig(prefix=prefix, backend=backend))
        elapsed = time.perf_counter() - start
        assert report.ok, "benchmark run failed"
        return elapsed
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--out", type=str, default=None)
    args = parser.parse_args()

    import logging

    logging.disable(logging.INFO)
    import ray

    t0 = time.perf_counter()
    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.2",
        logging_level="ERROR",
        log_to_driver=False,
    )
    ray_init = time.perf_counter() - t0

    rows = []
    for n in args.sizes:
        local = timed_run(n, "local")
        on_ray = timed_run(n, "ray")
        rows.append(
            {
                "steps": n,
                "local_s": local,
                "ray_s": on_ray,
                "local_ms_per_step": 1000 * local / n,
                "ray_ms_per_step": 1000 * on_ray / n,
                "ray_extra_ms_per_step": 1000 * (on_ray - local) / n,
            }
        )
    ray.shutdown()

    print(
        f"machine: {os.cpu_count()} cores; ray.init (local instance): {ray_init:.2f} s (not in the figures)"
    )
    header = ("steps", "local s", "ray s", "local ms/step", "ray ms/step", "ray extra ms/step")
    print(" ".join(f"{h:>{w}}" for h, w in zip(header, (7, 9, 9, 14, 12, 18), strict=True)))
    for r in rows:
        print(
            f"{r['steps']:>7} {r['local_s']:>9.2f} {r['ray_s']:>9.2f} {r['local_ms_per_step']:>14.2f} "
            f"{r['ray_ms_per_step']:>12.2f} {r['ray_extra_ms_per_step']:>18.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"ray_init_s": ray_init, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
