"""From a fresh clone to the end of `make run`, as a new user gets it.

    python3 benchmarks/fresh_clone.py [--runs 3] [--repo .] [--scratch /tmp/drydock-fresh]

Each run clones the repository's committed HEAD into its own directory and runs `make run` there
with nothing cached: an empty uv cache, an empty `DRYDOCK_CACHE_DIR` (so an empty JAX compilation
cache), no virtualenv. It prints, per run, the load average before, the time from the clone to the
run's first line (virtualenv, install, bytecode) and the rest, and the medians. Runs one after
another, so each has the machine to itself; the clones and caches are removed afterwards (the
logs are kept under `--scratch`).

Figures only: the target (2 min 30 s on a quiet 2-core machine, issue 48) is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

FIRST_LINE = re.compile(r"^\d\d:\d\d:\d\d ray: ", re.MULTILINE)
TARGET_S = 150.0


def _one(repo: str, scratch: str, number: int) -> dict[str, float | str]:
    clone = os.path.join(scratch, f"clone-{number}")
    caches = os.path.join(scratch, f"caches-{number}")
    for path in (clone, caches):
        shutil.rmtree(path, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", repo, clone], check=True)
    env = {
        **os.environ,
        "UV_CACHE_DIR": os.path.join(caches, "uv"),
        "PIP_NO_CACHE_DIR": "1",
        "DRYDOCK_CACHE_DIR": os.path.join(caches, "drydock"),
        "MARIN_PREFIX": os.path.join(caches, "marin"),
    }
    env.pop("DRYDOCK_PREFIX", None)
    load = os.getloadavg()[0]
    log_path = os.path.join(scratch, f"run-{number}.log")
    start = time.monotonic()
    first = None
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            ["make", "run"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            if first is None and FIRST_LINE.match(line):
                first = time.monotonic()
        rc = process.wait()
    end = time.monotonic()
    shutil.rmtree(clone, ignore_errors=True)
    shutil.rmtree(caches, ignore_errors=True)
    if rc != 0:
        sys.exit(f"run {number}: make run exited {rc}; see {log_path}")
    first = first if first is not None else end
    return {"load": load, "setup": first - start, "run": end - first, "total": end - start, "log": log_path}


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser.add_argument("--scratch", default="/tmp/drydock-fresh")
    args = parser.parse_args()
    os.makedirs(args.scratch, exist_ok=True)
    head = subprocess.run(
        ["git", "-C", args.repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    print(f"fresh clones of {args.repo} at {head}, {os.cpu_count()} CPUs")
    print(f"{'run':>4} {'load before':>12} {'clone to first line':>20} {'the run':>12} {'make run':>12}")
    rows = []
    for number in range(1, args.runs + 1):
        row = _one(args.repo, args.scratch, number)
        rows.append(row)
        print(
            f"{number:>4} {row['load']:>12.2f} {_clock(float(row['setup'])):>20} "
            f"{_clock(float(row['run'])):>12} {_clock(float(row['total'])):>12}",
            flush=True,
        )
    medians = {key: statistics.median(float(r[key]) for r in rows) for key in ("setup", "run", "total")}
    print(
        f"{'median':>4} {'':>12} {_clock(medians['setup']):>20} {_clock(medians['run']):>12} "
        f"{_clock(medians['total']):>12}   (target {_clock(TARGET_S)} on a quiet 2-core machine)"
    )


if __name__ == "__main__":
    main()
