"""What the dashboard shows, read from a storage prefix: experiments, step states, configs, logs, metrics.

Pure readers: every function takes a `Storage` (or `StepStore`) and a prefix, reads through
`pipeline.storage.files`'s public API, and returns plain frozen dataclasses; nothing here writes or knows
about HTTP. Formats read:

    <prefix>/experiments/<experiment>-<hash>.json   run manifests (`pipeline.storage.manifests`)
    <prefix>/<label>/.status, .lease, .step.json    the commit protocol (`pipeline.storage.files`)
    <prefix>/<label>/.progress                       a running step's last report (`step_events.progress`)
    <prefix>/<label>/.logs/attempt-<token>*.log      the Ray backend's copy of a step's output
    <prefix>/<label>/metrics.jsonl                   train_moe's per-step metrics (steps.training.tracker)
    <prefix>/<label>/results.json                    evaluate's results (steps.evaluation.evaluate)
    <prefix>/<label>/curve.json                      a curve by checkpoint (steps.evaluation.follow)
    SUCCESS `metrics` in .status                     what `pipeline.observe.compare` compares

The step library's formats are read by path and JSON only: `pipeline` never imports `steps`.
Names coming from a URL (experiment ids, step labels, log names) are checked against what storage
lists before anything is read, so a request cannot reach outside the prefix.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.core.drift import MISSING, json_diff
from pipeline.core.records import Event, StatusEvent, StepRecord
from pipeline.core.usable_numbers import finite_or_none
from pipeline.observe import compare, shown_state
from pipeline.observe.dashboard.records import (
    Comparison,
    EvalResults,
    ExperimentDetail,
    ExperimentSummary,
    Metrics,
    Progress,
    StepDetail,
    StepRow,
)
from pipeline.observe.shown_state import runner_gone
from pipeline.processes import host_id
from pipeline.storage.files import Storage
from pipeline.storage.layout import is_label, step_dir
from pipeline.storage.manifests import list_manifests, list_run_records, manifest_dir, run_record_dir
from pipeline.storage.opening import map_reads
from pipeline.storage.step_store import StepStore

__all__ = [
    "Comparison",
    "EvalResults",
    "ExperimentDetail",
    "ExperimentSummary",
    "Metrics",
    "NotFound",
    "Progress",
    "StepDetail",
    "StepRow",
    "list_experiments",
    "live_state",
    "read_comparison",
    "read_experiment",
    "read_progress",
    "read_run_record",
]


class NotFound(LookupError):
    """The experiment, step or log a request names does not exist under the prefix."""


# ---------------------------------------------------------------------------------------------
# Experiments (manifests)


def _summary(manifest_id: str, manifest: Mapping[str, Any], run: str | None = None) -> ExperimentSummary:
    counts = dict(Counter(str(step.get("state", "UNKNOWN")) for step in manifest.get("steps", [])))
    labels = {
        str(step.get("name")): str(step.get("label"))
        for step in manifest.get("steps", [])
        if isinstance(step, Mapping)
    }
    headline: dict[str, float] = {}
    for step in manifest.get("steps", []):
        recorded = step.get("metrics") if isinstance(step, Mapping) else None
        if isinstance(recorded, Mapping) and recorded:
            # The training loss if there is one, else the step's first metric.
            key = "train/loss" if "train/loss" in recorded else next(iter(recorded))
            value = finite_or_none(recorded[key])
            if value is not None:
                headline[f"{step.get('name')}: {key}"] = value
    return ExperimentSummary(
        id=manifest_id,
        experiment=str(manifest.get("experiment", manifest_id)),
        description=str(manifest.get("description") or ""),
        run_id=str(manifest.get("run_id") or ""),
        started=manifest.get("started"),
        updated=manifest.get("updated"),
        finished=bool(manifest.get("finished")),
        exit_code=manifest.get("exit_code"),
        counts=counts,
        run=run,
        labels=labels,
        metrics=headline,
    )


def _read_manifest(storage: Storage, prefix: str, manifest_id: str) -> Mapping[str, Any]:
    data = storage.read(f"{manifest_dir(prefix)}/{manifest_id}.json")
    if data is None:
        raise NotFound(f"no experiment {manifest_id!r} under {prefix}")
    manifest = json.loads(data)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps"), list):
        raise ValueError("not a Drydock manifest (no `steps` list)")
    return manifest


def list_experiments(storage: Storage, prefix: str) -> list[ExperimentSummary]:
    """Every run under `<prefix>/experiments/`, most recently started first: each run record
    (`experiments/runs/<id>/<run id>.json`), or a manifest's latest run if it has no records (from
    before runs kept them, or only ever found everything cached). Each row says which
    steps changed identity since the previous run of the same experiment.

    A manifest that cannot be parsed is listed with its error instead of hiding the others.
    """
    out = []
    for name in list_manifests(storage, prefix):
        manifest_id = name.removesuffix(".json")
        try:
            manifest = _read_manifest(storage, prefix, manifest_id)
        except NotFound:
            continue  # removed between listing and reading
        except ValueError as e:
            out.append(
                ExperimentSummary(manifest_id, manifest_id, "", "", None, None, False, None, {}, str(e))
            )
            continue
        records = list_run_records(storage, prefix, manifest_id)
        runs = []
        for record in records:
            data = storage.read(f"{run_record_dir(prefix, manifest_id)}/{record}")
            try:
                runs.append(_summary(manifest_id, json.loads(data or b"{}"), record.removesuffix(".json")))
            except (ValueError, AttributeError):
                continue  # a record cut short: the manifest still tells the run
        if not runs:  # a manifest from before runs kept records, or only ever fully cached
            runs.append(_summary(manifest_id, manifest))
        out.extend(runs)
    out.sort(key=lambda s: (s.started or 0.0, s.id))
    previous: dict[str, ExperimentSummary] = {}
    for i, summary in enumerate(out):
        before = previous.get(summary.experiment)
        if before is not None:
            changed = tuple(
                name for name, label in summary.labels.items() if before.labels.get(name) not in (None, label)
            )
            differences = tuple(
                line
                for name in changed
                for line in _versioned_changes(
                    storage, prefix, name, before.labels[name], summary.labels[name]
                )
            )
            # The graph may have changed too (a new sweep point, a renamed step): say which steps
            # came and went, rather than nothing because no step kept its name and changed.
            added = tuple(name for name in summary.labels if name not in before.labels)
            removed = tuple(name for name in before.labels if name not in summary.labels)
            out[i] = dataclasses.replace(
                summary,
                changed=changed,
                differences=differences,
                added=added,
                removed=removed,
                previous=before.id,
            )
        previous[summary.experiment] = summary
    return sorted(out, key=lambda s: (-(s.started or 0.0), s.id))


MAX_DIFFERENCES = 5
"""Versioned values listed per changed step on the experiment list (the step page has them all)."""


def _versioned_changes(storage: Storage, prefix: str, name: str, old: str, new: str) -> list[str]:
    """`name: path old → new` for the versioned values (not the upstream identities) that differ
    between two identities of a step, from their `.step.json`; none if either is unreadable."""
    store = StepStore(storage)
    try:
        a, b = (store.read_step_json(step_dir(prefix, label)) for label in (old, new))
    except Exception:  # a view: a missing or unreadable file just says nothing
        return []
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return []
    diff = json_diff((a.get("identity") or {}).get("versioned"), (b.get("identity") or {}).get("versioned"))
    lines = [f"{name}: {path} {_short(x)} → {_short(y)}" for path, x, y in diff[:MAX_DIFFERENCES]]
    if len(diff) > MAX_DIFFERENCES:
        lines.append(f"{name}: and {len(diff) - MAX_DIFFERENCES} more")
    return lines


def _short(value: Any) -> str:
    text = "absent" if value is MISSING else json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def read_run_record(storage: Storage, prefix: str, manifest_id: str, run: str) -> Mapping[str, Any]:
    """One run record of a manifest; NotFound unless storage lists it."""
    if f"{run}.json" not in list_run_records(storage, prefix, manifest_id):
        raise NotFound(f"experiment {manifest_id!r} has no run {run!r}")
    data = storage.read(f"{run_record_dir(prefix, manifest_id)}/{run}.json")
    manifest = json.loads(data or b"{}")
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps"), list):
        raise ValueError("not a Drydock run record (no `steps` list)")
    return manifest


def live_state(manifest_state: str, record: StepRecord, stale: bool) -> str:
    """The state to show for a step of a run (`pipeline.observe.shown_state`): storage's word where it
    has one, the manifest's otherwise. The manifest is written when a run starts and when it ends,
    so during a run it holds planned states (RUN, WAIT); `.status` is updated as steps go."""
    return shown_state.live_state(record, stale=stale, planned=manifest_state)


def read_progress(storage: Storage, directory: str, events: Sequence[StatusEvent]) -> Progress | None:
    """The `.progress` of the step's latest attempt; None if there is none or it is an older attempt's."""
    record = StepStore(storage).progress(directory, tuple(events))
    if record is None:
        return None
    try:
        return Progress(
            done=float(record["done"]),
            total=None if record.get("total") is None else float(record["total"]),
            unit=str(record.get("unit") or ""),
            time=float(record.get("time") or 0.0),
            data=record.get("data") or {},
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _step_row(entry: Mapping[str, Any], record: StepRecord, state: str, progress: Progress | None) -> StepRow:
    manifest_state = str(entry.get("state", "UNKNOWN"))
    return StepRow(
        label=str(entry["label"]),
        name=str(entry.get("name", "")),
        fn=str(entry.get("fn", "")),
        deps=tuple(entry.get("deps", ())),
        soft_deps=tuple(entry.get("soft_deps", ())),
        manifest_state=manifest_state,
        storage_state=record.state,
        state=state,
        progress=progress,
        reason=str(entry.get("reason") or ""),
        started=entry.get("started"),
        ended=entry.get("ended"),
        duration=entry.get("duration"),
        attempts=entry.get("attempts"),
        error=entry.get("error"),
    )


def read_experiment(
    store: StepStore, prefix: str, manifest_id: str, now: float | None = None, run: str | None = None
) -> ExperimentDetail:
    """One experiment's manifest with the current `.status` of each of its steps; with `run`, that
    run's own record, each step in the state that run left it.

    Raises NotFound for an id that is not a manifest under the prefix, ValueError for a corrupt one.
    """
    if f"{manifest_id}.json" not in store.storage.listdir(manifest_dir(prefix)):
        raise NotFound(f"no experiment {manifest_id!r} under {prefix}")
    if run is not None:
        record = read_run_record(store.storage, prefix, manifest_id, run)
        entries = [e for e in record["steps"] if isinstance(e, Mapping) and is_label(str(e.get("label", "")))]
        rows = [_step_row(e, StepRecord(), str(e.get("state", "UNKNOWN")), None) for e in entries]
        environment = {k: record.get(k) for k in ("git", "versions", "host", "argv", "prefix") if k in record}
        return ExperimentDetail(_summary(manifest_id, record, run), tuple(rows), environment)
    manifest = _read_manifest(store.storage, prefix, manifest_id)
    now = time.time() if now is None else now
    entries = [e for e in manifest["steps"] if isinstance(e, Mapping) and is_label(str(e.get("label", "")))]
    dirs = [step_dir(prefix, str(e["label"])) for e in entries]
    records = map_reads(
        store.storage, lambda d: store.record(d, with_metadata=False), dirs, threads=8, minimum=2
    )
    local_host = host_id()
    rows = []
    for entry, directory, record in zip(entries, dirs, records, strict=True):
        state = live_state(str(entry.get("state", "UNKNOWN")), record, runner_gone(record, now, local_host))
        # Only running steps have progress worth a read: a sweep's finished steps cost nothing more.
        progress = read_progress(store.storage, directory, record.events) if state == Event.RUNNING else None
        rows.append(_step_row(entry, record, state, progress))
    environment = {k: manifest.get(k) for k in ("git", "versions", "host", "argv", "prefix") if k in manifest}
    return ExperimentDetail(_summary(manifest_id, manifest), tuple(rows), environment)


def state_counts(rows: Sequence[StepRow]) -> dict[str, int]:
    """Steps per shown state, for an experiment's header."""
    return dict(Counter(str(row.state) for row in rows))


def read_comparison(
    store: StepStore, prefix: str, manifest_ids: Sequence[str], best: str | None = None
) -> Comparison:
    """Rows of the runs `manifest_ids` (experiments under the prefix) side by side.

    Raises NotFound for an id that is not a manifest under the prefix."""
    listed = set(store.storage.listdir(manifest_dir(prefix)))
    steps: list[compare.CompareStep] = []
    for manifest_id in dict.fromkeys(manifest_ids):
        if f"{manifest_id}.json" not in listed:
            raise NotFound(f"no experiment {manifest_id!r} under {prefix}")
        manifest = _read_manifest(store.storage, prefix, manifest_id)
        steps.extend(
            s for s in compare.manifest_steps(manifest, manifest_id, prefix.rstrip("/")) if is_label(s.label)
        )
    rows = compare.merge_shared(compare.compare_rows(steps, store)) if steps else []
    if best is not None and best not in compare.metric_names(rows):
        raise NotFound(f"no metric {best!r} to pick the best run by")
    picked = compare.best_row(rows, best)
    return Comparison(
        runs=tuple(dict.fromkeys(manifest_ids)),
        params=tuple(compare.leading_params(rows)),
        metrics=tuple(compare.metric_names(rows)),
        rows=tuple(rows),
        curves=tuple(compare.loss_curves(store, rows)),
        checkpoint_curves=tuple(compare.checkpoint_curves(store, steps, rows)),
        best_metric=picked[0] if picked else None,
        best_label=picked[1].label if picked else None,
    )
