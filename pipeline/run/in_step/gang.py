"""Where a running step's process stands in its gang.

A step whose `Resources` ask for more than one host (`hosts=N` for GPU or CPU hosts, a TPU pod
slice of several hosts, several slices) is a gang: the backend reserves every host at once, all or
nothing, and runs the same step function in one process per host (SPMD). Each process learns its
place from `current_gang()`, the same way on every backend:

    gang = current_gang()
    gang.index, gang.size, gang.leader      # 3, 16, False
    gang.coordinator                        # "10.0.0.7:41234": process 0's host and a free port
    gang.platform                           # "gpu", "cpu" or "tpu"

A step on one host (every step on the local backend) is a gang of one: index 0 of 1, the leader.
The step initializes `jax.distributed` from these coordinates (a TPU keeps JAX's own discovery:
`coordinator` is None there). Rules every gang step keeps (docs/cluster.md): only the leader
writes step-level files, every process writes its own checkpoint shards, and every decision that
changes control flow is taken once and shared before anyone acts on it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALONE", "PLATFORMS", "Gang"]

PLATFORMS = ("cpu", "gpu", "tpu")


@dataclass(frozen=True)
class Gang:
    """One process's place in its step's gang."""

    index: int = 0
    """This process's index, 0 to size - 1 (JAX's process id)."""
    size: int = 1
    """Processes in the gang: one per host."""
    coordinator: str | None = None
    """`host:port` where process 0 serves JAX's distributed coordinator; None for a gang of one
    and for TPU slices, whose processes find each other through the TPU runtime."""
    platform: str = "cpu"
    """The hosts' accelerator: "cpu", "gpu" or "tpu"."""
    local_device_ids: tuple[int, ...] | None = None
    """The devices of this host this process drives; None: all it sees (Ray narrows the GPUs a
    task sees to the ones it reserved)."""

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.size:
            raise ValueError(f"gang index {self.index} is not in 0..{self.size - 1}")
        if self.platform not in PLATFORMS:
            raise ValueError(f"gang platform {self.platform!r} is not one of {', '.join(PLATFORMS)}")

    @property
    def leader(self) -> bool:
        """Whether this process is the gang's process 0: the one that writes step-level files."""
        return self.index == 0

    @property
    def distributed(self) -> bool:
        """Whether the processes must form one JAX process group (more than one of them)."""
        return self.size > 1


ALONE = Gang()
"""A gang of one: a step on one host."""
