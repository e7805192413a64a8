"""The `mixture` step: tokenized components + weights (or a schedule) -> a Levanter data config.

It reads each component's `stats.json` (written by the tokenize step), normalizes the weights
of every phase, and works out for the token budget how many tokens each component contributes
and how many epochs of it that is. A component read more than `max_epochs` times is an error
naming it. A component whose weight is zero in every phase is validation-only.

Outputs, under the step's directory:

    data_config.yaml   a Levanter `LmDataConfig` (load it with `load_data_config`)
    mixture.json       the table: components, weights per phase, tokens, epochs, steps

A schedule is a list of `(start_step, {name: weight})` phases in training steps, as Levanter's
`LmDataConfig.train_weights` takes it: e.g. an initial mix, a main mix from 28% of training, a
cooldown from 80%. Turning steps into tokens needs `batch_size` and `seq_len`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec

from pipeline import Resources, Step, StepDeclarationError, output_of, step_function, this_output, versioned
from steps.files import write_text
from steps.imports import LEVANTER, import_ml

__all__ = [
    "MixtureConfig",
    "MixtureError",
    "load_data_config",
    "mixture",
    "mixture_step",
    "plan_mixture",
    "tokenizer_size_if_known",
]

Weights = Mapping[str, float] | Sequence[tuple[int, Mapping[str, float]]]
MAX_BLOCK = 2048  # Levanter's default mixture_block_size


class MixtureError(ValueError):
    """A mixture that cannot be built as asked: names the component or phase and the fix."""


@dataclass(frozen=True)
class MixtureConfig:
    """Configuration of the mixture step."""

    components: dict[str, str]
    """Component name -> a tokenize step's output directory (`output_of(tokenize_step)`)."""
    weights: dict[str, float] | list[tuple[int, dict[str, float]]]
    """Weights, or a schedule of `(start_step, weights)` phases; the first phase starts at step 0."""
    target_tokens: int
    """Training tokens in total."""
    batch_size: int
    """Sequences per training step."""
    seq_len: int
    """Tokens per sequence."""
    output: str
    """The step's output directory (`this_output()`)."""
    validation: list[str] = field(default_factory=list)
    """Components whose validation split is evaluated."""
    max_epochs: float | None = None
    """Most times any component may be read; None means no limit."""


def _check_component(name: str, key: str, value: Any) -> None:
    """A component is tokenized data: a tokenize step (or a step of one's own that writes a
    tokenized cache, or a path). Another step of this library (a training, an evaluation, a
    mixture) writes no cache, and would fail only when the mixture runs."""
    if not isinstance(value, Step):
        return
    from steps.data.tokenize import tokenize

    module = getattr(value.fn, "__module__", "") or ""
    if value.fn is not tokenize and module.startswith("steps."):
        kind = getattr(value.fn, "__name__", "step")
        raise StepDeclarationError(
            name,
            f"{value.name!r} is a {kind} step, not tokenized data: give a tokenize step (tokenize_step(...))",
            field=f"components[{key!r}]",
        )


def mixture_step(
    name: str,
    *,
    components: Mapping[str, Any],
    weights: Weights,
    target_tokens: int,
    batch_size: int,
    seq_len: int,
    validation: Sequence[str] = (),
    max_epochs: float | None = None,
) -> Step:
    """A ready mixture `Step`. `components` maps names to tokenize steps (or output paths).

    The weights are checked against the components before anything runs (a weight naming a
    component that does not exist, no positive weight in a phase, a phase past the end, a
    validation set that is not a component): a `StepDeclarationError` naming the field.
    """
    for key, value in components.items():
        _check_component(name, key, value)
    paths = {key: output_of(value) if isinstance(value, Step) else value for key, value in components.items()}
    try:
        schedule: Any = (
            {k: float(v) for k, v in weights.items()}
            if isinstance(weights, Mapping)
            else [(int(start), {k: float(v) for k, v in w.items()}) for start, w in weights]
        )
        # The token counts are not known yet: 1 per component checks everything but the epochs.
        plan_mixture(
            schedule,
            dict.fromkeys(components, 1),
            target_tokens=int(target_tokens),
            batch_size=int(batch_size),
            seq_len=int(seq_len),
        )
    except (MixtureError, TypeError, ValueError) as e:
        text = str(e)
        field_name, sep, message = text.partition(": ")
        if not sep or " " in field_name:
            field_name, message = "weights", text
        raise StepDeclarationError(name, message, field=field_name) from e
    unknown = sorted(set(validation) - set(components))
    if unknown:
        raise StepDeclarationError(
            name, f"unknown component(s) {unknown}; known: {sorted(components)}", field="validation"
        )
    return Step(
        name=name,
        fn=mixture,
        config=MixtureConfig(
            components=paths,
            weights=versioned(schedule),
            target_tokens=versioned(int(target_tokens)),
            batch_size=versioned(int(batch_size)),
            seq_len=versioned(int(seq_len)),
            validation=versioned(list(validation)),
            max_epochs=versioned(max_epochs),
            output=this_output(),
        ),
        description=f"mixture {name}",
        resources=Resources(cpus=1),
    )


# -- the arithmetic (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    start_step: int
    end_step: int
    weights: dict[str, float]
    """Normalized to sum to 1."""
    tokens: int


@dataclass(frozen=True)
class MixturePlan:
    """What a mixture will do: phases, tokens and epochs per component."""

    phases: list[Phase]
    num_steps: int
    tokens: dict[str, int]
    epochs: dict[str, float]
    validation_only: list[str]
    block_size: int


def plan_mixture(
    weights: Weights,
    train_tokens: Mapping[str, int],
    *,
    target_tokens: int,
    batch_size: int,
    seq_len: int,
    max_epochs: float | None = None,
) -> MixturePlan:
    """The token and epoch arithmetic of a mixture; raises `MixtureError` naming what is wrong."""
    if target_tokens <= 0 or batch_size <= 0 or seq_len <= 0:
        raise MixtureError("target_tokens, batch_size and seq_len must be positive")
    stages = [(0, dict(weights))] if isinstance(weights, Mapping) else [(int(s), dict(w)) for s, w in weights]
    if not stages:
        raise MixtureError("weights: no phases given")
    tokens_per_step = batch_size * seq_len
    num_steps = math.ceil(target_tokens / tokens_per_step)
    if stages[0][0] != 0:
        raise MixtureError(f"weights: the first phase must start at step 0, not {stages[0][0]}")
    for (a, _), (b, _) in itertools.pairwise(stages):
        if b <= a:
            raise MixtureError(f"weights: phase start steps must increase, got {a} then {b}")
    if stages[-1][0] >= num_steps:
        raise MixtureError(
            f"weights: a phase starts at step {stages[-1][0]}, but training has only {num_steps} steps "
            f"({target_tokens:,} tokens / {tokens_per_step:,} per step)"
        )
    phases = []
    for i, (start, raw) in enumerate(stages):
        unknown = sorted(set(raw) - set(train_tokens))
        if unknown:
            raise MixtureError(
                f"weights: phase {i} names unknown component(s) {unknown}; known: {sorted(train_tokens)}"
            )
        negative = sorted(k for k, v in raw.items() if v < 0)
        if negative:
            raise MixtureError(f"weights: phase {i} gives negative weight to {negative}")
        total = sum(raw.values())
        if total <= 0:
            raise MixtureError(f"weights: phase {i} (from step {start}) has no positive weight")
        end = stages[i + 1][0] if i + 1 < len(stages) else num_steps
        # The last phase ends exactly at the budget (the final step may be partial).
        tokens = (
            (end - start) * tokens_per_step
            if i + 1 < len(stages)
            else target_tokens - start * tokens_per_step
        )
        phases.append(Phase(start, end, {k: raw.get(k, 0.0) / total for k in sorted(train_tokens)}, tokens))
    used = {name: round(sum(p.tokens * p.weights[name] for p in phases)) for name in sorted(train_tokens)}
    epochs = {}
    for name, tokens in used.items():
        available = train_tokens[name]
        if tokens > 0 and available <= 0:
            raise MixtureError(f"component {name!r} has weight but no training tokens")
        epochs[name] = tokens / available if available else 0.0
        if max_epochs is not None and epochs[name] > max_epochs:
            raise MixtureError(
                f"component {name!r} would be read {epochs[name]:.2f} times ({tokens:,} tokens of its "
                f"{available:,}), more than max_epochs={max_epochs:g}; lower its weight, add data, or raise "
                "max_epochs"
            )
    validation_only = [name for name in sorted(train_tokens) if all(p.weights[name] == 0 for p in phases)]
    offsets = [p.start_step * batch_size for p in phases[1:]]
    block = MAX_BLOCK
    for offset in offsets:
        block = math.gcd(block, offset)
    return MixturePlan(phases, num_steps, used, epochs, validation_only, block)


# -- the step function ------------------------------------------------------------------------------


def mixture(config: MixtureConfig) -> None:
    """Read the components' stats, check the arithmetic, write `data_config.yaml` and `mixture.json`."""
    import_ml(*LEVANTER)
    stats = {name: _read_stats(name, path) for name, path in config.components.items()}
    tokenizers = {s["tokenizer"] for s in stats.values()}
    if len(tokenizers) != 1:
        raise MixtureError(f"components were tokenized with different tokenizers: {sorted(tokenizers)}")
    plan, train_tokens = _plan(config, stats)
    for name in config.validation:
        if name not in stats:
            raise MixtureError(f"validation: unknown component {name!r}; known: {sorted(stats)}")
        if "validation" not in stats[name]["splits"]:
            raise MixtureError(f"validation: component {name!r} was tokenized without validation inputs")
    for name in plan.validation_only:
        if name not in config.validation:
            raise MixtureError(
                f"component {name!r} has zero weight in every phase, so it is validation-only: list it in "
                "`validation` or drop it"
            )
    print(format_mixture(plan, train_tokens), flush=True)
    data_config = _data_config(config, plan, tokenizers.pop())
    write_text(f"{config.output}/data_config.yaml", _dump_data_config(data_config))
    table = {
        "target_tokens": config.target_tokens,
        "batch_size": config.batch_size,
        "seq_len": config.seq_len,
        "num_train_steps": plan.num_steps,
        "mixture_block_size": plan.block_size,
        "max_epochs": config.max_epochs,
        "phases": [
            {"start_step": p.start_step, "end_step": p.end_step, "tokens": p.tokens, "weights": p.weights}
            for p in plan.phases
        ],
        "components": {
            name: {
                "path": config.components[name],
                "train_tokens_available": train_tokens[name],
                "tokens": plan.tokens[name],
                "epochs": plan.epochs[name],
                "validation": name in config.validation,
                "validation_only": name in plan.validation_only,
                "validation_tokens": stats[name]["splits"].get("validation", {}).get("tokens", 0),
            }
            for name in sorted(stats)
        },
    }
    write_text(f"{config.output}/mixture.json", json.dumps(table, indent=2))


def preview(config: MixtureConfig) -> str | None:
    """The mixture table, for `drydock plan` once the tokenized components exist."""
    try:
        stats = {name: _read_stats(name, path) for name, path in config.components.items()}
    except MixtureError:
        return _format_phases(config)  # not tokenized yet: the schedule, without token counts
    return format_mixture(*_plan(config, stats))


def _format_phases(config: MixtureConfig) -> str:
    """The weight schedule alone, normalized, for plans made before the components exist."""
    stages = [(0, config.weights)] if isinstance(config.weights, Mapping) else list(config.weights)
    steps = math.ceil(config.target_tokens / (config.batch_size * config.seq_len))
    lines = [
        f"{steps:,} steps, {config.target_tokens:,} tokens; {len(stages)} phase(s) "
        "(tokens and epochs per component once the components are tokenized)"
    ]
    for start, weights in stages:
        total = sum(weights.values()) or 1.0
        shown = ", ".join(f"{name} {w / total:.3f}" for name, w in sorted(weights.items()))
        lines.append(f"  from step {start:,}: {shown}")
    return "\n".join(lines)


def _plan(config: MixtureConfig, stats: Mapping[str, Any]) -> tuple[MixturePlan, dict[str, int]]:
    """The mixture arithmetic for `config`, from the components' stats.json."""
    train_tokens = {name: s["splits"].get("train", {}).get("tokens", 0) for name, s in stats.items()}
    plan = plan_mixture(
        config.weights,
        train_tokens,
        target_tokens=config.target_tokens,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        max_epochs=config.max_epochs,
    )
    return plan, train_tokens


def format_mixture(plan: MixturePlan, train_tokens: Mapping[str, int]) -> str:
    """A plain-text table: weights per phase, then tokens and epochs per component. Each column is
    as wide as its widest cell, two spaces apart: a 15-digit token count never runs into the next."""
    names = sorted(train_tokens)
    header = [
        "component",
        *(f"steps {p.start_step}-{p.end_step}" for p in plan.phases),
        "tokens",
        "available",
        "epochs",
    ]
    rows = [
        [
            name,
            *(f"{p.weights[name]:.3f}" for p in plan.phases),
            f"{plan.tokens[name]:,}",
            f"{train_tokens[name]:,}",
            f"{plan.epochs[name]:.2f}",
        ]
        for name in names
    ]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first, *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    lines = [f"{plan.num_steps:,} steps; {len(plan.phases)} phase(s)", line(header)]
    for name, cells in zip(names, rows, strict=True):
        note = "  (validation only)" if name in plan.validation_only else ""
        lines.append(line(cells) + note)
    return "\n".join(lines)


step_function(mixture, preview=preview)


def _read_stats(name: str, path: str) -> dict[str, Any]:
    try:
        with fsspec.open(f"{path}/stats.json", "r") as f:
            return json.load(f)
    except FileNotFoundError as e:
        raise MixtureError(
            f"component {name!r}: no stats.json under {path}; is it a tokenize step's output?"
        ) from e


def _data_config(config: MixtureConfig, plan: MixturePlan, tokenizer: str) -> Any:
    from levanter.data.text import DatasetComponent, LmDataConfig
    from levanter.data.text.formats import TextLmDatasetFormat

    components = {}
    for name, path in sorted(config.components.items()):
        if name in config.validation:
            components[name] = DatasetComponent(cache_dir=path, format=TextLmDatasetFormat())
        else:
            # Only the train split: Levanter evaluates every component whose validation cache it finds.
            components[name] = DatasetComponent(
                cache_dir=f"{path}/train", flat_cache=True, format=TextLmDatasetFormat()
            )
    if len(plan.phases) == 1:
        weights: Any = dict(plan.phases[0].weights)
    else:
        weights = [(p.start_step, dict(p.weights)) for p in plan.phases]
    return LmDataConfig(
        tokenizer=tokenizer,
        cache_dir=None,
        auto_build_caches=False,
        components=components,
        train_weights=weights,
        mixture_block_size=plan.block_size,
    )


def _dump_data_config(data_config: Any) -> str:
    import draccus

    return draccus.dump(data_config)


def load_data_config(path: str) -> Any:
    """The Levanter `LmDataConfig` a mixture step wrote (`<output>/data_config.yaml` or its directory)."""
    import draccus
    from levanter.data.text import LmDataConfig

    if not path.endswith((".yaml", ".yml")):
        path = f"{path}/data_config.yaml"
    with fsspec.open(path, "r") as f:
        return draccus.load(LmDataConfig, f)


def tokenizer_size_if_known(data: str) -> int | None:
    """The size of the vocabulary of the tokenizer a mixture step (output `data`) recorded, read from
    its `tokenizer.json` without loading the tokenizer; None when that cannot be read (not written
    yet, a hub name)."""
    try:
        import yaml

        with fsspec.open(os.path.join(data, "data_config.yaml"), "r") as f:
            tokenizer = yaml.safe_load(f).get("tokenizer")
        with fsspec.open(os.path.join(tokenizer, "tokenizer.json"), "r") as f:
            raw = json.load(f)
        return len(raw["model"]["vocab"]) + sum(
            1 for t in raw.get("added_tokens", []) if t["content"] not in raw["model"]["vocab"]
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
