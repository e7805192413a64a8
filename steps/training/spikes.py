"""Loss spikes and divergence in a training run: the policy, the detector and the rewind record.

No ML library is imported here: the tracker (`steps.training.tracker`) feeds losses to a
`SpikeDetector`, train_moe keeps the `Rewind`s of a run in `rewinds.json` beside its metrics, and
status, the dashboard and tests read them back without Levanter.

A *spike* is a finite loss above `factor` x the median of the last `window` losses (once
`min_history` are known). What happens then is the policy's `action`:

- `warn`: a WARNING in `.status` and an event line in `metrics.jsonl`; training goes on. A NaN/Inf
  loss fails the run (Levanter's own check).
- `skip`: as `warn`, and Levanter's skip-step wrapper drops the optimizer update of any step
  whose loss or gradient norm is more than `skip_sigma` standard deviations above the mean of the
  last `skip_window` steps (NaN/Inf included). `patience` non-finite losses in a row fail the run.
- `rewind`: when `patience` consecutive steps spike, or one loss is NaN/Inf, training stops,
  restores the newest checkpoint the first of those steps did not depend on (checkpoint N holds
  the state whose loss is logged at step N + 1, so N + 1 must be before it), skips the data batches
  from that step through the trigger step (plus `skip_batches` more), optionally trains the next
  `lr_steps` steps at `lr_factor` x the scheduled learning rate, and goes on. After `max_rewinds`
  rewinds the next trigger fails the run with one error listing every rewind.

Data positions: training step `s` reads the `s`-th data batch (from 0) that no rewind skipped
(`data_batch`); a mixture's phases are in data batches, so after a skip the next phase begins
that many steps earlier. Rewinds are kept in the output (`rewinds.json`), so a resumed attempt
reads the same batches at the same steps.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "REWINDS_FILE",
    "Rewind",
    "RewindNeeded",
    "RewindsFileError",
    "SpikeDetector",
    "SpikePolicy",
    "Stability",
    "TrainingDiverged",
    "count_interventions",
    "data_batch",
    "lr_multiplier",
    "read_rewinds",
    "skipped_ranges",
]

REWINDS_FILE = "rewinds.json"


@dataclass(frozen=True)
class SpikePolicy:
    """What train_moe does about loss spikes and NaN/Inf losses (see the module docstring)."""

    action: Literal["warn", "skip", "rewind"] = "warn"
    factor: float = 3.0
    """A loss above this multiple of the recent median is a spike."""
    window: int = 50
    """How many recent losses the median is taken over."""
    min_history: int = 10
    """No spike is flagged before this many losses are known."""
    patience: int = 3
    """rewind: this many spiking steps in a row trigger a rewind (a NaN/Inf loss triggers at once).
    skip: this many NaN/Inf losses in a row fail the run."""
    skip_batches: int = 0
    """rewind: batches to skip after the trigger step, beyond the spiking steps themselves."""
    lr_factor: float = 1.0
    """rewind: scale the learning rate by this for `lr_steps` steps from the restored checkpoint."""
    lr_steps: int = 0
    max_rewinds: int = 3
    """rewind: the trigger after this many rewinds fails the run."""
    skip_sigma: float = 6.0
    """skip: Levanter's threshold, in standard deviations above the recent mean (loss or grad norm)."""
    skip_window: int = 128
    """skip: how many recent steps the mean and deviation are over (none skipped before half of it)."""

    def check(self) -> None:
        """Raise ValueError('field: message') for a policy that cannot work."""
        if self.action not in ("warn", "skip", "rewind"):
            raise ValueError(f"action: unknown {self.action!r}; use 'warn', 'skip' or 'rewind'")
        if not (isinstance(self.factor, int | float) and math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"factor: must be a finite number above 1, got {self.factor!r}")
        if not (isinstance(self.lr_factor, int | float) and 0 < self.lr_factor <= 1):
            raise ValueError(f"lr_factor: must be in (0, 1], got {self.lr_factor!r}")
        if not (isinstance(self.skip_sigma, int | float) and self.skip_sigma > 0):
            raise ValueError(f"skip_sigma: must be positive, got {self.skip_sigma!r}")
        for name in ("window", "min_history", "patience", "skip_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be a whole number >= 1, got {value!r}")
        for name in ("skip_batches", "lr_steps", "max_rewinds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name}: must be a whole number >= 0, got {value!r}")
        if self.skip_window < 4:
            raise ValueError(f"skip_window: must be at least 4, got {self.skip_window}")

    @property
    def changes_training(self) -> bool:
        """Whether the policy can change what is trained (and so belongs in the identity)."""
        return self.action != "warn"


@dataclass(frozen=True)
class Stability:
    """Levanter's update clipping and z-loss; the defaults (all off) change nothing."""

    z_loss: float = 0.0
    """Weight of the z-loss (logsumexp^2 of the output logits) added to the loss."""
    update_rms_clipping: float | None = None
    """Clip each parameter block's update to this RMS."""
    clip_update_sigma: float | None = None
    """Clip the update norm to its recent mean + this many standard deviations."""
    clip_update_window: int = 128
    """Steps in the update-norm history (with `clip_update_sigma`)."""

    def check(self) -> None:
        """Raise ValueError('field: message') for settings Levanter would refuse."""
        if not (isinstance(self.z_loss, int | float) and math.isfinite(self.z_loss) and self.z_loss >= 0):
            raise ValueError(f"z_loss: must be a finite number >= 0, got {self.z_loss!r}")
        for name in ("update_rms_clipping", "clip_update_sigma"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and value > 0):
                raise ValueError(f"{name}: must be positive or None, got {value!r}")
        if self.update_rms_clipping is not None and self.clip_update_sigma is not None:
            raise ValueError("clip_update_sigma: Levanter cannot clip by RMS and by norm history at once")
        if not isinstance(self.clip_update_window, int) or self.clip_update_window < 4:
            raise ValueError(
                f"clip_update_window: must be a whole number >= 4, got {self.clip_update_window!r}"
            )


@dataclass(frozen=True)
class Rewind:
    """One rewind: what triggered it and what it changed."""

    number: int
    """1 for the run's first rewind."""
    trigger_step: int
    """The step whose loss triggered it."""
    first_step: int
    """The first spiking step of the window (the restored state is from before it)."""
    restored_step: int | None
    """The checkpoint restored (its step; the next step trained is one more), None: from scratch."""
    skipped: tuple[int, int]
    """Data batches skipped, first and last (inclusive)."""
    reason: str
    """'nan', 'inf' or 'spike'."""
    losses: dict[str, float] = field(default_factory=dict)
    """The losses of the spiking window, by step (as strings, for JSON)."""
    median: float | None = None
    lr_factor: float = 1.0
    lr_from_step: int | None = None
    """With lr_factor < 1: the learning rate is scaled from this step (the first one retrained)..."""
    lr_until_step: int | None = None
    """...until this one (exclusive)."""
    wall_time: float = 0.0

    @property
    def batches(self) -> int:
        """How many data batches this rewind skipped."""
        return self.skipped[1] - self.skipped[0] + 1

    def describe(self) -> str:
        """One line, as the WARNING in `.status` says it."""
        loss = self.losses.get(str(self.trigger_step))
        what = {"nan": "loss NaN", "inf": "loss Inf"}.get(self.reason)
        if what is None:
            median = f" vs median {self.median:.3g}" if self.median is not None else ""
            what = f"loss {loss:.3g}{median}" if loss is not None else "loss spike"
        restored = f"step {self.restored_step}" if self.restored_step is not None else "the start"
        a, b = self.skipped
        lr = ""
        if self.lr_factor != 1 and self.lr_until_step is not None:
            lr = f"; learning rate x{self.lr_factor:g} for steps {self.lr_from_step}-{self.lr_until_step - 1}"
        since = f" (spiking since step {self.first_step})" if self.first_step != self.trigger_step else ""
        return (
            f"rewind {self.number}: {what} at step {self.trigger_step}{since}: rewound to {restored}, "
            f"skipped batches {a}-{b}{lr}"
        )

    def to_json(self) -> dict[str, Any]:
        """The record kept in rewinds.json."""
        out = asdict(self)
        out["skipped"] = list(self.skipped)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Rewind:
        """Read one record of rewinds.json."""
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["skipped"] = tuple(values["skipped"])
        return cls(**values)


class RewindNeeded(Exception):
    """Raised from the metrics tracker to stop Levanter's training loop for a rewind."""

    def __init__(
        self, trigger_step: int, first_step: int, reason: str, losses: dict[int, float], median: float | None
    ):
        super().__init__(f"{reason} at step {trigger_step}")
        self.trigger_step = trigger_step
        self.first_step = first_step
        self.reason = reason
        self.losses = losses
        self.median = median


class TrainingDiverged(RuntimeError):
    """Training cannot go on: too many rewinds, or NaN/Inf losses that skipping cannot fix."""


class SpikeDetector:
    """Classifies each step's loss for a policy; keeps the spiking streak and the counters.

    `observe(step, loss)` returns what the step was: 'ok', 'spike', 'nan' or 'inf'. It raises
    `RewindNeeded` when the policy says to rewind, and `TrainingDiverged` under `skip` after
    `patience` non-finite losses in a row. A spike does not join the history the median is taken
    over, so a long plateau of bad losses cannot become the new normal.
    """

    def __init__(self, policy: SpikePolicy) -> None:
        self.policy = policy
        self._recent: deque[float] = deque(maxlen=policy.window)
        self._streak: dict[int, float] = {}
        self._nonfinite_streak = 0
        self.median: float | None = None

    def observe(self, step: int, loss: float) -> str:
        """Classify `loss` at `step` (and raise when the policy says to act; see the class)."""
        policy = self.policy
        if not math.isfinite(loss):
            kind = "nan" if math.isnan(loss) else "inf"
            self._nonfinite_streak += 1
            if policy.action == "rewind":
                streak = {**self._streak, step: loss}
                first = min(streak)
                self._streak = {}
                raise RewindNeeded(step, first, kind, streak, self._median())
            if policy.action == "skip" and self._nonfinite_streak >= policy.patience:
                raise TrainingDiverged(
                    f"loss {kind} for {self._nonfinite_streak} steps in a row (through step {step}): "
                    "skipping updates did not recover; lower the learning rate, or use the rewind policy"
                )
            return kind
        self._nonfinite_streak = 0
        median = self._median()
        if median is not None and median > 0 and loss > policy.factor * median:
            self.median = median
            self._streak[step] = loss
            if policy.action == "rewind" and len(self._streak) >= policy.patience:
                streak, self._streak = self._streak, {}
                raise RewindNeeded(step, min(streak), "spike", streak, median)
            return "spike"
        self._streak = {}
        self._recent.append(loss)
        return "ok"

    def _median(self) -> float | None:
        if len(self._recent) < self.policy.min_history:
            return None
        return statistics.median(self._recent)


def skipped_ranges(rewinds: Sequence[Rewind]) -> list[tuple[int, int]]:
    """The data batches the rewinds skipped, as sorted, disjoint, inclusive ranges."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(r.skipped for r in rewinds):
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def data_batch(skipped: Sequence[tuple[int, int]], step: int) -> int:
    """The data batch trained at `step`: the step-th (from 0) batch not in `skipped_ranges`."""
    batch = step
    for a, b in skipped:
        if a > batch:
            break
        batch += b - a + 1
    return batch


def lr_multiplier(rewinds: Sequence[Rewind], step: int) -> float:
    """The factor on the scheduled learning rate at `step` (the product of the rewinds' in force)."""
    factor = 1.0
    for r in rewinds:
        if (
            r.lr_from_step is not None
            and r.lr_until_step is not None
            and r.lr_from_step <= step < r.lr_until_step
        ):
            factor *= r.lr_factor
    return factor


class RewindsFileError(ValueError):
    """A `rewinds.json` that is not one this step wrote (edited by hand, or damaged)."""


def read_rewinds(text: str | None, path: str = REWINDS_FILE) -> list[Rewind]:
    """The rewinds of a `rewinds.json` text (None: no file, no rewinds); a `RewindsFileError`
    naming `path` and what is wrong with it for anything else."""
    if not text:
        return []
    try:
        records = json.loads(text)["rewinds"]
        if not isinstance(records, list):
            raise TypeError(f"`rewinds` is a {type(records).__name__}, not a list")
        return [_checked_rewind(record, i) for i, record in enumerate(records)]
    except (ValueError, KeyError, TypeError) as e:
        what = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise RewindsFileError(
            f"{path} is damaged: {what}. It records the run's rewinds (the batches they skipped); "
            "restore it, or delete it to forget them"
        ) from e


def _whole(value: Any) -> bool:
    return type(value) is int and 0 <= value < 2**63


def _checked_rewind(record: Any, i: int) -> Rewind:
    where = f"rewinds[{i}]"
    if not isinstance(record, dict):
        raise TypeError(f"{where} is not an object")
    for name in ("number", "trigger_step", "first_step", "restored_step", "skipped", "reason"):
        if name not in record:
            raise ValueError(f"{where} has no `{name}`")
    for name in ("number", "trigger_step", "first_step"):
        if not _whole(record.get(name)):
            raise ValueError(f"{where}.{name} is {record.get(name)!r}, not a step number")
    for name in ("restored_step", "lr_from_step", "lr_until_step"):
        if record.get(name) is not None and not _whole(record[name]):
            raise ValueError(f"{where}.{name} is {record[name]!r}, not a step number")
    skipped = record.get("skipped")
    if not (isinstance(skipped, list) and len(skipped) == 2 and all(map(_whole, skipped))):
        raise ValueError(f"{where}.skipped is {skipped!r}, not [first, last] batch numbers")
    if skipped[0] > skipped[1]:
        raise ValueError(f"{where}.skipped is {skipped!r}: its first batch is after its last")
    if record.get("reason") not in ("nan", "inf", "spike"):
        raise ValueError(f"{where}.reason is {record.get('reason')!r}, not 'nan', 'inf' or 'spike'")
    losses = record.get("losses", {})
    # A NaN or infinite loss is kept as its repr ("nan", "inf"): JSON has no number for it.
    if not isinstance(losses, dict) or not all(
        (isinstance(v, int | float) and not isinstance(v, bool)) or v in ("nan", "inf", "-inf")
        for v in losses.values()
    ):
        raise ValueError(f"{where}.losses is not a mapping of steps to losses")
    for name, default in (("median", None), ("lr_factor", 1.0), ("wall_time", 0.0)):
        value = record.get(name, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{where}.{name} is {value!r}, not a number")
    factor = record.get("lr_factor", 1.0)
    if not (math.isfinite(factor) and 0 < factor <= 1):
        raise ValueError(f"{where}.lr_factor is {factor!r}, not a factor in (0, 1]")
    return Rewind.from_json(record)


def count_interventions(events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """train_result.json's `interventions` counters, from metrics.jsonl's event lines.

    Steps a rewind went back over are trained again, so their events are gone from the file; the
    rewind's line keeps their losses, and they are counted from there.
    """
    counts = {"nan_steps": 0, "inf_steps": 0, "spike_steps": 0, "skipped_updates": 0}
    key = {
        "nan": "nan_steps",
        "inf": "inf_steps",
        "spike": "spike_steps",
        "skipped_update": "skipped_updates",
    }
    rewinds = []
    for event in events:
        if event.get("event") in key:
            counts[key[event["event"]]] += 1
        elif event.get("event") == "rewind":
            try:
                rewinds.append(Rewind.from_json(event))
            except (KeyError, TypeError, ValueError):
                continue  # a damaged line: counted as nothing rather than failing a report
    for rewind in rewinds:
        for loss in rewind.losses.values():
            counts[
                {"nan": "nan_steps", "inf": "inf_steps", "-inf": "inf_steps"}.get(str(loss), "spike_steps")
            ] += 1
    counts["rewinds"] = len(rewinds)
    counts["batches_skipped"] = sum(b - a + 1 for a, b in skipped_ranges(rewinds))
    return counts
