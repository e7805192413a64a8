"""A training's time to its first step, with JAX's compilation cache empty (cold) and filled (warm).

    .venv/bin/python benchmarks/restart.py [--runs 3] [--scratch /tmp/drydock-restart]

The default experiment's training (`experiments/tiny_moe.py`, train/tiny-qwen3-moe) is run again
and again with `drydock run --only train --force train` on one prefix (its data steps are built
once, first): `--runs` times each with a new, empty `DRYDOCK_CACHE_DIR` (a cold start, as every
restart was before the cache), then `--runs` times with one cache directory the first of them
filled (a warm start: a retry, a rerun, a follower on the same host). Each attempt's
`train_result.json` says how many seconds passed from the step function's call to its first
logged step and what the compilation cache did; this prints them, the load average before each,
and the medians. Figures only: the goal (warm at most 40% of cold, issue 49) is printed beside.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "tiny_moe.py"
DRYDOCK = [sys.executable, "-m", "pipeline"]


def _run(prefix: Path, cache: Path, only: str | None, force: str | None) -> None:
    env = {**os.environ, "DRYDOCK_CACHE_DIR": str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    command = [*DRYDOCK, "run", str(EXPERIMENT), "--prefix", str(prefix)]
    if only:
        command += ["--only", only]
    if force:
        command += ["--force", force]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        sys.exit(f"drydock run exited {result.returncode}:\n{result.stderr[-3000:]}")


def _start(prefix: Path) -> dict:
    (train,) = (prefix / "train").glob("tiny-qwen3-moe-*")
    return json.loads((train / "train_result.json").read_text())["start"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", default="/tmp/drydock-restart")
    args = parser.parse_args()
    scratch = Path(args.scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    prefix = scratch / "prefix"
    print(f"{os.cpu_count()} CPUs; building the data steps once")
    _run(prefix, scratch / "cache-data", "mixture", None)
    print(f"{'start':>6} {'load':>5} {'to first step':>14}  compilation")
    seconds: dict[str, list[float]] = {"cold": [], "warm": []}
    warm_cache = scratch / "cache-warm"
    for kind in ("cold", "warm"):
        for number in range(args.runs):
            cache = scratch / f"cache-cold-{number}" if kind == "cold" else warm_cache
            if kind == "warm" and number == 0 and not warm_cache.exists():
                _run(prefix, warm_cache, "train", "train")  # fills it; not counted
            load = os.getloadavg()[0]
            _run(prefix, cache, "train", "train")
            start = _start(prefix)
            seconds[kind].append(start["seconds_from_start"])
            c = start["compilation"]
            compiling = c["trace_seconds"] + c["lower_seconds"] + c["backend_seconds"]
            print(
                f"{kind:>6} {load:>5.2f} {start['seconds_from_start']:>12.1f} s  "
                f"{c['programs']} programs, {c['from_cache']} from the cache, {compiling:.1f} s compiling",
                flush=True,
            )
    cold, warm = statistics.median(seconds["cold"]), statistics.median(seconds["warm"])
    print(
        f"median to first step: cold {cold:.1f} s, warm {warm:.1f} s: warm is {warm / cold:.0%} of cold "
        "(goal <= 40%)"
    )


if __name__ == "__main__":
    main()
