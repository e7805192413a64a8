"""How a training lays its devices out: Levanter's mesh, in Drydock's terms.

    MeshSpec(data=-1, tensor=1, expert=1, replica=1)

A mesh gives each device a coordinate on a few named axes; the product of the sizes is the
number of devices of the training (every host's, for a gang). What each axis shards:

    data     FSDP: the batch, and the parameters and optimizer state along the embedding dimension
             (-1: whatever the other axes leave; Levanter's physical axis `data`)
    replica  plain data parallelism within a slice: the batch, with parameters replicated
    tensor   attention heads and MLP width (Levanter's physical axis `model`)
    expert   the experts' weights (each device holds num_experts / expert of them) and the batch

Across TPU slices (multislice) the batch is split once more (`replica_dcn`, over the data-centre
network); that axis takes the number of slices by itself.

A mesh is not part of a training's identity: it changes where each number is computed, not which
numbers are computed. The sums of a data-parallel layout are taken in another order, which
changes the losses in their last digits (the tests measure under 1e-6 relative for these tiny
models), far inside what a different batch, data or model would change. So the same recipe can
move between a laptop, 16 GPU hosts and a TPU pod and keep every identity, and one run's
checkpoints resume under another layout (Levanter reshards them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["MeshSpec"]


@dataclass(frozen=True)
class MeshSpec:
    """Sizes of a training's mesh axes (see the module docstring)."""

    data: int = -1
    """FSDP: batch and parameters sharded; -1 takes the devices the other axes leave."""
    replica: int = 1
    """Data parallelism with replicated parameters (within a slice)."""
    tensor: int = 1
    """Tensor parallelism: heads and MLP width sharded."""
    expert: int = 1
    """Expert parallelism: the experts' weights sharded (the batch too)."""

    def sizes(self, devices: int | None) -> dict[str, int]:
        """Every axis's size on `devices` devices (None: unknown; `data` stays -1 then)."""
        known = self.replica * self.tensor * self.expert * (self.data if self.data > 0 else 1)
        data = self.data
        if data == -1 and devices is not None:
            data = devices // known if known and devices % known == 0 else -1
        return {"data": data, "replica": self.replica, "tensor": self.tensor, "expert": self.expert}

    def batch_ways(self, devices: int | None) -> int | None:
        """Into how many parts the batch is split (data x replica x expert); None if unknown."""
        sizes = self.sizes(devices)
        if sizes["data"] < 0:
            return None
        return sizes["data"] * sizes["replica"] * sizes["expert"]

    def problems(
        self,
        devices: int | None,
        *,
        batch_size: int,
        num_experts: int,
        num_heads: int,
        num_kv_heads: int,
        intermediate: int,
        num_global_kv_heads: int | None = None,
    ) -> list[tuple[str, str]]:
        """What cannot work, as (field, message) pairs: axes that are not whole numbers >= 1
        (data may be -1), a product that is not the device count, a batch, experts or heads that
        do not divide."""
        out: list[tuple[str, str]] = []
        for name in ("data", "replica", "tensor", "expert"):
            value = getattr(self, name)
            allowed = value == -1 and name == "data"
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and not allowed):
                either = " or -1" if name == "data" else ""
                out.append((f"mesh.{name}", f"must be a whole number >= 1{either}, got {value!r}"))
        if out:
            return out
        fixed = self.devices_fixed
        if devices is not None and self.data == -1 and devices % fixed:
            out.append(("mesh", f"replica x tensor x expert = {fixed} does not divide the {devices} devices"))
        elif devices is not None and self.data > 0 and fixed != devices:
            out.append(("mesh", f"{self._product()} = {fixed} devices, but the training has {devices}"))
        ways = self.batch_ways(devices)
        if ways is not None and batch_size % ways:
            out.append(
                ("batch_size", f"{batch_size} does not split into the mesh's {ways} data-parallel parts")
            )
        if num_experts % self.expert:
            out.append(
                ("mesh.expert", f"{num_experts} experts do not split over an expert axis of {self.expert}")
            )
        counts = [("heads", num_heads), ("KV heads", num_kv_heads), ("expert width", intermediate)]
        if num_global_kv_heads is not None:
            counts.append(("global layers' KV heads", num_global_kv_heads))
        for what, count in counts:
            if count % self.tensor:
                out.append(
                    ("mesh.tensor", f"{count} {what} do not split over a tensor axis of {self.tensor}")
                )
        return out

    def _product(self) -> str:
        return " x ".join(f"{name} {getattr(self, name)}" for name in ("data", "replica", "tensor", "expert"))

    def to_levanter(self) -> Any:
        """Levanter's `MeshConfig` for this layout."""
        from levanter.utils.mesh import MeshConfig

        axes = {"data": self.data, "replica": self.replica, "model": self.tensor}
        batch = ["replica_dcn", "replica", "data"]
        shared: dict[str, Any] = {}
        params: dict[str, Any] = {"embed": "data"}
        if self.tensor > 1:
            # Levanter maps `heads` and `mlp` to `model`, but its attention projections are shaped
            # by `kv_head` (x `q_heads_per_group`): without this, only the output projection of
            # attention would be split over the tensor axis (seen in layout.json).
            shared["kv_head"] = "model"
        if self.expert > 1:
            axes["expert"] = self.expert
            batch.append("expert")
            # The experts' weights live sharded over the expert axis; for compute, Levanter's
            # MoE layer gathers them (its routing works on the tokens each device holds).
            params["experts"] = "expert"
        return MeshConfig(
            axes=axes, compute_mapping={"batch": batch}, shared_mapping=shared, param_mapping=params
        )

    @property
    def devices_fixed(self) -> int:
        """The product of the axes given as sizes (all of them unless data is -1)."""
        return math.prod(v for v in (self.data, self.replica, self.tensor, self.expert) if v > 0)
