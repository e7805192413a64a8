"""A real multi-node Ray cluster on this machine, for tests: what `drydock cluster start` starts
(`pipeline.run.backends.local_cluster`): a head and worker nodes, each on its own loopback address
(127.0.0.2, .3, ...) like separate hosts, with a token of their own; stopped node by node."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from pipeline.run.backends.local_cluster import (
    ClusterSpec,
    WorkerNode,
    auth_env,
    find_cluster,
    start_cluster,
    stop_cluster,
)

ROOT = Path(__file__).resolve().parents[1]


def ray_env(address: str | None = None) -> dict[str, str]:
    """The environment of drivers: this repository importable, no stray address, no token for a
    private instance; with `address`, the token of the cluster there (a `drydock run` finds it
    itself; a plain `ray.init` needs it)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ADDRESS", None)
    cluster = find_cluster(address) if address else None
    if cluster is not None:
        env.update(auth_env(cluster))
    return env


@contextlib.contextmanager
def ray_cluster(
    workers: Sequence[tuple[Mapping[str, float], str | None]], head_cpus: int = 1, worker_cpus: int = 1
) -> Iterator[str]:
    """Start a head node and one worker node per `(custom resources, slice label or None)`;
    yield the cluster's address; stop exactly its nodes afterwards."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    nodes = tuple(
        WorkerNode(
            cpus=worker_cpus,
            resources=dict(resources),
            labels={"ray.io/tpu-slice-name": slice_name} if slice_name else {},
        )
        for resources, slice_name in workers
    )
    name = f"test-{uuid.uuid4().hex[:8]}"
    cluster = start_cluster(name, ClusterSpec(head_cpus=head_cpus, nodes=nodes), cwd=str(ROOT))
    try:
        yield cluster.address
    finally:
        stop_cluster(name)
