"""What a training's run page gathers beside its loss: what operators otherwise assemble from a
status command, the logs of every host, the metrics file and the alerts channel.

    prediction   <step>/prediction.json (steps.scaling.prediction's format): the predicted eval-loss curve
                 and its band, and every evaluation so far placed on it
    hosts        the latest attempt's pulses (`.logs/attempt-<T>[-host-<h>].pulse`,
                 pipeline.run.in_step.pulse): per host, where it runs, how long since its last
                 pulse and since its last progress
    attempts     each attempt in `.status`: when it started and ended, how (succeeded, preempted,
                 failed, interrupted, still running) and why (`cause`: lost machine, hung, crash
                 loop, error), with the message
    alerts       what the runs that ran the step sent about it (`<prefix>/experiments/alerts/<run
                 id>.jsonl`, pipeline.run.console.alerts)
    host logs    each host's log of the latest attempt, and the last lines of the first host's

Pure readers, like `data`: formats are read by path and JSON, nothing is written.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.records import StatusEvent
from pipeline.core.usable_numbers import finite_number, usable_time
from pipeline.observe.dashboard.records import Metrics
from pipeline.storage.files import Storage
from pipeline.storage.layout import LOGS_DIR, alerts_path, log_token

__all__ = ["PREDICTION_FILE", "RunPage", "read_run_page"]

PREDICTION_FILE = "prediction.json"
SILENT_AFTER = 20.0
"""A host whose last pulse is older than this (four missed pulses of 5 s) is shown as silent."""
MAX_ALERTS = 50

_PULSE = re.compile(r"^attempt-(\d+)(?:-host-(\d+))?\.pulse$")
_HOST_LOG = re.compile(r"^attempt-(\d+)(?:-slice-\d+)?(?:-host-(\d+))?\.log$")


@dataclass(frozen=True)
class RunPage:
    """The run page's sections; each empty where the step has nothing of it."""

    prediction: Mapping[str, Any] | None
    """`source`, `patience`, `final`, `points` [[step, loss, low, high]] and `evaluations`: each
    evaluation so far with its predicted value, band and deviation."""
    hosts: tuple[Mapping[str, Any], ...]
    attempts: tuple[Mapping[str, Any], ...]
    alerts: tuple[Mapping[str, Any], ...]
    host_logs: tuple[tuple[int | None, str], ...]
    """(host, log name) of the latest attempt, host order."""


def read_run_page(
    storage: Storage,
    prefix: str,
    directory: str,
    name: str | None,
    events: Sequence[StatusEvent],
    logs: Sequence[str],
    metrics: Metrics | None,
    now: float,
) -> RunPage:
    """The run page's sections for the step at `directory` (named `name`)."""
    latest = max((e.token for e in events), default=None)
    return RunPage(
        prediction=_prediction(storage, directory, metrics),
        hosts=_hosts(storage, directory, latest, now),
        attempts=_attempts(events),
        alerts=_alerts(storage, prefix, name, events),
        host_logs=_host_logs(logs, latest),
    )


def _curve_at(points: Sequence[Sequence[float]], step: float) -> tuple[float, float, float] | None:
    """(loss, low, high) at `step`, log-linear between points (as steps.scaling.prediction.Curve.at)."""
    steps = [p[0] for p in points]
    if not points or step < steps[0] or step > steps[-1]:
        return None
    i = bisect.bisect_left(steps, step)
    if steps[i] == step:
        return points[i][1], points[i][2], points[i][3]
    (s0, *a), (s1, *b) = points[i - 1], points[i]
    w = (step - s0) / (s1 - s0)
    loss, low, high = (math.exp((1 - w) * math.log(x) + w * math.log(y)) for x, y in zip(a, b, strict=True))
    return loss, low, high


def _prediction(storage: Storage, directory: str, metrics: Metrics | None) -> Mapping[str, Any] | None:
    data = storage.read(f"{directory}/{PREDICTION_FILE}")
    try:
        raw = json.loads(data) if data is not None else None
        points = [[int(p[0]), *(float(v) for v in p[1:4])] for p in raw["points"]]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    if not points or not all(finite_number(v) and v > 0 for p in points for v in p[1:]):
        return None
    evaluations = []
    if metrics is not None:
        for step, loss in zip(metrics.eval_steps, metrics.eval_loss, strict=True):
            expected = _curve_at(points, step)
            if expected is None or loss is None:
                continue
            predicted, low, high = expected
            verdict = "inside" if low <= loss <= high else "above" if loss > high else "below"
            evaluations.append(
                {
                    "step": step,
                    "loss": loss,
                    "predicted": predicted,
                    "low": low,
                    "high": high,
                    "deviation": loss / predicted - 1,
                    "verdict": verdict,
                }
            )
    return {
        "source": str(raw.get("source") or ""),
        "patience": raw.get("patience"),
        "final": {"step": points[-1][0], "loss": points[-1][1], "low": points[-1][2], "high": points[-1][3]},
        "points": points,
        "evaluations": evaluations,
    }


def _hosts(storage: Storage, directory: str, token: int | None, now: float) -> tuple[Mapping[str, Any], ...]:
    if token is None:
        return ()
    found = []
    for entry in storage.listdir(f"{directory}/{LOGS_DIR}"):
        match = _PULSE.match(entry)
        if match is None or int(match[1]) != token:
            continue
        try:
            pulse = json.loads(storage.read(f"{directory}/{LOGS_DIR}/{entry}") or b"")
        except ValueError:
            continue
        if not isinstance(pulse, Mapping):
            continue
        beat = pulse.get("time")
        progress_time = pulse.get("progress_time")
        row = {
            "host": int(match[2]) if match[2] is not None else 0,
            "where": str(pulse.get("where") or ""),
            "pulse_age": max(0.0, now - beat) if usable_time(beat) else None,
            "done": pulse.get("done") if finite_number(pulse.get("done")) else None,
            "total": pulse.get("total") if finite_number(pulse.get("total")) else None,
            "unit": str(pulse.get("unit") or ""),
            "progress_age": max(0.0, now - progress_time) if usable_time(progress_time) else None,
        }
        row["alive"] = row["pulse_age"] is not None and row["pulse_age"] <= SILENT_AFTER
        found.append(row)
    return tuple(sorted(found, key=lambda r: r["host"]))


def _attempts(events: Sequence[StatusEvent]) -> tuple[Mapping[str, Any], ...]:
    """One row per attempt (a RUNNING event and the state event of the same token that ended it)."""
    rows: dict[int, dict[str, Any]] = {}
    for e in events:
        if e.event == "RUNNING":
            rows[e.token] = {
                "attempt": len(rows) + 1,
                "token": e.token,
                "run_id": e.run_id,
                "started": e.time,
                "ended": None,
                "outcome": "RUNNING",
                "cause": "",
                "message": "",
            }
        elif e.event in ("SUCCESS", "FAILED", "PREEMPTED", "CANCELLED") and e.token in rows:
            row = rows[e.token]
            if row["ended"] is not None:
                continue
            cause = e.data.get("cause") if isinstance(e.data, Mapping) else None
            row.update(
                ended=e.time,
                outcome=e.event,
                cause=str(cause) if isinstance(cause, str) else _cause(e),
                message=e.message,
            )
    for row in rows.values():
        ended = row["ended"]
        row["seconds"] = ended - row["started"] if ended is not None else None
    return tuple(rows.values())


def _cause(event: StatusEvent) -> str:
    """The cause of an attempt recorded before causes were (`pipeline.run.scheduler.executor`)."""
    if event.event == "PREEMPTED":
        return "hung" if event.message.startswith("hung:") else "lost machine"
    if event.event == "FAILED":
        return "crash loop" if event.message.startswith("the same crash") else "error"
    return {"CANCELLED": "interrupted"}.get(event.event, "")


def _alerts(
    storage: Storage, prefix: str, name: str | None, events: Sequence[StatusEvent]
) -> tuple[Mapping[str, Any], ...]:
    if name is None:
        return ()
    out: list[Mapping[str, Any]] = []
    for run_id in dict.fromkeys(e.run_id for e in events if e.run_id):
        if not re.fullmatch(r"[0-9A-Za-z_-]+", run_id):
            continue  # a run id is a file name here: anything else is not one a runner wrote
        data = storage.read(alerts_path(prefix, run_id))
        for line in (data or b"").decode("utf-8", "replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, Mapping) and entry.get("step") == name and usable_time(entry.get("time")):
                out.append({**entry, "run_id": run_id})
    return tuple(sorted(out, key=lambda e: e["time"])[-MAX_ALERTS:])


def _host_logs(logs: Sequence[str], token: int | None) -> tuple[tuple[int | None, str], ...]:
    if token is None:
        return ()
    found = []
    for name in logs:
        match = _HOST_LOG.match(name)
        if match is not None and log_token(name) == token:
            found.append((int(match[2]) if match[2] is not None else None, name))
    return tuple(sorted(found, key=lambda item: (item[0] is not None, item[0] or 0, item[1])))
