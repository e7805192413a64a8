"""What the dashboard costs for large experiments: reading step states, and rendering the page.

For N steps, writes a prefix with one committed step directory per step (`.status` with RUNNING
and SUCCESS, as the executor leaves it) and a manifest listing them, then measures
`read_experiment` (the manifest plus every step's `.status`) and one GET of the experiment page
through the real app (FastAPI's test client, no network). Prints seconds and page size.

    .venv/bin/python benchmarks/dashboard.py [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py shadows the standard library's `tokenize` (used by `inspect` and
# `traceback`) for scripts run from this directory: take the directory off the import path.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

from pipeline.observe.dashboard import data
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore

EXPERIMENT = "sweep-000000000000"


def make_prefix(n: int) -> str:
    """A prefix with `n` committed steps and one manifest that lists them."""
    prefix = tempfile.mkdtemp(prefix="drydock-bench-dashboard-")
    steps = []
    for i in range(n):
        label = f"sweep/s{i}-{i:012x}"
        directory = os.path.join(prefix, label)
        os.makedirs(directory)
        events = [
            {"event": "RUNNING", "token": 1, "time": 1.0},
            {"event": "SUCCESS", "token": 1, "time": 2.0},
        ]
        with open(os.path.join(directory, ".status"), "w") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))
        steps.append(
            {
                "label": label,
                "name": f"sweep/s{i}",
                "hash": f"{i:012x}",
                "state": "SUCCEEDED",
                "deps": [f"sweep/s{i - 1}-{i - 1:012x}"] if i % 10 else [],
                "soft_deps": [],
                "fn": "bench:step",
            }
        )
    os.makedirs(os.path.join(prefix, "experiments"))
    with open(os.path.join(prefix, "experiments", f"{EXPERIMENT}.json"), "w") as f:
        manifest = {"experiment": "sweep", "finished": True, "exit_code": 0, "updated": 1.0, "steps": steps}
        json.dump(manifest, f)
    return prefix


def measure(n: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from pipeline.observe.dashboard.app import create_app

    prefix = make_prefix(n)
    try:
        store = StepStore(open_storage(prefix))
        start = time.perf_counter()
        data.read_experiment(store, prefix, EXPERIMENT)
        read = time.perf_counter() - start
        client = TestClient(create_app(prefix))
        start = time.perf_counter()
        response = client.get(f"/experiments/{EXPERIMENT}")
        page = time.perf_counter() - start
        assert response.status_code == 200, response.status_code
        return {"steps": n, "read_s": read, "page_s": page, "page_mb": len(response.content) / 1e6}
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()
    print(f"# {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{'steps':>8}  {'read states':>11}  {'page':>7}  {'page size':>9}")
    for n in args.sizes:
        r = measure(n)
        print(f"{n:>8,}  {r['read_s']:>10.2f}s  {r['page_s']:>6.2f}s  {r['page_mb']:>7.2f}MB")


if __name__ == "__main__":
    main()
