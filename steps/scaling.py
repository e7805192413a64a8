"""The `scaling_fit` step: fit L(N, D) = E + A/N^alpha + B/D^beta to evaluated runs, predict a target.

Inputs are grid points (each an evaluate step's output, with the model and the tokens it was
trained on) and a target config, optionally with its own evaluation. N is the model's *active
non-embedding* parameter count (`active_non_embedding_params`): active because an MoE token only
touches its routed experts, so compute per token follows active, not total, parameters; without
the token embedding and LM head because at this size they are most of the model and scale with
the vocabulary, not with capacity (Kaplan et al. 2020 saw the cleaner law without them). D is the
number of training tokens, `num_steps * batch_size * seq_len`.

The fitting math is pure functions of arrays (`fit_law`, `goodness_of_fit`, `leave_one_out`,
`prediction_interval`, `prediction_error`), tested directly. The fit minimizes the Huber loss
(delta 0.01) of the relative residuals, which to first order are Chinchilla's log residuals
(Hoffmann et al. 2022, appendix D.2), by variable projection: for given exponents E, A and B are
a non-negative least-squares problem, so only (alpha, beta) is searched, over a grid and then by
Nelder-Mead. The prediction interval is a residual bootstrap: the fitted log losses plus log
residuals drawn with replacement (inflated by sqrt(n / (n - 5)) for the degrees of freedom the
fit used), refitted each time.

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
from steps.files import exists, read_json, save_figure, write_json
from steps.moe import MoeModelConfig, parameter_counts

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

NUM_PARAMETERS = 5
"""E, A, alpha, B, beta."""
LAW = "L(N, D) = E + A / N^alpha + B / D^beta"


class ScalingFitError(ValueError):
    """Points that cannot be fitted, or an input that is missing or malformed; names the field."""

    def __init__(self, message: str, field: str, step: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(f"{step + ', ' if step else ''}field `{field}`: {message}")


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
        _check_grid(
            [active_non_embedding_params(p.model) for p in points],
            [p.tokens for p in points],
            [p.label for p in points],
            minimum=MIN_POINTS,
        )
        _check_settings(level, resamples, huber_delta)
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


# -- the law and its fit (pure) ---------------------------------------------------------------------


@dataclass(frozen=True)
class LawFit:
    """A fitted L(N, D) = E + A / N^alpha + B / D^beta."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float
    objective: float
    """The Huber loss of the relative residuals at the optimum."""

    def predict(self, n: Any, d: Any) -> Any:
        """Predicted loss at N = `n`, D = `d` (scalars or arrays)."""
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        return self.E + self.A / n**self.alpha + self.B / d**self.beta

    def as_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "alpha": self.alpha, "B": self.B, "beta": self.beta}


MIN_POINTS = NUM_PARAMETERS + 1
"""What the step needs: five points determine the law, and an interval needs residuals left over."""


def _check_grid(
    n: Sequence[float], d: Sequence[float], labels: Sequence[str] | None = None, minimum: int = NUM_PARAMETERS
) -> None:
    """Raise `ScalingFitError(message, field)` if these points cannot determine the law."""
    if len(n) < NUM_PARAMETERS:
        raise ScalingFitError(
            f"{len(n)} point(s) cannot fit the {NUM_PARAMETERS} parameters of {LAW}; "
            f"give at least {MIN_POINTS} (e.g. 3 model sizes x 2 token budgets)",
            "points",
        )
    if len(n) < minimum:
        raise ScalingFitError(
            f"{len(n)} points fit the {NUM_PARAMETERS} parameters of {LAW} exactly, leaving no residuals "
            f"to estimate the prediction's interval from; give at least {minimum}",
            "points",
        )
    for values, what in ((n, "model size (N)"), (d, "token budget (D)")):
        if len(set(values)) < 2:
            raise ScalingFitError(
                f"every point has the same {what}: vary it across at least 2 values", "points"
            )
    for i, (a, b) in enumerate(zip(n, d, strict=True)):
        if not (a > 0 and b > 0):
            name = labels[i] if labels else str(i)
            raise ScalingFitError(f"point {name!r}: N={a} and D={b} must be positive", f"points.{i}")


def _check_settings(level: float, resamples: int, huber_delta: float) -> None:
    if not 0 < level < 1:
        raise ScalingFitError(f"interval level must be strictly between 0 and 1, got {level}", "level")
    if resamples < 20:
        raise ScalingFitError(f"resamples must be at least 20 for an interval, got {resamples}", "resamples")
    if not huber_delta > 0:
        raise ScalingFitError(f"huber_delta must be positive, got {huber_delta}", "huber_delta")


def _as_arrays(n: Any, d: Any, loss: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, d, loss = (np.asarray(x, dtype=float).ravel() for x in (n, d, loss))
    if not len(n) == len(d) == len(loss):
        raise ScalingFitError(f"N, D and loss differ in length: {len(n)}, {len(d)}, {len(loss)}", "points")
    _check_grid(list(n), list(d))
    bad = [i for i, v in enumerate(loss) if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ScalingFitError(f"losses must be finite and positive; point(s) {bad} are {loss[bad]}", "points")
    return n, d, loss


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    return np.where(np.abs(r) <= delta, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta))


def _linear_part(x: np.ndarray, y: np.ndarray, loss: np.ndarray, delta: float) -> tuple[np.ndarray, float]:
    """(E, A', B') >= 0 minimizing the Huber loss of the relative residuals of E + A'x + B'y.

    For fixed exponents the law is linear in its coefficients: non-negative least squares on
    relative residuals (to first order the log residuals), with Huber weights by iterative
    reweighting.
    """
    from scipy.optimize import nnls

    design = np.stack([np.ones_like(x), x, y], axis=1) / loss[:, None]
    weights = np.ones_like(x)
    for _ in range(30):
        root = np.sqrt(weights)
        coef, _ = nnls(design * root[:, None], root)
        r = design @ coef - 1.0
        new = np.where(np.abs(r) <= delta, 1.0, delta / np.maximum(np.abs(r), 1e-300))
        if np.allclose(new, weights, rtol=1e-6, atol=1e-9):
            break
        weights = new
    return coef, float(_huber(r, delta).sum())


def _profile(
    exponents: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, loss: np.ndarray, delta: float
) -> float:
    """The best objective over E, A, B for fixed (alpha, beta); log N and log D are centred."""
    alpha, beta = exponents
    return _linear_part(np.exp(-alpha * log_n), np.exp(-beta * log_d), loss, delta)[1]


EXPONENT_RANGE = (0.0, 2.5)
_GRID = np.linspace(0.05, 2.0, 16)  # Nelder-Mead refines from the best of it


def fit_law(n: Any, d: Any, loss: Any, *, huber_delta: float = 1e-2, start: LawFit | None = None) -> LawFit:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to losses at (N, D).

    Variable projection: for given exponents the best E, A, B >= 0 are a small non-negative
    least-squares problem (Huber loss of the relative residuals, `_linear_part`), so only
    (alpha, beta) is searched: over a grid, then refined by Nelder-Mead within `EXPONENT_RANGE`.
    That finds the global optimum of a problem whose five-parameter form (Chinchilla's L-BFGS in
    log space) crawls along a flat valley where E trades off against A and B. `start` (a previous
    fit, as bootstrap refits use) replaces the grid. Raises `ScalingFitError` naming the field if
    the points cannot determine the law.
    """
    from scipy.optimize import minimize

    n, d, loss = _as_arrays(n, d, loss)
    # Centred logs keep x and y near 1, so the least-squares problem is well conditioned.
    mid_n, mid_d = float(np.log(n).mean()), float(np.log(d).mean())
    log_n, log_d = np.log(n) - mid_n, np.log(d) - mid_d
    if start is None:
        scores = [
            (_profile(np.array([a, b]), log_n, log_d, loss, huber_delta), a, b) for a in _GRID for b in _GRID
        ]
        _, a0, b0 = min(scores)
        first = np.array([a0, b0])
    else:
        first = np.array([start.alpha, start.beta])
    result = minimize(
        _profile,
        first,
        args=(log_n, log_d, loss, huber_delta),
        method="Nelder-Mead",
        bounds=[EXPONENT_RANGE, EXPONENT_RANGE],
        options={"xatol": 1e-5, "fatol": 1e-12, "maxiter": 2000},
    )
    alpha, beta = (float(v) for v in result.x)
    (e, a, b), value = _linear_part(np.exp(-alpha * log_n), np.exp(-beta * log_d), loss, huber_delta)
    return LawFit(
        E=float(e),
        A=float(a) * math.exp(alpha * mid_n),
        alpha=alpha,
        B=float(b) * math.exp(beta * mid_d),
        beta=beta,
        objective=value,
    )


def goodness_of_fit(law: LawFit, n: Any, d: Any, loss: Any) -> dict[str, Any]:
    """R² and RMSE of the loss, RMSE of the log loss, and per-point predictions and residuals."""
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    predicted = law.predict(n, d)
    residuals = loss - predicted
    total = float(((loss - loss.mean()) ** 2).sum())
    return {
        "r2": 1.0 - float((residuals**2).sum()) / total if total > 0 else float("nan"),
        "rmse": float(np.sqrt((residuals**2).mean())),
        "rmse_log": float(np.sqrt(((np.log(loss) - np.log(predicted)) ** 2).mean())),
        "max_abs_residual": float(np.abs(residuals).max()),
        "predicted": [float(x) for x in predicted],
        "residuals": [float(x) for x in residuals],
    }


def leave_one_out(
    n: Any, d: Any, loss: Any, *, huber_delta: float = 1e-2, start: LawFit | None = None
) -> list[float | None]:
    """Each point's loss as predicted by a fit to the other points (None where they cannot fit).

    `start` (e.g. the fit to all points) starts each refit instead of the grid of starts.
    """
    n, d, loss = _as_arrays(n, d, loss)
    out: list[float | None] = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        try:
            law = fit_law(n[keep], d[keep], loss[keep], huber_delta=huber_delta, start=start)
        except ScalingFitError:
            out.append(None)
            continue
        out.append(float(law.predict(n[i], d[i])))
    return out


def prediction_interval(
    law: LawFit,
    n: Any,
    d: Any,
    loss: Any,
    target_n: float,
    target_d: float,
    *,
    level: float = 0.9,
    resamples: int = 200,
    seed: int = 0,
    huber_delta: float = 1e-2,
) -> tuple[float, float]:
    """A `level` interval for the loss at (target_n, target_d), by residual bootstrap in log space.

    Each resample adds log residuals drawn with replacement (scaled by sqrt(n / (n - 5)), since
    the fit's five parameters shrink the residuals it leaves) to the fitted log losses, refits
    from `law`, and predicts the target; the interval is the central `level` of those predictions.
    """
    _check_settings(level, resamples, huber_delta)
    n, d, loss = _as_arrays(n, d, loss)
    _check_grid(list(n), list(d), minimum=MIN_POINTS)
    fitted = np.log(law.predict(n, d))
    residuals = (np.log(loss) - fitted) * math.sqrt(len(n) / (len(n) - NUM_PARAMETERS))
    rng = np.random.default_rng(seed)
    predictions = []
    for _ in range(resamples):
        sample = np.exp(fitted + rng.choice(residuals, size=len(n), replace=True))
        refit = fit_law(n, d, sample, huber_delta=huber_delta, start=law)
        predictions.append(float(refit.predict(target_n, target_d)))
    low, high = np.quantile(predictions, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def prediction_error(predicted: float, low: float, high: float, measured: float) -> dict[str, Any]:
    """How far the measured loss is from the prediction, and whether the interval holds it."""
    if not (math.isfinite(measured) and measured > 0):
        raise ScalingFitError(
            f"the target's measured loss must be finite and positive, got {measured}", "target"
        )
    absolute = measured - predicted
    return {
        "absolute": absolute,
        "relative": absolute / measured,
        "inside_interval": bool(low <= measured <= high),
    }


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


def scaling_fit(config: ScalingFitConfig) -> dict[str, Any]:
    """Fit the law to the evaluated grid, predict the target, write fit.json and fit.png."""
    try:
        _check_settings(config.level, config.resamples, config.huber_delta)
        rows = [_row(p) for p in config.points]
        _check_grid(
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


# -- the plot -------------------------------------------------------------------------------------------


def plot_fit(result: dict[str, Any], law: LawFit, png_path: str) -> None:
    """Loss against N per token budget with the fitted curves and the target; predicted vs measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    rows, target = result["points"], result["target"]
    budgets = sorted({r["tokens"] for r in rows} | {target["tokens"]})
    colors = plt.get_cmap("viridis")(np.linspace(0.0, 0.85, len(budgets)))
    all_n = [r["active_non_embedding_params"] for r in rows] + [target["active_non_embedding_params"]]
    curve_n = np.geomspace(min(all_n) / 1.3, max(all_n) * 1.3, 100)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    for color, tokens in zip(colors, budgets, strict=True):
        grid = [r for r in rows if r["tokens"] == tokens]
        label = None if grid else f"fit at the target's D = {tokens:,}"
        style = "-" if grid else "--"
        left.plot(curve_n, law.predict(curve_n, tokens), style, color=color, linewidth=1.2, label=label)
        if grid:
            left.plot(
                [r["active_non_embedding_params"] for r in grid],
                [r["loss"] for r in grid],
                "o",
                color=color,
                label=f"D = {tokens:,} tokens",
            )
    t_n, interval = target["active_non_embedding_params"], target["interval"]
    predicted = target["predicted_loss"]
    left.errorbar(
        [t_n],
        [predicted],
        yerr=[[predicted - interval["low"]], [interval["high"] - predicted]],
        fmt="D",
        color="tab:red",
        capsize=4,
        label=f"target prediction, {interval['level']:.0%} interval (D = {target['tokens']:,})",
    )
    if target["measured_loss"] is not None:
        left.plot(
            [t_n], [target["measured_loss"]], "*", color="black", markersize=12, label="target measured"
        )
    left.set_xscale("log")
    # A short log axis gets too few (or overlapping) labels: label the N of the points instead.
    ticks = sorted(set(all_n))
    left.set_xticks(ticks, [f"{v / 1000:.0f}k" for v in ticks])
    left.xaxis.set_minor_formatter(NullFormatter())
    left.set_xlabel("N: active non-embedding parameters")
    left.set_ylabel(f"validation loss ({result['loss']}, nats/token)")
    left.set_title(
        "L = {E:.2f} + {A:.3g}/N^{alpha:.2f} + {B:.3g}/D^{beta:.2f}".format(**result["parameters"]),
        fontsize=9,
    )
    left.grid(alpha=0.3, which="both")
    left.legend(fontsize=7)

    measured = [r["loss"] for r in rows]
    fitted = [r["predicted"] for r in rows]
    right.plot(measured, fitted, "o", color="tab:blue", label="grid points (in-sample)")
    held = [
        (r["loss"], r["leave_one_out_predicted"]) for r in rows if r["leave_one_out_predicted"] is not None
    ]
    if held:
        right.plot(*zip(*held, strict=True), "x", color="tab:gray", label="grid points (leave-one-out)")
    if target["measured_loss"] is not None:
        right.errorbar(
            [target["measured_loss"]],
            [predicted],
            yerr=[[predicted - interval["low"]], [interval["high"] - predicted]],
            fmt="D",
            color="tab:red",
            capsize=4,
            label="target",
        )
    values = measured + fitted + [predicted, interval["low"], interval["high"]]
    if target["measured_loss"] is not None:
        values.append(target["measured_loss"])
    lo, hi = min(values), max(values)
    pad = 0.05 * (hi - lo)
    right.plot([lo - pad, hi + pad], [lo - pad, hi + pad], ":", color="black", linewidth=1)
    right.set_xlabel("measured loss")
    right.set_ylabel("predicted loss")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png_path)
    plt.close(fig)
