"""Sweeps: a grid or a seeded random search over versioned fields, each run named by its values.

    from pipeline import grid, random_search, log_uniform, sweep

    trainings = sweep(train, grid({"optimizer.learning_rate": [1e-3, 3e-3, 1e-2]}))
    # three steps: train/code/learning_rate=0.001, .../learning_rate=0.003, .../learning_rate=0.01

    for point in grid(lr=[1e-3, 3e-3], warmup=[0.05, 0.1]):     # or build each run yourself
        train = train_moe_step(point.name("train/code"), ..., optimizer=OptimizerSpec(
            learning_rate=point["lr"], warmup=point["warmup"]))   # train/code/lr=0.001,warmup=0.05

A run's name is its template's name, a slash, and `key=value` pairs joined by commas. The name
says what differs, and `drydock explain` finds the template's other runs by it: the steps whose
last name part is made of `key=value` pairs, beside this one. Planning is pure: a sweep is a list
of ordinary steps, each with its own identity, cached and shared through leases like any other
(several runners started on the same sweep file run each point once).

Random values are rounded to `digits` significant digits (3), so that the name shows the value the
run used; points that round to the same values are drawn once.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import StepDeclarationError
from pipeline.step import Step, Versioned

__all__ = ["Point", "choice", "grid", "log_uniform", "random_search", "sweep", "uniform"]


@dataclass(frozen=True)
class Point:
    """One run of a sweep: its values, in the order the sweep named them."""

    values: tuple[tuple[str, Any], ...]

    def __getitem__(self, key: str) -> Any:
        for name, value in self.values:
            if name == key:
                return value
        raise KeyError(key)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    @property
    def label(self) -> str:
        """`lr=0.003,warmup=0.1`: the last part of each run's name."""
        return ",".join(f"{_short_key(key)}={format_value(value, key)}" for key, value in self.values)

    def name(self, base: str) -> str:
        """The name of this point's run of the step called `base`: `base/lr=0.003,warmup=0.1`."""
        return f"{base.rstrip('/')}/{self.label}"


def _short_key(key: str) -> str:
    """A field path's last part names it in a run's name (`optimizer.learning_rate` -> `learning_rate`)."""
    return key.rsplit(".", 1)[-1]


def format_value(value: Any, key: str = "value") -> str:
    """How a value appears in a run's name: numbers in their shortest form (`0.003`, `1e-05`,
    `64`), booleans as `true`/`false`, strings as they are (letters, digits and `. _ + -`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise StepDeclarationError(None, f"a swept value must be finite, got {value!r}", field=key)
        return repr(value)
    if isinstance(value, str) and value and all(c.isalnum() or c in "._+-" for c in value):
        return value
    raise StepDeclarationError(
        None,
        f"a swept value must be a number, a boolean or a plain string (letters, digits and . _ + -) "
        f"to name its run; got {value!r}",
        field=key,
    )


def grid(axes: Mapping[str, Sequence[Any]] | None = None, /, **more: Sequence[Any]) -> list[Point]:
    """Every combination of the values given for each key (a mapping, keyword arguments, or
    both: `grid({"optimizer.learning_rate": [1e-3, 3e-3]}, seed=[0, 1])`), the first key varying
    slowest."""
    axes = {**(axes or {}), **more}
    if not axes:
        raise StepDeclarationError(None, "a grid needs at least one key with its values", field="grid")
    for key, values in axes.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise StepDeclarationError(None, f"needs a non-empty list of values, got {values!r}", field=key)
        if len(set(map(repr, values))) != len(values):
            raise StepDeclarationError(None, f"lists a value twice: {list(values)!r}", field=key)
    points = [Point(tuple(zip(axes, combo, strict=True))) for combo in itertools.product(*axes.values())]
    _check_names(points)
    return points


@dataclass(frozen=True)
class _Distribution:
    kind: str
    low: float = 0.0
    high: float = 0.0
    options: tuple[Any, ...] = ()

    def draw(self, rng: random.Random, digits: int) -> Any:
        if self.kind == "choice":
            return rng.choice(self.options)
        if self.kind == "uniform":
            return _round(rng.uniform(self.low, self.high), digits)
        return _round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))), digits)


def uniform(low: float, high: float) -> Any:
    """Values drawn uniformly between `low` and `high`."""
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise StepDeclarationError(None, f"needs finite low < high, got {low!r}, {high!r}", field="uniform")
    return _Distribution("uniform", low, high)


def log_uniform(low: float, high: float) -> Any:
    """Values whose logarithm is uniform between log(`low`) and log(`high`): learning rates."""
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low < high):
        raise StepDeclarationError(None, f"needs 0 < low < high, got {low!r}, {high!r}", field="log_uniform")
    return _Distribution("log_uniform", low, high)


def choice(*options: Any) -> Any:
    """One of `options`, each as likely."""
    if not options:
        raise StepDeclarationError(None, "needs at least one option", field="choice")
    return _Distribution("choice", options=tuple(options))


def _round(value: float, digits: int) -> float:
    return float(f"{value:.{digits}g}")


def random_search(space: Mapping[str, Any], /, trials: int, *, seed: int = 0, digits: int = 3) -> list[Point]:
    """`trials` points drawn from `space` (each key: `uniform`, `log_uniform`, `choice`, or a fixed
    value) by a generator seeded with `seed`: the same call gives the same points on every machine.
    (`space` is a mapping, not keyword arguments, so that a swept field may be called `seed`.)"""
    if not isinstance(trials, int) or trials < 1:
        raise StepDeclarationError(None, f"must be a positive number of runs, got {trials!r}", field="trials")
    if not space:
        raise StepDeclarationError(None, "a random search needs at least one key", field="random_search")
    rng = random.Random(seed)
    points: list[Point] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()
    # Values rounded to `digits` can repeat: draw until `trials` distinct points, within reason.
    for _ in range(trials * 100):
        values = tuple(
            (key, dist.draw(rng, digits) if isinstance(dist, _Distribution) else dist)
            for key, dist in space.items()
        )
        if values not in seen:
            seen.add(values)
            points.append(Point(values))
            if len(points) == trials:
                break
    else:
        raise StepDeclarationError(
            None, f"the space holds fewer than {trials} distinct points at {digits} digits", field="trials"
        )
    _check_names(points)
    return points


def _check_names(points: Sequence[Point]) -> None:
    labels = [p.label for p in points]  # each value must be nameable (raises otherwise)
    shorts = [_short_key(k) for k, _ in points[0].values] if points else []
    if len(set(shorts)) != len(shorts):
        raise StepDeclarationError(
            None,
            f"two keys end in the same name ({', '.join(shorts)}): their runs' names would clash",
            field="keys",
        )
    if len(set(labels)) != len(labels):
        raise StepDeclarationError(None, "two points have the same name", field="points")


def sweep(template: Step, points: Sequence[Point]) -> list[Step]:
    """One step per point: `template` with each point's values put at their field paths
    (`optimizer.learning_rate`: the `learning_rate` of the config's `optimizer`), named
    `<template name>/<point label>`. Each field set must be versioned in the template (inside a
    `versioned(...)` value, or one itself): a sweep over a field that is not part of identity
    would give runs that differ only in name."""
    if not isinstance(template, Step):
        raise StepDeclarationError(None, f"sweeps a Step, got {type(template).__name__}", field="template")
    steps = []
    for point in points:
        config = template.config
        for path, value in point.values:
            config = _replace(config, path.split("."), value, template.name, path, inside_versioned=False)
        steps.append(dataclasses.replace(template, name=point.name(template.name), config=config))
    return steps


def _replace(obj: Any, parts: list[str], value: Any, step: str, path: str, *, inside_versioned: bool) -> Any:
    if isinstance(obj, Versioned):
        return Versioned(_replace(obj.value, parts, value, step, path, inside_versioned=True))
    if not parts:
        if not inside_versioned:
            raise StepDeclarationError(
                step, "is not versioned: runs that differ in it would share one identity", field=path
            )
        return value
    head, rest = parts[0], parts[1:]
    if isinstance(obj, Mapping):
        if head not in obj:
            raise StepDeclarationError(step, f"the config has no key {head!r}", field=path)
        return {**obj, head: _replace(obj[head], rest, value, step, path, inside_versioned=inside_versioned)}
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        raise StepDeclarationError(step, f"{type(obj).__name__} has no field {head!r}", field=path)
    names = [f.name for f in dataclasses.fields(obj)]
    if head not in names:
        raise StepDeclarationError(
            step, f"{type(obj).__name__} has no field {head!r}; its fields: {', '.join(names)}", field=path
        )
    inner = _replace(getattr(obj, head), rest, value, step, path, inside_versioned=inside_versioned)
    return dataclasses.replace(obj, **{head: inner})


def is_point_name(name: str) -> bool:
    """Is `name` a sweep run's name: a last part of `key=value` pairs joined by commas?"""
    base, _, last = name.rpartition("/")
    return bool(base) and all(part.count("=") == 1 and not part.startswith("=") for part in last.split(","))
