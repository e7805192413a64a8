"""The processes of a training gang decide together.

A training that spans hosts runs the same program in one process per host (SPMD); every step is
a set of collectives that all of them must enter. A process that leaves the training loop on its
own (to rewind after a loss spike, because its write fence saw the lease expire, because its
checkpoint writer found someone else's checkpoint) leaves the others waiting in the next
collective forever. So no process acts on such a decision alone: each decision is taken once,
shared through a collective that every process enters at the same point of the program, and
only then acted upon, by all of them the same way.

    join_gang(gang)          jax.distributed from the gang's coordinates, bound to the node's address
    exchange(row)            every process's row of small integers, to every process
    agree_any(flag)          True on every process if it is True on any
    barrier(name)            wait until every process got here

In a gang of one these cost nothing and return at once.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pipeline import Gang

__all__ = ["agree_any", "barrier", "exchange", "join_gang"]


def join_gang(gang: Gang) -> None:
    """Make this process one of the gang's JAX process group, before anything touches a JAX
    backend. A gang of one does nothing; a TPU gang lets JAX find its peers through the TPU
    runtime; GPU and CPU gangs use the coordinator the backend gave (host 0 and a free port).
    CPU processes exchange tensors through gloo. Never from a hub or a metadata server."""
    if not gang.distributed:
        return
    import jax
    from levanter.distributed import DistributedConfig

    if jax.distributed.is_initialized():
        return
    if gang.platform == "tpu":
        DistributedConfig().initialize()
        return
    if gang.platform == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # Levanter's DistributedConfig.initialize, less its Slurm look-ups (the gang names everything)
    # and with the coordinator bound to its node's address: JAX binds every interface otherwise.
    jax.distributed.initialize(
        gang.coordinator,
        gang.size,
        gang.index,
        _local_devices(gang),
        initialization_timeout=30 * 60,
        coordinator_bind_address=gang.coordinator,
    )
    # In the attempt's log of each host: which process this is, and with whom.
    print(
        f"train: process {gang.index} of {gang.size} joined the gang (coordinator {gang.coordinator}, "
        f"{jax.device_count()} devices in all)",
        flush=True,
    )


def _local_devices(gang: Gang) -> list[int] | None:
    """The devices this process drives, numbered as it sees them: every GPU Ray made visible to
    it (given explicitly, so that Levanter's Slurm discovery, when a Ray cluster runs inside a
    Slurm job, never picks GPUs by the job's numbering instead)."""
    if gang.local_device_ids is not None:
        return list(gang.local_device_ids)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if gang.platform == "gpu" and visible:
        return list(range(len([v for v in visible.split(",") if v.strip()])))
    return None


def _size() -> int:
    """Processes in this training's JAX process group: 1 unless `join_gang` made one (asked
    without touching a JAX backend, which a single-process run initializes later, its own way)."""
    import jax

    return jax.process_count() if jax.distributed.is_initialized() else 1


def exchange(row: Sequence[int]) -> np.ndarray:
    """Every process's `row` (the same length everywhere), stacked by process index: a collective
    that every process of the gang must enter. One process: its own row."""
    local = np.asarray(row, dtype=np.int64).reshape(1, -1)
    if _size() == 1:
        return local
    from jax.experimental import multihost_utils

    # int32 on the wire: JAX without x64 would silently narrow int64 anyway.
    return np.asarray(multihost_utils.process_allgather(local.astype(np.int32)[0])).reshape(_size(), -1)


def agree_any(flag: bool) -> bool:
    """True on every process if `flag` is True on any (a collective, like `exchange`)."""
    return bool(exchange([int(flag)])[:, 0].any())


def barrier(name: str) -> None:
    """Wait until every process of the gang has reached the barrier called `name`."""
    if _size() == 1:
        return
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
