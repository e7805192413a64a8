"""Executor options: backend options nest (`--ray.address`), the old flags keep working."""

from __future__ import annotations

import pytest

from pipeline.errors import StepDeclarationError
from pipeline.run.backends import REGISTRY, backend_class, make_backend
from pipeline.run.backends.local import LocalBackend
from pipeline.run.options import ExecutorMainConfig, RayOptions, parse_options, validate_options


def test_ray_options_nest_and_the_old_flag_fills_them():
    assert parse_options(["--ray.address", "10.0.0.5:6379"]).ray == RayOptions(address="10.0.0.5:6379")
    assert parse_options(["--ray_address", "10.0.0.5:6379"]).ray.address == "10.0.0.5:6379"
    assert parse_options(["--ray.num_cpus", "2"]).ray.num_cpus == 2
    assert ExecutorMainConfig(ray_address="h:1").ray.address == "h:1"
    # An explicit --ray.address wins over the older spelling.
    assert parse_options(["--ray.address", "a:1", "--ray_address", "b:2"]).ray.address == "a:1"


def test_unknown_options_and_backends_are_one_clear_error():
    with pytest.raises(StepDeclarationError, match="field `argv`: bad command-line option"):
        parse_options(["--ray.adress", "x"])
    with pytest.raises(
        StepDeclarationError, match="field `--backend`: unknown backend 'slurm'; choose one of ray, local"
    ):
        validate_options(ExecutorMainConfig(backend="slurm"))


def test_backends_come_from_the_registry():
    # Every entry names a Backend class and an options field of the executor's config.
    from dataclasses import fields

    from pipeline.run.backends.base import Backend

    names = {f.name for f in fields(ExecutorMainConfig)}
    for name, entry in REGISTRY.items():
        assert issubclass(backend_class(name), Backend) and entry.options in names, name
    assert backend_class("local") is LocalBackend
    backend = make_backend("local", ExecutorMainConfig(backend="local"))
    assert isinstance(backend, LocalBackend)
    backend.close()
