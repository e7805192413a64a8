"""Step functions for the Ray backend tests (module-level, so Ray workers import them)."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field

from pipeline import step_function


@dataclass(frozen=True)
class MeetConfig:
    output: str
    rendezvous: str
    me: str
    other: str
    timeout: float = 60.0


def meet(config: MeetConfig) -> None:
    """Succeeds only if `other` arrives while `me` is still running: proof of concurrency."""
    os.makedirs(config.rendezvous, exist_ok=True)
    open(os.path.join(config.rendezvous, config.me), "w").close()
    deadline = time.time() + config.timeout
    while not os.path.exists(os.path.join(config.rendezvous, config.other)):
        if time.time() > deadline:
            raise TimeoutError(f"{config.other} never ran alongside {config.me}")
        time.sleep(0.02)
    os.makedirs(config.output, exist_ok=True)
    open(os.path.join(config.output, "met"), "w").close()


@dataclass(frozen=True)
class ProbeConfig:
    output: str
    message: str = "hello from a ray step"
    sleep: float = 0.0
    """Seconds to sleep; with `pid_file`, only in the first attempt."""
    pid_file: str | None = None
    fail_first: str | None = None
    """A marker file: if absent, create it and raise (so the first attempt fails)."""
    tags: list[str] = field(default_factory=list)
    fail_index: int | None = None
    """In a gang: the process of this index raises at once (the others sleep `sleep`)."""


def probe(config: ProbeConfig) -> None:
    """Record where and how the step ran: node, resources, environment, host ids, gang place."""
    import ray

    from pipeline import current_gang

    gang = current_gang()
    print(config.message, flush=True)
    if config.fail_index is not None and gang.index == config.fail_index:
        # Once the other process is running (it writes its pid first): the gang then has a
        # process to stop.
        deadline = time.time() + 60
        while config.pid_file and not os.path.exists(config.pid_file) and time.time() < deadline:
            time.sleep(0.05)
        raise RuntimeError(f"process {gang.index} of the gang fails on purpose")
    if config.fail_first and not os.path.exists(config.fail_first):
        open(config.fail_first, "w").close()
        raise RuntimeError("first attempt fails on purpose")
    first_attempt = True
    if config.pid_file:
        first_attempt = not os.path.exists(config.pid_file)
        with open(config.pid_file, "a") as f:
            f.write(f"{os.getpid()} {os.getppid()}\n")  # the worker and its raylet
    if config.sleep and first_attempt:
        time.sleep(config.sleep)
    ctx = ray.get_runtime_context()
    info = {
        "node_id": ctx.get_node_id(),
        "resources": ctx.get_assigned_resources(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("DRYDOCK_", "MEGASCALE_", "PROBE_"))},
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "gang": {
            "index": gang.index,
            "size": gang.size,
            "coordinator": gang.coordinator,
            "leader": gang.leader,
        },
    }
    os.makedirs(config.output, exist_ok=True)
    host_id = os.environ.get("DRYDOCK_TPU_HOST_ID", str(gang.index))
    slice_id = os.environ.get("DRYDOCK_TPU_SLICE_ID", "0")
    with open(os.path.join(config.output, f"probe-{slice_id}-{host_id}.json"), "w") as f:
        json.dump(info, f)


def exit_now(config: ProbeConfig) -> None:
    """A step that prints, then calls sys.exit(3)."""
    import sys

    print("about to exit", flush=True)
    sys.exit(3)


def fresh_probe(config: ProbeConfig) -> None:
    """`probe`, in a worker process of its own (see the Ray backend's `fresh_process`)."""
    probe(config)


step_function(fresh_probe, fresh_process=True)


def in_ray_worker(x: int) -> tuple[int, bool]:
    """Runs where `parallel_map` sends it: says whether that is a Ray worker."""
    import ray

    return x * x, ray.is_initialized()


@dataclass(frozen=True)
class FanConfig:
    output: str
    n: int = 3


def fan_out(config: FanConfig) -> None:
    """A step that fans out with `pipeline.run.in_step.parallel.parallel_map` and records where it ran."""
    from pipeline.run.in_step.parallel import parallel_map

    results = sorted(parallel_map(in_ray_worker, [(i,) for i in range(config.n)], max_workers=2))
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "fan.json"), "w") as f:
        json.dump(results, f)


@dataclass(frozen=True)
class TalkConfig:
    output: str
    seconds: float = 120.0


def talk_then_sleep(config: TalkConfig) -> None:
    """Says something, then sleeps: a long step for a runner to be interrupted in."""
    os.makedirs(config.output, exist_ok=True)
    print("step says hello", flush=True)
    time.sleep(config.seconds)


@dataclass(frozen=True)
class CrashConfig:
    output: str
    tags: list[str] = field(default_factory=list)


def segfault(config: CrashConfig) -> None:
    """A step whose process dies of a segmentation fault every time, at the same point."""
    import ctypes

    print("reading address 0", flush=True)
    ctypes.string_at(0)


step_function(segfault, fresh_process=True)


@dataclass(frozen=True)
class ProduceConfig:
    output: str
    count: int = 3
    every: float = 0.5
    die_once_in: str | None = None
    """A directory: the first attempt dies (its worker ends) after the first item, as a lost host."""


def _counted(config: ProduceConfig) -> dict[str, int]:
    """A training's preview (what `.step.json` records), which takes a while: `train_moe`'s counts
    its model's parameters. Meanwhile the steps that follow it reached Ray first."""
    time.sleep(1.5)
    return {"items": config.count}


@step_function(preview=_counted, fresh_process=True)
def produce(config: ProduceConfig) -> None:
    """A training in miniature: an item (`item-<i>`) every `every` seconds, then `done`."""
    os.makedirs(config.output, exist_ok=True)
    for i in range(config.count):
        open(os.path.join(config.output, f"item-{i}"), "w").close()
        if i == 0 and config.die_once_in is not None:
            marker = os.path.join(config.die_once_in, "died")
            if not os.path.exists(marker):
                os.makedirs(config.die_once_in, exist_ok=True)
                open(marker, "w").close()
                os._exit(1)
        time.sleep(config.every)
    open(os.path.join(config.output, "done"), "w").close()


@dataclass(frozen=True)
class FollowConfig:
    output: str
    source: str
    """The followed step's output (`output_of(step, blocking=False)`)."""
    timeout: float = 60.0


def follow_items(config: FollowConfig) -> None:
    """An evaluation that follows `produce`: sees its items as they come, ends when it is done."""
    deadline = time.time() + config.timeout
    seen: list[str] = []
    while True:
        finished = os.path.exists(os.path.join(config.source, "done"))
        if os.path.isdir(config.source):
            seen += sorted(n for n in os.listdir(config.source) if n.startswith("item-") and n not in seen)
        if finished:
            break
        if time.time() > deadline:
            raise TimeoutError(f"what it follows did not finish in {config.timeout} s; saw {seen}")
        time.sleep(0.05)
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "seen.json"), "w") as f:
        json.dump({"seen": seen, "pid": os.getpid()}, f)


@dataclass(frozen=True)
class StoppableConfig:
    output: str
    scratch: str
    """Outside the step's directory: the first attempt leaves its pid there, the second sees it."""


def stop_me_once(config: StoppableConfig) -> None:
    """The first attempt writes its pid to `scratch/pid` and waits (to be sent SIGTERM); the
    next one finishes at once."""
    os.makedirs(config.output, exist_ok=True)
    pid_file = os.path.join(config.scratch, "pid")
    if not os.path.exists(pid_file):
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        time.sleep(120)
        return
    with open(os.path.join(config.output, "done.txt"), "w") as f:
        f.write("done")
