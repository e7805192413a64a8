"""Backends run step functions (`base.Backend`); this is their registry.

A backend is one entry here (its name, the module and class that implement it, and the
`ExecutorMainConfig` field holding its options) and one module. Modules are imported only when
their backend is used, so importing this package stays cheap and `import ray` happens in
`pipeline.run.backends.ray` alone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.run.backends.base import Backend

__all__ = ["REGISTRY", "BackendEntry", "backend_class", "check_declared", "make_backend"]


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend lives and where its options are."""

    module: str
    cls: str
    options: str
    """The `ExecutorMainConfig` field with its options (`--ray.address` is the field `ray`)."""
    summary: str
    plan_check: str | None = None
    """`module:function` refusing a plan this backend can never run, from the declaration alone
    (no backend started): `drydock plan` calls it as `run` does, so both refuse alike."""


REGISTRY: dict[str, BackendEntry] = {
    "ray": BackendEntry(
        "pipeline.run.backends.ray",
        "RayBackend",
        "ray",
        "a private local Ray instance, or the cluster at --ray.address",
    ),
    "local": BackendEntry(
        "pipeline.run.backends.local",
        "LocalBackend",
        "local",
        "threads of this process",
        plan_check="pipeline.run.backends.local:check_declared",
    ),
}


def backend_class(name: str) -> type[Backend]:
    """The class of the backend registered as `name` (importing its module now)."""
    entry = REGISTRY[name]
    return getattr(importlib.import_module(entry.module), entry.cls)


def make_backend(name: str, config: Any) -> Backend:
    """The backend `name`, created from its options in `config` (an `ExecutorMainConfig`)."""
    verbose = bool(getattr(config, "verbose", False))
    return backend_class(name).create(getattr(config, REGISTRY[name].options), verbose=verbose)


def check_declared(name: str, plan: Any) -> None:
    """Raise the `StepDeclarationError` backend `name` would raise for `plan` before running it,
    without starting the backend (`drydock plan`)."""
    entry = REGISTRY[name]
    if entry.plan_check is None:
        return
    module, function = entry.plan_check.split(":")
    getattr(importlib.import_module(module), function)(plan)
