"""How a step's `Resources` map to Ray, and whether a cluster can ever satisfy them. Pure: these
functions read Ray's node descriptions (plain dicts) and never import Ray.

    cpus, gpus, memory, custom  -> num_cpus, num_gpus, memory, resources of the task
    accelerator="H100"          -> accelerator_type (Ray's `accelerator_type:H100` node resource)
    env, pip                    -> runtime_env {"env_vars": ..., "pip": ...}
    tpu="v4-16", slices=N       -> whole slices, found by the `ray.io/tpu-slice-name` node label
    hosts=N                     -> N nodes, each able to hold one host's share (a gang)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.plan import Plan, State
from pipeline.core.tpu import tpu_slice
from pipeline.step import Resources

__all__ = [
    "ACCELERATOR_PREFIX",
    "SLICE_LABEL",
    "follower_shortfalls",
    "host_bundle",
    "parse_memory",
    "runtime_env",
    "task_options",
    "unsatisfiable",
]

SLICE_LABEL = "ray.io/tpu-slice-name"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory(text: str) -> int:
    """Bytes in a memory size such as "16GiB", "512MB" or "1e9"."""
    value = text.strip().lower().replace(" ", "")
    number = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"cannot read memory size {text!r}; use e.g. '16GiB' or '512MB'")
    return int(float(number) * _UNITS[unit])


def runtime_env(resources: Resources, env: dict[str, str] | None = None) -> dict[str, Any]:
    runtime_env: dict[str, Any] = {}
    env_vars = dict(resources.env if env is None else env)
    if env_vars:
        runtime_env["env_vars"] = env_vars
    if resources.pip:
        runtime_env["pip"] = list(resources.pip)
    return runtime_env


ACCELERATOR_PREFIX = "accelerator_type:"
"""Ray's node resource naming a node's GPU type (`accelerator_type:H100`)."""


def task_options(resources: Resources, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Ray task options for one host's share of `resources` (the whole step on one host)."""
    options: dict[str, Any] = {"num_cpus": resources.cpus, "num_gpus": resources.gpus}
    if resources.memory:
        options["memory"] = parse_memory(resources.memory)
    if resources.custom:
        options["resources"] = dict(resources.custom)
    if resources.accelerator:
        options["accelerator_type"] = resources.accelerator
    runtime = runtime_env(resources, env)
    if runtime:
        options["runtime_env"] = runtime
    return options


def host_bundle(resources: Resources) -> dict[str, float]:
    """One host's placement-group bundle of a gang: its CPUs, GPUs, memory and custom resources
    (a tiny share of the accelerator-type resource pins it to hosts of that GPU type)."""
    bundle = _requested(resources)
    if resources.accelerator:
        bundle[f"{ACCELERATOR_PREFIX}{resources.accelerator}"] = 0.001
    return bundle


def _requested(resources: Resources) -> dict[str, float]:
    wanted: dict[str, float] = {"CPU": float(resources.cpus)}
    if resources.gpus:
        wanted["GPU"] = float(resources.gpus)
    if resources.memory:
        wanted["memory"] = float(parse_memory(resources.memory))
    wanted.update({k: float(v) for k, v in resources.custom.items()})
    if resources.accelerator:
        wanted[f"{ACCELERATOR_PREFIX}{resources.accelerator}"] = 0.001
    return wanted


def _describe(resources: dict[str, float]) -> str:
    shown = {
        k: v for k, v in sorted(resources.items()) if not k.startswith("node:") and "object_store" not in k
    }
    return ", ".join(f"{k} {v:g}" for k, v in shown.items()) or "nothing"


def unsatisfiable(resources: Resources, nodes: list[dict[str, Any]]) -> str | None:
    """Why no node (or slice) of the cluster can ever run a step with `resources`, or None."""
    if resources.tpu:
        try:
            spec = tpu_slice(resources.tpu)
        except ValueError as e:
            return str(e)
        per_slice: dict[str, int] = {}
        heads = set()
        for node in nodes:
            name = (node.get("Labels") or {}).get(SLICE_LABEL)
            res = node.get("Resources", {})
            if name and res.get("TPU", 0) >= spec.chips_per_host and res.get("CPU", 0) >= resources.cpus:
                per_slice[name] = per_slice.get(name, 0) + 1
            if name and res.get(spec.head_resource, 0) >= 1:
                heads.add(name)
        complete = [name for name in heads if per_slice.get(name, 0) >= spec.hosts]
        if len(complete) < resources.slices:
            return (
                f"asks for {resources.slices} x {spec.type} ({spec.hosts} hosts of {spec.chips_per_host} "
                f"chips each, head resource {spec.head_resource}); the cluster has {len(complete)} such "
                "slice(s)"
            )
        return None
    wanted = _requested(resources)
    fitting = sum(
        1 for node in nodes if all(node.get("Resources", {}).get(k, 0) >= v for k, v in wanted.items())
    )
    if resources.hosts > 1:
        if fitting >= resources.hosts:
            return None
        return (
            f"asks for {resources.hosts} hosts of {_describe(wanted)} each (a gang: one process per "
            f"node, all at once); the cluster has {fitting} such node(s)"
        )
    if fitting:
        return None
    largest = max((n.get("Resources", {}) for n in nodes), key=lambda r: r.get("CPU", 0), default={})
    totals: dict[str, float] = {}
    for node in nodes:
        for k, v in node.get("Resources", {}).items():
            totals[k] = totals.get(k, 0) + v
    return (
        f"asks for {_describe(wanted)} on one node; no node has that "
        f"(largest node: {_describe(largest)}; cluster total: {_describe(totals)})"
    )


def follower_shortfalls(plan: Plan, capacity: Mapping[str, float]) -> list[str]:
    """A warning for each step to run whose followers (steps that read it with `blocking=False`:
    evaluations of a running training's checkpoints) cannot run beside it on a cluster of
    `capacity` (resource -> total). They never keep it from starting (the executor starts them
    once it has), but they then wait for its resources and evaluate only after it ends. Only the
    resources named in `capacity` are compared."""
    to_run = set(plan.in_state(State.RUN))
    followers: dict[str, list[str]] = {}
    for label in plan.steps:
        if label in to_run:
            for followed in plan.dag.nodes[label].soft_deps:
                if followed in to_run:
                    followers.setdefault(followed, []).append(label)
    warnings = []
    for followed, labels in followers.items():
        wanted: dict[str, float] = {}
        for label in (followed, *labels):
            resources = plan.dag.nodes[label].step.resources
            if resources.tpu or resources.hosts > 1:
                continue  # a slice or gang of its own: not competing for the same pool
            for key, value in _requested(resources).items():
                wanted[key] = wanted.get(key, 0.0) + value
        short = {k: v for k, v in wanted.items() if k in capacity and v > capacity[k]}
        if not short:
            continue
        names = ", ".join(plan.dag.nodes[label].name for label in labels)
        need = " and ".join(f"{v:g} {k}" for k, v in sorted(short.items()))
        have = " and ".join(f"{capacity.get(k, 0.0):g}" for k in sorted(short))
        warnings.append(
            f"step '{plan.dag.nodes[followed].name}' and the {len(labels)} step(s) that follow it "
            f"({names}) need {need} at once; the cluster has {have}: the followers start once it has "
            "started and wait for free resources, so some evaluate its checkpoints only after it ends"
        )
    return warnings
