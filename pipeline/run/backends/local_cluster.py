"""A Ray cluster on this one machine, for trying gangs of hosts before a real cluster
(`drydock cluster start|stop|list`, and the multi-host tests).

    drydock cluster start --workers 2          # a head and two worker nodes; prints the address
    drydock run x.py --ray_address 127.0.0.2:PORT
    drydock cluster stop                       # stops exactly these nodes, no other Ray

Each node is a `ray start --block` process in a session of its own, on its own loopback address
(127.0.0.2 for the head, .3, .4, ... for the workers: like separate hosts, and Ray rewrites
127.0.0.1 to the machine's network address but not the rest of 127/8). Stopping signals each
node's process group, so a Ray that someone else started on the machine is never touched (`ray
stop --force` kills every Ray of every user).

Ray 2.60 turns token authentication on where `ray start` runs: the nodes here share a token that
`start` makes (kept, readable by its owner only, in the cluster's directory), and a driver that
names the cluster's address gets it from there (`auth_env`): `drydock run --ray_address` needs
nothing else. The nodes' servers still bind all interfaces (Ray 2.60 has no option against it),
so the token is what keeps others out.

The nodes import your step functions: the directory `start` ran in is put on their PYTHONPATH
(with any PYTHONPATH it had), so an experiment's own modules there import on every node.
State, one directory a cluster: `$DRYDOCK_CACHE_DIR/clusters/<name>/` (default
`~/.cache/drydock/clusters/<name>/`): `cluster.json` (address, nodes, their process groups),
`token`, and each node's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import DrydockError
from pipeline.processes import cache_dir, pid_alive, process_start_time

__all__ = [
    "ClusterError",
    "ClusterSpec",
    "LocalCluster",
    "WorkerNode",
    "auth_env",
    "clusters_root",
    "find_cluster",
    "list_clusters",
    "start_cluster",
    "stop_cluster",
]

HEAD_IP = "127.0.0.2"
_START_TIMEOUT = 180.0


class ClusterError(DrydockError):
    """A cluster that cannot be started, found or stopped; the message says why in one line."""


@dataclass(frozen=True)
class ClusterSpec:
    """What to start: a head and `workers` worker nodes, each a loopback "host"."""

    workers: int = 2
    """Worker nodes (the head runs the driver's tasks too, with `head_cpus`)."""
    cpus: int = 1
    """CPUs each worker node offers: one gang process of a CPU training each."""
    head_cpus: int = 1
    gpus: int = 0
    """GPUs each worker node offers (the machine's GPUs are shared, as Ray counts them)."""
    resources: Mapping[str, float] = field(default_factory=dict)
    """Custom resources each worker node offers (`{"TPU": 4}` to try a TPU-shaped layout)."""
    nodes: tuple[WorkerNode, ...] = ()
    """Worker nodes one by one, when they differ (the tests' TPU slices); overrides the above."""

    def __post_init__(self) -> None:
        if self.workers < 0 or self.cpus < 0 or self.head_cpus < 0 or self.gpus < 0:
            raise ClusterError("workers, cpus, head_cpus and gpus must not be negative")
        if len(self.worker_nodes()) > 250:
            raise ClusterError("at most 250 workers: each takes a loopback address 127.0.0.3 to .252")

    def worker_nodes(self) -> tuple[WorkerNode, ...]:
        """Each worker node to start."""
        if self.nodes:
            return self.nodes
        return tuple(WorkerNode(self.cpus, self.gpus, dict(self.resources)) for _ in range(self.workers))


@dataclass(frozen=True)
class WorkerNode:
    """One worker node: what it offers Ray."""

    cpus: int = 1
    gpus: int = 0
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    """Node labels (`ray.io/tpu-slice-name`: the slice a TPU host belongs to)."""


@dataclass(frozen=True)
class Node:
    """One `ray start --block` process: its address, process (group) and log."""

    ip: str
    pid: int
    pid_start: str | None
    log: str


@dataclass(frozen=True)
class LocalCluster:
    """A started cluster, as `cluster.json` records it."""

    name: str
    address: str
    directory: str
    nodes: tuple[Node, ...]
    spec: dict[str, Any]
    started: float

    @property
    def token_path(self) -> str:
        return os.path.join(self.directory, "token")

    def alive(self) -> list[Node]:
        """The nodes whose process still runs."""
        return [n for n in self.nodes if pid_alive(n.pid, n.pid_start)]

    def describe(self) -> str:
        alive = len(self.alive())
        return (
            f"cluster {self.name!r}: head {self.address}, {len(self.nodes) - 1} worker(s) "
            f"({alive} of {len(self.nodes)} nodes running)"
        )


def clusters_root() -> Path:
    """Where clusters' state lives: `clusters/` in Drydock's cache (`pipeline.processes.cache_dir`)."""
    return Path(cache_dir("clusters"))


def _ray() -> str:
    """The `ray` command of this environment (beside its Python, where a virtualenv keeps it)."""
    beside = Path(sys.executable).with_name("ray")
    return str(beside) if beside.exists() else "ray"


def auth_env(cluster: LocalCluster) -> dict[str, str]:
    """The environment a process needs to join `cluster`: its token, and no stray address."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": cluster.token_path}


def _node_env(cluster_dir: Path, token_path: Path, cwd: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_path))
    # Step functions are imported on the nodes: the directory the cluster started in first.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _load(directory: Path) -> LocalCluster | None:
    try:
        data = json.loads((directory / "cluster.json").read_text())
        nodes = tuple(Node(**n) for n in data.pop("nodes"))
        return LocalCluster(nodes=nodes, **data)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def list_clusters() -> list[LocalCluster]:
    """Every cluster recorded under `clusters_root()`, running or not."""
    root = clusters_root()
    if not root.is_dir():
        return []
    found = (_load(d) for d in sorted(root.iterdir()) if d.is_dir())
    return [c for c in found if c is not None]


def find_cluster(address: str) -> LocalCluster | None:
    """The running cluster started here whose head is `address`, if any."""
    for cluster in list_clusters():
        if cluster.address == address and cluster.alive():
            return cluster
    return None


def _start_node(command: list[str], env: Mapping[str, str], log: Path) -> Node:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped alone, all of it
        )
    ip = command[command.index("--node-ip-address") + 1]
    return Node(ip, process.pid, process_start_time(process.pid), str(log))


def _wait_for(what: str, ready: Any, node: Node, timeout: float = _START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        if not pid_alive(node.pid, node.pid_start):
            tail = Path(node.log).read_text(errors="replace").strip().splitlines()[-5:]
            raise ClusterError(f"{what} exited while starting; its log {node.log} ends: {' | '.join(tail)}")
        time.sleep(0.2)
    raise ClusterError(f"{what} did not start within {timeout:g} s; see {node.log}")


def _started(node: Node) -> bool:
    """Whether the node's `ray start` says it is up: what it prints once its raylet has
    registered with the head (where `ray start` without `--block` would return)."""
    try:
        return "Ray runtime started." in Path(node.log).read_text(errors="replace")
    except OSError:
        return False


def start_cluster(name: str, spec: ClusterSpec, cwd: str | None = None) -> LocalCluster:
    """Start a head and `spec.workers` worker nodes, one at a time (on two cores raylets started
    together time out registering with the GCS); returns the cluster once every node is alive."""
    if not name or "/" in name or name.startswith("."):
        raise ClusterError(f"a cluster name is a plain word, not {name!r}")
    directory = clusters_root() / name
    existing = _load(directory)
    if existing is not None and existing.alive():
        raise ClusterError(f"{existing.describe()} is already running; stop it: drydock cluster stop {name}")
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.log"):
        old.unlink()
    token = directory / "token"
    token.write_text(secrets.token_hex(32) + "\n")
    token.chmod(0o600)
    env = _node_env(directory, token, cwd or os.getcwd())
    port = _free_port(HEAD_IP)
    address = f"{HEAD_IP}:{port}"
    common = ["--block", "--disable-usage-stats"]
    head_command = [_ray(), "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(port)]
    head_command += ["--include-dashboard", "false", "--num-cpus", str(spec.head_cpus), *common]
    nodes = [_start_node(head_command, env, directory / "head.log")]
    cluster = LocalCluster(name, address, str(directory), tuple(nodes), asdict(spec), time.time())
    _record(directory, cluster)
    try:
        _wait_for("the head node", lambda: _started(nodes[0]), nodes[0])
        for i, worker in enumerate(spec.worker_nodes()):
            ip = f"127.0.0.{3 + i}"
            command = [_ray(), "start", "--address", address, "--node-ip-address", ip]
            command += ["--num-cpus", str(worker.cpus), *common]
            if worker.gpus:
                command += ["--num-gpus", str(worker.gpus)]
            if worker.resources:
                command += ["--resources", json.dumps(dict(worker.resources))]
            if worker.labels:
                command += ["--labels", ",".join(f"{k}={v}" for k, v in worker.labels.items())]
            node = _start_node(command, env, directory / f"worker-{i + 1}.log")
            nodes.append(node)
            cluster = LocalCluster(name, address, str(directory), tuple(nodes), asdict(spec), cluster.started)
            _record(directory, cluster)
            _wait_for(f"worker {i + 1}", lambda n=node: _started(n), node)
    except BaseException:
        stop_cluster(name)
        raise
    return cluster


def _record(directory: Path, cluster: LocalCluster) -> None:
    data = asdict(cluster)
    tmp = directory / "cluster.json.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, directory / "cluster.json")


def stop_cluster(name: str, grace: float = 5.0) -> LocalCluster:
    """Stop every node of cluster `name` (SIGTERM to each node's process group, SIGKILL to what is
    left after `grace` seconds: a node drains for 30 s on SIGTERM, which a cluster for trying
    things need not wait for); no other Ray on the machine is touched. Returns the cluster."""
    directory = clusters_root() / name
    cluster = _load(directory)
    if cluster is None:
        known = ", ".join(c.name for c in list_clusters()) or "none"
        raise ClusterError(f"no cluster named {name!r} was started here (known: {known})")
    # Workers first, the head last: a head stopped first leaves raylets retrying it.
    for node in reversed(cluster.nodes):
        if pid_alive(node.pid, node.pid_start):
            _signal_group(node.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_group_alive(n.pid) for n in cluster.nodes):
        time.sleep(0.2)
    for node in cluster.nodes:
        if _group_alive(node.pid):
            _signal_group(node.pid, signal.SIGKILL)
    (directory / "token").unlink(missing_ok=True)
    return cluster


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group `pgid` (a node's session) is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return any(_pgid_of(pid) == pgid for pid in _pids())


def _pids() -> Sequence[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _pgid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie holds nothing
            return None
        return int(fields[2])
    except (OSError, IndexError, ValueError):
        return None
