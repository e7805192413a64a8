"""What the train step adds to Levanter's trainer: a metrics.jsonl tracker with a loss-spike
guard (and, for outputs on object storage, the uploader that publishes it), router statistics for
every MoE family, and the Mixtral differentiable-logging fix.

Everything here plugs into Levanter through its own extension points (a registered
`TrackerConfig`, a `WatchConfig` subclass); the one patch, `fix_mixtral_jit_log`, is applied
only when a probe shows the bug it fixes is present.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import math
import os
import posixpath
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import fsspec
import haliax as hax
import jax
import jax.numpy as jnp
import levanter.tracker
import levanter.tracker.tracker_fns as tracker_fns
import numpy as np
from levanter.callbacks.watch import WatchCallback, WatchConfig
from levanter.checkpoint import Checkpointer, CheckpointerConfig
from levanter.data.dataset import AsyncDataset
from levanter.tracker.tracker import NoopTracker, Tracker, TrackerConfig

from pipeline.run import step_events
from steps.files import exists, local_path, write_file
from steps.gang_sync import exchange
from steps.metrics import (
    MetricsUploader,
    begin_metrics,
    publish_metrics,
    read_events,
    read_metrics,
    write_metrics,
)
from steps.prediction import Curve, PredictionWatch
from steps.spikes import Rewind, RewindNeeded, SpikeDetector, SpikePolicy, count_interventions, data_batch

logger = logging.getLogger(__name__)

__all__ = [
    "GangTracker",
    "JsonlTrackerConfig",
    "MetricsCheckpointerConfig",
    "MetricsUploader",
    "RouterStatsWatchConfig",
    "SkippedBatches",
    "begin_metrics",
    "checkpoint_saved",
    "decide_together",
    "fix_eval_tag_arrays",
    "fix_mixtral_jit_log",
    "fresh_tensorstore_cache",
    "jit_log_breaks_grad",
    "local_path",
    "publish_metrics",
    "read_events",
    "read_metrics",
    "router_stats",
    "scale_learning_rate",
    "skip_batches",
    "wait_for_checkpoints",
    "write_file",
    "write_metrics",
]

RATE_WINDOW = 20
"""Steps the live step rate (and so the estimated time to finish) is measured over."""

# -- metrics.jsonl and the loss-spike guard ---------------------------------------------------------


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
        if self._prediction is not None and _finite(flat.get("eval/loss")):
            self._compare(record["step"], float(flat["eval/loss"]))
        for key, short in (("throughput/tokens_per_second", "tokens_per_second"), ("throughput/mfu", "mfu")):
            if isinstance(record.get(key), int | float):
                self._latest[short] = float(record[key])
        if isinstance(loss, int | float):
            # Levanter logs run_progress = step / num_train_steps beside the loss, where `step` is
            # the 0-based index of the step just finished: step + 1 steps are done.
            fraction = record.get("run_progress")
            total = round(record["step"] / fraction) if isinstance(fraction, float) and fraction > 0 else None
            done = record["step"] + 1
            figures = self._figures(done, total, float(loss), record["wall_time"])
            step_events.progress(done, total, "steps", data=figures, context=self._context)

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
        saved = _SAVED.get(self.path)
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


class MetricsCheckpointer(Checkpointer):
    """Levanter's checkpointer, publishing the metrics logged so far before each checkpoint.

    A run resumed from checkpoint N computes (and logs) only the steps after N again, so the lines
    of the steps up to N must be on the output before checkpoint N can be found: uploading only
    every few seconds would lose them for good if the run died in between. The checkpoint's own
    step may log more after the save began (router statistics, evaluation): that is published when
    the checkpoint commits.

    TensorStore writes checkpoints from native code, which the write fence cannot see, so each
    save first checks the step's lease (`LeaseExpired`), and refuses a step whose complete
    checkpoint exists but was not saved by this checkpointer (`LeaseExpired` too): an attempt
    resumes after its latest complete checkpoint, so another attempt must have saved it, and
    overwriting it could change the bytes a newer owner has committed.
    """

    metrics_path: str
    retention: dict[str, Any] | None = None
    """`prune_checkpoints` arguments (interval, keep, keep_every, final_step); None keeps all."""

    def save_checkpoint(
        self, tree: Any, step: int, destination: str, commit_callback: Any = None, **kwargs: Any
    ) -> Any:
        _CHECKPOINTERS[self.metrics_path] = self
        # TensorStore writes the checkpoint from native code, which the write fence cannot see:
        # check the lease before handing it over, and never write over another attempt's save.
        # Every process of a gang saves its shards together, so they decide together too.
        what = f"the checkpoint of step {step}"
        guard = step_events.lease_guard()
        lost = guard.fence is not None and guard.fence.remaining() <= 0
        path = os.path.join(kwargs.get("base_path_override") or self.base_path, destination)
        saved = self.__dict__.setdefault("_saved_here", set())
        taken = int(step) not in saved and exists(os.path.join(path, "metadata.json"))
        rows = exchange([int(lost), int(taken)])
        if rows[:, 0].any():
            guard.lost(what, "the lease may have expired (on a process of the gang)")
        if rows[:, 1].any():
            guard.lost(
                f"{what} at {path}",
                "another attempt of this step has saved it (this one lost its lease, or its clock is off)",
            )
        saved.add(int(step))
        publish_metrics(self.metrics_path)

        def committed() -> None:
            checkpoint_saved(self.metrics_path, int(step), time.time())
            try:
                publish_metrics(self.metrics_path)
            except Exception as e:  # the periodic uploads and the final one retry (or stop: lease lost)
                logger.warning("could not upload metrics after the checkpoint at step %s: %s", step, e)
            if commit_callback is not None:
                commit_callback()
            self._prune(kwargs.get("base_path_override") or self.base_path)

        return super().save_checkpoint(tree, step, destination, committed, **kwargs)

    def _prune(self, root: str) -> None:
        """Apply the retention policy under `root` once a checkpoint has committed (one host)."""
        if not self.retention or jax.process_index() != 0:
            return
        from steps.checkpoints import prune_checkpoints

        try:
            deleted = prune_checkpoints(root, **self.retention)
        except Exception as e:  # retention must never fail training; the next save tries again
            logger.warning("could not delete old checkpoints under %s: %s", root, e)
            return
        if deleted:
            logger.info("retention: deleted the checkpoints of steps %s", deleted)


# The checkpointer of each training attempt, by metrics path: a rewind waits for its saves.
_CHECKPOINTERS: dict[str, Checkpointer] = {}
# The latest checkpoint saved, (step, time), by metrics path: the tracker reports its age.
_SAVED: dict[str, tuple[int, float]] = {}


def checkpoint_saved(metrics_path: str, step: int, when: float) -> None:
    """Tell the tracker of `metrics_path` that the checkpoint of `step` is complete as of `when`."""
    _SAVED[metrics_path] = (step, when)


def wait_for_checkpoints(metrics_path: str) -> None:
    """Wait until the checkpoint saves of the attempt logging to `metrics_path` have finished
    (a rewind must not delete checkpoints while one is still being written)."""
    checkpointer = _CHECKPOINTERS.pop(metrics_path, None)
    if checkpointer is not None:
        checkpointer.wait_until_finished()


@dataclasses.dataclass
class MetricsCheckpointerConfig(CheckpointerConfig):
    """`TrainerConfig.checkpointer` whose checkpointer is a `MetricsCheckpointer` for `metrics_path`."""

    metrics_path: str = "metrics.jsonl"
    """The local file the metrics tracker appends to (published only if it has a running uploader)."""
    retention: dict[str, Any] | None = None
    """See `MetricsCheckpointer.retention`."""

    def create(self, run_id: Any) -> Checkpointer:
        checkpointer = super().create(run_id)
        # Levanter builds the checkpointer from its own fields (whatever they are in this version);
        # only the class changes, so that save_checkpoint publishes first.
        checkpointer.__class__ = MetricsCheckpointer
        checkpointer.metrics_path = self.metrics_path  # type: ignore[attr-defined]
        checkpointer.retention = self.retention  # type: ignore[attr-defined]
        return checkpointer


_REASONS = ("", "nan", "inf", "spike")


def decide_together(step: int, rewind: RewindNeeded | None, guard: step_events.LeaseGuard) -> None:
    """At the loss of `step`, on every process of the gang (a collective; nothing in a gang of
    one): share the leader's `rewind` (None elsewhere) and whether any process's lease may have
    expired, then act on it everywhere. A lost lease stops every process (`LeaseExpired`); a
    rewind raises `RewindNeeded` everywhere, the leader's own (with the losses it logs)."""
    fence = guard.fence
    lost = fence is not None and fence.remaining() <= 0
    reason = _REASONS.index(rewind.reason) if rewind is not None and rewind.reason in _REASONS else 0
    row = [int(rewind is not None), rewind.trigger_step if rewind else 0, rewind.first_step if rewind else 0]
    rows = exchange([*row, reason, int(lost)])
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
    """The predicted eval loss (`steps.prediction.Curve` as JSON); None: no prediction."""
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

_ORIGINAL_JIT_LOG = tracker_fns.jit_log


def _differentiable_jit_log(metrics: Any, *, step: int | None = None) -> None:
    # Same as Levanter's jit_log, with jax.debug.callback (which has a JVP rule and is called on
    # primal values only) instead of io_callback (which has none).
    if tracker_fns._global_tracker is None:
        tracker_fns._log_missing_tracker_once()
        return
    if not tracker_fns._should_use_callback:
        tracker_fns._global_tracker.log(metrics, step=step, commit=False)
        return
    jax.debug.callback(functools.partial(tracker_fns._do_jit_log, step=step), metrics)


def jit_log_breaks_grad() -> bool:
    """Whether `levanter.tracker.jit_log` inside a differentiated function fails (the Mixtral bug)."""

    def f(x: jax.Array) -> jax.Array:
        levanter.tracker.jit_log({"probe": x})
        return x * x

    with tracker_fns.current_tracker(NoopTracker()):
        try:
            jax.jit(jax.grad(f))(jnp.float32(1.0)).block_until_ready()
        except ValueError as e:
            if "do not support JVP" in str(e):
                return True
            raise
    return False


def fix_mixtral_jit_log() -> bool:
    """Make Levanter's in-loss router logging differentiable, if (and only if) it is not.

    Levanter's Mixtral calls `levanter.tracker.jit_log` inside the loss, and `jit_log` uses
    `io_callback`, which cannot be differentiated: training fails at its first step with "IO
    callbacks do not support JVP". Swapping the transport keeps every router statistic. Returns
    whether the fix is in place; a Levanter that fixed the bug is left alone.
    """
    if levanter.tracker.jit_log is _differentiable_jit_log:
        return True
    if not jit_log_breaks_grad():
        logger.info("levanter.tracker.jit_log is differentiable in this Levanter; no fix needed")
        return False
    logger.info("Mixtral: routing levanter.tracker.jit_log through jax.debug.callback (differentiable)")
    tracker_fns.jit_log = _differentiable_jit_log
    levanter.tracker.jit_log = _differentiable_jit_log
    return True


# -- the multi-process evaluation fix ---------------------------------------------------------------


def _host_tag_arrays(self: Any) -> list[Any]:
    # As Levanter's DomainTaggedDataset._compute_tag_arrays, but host (numpy) arrays: the loader
    # stacks them into the batch and places the batch on the devices itself.
    arrays = []
    for _dataset, tags in self.datasets:
        array = np.zeros(self.num_tags, dtype=np.int32)
        array[[self.tag_to_index[tag] for tag in tags]] = 1
        arrays.append(array)
    return arrays


def fix_eval_tag_arrays() -> bool:
    """Make Levanter's evaluation work on more than one device; whether it was needed.

    Levanter's `DomainTaggedDataset` makes each validation set's tag array with `jnp.asarray`
    while the trainer's mesh is current: with several devices (one process's, or a gang's) that
    is an array on all of them, and the data loader, which stacks a batch on one device before
    placing it, fails ("Received incompatible devices for jitted computation ... device ids [0,
    2048]"). Host arrays are what the loader expects. Applied only with more than one device.
    """
    if jax.device_count() == 1:
        return False
    from levanter.eval import DomainTaggedDataset

    DomainTaggedDataset._compute_tag_arrays = _host_tag_arrays  # type: ignore[method-assign]
    return True


# -- router statistics -----------------------------------------------------------------------------


def _loads(router_logits: Any, token: Any, experts: Any, k: int) -> jax.Array:
    probs = jax.nn.softmax(router_logits.rearrange((token, experts)).array.astype(jnp.float32), axis=-1)
    _, chosen = jax.lax.top_k(probs, k)
    counts = jnp.bincount(chosen.reshape(-1), length=experts.size)
    return counts / counts.sum()


@hax.named_jit
def router_stats(model: Any, tokens: Any, attn_mask: Any) -> dict[str, jax.Array]:
    """Per-layer expert load (share of top-k assignments), max-load ratio and load entropy.

    A forward replay of the decoder layers that reads each router, outside any gradient: it
    works the same for Qwen3-MoE (which logs no router statistics itself) and Mixtral.
    `max_load_ratio` is max_e(load_e) x experts: 1.0 is perfectly balanced.
    """
    from levanter.models.qwen3_moe import Qwen3MoeLMHeadModel

    config = model.config
    out: dict[str, jax.Array] = {}
    ratios = []
    if hasattr(model, "router_loads"):  # drydock_moe reads its own routers (with their bias)
        for i, load in enumerate(model.router_loads(tokens, attn_mask)):
            ratios.append(load.max() * config.num_experts)
            out[f"router/layer{i}/max_load_ratio"] = ratios[-1]
            out[f"router/layer{i}/load_entropy"] = -(load * jnp.log(load + 1e-9)).sum()
        out["router/max_load_ratio"] = jnp.max(jnp.stack(ratios))
        out["router/mean_max_load_ratio"] = jnp.mean(jnp.stack(ratios))
        return out
    qwen = isinstance(model, Qwen3MoeLMHeadModel)
    experts, k = config.Experts, config.num_experts_per_tok
    x = model.embeddings.embed(tokens)
    for i, layer in enumerate(model.transformer.layers.unstacked()):
        h = layer.input_layernorm(x)
        x = x + layer.self_attn(x=h, mask=attn_mask, key=None)
        h = layer.post_attention_layernorm(x)
        moe = layer.mlp if qwen else layer.block_sparse_moe
        flat = hax.flatten_axes(
            h, old_axes=[h.resolve_axis("batch"), h.resolve_axis(config.max_Pos.name)], new_axis="token"
        )
        load = _loads(moe.gate(flat), flat.resolve_axis("token"), experts, k)
        if qwen:
            x = x + moe(h)
        else:
            moe_out, _ = moe(h)
            shared = layer.shared_mlp(h) if layer.shared_mlp is not None else 0
            x = x + shared + moe_out
        ratio = load.max() * experts.size
        ratios.append(ratio)
        out[f"router/layer{i}/max_load_ratio"] = ratio
        out[f"router/layer{i}/load_entropy"] = -(load * jnp.log(load + 1e-9)).sum()
    out["router/max_load_ratio"] = jnp.max(jnp.stack(ratios))
    out["router/mean_max_load_ratio"] = jnp.mean(jnp.stack(ratios))
    return out


class RouterStatsCallback(WatchCallback):
    """Levanter's watch callback (gradient and parameter norms) plus `router_stats` on a fixed batch."""

    def __init__(self, data_config: Any, seq_len: int, batch_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._data_config = data_config
        self._seq_len = seq_len
        self._batch_size = batch_size
        self._batch: Any = None

    def _probe_batch(self, model: Any) -> Any:
        if self._batch is None:
            from levanter.data import DataLoader
            from levanter.utils.mesh import MeshConfig

            pos = model.config.max_Pos.resize(self._seq_len)
            sets = self._data_config.validation_sets(pos)
            dataset = next(iter(sets.values())) if sets else None
            if dataset is None:
                from levanter.schedule import BatchSchedule

                dataset = self._data_config.train_set(
                    pos, BatchSchedule(self._batch_size), key=jax.random.PRNGKey(0)
                )
            # Hooks run under the parameter mapping; the loader needs the compute mapping.
            loader = DataLoader(
                dataset,
                batch_size=self._batch_size,
                mesh=hax.partitioning._get_mesh(),
                axis_resources=MeshConfig().resolved_compute_mapping,
            )
            self._batch = next(iter(loader))
        return self._batch

    def on_step(self, step_info: Any, cb_info: Any) -> None:
        super().on_step(step_info, cb_info)
        model = step_info.eval_model
        batch = self._probe_batch(model)
        stats = router_stats(model, batch.tokens, batch.attn_mask)
        levanter.tracker.log(jax.device_get(stats), step=int(step_info.step))


@dataclasses.dataclass(frozen=True)
class RouterStatsWatchConfig(WatchConfig):
    """`TrainerConfig.watch` that also logs router statistics every `interval` steps."""

    data_config: Any = None
    seq_len: int = 128
    batch_size: int = 8

    def build(self) -> RouterStatsCallback:
        return RouterStatsCallback(
            self.data_config,
            self.seq_len,
            self.batch_size,
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histograms,
            split_scan_layers=self.split_scan_layers,
        )


# -- rewinds: skipped data batches and a lowered learning rate --------------------------------------


class SkippedBatches(AsyncDataset):
    """A training dataset whose batches in `skipped` (inclusive ranges of data batches) are never
    read: training step `s` gets data batch `spikes.data_batch(skipped, s)`."""

    def __init__(self, inner: AsyncDataset, skipped: list[tuple[int, int]], batch_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.skipped = skipped
        self.batch_size = batch_size
        self._count = sum(b - a + 1 for a, b in skipped) * batch_size

    def _index(self, index: int) -> int:
        step, within = divmod(int(index), self.batch_size)
        return data_batch(self.skipped, step) * self.batch_size + within

    async def async_len(self) -> int:
        return max(0, await self.inner.async_len() - self._count)

    def is_finite(self) -> bool:
        return self.inner.is_finite()

    async def get_batch(self, indices: Sequence[int]) -> Sequence[Any]:
        return await self.inner.get_batch([self._index(i) for i in indices])

    async def getitem_async(self, index: int) -> Any:
        return await self.inner.getitem_async(self._index(index))


def skip_batches(data: Any, skipped: list[tuple[int, int]], batch_size: int) -> Any:
    """A copy of the Levanter data config `data` whose training set leaves out `skipped` batches."""
    if not skipped:
        return data
    data = copy.copy(data)
    train_set = data.train_set

    def skipping_train_set(*args: Any, **kwargs: Any) -> AsyncDataset:
        return SkippedBatches(train_set(*args, **kwargs), skipped, batch_size)

    object.__setattr__(data, "train_set", skipping_train_set)
    return data


def scale_learning_rate(optimizer: Any, rewinds: Sequence[Rewind], offset: int = 0) -> Any:
    """A copy of the Levanter optimizer config `optimizer` whose schedule is multiplied by
    `spikes.lr_multiplier(rewinds, step)` (the schedule's count is the optimizer step, which is
    the training step less `offset`: a branch's fresh optimizer counts from the branch point)."""
    windows = [
        (r.lr_from_step, r.lr_until_step, r.lr_factor)
        for r in rewinds
        if r.lr_from_step is not None and r.lr_until_step is not None and r.lr_factor != 1
    ]
    if not windows:
        return optimizer
    optimizer = copy.copy(optimizer)
    scheduler = optimizer.lr_scheduler

    def scaled_scheduler(num_train_steps: int, override_lr: float | None = None) -> Any:
        schedule = scheduler(num_train_steps, override_lr=override_lr)

        def scaled(count: Any) -> Any:
            factor = jnp.ones((), dtype=jnp.float32)
            step = count + offset
            for first, until, scale in windows:
                factor = factor * jnp.where((step >= first) & (step < until), scale, 1.0)
            return schedule(count) * factor

        return scaled

    object.__setattr__(optimizer, "lr_scheduler", scaled_scheduler)
    return optimizer


def shift_schedule(optimizer: Any, steps_done: int) -> Any:
    """A copy of the Levanter optimizer config `optimizer` whose schedule spans the run's steps
    less `steps_done`: for a branch that starts a fresh optimizer (its count 0) at step
    `steps_done`, so its warm-up and decay fit the steps it trains. Unchanged for 0."""
    if not steps_done:
        return optimizer
    optimizer = copy.copy(optimizer)
    scheduler = optimizer.lr_scheduler

    def shifted(num_train_steps: int, override_lr: float | None = None) -> Any:
        return scheduler(num_train_steps - steps_done, override_lr=override_lr)

    object.__setattr__(optimizer, "lr_scheduler", shifted)
    return optimizer


@contextlib.contextmanager
def fresh_optimizer_state(active: bool = True) -> Iterator[None]:
    """While active, Levanter's trainer loads only the model, step and key of the checkpoint it
    initializes from, and initializes the optimizer's state afresh (a branch with init="weights").

    Levanter decides what to read from a checkpoint by the mask `saveable_training_mask` gives;
    `Trainer.initial_state` is its only caller in `levanter.trainer` (saving uses its own module's
    name), so this changes what the initial state loads and nothing it saves."""
    if not active:
        yield
        return
    import levanter.trainer as trainer_module

    original = trainer_module.saveable_training_mask

    def weights_only(state: Any, is_trainable: Any = True) -> Any:
        mask = original(state, is_trainable)
        off = jax.tree_util.tree_map(lambda _: False, mask.opt_state)
        averaging = jax.tree_util.tree_map(lambda _: False, mask.model_averaging)
        return dataclasses.replace(mask, opt_state=off, model_averaging=averaging)

    trainer_module.saveable_training_mask = weights_only
    try:
        yield
    finally:
        trainer_module.saveable_training_mask = original


def fresh_tensorstore_cache() -> None:
    """Give JAX's checkpoint serialization a new TensorStore context, so a new, empty cache.

    JAX keeps one context (with a 10 GB cache pool) for the whole process and binds it as the
    default argument of its serialization functions. A rewind moves checkpoints away and the
    training saves the same steps again at the same paths; with the old cache, TensorStore took
    the new OCDBT database for the old one and read data files that were no longer there
    ("Error reading Byte range ... step-40/d/..."). Called after every rewind.
    """
    import jax.experimental.array_serialization.serialization as serialization
    import jax.experimental.array_serialization.tensorstore_impl as impl
    import tensorstore as ts

    old = impl._TS_CONTEXT
    new = ts.Context(old.spec)
    for module in (impl, serialization):
        for name, value in list(vars(module).items()):
            if value is old:
                setattr(module, name, new)
            elif callable(value) and getattr(value, "__defaults__", None):
                value.__defaults__ = tuple(new if d is old else d for d in value.__defaults__)
