"""A real multi-node Ray cluster on this machine, for tests: `ray start --head` plus worker nodes,
each on its own loopback address (127.0.0.2, .3, ...), like separate hosts. Ray rewrites
127.0.0.1 itself to the machine's network address, but not the rest of 127/8."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict[str, str]:
    """The environment of the cluster's processes and of drivers that join it: this repository
    importable (workers import step functions from it), no auth token, no stray address."""
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def ray_cluster(
    workers: Sequence[tuple[Mapping[str, float], str | None]], head_cpus: int = 1, worker_cpus: int = 1
) -> Iterator[str]:
    """Start a head node and one worker node per `(custom resources, slice label or None)`;
    yield the cluster's address; stop every node afterwards."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    port = free_port()
    address = f"127.0.0.2:{port}"
    head = [RAY, "start", "--head", "--node-ip-address", "127.0.0.2", "--port", str(port)]
    head += ["--include-dashboard", "false", "--num-cpus", str(head_cpus), "--disable-usage-stats"]
    subprocess.run(head, check=True, env=ray_env(), capture_output=True, timeout=180)
    try:
        # One at a time: on two cores, raylets started together time out registering with the GCS.
        for i, (resources, slice_name) in enumerate(workers, start=3):
            command = [RAY, "start", "--address", address, "--node-ip-address", f"127.0.0.{i}"]
            command += ["--num-cpus", str(worker_cpus), "--disable-usage-stats"]
            if resources:
                command += ["--resources", json.dumps(dict(resources))]
            if slice_name:
                command += ["--labels", f"ray.io/tpu-slice-name={slice_name}"]
            subprocess.run(command, check=True, env=ray_env(), capture_output=True, timeout=180)
        yield address
    finally:
        subprocess.run([RAY, "stop", "--force"], env=ray_env(), capture_output=True, timeout=120)
