"""The scaling_fit step's config and the N of a point, below the modules that read them (`fit`,
`methods`, `prediction`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from steps.models import MoeModelConfig, parameter_counts
from steps.scaling.law import HUBER_DELTA

__all__ = ["ScalingFitConfig", "ScalingPoint", "active_non_embedding_params"]


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
    huber_delta: float = HUBER_DELTA
    """Huber threshold on log residuals: smaller ones count squared, larger ones linearly, so one bad
    run cannot dominate the fit (Hoffmann et al.'s 1e-3)."""
    laws: list[str] = field(default_factory=lambda: ["chinchilla", "kaplan"])
    """The law forms fitted (`steps.scaling.law.FORMS`)."""
    isoflop: bool = True
    """Also predict by the IsoFLOP method (`steps.scaling.isoflop`), where the grid allows it."""
    pre_check: int = 3
    """How many of the grid's largest-compute points are each predicted by every method fitted to
    the other points; the method with the smallest mean error there predicts the target."""


def active_non_embedding_params(model: MoeModelConfig) -> int:
    """N: the parameters one token touches, without the token embedding and the LM head."""
    return parameter_counts(model, vocab_size=0)[1]
