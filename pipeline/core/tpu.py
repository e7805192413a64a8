"""TPU pod slice types: chips per host and hosts per slice, for v4, v5e, v5p and v6e.

A slice type is written as Cloud TPU names it: `v4-16`, `v5p-64` (the number counts
TensorCores, two per chip), `v5litepod-16` or `v5e-16`, `v6e-64` (the number counts chips).
Ray advertises a slice's first host with the resource `TPU-<type>-head`, every host with `TPU`
(its chips), and the label `ray.io/tpu-slice-name`; the Ray backend gang-schedules with them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["TPU_GENERATIONS", "TpuSlice", "tpu_slice"]


@dataclass(frozen=True)
class _Generation:
    cores_per_chip: int
    chips_per_host: int
    """Chips per host in multi-host slices."""
    max_single_host_chips: int
    """Largest slice that fits on one host (v5e/v6e have 8-chip hosts for small slices)."""
    ray_name: str
    """How Ray spells the generation in `TPU-<type>-head`."""


TPU_GENERATIONS: dict[str, _Generation] = {
    "v4": _Generation(cores_per_chip=2, chips_per_host=4, max_single_host_chips=4, ray_name="v4"),
    "v5p": _Generation(cores_per_chip=2, chips_per_host=4, max_single_host_chips=4, ray_name="v5p"),
    "v5litepod": _Generation(
        cores_per_chip=1, chips_per_host=4, max_single_host_chips=8, ray_name="v5litepod"
    ),
    "v6e": _Generation(cores_per_chip=1, chips_per_host=4, max_single_host_chips=8, ray_name="v6e"),
}
_ALIASES = {"v5e": "v5litepod"}
_PATTERN = re.compile(r"^(v4|v5p|v5e|v5litepod|v6e)-(\d+)$")


@dataclass(frozen=True)
class TpuSlice:
    """One TPU pod slice type."""

    type: str
    """Canonical type, as Ray names it (e.g. "v5litepod-16")."""
    generation: str
    chips: int
    chips_per_host: int
    hosts: int

    @property
    def head_resource(self) -> str:
        """The Ray resource held only by the slice's first host."""
        return f"TPU-{self.type}-head"


def tpu_slice(name: str) -> TpuSlice:
    """Parse a slice type such as "v5p-64"; raises ValueError with the valid forms."""
    match = _PATTERN.match(name.strip().lower())
    if not match:
        raise ValueError(
            f"unknown TPU type {name!r}; expected <generation>-<size> with generation one of "
            "v4, v5p, v5e (v5litepod), v6e, e.g. 'v4-16', 'v5p-64', 'v6e-8'"
        )
    generation = _ALIASES.get(match.group(1), match.group(1))
    size = int(match.group(2))
    spec = TPU_GENERATIONS[generation]
    if size % spec.cores_per_chip:
        raise ValueError(
            f"TPU type {name!r}: size must be a multiple of {spec.cores_per_chip} for {generation}"
        )
    chips = size // spec.cores_per_chip
    if chips <= spec.max_single_host_chips:
        per_host, hosts = chips, 1
    else:
        if chips % spec.chips_per_host:
            raise ValueError(
                f"TPU type {name!r}: {chips} chips do not split into hosts of {spec.chips_per_host}"
            )
        per_host, hosts = spec.chips_per_host, chips // spec.chips_per_host
    return TpuSlice(f"{spec.ray_name}-{size}", generation, chips, per_host, hosts)
