"""Scaling: fit scaling laws to evaluated runs and predict a target (`scaling_fit`), and a training's
predicted loss curve (`prediction`)."""

from __future__ import annotations

import importlib
from typing import Any

_MOVED = ("ScalingFitConfig", "ScalingPoint", "scaling_fit", "scaling_point", "scaling_fit_step")


def __getattr__(name: str) -> Any:
    # Manifests written before the step library had folders name `steps.scaling:ScalingFitConfig`
    # (the step now lives in `steps.scaling.fit`).
    if name in _MOVED:
        return getattr(importlib.import_module("steps.scaling.fit"), name)
    raise AttributeError(f"module 'steps.scaling' has no attribute {name!r}")
