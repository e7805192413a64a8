"""metrics.jsonl: the per-step metrics a training step writes, by local path or URL.

Reading, writing and publishing the file needs no ML library, so the end-of-run report, the
evaluate step's plot and tests import this module without Levanter (`steps.training_hooks`,
which writes the file while training, imports Levanter and JAX: seconds).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from types import TracebackType
from typing import Any

import fsspec

from pipeline.observe.metrics import ALIASES, parse_events, parse_metrics
from steps.files import write_file

logger = logging.getLogger(__name__)

__all__ = [
    "ALIASES",
    "MetricsUploader",
    "begin_metrics",
    "publish_metrics",
    "read_events",
    "read_metrics",
    "write_metrics",
]


def read_metrics(path: str, *, up_to: int | None = None) -> list[dict[str, Any]]:
    """One record per step, in step order, with the short aliases (`loss`, `learning_rate`, ...).

    `path` is a path or URL; a missing file has no records. See `pipeline.observe.metrics` for how
    lines merge; with `up_to`, steps after it are dropped (a resumed run computes them again).
    """
    fs, plain = fsspec.core.url_to_fs(path)
    if not fs.exists(plain):
        return []
    with fs.open(plain, "r") as f:
        return parse_metrics(f, up_to=up_to)


def read_events(path: str) -> list[dict[str, Any]]:
    """The event lines of `path` (spikes, skipped updates, rewinds), in the order written."""
    fs, plain = fsspec.core.url_to_fs(path)
    if not fs.exists(plain):
        return []
    with fs.open(plain, "r") as f:
        return parse_events(f)


def write_metrics(path: str, records: list[dict[str, Any]]) -> None:
    """Replace `path` (a path or URL) with `records`, one line each, atomically."""
    write_file(path, "".join(json.dumps(r) + "\n" for r in records).encode())


def begin_metrics(
    path: str, local: str, resumed_from: int | None, rewinds: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Set up the metrics of a training attempt; returns the records kept.

    `path` is the output's metrics.jsonl (a path or URL) and `local` the file the tracker appends
    to (the same file, or a scratch copy when `path` is on object storage). Both get the steps up
    to `resumed_from`, the checkpoint the attempt resumes from, read from `path`: the steps after
    it are computed (and logged) again. A fresh start (`resumed_from` None) keeps nothing. Event
    lines of the steps kept stay; the rewind events are `rewinds` (the run's rewinds.json is what
    says which rewinds happened, so a kill between a rewind and its line loses nothing).
    """
    kept = read_metrics(path, up_to=resumed_from) if resumed_from is not None else []
    if resumed_from is not None:
        kept += [e for e in read_events(path) if e["event"] != "rewind" and e["step"] <= resumed_from]
    kept += rewinds or []
    if local != path:
        write_metrics(path, kept)
    write_metrics(local, kept)
    return kept


class MetricsUploader:
    """Publishes a local metrics file, which the tracker appends to, whole at `remote` (a URL).

    Object stores cannot append, so a training run whose output is on one appends to a scratch
    file and this replaces `<output>/metrics.jsonl` with it: from a background thread every
    `interval` seconds while the file changes, and once more on `close()`. A crash between two
    uploads loses at most the lines of the last `interval` seconds; those are of steps after the last
    checkpoint (`MetricsCheckpointer` publishes before each one), which the resumed run computes
    again. Only whole lines are uploaded, so readers never see a line being written.

    With `already_published`, the file as it is now is taken to be what `remote` holds (as after
    `begin_metrics`): it is uploaded only once it changes. On a TPU pod every host runs the step but
    only the first one's tracker writes, so the other hosts' copies never change and never upload.

    Each upload sends the whole file, so a very large file would keep the uploader busy: the wait
    between uploads grows to `busy_factor` times the last upload's duration when that is longer.
    Use it as a context manager (`with MetricsUploader(...):`) around the training.
    """

    def __init__(
        self,
        local: str,
        remote: str,
        interval: float,
        *,
        already_published: bool = False,
        busy_factor: float = 10.0,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"metrics upload interval must be positive, got {interval}")
        self.local = local
        self.remote = remote
        self.interval = interval
        self.busy_factor = busy_factor
        self.uploads = 0
        """How many times the remote file was replaced."""
        self._local_fs = fsspec.filesystem("file")
        self._lock = threading.Lock()
        self._uploaded: tuple[int, float] | None = None  # (size, mtime) of the file last uploaded
        if already_published:
            self._uploaded = self._version()
        self._wait = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def upload(self) -> bool:
        """Upload the local file now if it changed since the last upload; whether it did."""
        with self._lock:
            version = self._version()
            if version is None or version == self._uploaded:
                return False
            with self._local_fs.open(self.local, "rb") as f:
                data = f.read()
            # The tracker may be half-way through a line: publish up to the last complete one.
            data = data[: data.rfind(b"\n") + 1]
            started = time.monotonic()
            write_file(self.remote, data)
            self._wait = max(self.interval, self.busy_factor * (time.monotonic() - started))
            self._uploaded = version
            self.uploads += 1
            return True

    def _version(self) -> tuple[int, float] | None:
        if not self._local_fs.exists(self.local):
            return None
        info = self._local_fs.info(self.local)
        return int(info["size"]), float(info["mtime"])

    def start(self) -> MetricsUploader:
        """Start uploading every `interval` seconds (from a daemon thread); `publish_metrics(local)`
        uploads through this uploader until it is closed."""
        if self._thread is None:
            _RUNNING[self.local] = self
            self._thread = threading.Thread(target=self._run, name="metrics-uploader", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread, then upload what it has not (errors here are raised)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            _RUNNING.pop(self.local, None)
        self.upload()

    def _run(self) -> None:
        while not self._stop.wait(self._wait):
            try:
                self.upload()
            except Exception as e:  # a failed upload is retried at the next interval; close() raises
                logger.warning("could not upload %s to %s (will retry): %s", self.local, self.remote, e)

    def __enter__(self) -> MetricsUploader:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self.close()
            return
        try:  # publish what the failed run logged, without hiding why it failed
            self.close()
        except Exception as e:
            logger.warning("could not upload %s to %s: %s", self.local, self.remote, e)


# The running uploaders by local file: the checkpointer (built by Levanter from a config) finds its own.
_RUNNING: dict[str, MetricsUploader] = {}


def publish_metrics(local: str) -> bool:
    """Upload `local` now through its running `MetricsUploader`, if it has one (an output on object
    storage) and it changed; whether it uploaded."""
    uploader = _RUNNING.get(local)
    return uploader.upload() if uploader is not None else False
