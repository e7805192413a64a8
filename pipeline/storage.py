"""Storage under the prefix, and the commit protocol of a step directory.

This is the only module that opens files under a prefix. Per step directory:

    <prefix>/<name>-<hash>/
        .step.json   identity inputs, resolved config, code fingerprint, deps, git, versions
        .status      append-only JSON lines: RUNNING, SUCCESS, FAILED, CANCELLED, ...
        .lease       owner, fencing token, expiry

The protocol:
  * acquire: under an atomic read-modify-write of `.lease`, take it if it is stale
    (`lease.is_stale`), with a fencing token one above any token seen in `.lease` or `.status`;
  * every status event is appended by an atomic read-modify-write of `.status` that checks the
    writer's token is still the newest in the file; RUNNING additionally refuses to start over
    a SUCCESS (another runner finished first), so a step function runs once;
  * SUCCESS is written only by the holder of the current lease: the lease is checked, then the
    conditional append re-checks that no newer token started meanwhile;
  * readers trust a step only when its `.status` ends in SUCCESS.

Atomic read-modify-write (`Storage.update`) is the single primitive the protocol needs. Local
disk implements it with `flock` on the file; `memory://` with a process lock (the memory
filesystem is process-local); S3 and GCS (`ConditionalStorage`) with their conditional writes:
read the object and its version, compute, write only if the version is unchanged, else re-read
and recompute. Status appends drop an unterminated last line (the trace of a write that failed
half-way) instead of building on it. Transient storage errors are retried with backoff and
jitter (`pipeline.object_storage`); docs/storage.md describes the guarantees per store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fsspec

from pipeline.errors import StorageError
from pipeline.lease import LeaseRecord, Owner, is_stale
from pipeline.object_storage import (
    CONDITIONAL_PROTOCOLS,
    CONTENTION,
    DEFAULT_RETRY,
    ConditionalObjects,
    RetryPolicy,
    backoff_delay,
    describe_error,
    is_missing_bucket,
    open_object_store,
    retrying,
)

__all__ = [
    "HIDDEN_FILES",
    "Acquired",
    "AlreadyDone",
    "ConditionalStorage",
    "Held",
    "RetryPolicy",
    "StatusEvent",
    "StepRecord",
    "StepStore",
    "Storage",
    "open_storage",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

STEP_JSON = ".step.json"
STATUS = ".status"
LEASE = ".lease"
PROGRESS = ".progress"
PINNED = ".pinned"
HIDDEN_FILES = frozenset({STEP_JSON, STATUS, LEASE, ".logs", PROGRESS, PINNED})
"""Drydock's own entries in a step directory (plus `.status.corrupt-*`, `.tmp-*`)."""

RUNNING = "RUNNING"
SUCCESS = "SUCCESS"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
PREEMPTED = "PREEMPTED"
WARNING = "WARNING"
NOTES = frozenset({WARNING})
"""Events a running step reports about itself; they never change the step's state."""


# ---------------------------------------------------------------------------------------------
# Byte-level storage: read, write, atomic read-modify-write.


class Storage:
    """Files under a prefix through fsspec. Paths are full URLs or absolute local paths.

    Every operation is retried under `retry` while it fails transiently (`is_transient`); what
    still fails raises a `StorageError` naming the operation, the path and the cause. `sleep` and
    `uniform` (the jitter's random draw) are passed in so that tests control time.
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        self.fs = fs
        self.retry_policy = retry
        self._sleep = sleep
        self._uniform = uniform
        self._lock = threading.Lock()

    def _retrying(self, what: str, path: str, op: Callable[[], T]) -> T:
        return retrying(what, path, op, self.retry_policy, sleep=self._sleep, uniform=self._uniform)

    def _read_once(self, path: str) -> bytes | None:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError as e:
            if is_missing_bucket(e):
                raise
            return None

    def _write_once(self, path: str, data: bytes) -> None:
        self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        self.fs.pipe_file(path, data)

    def read(self, path: str) -> bytes | None:
        """The content of `path`, or None if it does not exist."""
        return self._retrying("read", path, lambda: self._read_once(path))

    def write(self, path: str, data: bytes) -> None:
        """Replace `path` with `data` as a whole (readers see the old or the new content)."""
        self._retrying("write", path, lambda: self._write_once(path, data))

    def update(self, path: str, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        """Atomically replace `path` with `fn(old)`; `fn` returns None to leave it unchanged.

        Returns what was written, or None. The base implementation serializes updates within
        this process, which is exact for `memory://`: there, a write that failed transiently
        (even half-way) is simply retried with the same bytes. `ConditionalStorage` serializes
        runners on different machines with the store's conditional writes.
        """
        with self._lock:
            new = fn(self.read(path))
            if new is not None:
                self._retrying("update", path, lambda: self._write_once(path, new))
            return new

    def listdir(self, path: str) -> list[str]:
        """Base names of the entries directly inside `path` ([] if it does not exist)."""

        def once() -> list[str]:
            self.fs.invalidate_cache(path)  # another runner may have written since we last looked
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError as e:
                if is_missing_bucket(e):
                    raise
                return []
            return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

        return self._retrying("list", path, once)

    def read_tail(self, path: str, size: int) -> bytes | None:
        """The last `size` bytes of `path` (all of it if shorter), or None if it does not exist."""

        def once() -> bytes | None:
            try:
                with self.fs.open(path, "rb") as f:
                    end = f.seek(0, 2)
                    f.seek(max(0, end - size))
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None

        return self._retrying("read", path, once)

    def delete(self, path: str, recursive: bool = False) -> None:
        """Remove the file `path`, or with `recursive` the directory and all below it; absent is fine."""

        def once() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=recursive)

        self._retrying("delete", path, once)

    def disk_usage(self, path: str) -> int:
        """Total bytes of the files under `path` (0 if it does not exist)."""

        def once() -> int:
            try:
                return int(self.fs.du(path, total=True))
            except FileNotFoundError:
                return 0

        return self._retrying("measure", path, once)

    def check_writable(self, prefix: str) -> None:
        """Raise a StorageError unless files can be created under `prefix`."""
        probe = f"{prefix.rstrip('/')}/.drydock-write-check-{os.getpid()}"
        try:
            self.write(probe, b"ok")
            self._retrying("delete", probe, lambda: self.fs.rm(probe))
        except StorageError as e:
            cause = e.__cause__ if e.__cause__ is not None else e
            raise StorageError(f"prefix {prefix!r} is not writable: {describe_error(cause)}") from e


class ConditionalStorage(Storage):
    """An object store with conditional writes (S3, GCS): `update` is safe across machines.

    `update` reads the object with its version, computes `fn(old)`, and writes the result only
    if the version is still current. When another writer got there first the store refuses the
    write; we wait a jittered moment (`contention`), re-read and recompute, at most
    `contention.tries` times. A write whose reply was lost (it timed out, then its retry was
    refused) is recognised by finding our own content in place, so it is never applied twice.
    """

    def __init__(
        self,
        fs: fsspec.AbstractFileSystem,
        objects: ConditionalObjects,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        contention: RetryPolicy = CONTENTION,
        sleep: Callable[[float], None] = time.sleep,
        uniform: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(fs, retry=retry, sleep=sleep, uniform=uniform)
        self.objects = objects
        self.contention = contention

    def _write_once(self, path: str, data: bytes) -> None:
        # No makedirs: object stores have no directories, and s3fs would create a missing bucket.
        self.fs.pipe_file(path, data)

    def update(self, path: str, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        unsure: bytes | None = None  # what we wrote when a failed try may still have landed
        for conflict in range(1, self.contention.tries + 1):
            old, version = self._retrying("read", path, lambda: self.objects.get(path))
            if unsure is not None and old == unsure:
                # Our write landed and only its reply was lost. Telling it apart by content is
                # sound because Drydock's `.lease` and `.status` content is unique to its writer
                # (run id, token, time); a refusal on the first try is never taken for success.
                return unsure
            new = fn(old)
            if new is None:
                return None
            tries: list[None] = []

            def put(new: bytes = new, version: str | None = version, tries: list[None] = tries) -> bool:
                tries.append(None)
                return self.objects.put_if(path, new, version)

            if self._retrying("write", path, put):
                return new
            unsure = new if len(tries) > 1 else None
            self._sleep(backoff_delay(conflict, self.contention, self._uniform()))
        raise StorageError(
            f"cannot update {path}: {self.contention.tries} conditional writes in a row lost to "
            "concurrent writers"
        )


class LocalStorage(Storage):
    """Local disk: atomic rename for whole writes, `flock` for read-modify-write.

    `update` appends in place when the new content extends the old, so `.status` stays a true
    append-only file. Safe against processes dying at any point; it does not fsync, so a
    machine losing power may lose the last events (they are then redone, never half-trusted).
    """

    def __init__(self) -> None:
        super().__init__(fsspec.filesystem("file"))

    @staticmethod
    def _local(path: str) -> str:
        return path[len("file://") :] if path.startswith("file://") else path

    def read(self, path: str) -> bytes | None:
        try:
            with open(self._local(path), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None

    def write(self, path: str, data: bytes) -> None:
        path = self._local(path)
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def update(self, path: str, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        path = self._local(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            old = b"".join(chunks)
            new = fn(old if old else None)
            if new is None:
                return None
            if new.startswith(old):
                os.write(fd, new[len(old) :])  # the offset is at the end after reading
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, new, 0)
            return new
        finally:
            os.close(fd)  # closing releases the flock

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(self._local(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def check_writable(self, prefix: str) -> None:
        path = self._local(prefix)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"prefix {prefix!r} cannot be created: {e.strerror or e}") from e
        if not os.access(path, os.W_OK | os.X_OK):
            raise StorageError(f"prefix {prefix!r} is not writable (permission denied)")


def _is_local(prefix: str) -> bool:
    return "://" not in prefix or prefix.startswith("file://")


def normalize_prefix(prefix: str) -> str:
    """An absolute local path (for local prefixes) or the URL without a trailing slash."""
    if _is_local(prefix):
        local = prefix[len("file://") :] if prefix.startswith("file://") else prefix
        return os.path.abspath(os.path.expanduser(local))
    return prefix.rstrip("/")


def open_storage(prefix: str) -> Storage:
    """The storage implementation for `prefix` (local disk, memory://, s3://, gs://, or another
    fsspec URL). S3 and GCS get conditional writes; other remote protocols get a warning."""
    if _is_local(prefix):
        return LocalStorage()
    protocol = prefix.split("://", 1)[0]
    try:
        if protocol in CONDITIONAL_PROTOCOLS:
            opened = open_object_store(protocol)
            assert opened is not None  # every protocol in CONDITIONAL_PROTOCOLS has one
            return ConditionalStorage(*opened)
        fs = fsspec.filesystem(protocol)
    except (ImportError, ValueError) as e:
        raise StorageError(f"prefix {prefix!r}: cannot open filesystem {protocol!r}: {e}") from e
    if protocol != "memory":
        logger.warning(
            "prefix %s: %s has no conditional writes, so leases use process-local locking; do not "
            "run two executors on different machines against it at once",
            prefix,
            protocol,
        )
    return Storage(fs)


# ---------------------------------------------------------------------------------------------
# Step directories: status events, leases, metadata.


@dataclass(frozen=True)
class StatusEvent:
    """One line of `.status`."""

    event: str
    token: int
    time: float
    run_id: str = ""
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def dump(self) -> bytes:
        raw: dict[str, Any] = {"event": self.event, "token": self.token, "time": round(self.time, 6)}
        if self.run_id:
            raw["run_id"] = self.run_id
        if self.message:
            raw["message"] = self.message
        if self.data:
            raw["data"] = dict(self.data)
        return json.dumps(raw, sort_keys=True).encode() + b"\n"


def last_state(events: tuple[StatusEvent, ...]) -> StatusEvent | None:
    """The last event that is a state (RUNNING, SUCCESS, ...), not a note."""
    for event in reversed(events):
        if event.event not in NOTES:
            return event
    return None


def complete_lines(data: bytes | None) -> bytes:
    """`data` without an unterminated last line: what an append may safely build on.

    Such a line is the trace of a write that failed half-way; appending after it would glue the
    next event onto it and turn a skipped fragment into a corrupt line.
    """
    if not data:
        return b""
    return data[: data.rfind(b"\n") + 1]


def parse_status(data: bytes | None, path: str = ".status") -> tuple[StatusEvent, ...]:
    """Events of a `.status` file. A final line without newline is a write in progress: skipped."""
    if not data:
        return ()
    lines = data.split(b"\n")
    complete = lines[:-1]  # the last element is b"" or an unfinished line
    events = []
    for number, line in enumerate(complete, 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            events.append(
                StatusEvent(
                    event=raw["event"],
                    token=int(raw["token"]),
                    time=float(raw["time"]),
                    run_id=raw.get("run_id", ""),
                    message=raw.get("message", ""),
                    data=raw.get("data", {}),
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            raise StorageError(
                f"{path} line {number} is corrupt ({e}); see it with `drydock status` and "
                "rerun the step with `--force` to start it over"
            ) from e
    return tuple(events)


@dataclass(frozen=True)
class StepRecord:
    """What storage says about one step directory at one moment (a snapshot entry)."""

    events: tuple[StatusEvent, ...] = ()
    step_json: Mapping[str, Any] | None = None
    lease: LeaseRecord | None = None
    corrupt: str | None = None
    """Why `.status` could not be read, if it could not."""

    @property
    def last(self) -> StatusEvent | None:
        """The last state event (notes such as WARNING are skipped)."""
        return last_state(self.events)

    @property
    def state(self) -> str | None:
        """The last state event's name, or None if the step never started here."""
        last = last_state(self.events)
        return last.event if last else None

    @property
    def succeeded(self) -> bool:
        return self.state == SUCCESS


@dataclass(frozen=True)
class Acquired:
    """The lease is ours, with this fencing token; RUNNING has been recorded."""

    token: int


@dataclass(frozen=True)
class Held:
    """Another live runner holds the lease."""

    lease: LeaseRecord


@dataclass(frozen=True)
class AlreadyDone:
    """The step reached SUCCESS (by another runner) before we could start it."""


class StepStore:
    """The commit protocol of step directories on one `Storage`."""

    def __init__(self, storage: Storage, clock: Callable[[], float] = time.time) -> None:
        self.storage = storage
        self.clock = clock

    # -- reading ------------------------------------------------------------------------------

    def record(self, step_dir: str, *, with_metadata: bool = True) -> StepRecord:
        """A consistent-enough view of one step directory.

        `.step.json` is read for finished steps (drift notes need it), `.lease` for unfinished
        ones (to tell a live runner from a dead one).
        """
        try:
            events = self.events(step_dir)
        except StorageError as e:
            return StepRecord(lease=self.lease(step_dir), corrupt=str(e))
        step_json = None
        lease = None
        if (last := last_state(events)) is not None and last.event == SUCCESS:
            if with_metadata:
                step_json = self.read_step_json(step_dir)
        else:
            lease = LeaseRecord.parse(self.storage.read(f"{step_dir}/{LEASE}"))
        return StepRecord(events, step_json, lease)

    def records(self, step_dirs: Iterable[str], *, threads: int = 16) -> dict[str, StepRecord]:
        """Records of many step directories: the snapshot a plan is made from."""
        dirs = list(dict.fromkeys(step_dirs))
        if isinstance(self.storage, LocalStorage) or len(dirs) < 64:
            return {d: self.record(d) for d in dirs}
        with ThreadPoolExecutor(threads) as pool:  # object stores: latency-bound, read in parallel
            return dict(zip(dirs, pool.map(self.record, dirs), strict=True))

    def events(self, step_dir: str) -> tuple[StatusEvent, ...]:
        path = f"{step_dir}/{STATUS}"
        return parse_status(self.storage.read(path), path)

    def read_step_json(self, step_dir: str) -> Mapping[str, Any] | None:
        data = self.storage.read(f"{step_dir}/{STEP_JSON}")
        if data is None:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return {"__corrupt__": True}

    def lease(self, step_dir: str) -> LeaseRecord | None:
        return LeaseRecord.parse(self.storage.read(f"{step_dir}/{LEASE}"))

    def progress(self, step_dir: str, events: tuple[StatusEvent, ...]) -> Mapping[str, Any] | None:
        """The `.progress` report (`pipeline.step_events.progress`) of the latest attempt in
        `events`; None without one, or when it is unreadable or an earlier attempt's."""
        runs = [e for e in events if e.event == RUNNING]
        if not runs:
            return None
        raw = self.storage.read(f"{step_dir}/{PROGRESS}")
        if not raw:
            return None
        try:
            report = json.loads(raw)
        except ValueError:
            return None
        # An earlier attempt's progress says nothing about this one.
        if not isinstance(report, dict) or report.get("token") != runs[-1].token:
            return None
        return report

    def has_payload(self, step_dir: str) -> bool:
        """Whether the step wrote anything besides Drydock's own metadata."""
        return any(
            name not in HIDDEN_FILES and not name.startswith((".tmp-", f"{STATUS}.corrupt-"))
            for name in self.storage.listdir(step_dir)
        )

    # -- writing ------------------------------------------------------------------------------

    def write_step_json(self, step_dir: str, info: Mapping[str, Any]) -> None:
        self.storage.write(f"{step_dir}/{STEP_JSON}", json.dumps(info, indent=2, sort_keys=True).encode())

    def acquire(
        self,
        step_dir: str,
        owner: Owner,
        ttl: float,
        *,
        rerun_after: int | None = None,
        attempt: int = 1,
    ) -> Acquired | Held | AlreadyDone:
        """Take the step's lease and record RUNNING, or say who holds it / that it is done.

        `rerun_after`: with `--force`, the number of status events seen at plan time; RUNNING may
        then follow a SUCCESS only if no event was added since (one forced rerun, not one per runner).
        """
        status_path = f"{step_dir}/{STATUS}"
        raw = self.storage.read(status_path)
        corrupt = None
        try:
            events = parse_status(raw, status_path)
        except StorageError:
            if rerun_after is None:
                raise
            events, corrupt = (), raw  # --force: set the unreadable file aside below
        if self._done(events, rerun_after):
            return AlreadyDone()
        seen_token = max((e.token for e in events), default=0)
        now = self.clock()
        outcome: dict[str, Any] = {}

        def take(old: bytes | None) -> bytes | None:
            outcome.clear()  # `update` may call this again after losing a race: last call wins
            current = LeaseRecord.parse(old)
            if not is_stale(current, now, owner.host):
                outcome["held"] = current
                return None
            token = max(current.token if current else 0, seen_token) + 1
            outcome["token"] = token
            return LeaseRecord(token, owner.run_id, owner.host, owner.pid, owner.pid_start, now + ttl).dump()

        self.storage.update(f"{step_dir}/{LEASE}", take)
        if "held" in outcome:
            return Held(outcome["held"])
        token = outcome["token"]
        if corrupt is not None:
            # Keep the evidence; the forced rerun starts a fresh history under the new lease.
            self.storage.write(f"{step_dir}/{STATUS}.corrupt-{token}", corrupt)
            self.storage.write(status_path, b"")
            rerun_after = 0

        def start(old: bytes | None) -> bytes | None:
            current = parse_status(old, status_path)
            if self._done(current, rerun_after) or any(e.token >= token for e in current):
                return None
            event = StatusEvent(RUNNING, token, self.clock(), owner.run_id, data={"attempt": attempt})
            return complete_lines(old) + event.dump()

        if self.storage.update(status_path, start) is None:
            self.release(step_dir, owner, token)
            if self._done(self.events(step_dir), rerun_after):
                return AlreadyDone()
            held = self.lease(step_dir)
            if held is not None and not held.released:
                return Held(held)
            return AlreadyDone()
        return Acquired(token)

    @staticmethod
    def _done(events: tuple[StatusEvent, ...], rerun_after: int | None) -> bool:
        last = last_state(events)
        if last is None or last.event != SUCCESS:
            return False
        return rerun_after is None or len(events) > rerun_after

    def renew(self, step_dir: str, owner: Owner, token: int, ttl: float) -> bool:
        """Extend our lease; False if it is no longer ours (the step must stop)."""
        now = self.clock()

        def extend(old: bytes | None) -> bytes | None:
            current = LeaseRecord.parse(old)
            if current is None or not current.held_by(owner, token):
                return None
            return LeaseRecord(token, owner.run_id, owner.host, owner.pid, owner.pid_start, now + ttl).dump()

        return self.storage.update(f"{step_dir}/{LEASE}", extend) is not None

    def release(self, step_dir: str, owner: Owner, token: int) -> None:
        """Give our lease up (kept as a record so fencing tokens keep growing)."""

        def drop(old: bytes | None) -> bytes | None:
            current = LeaseRecord.parse(old)
            if current is None or not current.held_by(owner, token):
                return None
            return LeaseRecord(
                token, owner.run_id, owner.host, owner.pid, owner.pid_start, current.expires, released=True
            ).dump()

        self.storage.update(f"{step_dir}/{LEASE}", drop)

    def append(
        self,
        step_dir: str,
        owner: Owner,
        token: int,
        event: str,
        message: str = "",
        data: Mapping[str, Any] | None = None,
        *,
        require_lease: bool = False,
    ) -> bool:
        """Append an event written under fencing token `token`; False if a newer token started.

        With `require_lease` (SUCCESS), the event is written only while `owner` holds the lease.
        """
        if require_lease:
            lease = self.lease(step_dir)
            if lease is None or not lease.held_by(owner, token) or self.clock() >= lease.expires:
                return False
        status_path = f"{step_dir}/{STATUS}"
        line = StatusEvent(event, token, self.clock(), owner.run_id, message, data or {}).dump()

        def add(old: bytes | None) -> bytes | None:
            current = parse_status(old, status_path)
            newest = max((e.token for e in current), default=0)
            last = last_state(current)
            if newest != token or (last is not None and last.event == SUCCESS):
                return None
            return complete_lines(old) + line

        return self.storage.update(status_path, add) is not None

    def note(
        self,
        step_dir: str,
        run_id: str,
        token: int,
        event: str,
        message: str,
        data: Mapping[str, Any] | None = None,
    ) -> bool:
        """Append a note (e.g. WARNING) from a running attempt; False if that attempt is no longer current."""
        if event not in NOTES:
            raise ValueError(f"{event!r} is a state, not a note")
        owner = Owner(run_id, "", 0, None)  # only the run id goes into the line
        return self.append(step_dir, owner, token, event, message, data)

    def commit(self, step_dir: str, owner: Owner, token: int, data: Mapping[str, Any] | None = None) -> bool:
        """Write SUCCESS if and only if we still hold the lease. Then release it."""
        ok = self.append(step_dir, owner, token, SUCCESS, data=data, require_lease=True)
        self.release(step_dir, owner, token)
        return ok
