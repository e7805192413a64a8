"""The `scaling_fit` step: fit L(N, D) = E + A/N^alpha + B/D^beta to evaluated runs, predict a target.

Inputs are grid points (each an evaluate step's output, with the model and the tokens it was
trained on) and a target config, optionally with its own evaluation. N is the model's *active
non-embedding* parameter count (`active_non_embedding_params`): active because an MoE token only
touches its routed experts, so compute per token follows active, not total, parameters; without
the token embedding and LM head because at this size they are most of the model and scale with
the vocabulary, not with capacity (Kaplan et al. 2020 saw the cleaner law without them). D is the
number of training tokens, `num_steps * batch_size * seq_len`.

The fitting math is pure functions of arrays in `steps.scaling.law` (`fit_law`,
`goodness_of_fit`, `leave_one_out`, `prediction_interval`, `prediction_error`), tested directly;
the picture is `steps.scaling.plot`.

Outputs, under the step's directory:

    fit.json   the law's parameters, goodness of fit (R², RMSE, leave-one-out RMSE, per-point
               residuals), the target's predicted loss with its interval, and, when the target
               was evaluated, the prediction's error against the measured loss
    fit.png    loss against N, one colour per token budget, the fitted curves, the prediction
               with its interval and the measured target; beside it predicted against measured
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline import Resources, Step, StepDeclarationError, output_of, step_function, this_output, versioned
from pipeline.step import Versioned
from steps.files import exists, read_json, write_json
from steps.imports import import_ml
from steps.moe import MoeModelConfig, parameter_counts
from steps.scaling.law import (
    LAW,
    MIN_POINTS,
    NUM_PARAMETERS,
    LawFit,
    ScalingFitError,
    check_grid,
    check_settings,
    fit_law,
    goodness_of_fit,
    leave_one_out,
    prediction_error,
    prediction_interval,
)
from steps.scaling.plot import plot_fit

__all__ = [
    "MIN_POINTS",
    "NUM_PARAMETERS",
    "LawFit",
    "ScalingFitConfig",
    "ScalingFitError",
    "ScalingPoint",
    "active_non_embedding_params",
    "fit_law",
    "goodness_of_fit",
    "leave_one_out",
    "prediction_error",
    "prediction_interval",
    "scaling_fit",
    "scaling_fit_step",
    "scaling_point",
]


@dataclass(frozen=True)
class ScalingPoint:
    """One trained and evaluated configuration: the model, its tokens and its evaluation."""

    label: str
    """A short name for tables and the plot, e.g. `d64-s600`."""
    model: MoeModelConfig
    """The trained model: N is its active non-embedding parameter count."""
    tokens: int
    """D: the tokens it was trained on (`num_steps * batch_size * seq_len`)."""
    evaluation: str | None = None
    """An evaluate step's output directory (its `results.json`); None for a target not trained."""


@dataclass(frozen=True)
class ScalingFitConfig:
    """Configuration of the scaling_fit step."""

    points: list[ScalingPoint]
    """The grid: every point must have an evaluation."""
    target: ScalingPoint
    """The config whose loss is predicted; with an evaluation, the prediction's error is reported."""
    output: str
    """The step's output directory (`this_output()`)."""
    loss: str = "average"
    """Which loss of `results.json`: `average` (over the validation sets) or one validation set's name."""
    level: float = 0.9
    """Coverage of the prediction interval."""
    resamples: int = 200
    """Bootstrap refits for the interval."""
    seed: int = 0
    huber_delta: float = 1e-2
    """Huber threshold on relative residuals: smaller ones count squared, larger ones linearly, so
    one bad run cannot dominate the fit. Chinchilla used 1e-3 on log residuals (set it so to match)."""


def active_non_embedding_params(model: MoeModelConfig) -> int:
    """N: the parameters one token touches, without the token embedding and the LM head."""
    return parameter_counts(model, vocab_size=0)[1]


def _unwrap(value: Any) -> Any:
    return value.value if isinstance(value, Versioned) else value


def scaling_point(train: Step, evaluation: Step | None = None, label: str | None = None) -> ScalingPoint:
    """The point of a train_moe step (its model and tokens) and the evaluate step that scored it."""
    config = train.config
    model = _unwrap(config.model)
    tokens = _unwrap(config.num_steps) * _unwrap(config.batch_size) * _unwrap(config.seq_len)
    return ScalingPoint(
        label=label or train.name.rsplit("/", 1)[-1],
        model=model,
        tokens=tokens,
        evaluation=None if evaluation is None else output_of(evaluation),
    )


def scaling_fit_step(
    name: str,
    *,
    points: Sequence[ScalingPoint],
    target: ScalingPoint,
    loss: str = "average",
    level: float = 0.9,
    resamples: int = 200,
    seed: int = 0,
    huber_delta: float = 1e-2,
) -> Step:
    """A ready scaling_fit `Step`. Points, target, loss, interval and fit settings are versioned.

    A grid that cannot determine the law (fewer points than its five parameters, or a single model
    size or token budget) is refused here, naming the step and the field, before anything runs.
    """
    try:
        check_grid(
            [active_non_embedding_params(p.model) for p in points],
            [p.tokens for p in points],
            [p.label for p in points],
            minimum=MIN_POINTS,
        )
        check_settings(level, resamples, huber_delta)
    except ScalingFitError as e:
        raise StepDeclarationError(name, e.message, field=e.field) from e
    for i, point in enumerate(points):
        if point.evaluation is None:
            raise StepDeclarationError(
                name, f"point {point.label!r} has no evaluation to fit", field=f"points.{i}.evaluation"
            )

    def declared(point: ScalingPoint) -> ScalingPoint:
        return ScalingPoint(
            label=versioned(point.label),
            model=versioned(point.model),
            tokens=versioned(point.tokens),
            evaluation=point.evaluation,
        )

    return Step(
        name=name,
        fn=scaling_fit,
        config=ScalingFitConfig(
            points=[declared(p) for p in points],
            target=declared(target),
            output=this_output(),
            loss=versioned(loss),
            level=versioned(level),
            resamples=versioned(resamples),
            seed=versioned(seed),
            huber_delta=versioned(huber_delta),
        ),
        description=f"fit {LAW} to {len(points)} points; predict {target.label}",
        resources=Resources(cpus=1),
    )


# -- the step function ------------------------------------------------------------------------------


def _measured_loss(point: ScalingPoint, loss: str, field: str) -> float:
    path = os.path.join(str(point.evaluation), "results.json")
    try:
        results = read_json(path)
    except FileNotFoundError as e:
        raise ScalingFitError(
            f"point {point.label!r}: no results.json at {path}", f"{field}.evaluation"
        ) from e
    if loss == "average":
        value = results.get("average", {}).get("loss")
    else:
        sets = results.get("validation_sets", {})
        if loss not in sets:
            raise ScalingFitError(
                f"point {point.label!r} has no validation set {loss!r}; "
                f"it has {sorted(sets)} (or use 'average')",
                "loss",
            )
        value = sets[loss].get("loss")
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ScalingFitError(
            f"point {point.label!r}: loss {value!r} in {path} is not a positive number", field
        )
    return float(value)


def _row(point: ScalingPoint) -> dict[str, Any]:
    n = active_non_embedding_params(point.model)
    return {
        "label": point.label,
        "active_non_embedding_params": n,
        "total_non_embedding_params": parameter_counts(point.model, vocab_size=0)[0],
        "tokens": point.tokens,
        "compute_flops": 6.0 * n * point.tokens,
    }


def _read_points(config: ScalingFitConfig) -> tuple[list[dict[str, Any]], dict[str, Any], float | None]:
    """The grid's rows with their measured losses, the target's row, and its measured loss."""
    try:
        check_settings(config.level, config.resamples, config.huber_delta)
        rows = [_row(p) for p in config.points]
        check_grid(
            [r["active_non_embedding_params"] for r in rows],
            [r["tokens"] for r in rows],
            [p.label for p in config.points],
            minimum=MIN_POINTS,
        )
        for i, (point, row) in enumerate(zip(config.points, rows, strict=True)):
            if point.evaluation is None:
                raise ScalingFitError(
                    f"point {point.label!r} has no evaluation to fit", f"points.{i}.evaluation"
                )
            row["loss"] = _measured_loss(point, config.loss, f"points.{i}")
        target = _row(config.target)
        measured = (
            None if config.target.evaluation is None else _measured_loss(config.target, config.loss, "target")
        )
    except ScalingFitError as e:
        # The step function does not know its step's name (the executor adds it): say which kind.
        raise ScalingFitError(e.message, e.field, step="scaling_fit") from None
    return rows, target, measured


def scaling_fit(config: ScalingFitConfig) -> dict[str, Any]:
    """Fit the law to the evaluated grid, predict the target, write fit.json and fit.png."""
    import_ml("scipy.optimize", "matplotlib")
    rows, target, measured = _read_points(config)
    n = np.array([r["active_non_embedding_params"] for r in rows], dtype=float)
    d = np.array([r["tokens"] for r in rows], dtype=float)
    loss = np.array([r["loss"] for r in rows])
    law = fit_law(n, d, loss, huber_delta=config.huber_delta)
    quality = goodness_of_fit(law, n, d, loss)
    loo = leave_one_out(n, d, loss, huber_delta=config.huber_delta)
    loo_errors = [p - x for p, x in zip(loo, loss, strict=True) if p is not None]
    for row, predicted, residual, held_out in zip(
        rows, quality["predicted"], quality["residuals"], loo, strict=True
    ):
        row.update(predicted=predicted, residual=residual, leave_one_out_predicted=held_out)
    predicted = float(law.predict(target["active_non_embedding_params"], target["tokens"]))
    low, high = prediction_interval(
        law,
        n,
        d,
        loss,
        target["active_non_embedding_params"],
        target["tokens"],
        level=config.level,
        resamples=config.resamples,
        seed=config.seed,
        huber_delta=config.huber_delta,
    )
    target.update(
        predicted_loss=predicted,
        interval={
            "low": low,
            "high": high,
            "level": config.level,
            "method": "residual bootstrap in log space",
            "resamples": config.resamples,
        },
        measured_loss=measured,
        error=None if measured is None else prediction_error(predicted, low, high, measured),
    )
    result = {
        "law": LAW,
        "N": "active non-embedding parameters",
        "D": "training tokens",
        "loss": config.loss,
        "parameters": law.as_dict(),
        "fit": {
            "method": f"Huber (delta={config.huber_delta:g}) on relative residuals, variable projection "
            "(NNLS for E, A, B; grid then Nelder-Mead for alpha, beta)",
            "num_points": len(rows),
            "objective": law.objective,
            "r2": quality["r2"],
            "rmse": quality["rmse"],
            "rmse_log": quality["rmse_log"],
            "max_abs_residual": quality["max_abs_residual"],
            "leave_one_out_rmse": float(np.sqrt(np.mean(np.square(loo_errors)))) if loo_errors else None,
        },
        "points": rows,
        "target": target,
    }
    write_json(os.path.join(config.output, "fit.json"), result)
    plot_fit(result, law, os.path.join(config.output, "fit.png"))
    print(format_result(result), flush=True)
    return result


def format_result(result: dict[str, Any]) -> str:
    """A few lines: the law, goodness of fit, and the target's prediction (and error)."""
    p, fit, t = result["parameters"], result["fit"], result["target"]
    loo = fit["leave_one_out_rmse"]  # None when no n - 1 points can determine the law
    lines = [
        f"L(N, D) = {p['E']:.3f} + {p['A']:.4g}/N^{p['alpha']:.3f} + {p['B']:.4g}/D^{p['beta']:.3f}",
        f"{fit['num_points']} points: R² {fit['r2']:.4f}, RMSE {fit['rmse']:.4f}, "
        f"leave-one-out RMSE {'-' if loo is None else f'{loo:.4f}'}",
        f"target {t['label']} (N={t['active_non_embedding_params']:,}, D={t['tokens']:,}): predicted "
        f"{t['predicted_loss']:.4f}, {t['interval']['level']:.0%} interval "
        f"[{t['interval']['low']:.4f}, {t['interval']['high']:.4f}]",
    ]
    if t["error"] is not None:
        e = t["error"]
        inside = "inside" if e["inside_interval"] else "outside"
        lines.append(
            f"measured {t['measured_loss']:.4f}: error {e['absolute']:+.4f} ({e['relative']:+.2%}), "
            f"{inside} the interval"
        )
    return "\n".join(lines)


def preview(config: ScalingFitConfig) -> str:
    """The grid, for `drydock plan`: N, D and compute of every point and of the target."""
    rows = [_row(p) for p in config.points]
    target = _row(config.target)
    width = max(len(r["label"]) for r in [*rows, target]) + 2
    lines = [
        f"fit {LAW} to {len(rows)} points (N: active non-embedding parameters, D: tokens); "
        f"predict the target with a {config.level:.0%} interval",
        f"  {'point':<{width}}{'N':>12}{'D':>14}{'6ND (FLOPs)':>14}",
    ]
    for r in [*rows, target]:
        lines.append(
            f"  {r['label']:<{width}}{r['active_non_embedding_params']:>12,}{r['tokens']:>14,}"
            f"{r['compute_flops']:>14.3g}"
        )
    lines[-1] += "  <- target" + ("" if config.target.evaluation is not None else " (not trained)")
    return "\n".join(lines)


def report(config: ScalingFitConfig) -> str | None:
    """The end-of-run summary (pipeline.run.hooks): the law, its fit, the prediction, where files are."""
    path = os.path.join(config.output, "fit.json")
    if not exists(path):
        return None
    result = read_json(path)
    lines = [f"  {line}" for line in format_result(result).splitlines()]
    lines.append(f"  fit:  {path}")
    lines.append(f"  plot: {os.path.join(config.output, 'fit.png')}")
    return "\n".join(lines)


step_function(scaling_fit, preview=preview, report=report)
