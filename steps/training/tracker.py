"""The metrics.jsonl tracker train_moe hands Levanter: one line per step, the loss-spike guard,
the live rate and predicted curve, and (in a gang) the decision every host takes together.

It plugs into Levanter as a registered `TrackerConfig` (`drydock_jsonl`); for outputs on object
storage it publishes through `steps.training.metrics_file.MetricsUploader`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import logging
import math
import posixpath
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import jax
import numpy as np
from levanter.tracker.tracker import Tracker, TrackerConfig

from pipeline.steplib import step_events
from steps.files import local_path, write_file
from steps.scaling.prediction import Curve, PredictionWatch
from steps.training import ledger, preemption
from steps.training.checkpointer import last_saved
from steps.training.gang_sync import exchange
from steps.training.metrics_file import read_events, read_metrics
from steps.training.spikes import RewindNeeded, SpikeDetector, SpikePolicy, count_interventions
from steps.training.startup import first_step

logger = logging.getLogger(__name__)

__all__ = ["RATE_WINDOW", "GangTracker", "JsonlTracker", "JsonlTrackerConfig", "decide_together"]

RATE_WINDOW = 20
"""Steps the live step rate (and so the estimated time to finish) is measured over."""


def _scalar(value: Any) -> Any:
    if isinstance(value, jax.Array | np.ndarray | np.generic):
        array = np.asarray(value)
        return array.item() if array.size == 1 else None
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return None  # histograms and summaries stay in Levanter's own trackers


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        elif (scalar := _scalar(value)) is not None:
            out[name] = scalar
    return out


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_CURRENT: list[JsonlTracker] = []
"""The newest tracker of this process (its training's current attempt), for `evaluating`."""

HEARTBEAT_SECONDS = 10.0
"""How often progress is reported again while an in-training evaluation runs."""


@contextlib.contextmanager
def evaluating(every: float = HEARTBEAT_SECONDS) -> Iterator[None]:
    """While an in-training evaluation runs (no training step is logged), report the last
    progress again every `every` seconds from a thread of its own: the runner's watchdog sees the
    training alive. An evaluation of a whole validation set can outlast the watchdog's bound
    (a tiny gang's 20 s; 120 s by default), and nothing else reports during it."""
    trackers = list(_CURRENT)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            for tracker in trackers:
                tracker.heartbeat()

    # The thread inherits the step's context (its write fence included).
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(beat,), name="drydock-eval-heartbeat", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


class JsonlTracker(Tracker):
    """Appends every stepped metrics call to `path` at once, as `{"step": N, ...}`, and watches
    the loss for spikes under a `SpikePolicy`.

    A step is logged in several calls; `read_metrics` merges them into one record per step (and
    train_moe compacts the file that way when training ends). Writing at once matters: a record
    held back until the next step would be lost by a kill right after a checkpoint, since the
    resumed run starts at the following step. Values logged inside jit (step=None) arrive while
    the next step runs, so they are held and written with the next stepped call.

    A step whose loss is a spike or NaN/Inf gets `"spike": "spike"|"nan"|"inf"` in its record, a
    WARNING in the step's `.status` and an event line (`{"event": ..., "step": N, ...}`, which
    `read_metrics` leaves out and `read_events` returns); so does an optimizer update that
    Levanter's skip-step wrapper dropped. When the policy says to rewind, `log` raises
    `RewindNeeded` out of Levanter's training loop, after writing the step's record.

    In a gang this is the leader's tracker; the other processes have a `GangTracker`. At every
    step's loss both share what they decided (`decide_together`): the leader's rewind, any
    process's lost lease. Every process then leaves the loop at the same step, or none does.
    """

    name = "drydock_jsonl"

    def __init__(
        self,
        path: str,
        policy: SpikePolicy | None = None,
        summary_path: str | None = None,
        prediction: Curve | None = None,
        branch: Mapping[str, Any] | None = None,
    ) -> None:
        local = local_path(path)
        if local is None:
            # Object stores cannot append: train_moe appends to a scratch file and uploads it.
            raise ValueError(
                f"JsonlTracker path {path!r}: metrics are appended, so this must be a local path; for an "
                "output on object storage append to a local file and publish it with MetricsUploader"
            )
        self.path = local
        self.summary_path = summary_path or posixpath.join(posixpath.dirname(local), "summary.json")
        self._fs = fsspec.filesystem("file")
        self._fs.makedirs(posixpath.dirname(local), exist_ok=True)
        self._lock = threading.Lock()
        self._unstepped: dict[str, Any] = {}
        self._detector = SpikeDetector(policy) if policy is not None else None
        # Captured here, in the step's thread: metrics may later arrive from callback threads.
        self._context = step_events.current()
        self._guard = step_events.lease_guard()
        # For the live figures in `.progress`: the counters so far (a resumed attempt starts from
        # the events its file kept), the recent step rate, the latest throughput.
        self._events = read_events(local) if self._fs.exists(local) else []
        if branch is not None and not any(e.get("event") == "branch" for e in self._events):
            # A branch's metrics say where they leave the trunk's (readers draw it from there);
            # written once, by the first attempt (a resume keeps the line: its step is the earliest).
            self._append(dict(branch))
            self._events.append(dict(branch))
        self._recent: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)
        self._reported: tuple[int, int | None, float] | None = None
        """(done, total, loss) of the last progress report, to report again after an evaluation."""
        self._last_figures: dict[str, Any] = {}
        self._started = False
        _CURRENT[:] = [self]  # a rewind's or a retry's new tracker replaces the one before
        self._latest: dict[str, float] = {}
        # The predicted eval loss: a resumed attempt catches up on the evaluations already made.
        self._prediction = None if prediction is None else PredictionWatch(prediction)
        if self._prediction is not None and self._fs.exists(local):
            self._prediction.replay(
                [(r["step"], r["eval/loss"]) for r in read_metrics(local) if _finite(r.get("eval/loss"))]
            )

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        pass

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        flat = _flatten(metrics)
        with self._lock:
            if step is None:
                self._unstepped.update(flat)
                return
            record = {"step": int(step), **self._unstepped, **flat, "wall_time": time.time()}
            self._unstepped = {}
            loss = record.get("train/loss")
            kind, rewind = "ok", None
            if self._detector is not None and isinstance(loss, int | float):
                try:
                    kind = self._detector.observe(record["step"], float(loss))
                except RewindNeeded as e:
                    kind, rewind = e.reason, e
                if kind != "ok":
                    record["spike"] = kind
            self._append(record)
        if "train/loss" in flat:
            decide_together(record["step"], rewind, self._guard)
        elif rewind is not None:
            raise rewind
        # Notes first: the progress report below counts them.
        if kind != "ok":
            self._spiked(record["step"], float(loss), kind)  # type: ignore[arg-type]
        if record.get("optim/skipped_step") == 1:
            self._skipped(record)
        compared = self._prediction is not None and _finite(flat.get("eval/loss"))
        if compared:
            self._compare(record["step"], float(flat["eval/loss"]))
        for key, short in (("throughput/tokens_per_second", "tokens_per_second"), ("throughput/mfu", "mfu")):
            if isinstance(record.get(key), int | float):
                self._latest[short] = float(record[key])
        if not self._started:
            # The first stepped record, not the first loss: Levanter's performance hook logs every
            # step from the first, the loss only from step 2 of a fresh run.
            self._started = True
            first_step(record["step"], record["wall_time"])
        if isinstance(loss, int | float) and (clock := ledger.active()) is not None:
            clock.step(record["step"])
        if isinstance(loss, int | float):
            # Levanter logs run_progress = step / num_train_steps beside the loss, where `step` is
            # the 0-based index of the step just finished: step + 1 steps are done.
            fraction = record.get("run_progress")
            total = round(record["step"] / fraction) if isinstance(fraction, float) and fraction > 0 else None
            done = record["step"] + 1
            self._reported = (done, total, float(loss))
            figures = self._figures(done, total, float(loss), record["wall_time"])
            self._last_figures = figures
            step_events.progress(done, total, "steps", data=figures, context=self._context)
        elif compared and self._reported is not None:
            # An evaluation logged on its own (Levanter's hook, after the step's loss; the final
            # one after the last step): the report carries it too, so status shows the same
            # evaluation as the run page, not the one before it.
            done, total, last_loss = self._reported
            figures = self._figures(done, total, last_loss, record["wall_time"])
            step_events.progress(done, total, "steps", data=figures, context=self._context)

    def heartbeat(self) -> None:
        """Report the last progress again, now: the same step, a new time. The watchdog takes a
        new report as a sign of life (not of pace), so a long evaluation is not a hang."""
        if self._reported is None:
            return
        done, total, _loss = self._reported
        step_events.progress(done, total, "steps", data=self._last_figures, context=self._context)

    def _figures(self, done: int, total: int | None, loss: float, now: float) -> dict[str, Any]:
        """What `.progress` carries for status and the dashboard (see `docs/observing.md`)."""
        figures: dict[str, Any] = {"loss": loss if math.isfinite(loss) else repr(loss), **self._latest}
        self._recent.append((done, now))
        if len(self._recent) >= 2:
            (first_done, first_time), (last_done, last_time) = self._recent[0], self._recent[-1]
            if last_time > first_time:
                rate = (last_done - first_done) / (last_time - first_time)
                figures["steps_per_second"] = rate
                if total is not None and rate > 0:
                    figures["eta_seconds"] = (total - done) / rate
        saved = last_saved(self.path)
        if saved is not None:
            figures["checkpoint_step"], figures["checkpoint_time"] = saved
        counts = count_interventions(self._events)
        figures["interventions"] = {k: v for k, v in counts.items() if v}
        # What the runner tells people of (`--notify`): each kind once per new count.
        alerts = {}
        rewinds = [e for e in self._events if e.get("event") == "rewind"]
        if rewinds:
            last = rewinds[-1]
            alerts["rewind"] = {
                "count": len(rewinds),
                "message": str(last.get("message") or f"rewind {len(rewinds)}"),
            }
        if self._prediction is not None:
            if self._prediction.latest is not None:
                figures["prediction"] = self._prediction.latest
            if self._prediction.excursions:
                alerts["off_prediction"] = {
                    "count": self._prediction.excursions,
                    "message": self._prediction.message,
                }
        figures["alerts"] = alerts
        return figures

    def _compare(self, step: int, loss: float) -> None:
        assert self._prediction is not None
        warning = self._prediction.observe(step, loss)
        if warning is None:
            return
        data = {k: v for k, v in (self._prediction.latest or {}).items() if k != "step"}
        with self._lock:
            self._append(
                {"event": "off_prediction", "step": step, "loss": loss, **data, "wall_time": time.time()}
            )
        step_events.warn(warning, {"step": step, **data}, context=self._context)

    def _append(self, record: dict[str, Any]) -> None:
        with self._fs.open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def _spiked(self, step: int, loss: float, kind: str) -> None:
        assert self._detector is not None
        median = self._detector.median
        if kind == "spike" and median:
            ratio = loss / median
            message = f"loss spike at step {step}: {loss:.4f} is {ratio:.1f}x the recent median {median:.4f}"
        else:
            message = f"loss {kind} at step {step}"
        action = self._detector.policy.action
        if action == "rewind":
            message += " (rewinds if it persists)"
        data = {"step": step, "loss": loss if math.isfinite(loss) else repr(loss), "median": median}
        with self._lock:
            self._append({"event": kind, **data, "wall_time": time.time()})
            self._events.append({"event": kind, **data})
        step_events.warn(message, data, context=self._context)

    def _skipped(self, record: dict[str, Any]) -> None:
        step = record["step"]
        loss = record.get("optim/skip_step/loss")
        data = {"step": step, "loss": loss, "threshold": record.get("optim/skip_step/loss_threshold")}
        with self._lock:
            self._append({"event": "skipped_update", **data, "wall_time": time.time()})
            self._events.append({"event": "skipped_update", **data})
        figures = [
            f"{name} {value:.4g} (threshold {threshold:.4g})"
            for name, value, threshold in (
                ("loss", loss, record.get("optim/skip_step/loss_threshold")),
                (
                    "grad norm",
                    record.get("optim/skip_step/grad_norm"),
                    record.get("optim/skip_step/grad_norm_threshold"),
                ),
            )
            if isinstance(value, int | float) and isinstance(threshold, int | float)
        ]
        message = f"optimizer update of step {step} skipped" + (f": {', '.join(figures)}" if figures else "")
        step_events.warn(message, data, context=self._context)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        write_file(self.summary_path, json.dumps(_flatten(metrics), indent=1, default=str).encode())

    def log_artifact(self, artifact_path: Any, *, name: str | None = None, type: str | None = None) -> None:
        pass

    def finish(self) -> None:
        pass


_REASONS = ("", "nan", "inf", "spike")


def decide_together(step: int, rewind: RewindNeeded | None, guard: step_events.LeaseGuard) -> None:
    """At the loss of `step`, on every process of the gang (a collective; nothing in a gang of
    one): share the leader's `rewind` (None elsewhere) and whether any process's lease may have
    expired, then act on it everywhere. A lost lease stops every process (`LeaseExpired`); a
    rewind raises `RewindNeeded` everywhere, the leader's own (with the losses it logs); a
    preemption notice on any process makes every one save this step and stop
    (`steps.training.preemption`)."""
    fence = guard.fence
    lost = fence is not None and fence.remaining() <= 0
    reason = _REASONS.index(rewind.reason) if rewind is not None and rewind.reason in _REASONS else 0
    row = [int(rewind is not None), rewind.trigger_step if rewind else 0, rewind.first_step if rewind else 0]
    rows = exchange([*row, reason, int(lost), int(preemption.received())])
    if rows[:, 5].any():
        # A notice on any host: every host saves this step's checkpoint and stops (its hook).
        preemption.decide(step)
    if rows[:, 4].any():
        hosts = ", ".join(str(i) for i in np.flatnonzero(rows[:, 4]))
        guard.lost(f"training step {step + 1}", f"process(es) {hosts} of the gang may have lost the lease")
    if rows[0, 0]:
        if rewind is not None:
            raise rewind
        trigger, first, code = (int(v) for v in rows[0, 1:4])
        raise RewindNeeded(trigger, first, _REASONS[code] or "spike", {}, None)


class GangTracker(Tracker):
    """The tracker of a gang's other processes: they log nothing (the leader keeps the metrics),
    but at every step's loss they take part in the gang's decision (`decide_together`)."""

    name = "drydock_gang"

    def __init__(self) -> None:
        self._guard = step_events.lease_guard()
        self._context = step_events.current()

    def log_hyperparameters(self, hparams: Mapping[str, Any]) -> None:
        pass

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        flat = _flatten(metrics)
        if step is not None and "train/loss" in flat:
            decide_together(int(step), None, self._guard)
            # Kept by this process only (the leader writes `.progress`): its pulse says how far
            # this host got, which the watchdog and the run page compare across hosts.
            fraction = flat.get("run_progress")
            total = round(int(step) / fraction) if isinstance(fraction, float) and fraction > 0 else None
            step_events.progress(int(step) + 1, total, "steps", context=self._context)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        pass

    def log_artifact(self, artifact_path: Any, *, name: str | None = None, type: str | None = None) -> None:
        pass

    def finish(self) -> None:
        pass


@TrackerConfig.register_subclass("drydock_jsonl")
@dataclasses.dataclass
class JsonlTrackerConfig(TrackerConfig):
    """Levanter tracker config for `JsonlTracker`."""

    path: str = "metrics.jsonl"
    """Where lines are appended: a local path (see `MetricsUploader` for object storage)."""
    spike_policy: str | None = None
    """A `SpikePolicy` as JSON (a string, so that Levanter can log this config); None: no guard."""
    summary_path: str | None = None
    """Where Levanter's run summary goes (a path or URL); None: `summary.json` beside `path`."""
    prediction: str | None = None
    """The predicted eval loss (`steps.scaling.prediction.Curve` as JSON); None: no prediction."""
    branch: str | None = None
    """A branch's `branch` event line as JSON (`pipeline.observe.metrics.branch_event`); None: no
    branch."""

    def init(self, run_id: str | None) -> Tracker:
        if jax.process_index() != 0:
            return GangTracker()
        policy = SpikePolicy(**json.loads(self.spike_policy)) if self.spike_policy else None
        curve = Curve.from_json(json.loads(self.prediction)) if self.prediction else None
        branch = json.loads(self.branch) if self.branch else None
        return JsonlTracker(self.path, policy, self.summary_path, curve, branch)


# -- the Mixtral fix ----------------------------------------------------------------------------------
