"""A training's predicted eval loss: a curve with its interval, compared with every evaluation.

A training is given a prediction in one of two ways (`train_moe_step(..., prediction=...)`):

    predicted_by(fit)                       a scaling_fit step whose target is this training's
                                            model and token count: its chosen method's law gives
                                            the curve, its interval the band
    LossPrediction(points=[(step, loss, low, high), ...])
                                            numbers: the expected eval loss at some steps

Neither enters the training's identity: a prediction is compared with the run, it does not
change it (the fit is an `output_of(fit, identity=False)` input: the training waits for the fit,
but refitting the ladder never reruns it).

From a fit, the curve at step t is the law at the training's N and t's tokens, L(N, t x tokens
per step), which ends at the fit's prediction for the whole run; the band is the fit's interval at
the target, as a ratio, at every step. Read it as what a *complete* run of t's tokens reaches:
a run whose learning rate has not decayed yet sits a little above it (docs/training.md, "The
predicted loss").

At the start of each attempt train_moe writes the curve to `prediction.json` (what the dashboard
draws and `drydock status` reads through the training's progress reports). Each evaluation is
placed on the curve (log-linear between its points); `patience` evaluations in a row outside the
band are a WARNING in the step's `.status`, an `off_prediction` line in metrics.jsonl and an
alert; the count starts again once an evaluation is back inside.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline import OutputOf, Step, output_of, unversioned
from steps.files import exists, read_json
from steps.models import MoeModelConfig

__all__ = [
    "PREDICTION_FILE",
    "Curve",
    "LossPrediction",
    "PredictionError",
    "PredictionWatch",
    "check_prediction",
    "fit_summary",
    "predicted_by",
    "read_curve",
    "resolve_curve",
    "start_prediction",
]

PREDICTION_FILE = "prediction.json"
CURVE_POINTS = 48
"""Points of a curve from a fit, beside the evaluations' steps: enough to draw it smoothly."""


class PredictionError(ValueError):
    """A prediction that does not fit its training, naming the field."""

    def __init__(self, message: str, field: str = "prediction") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


@dataclass(frozen=True)
class LossPrediction:
    """What a training's eval loss should be: numbers (`points`) or a scaling fit (`fit`)."""

    points: tuple[tuple[int, float, float, float], ...] = ()
    """(step, predicted eval loss, interval low, interval high), steps increasing."""
    fit: Any = None
    """A scaling_fit step's output directory (`predicted_by` sets it; resolved at run time)."""
    patience: int = 3
    """Evaluations in a row outside the interval before a WARNING and an alert."""
    source: str = ""
    """Where the prediction comes from, as shown (the fit's step name; `given` for numbers)."""


def predicted_by(fit: Step, *, patience: int = 3) -> LossPrediction:
    """The prediction of `fit` (a `scaling_fit_step` whose target is this training) for a training.

    The training waits for the fit and reads its fit.json when it starts; the fit stays out of
    the training's identity."""
    return LossPrediction(fit=output_of(fit, identity=False), patience=patience, source=fit.name)


def _describe(n: int, tokens: int) -> str:
    return f"N={n:,} active non-embedding parameters, D={tokens:,} tokens"


def check_prediction(prediction: Any, model: MoeModelConfig, tokens: int, num_steps: int) -> None:
    """Raise `PredictionError` if `prediction` cannot be this training's: a fit whose target is
    another model size or token count, numbers out of order, or a bad patience."""
    from steps.scaling.fit_config import ScalingFitConfig, active_non_embedding_params

    if not isinstance(prediction, LossPrediction):
        raise PredictionError(
            f"must be a LossPrediction (or predicted_by(fit)), got {type(prediction).__name__}"
        )
    if type(prediction.patience) is not int or prediction.patience < 1:
        raise PredictionError(
            f"must be a whole number of evaluations >= 1, got {prediction.patience!r}", "prediction.patience"
        )
    if (prediction.fit is None) == (not prediction.points):
        raise PredictionError("give either points or a fit (predicted_by), not both or neither")
    if prediction.fit is not None:
        fit = prediction.fit
        step = fit.step if isinstance(fit, OutputOf) else None
        config = getattr(step, "config", None)
        if not isinstance(config, ScalingFitConfig):
            raise PredictionError("the fit must be a scaling_fit step (predicted_by(scaling_fit_step(...)))")
        target = config.target
        fit_n = active_non_embedding_params(unversioned(target.model))
        fit_tokens = unversioned(target.tokens)
        own_n = active_non_embedding_params(model)
        if (fit_n, fit_tokens) != (own_n, tokens):
            raise PredictionError(
                f"{step.name!r} predicts {unversioned(target.label)!r} ({_describe(fit_n, fit_tokens)}), "
                f"not this training ({_describe(own_n, tokens)}): give the fit this training's model "
                "and tokens as its target"
            )
        return
    previous = 0
    for i, point in enumerate(prediction.points):
        where = f"prediction.points.{i}"
        if not (isinstance(point, tuple | list) and len(point) == 4):
            raise PredictionError(f"must be (step, loss, low, high), got {point!r}", where)
        step_number, loss, low, high = point
        if type(step_number) is not int or not previous < step_number <= num_steps:
            raise PredictionError(
                f"step {step_number!r} must be a whole number after {previous} and at most num_steps "
                f"({num_steps})",
                where,
            )
        numbers = (low, loss, high)
        if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0 for v in numbers):
            raise PredictionError(f"loss, low and high must be positive finite numbers, got {point!r}", where)
        if not low <= loss <= high:
            raise PredictionError(f"needs low <= loss <= high, got {point!r}", where)
        previous = step_number


@dataclass(frozen=True)
class Curve:
    """A resolved prediction: points (step, loss, low, high), where they come from, the patience."""

    points: tuple[tuple[int, float, float, float], ...]
    source: str
    patience: int

    def at(self, step: float) -> tuple[float, float, float] | None:
        """(loss, low, high) at `step`, log-linear between points; None before the first point or
        after the last (a prediction says nothing there)."""
        steps = [p[0] for p in self.points]
        if not self.points or step < steps[0] or step > steps[-1]:
            return None
        i = bisect.bisect_left(steps, step)
        if steps[i] == step:
            return self.points[i][1:]
        (s0, *a), (s1, *b) = self.points[i - 1], self.points[i]
        w = (step - s0) / (s1 - s0)
        return tuple(math.exp((1 - w) * math.log(x) + w * math.log(y)) for x, y in zip(a, b, strict=True))  # type: ignore[return-value]

    @property
    def final(self) -> tuple[int, float, float, float]:
        return self.points[-1]

    def to_json(self) -> dict[str, Any]:
        step, loss, low, high = self.final
        return {
            "source": self.source,
            "patience": self.patience,
            "final": {"step": step, "loss": loss, "low": low, "high": high},
            "points": [list(p) for p in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Curve:
        points = tuple((int(p[0]), float(p[1]), float(p[2]), float(p[3])) for p in data["points"])
        return cls(points, str(data.get("source", "")), int(data.get("patience", 3)))


def _predictor(method: Mapping[str, Any]) -> Callable[[float, float], float]:
    """predict(n, d) of a fit.json method entry."""
    from steps.scaling.isoflop import predictor_from_dict
    from steps.scaling.law import FORMS, LawFit

    if method.get("kind") == "isoflop":
        return predictor_from_dict(method)
    form = next(name for name, spec in FORMS.items() if spec.law == method["law"])
    law = LawFit.of(form, **method["parameters"])
    return lambda n, d: float(law.predict(n, d))


def fit_summary(fit_dir: str) -> dict[str, Any] | None:
    """The target's prediction in `fit_dir`/fit.json (loss, interval, method, N, D), or None if
    the fit has not been made."""
    path = os.path.join(fit_dir, "fit.json")
    if not exists(path):
        return None
    target = read_json(path)["target"]
    return {
        "loss": float(target["predicted_loss"]),
        "low": float(target["interval"]["low"]),
        "high": float(target["interval"]["high"]),
        "level": target["interval"].get("level"),
        "method": target.get("method"),
        "n": int(target["active_non_embedding_params"]),
        "tokens": int(target["tokens"]),
    }


def resolve_curve(
    prediction: LossPrediction,
    *,
    model: MoeModelConfig,
    tokens_per_step: int,
    num_steps: int,
    eval_steps: Sequence[int] = (),
) -> Curve:
    """The curve a training compares its evaluations with. From a fit, the law's loss at every
    step of `eval_steps` and at `CURVE_POINTS` steps spread over the run, from the step where the
    training has seen as many tokens as the fit's smallest grid point (the law says nothing
    before it). Raises `PredictionError`
    when the fit has no fit.json or predicts another model size or token count."""
    from steps.scaling.fit_config import active_non_embedding_params

    if prediction.fit is None:
        points = tuple(tuple(p) for p in prediction.points)
        return Curve(points, prediction.source or "given", prediction.patience)  # type: ignore[arg-type]
    fit_dir = str(prediction.fit)
    summary = fit_summary(fit_dir)
    if summary is None:
        raise PredictionError(f"the scaling fit at {fit_dir} has no fit.json: it must finish first")
    n, tokens = active_non_embedding_params(model), tokens_per_step * num_steps
    if (summary["n"], summary["tokens"]) != (n, tokens):
        raise PredictionError(
            f"the fit at {fit_dir} predicts {_describe(summary['n'], summary['tokens'])}, not this training "
            f"({_describe(n, tokens)})"
        )
    fit = read_json(os.path.join(fit_dir, "fit.json"))
    predict = _predictor(fit["methods"][summary["method"]])
    # The law speaks for token counts like the grid's: before the grid's smallest D it is an
    # extrapolation to nothing (at 6 steps, 272 nats where guessing gives ln V), so the curve
    # starts at the step where the training has seen that many tokens.
    grid_tokens = [int(row["tokens"]) for row in fit.get("points", ()) if row.get("tokens")]
    first = min(num_steps, math.ceil(min(grid_tokens) / tokens_per_step)) if grid_tokens else 1
    spread = {max(first, round(num_steps * (i + 1) / CURVE_POINTS)) for i in range(CURVE_POINTS)}
    steps = sorted({s for s in eval_steps if first <= s <= num_steps} | spread)
    final = predict(n, tokens)
    # The law at the run's end is the fit's own prediction; the band is its interval as a ratio.
    low, high = summary["low"] / summary["loss"], summary["high"] / summary["loss"]
    points = []
    for step in steps:
        loss = summary["loss"] * predict(n, tokens_per_step * step) / final
        points.append((step, loss, loss * low, loss * high))
    name = prediction.source or os.path.basename(fit_dir.rstrip("/"))
    return Curve(tuple(points), f"{summary['method']} fit of {name}", prediction.patience)


def read_curve(output: str) -> Curve | None:
    """The curve train_moe wrote in `output` (its `prediction.json`), or None."""
    path = os.path.join(output, PREDICTION_FILE)
    return Curve.from_json(read_json(path)) if exists(path) else None


class PredictionWatch:
    """Places each evaluation on the curve and counts evaluations in a row outside its band."""

    def __init__(self, curve: Curve) -> None:
        self.curve = curve
        self.outside = 0
        self.excursions = 0
        """Times `patience` evaluations in a row went outside (each is one warning)."""
        self.latest: dict[str, Any] | None = None
        self.message = ""

    def observe(self, step: int, loss: float) -> str | None:
        """Record the evaluation at `step`; the warning to raise, if this one makes `patience` in a row."""
        expected = self.curve.at(step)
        if expected is None or not math.isfinite(loss):
            return None
        predicted, low, high = expected
        inside = low <= loss <= high
        self.outside = 0 if inside else self.outside + 1
        self.latest = {
            "step": step,
            "measured": loss,
            "predicted": predicted,
            "low": low,
            "high": high,
            "outside": self.outside,
        }
        if self.outside != self.curve.patience:
            return None
        self.excursions += 1
        side = "above" if loss > high else "below"
        self.message = (
            f"eval loss {loss:.4f} at step {step} is {abs(loss / predicted - 1):.1%} {side} the predicted "
            f"{predicted:.4f} [{low:.4f}, {high:.4f}] ({self.curve.source}), {self.outside} evaluations "
            "in a row outside the interval"
        )
        return self.message

    def replay(self, evaluations: Sequence[tuple[int, float]]) -> None:
        """Catch up on a resumed attempt's earlier evaluations (no warnings: they were raised then)."""
        for step, loss in evaluations:
            self.observe(step, loss)


def start_prediction(
    prediction: LossPrediction | None,
    output: str,
    *,
    model: MoeModelConfig,
    tokens_per_step: int,
    num_steps: int,
    eval_interval: int,
) -> str | None:
    """At a training's start: resolve its prediction, write `prediction.json` into `output`, and
    return the curve as JSON text for the metrics tracker (None without a prediction)."""
    from steps.files import write_json

    if prediction is None:
        return None
    evaluations = range(eval_interval, num_steps + 1, eval_interval) if eval_interval > 0 else ()
    curve = resolve_curve(
        prediction, model=model, tokens_per_step=tokens_per_step, num_steps=num_steps, eval_steps=evaluations
    )
    write_json(os.path.join(output, PREDICTION_FILE), curve.to_json())
    return json.dumps(curve.to_json())
