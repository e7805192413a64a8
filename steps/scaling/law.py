"""Scaling laws L(N, D) and their fit as in Hoffmann et al. (2022), as pure functions of arrays.

Two forms, both with five parameters and an irreducible loss E:

    chinchilla   L = E + A / N^alpha + B / D^beta              (Hoffmann et al. 2022, eq. 2)
    kaplan       L = E + ((N_c / N)^(alpha / beta) + D_c / D)^beta   (Kaplan et al. 2020, eq. 1.5, plus E)

Chinchilla's form is additive: a larger model gains the same from more data as a smaller one.
Kaplan's is not: data and parameters share one bracket, so when data is short a larger model
gains less from its size, and when data is long it gains more (the grid's N x D interaction).

The fit is Hoffmann's, appendix D.2: both forms are written in log space (log L = LSE(e,
a - alpha log N, b - beta log D) for Chinchilla), and the Huber loss (delta 1e-3) of the log
residuals is minimized by L-BFGS from a grid of starts. Every start of the grid is scored, and
L-BFGS runs from the best `REFINED_STARTS` of them. The prediction interval is a residual
bootstrap: the fitted log losses plus log residuals drawn with replacement (inflated by
sqrt(n / (n - 5)) for the degrees of freedom the fit used), refitted each time, and one more
residual for the target run's own deviation from the law. No I/O here.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "FORMS",
    "MIN_POINTS",
    "NUM_PARAMETERS",
    "Form",
    "LawFit",
    "ScalingFitError",
    "check_form",
    "check_grid",
    "check_settings",
    "fit_law",
    "goodness_of_fit",
    "leave_one_out",
    "one_blas_thread",
    "prediction_error",
    "prediction_interval",
]

NUM_PARAMETERS = 5
"""Both forms have five: E, two scales and two exponents."""


class ScalingFitError(ValueError):
    """Points that cannot be fitted, or an input that is missing or malformed; names the field."""

    def __init__(self, message: str, field: str, step: str | None = None) -> None:
        self.message = message
        self.field = field
        super().__init__(f"{step + ', ' if step else ''}field `{field}`: {message}")


def _chinchilla(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    e, a, alpha, b, beta = (np.asarray(t)[..., None] for t in theta)
    terms = np.broadcast_arrays(e, a - alpha * log_n, b - beta * log_d)
    return np.logaddexp(np.logaddexp(terms[0], terms[1]), terms[2])


def _kaplan(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    e, a, alpha, b, beta = (np.asarray(t)[..., None] for t in theta)
    bracket = np.logaddexp(alpha / beta * (a - log_n), b - log_d)
    return np.logaddexp(e, beta * bracket)


@dataclass(frozen=True)
class Form:
    """A law in log space: `log_loss(theta, log N, log D)`, with theta = (e, a, alpha, b, beta)."""

    name: str
    law: str
    public: tuple[str, ...]
    """The names of exp(e), exp(a), alpha, exp(b), beta in `law`."""
    log_loss: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    bounds: tuple[tuple[float, float], ...]


# Log scales stay within [-10, 40], which holds any law whose terms are O(1) at N, D below 1e17.
# Chinchilla's exponents stay within [0, 3]. Kaplan's outer exponent beta is the power of the whole
# bracket and runs higher on short runs (4.9 on the demo sweep): a bound at 3 stopped the fit there
# and moved its prediction by 2%. It stays above 0.02 because alpha is divided by it.
_BOUNDS = ((-10.0, 10.0), (-10.0, 40.0), (0.0, 3.0), (-10.0, 40.0), (0.02, 3.0))
_KAPLAN_BOUNDS = ((-10.0, 10.0), (-10.0, 40.0), (0.0, 10.0), (-10.0, 40.0), (0.02, 10.0))
FORMS: dict[str, Form] = {
    "chinchilla": Form(
        "chinchilla",
        "L(N, D) = E + A / N^alpha + B / D^beta",
        ("E", "A", "alpha", "B", "beta"),
        _chinchilla,
        _BOUNDS,
    ),
    "kaplan": Form(
        "kaplan",
        "L(N, D) = E + ((N_c / N)^(alpha / beta) + D_c / D)^beta",
        ("E", "N_c", "alpha", "D_c", "beta"),
        _kaplan,
        _KAPLAN_BOUNDS,
    ),
}

# Hoffmann et al.'s grid of starts (appendix D.2), with the exponents' zero moved off the bound.
_STARTS = np.array(
    list(
        itertools.product(
            (-1.0, -0.5, 0.0, 0.5, 1.0),
            (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            (0.1, 0.5, 1.0, 1.5, 2.0),
            (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
            (0.1, 0.5, 1.0, 1.5, 2.0),
        )
    )
)
REFINED_STARTS = 12
"""L-BFGS runs from this many of the grid's best starts (of 4,500), and from the best start of each
pair of exponents (alpha, beta) the others miss: 37 runs instead of 4,500, which would cost seconds
per fit. The best starts alone are not enough: at the sizes of a real ladder (N of 1e7-1e9, D of
1e10-1e11) they can all share one pair of exponents whose D term is flat there (beta = 1), and
every run ends in that basin (a noise-free Chinchilla law was fitted 14% off at a 23B target)."""


def _diverse(order: np.ndarray) -> list[int]:
    """The first `REFINED_STARTS` of `order` (start indices, best first), then the best start of
    each pair of exponents not yet among them."""
    chosen = [int(i) for i in order[:REFINED_STARTS]]
    pairs = {(float(_STARTS[i, 2]), float(_STARTS[i, 4])) for i in chosen}
    for i in order[REFINED_STARTS:]:
        pair = (float(_STARTS[i, 2]), float(_STARTS[i, 4]))
        if pair not in pairs:
            pairs.add(pair)
            chosen.append(int(i))
    return chosen


HUBER_DELTA = 1e-3
"""Hoffmann et al.'s threshold on log residuals."""


@dataclass(frozen=True)
class LawFit:
    """A fitted law: its form and theta = (e, a, alpha, b, beta) in log space."""

    form: str
    theta: tuple[float, ...]
    objective: float
    """The Huber loss of the log residuals at the optimum."""

    @classmethod
    def of(cls, form: str, **public: float) -> LawFit:
        """A law from its public parameters, e.g. `LawFit.of("chinchilla", E=1.6, A=400, alpha=0.45, ...)`."""
        names = FORMS[form].public
        e, a, alpha, b, beta = (public[k] for k in names)
        return cls(form, (math.log(e), math.log(a), alpha, math.log(b), beta), 0.0)

    def predict(self, n: Any, d: Any) -> Any:
        """Predicted loss at N = `n`, D = `d` (scalars or arrays of one shape)."""
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        flat = FORMS[self.form].log_loss(np.array(self.theta), np.log(n).ravel(), np.log(d).ravel())
        out = np.exp(flat).reshape(np.broadcast_shapes(n.shape, d.shape))
        return float(out) if out.ndim == 0 else out

    def as_dict(self) -> dict[str, float]:
        """The public parameters, as the form's formula names them."""
        e, a, alpha, b, beta = self.theta
        values = (math.exp(e), math.exp(a), alpha, math.exp(b), beta)
        return dict(zip(FORMS[self.form].public, values, strict=True))

    def formula(self) -> str:
        """The law with its numbers, for a summary line or a plot title."""
        p = list(self.as_dict().values())
        if self.form == "chinchilla":
            return f"L = {p[0]:.3f} + {p[1]:.4g}/N^{p[2]:.3f} + {p[3]:.4g}/D^{p[4]:.3f}"
        return f"L = {p[0]:.3f} + (({p[1]:.4g}/N)^{p[2] / p[4]:.3f} + {p[3]:.4g}/D)^{p[4]:.3f}"


MIN_POINTS = NUM_PARAMETERS + 1
"""What the step needs: five points determine the law, and an interval needs residuals left over."""


def check_grid(
    n: Sequence[float], d: Sequence[float], labels: Sequence[str] | None = None, minimum: int = NUM_PARAMETERS
) -> None:
    """Raise `ScalingFitError(message, field)` if these points cannot determine a law."""
    law = FORMS["chinchilla"].law
    if len(n) < NUM_PARAMETERS:
        raise ScalingFitError(
            f"{len(n)} point(s) cannot fit the {NUM_PARAMETERS} parameters of {law}; "
            f"give at least {MIN_POINTS} (e.g. 3 model sizes x 2 token budgets)",
            "points",
        )
    if len(n) < minimum:
        raise ScalingFitError(
            f"{len(n)} points fit the {NUM_PARAMETERS} parameters of {law} exactly, leaving no residuals "
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


def check_form(form: str) -> Form:
    if form not in FORMS:
        raise ScalingFitError(f"unknown law {form!r}; choose one of {sorted(FORMS)}", "laws")
    return FORMS[form]


def _as_arrays(n: Any, d: Any, loss: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, d, loss = (np.asarray(x, dtype=float).ravel() for x in (n, d, loss))
    if not len(n) == len(d) == len(loss):
        raise ScalingFitError(f"N, D and loss differ in length: {len(n)}, {len(d)}, {len(loss)}", "points")
    check_grid(list(n), list(d))
    bad = [i for i, v in enumerate(loss) if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ScalingFitError(f"losses must be finite and positive; point(s) {bad} are {loss[bad]}", "points")
    return n, d, loss


@functools.cache
def _blas_threads() -> Any:
    import scipy.optimize  # noqa: F401  (loads scipy's BLAS, so that the controller sees it)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def one_blas_thread() -> AbstractContextManager[Any]:
    """Run BLAS on one thread inside: L-BFGS-B and the fits' least squares make thousands of tiny
    BLAS calls, and on a machine whose cores are busy (a sweep training beside its fit, a test
    suite) OpenBLAS's thread pool spins on every one of them: the same fit took 15 times longer."""
    return _blas_threads().limit(limits=1)


def _huber(r: np.ndarray, delta: float) -> np.ndarray:
    return np.where(np.abs(r) <= delta, 0.5 * r**2, delta * (np.abs(r) - 0.5 * delta))


def _objective(
    theta: np.ndarray, form: Form, log_n: np.ndarray, log_d: np.ndarray, log_loss: np.ndarray, delta: float
) -> tuple[float, np.ndarray]:
    """The Huber loss of the log residuals and its gradient (central differences: five parameters
    and a handful of points make that cheaper than deriving two forms by hand)."""
    value = float(_huber(form.log_loss(theta, log_n, log_d) - log_loss, delta).sum())
    step = 1e-6
    shifted = np.concatenate([theta + step * np.eye(5), theta - step * np.eye(5)])
    values = _huber(form.log_loss(shifted.T, log_n, log_d) - log_loss, delta).sum(axis=1)
    return value, (values[:5] - values[5:]) / (2 * step)


def fit_law(
    n: Any,
    d: Any,
    loss: Any,
    *,
    form: str = "chinchilla",
    huber_delta: float = HUBER_DELTA,
    start: LawFit | None = None,
) -> LawFit:
    """Fit `form` to losses at (N, D): Huber loss of the log residuals, L-BFGS from a grid of starts.

    Every one of the grid's 4,500 starts is scored at once, and L-BFGS-B (within the form's
    bounds) runs from the best `REFINED_STARTS` and the best of every other pair of exponents;
    the best optimum wins. `start` (a previous fit,
    as bootstrap and leave-one-out refits use) is refined alone instead. Raises
    `ScalingFitError` naming the field if the points cannot determine the law.
    """
    with one_blas_thread():
        return _fit_law(n, d, loss, form=form, huber_delta=huber_delta, start=start)


def _fit_law(n: Any, d: Any, loss: Any, *, form: str, huber_delta: float, start: LawFit | None) -> LawFit:
    from scipy.optimize import minimize

    shape = check_form(form)
    n, d, loss = _as_arrays(n, d, loss)
    log_n, log_d, log_loss = np.log(n), np.log(d), np.log(loss)
    if start is None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            scores = _huber(shape.log_loss(_STARTS.T, log_n, log_d) - log_loss, huber_delta).sum(axis=1)
        order = np.argsort(np.where(np.isfinite(scores), scores, np.inf))
        starts = _STARTS[_diverse(order)]
    else:
        starts = np.array([start.theta])
    best = None
    for first in starts:
        with np.errstate(over="ignore", invalid="ignore"):
            result = minimize(
                _objective,
                first,
                args=(shape, log_n, log_d, log_loss, huber_delta),
                jac=True,
                method="L-BFGS-B",
                bounds=shape.bounds,
                options={"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-10},
            )
        if np.isfinite(result.fun) and (best is None or result.fun < best.fun):
            best = result
    if best is None:
        raise ScalingFitError(f"the {form} law could not be fitted to these points from any start", "points")
    return LawFit(form=form, theta=tuple(float(v) for v in best.x), objective=float(best.fun))


def goodness_of_fit(law: LawFit, n: Any, d: Any, loss: Any) -> dict[str, Any]:
    """R² and RMSE of the loss, RMSE of the log loss, and per-point predictions and residuals."""
    n, d, loss = (np.asarray(x, dtype=float) for x in (n, d, loss))
    predicted = np.asarray(law.predict(n, d))
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
    n: Any,
    d: Any,
    loss: Any,
    *,
    form: str = "chinchilla",
    huber_delta: float = HUBER_DELTA,
    start: LawFit | None = None,
) -> list[float | None]:
    """Each point's loss as predicted by a fit to the other points (None where they cannot fit).

    `start` (e.g. the fit to all points) starts each refit instead of the grid of starts.
    """
    n, d, loss = _as_arrays(n, d, loss)
    out: list[float | None] = []
    for i in range(len(n)):
        keep = np.arange(len(n)) != i
        try:
            law = fit_law(n[keep], d[keep], loss[keep], form=form, huber_delta=huber_delta, start=start)
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
    huber_delta: float = HUBER_DELTA,
) -> tuple[float, float]:
    """A `level` interval for the loss a run at (target_n, target_d) will measure, by residual
    bootstrap in log space (Davison and Hinkley 1997, algorithm 6.4).

    Each resample adds log residuals drawn with replacement (scaled by sqrt(n / (n - 5)), since
    the fit's five parameters shrink the residuals it leaves) to the fitted log losses, refits
    from `law`, and predicts the target, times the exponential of one more drawn residual: the
    measured target is one run, off the law by as much as a grid point is, not the law's mean.
    The interval is the central `level` of those predictions.
    """
    check_settings(level, resamples, huber_delta)
    n, d, loss = _as_arrays(n, d, loss)
    check_grid(list(n), list(d), minimum=MIN_POINTS)
    fitted = np.log(law.predict(n, d))
    residuals = (np.log(loss) - fitted) * math.sqrt(len(n) / (len(n) - NUM_PARAMETERS))
    rng = np.random.default_rng(seed)
    predictions = []
    with one_blas_thread():
        for _ in range(resamples):
            sample = np.exp(fitted + rng.choice(residuals, size=len(n), replace=True))
            refit = _fit_law(n, d, sample, form=law.form, huber_delta=huber_delta, start=law)
            predictions.append(float(refit.predict(target_n, target_d)) * math.exp(rng.choice(residuals)))
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
