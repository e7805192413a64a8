"""What the dashboard shows of one step (`pipeline.observe.dashboard.data` reads experiments):
its record, progress, metrics chart, evaluation results and curve, report, and attempt logs,
read from its directory through `pipeline.storage`'s public API, as plain frozen records."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipeline.core.identity import HASH_CHARS
from pipeline.core.records import Event, StepRecord
from pipeline.core.usable_numbers import finite_or_none
from pipeline.observe import compare
from pipeline.observe.dashboard.chart import read_chart
from pipeline.observe.dashboard.data import NotFound, read_progress
from pipeline.observe.dashboard.records import (
    EvalResults,
    Metrics,
    StepDetail,
)
from pipeline.observe.evidence import EVIDENCE_DIR, DataSample, read_data_sample
from pipeline.observe.metrics import METRICS_DIR, METRICS_FILE
from pipeline.observe.shown_state import runner_gone
from pipeline.processes import host_id
from pipeline.storage.files import Storage
from pipeline.storage.layout import LOGS_DIR, is_label, is_payload, log_token, step_dir
from pipeline.storage.opening import map_reads
from pipeline.storage.step_store import StepStore

__all__ = [
    "CURVE_FILE",
    "MAX_CHART_POINTS",
    "MAX_LOG_BYTES",
    "RESULTS_FILE",
    "has_data",
    "read_curve",
    "read_data",
    "read_log",
    "read_metrics",
    "read_results",
    "read_step",
    "recorded_report",
]

RESULTS_FILE = "results.json"
CURVE_FILE = "curve.json"

MAX_CHART_POINTS = 2000
"""Longer curves are thinned to about this many points: a browser draws them as fast, and a
100,000-step run does not ship megabytes of JSON per page view."""
MAX_LOG_BYTES = 512 * 1024
"""A log larger than this is shown by its last bytes (the end is where a failure is)."""


def _check_label(storage: Storage, prefix: str, label: str) -> str:
    """The step's directory, if `label` is a step label with a directory under the prefix."""
    if not is_label(label):
        raise NotFound(f"{label!r} is not a step label (name-<{HASH_CHARS} hex>)")
    directory = step_dir(prefix, label)
    if not storage.listdir(directory):
        raise NotFound(f"step {label} has no directory under {prefix}")
    return directory


def read_data(storage: Storage, prefix: str, label: str, reason: str | None, samples: int) -> DataSample:
    """What the curation step `label` removed and why, beside what it kept
    (`pipeline.observe.evidence`); `NotFound` if it wrote no evidence."""
    directory = _check_label(storage, prefix, label)
    sample = read_data_sample(storage, directory, per_reason=samples, kept=samples, reason=reason)
    if sample is None:
        raise NotFound(f"step {label} has no evidence of what it removed (not a curation step, or not run)")
    if reason is not None and reason not in sample.reasons:
        raise NotFound(f"step {label} removed nothing for {reason!r}")
    return sample


def has_data(storage: Storage, prefix: str, label: str) -> bool:
    """Whether the step wrote evidence of what it removed (the step page links its data page)."""
    return bool(storage.listdir(f"{step_dir(prefix, label)}/{EVIDENCE_DIR}"))


def read_metrics(storage: Storage, directory: str) -> Metrics | None:
    """The step's metrics merged per step (later lines win), or None if it has none.

    Lines are merged and aliased as `pipeline.observe.metrics` does for the training step; the
    segments of an output on object storage are read in order, as one file, and each closed one
    is parsed once per dashboard process (`chart`).
    """
    return read_chart(
        directory, storage.listdir, _read_all(storage), MAX_CHART_POINTS, finite_or_none, _event
    )


def _event(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event line as the chart and the interventions table show it."""
    kind = str(event["event"])
    loss = event.get("loss")
    if kind == "rewind" and isinstance(event.get("losses"), Mapping):
        loss = event["losses"].get(str(event["step"]))
    message = event.get("message")
    if not isinstance(message, str):
        shown = finite_or_none(loss)
        message = f"{kind} at step {event['step']}" + (f": loss {shown:.4g}" if shown is not None else "")
    return {"step": int(event["step"]), "event": kind, "loss": finite_or_none(loss), "message": message}


def read_results(storage: Storage, directory: str) -> EvalResults | None:
    """The step's results.json (evaluate's format), or None if there is none.

    Raises ValueError if the file is there but is not in that format.
    """
    data = storage.read(f"{directory}/{RESULTS_FILE}")
    if data is None:
        return None
    raw = json.loads(data)
    sets = raw.get("validation_sets") if isinstance(raw, dict) else None
    if not isinstance(sets, dict):
        raise ValueError(f"{RESULTS_FILE} has no `validation_sets` mapping")
    keys = ("loss", "bits_per_byte", "perplexity")
    return EvalResults(
        checkpoint=raw.get("checkpoint"),
        checkpoint_step=raw.get("checkpoint_step"),
        sets={
            name: {k: finite_or_none(v.get(k)) for k in keys}
            for name, v in sets.items()
            if isinstance(v, dict)
        },
        average={k: finite_or_none((raw.get("average") or {}).get(k)) for k in keys},
    )


def recorded_report(record: StepRecord) -> str | Mapping[str, Any] | None:
    """The report recorded with the step's last SUCCESS, if it is one and has one."""
    last = record.last
    if last is None or last.event != Event.SUCCESS or not isinstance(last.data, Mapping):
        return None
    report = last.data.get("report")
    return report if isinstance(report, str | Mapping) and report else None


def _log_order(name: str) -> tuple[int, str]:
    token = log_token(name)
    return (-1 if token is None else token, name)


def read_step(store: StepStore, prefix: str, label: str, now: float | None = None) -> StepDetail:
    """Everything about one step directory. Raises NotFound if `label` has no directory."""
    storage = store.storage
    directory = _check_label(storage, prefix, label)
    record = store.record(directory, with_metadata=False)
    entries = storage.listdir(directory)
    logs = tuple(
        sorted((n for n in storage.listdir(f"{directory}/{LOGS_DIR}") if n.endswith(".log")), key=_log_order)
    )
    files = tuple(sorted(n for n in entries if is_payload(n)))
    problems = []
    metrics = results = None
    report = recorded_report(record)
    if METRICS_FILE in entries or METRICS_DIR in entries:
        metrics = read_metrics(storage, directory)
    # An evaluation's recorded report shows its table; results.json is read for runs recorded
    # before steps recorded their reports.
    if RESULTS_FILE in entries and report is None:
        try:
            results = read_results(storage, directory)
        except (ValueError, AttributeError) as e:
            problems.append(f"{RESULTS_FILE} is not in the evaluate step's format: {e}")
    lease = record.lease if record.lease is not None else store.lease(directory)
    now = time.time() if now is None else now
    return StepDetail(
        label=label,
        step_json=store.read_step_json(directory),
        events=record.events,
        state=record.state,
        lease=lease,
        corrupt=record.corrupt,
        logs=logs,
        files=files,
        metrics=metrics,
        results=results,
        problems=tuple(problems),
        stale=runner_gone(record, now, host_id()),
        progress=read_progress(storage, directory, record.events),
        curve=read_curve(storage, directory) if CURVE_FILE in entries else None,
        report=report,
    )


def read_curve(storage: Storage, directory: str) -> Mapping[str, Any] | None:
    """A follower's `curve.json`: `{"ylabel", "steps": [...], "series": {name: [value per step]},
    "errors": {...}, "levels": {...}}`, non-finite values as gaps; None if it is missing or not in
    that form (`compare.read_checkpoint_curve`)."""
    return compare.read_checkpoint_curve(storage.read(f"{directory}/{CURVE_FILE}"))


def read_log(storage: Storage, prefix: str, label: str, name: str) -> tuple[str, bool]:
    """A log of the step: its text (the last MAX_LOG_BYTES) and whether it was cut.

    Only names that `.logs/` lists are read.
    """
    directory = _check_label(storage, prefix, label)
    if name not in storage.listdir(f"{directory}/{LOGS_DIR}"):
        raise NotFound(f"step {label} has no log {name!r}")
    data = storage.read(f"{directory}/{LOGS_DIR}/{name}")
    if data is None:  # gone since the listing, or a link out of the prefix (never followed)
        raise NotFound(f"step {label} has no log {name!r} inside the prefix")
    cut = len(data) > MAX_LOG_BYTES
    return data[-MAX_LOG_BYTES:].decode("utf-8", errors="replace"), cut


MAX_FIGURE_BYTES = 8 * 1024 * 1024
"""The largest figure a step page shows."""


def figures_of(files: Sequence[str]) -> list[str]:
    """The step's own figures among its top-level output files: PNG images (a fit's `fit.png`, an
    evaluation's `curves.png`), shown on its page. PNG only: an SVG can carry script."""
    return [name for name in files if name.lower().endswith(".png")]


def read_figure(storage: Storage, prefix: str, label: str, name: str) -> bytes:
    """A figure of the step (a name `figures_of` gives for its output files), at most
    `MAX_FIGURE_BYTES`."""
    directory = _check_label(storage, prefix, label)
    if name not in figures_of([n for n in storage.listdir(directory) if is_payload(n)]):
        raise NotFound(f"step {label} has no figure {name!r}")
    data = storage.read(f"{directory}/{name}")
    if data is None or len(data) > MAX_FIGURE_BYTES or not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise NotFound(f"step {label} has no figure {name!r} inside the prefix that is a PNG under 8 MiB")
    return data


def _read_all(storage: Storage) -> Callable[[list[str]], list[bytes | None]]:
    """Reads many files of `storage` at once (in parallel on an object store): a long training's
    metrics segments."""
    return lambda paths: map_reads(storage, storage.read, paths, minimum=8)
