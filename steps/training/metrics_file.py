"""metrics.jsonl: the per-step metrics a training step writes, by local path or URL.

Reading, writing and publishing the file needs no ML library, so the end-of-run report, the
evaluate step's plot and tests import this module without Levanter (`steps.training.tracker`,
which writes the file while training, imports Levanter and JAX: seconds).
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.steplib import (
    ALIASES,
    METRICS_DIR,
    StepCancelled,
    metrics_files,
    open_storage,
    parse_events,
    parse_metrics,
    read_metrics_data,
    segment_index,
    segment_name,
    step_events,
)
from steps.files import local_path, write_file

logger = logging.getLogger(__name__)

__all__ = [
    "ALIASES",
    "SEGMENT_BYTES",
    "MetricsUploader",
    "begin_metrics",
    "publish_metrics",
    "read_events",
    "read_metrics",
    "write_metrics",
]


SEGMENT_BYTES = 1 << 20
"""On object storage, a segment is closed once it holds this many bytes (see `MetricsUploader`)."""


def read_metrics(path: str, *, up_to: int | None = None) -> list[dict[str, Any]]:
    """One record per step, in step order, with the short aliases (`loss`, `learning_rate`, ...).

    `path` is the output's `metrics.jsonl` (a path or URL); the segments beside it (an output on
    object storage) are read too, in order. Nothing there: no records. See
    `pipeline.observe.metrics` for how lines merge; with `up_to`, steps after it are dropped (a
    resumed run computes them again).
    """
    return parse_metrics(_read_lines(path).splitlines(), up_to=up_to)


def read_events(path: str) -> list[dict[str, Any]]:
    """The event lines of the metrics at `path` (spikes, skipped updates, rewinds), in the order
    written."""
    return parse_events(_read_lines(path).splitlines())


def write_metrics(path: str, records: list[dict[str, Any]]) -> None:
    """Replace the metrics at `path` (a path or URL) with `records`, one line each.

    On local disk `path` is replaced atomically. On object storage the lines go to segments
    (`_store_lines`), which leaves every segment that already holds the right lines untouched.
    """
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    if local_path(path) is not None:
        write_file(path, data)
    else:
        _store_lines(path, data)


def begin_metrics(
    path: str,
    local: str,
    resumed_from: int | None,
    rewinds: list[dict[str, Any]] | None = None,
    dropped: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Set up the metrics of a training attempt; returns the records kept.

    `path` is the output's metrics.jsonl (a path or URL) and `local` the file the tracker appends
    to (the same file, or a scratch copy when `path` is on object storage). Both get the lines of
    the steps up to `resumed_from`, the checkpoint the attempt resumes from, read from `path`:
    the steps after it are computed (and logged) again. A fresh start (`resumed_from` None)
    keeps nothing. Event lines of the steps kept stay; of rewind lines, those of `rewinds` stay
    where they are and the missing ones are added at the end (the run's rewinds.json is what
    says which rewinds happened, so a kill between a rewind and its line loses nothing).

    Lines are kept as written, in their order, so on object storage the kept lines are usually
    a prefix of the segments there: the segments before the cut are left as they are. The steps
    of the lines left out go to `dropped`: an attempt before this one logged them, and this one
    computes them again (the ledger's redone steps).
    """
    data = _read_lines(path) if resumed_from is not None else b""
    expected = [dict(r) for r in rewinds or []]
    kept: list[bytes] = []
    for line in data.splitlines():
        record = _parsed(line)
        if record is None:
            continue  # cut short by a kill, or not a metrics line
        if record.get("event") == "rewind":
            if record in expected:  # a recorded rewind, once
                expected.remove(record)
                kept.append(line)
        elif resumed_from is not None and record["step"] <= resumed_from:
            kept.append(line)
        elif dropped is not None and "event" not in record:
            dropped.append(record["step"])
    kept += [json.dumps(r).encode() for r in expected]
    text = b"".join(line + b"\n" for line in kept)
    if local != path:
        _store_lines(path, text)
    write_file(local, text)
    return parse_metrics(text.splitlines())


def _parsed(line: bytes) -> dict[str, Any] | None:
    """A metrics line as a dict with an integer step, or None."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int):
        return None
    return record


# -- the files behind a metrics path ----------------------------------------------------------------


def _read_lines(path: str) -> bytes:
    """The metrics lines of the output whose metrics.jsonl is `path`: that file, then the segments."""
    fs, plain = fsspec.core.url_to_fs(path)
    directory = posixpath.dirname(plain)
    return read_metrics_data(directory, _reader(fs), _lister(fs), read_all=_all_reader(fs)) or b""


def _all_reader(fs: fsspec.AbstractFileSystem) -> Callable[[list[str]], list[bytes | None]]:
    def read_all(paths: list[str]) -> list[bytes | None]:
        if len(paths) == 1:
            return [_reader(fs)(paths[0])]
        # One call for all of them: s3fs and gcsfs fetch them concurrently. A file gone since
        # the listing (a resume rewriting the segments) is left out.
        found = fs.cat(paths, on_error="omit")
        return [found.get(p) for p in paths]

    return read_all


def _reader(fs: fsspec.AbstractFileSystem) -> Callable[[str], bytes | None]:
    def read(path: str) -> bytes | None:
        try:
            return fs.cat_file(path)
        except FileNotFoundError:
            return None

    return read


def _lister(fs: fsspec.AbstractFileSystem) -> Callable[[str], list[str]]:
    def listdir(path: str) -> list[str]:
        fs.invalidate_cache(path)  # a listing cached by s3fs would miss a segment just written
        try:
            return [posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            return []

    return listdir


def _published(path: str) -> list[tuple[str, int]]:
    """The files (plain paths) holding the metrics of `path`'s output now, with their sizes."""
    fs, plain = fsspec.core.url_to_fs(path)
    files = metrics_files(posixpath.dirname(plain), _lister(fs))
    return [(f, int(fs.info(f)["size"])) for f in files]


def _store_lines(path: str, data: bytes) -> None:
    """Make the metrics files of `path`'s output (on object storage) hold exactly `data`.

    The files whose content is already the matching part of `data` stay as they are; the first
    one that differs is replaced by the rest of `data`, and the files after it are deleted, last
    first. A kill part-way leaves the replaced file and some old files after it. Those hold the
    lines after the cut: a run writes its lines in step order, so they are of steps after the
    checkpoint the next `begin_metrics` resumes from, which drops them; no line is lost or doubled.
    """
    fs, plain = fsspec.core.url_to_fs(path)
    directory = posixpath.dirname(plain)
    read = _reader(fs)
    files = metrics_files(directory, _lister(fs))
    offset = 0
    kept = 0
    for name in files:
        content = read(name) or b""
        if not content or data[offset : offset + len(content)] != content:
            break
        offset += len(content)
        kept += 1
    rest = data[offset:]
    stale = files[kept:]
    if rest or stale:
        step_events.check_lease(f"rewrite of the metrics segments of {posixpath.dirname(path)}")
    if rest:
        target = stale.pop(0) if stale else f"{directory}/{METRICS_DIR}/{segment_name(_next_index(files))}"
        if isinstance(fs, LocalFileSystem):  # only tests keep "remote" metrics on local disk
            fs.makedirs(posixpath.dirname(target), exist_ok=True)
        fs.pipe_file(target, rest)
    for name in reversed(stale):
        fs.rm(name)


def _next_index(files: list[str]) -> int:
    """The number of the segment after the last of `files` (0 if none is a segment)."""
    numbers = [segment_index(posixpath.basename(f)) for f in files]
    return max((n for n in numbers if n is not None), default=-1) + 1


class MetricsUploader:
    """Publishes a local metrics file, which the tracker appends to, as segments beside `remote`.

    Object stores cannot append, so a training run whose output is on one appends to a scratch
    file, and this publishes what the file gained as `<output>/metrics/part-NNNNNN.jsonl`
    (`remote` is the output's `metrics.jsonl`, which is not written): from a background thread
    every `interval` seconds while the file changes, and once more on `close()`. The lines not
    yet in a closed segment go to the open segment, replaced whole at each upload; once it holds
    `segment_bytes` it is closed and never written again, and the next lines open the next one.
    So an upload sends at most about `segment_bytes` (plus the lines of one interval), however
    long the run: the hero run's 390k steps would otherwise re-send a file of hundreds of MB
    every 30 s. `bytes_uploaded` counts what was sent.

    A crash between two uploads loses at most the lines of the last `interval` seconds; those are
    of steps after the last checkpoint (`MetricsCheckpointer` publishes before each one), which
    the resumed run computes again. Only whole lines are uploaded, so readers never see a line
    being written. Each upload first checks the lease of the step attempt that built the
    uploader (`step_events.lease_guard`): once it may have expired, nothing more is uploaded
    (`LeaseExpired`), since another runner may own the output by then. And each write of a
    segment is conditional on the segment holding what this uploader last wrote there (nothing,
    for a new one; with `already_published`, what it held when the uploader was made): a newer
    attempt that has rewritten it wins, and this one stops (`LeaseExpired`).

    With `already_published`, the file as it is now is taken to be what the segments hold (as
    after `begin_metrics`): the segments are listed once, to learn which one is open, and it is
    uploaded only once it changes. On a TPU pod every host runs the step but only the first
    one's tracker writes, so the other hosts' copies never change and never upload.

    An upload that takes long (a slow store) makes the wait between uploads grow to
    `busy_factor` times its duration. Use it as a context manager (`with MetricsUploader(...):`)
    around the training.
    """

    def __init__(
        self,
        local: str,
        remote: str,
        interval: float,
        *,
        already_published: bool = False,
        busy_factor: float = 10.0,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"metrics upload interval must be positive, got {interval}")
        if segment_bytes <= 0:
            raise ValueError(f"metrics segment size must be positive, got {segment_bytes}")
        self.local = local
        self.remote = remote
        self.interval = interval
        self.busy_factor = busy_factor
        self.segment_bytes = segment_bytes
        self.uploads = 0
        """How many times a segment was written."""
        self.bytes_uploaded = 0
        """How many bytes those writes sent."""
        self._segments = f"{posixpath.dirname(remote)}/{METRICS_DIR}"  # a URL, like `remote`
        # The step's lease, checked before each upload (from the uploader's thread too): an
        # attempt that lost its step must not replace the new owner's segments.
        self._guard = step_events.lease_guard()
        self._storage = open_storage(self._segments)
        self._local_fs = fsspec.filesystem("file")
        self._lock = threading.Lock()
        self._uploaded: tuple[int, float] | None = None  # (size, mtime) of the file last uploaded
        # The local file's bytes before `_closed` are in closed segments; the rest goes to the
        # open segment, number `_open`.
        self._closed = 0
        self._open = 0
        # What the open segment holds now, as this uploader knows it (None: it does not exist).
        # Each write is conditional on it: see `upload`.
        self._holds: bytes | None = None
        if already_published:
            self._uploaded = self._version()
            self._closed, self._open = self._layout(_published(remote))
            self._holds = self._storage.read(self._target())
        self._wait = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _layout(self, files: list[tuple[str, int]]) -> tuple[int, int]:
        """(bytes in closed files, number of the open segment) of the published `files`. The last
        segment is open unless it is full; a metrics.jsonl from before segments is closed."""
        total = sum(size for _, size in files)
        numbers = [segment_index(posixpath.basename(name)) for name, _ in files]
        if not files or numbers[-1] is None:
            return total, _next_index([name for name, _ in files])
        last = files[-1][1]
        if last >= self.segment_bytes:
            return total, numbers[-1] + 1
        return total - last, numbers[-1]

    def upload(self) -> bool:
        """Upload what the local file gained since the last upload, if anything; whether it did."""
        with self._lock:
            version = self._version()
            if version is None or version == self._uploaded:
                return False
            with self._local_fs.open(self.local, "rb") as f:
                f.seek(self._closed)
                data = f.read()
            # The tracker may be half-way through a line: publish up to the last complete one.
            data = data[: data.rfind(b"\n") + 1]
            if not data:
                return False
            target = self._target()
            self._guard(f"upload of {target}")
            expected = self._holds

            def replace(old: bytes | None) -> bytes | None:
                return data if old == expected else None

            # Conditional on the segment still holding what this uploader last put there: a
            # check of the lease is not enough, since an upload that passed it just before the
            # process froze is sent when it thaws. By then a newer attempt of the step has
            # rewritten the open segment (a resume cuts it at its checkpoint, and its own
            # uploads extend it), so the stale write is refused.
            started = time.monotonic()
            if self._storage.update(target, replace) is None:
                self._guard.lost(f"upload of {target}", "another attempt of this step has rewritten it")
            self._wait = max(self.interval, self.busy_factor * (time.monotonic() - started))
            self._uploaded = version
            self.uploads += 1
            self.bytes_uploaded += len(data)
            self._holds = data
            if len(data) >= self.segment_bytes:
                self._closed += len(data)
                self._open += 1
                self._holds = None
            return True

    def _target(self) -> str:
        return f"{self._segments}/{segment_name(self._open)}"

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
            except StepCancelled as e:  # the lease is lost: nothing more may be uploaded
                logger.warning("stopped uploading %s: %s", self.local, e)
                return
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
