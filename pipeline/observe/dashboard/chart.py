"""A training step's metrics as the dashboard charts them, with the closed segments parsed once.

The step page of a running training reloads every few seconds. On object storage a long run's
metrics are hundreds of segments (`pipeline.observe.metrics`); every segment but the last is
closed and never changes, yet parsing all their lines again took 6 s per reload for a simulated
390k-step run (docs/performance.md). So each closed segment is summarized once, to what the
chart needs, and the summary is kept by the digest of the segment's bytes: a segment a resume
rewrote has other bytes and is summarized again. The open segment (or a local `metrics.jsonl`)
is parsed at every read.

A summary keeps, per step, the loss, the learning rate and the evaluation loss as the lines set
them (later lines win, as `parse_metrics` merges them), the events, and the whole record of the
segment's highest step (the chart's "last" record is the highest step's). Merging the summaries
in file order gives exactly what parsing every line would.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.observe.dashboard.records import Metrics
from pipeline.observe.metrics import ALIASES, metrics_files, step_of

__all__ = ["CACHED_SEGMENTS", "read_chart"]

CACHED_SEGMENTS = 4096
"""Summaries kept (about 300 KB each for a 1 MiB segment): a few hero runs' worth."""

# Chart slots: the value a step's merged record would have for each, aliases applied.
_SLOTS = (
    ("train/loss", "loss"),
    ("optim/learning_rate", "learning_rate"),
    ("eval/loss", "eval/loss"),
    ("throughput/tokens_per_second", "tokens_per_second"),
    ("throughput/mfu", "mfu"),
    ("wall_time", "wall_time"),
    ("router/max_load_ratio", "router_max_load_ratio"),
    ("router/mean_max_load_ratio", "router/mean_max_load_ratio"),
)
_ABSENT: Any = object()
"""A slot no line has set (unlike a value of null, which a later line may set)."""


@dataclass
class _Summary:
    """What the chart needs from one file of metrics lines."""

    values: dict[int, list[Any]] = field(default_factory=dict)
    """Step -> the values of the long keys of `_SLOTS`, then of the short ones (`_ABSENT` where
    no line set it)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    top: int | None = None
    """The highest step of the file, whose whole merged record is `top_record`."""
    top_record: dict[str, Any] = field(default_factory=dict)


def _summarize(data: bytes) -> _Summary:
    out = _Summary()
    for line in data.splitlines():
        try:
            record = json.loads(line)
            step = step_of(record)
        except (ValueError, KeyError, TypeError):
            continue  # cut short by a kill, not a metrics line, or a step out of range (as `parse_metrics`)
        if "event" in record:
            if isinstance(record.get("event"), str) and type(record.get("step")) is int:
                out.events.append(record)  # as `parse_events`
            continue
        slots = out.values.setdefault(step, [_ABSENT] * (2 * len(_SLOTS)))
        for i, (long, short) in enumerate(_SLOTS):
            if long in record:
                slots[i] = record[long]
            if short in record:
                slots[len(_SLOTS) + i] = record[short]
        if out.top is None or step > out.top:
            out.top, out.top_record = step, {}
        if step == out.top:
            out.top_record.update(record)
    return out


class _Cache:
    """Summaries of closed segments by the digest of their bytes, least recently used out first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[bytes, _Summary] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def summary(self, data: bytes) -> _Summary:
        key = hashlib.blake2b(data, digest_size=16).digest()
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return found
        found = _summarize(data)
        with self._lock:
            self._items[key] = found
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return found


_CACHE = _Cache(CACHED_SEGMENTS)


def read_chart(
    directory: str,
    listdir: Callable[[str], list[str]],
    read_all: Callable[[list[str]], list[bytes | None]],
    max_points: int,
    number: Callable[[Any], float | None],
    event: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> Metrics | None:
    """The step's metrics merged per step and thinned to about `max_points`, or None if it has
    none. `number` turns a value into a finite float or None; `event` an event line into what
    the chart shows."""
    files = metrics_files(directory, listdir)
    if not files:
        return None
    parts = read_all(files)
    values: dict[int, list[Any]] = {}
    events: list[dict[str, Any]] = []
    tops: list[tuple[int, dict[str, Any]]] = []
    for i, data in enumerate(parts):
        if not data:
            continue  # deleted since the listing (a resume rewriting the segments)
        closed = i < len(parts) - 1
        summary = _CACHE.summary(data) if closed else _summarize(data)
        for step, slots in summary.values.items():
            merged = values.get(step)
            if merged is None:
                values[step] = list(slots)
                continue
            for j, value in enumerate(slots):
                if value is not _ABSENT:
                    merged[j] = value
        events.extend(summary.events)
        if summary.top is not None:
            tops.append((summary.top, summary.top_record))
    ordered = sorted(values)
    stride = max(1, math.ceil(len(ordered) / max_points))
    # Thin evenly but always keep the last point: it is the one a user is watching.
    shown = ordered[::stride]
    if ordered and shown[-1] != ordered[-1]:
        shown.append(ordered[-1])
    n = len(_SLOTS)

    def slot(step: int, i: int) -> Any:
        # As `parse_metrics` aliases: the long key's value wins over a short key's.
        long, short = values[step][i], values[step][n + i]
        value = long if long is not _ABSENT else short
        return None if value is _ABSENT else value

    evaluated = [s for s in ordered if values[s][2] is not _ABSENT]
    # Router statistics are logged every few steps: charted at the steps that have them, thinned
    # on their own (the loss's thinning would miss most of them).
    routed = [s for s in ordered if slot(s, 6) is not None]
    routed_shown = routed[:: max(1, math.ceil(len(routed) / max_points))]
    if routed and routed_shown[-1] != routed[-1]:
        routed_shown.append(routed[-1])
    # Seconds per step: between the records of consecutive steps (a step's record is written when
    # it ends), so a gap from a restart or a rewind, where steps are not consecutive in time, is
    # left out; so are pauses for evaluations and checkpoints only where they fall between steps.
    walls = {s: number(slot(s, 5)) for s in ordered}
    step_seconds = [
        b - a
        for s in ordered
        if (a := walls[s]) is not None and (b := walls.get(s + 1)) is not None and b > a
    ]

    return Metrics(
        steps=tuple(shown),
        loss=tuple(number(slot(s, 0)) for s in shown),
        learning_rate=tuple(number(slot(s, 1)) for s in shown),
        total_steps=len(ordered),
        last=_last(ordered[-1], tops) if ordered else {},
        eval_steps=tuple(evaluated),
        eval_loss=tuple(number(slot(s, 2)) for s in evaluated),
        events=tuple(event(e) for e in events),
        tokens_per_second=tuple(number(slot(s, 3)) for s in shown),
        mfu=tuple(number(slot(s, 4)) for s in shown),
        step_seconds=step_time_summary(step_seconds),
        router_steps=tuple(routed_shown),
        router_max_load_ratio=tuple(number(slot(s, 6)) for s in routed_shown),
        router_mean_max_load_ratio=tuple(number(slot(s, 7)) for s in routed_shown),
    )


STEP_TIME_BINS = 20


def step_time_summary(seconds: list[float]) -> dict[str, Any] | None:
    """Percentiles and a histogram (log-spaced bins: a slow step is often 10x a typical one) of the
    seconds per step; None for fewer than two."""
    if len(seconds) < 2:
        return None
    ordered = sorted(seconds)

    def percentile(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    low, high = ordered[0], ordered[-1]
    if high > low:
        ratio = (high / low) ** (1 / STEP_TIME_BINS)
        edges = [low * ratio**i for i in range(STEP_TIME_BINS)] + [high]
    else:
        edges = [low, high]
    counts = [0] * (len(edges) - 1)
    for value in ordered:
        i = next((j for j in range(len(counts)) if value <= edges[j + 1]), len(counts) - 1)
        counts[i] += 1
    return {
        "count": len(ordered),
        "p10": percentile(0.1),
        "median": percentile(0.5),
        "p90": percentile(0.9),
        "p99": percentile(0.99),
        "max": high,
        "edges": edges,
        "counts": counts,
    }


def _last(step: int, tops: list[tuple[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """The highest step's whole record, merged in file order, with the short aliases."""
    record: dict[str, Any] = {}
    for top, part in tops:
        if top == step:
            record.update(part)
    for key, alias in ALIASES.items():
        if key in record:
            record[alias] = record[key]
    return record
