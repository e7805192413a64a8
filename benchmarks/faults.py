"""Fault-injection figures: many trials of the kill, race and pause faults of `tests/faults/`.

    .venv/bin/python benchmarks/faults.py [--trials 200] [--race-trials N] [--pause-trials N]
        [--flaky-trials N] [--full-trials N] [--ray-trials 3] [--jobs 2] [--seed 0] [--keep DIR]

Runs the trials of `tests/faults/trials.py` and `tests/faults/storage_trials.py` (the same code
the test suite runs with a few trials) and prints, per kind of fault: trials, faults injected,
steps committed, duplicates, half-committed and lost outputs (the last three must be 0), and
calls redone after a crash. Every problem found is printed in full below the table. Exit code
1 if any was found.

`--trials` is the number of SIGKILL trials on the local backend, and of transient-storage
(`flaky`) and full-storage (`full`) trials, which take well under a second each. Race and pause
trials take longer (several runners, a lease to expire) and default to a tenth and a twentieth
of it. `--ray-trials` SIGKILL trials run with the Ray backend, one at a time (each starts a
private Ray instance). `--store-kill-trials` and `--store-race-trials` run the kill and race
trials with the prefix on S3: a moto server on 127.0.0.1 started for the benchmark (the call
logs stay on local disk); kills land uniformly within a run's duration measured there.
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
import platform
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.faults.trials import Counts, calibrate, one_trial, summarize

RAY_SPAN = 1.5
"""Seconds after the first step call within which Ray kills land (the steps take about that)."""


def run_kind(
    kind: str,
    n: int,
    root: Path,
    args: argparse.Namespace,
    span: float,
    backend: str,
    store: str | None = None,
) -> tuple[Counts, float]:
    """`n` trials of `kind`, `args.jobs` at a time; each trial's seed is `args.seed + i`."""
    started = time.monotonic()
    total = Counts()
    jobs = 1 if backend == "ray" else max(1, args.jobs)  # one private Ray instance at a time
    with ThreadPoolExecutor(jobs) as pool:  # trials are subprocesses or I/O-bound: threads suffice
        futures = [
            pool.submit(
                one_trial,
                kind,
                root / f"{kind}-{backend}{'-s3' if store else ''}-{i:04d}",
                args.seed + i,
                span=span,
                backend=backend,
                store=store,
            )
            for i in range(n)
        ]
        for done, future in enumerate(futures, 1):
            total = total + future.result()
            if done % 20 == 0 or done == n:
                print(f"  {kind}: {done}/{n} trials", file=sys.stderr, flush=True)
    return total, time.monotonic() - started


def store_trials(root: Path, args: argparse.Namespace) -> list[tuple[str, Counts]]:
    """The kill and race trials with the prefix on S3, against a moto server started here."""
    from tests.s3server import s3_bucket_environment

    rows = []
    with s3_bucket_environment("drydock-faults"):
        store = "s3://drydock-faults"
        span = calibrate(root / "calibrate-s3", store=store)
        print(f"an uninterrupted run on S3 (moto) takes {span:.2f}s", flush=True)
        for label, kind, n in (
            ("kill/s3", "kill", args.store_kill_trials),
            ("race/s3", "race", args.store_race_trials),
        ):
            if n <= 0:
                continue
            counts, seconds = run_kind(kind, n, root, args, span, "local", store)
            rows.append((label, counts))
            print(f"  {label}: {n} trials in {seconds:.0f}s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200, help="SIGKILL trials (local backend)")
    parser.add_argument("--race-trials", type=int, default=None, help="default: trials // 10")
    parser.add_argument("--pause-trials", type=int, default=None, help="default: trials // 20")
    parser.add_argument("--flaky-trials", type=int, default=None, help="default: trials")
    parser.add_argument("--full-trials", type=int, default=None, help="default: trials")
    parser.add_argument("--ray-trials", type=int, default=3, help="SIGKILL trials with the Ray backend")
    parser.add_argument(
        "--store-kill-trials", type=int, default=50, help="SIGKILL trials, prefix on S3 (moto)"
    )
    parser.add_argument("--store-race-trials", type=int, default=10, help="race trials, prefix on S3 (moto)")
    parser.add_argument("--jobs", type=int, default=2, help="trials running at once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=None, help="keep trial directories here")
    args = parser.parse_args()
    os.environ["RAY_AUTH_MODE"] = "disabled"

    def default(value: int | None, fallback: int) -> int:
        return value if value is not None else fallback

    with tempfile.TemporaryDirectory(prefix="drydock-faults-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        span = calibrate(root / "calibrate")
        print(
            f"python {platform.python_version()}, {os.cpu_count()} CPUs, jobs {args.jobs}, seed {args.seed}; "
            f"an uninterrupted local run takes {span:.2f}s, so local kills land uniformly in "
            f"[0, {span:.2f}s] after the executor starts; Ray kills land in [0, {RAY_SPAN}s] after "
            "the first step call starts",
            flush=True,
        )
        plan = [
            ("kill", "kill", args.trials, "local", span),
            ("race", "race", default(args.race_trials, max(1, args.trials // 10)), "local", span),
            ("pause", "pause", default(args.pause_trials, max(1, args.trials // 20)), "local", span),
            ("flaky", "flaky", default(args.flaky_trials, args.trials), "local", span),
            ("full", "full", default(args.full_trials, args.trials), "local", span),
            ("kill/ray", "kill", args.ray_trials, "ray", RAY_SPAN),
        ]
        rows = []
        for label, kind, n, backend, kind_span in plan:
            if n <= 0:
                continue
            counts, seconds = run_kind(kind, n, root, args, kind_span, backend)
            rows.append((label, counts))
            print(f"  {label}: {n} trials in {seconds:.0f}s", file=sys.stderr, flush=True)
        if args.store_kill_trials > 0 or args.store_race_trials > 0:
            rows.extend(store_trials(root, args))
        total = Counts()
        for _label, counts in rows:
            total = total + counts
        print(summarize([*rows, ("all", total)]))
        for problem in total.problems:
            print(f"PROBLEM {problem}")
    return 0 if total.clean else 1


if __name__ == "__main__":
    sys.exit(main())
