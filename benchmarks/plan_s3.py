"""Cached planning on object storage: time and requests per step, against moto's S3 server.

    .venv/bin/python benchmarks/plan_s3.py [--sizes 1000 10000] [--repeat 3]

For each size: the engine benchmark's layered experiment (benchmarks/engine.py) is left fully done
under `s3://drydock-bench/plan-<size>` (through `StepStore`, as the executor would commit it,
digests included), then `prepare()` plans it `--repeat` times. Printed: the median time, and the
storage requests per cached step, counted at `Storage` (every `read` is one GET, every `listdir`
one LIST). moto runs in one Python process on the same cores as the benchmark: the figures are
about Drydock's request pattern, not about S3's latency. Nothing is asserted on time.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ must leave sys.path before anything else is imported (see benchmarks/engine.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import collections
import importlib.util
import platform
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from pipeline import ExecutorMainConfig
from pipeline.core.dag import build_dag
from pipeline.core.plan import State
from pipeline.processes import current_owner
from pipeline.run.experiment import prepare
from pipeline.run.records.provenance import drift_digest_of, environment_info, step_info
from pipeline.storage.files import Storage
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, StepStore
from tests.s3server import s3_bucket_environment

BUCKET = "drydock-bench"


def _engine():  # the engine benchmark's synthetic experiment, loaded by path (benchmarks/ is no package)
    spec = importlib.util.spec_from_file_location("drydock_bench_engine", os.path.join(_HERE, "engine.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def populate(steps, prefix: str, threads: int = 16) -> None:
    """Every step committed as the executor would (digests included), in parallel; one step
    first, alone, for the reason `pipeline.storage.opening.map_reads` gives."""
    dag = build_dag(steps, prefix)
    store = StepStore(open_storage(prefix))
    owner = current_owner()
    run_info = environment_info(None)

    def one(label: str) -> None:
        node = dag.nodes[label]
        taken = store.acquire(node.output_path, owner, 600.0)
        assert isinstance(taken, Acquired), taken
        info = step_info(dag, label)
        info.update(run_info, run_id=owner.run_id, attempt=1, token=taken.token, started=time.time())
        step_json = store.write_step_json(node.output_path, info)
        store.storage.write(f"{node.output_path}/out.txt", b"0\n")
        data = {"duration": 0.0, "drift": drift_digest_of(dag, label), "step_json": step_json}
        assert store.commit(node.output_path, owner, taken.token, data=data)

    labels = list(dag.nodes)
    one(labels[0])
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, labels[1:]))


class Counting:
    """Counts `Storage.read` and `Storage.listdir` calls (one GET, one LIST each)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._read, self._listdir = Storage.read, Storage.listdir
        counts = self.counts
        read, listdir = self._read, self._listdir

        def counted_read(storage: Storage, path: str) -> bytes | None:
            counts[path.rsplit("/", 1)[-1] if "/." in path else "other"] += 1
            return read(storage, path)

        def counted_listdir(storage: Storage, path: str) -> list[str]:
            counts["LIST"] += 1
            return listdir(storage, path)

        Storage.read, Storage.listdir = counted_read, counted_listdir  # type: ignore[method-assign]

    def close(self) -> None:
        Storage.read, Storage.listdir = self._read, self._listdir  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    engine = _engine()
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    with s3_bucket_environment(BUCKET):
        for size in args.sizes:
            prefix = f"s3://{BUCKET}/plan-{size}"
            steps = engine.layered_steps(size, 32)
            started = time.perf_counter()
            populate(steps, prefix)
            populated = time.perf_counter() - started
            config = ExecutorMainConfig(prefix=prefix, backend="local")
            times = []
            counting = None
            for i in range(args.repeat):
                if i == args.repeat - 1:
                    counting = Counting()
                start = time.perf_counter()
                _dag, _store, plan = prepare(steps, config)
                times.append(time.perf_counter() - start)
                assert len(plan.in_state(State.CACHED)) == size, plan.counts()
                assert all(sp.reason == "cached" for sp in plan.steps.values())
            assert counting is not None
            counting.close()
            per_step = {k: v / size for k, v in sorted(counting.counts.items())}
            shown = ", ".join(f"{k} {v:.2f}" for k, v in per_step.items())
            print(
                f"{size:>7,} steps: cached plan {statistics.median(times):.2f} s (median of {len(times)}; "
                f"{1e6 * statistics.median(times) / size:,.0f} us/step); requests per cached step: "
                f"{sum(per_step.values()):.2f} ({shown}); populated in {populated:.0f} s"
            )
    print(f"load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
