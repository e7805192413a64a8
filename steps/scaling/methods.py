"""The scaling fit's methods, each fitted to the grid and checked on its own largest points: the
laws of `steps.scaling.law` and the IsoFLOP method of `steps.scaling.isoflop`, with the target's
prediction and interval. Pure functions of arrays; the step is `steps.scaling.fit`."""

from __future__ import annotations

from typing import Any

import numpy as np

from steps.scaling.fit_config import ScalingFitConfig
from steps.scaling.isoflop import IsoflopFit, IsoflopUnavailable, fit_isoflop, isoflop_interval
from steps.scaling.law import (
    FORMS,
    REFINED_STARTS,
    LawFit,
    fit_law,
    goodness_of_fit,
    leave_one_out,
    prediction_error,
    prediction_interval,
)

__all__ = ["fit_isoflop_method", "fit_law_method", "pre_check", "prediction_of"]


def prediction_of(
    predicted: float, low: float, high: float, config: ScalingFitConfig, measured: float | None, how: str
) -> dict[str, Any]:
    """The target's entry for one method: its prediction, interval and, if measured, its error."""
    return {
        "predicted_loss": predicted,
        "interval": {
            "low": low,
            "high": high,
            "level": config.level,
            "method": how,
            "resamples": config.resamples,
        },
        "error": None if measured is None else prediction_error(predicted, low, high, measured),
    }


def fit_law_method(
    form: str,
    config: ScalingFitConfig,
    arrays: tuple[np.ndarray, ...],
    target: dict[str, Any],
    measured: float | None,
    checked: list[int],
) -> tuple[dict[str, Any], LawFit, list[float | None]]:
    """The law's entry of fit.json, the law, and each grid point's leave-one-out prediction."""
    n, d, loss = arrays
    law = fit_law(n, d, loss, form=form, huber_delta=config.huber_delta)
    quality = goodness_of_fit(law, n, d, loss)
    loo = leave_one_out(n, d, loss, form=form, huber_delta=config.huber_delta, start=law)
    loo_errors = [p - x for p, x in zip(loo, loss, strict=True) if p is not None]
    t_n, t_d = target["active_non_embedding_params"], target["tokens"]
    low, high = prediction_interval(
        law,
        n,
        d,
        loss,
        t_n,
        t_d,
        level=config.level,
        resamples=config.resamples,
        seed=config.seed,
        huber_delta=config.huber_delta,
    )
    method = {
        "kind": "law",
        "law": FORMS[form].law,
        "parameters": law.as_dict(),
        "fit": {
            "method": f"Huber (delta={config.huber_delta:g}) on log residuals, L-BFGS-B from the best "
            f"{REFINED_STARTS} of a grid of 4,500 starts (Hoffmann et al. 2022, appendix D.2)",
            "num_points": len(n),
            "objective": law.objective,
            "r2": quality["r2"],
            "rmse": quality["rmse"],
            "rmse_log": quality["rmse_log"],
            "max_abs_residual": quality["max_abs_residual"],
            "leave_one_out_rmse": float(np.sqrt(np.mean(np.square(loo_errors)))) if loo_errors else None,
        },
        "pre_check": pre_check([loo[i] for i in checked], [float(loss[i]) for i in checked]),
        "target": prediction_of(
            float(law.predict(t_n, t_d)), low, high, config, measured, "residual bootstrap in log space"
        ),
    }
    return method, law, loo


def fit_isoflop_method(
    config: ScalingFitConfig,
    arrays: tuple[np.ndarray, ...],
    target: dict[str, Any],
    measured: float | None,
    checked: list[int],
) -> tuple[dict[str, Any], IsoflopFit | None]:
    """The IsoFLOP method's entry of fit.json and its fit (None when the grid cannot carry it)."""
    n, d, loss = arrays
    try:
        fit = fit_isoflop(n, d, loss)
    except IsoflopUnavailable as e:
        return {"kind": "isoflop", "unavailable": e.message}, None
    held_out: list[float | None] = []
    for i in checked:
        keep = np.arange(len(n)) != i
        try:
            held_out.append(fit_isoflop(n[keep], d[keep], loss[keep]).predict(n[i], d[i]))
        except IsoflopUnavailable:
            held_out.append(None)
    t_n, t_d = target["active_non_embedding_params"], target["tokens"]
    low, high = isoflop_interval(
        n, d, loss, t_n, t_d, level=config.level, resamples=config.resamples, seed=config.seed
    )
    best_n, best_loss = fit.optimal(6.0 * t_n * t_d)
    method = {
        "kind": "isoflop",
        **fit.as_dict(),
        "pre_check": pre_check(held_out, [float(loss[i]) for i in checked]),
        "target": {
            **prediction_of(
                fit.predict(t_n, t_d),
                low,
                high,
                config,
                measured,
                "residual bootstrap of the grid's points about each size's line in log D",
            ),
            "optimal_params": best_n,
            "optimal_loss": best_loss,
        },
    }
    return method, fit


def pre_check(predicted: list[float | None], measured: list[float]) -> dict[str, Any]:
    """A method's pre-check: its predictions of the held-out points and their relative errors."""
    errors = [None if p is None else (m - p) / m for p, m in zip(predicted, measured, strict=True)]
    known = [abs(e) for e in errors if e is not None]
    return {
        "predicted": predicted,
        "relative_errors": errors,
        "mean_abs_relative_error": float(np.mean(known)) if len(known) == len(errors) else None,
    }
