"""A training's layout, checked when it is declared, and its memory and time estimates, against
numbers worked out by hand (issue 30)."""

from __future__ import annotations

import pytest

from pipeline import Resources, StepDeclarationError
from steps.models import MoeModelConfig, parameter_counts
from steps.training.estimates import (
    ACCELERATORS,
    GIB,
    Hardware,
    hardware_of,
    layout_summary,
    memory_per_device,
    training_seconds,
)
from steps.training.mesh import MeshSpec

# A small model whose numbers are easy to follow by hand.
MODEL = MoeModelConfig(
    hidden_dim=64,
    expert_intermediate_dim=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    num_experts=8,
    num_experts_per_token=2,
)
VOCAB = 1000


def test_the_memory_estimate_matches_a_hand_computation():
    # 8 devices: data 2, tensor 2, expert 2. Batch 16 x seq 32 tokens split 2 x 2 = 4 ways.
    mesh = MeshSpec(data=2, tensor=2, expert=2)
    got = memory_per_device(MODEL, VOCAB, 16, 32, mesh, 8, "bf16")
    total, _ = parameter_counts(MODEL, VOCAB)
    experts = 2 * 8 * 3 * 64 * 128  # layers x experts x (gate, up, down) x hidden x width = 393,216
    dense = total - experts
    held = dense / (2 * 2) + experts / (2 * 2 * 2)
    assert got["state"] == 16 * held
    tokens = 16 * 32 / 4  # 128 per device; bf16: 2 bytes a value
    saved = 2 * tokens * 64 * 2  # layers x tokens x hidden x bytes
    attention = 2 * tokens * (4 * 16 + 2 * 2 * 16 + 64) / 2 * 2  # q, k, v, hidden over tensor 2
    scores = tokens / 32 * 4 / 2 * 32**2 * 2  # sequences x heads/tensor x seq^2 x bytes
    moe = 2 * tokens * 2 * 3 * 128 / 2 * 2  # top-2 x (gate, up, act) x width/tensor x bytes
    logits = tokens * VOCAB / 2 * 4  # float32
    assert got["activations"] == pytest.approx(saved + attention + scores + moe + logits)
    assert got["total"] == got["state"] + got["activations"]
    # float32 compute doubles every activation, not the state.
    f32 = memory_per_device(MODEL, VOCAB, 16, 32, mesh, 8, "f32")
    assert f32["state"] == got["state"]
    assert f32["activations"] == pytest.approx(2 * (saved + attention + scores + moe) + logits)


def test_the_time_estimate_is_six_n_d_over_the_devices_peak():
    hardware = Hardware("H100", 128, 0.5)
    seconds = training_seconds(10**9, 10**12, hardware)
    assert seconds == pytest.approx(6 * 10**9 * 10**12 / (128 * 989e12 * 0.5))
    assert training_seconds(10**9, 10**12, Hardware(None, None)) is None


def test_hardware_comes_from_the_resources():
    assert hardware_of(Resources(gpus=8, hosts=16, accelerator="H100")) == Hardware("H100", 128, 0.4)
    assert hardware_of(Resources(tpu="v5p-64", slices=2)) == Hardware(
        "v5p", 64, 0.4, slices=2
    )  # 32 chips x 2
    assert hardware_of(Resources(tpu="v5e-16")) == Hardware("v5e", 16, 0.4)
    assert hardware_of(Resources(cpus=4)) == Hardware(None, None, 0.4)
    assert {"v4", "v5e", "v5p", "v6e", "H100", "H200", "B200", "GB200"} <= set(ACCELERATORS)


def test_the_plan_shows_the_layout_memory_and_time():
    shown = layout_summary(
        MODEL, MeshSpec(data=2, tensor=2, expert=2), Hardware("H200", 8), 16, 32, VOCAB, "bf16", 10**9
    )
    assert shown["mesh"] == "data 2 x tensor 2 x expert 2 (8 H200)"
    memory = memory_per_device(MODEL, VOCAB, 16, 32, MeshSpec(data=2, tensor=2, expert=2), 8, "bf16")
    assert shown["memory per device"] == (
        f"{memory['total'] / 2**20:.1f} MiB of 131.3 GiB (0%): state {memory['state'] / 2**20:.1f} MiB, "
        f"activations {memory['activations'] / 2**10:.1f} KiB"  # under a MiB: in KiB
    )
    assert memory["activations"] < 2**20 <= memory["state"]
    assert shown["time"] == "0 min at 40% MFU"


@pytest.mark.parametrize(
    ("kwargs", "resources", "field", "message"),
    [
        (
            {"mesh": MeshSpec(data=4, tensor=2)},
            Resources(gpus=8, hosts=2, accelerator="H100"),
            "mesh",
            "data 4 x replica 1 x tensor 2 x expert 1 = 8 devices, but the training has 16",
        ),
        (
            {"mesh": MeshSpec(tensor=3)},
            Resources(gpus=8, hosts=2, accelerator="H100"),
            "mesh",
            "replica x tensor x expert = 3 does not divide the 16 devices",
        ),
        (
            {"mesh": MeshSpec(replica=3)},
            Resources(gpus=3, accelerator="H100"),
            "batch_size",
            "8 does not split into the mesh's 3 data-parallel parts",
        ),
        (
            {"mesh": MeshSpec(expert=8)},
            Resources(gpus=8, accelerator="H100"),
            "mesh.expert",
            "4 experts do not split over an expert axis of 8",
        ),
        (
            {"mesh": MeshSpec(tensor=8)},
            Resources(gpus=8, accelerator="H100"),
            "mesh.tensor",
            "4 heads do not split over a tensor axis of 8",
        ),
        ({"mesh": MeshSpec(data=0)}, None, "mesh.data", "must be a whole number >= 1 or -1, got 0"),
        ({"precision": "fp8"}, None, "precision", "'fp8' is not 'f32' or 'bf16'"),
        ({"mfu": 1.5}, None, "mfu", "must be a fraction in (0, 1], got 1.5"),
        ({"mesh": {"data": 2}}, None, "mesh", "must be a MeshSpec, got dict"),
    ],
)
def test_a_layout_that_cannot_work_is_refused_at_declaration(kwargs, resources, field, message):
    from tests.steps.tiny import declared_training

    with pytest.raises(StepDeclarationError) as info:
        declared_training(**kwargs, resources=resources)
    assert info.value.field == field
    assert message in str(info.value)


def test_a_layout_too_big_for_the_accelerator_is_refused():
    from steps.training.train_moe import train_moe_step
    from tests.steps.tiny import declared_training

    wide = MoeModelConfig(
        hidden_dim=8192,
        expert_intermediate_dim=8192,
        num_layers=8,
        num_heads=64,
        num_kv_heads=8,
        num_experts=64,
        num_experts_per_token=4,
    )
    base = declared_training()
    with pytest.raises(StepDeclarationError) as info:
        train_moe_step(
            "train/wide",
            data=base.config.data,
            model=wide,
            batch_size=8,
            seq_len=64,
            num_steps=10,
            vocab_size=32_000,
            resources=Resources(gpus=1, accelerator="H100"),
        )
    assert info.value.field == "mesh" and "does not fit a H100's 74.5 GiB" in str(info.value)
    assert GIB == 2**30
