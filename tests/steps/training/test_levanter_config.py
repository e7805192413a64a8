"""The Levanter config train_moe hands to Levanter's trainer, read back: what docs/training.md says
a field does is what the trainer is told."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest

from pipeline import unversioned
from steps.models import to_levanter
from steps.training.levanter_config import levanter_train_config
from tests.steps.tiny import declared_training


@pytest.mark.parametrize(
    ("precision", "compute"), [("f32", jnp.float32), ("bf16", jnp.bfloat16)], ids=["f32", "bf16"]
)
def test_precision_sets_the_compute_dtype_and_keeps_float32_weights(tmp_path, precision, compute):
    """`precision="bf16"` computes in bfloat16 with float32 weights (Levanter's `p=f32,c=bf16`);
    the default `"f32"` computes in float32."""
    step = declared_training(precision=precision)
    config = dataclasses.replace(
        step.config,
        **{f.name: unversioned(getattr(step.config, f.name)) for f in dataclasses.fields(step.config)},
    )
    config = dataclasses.replace(config, output=str(tmp_path / "out"), data=str(tmp_path / "data"))
    trained = levanter_train_config(config, None, to_levanter(config.model, 64, "unused"))
    policy = trained.trainer.mp
    assert (policy.param_dtype, policy.compute_dtype) == (jnp.float32, compute)
