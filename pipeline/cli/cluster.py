"""`drydock cluster`: a Ray cluster on this machine, to try gangs of hosts before a real one.

    drydock cluster start [--workers N] [--cpus C] [--gpus G] [--resources JSON] [--name NAME]
    drydock cluster stop [NAME]
    drydock cluster list

What a cluster is and how it is stopped: `pipeline.run.backends.local_cluster`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from pipeline.cli.common import Parser, guarded
from pipeline.errors import StepDeclarationError

__all__ = ["cluster_command"]

_USAGE = "drydock cluster start [--workers N] [--cpus C] [--gpus G] [--name NAME] | stop [NAME] | list"


def cluster_command(argv: Sequence[str]) -> int:
    """`drydock cluster start|stop|list`."""
    return guarded(_cluster, argv)


def _cluster(argv: Sequence[str]) -> int:
    from pipeline.run.backends import local_cluster as lc

    action, *rest = list(argv) or ["list"]
    if action == "start":
        parser = Parser(prog="drydock cluster start", add_help=False)
        parser.add_argument("--name", default="default")
        parser.add_argument("--workers", type=int, default=2)
        parser.add_argument("--cpus", type=int, default=1)
        parser.add_argument("--head-cpus", "--head_cpus", dest="head_cpus", type=int, default=1)
        parser.add_argument("--gpus", type=int, default=0)
        parser.add_argument("--resources", default="{}")
        args = parser.parse_args(rest)
        try:
            resources = json.loads(args.resources)
            if not isinstance(resources, dict):
                raise ValueError("not an object")
        except ValueError as e:
            raise StepDeclarationError(None, f"not a JSON object ({e})", field="--resources") from e
        spec = lc.ClusterSpec(args.workers, args.cpus, args.head_cpus, args.gpus, resources)
        cluster = lc.start_cluster(args.name, spec, cwd=os.getcwd())
        stop = "drydock cluster stop" + ("" if args.name == "default" else f" {args.name}")
        print(cluster.describe())
        print(f"  run on it:      drydock run FILE --ray_address {cluster.address}")
        env = " ".join(f"{k}={v}" for k, v in lc.auth_env(cluster).items())
        print(f"  other drivers:  {env} RAY_ADDRESS={cluster.address} python ...")
        print(f"  step modules:   importable on every node from {os.getcwd()} (PYTHONPATH)")
        print(f"  logs:           {cluster.directory}")
        print(f"  stop it:        {stop}")
        return 0
    if action == "stop":
        parser = Parser(prog="drydock cluster stop", add_help=False)
        parser.add_argument("name", nargs="?", default="default")
        args = parser.parse_args(rest)
        cluster = lc.stop_cluster(args.name)
        print(f"stopped cluster {cluster.name!r} ({len(cluster.nodes)} nodes, head {cluster.address})")
        return 0
    if action == "list":
        Parser(prog="drydock cluster list", add_help=False).parse_args(rest)
        clusters = lc.list_clusters()
        for cluster in clusters:
            print(cluster.describe())
        if not clusters:
            print(f"no cluster started here (none under {lc.clusters_root()})")
        return 0
    raise StepDeclarationError(None, f"unknown action {action!r}; usage: {_USAGE}", field="argv")
