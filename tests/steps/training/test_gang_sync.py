"""Joining a gang (`steps.training.gang_sync.join_gang`): two CPU processes on loopback form one
JAX process group, and the coordinator listens on the node's address only."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

MEMBER = """
import json, sys
import psutil
from pipeline import Gang
from steps.training.gang_sync import agree_any, join_gang

index, coordinator = int(sys.argv[1]), sys.argv[2]
join_gang(Gang(index=index, size=2, coordinator=coordinator, platform="cpu"))
port = int(coordinator.rsplit(":", 1)[1])
listening = sorted(
    c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
    if c.status == psutil.CONN_LISTEN and c.laddr.port == port
)
import jax
together = agree_any(index == 1)  # a collective both must enter
print(json.dumps({"listening": listening, "processes": jax.process_count(), "agreed": bool(together)}))
"""


def test_a_cpu_gang_joins_and_its_coordinator_binds_the_node_address_only():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    coordinator = f"127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    members = [
        subprocess.Popen(
            [sys.executable, "-c", MEMBER, str(index), coordinator],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in (0, 1)
    ]
    outputs = [member.communicate(timeout=240) for member in members]
    for member, (_out, err) in zip(members, outputs, strict=True):
        assert member.returncode == 0, err[-3000:]
    leader, follower = (json.loads(out.strip().splitlines()[-1]) for out, _err in outputs)
    assert leader["processes"] == follower["processes"] == 2
    assert leader["agreed"] and follower["agreed"]
    # Regression: JAX's coordinator bound every interface ("[::]:port") unless told otherwise.
    assert [ip.removeprefix("::ffff:") for ip in leader["listening"]] == ["127.0.0.1"], leader
    assert follower["listening"] == []
