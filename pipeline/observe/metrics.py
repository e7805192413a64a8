"""The format of `metrics.jsonl`, the per-step metrics a training step writes in its output.

The engine knows nothing of training, but `drydock status` and the dashboard show a training
step's loss, and the step library reads the file back on resume: this module is the one reader
of the format they share. One JSON object per line with an integer `step`; several lines may
carry one step (Levanter logs evaluation and training metrics separately), later keys winning;
a line cut short by a kill is skipped. A line with an `event` key is an intervention (a loss
spike, a skipped update, a rewind), not a step's metrics: `parse_events` returns those. Pure
functions, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = ["ALIASES", "EVENT_KINDS", "METRICS_FILE", "parse_events", "parse_metrics"]

METRICS_FILE = "metrics.jsonl"

ALIASES = {
    "train/loss": "loss",
    "optim/learning_rate": "learning_rate",
    "throughput/tokens_per_second": "tokens_per_second",
    "router/max_load_ratio": "router_max_load_ratio",
}
"""Short names for Levanter's keys. A file still being written has only the long ones; one
compacted at the end of training has both."""


def parse_metrics(lines: Iterable[str | bytes], *, up_to: int | None = None) -> list[dict[str, Any]]:
    """One record per step, in step order, with the short aliases (`loss`, `learning_rate`, ...).

    Lines of one step merge (later keys win); torn or foreign lines are skipped; with `up_to`,
    steps after it are dropped.
    """
    merged: dict[int, dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
            step = int(record["step"])
        except (ValueError, KeyError, TypeError):
            continue
        if "event" in record:
            continue
        if up_to is None or step <= up_to:
            merged.setdefault(step, {}).update(record)
    out = []
    for step in sorted(merged):
        record = merged[step]
        for key, alias in ALIASES.items():
            if key in record:
                record[alias] = record[key]
        out.append(record)
    return out


EVENT_KINDS = ("spike", "nan", "inf", "skipped_update", "rewind")
"""The events a training step records in metrics.jsonl."""


def parse_events(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The event lines (`{"event": kind, "step": N, ...}`), in the order they were written."""
    out = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("event"), str)
            and isinstance(record.get("step"), int)
        ):
            out.append(record)
    return out
