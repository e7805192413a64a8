"""The models: `MoeModelConfig`, the registry of model families and the families themselves
(`steps.models.families`), Drydock's own MoE (`drydock_moe`) and its export. The bottom of the
step library beside `steps.files`: data, scaling, training and evaluation all describe models
with it, and it imports none of them."""

from __future__ import annotations

from steps.models import families as families  # importing it registers every family
from steps.models.config import (
    TINY_MOE,
    ModelFamily,
    MoeModelConfig,
    family,
    family_names,
    parameter_counts,
    register,
    tiny_moe,
    to_levanter,
)

__all__ = [
    "TINY_MOE",
    "ModelFamily",
    "MoeModelConfig",
    "family",
    "family_names",
    "parameter_counts",
    "register",
    "tiny_moe",
    "to_levanter",
]
