"""The `scaling_fit` step: fit scaling laws to evaluated runs, check them, predict a target.

Inputs are grid points (each an evaluate step's output, with the model and the tokens it was
trained on) and a target config, optionally with its own evaluation. N is the model's *active
non-embedding* parameter count (`active_non_embedding_params`): active because an MoE token only
touches its routed experts, so compute per token follows active, not total, parameters; without
the token embedding and LM head because at this size they are most of the model and scale with
the vocabulary, not with capacity (Kaplan et al. 2020 saw the cleaner law without them). D is the
number of training tokens, `num_steps * batch_size * seq_len`.

Three methods, side by side: the laws of `steps.scaling.law` (Chinchilla's additive
E + A/N^alpha + B/D^beta and Kaplan's form with an N x D interaction, both fitted as Hoffmann et
al. did), and the IsoFLOP method of `steps.scaling.isoflop`. Before any of them predicts the
target, each is checked on the grid itself: each of its `pre_check` largest-compute points is
predicted by the method fitted to the others. The method with the smallest mean error there
gives the prediction; the others are reported beside it. The picture is `steps.scaling.plot`.

Outputs, under the step's directory:

    fit.json   per method: its parameters, goodness of fit (R², RMSE, leave-one-out), its
               pre-check errors, the target's predicted loss with its interval and, when the
               target was evaluated, the error against the measured loss; which method was chosen
    fit.png    loss against N, one colour per token budget, the chosen method's curves, every
               method's prediction with its interval and the measured target; beside it the
               chosen method's predicted against measured loss
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline import (
    Resources,
    Step,
    StepDeclarationError,
    output_of,
    step_function,
    this_output,
    unversioned,
    versioned,
)
from steps.files import exists, read_json, write_json
from steps.imports import import_ml
from steps.models import parameter_counts
from steps.scaling.fit_config import ScalingFitConfig, ScalingPoint, active_non_embedding_params
from steps.scaling.isoflop import IsoflopUnavailable, isoflop_profiles
from steps.scaling.law import HUBER_DELTA, MIN_POINTS, ScalingFitError, check_form, check_grid, check_settings
from steps.scaling.methods import fit_isoflop_method, fit_law_method
from steps.scaling.plot import plot_fit

__all__ = [
    "ScalingFitConfig",
    "ScalingPoint",
    "active_non_embedding_params",
    "scaling_fit",
    "scaling_fit_step",
    "scaling_point",
]


def scaling_point(train: Step, evaluation: Step | None = None, label: str | None = None) -> ScalingPoint:
    """The point of a train_moe step (its model and tokens) and the evaluate step that scored it."""
    config = train.config
    model = unversioned(config.model)
    tokens = unversioned(config.num_steps) * unversioned(config.batch_size) * unversioned(config.seq_len)
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
    huber_delta: float = HUBER_DELTA,
    laws: Sequence[str] = ("chinchilla", "kaplan"),
    isoflop: bool = True,
    pre_check: int = 3,
) -> Step:
    """A ready scaling_fit `Step`. Points, target, loss, methods, interval and fit settings are versioned.

    A grid that cannot determine a law (fewer points than its five parameters, or a single model
    size or token budget), an unknown law or a bad setting is refused here, naming the step and the
    field, before anything runs.
    """
    try:
        check_grid(
            [active_non_embedding_params(p.model) for p in points],
            [p.tokens for p in points],
            [p.label for p in points],
            minimum=MIN_POINTS,
        )
        _check_config(
            ScalingFitConfig(
                points=list(points),
                target=target,
                output="",
                level=level,
                resamples=resamples,
                huber_delta=huber_delta,
                laws=list(laws),
                isoflop=isoflop,
                pre_check=pre_check,
            )
        )
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
            laws=versioned(list(laws)),
            isoflop=versioned(isoflop),
            pre_check=versioned(pre_check),
        ),
        description=f"fit {', '.join(_methods(points, laws, isoflop)[0])} to {len(points)} points; "
        f"predict {target.label}",
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


def _methods(
    points: Sequence[ScalingPoint], laws: Sequence[str], isoflop: bool
) -> tuple[list[str], str | None]:
    """The methods the fit will run on this grid, and why IsoFLOP will not where it is asked for but
    the grid cannot give it its profiles (three sizes on each of three compute budgets): the plan
    must not promise a method the run then skips."""
    if not isoflop:
        return list(laws), None
    n = [active_non_embedding_params(p.model) for p in points]
    try:
        isoflop_profiles(n, [p.tokens for p in points], [1.0] * len(points))  # depends on N and D only
    except IsoflopUnavailable as e:
        return list(laws), e.message
    return [*laws, "isoflop"], None


def _row(point: ScalingPoint) -> dict[str, Any]:
    n = active_non_embedding_params(point.model)
    return {
        "label": point.label,
        "active_non_embedding_params": n,
        "total_non_embedding_params": parameter_counts(point.model, vocab_size=0)[0],
        "tokens": point.tokens,
        "compute_flops": 6.0 * n * point.tokens,
    }


def _check_config(config: ScalingFitConfig) -> None:
    check_settings(config.level, config.resamples, config.huber_delta)
    if not config.laws and not config.isoflop:
        raise ScalingFitError("no method to fit: name at least one law or set isoflop", "laws")
    for form in config.laws:
        check_form(form)
    if len(set(config.laws)) != len(config.laws):
        raise ScalingFitError(f"a law is named twice: {list(config.laws)}", "laws")
    if not 1 <= config.pre_check < len(config.points):
        raise ScalingFitError(
            f"pre_check holds out the largest points one at a time: give 1 to {len(config.points) - 1}, "
            f"got {config.pre_check}",
            "pre_check",
        )


def _read_points(config: ScalingFitConfig) -> tuple[list[dict[str, Any]], dict[str, Any], float | None]:
    """The grid's rows with their measured losses, the target's row, and its measured loss."""
    try:
        _check_config(config)
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


def _pre_check_points(rows: list[dict[str, Any]], count: int) -> list[int]:
    """The indices of the `count` points of largest compute: the ones a prediction leans on most."""
    return sorted(range(len(rows)), key=lambda i: -rows[i]["compute_flops"])[:count]


def scaling_fit(config: ScalingFitConfig) -> dict[str, Any]:
    """Fit each method to the evaluated grid, check it on the grid's largest points, predict the
    target with each; the method the pre-check trusts most gives the prediction. Writes fit.json
    and fit.png."""
    import_ml("scipy.optimize", "matplotlib")
    rows, target, measured = _read_points(config)
    arrays = (
        np.array([r["active_non_embedding_params"] for r in rows], dtype=float),
        np.array([r["tokens"] for r in rows], dtype=float),
        np.array([r["loss"] for r in rows]),
    )
    checked = _pre_check_points(rows, config.pre_check)
    methods: dict[str, dict[str, Any]] = {}
    predictors: dict[str, Any] = {}
    held_out: dict[str, list[float | None]] = {}
    for form in config.laws:
        methods[form], predictors[form], held_out[form] = fit_law_method(
            form, config, arrays, target, measured, checked
        )
    if config.isoflop:
        methods["isoflop"], iso = fit_isoflop_method(config, arrays, target, measured, checked)
        if iso is not None:
            predictors["isoflop"] = iso
    scores = {
        name: m["pre_check"]["mean_abs_relative_error"]
        for name, m in methods.items()
        if "pre_check" in m and m["pre_check"]["mean_abs_relative_error"] is not None
    }
    if not scores:
        raise ScalingFitError(
            "no method could predict the held-out points of the pre-check", "pre_check", step="scaling_fit"
        )
    chosen = min(scores, key=lambda name: scores[name])
    for i, row in enumerate(rows):
        row["predicted"] = {
            name: float(model.predict(row["active_non_embedding_params"], row["tokens"]))
            for name, model in predictors.items()
        }
        row["leave_one_out_predicted"] = {name: loo[i] for name, loo in held_out.items()}
    target.update(methods[chosen]["target"], method=chosen, measured_loss=measured)
    result = {
        "N": "active non-embedding parameters",
        "D": "training tokens",
        "loss": config.loss,
        "pre_check": {
            "points": [rows[i]["label"] for i in checked],
            "mean_abs_relative_error": scores,
            "chosen": chosen,
            "rule": "each of the grid's largest-compute points is predicted by the method fitted to the "
            "others; the method with the smallest mean absolute relative error predicts the target",
        },
        "methods": methods,
        "points": rows,
        "target": target,
    }
    write_json(os.path.join(config.output, "fit.json"), result)
    plot_fit(result, predictors, os.path.join(config.output, "fit.png"))
    print(format_result(result), flush=True)
    return result


def format_result(result: dict[str, Any]) -> str:
    """A few lines: each method's prediction (and error), the pre-check, the chosen prediction."""
    t = result["target"]
    lines = [
        f"target {t['label']} (N={t['active_non_embedding_params']:,}, D={t['tokens']:,}, "
        f"C={t['compute_flops']:.3g})"
        + ("" if t["measured_loss"] is None else f": measured {t['measured_loss']:.4f}")
    ]
    check = result["pre_check"]["mean_abs_relative_error"]
    for name, m in result["methods"].items():
        if "unavailable" in m:
            lines.append(f"  {name:<11} unavailable: {m['unavailable']}")
            continue
        p = m["target"]
        score = check.get(name)
        line = (
            f"  {name:<11} predicted {p['predicted_loss']:.4f} [{p['interval']['low']:.4f}, "
            f"{p['interval']['high']:.4f}]"
        )
        if p["error"] is not None:
            line += f", error {p['error']['relative']:+.2%}"
        line += f"; pre-check {'-' if score is None else f'{score:.2%}'}"
        if "fit" in m:
            line += f", leave-one-out RMSE {m['fit']['leave_one_out_rmse'] or float('nan'):.4f}"
        lines.append(line)
    e = t["error"]
    verdict = (
        ""
        if e is None
        else f": error {e['relative']:+.2%}, {'inside' if e['inside_interval'] else 'outside'} the interval"
    )
    lines.append(
        f"prediction ({t['method']}, chosen by the pre-check on {', '.join(result['pre_check']['points'])}): "
        f"{t['predicted_loss']:.4f}, {t['interval']['level']:.0%} interval "
        f"[{t['interval']['low']:.4f}, {t['interval']['high']:.4f}]{verdict}"
    )
    return "\n".join(lines)


def preview(config: ScalingFitConfig) -> str:
    """The grid, for `drydock plan`: N, D and compute of every point and of the target."""
    rows = [_row(p) for p in config.points]
    target = _row(config.target)
    width = max(len(r["label"]) for r in [*rows, target]) + 2
    # Columns as wide as their largest number, and two spaces more.
    n_width = max(len(f"{r['active_non_embedding_params']:,}") for r in [*rows, target]) + 2
    d_width = max(len(f"{r['tokens']:,}") for r in [*rows, target]) + 2
    methods, why_not = _methods(config.points, config.laws, config.isoflop)
    lines = [
        f"fit {', '.join(methods)} to {len(rows)} points "
        f"(N: active non-embedding parameters, D: tokens); check each on the {config.pre_check} largest; "
        f"predict the target with a {config.level:.0%} interval",
        *([f"  isoflop cannot run on this grid: {why_not}"] if why_not else []),
        f"  {'point':<{width}}{'N':>{n_width}}{'D':>{d_width}}{'6ND (FLOPs)':>14}",
    ]
    for r in [*rows, target]:
        lines.append(
            f"  {r['label']:<{width}}{r['active_non_embedding_params']:>{n_width},}{r['tokens']:>{d_width},}"
            f"{r['compute_flops']:>14.3g}"
        )
    lines[-1] += "  <- target" + ("" if config.target.evaluation is not None else " (not trained)")
    return "\n".join(lines)


def report(config: ScalingFitConfig) -> str | None:
    """The end-of-run summary (pipeline.run.records.hooks): the law, its fit, the prediction, where
    files are."""
    path = os.path.join(config.output, "fit.json")
    if not exists(path):
        return None
    result = read_json(path)
    lines = [f"  {line}" for line in format_result(result).splitlines()]
    lines.append(f"  fit:  {path}")
    lines.append(f"  plot: {os.path.join(config.output, 'fit.png')}")
    return "\n".join(lines)


step_function(scaling_fit, preview=preview, report=report)
