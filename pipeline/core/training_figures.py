"""A running training's live figures, read from its `.progress` (what `step_events.progress`
wrote), for `drydock status` and the dashboard: from any machine that sees the prefix.

The engine knows nothing of training; these are the keys of `.progress` data that a training
step reports beside `loss` (`steps.training.tracker.JsonlTracker`) and that are worth a column.
Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.core.usable_numbers import finite_number, usable_time

__all__ = [
    "FIGURES",
    "INTERVENTION_NAMES",
    "figures_text",
    "live_figures",
    "prediction_figure",
    "prediction_text",
]

FIGURES = ("loss", "tokens_per_second", "mfu", "steps_per_second", "eta_seconds", "checkpoint_step")
"""Numbers a step may report in its `.progress` data, shown when present."""

INTERVENTION_NAMES = {
    "nan_steps": ("NaN loss", "NaN losses"),
    "inf_steps": ("Inf loss", "Inf losses"),
    "spike_steps": ("spike", "spikes"),
    "skipped_updates": ("skipped update", "skipped updates"),
    "rewinds": ("rewind", "rewinds"),
    "batches_skipped": ("batch skipped", "batches skipped"),
}
"""How a training's `interventions` counters are named, one and many (see `steps.training.spikes`)."""


def live_figures(progress: Mapping[str, Any], now: float) -> dict[str, Any]:
    """The figures of a `.progress` record (`done`, `total`, `unit`, `time`, `data`): step and
    total (for a unit of steps), loss, tokens/s, MFU (where the hardware's peak is known), steps/s,
    the estimated seconds to finish (counted down since the report), the last checkpoint's step
    and age, the latest evaluation against the predicted eval loss, and the non-zero counters of
    spikes, NaN/Inf losses, skipped updates and rewinds."""
    data = progress.get("data")
    out: dict[str, Any] = {}
    if progress.get("unit") == "steps":
        out["step"], out["total"] = progress.get("done"), progress.get("total")
    if not isinstance(data, Mapping):
        return out
    for key in FIGURES:
        value = data.get(key)
        if finite_number(value):  # an edited report may hold 1e999 (read as infinity)
            out[key] = value
    reported = progress.get("time")
    age = max(0.0, now - reported) if usable_time(reported) else 0.0
    if "eta_seconds" in out:
        out["eta_seconds"] = max(0.0, out["eta_seconds"] - age)
    if usable_time(data.get("checkpoint_time")):
        out["checkpoint_age_seconds"] = max(0.0, now - data["checkpoint_time"])
    predicted = prediction_figure(data.get("prediction"))
    if predicted is not None:
        out["prediction"] = predicted
    counts = data.get("interventions")
    if isinstance(counts, Mapping):
        counts = {k: v for k, v in counts.items() if type(v) is int and finite_number(v) and v}
        if counts:
            out["interventions"] = counts
    return out


def figures_text(figures: Mapping[str, Any], *, running: bool = True) -> list[str]:
    """Short texts for a status column: `24.5k tok/s`, `ETA 3m12s`, `ckpt 2m ago`, `1 rewinds`.
    Loss and step count are the caller's (it shows them for finished steps too)."""
    parts = []
    if running:
        if "mfu" in figures:
            parts.append(f"MFU {figures['mfu']:.1f}%")
        elif "tokens_per_second" in figures:
            parts.append(f"{compact(figures['tokens_per_second'])} tok/s")
        if "eta_seconds" in figures:
            parts.append(f"ETA {duration(figures['eta_seconds'])}")
        if "checkpoint_age_seconds" in figures:
            parts.append(f"ckpt {duration(figures['checkpoint_age_seconds'])} ago")
    if "prediction" in figures:
        parts.append(prediction_text(figures["prediction"]))
    counts = figures.get("interventions") or {}
    if counts:
        names = {k: INTERVENTION_NAMES.get(k, (k, k)) for k in counts}
        parts.append(", ".join(f"{n} {names[k][0] if n == 1 else names[k][1]}" for k, n in counts.items()))
    return parts


def prediction_figure(value: Any) -> dict[str, Any] | None:
    """A report's `prediction` (the latest evaluation against the predicted eval loss: `step`,
    `measured`, `predicted`, `low`, `high`, `outside`), or None if it is missing or unusable."""
    if not isinstance(value, Mapping):
        return None
    numbers = ("measured", "predicted", "low", "high")
    if not all(finite_number(value.get(k)) and value[k] > 0 for k in numbers):
        return None
    outside = value.get("outside")
    return {
        **{k: float(value[k]) for k in numbers},
        "step": value.get("step") if type(value.get("step")) is int else None,
        "outside": outside if type(outside) is int and outside >= 0 else 0,
    }


def prediction_text(figure: Mapping[str, Any]) -> str:
    """`on prediction`, `eval 4.2% above prediction` (with `3 evals outside` once it stays there)."""
    measured, predicted = figure["measured"], figure["predicted"]
    if figure["low"] <= measured <= figure["high"]:
        return "on prediction"
    side = "above" if measured > figure["high"] else "below"
    text = f"eval {abs(measured / predicted - 1):.1%} {side} prediction"
    return text + (f" ({figure['outside']} evals outside)" if figure["outside"] > 1 else "")


def compact(value: float) -> str:
    """12,345 -> 12.3k: a rate at a glance."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def duration(seconds: float) -> str:
    """42s, 3m12s, 5h07m."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"
