"""`drydock cluster`: a Ray cluster on this machine that `drydock run --ray_address` joins with no
token set by hand, and that `stop` ends without touching another Ray on the machine; a driver
the cluster refuses gets one line, not Ray's retries and a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.processes import pid_alive
from pipeline.run.backends.local_cluster import list_clusters

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def drydock(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_cluster_started_here_runs_a_gang_free_of_token_chores_and_stops_alone(tmp_path):
    # As a user's shell has it: no RAY_AUTH_MODE (the test session sets `disabled`).
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(ROOT)
    env["DRYDOCK_CACHE_DIR"] = str(tmp_path / "cache")
    started = drydock("cluster", "start", "--workers", "1", "--name", "trial", env=env)
    assert started.returncode == 0, started.stderr
    (address,) = re.findall(r"--ray_address (127\.0\.0\.2:\d+)", started.stdout)
    other = drydock("cluster", "start", "--workers", "0", "--name", "other", env=env)
    assert other.returncode == 0, other.stderr
    try:
        assert "drydock cluster stop trial" in started.stdout
        listed = drydock("cluster", "list", env=env).stdout
        assert "cluster 'trial': head " + address in listed and "(2 of 2 nodes running)" in listed

        # Two hosts of one gang: the hello experiment on the cluster, the token found by Drydock.
        run = drydock(
            "run", "experiments/hello.py", "--prefix", str(tmp_path / "p"), "--ray_address", address, env=env
        )
        assert run.returncode == 0, run.stderr
        assert "3 succeeded" in run.stdout + run.stderr

        # A cluster whose token this driver does not have (as one `ray start` made elsewhere).
        stranger = {**env, "DRYDOCK_CACHE_DIR": str(tmp_path / "elsewhere")}
        refused = drydock(
            "run",
            "experiments/hello.py",
            "--prefix",
            str(tmp_path / "q"),
            "--ray_address",
            address,
            env=stranger,
        )
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
        assert lines[0].startswith(
            f"error: experiment, field `--ray_address`: cannot join the Ray cluster at '{address}'"
        )
        assert "RAY_AUTH_MODE=token" in lines[0]
    finally:
        stopped = drydock("cluster", "stop", "trial", env=env)
    assert stopped.returncode == 0, stopped.stderr
    os.environ["DRYDOCK_CACHE_DIR"], saved = str(tmp_path / "cache"), os.environ["DRYDOCK_CACHE_DIR"]
    try:
        clusters = {c.name: c for c in list_clusters()}
    finally:
        os.environ["DRYDOCK_CACHE_DIR"] = saved
    try:
        assert not clusters["trial"].alive()
        # The other cluster, started the same way, still runs: stop ended only its own nodes.
        assert all(pid_alive(n.pid, n.pid_start) for n in clusters["other"].nodes)
    finally:
        assert drydock("cluster", "stop", "other", env=env).returncode == 0
    unknown = drydock("cluster", "stop", "nope", env=env)
    assert unknown.returncode == 2 and "no cluster named 'nope'" in unknown.stderr
