"""The law L(N, D) = E + A/N^alpha + B/D^beta and its fit, as pure functions of arrays.

The fit minimizes the Huber loss (delta 0.01) of the relative residuals, which to first order are
Chinchilla's log residuals (Hoffmann et al. 2022, appendix D.2), by variable projection: for
given exponents E, A and B are a non-negative least-squares problem, so only (alpha, beta) is
searched, over a grid and then by Nelder-Mead. The prediction interval is a residual bootstrap:
the fitted log losses plus log residuals drawn with replacement (inflated by sqrt(n / (n - 5))
for the degrees of freedom the fit used), refitted each time. No I/O here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "LAW",
    "MIN_POINTS",
    "NUM_PARAMETERS",
    "LawFit",
    "ScalingFitError",
    "check_grid",
    "check_settings",
    "fit_law",
    "goodness_of_fit",
    "leave_one_out",
    "prediction_error",
    "prediction_interval",
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


def check_grid(
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


def check_settings(level: float, resamples: int, huber_delta: float) -> None:
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
    check_grid(list(n), list(d))
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
    check_settings(level, resamples, huber_delta)
    n, d, loss = _as_arrays(n, d, loss)
    check_grid(list(n), list(d), minimum=MIN_POINTS)
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
