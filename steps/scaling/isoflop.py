"""The IsoFLOP method (Hoffmann et al. 2022, approach 2), as pure functions of arrays.

For a compute budget C = 6ND, the models of the grid trained with that compute lie on a curve
in log N, a parabola near its minimum (the "IsoFLOP profile"). Its minimum is the best loss C
can buy, L*(C), at the compute-optimal size N*(C). Across budgets, L*(C) and N*(C) follow power
laws in C, which are extrapolated to the target's compute. A target that is not compute-optimal
sits on its budget's profile away from the minimum: its loss is L*(C) plus the profiles' mean
curvature times (log N - log N*(C))².

A sweep of a few sizes and budgets is not laid out on iso-compute lines, so the profiles are
read off it: for each model size, its losses at its budgets are joined piecewise linearly in
(log D, log L), and a budget C takes every size whose measured D range holds C / 6N. Budgets are
spread log-evenly over the compute range where at least `MIN_SIZES` sizes have such a point. No
extrapolation beyond a size's own runs is done to build a profile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from steps.scaling.law import ScalingFitError, one_blas_thread

__all__ = [
    "MIN_SIZES",
    "IsoflopFit",
    "IsoflopUnavailable",
    "fit_isoflop",
    "isoflop_interval",
    "isoflop_profiles",
    "predictor_from_dict",
]

MIN_SIZES = 3
"""A parabola needs three sizes on a budget."""
MIN_BUDGETS = 3
"""Two power laws in C (two parameters each) need three budgets to leave a residual."""
BUDGETS = 5
"""Budgets read off the grid, log-evenly over the range where they can be."""


class IsoflopUnavailable(ScalingFitError):
    """The grid has too few sizes on enough common compute budgets to draw IsoFLOP profiles."""


@dataclass(frozen=True)
class Profile:
    """One budget's IsoFLOP profile: loss = c0 + c1 x + c2 x², x = log N."""

    compute: float
    log_n: tuple[float, ...]
    loss: tuple[float, ...]
    coefficients: tuple[float, float, float]

    @property
    def curvature(self) -> float:
        return self.coefficients[2]

    def minimum(self) -> tuple[float, float, bool]:
        """(log N*, L*, inside): the parabola's minimum, or its lower end within the profile's
        sizes when the minimum lies outside them (then `inside` is False)."""
        c0, c1, c2 = self.coefficients
        lo, hi = min(self.log_n), max(self.log_n)
        x = -c1 / (2 * c2) if c2 > 0 else math.nan
        inside = bool(lo <= x <= hi)
        if not inside:
            x = lo if c0 + c1 * lo + c2 * lo**2 <= c0 + c1 * hi + c2 * hi**2 else hi
        return x, c0 + c1 * x + c2 * x**2, inside


@dataclass(frozen=True)
class IsoflopFit:
    """Profiles, and the power laws log L* = a + b log C and log N* = a' + b' log C across them."""

    profiles: tuple[Profile, ...]
    loss_law: tuple[float, float]
    size_law: tuple[float, float]
    curvature: float
    """The profiles' mean curvature in log N (of the loss), which places an off-optimum target."""

    def optimal(self, compute: float) -> tuple[float, float]:
        """(N*, L*) at `compute`."""
        log_c = math.log(compute)
        return (
            math.exp(self.size_law[0] + self.size_law[1] * log_c),
            math.exp(self.loss_law[0] + self.loss_law[1] * log_c),
        )

    def predict(self, n: float, d: float) -> float:
        """The loss of N = `n` trained on D = `d`: L*(6ND) plus the curvature term for N away from N*."""
        best_n, best_loss = self.optimal(6.0 * n * d)
        return best_loss + max(self.curvature, 0.0) * (math.log(n) - math.log(best_n)) ** 2

    def as_dict(self) -> dict[str, Any]:
        rows = []
        for p in self.profiles:
            log_n, loss, inside = p.minimum()
            rows.append(
                {
                    "compute_flops": p.compute,
                    "sizes": [round(math.exp(x)) for x in p.log_n],
                    "losses": list(p.loss),
                    "optimal_params": math.exp(log_n),
                    "optimal_loss": loss,
                    "minimum_inside_sizes": inside,
                    "curvature": p.curvature,
                }
            )
        return {
            "profiles": rows,
            "loss_law": {"log_L_star": f"{self.loss_law[0]:.4f} + {self.loss_law[1]:.4f} log C"},
            "size_law": {"log_N_star": f"{self.size_law[0]:.4f} + {self.size_law[1]:.4f} log C"},
            # The same laws as numbers, (intercept, slope): what `from_dict` rebuilds a predictor from.
            "loss_law_coefficients": list(self.loss_law),
            "size_law_coefficients": list(self.size_law),
            "loss_exponent": self.loss_law[1],
            "size_exponent": self.size_law[1],
            "curvature": self.curvature,
        }


def predictor_from_dict(entry: Mapping[str, Any]) -> Callable[[float, float], float]:
    """`predict(n, d)` of a fit.json IsoFLOP entry (`IsoflopFit.as_dict`), without its profiles."""
    loss_a, loss_b = (float(v) for v in entry["loss_law_coefficients"])
    size_a, size_b = (float(v) for v in entry["size_law_coefficients"])
    curvature = max(float(entry["curvature"]), 0.0)

    def predict(n: float, d: float) -> float:
        log_c = math.log(6.0 * n * d)
        best_log_n = size_a + size_b * log_c
        return math.exp(loss_a + loss_b * log_c) + curvature * (math.log(n) - best_log_n) ** 2

    return predict


def _interpolate(log_d: np.ndarray, log_loss: np.ndarray, x: float) -> float:
    order = np.argsort(log_d)
    return float(np.interp(x, log_d[order], log_loss[order]))


def isoflop_profiles(
    n: Any, d: Any, loss: Any, *, budgets: int = BUDGETS
) -> list[tuple[float, np.ndarray, np.ndarray]]:
    """(C, log N, L) for each budget read off the grid. Raises `IsoflopUnavailable` if fewer than
    `MIN_BUDGETS` budgets have `MIN_SIZES` sizes."""
    n, d, loss = (np.asarray(x, dtype=float).ravel() for x in (n, d, loss))
    sizes = sorted(set(n.tolist()))
    spans = {}
    for size in sizes:
        mine = n == size
        if mine.sum() >= 2:
            spans[size] = (6 * size * d[mine].min(), 6 * size * d[mine].max())
    edges = sorted({c for span in spans.values() for c in span})
    covered = [
        c
        for c in edges
        if sum(lo <= c * (1 + 1e-9) and c <= hi * (1 + 1e-9) for lo, hi in spans.values()) >= MIN_SIZES
    ]
    if len(covered) < 2 or max(covered) / min(covered) < 1.01:
        raise IsoflopUnavailable(
            f"no range of compute holds {MIN_SIZES} model sizes each trained with budgets on both sides "
            f"of it ({len(spans)} sizes with two budgets or more); an IsoFLOP profile needs {MIN_SIZES} "
            f"sizes per budget on {MIN_BUDGETS} budgets: add sizes or budgets",
            "points",
        )
    lo, hi = min(covered), max(covered)
    out = []
    for c in np.geomspace(lo, hi, budgets):
        on = [s for s, (a, b) in spans.items() if a <= c * (1 + 1e-9) and c <= b * (1 + 1e-9)]
        if len(on) < MIN_SIZES:
            continue
        log_n = np.log(np.array(on))
        values = np.array(
            [
                math.exp(_interpolate(np.log(d[n == s]), np.log(loss[n == s]), math.log(c / (6 * s))))
                for s in on
            ]
        )
        out.append((float(c), log_n, values))
    if len(out) < MIN_BUDGETS:
        raise IsoflopUnavailable(
            f"only {len(out)} compute budget(s) hold {MIN_SIZES} model sizes; the IsoFLOP method needs "
            f"{MIN_BUDGETS}: add sizes or budgets",
            "points",
        )
    return out


def _fit(profiles: list[tuple[float, np.ndarray, np.ndarray]]) -> IsoflopFit:
    fitted = []
    for c, log_n, values in profiles:
        c2, c1, c0 = np.polyfit(log_n, values, 2)
        fitted.append(
            Profile(c, tuple(log_n.tolist()), tuple(values.tolist()), (float(c0), float(c1), float(c2)))
        )
    log_c = np.log([p.compute for p in fitted])
    minima = [p.minimum() for p in fitted]
    loss_law = np.polyfit(log_c, np.log([m[1] for m in minima]), 1)
    size_law = np.polyfit(log_c, [m[0] for m in minima], 1)
    return IsoflopFit(
        profiles=tuple(fitted),
        loss_law=(float(loss_law[1]), float(loss_law[0])),
        size_law=(float(size_law[1]), float(size_law[0])),
        curvature=float(np.mean([p.curvature for p in fitted])),
    )


def fit_isoflop(n: Any, d: Any, loss: Any, *, budgets: int = BUDGETS) -> IsoflopFit:
    """Profiles read off the grid, a parabola in log N on each, power laws in C across their minima."""
    with one_blas_thread():
        return _fit(isoflop_profiles(n, d, loss, budgets=budgets))


def isoflop_interval(
    n: Any,
    d: Any,
    loss: Any,
    target_n: float,
    target_d: float,
    *,
    level: float = 0.9,
    resamples: int = 200,
    seed: int = 0,
    budgets: int = BUDGETS,
) -> tuple[float, float]:
    """A `level` interval for the target's loss, by residual bootstrap on the grid's points.

    The noise of a point is its log residual from its size's straight line in (log D, log L)
    (inflated by sqrt(k / (k - 2)) for the line's two parameters): a profile built from three
    sizes fits its parabola exactly and so has no residuals of its own. Each resample multiplies
    the grid's losses by residuals drawn with replacement, rebuilds the profiles, refits and
    predicts the target, times one more drawn residual for the target run's own noise.
    """
    n, d, loss = (np.asarray(x, dtype=float).ravel() for x in (n, d, loss))
    residuals = []
    for size in set(n.tolist()):
        mine = n == size
        if mine.sum() > 2:
            x, y = np.log(d[mine]), np.log(loss[mine])
            line = np.polyfit(x, y, 1)
            residuals.extend((y - np.polyval(line, x)) * math.sqrt(mine.sum() / (mine.sum() - 2)))
    if not residuals:
        raise IsoflopUnavailable(
            "no model size has three budgets to measure the points' noise from", "points"
        )
    noise = np.array(residuals)
    rng = np.random.default_rng(seed)
    predictions = []
    with one_blas_thread():
        for _ in range(resamples):
            sample = loss * np.exp(rng.choice(noise, size=len(loss), replace=True))
            refit = _fit(isoflop_profiles(n, d, sample, budgets=budgets))
            predictions.append(refit.predict(target_n, target_d) * math.exp(rng.choice(noise)))
    low, high = np.quantile(predictions, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)
