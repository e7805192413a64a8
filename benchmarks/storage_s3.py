"""Object-storage benchmark: Drydock's storage operations against moto's S3 server on loopback.

    .venv/bin/python benchmarks/storage_s3.py [--ops 200] [--threads 1 4 8] [--racers 8] [--races 5]

Starts moto's standalone server (tests/s3server.py) and measures, through `open_storage("s3://...")`:

  read / write   one small object, one request each (GET, PUT)
  update         the conditional read-modify-write (GET with ETag + PUT If-Match), uncontended
  contended      N threads incrementing one counter: updates per second, and conditional PUTs
                 refused per update (each refusal is a re-read and a recompute)
  lease race     `--racers` processes acquire one step's lease at the same moment (the winner
                 commits): exactly one must win; the figure is how long until every racer
                 knows its outcome (Acquired, Held or AlreadyDone)

moto runs in one Python process on the same cores as the benchmark: these figures are about
Drydock's request pattern and its overhead, not about S3, whose latency is ~10-30 ms per request
instead of ~1-3 ms here. Figures only: nothing is asserted on time.
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
import multiprocessing
import platform
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import fsspec

from pipeline.processes import current_owner
from pipeline.storage.files import ConditionalStorage
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, StepStore
from tests.s3server import moto_s3, s3_environment

BUCKET = "drydock-bench"


class CountingObjects:
    """The store's conditional requests, counting the PUTs the server refused."""

    def __init__(self, objects: object) -> None:
        self.objects = objects
        self.refused = 0

    def get(self, path: str) -> tuple[bytes | None, str | None]:
        return self.objects.get(path)  # type: ignore[attr-defined]

    def put_if(self, path: str, data: bytes, version: str | None) -> bool:
        ok = self.objects.put_if(path, data, version)  # type: ignore[attr-defined]
        if not ok:
            self.refused += 1
        return ok


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:8.1f} ops/s   {seconds / n * 1000:6.2f} ms/op"


def bench_single(root: str, ops: int) -> None:
    storage = open_storage(root)
    path = f"{root}/single"
    started = time.perf_counter()
    for i in range(ops):
        storage.write(path, str(i).encode())
    print(f"write        {rate(ops, time.perf_counter() - started)}")
    started = time.perf_counter()
    for _ in range(ops):
        storage.read(path)
    print(f"read         {rate(ops, time.perf_counter() - started)}")
    started = time.perf_counter()
    for _ in range(ops):
        storage.update(f"{root}/update", lambda old: (old or b"") + b"x\n")
    print(f"update       {rate(ops, time.perf_counter() - started)}   (GET + conditional PUT)")


def bench_contended(root: str, ops: int, threads: int) -> None:
    base = open_storage(root)
    assert isinstance(base, ConditionalStorage)
    counting = CountingObjects(base.objects)
    storage = ConditionalStorage(base.fs, counting)  # type: ignore[arg-type]
    path = f"{root}/counter-{threads}"

    def increment(_: int) -> None:
        storage.update(path, lambda old: str(int(old or b"0") + 1).encode())

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(increment, range(ops)))
    seconds = time.perf_counter() - started
    final = int(storage.read(path) or b"0")
    lost = "" if final == ops else f"   LOST {ops - final} UPDATES"
    print(
        f"contended/{threads:<2d} {rate(ops, seconds)}   refused PUTs per update "
        f"{counting.refused / ops:4.2f}   counter {final}/{ops}{lost}"
    )


def _racer(step_dir: str, barrier: multiprocessing.Barrier, results: multiprocessing.Queue) -> None:
    steps = StepStore(open_storage(step_dir))
    me = current_owner()
    barrier.wait()
    started = time.perf_counter()
    taken = steps.acquire(step_dir, me, ttl=60)
    seconds = time.perf_counter() - started
    if isinstance(taken, Acquired):  # commit, so that racers that read later find it done
        steps.storage.write(f"{step_dir}/payload", b"x")
        steps.commit(step_dir, me, taken.token)
    results.put((type(taken).__name__, seconds))


def bench_race(root: str, racers: int, races: int) -> None:
    ctx = multiprocessing.get_context("fork")
    winners, slowest = [], []
    for _ in range(races):
        step_dir = f"{root}/race-{uuid.uuid4().hex[:8]}"
        barrier, results = ctx.Barrier(racers), ctx.Queue()
        procs = [ctx.Process(target=_racer, args=(step_dir, barrier, results)) for _ in range(racers)]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        winners.append(sum(name == "Acquired" for name, _ in outcomes))
        slowest.append(max(seconds for _, seconds in outcomes))
    print(
        f"lease race   {racers} processes x {races} races: winners per race {winners}; "
        f"slowest racer median {statistics.median(slowest) * 1000:.0f} ms, max {max(slowest) * 1000:.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--racers", type=int, default=8)
    parser.add_argument("--races", type=int, default=5)
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, moto server on 127.0.0.1")
    with moto_s3() as endpoint:
        os.environ.update(s3_environment(endpoint))
        fsspec.filesystem("s3").mkdir(BUCKET)
        root = f"s3://{BUCKET}/bench-{uuid.uuid4().hex[:8]}"
        bench_single(root, args.ops)
        for threads in args.threads:
            bench_contended(root, args.ops, threads)
        bench_race(root, args.racers, args.races)


if __name__ == "__main__":
    main()
