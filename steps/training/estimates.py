"""What a training will need, before it runs: memory per device and time to train.

    Hardware(accelerator="H100", devices=128, mfu=0.4)       from the step's Resources
    memory_per_device(model, vocab, batch, seq, mesh, devices, precision) -> bytes, by part
    training_seconds(active_params, tokens, hardware) -> seconds

Both are estimates, written out so a reader can check them by hand (`tests/steps/training/test_estimates.py`
does): `drydock plan` shows them, `plan --json` carries them, and `train_moe_step` refuses a
declaration whose estimate does not fit the accelerator's memory.

**Memory per device** = state + activations.
  * State: 16 bytes per parameter the device holds (float32 weights, float32 gradients, AdamW's two
    float32 moments). A device holds the dense parameters / (data x tensor) and the experts'
    parameters / (data x tensor x expert): FSDP shards along the embedding dimension over `data`,
    heads and MLP width over `tensor`, the experts over `expert`; `replica` axes replicate.
  * Activations, per device, with T = batch x seq / (data x replica x expert) tokens and c bytes a
    value (2 for bf16 compute, 4 for float32), and every layer rematerialized (Levanter's Qwen3-MoE
    checkpoints each layer): the residual stream saved at each layer's input (layers x T x hidden
    x c); one layer's working set while it is recomputed and differentiated (2 x T x (q + k + v
    + hidden)/tensor x c for the attention projections, their gradients beside them; T/seq x
    heads/tensor x seq^2 x c for one layer's attention scores; 2 x T x top_k x 3 x expert
    width/tensor x c for the experts' gate, up and activation); and the float32 logits of the loss
    (T x vocab/tensor x 4).
**Time** = 6 x active parameters x tokens / (devices x peak FLOP/s x MFU), the usual
6ND count of a step's forward and backward passes, at an assumed model FLOP utilization the
recipe may set (0.4 by default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.steplib import format_size

if TYPE_CHECKING:
    from steps.models import MoeModelConfig
    from steps.training.mesh import MeshSpec

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "Hardware",
    "gathered_experts",
    "hardware_of",
    "layout_problems",
    "layout_summary",
    "memory_per_device",
    "training_seconds",
]

GIB = 2**30


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's memory and dense bf16 peak."""

    name: str
    memory: float
    """Bytes of device memory (HBM) one device has."""
    peak_flops: float
    """Dense bf16 FLOP/s of one device (what MFU is measured against)."""
    hbm_bandwidth: float
    """HBM bytes per second."""
    ici_bandwidth: float
    """Bytes per second one way over all the device's chip-to-chip links (ICI; NVLink)."""
    dcn_bandwidth: float
    """Bytes per second per device over the data-centre network (between slices or racks)."""


# Published figures (Cloud TPU's system architecture pages; NVIDIA's datasheets): memory per
# device, dense (not sparse) bf16 peak, HBM bandwidth, inter-chip bandwidth one way (v5p: 4,800
# Gbps per chip; H100 NVLink: 900 GB/s both ways), and a data-centre network share per device. A
# TPU device is a chip (v4 and v5p chips are one JAX device each: their two cores work as one).
ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("v4", 32 * GIB, 275e12, 1.2e12, 300e9, 6.25e9),
        Accelerator("v5e", 16 * GIB, 197e12, 819e9, 200e9, 6.25e9),
        Accelerator("v5p", 95 * GIB, 459e12, 2765e9, 600e9, 6.25e9),
        Accelerator("v6e", 32 * GIB, 918e12, 1640e9, 448e9, 12.5e9),
        Accelerator("A100", 80e9, 312e12, 2.0e12, 300e9, 25e9),
        Accelerator("H100", 80e9, 989e12, 3.35e12, 450e9, 50e9),
        Accelerator("H200", 141e9, 989e12, 4.8e12, 450e9, 50e9),
        Accelerator("B200", 180e9, 2250e12, 8e12, 900e9, 50e9),
        Accelerator("GB200", 186e9, 2500e12, 8e12, 900e9, 50e9),
    )
}
_TPU_NAMES = {"v4": "v4", "v5p": "v5p", "v5litepod": "v5e", "v6e": "v6e"}


@dataclass(frozen=True)
class Hardware:
    """Where a training runs: its accelerator (None on CPUs), its device count, an assumed MFU."""

    accelerator: str | None = None
    devices: int | None = None
    """Devices of the whole training (every host's); None when not known (CPU hosts)."""
    mfu: float = 0.4
    """Model FLOP utilization assumed for the time estimate."""
    slices: int = 1
    """TPU slices (multislice): `devices` counts the chips of all of them."""

    @property
    def spec(self) -> Accelerator | None:
        return ACCELERATORS.get(self.accelerator) if self.accelerator else None


def hardware_of(resources: Any, mfu: float = 0.4) -> Hardware:
    """The hardware a step's `Resources` ask for: a TPU slice type's chips (times slices), or
    GPUs per host times hosts of the named type; on CPU hosts the devices are not known."""
    from pipeline import Resources, tpu_slice

    if not isinstance(resources, Resources):
        return Hardware(mfu=mfu)
    if resources.tpu:
        spec = tpu_slice(resources.tpu)
        generation = _TPU_NAMES.get(spec.generation, spec.generation)
        return Hardware(generation, spec.chips * resources.slices, mfu, slices=resources.slices)
    if resources.gpus:
        devices = int(resources.gpus) * resources.hosts if float(resources.gpus).is_integer() else None
        return Hardware(resources.accelerator, devices, mfu)
    # CPU hosts: one JAX device each by default, more with XLA's host-platform flag; not known here.
    return Hardware(None, None, mfu)


def _split_params(model: MoeModelConfig, vocab: int) -> tuple[int, int]:
    """(dense parameters, routed experts' parameters) of `model`."""
    from steps.models import parameter_counts

    total, _active = parameter_counts(model, vocab)
    experts = model.num_layers * model.num_experts * 3 * model.hidden_dim * model.expert_intermediate_dim
    return total - experts, experts


def memory_per_device(
    model: MoeModelConfig,
    vocab: int,
    batch_size: int,
    seq_len: int,
    mesh: MeshSpec,
    devices: int,
    precision: str = "f32",
) -> dict[str, float]:
    """The estimate in the module docstring, by part (bytes): `state`, `activations`, `total`."""
    sizes = mesh.sizes(devices)
    data, tensor, expert = max(sizes["data"], 1), sizes["tensor"], sizes["expert"]
    dense, experts = _split_params(model, vocab)
    held = dense / (data * tensor) + experts / (data * tensor * expert)
    state = 16 * held
    c = 2 if precision == "bf16" else 4
    ways = mesh.batch_ways(devices) or 1
    tokens = batch_size * seq_len / ways
    head_dim = model.head_dim or model.hidden_dim // model.num_heads
    q, kv = model.num_heads * head_dim, model.num_kv_heads * head_dim
    saved = model.num_layers * tokens * model.hidden_dim * c
    attention = 2 * tokens * (q + 2 * kv + model.hidden_dim) / tensor * c
    scores = tokens / seq_len * model.num_heads / tensor * seq_len**2 * c
    moe = 2 * tokens * model.num_experts_per_token * 3 * model.expert_intermediate_dim / tensor * c
    logits = tokens * vocab / tensor * 4
    activations = saved + attention + scores + moe + logits
    return {"state": state, "activations": activations, "total": state + activations}


def gathered_experts(model: MoeModelConfig, mesh: MeshSpec, precision: str = "f32") -> float:
    """Bytes of one layer's routed experts as every device holds them while the layer computes.

    Levanter's MoE layers shard the experts' weights over `expert` at rest but gather all of a
    layer's experts on every device for the grouped matmuls (there is no all-to-all dispatch), so
    each device holds every expert of the layer being computed, split only by `tensor` (their
    MLP width); the backward pass holds them again, with their gradients. The memory estimate
    leaves this out; for a model with many wide experts it dominates (the hero's 384 experts: 20.3
    GiB a layer in bf16), which is what compiling the layout shows (`drydock plan --compile`)."""
    c = 2 if precision == "bf16" else 4
    per_layer = model.num_experts * 3 * model.hidden_dim * model.expert_intermediate_dim
    return per_layer * c / mesh.tensor


def training_seconds(active_params: int, tokens: int, hardware: Hardware) -> float | None:
    """6 x active parameters x tokens / (devices x peak x MFU); None without a known accelerator."""
    spec = hardware.spec
    if spec is None or not hardware.devices:
        return None
    return 6 * active_params * tokens / (hardware.devices * spec.peak_flops * hardware.mfu)


def readable_duration(seconds: float) -> str:
    """`3.2 h`, `41 days`: a training's length at a glance."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def fits(total: float, hardware: Hardware) -> bool | None:
    """Whether `total` bytes fit one device of `hardware` (None: unknown accelerator)."""
    spec = hardware.spec
    return None if spec is None else total <= spec.memory and math.isfinite(total)


def layout_problems(
    model: MoeModelConfig,
    mesh: MeshSpec,
    hardware: Hardware,
    batch_size: int,
    seq_len: int,
    vocab: int | None,
    precision: str,
) -> list[tuple[str, str]]:
    """(field, message) for every way the layout cannot work: the mesh against the devices, the
    batch, the experts and heads (`MeshSpec.problems`), then the memory estimate against the
    accelerator's memory (when the vocabulary and the accelerator are known)."""
    problems = mesh.problems(
        hardware.devices,
        batch_size=batch_size,
        num_experts=model.num_experts,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        intermediate=model.expert_intermediate_dim,
        num_global_kv_heads=model.num_global_kv_heads,
    )
    spec = hardware.spec
    if problems or vocab is None or spec is None or not hardware.devices:
        return problems
    need = memory_per_device(model, vocab, batch_size, seq_len, mesh, hardware.devices, precision)
    if need["total"] > spec.memory:
        problems.append(
            (
                "mesh",
                f"the estimated {format_size(need['total'])} per device (state "
                f"{format_size(need['state'])}, activations {format_size(need['activations'])}) "
                f"does not fit a {spec.name}'s {format_size(spec.memory)}: shard more (data, tensor, "
                "expert), use more devices, or a smaller batch",
            )
        )
    return problems


def layout_summary(
    model: MoeModelConfig,
    mesh: MeshSpec,
    hardware: Hardware,
    batch_size: int,
    seq_len: int,
    vocab: int | None,
    precision: str,
    tokens: int,
) -> dict[str, Any]:
    """What `drydock plan` shows of a training's layout: the mesh on its devices, the memory per
    device against the accelerator's, the time to train at the assumed MFU."""
    from steps.models import parameter_counts

    devices = hardware.devices
    sizes = mesh.sizes(devices)
    shown = " x ".join(f"{name} {size}" for name, size in sizes.items() if size != 1) or "data 1"
    where = f"{devices} {hardware.accelerator or 'devices'}" if devices else "devices unknown"
    out: dict[str, Any] = {"mesh": f"{shown} ({where})"}
    if vocab is None or not devices:
        return out
    need = memory_per_device(model, vocab, batch_size, seq_len, mesh, devices, precision)
    spec = hardware.spec
    of = f" of {format_size(spec.memory)} ({need['total'] / spec.memory:.0%})" if spec else ""
    out["memory per device"] = (
        f"{format_size(need['total'])}{of}: state {format_size(need['state'])}, "
        f"activations {format_size(need['activations'])}"
    )
    seconds = training_seconds(parameter_counts(model, vocab)[1], tokens, hardware)
    if seconds is not None:
        out["time"] = f"{readable_duration(seconds)} at {hardware.mfu:.0%} MFU"
    return out
