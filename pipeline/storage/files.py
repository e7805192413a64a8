"""Byte-level storage under a prefix: read, write, list, delete, atomic read-modify-write.

Together with `pipeline.storage.step_store` (the commit protocol built on it) and
`pipeline.storage.manifests`, this is the only code that opens files under a prefix.

Atomic read-modify-write (`Storage.update`) is the single primitive the commit protocol needs.
Local disk implements it with `flock` on the file; `memory://` with a process lock (the memory
filesystem is process-local); S3 and GCS (`ConditionalStorage`) with their conditional writes:
read the object and its version, compute, write only if the version is unchanged, else re-read
and recompute. Transient storage errors are retried with backoff and jitter
(`pipeline.storage.object_stores`); docs/storage.md describes the guarantees per store.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import fsspec

from pipeline.errors import StorageAccessDenied, StorageError
from pipeline.storage.layout import TMP_PREFIX
from pipeline.storage.object_stores import (
    CONTENTION,
    DEFAULT_RETRY,
    ConditionalObjects,
    RetryPolicy,
    backoff_delay,
    describe_error,
    is_missing_bucket,
    retrying,
)

__all__ = [
    "ConditionalStorage",
    "LocalStorage",
    "RetryPolicy",
    "Storage",
    "write_atomically",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
A = TypeVar("A")


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

    def read_consistent(self, path: str) -> bytes | None:
        """`read`, never seeing a write of `update` half-done: here, under the process lock
        `update` writes under, since a filesystem may write a file by truncating it first (a
        commit that read `.lease` mid-renewal took the lease for lost). Object stores replace an
        object whole (`ConditionalStorage` reads plainly); local disk reads under `flock`."""
        with self._lock:
            return self.read(path)

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
        """Remove the file `path`, or with `recursive` the directory and all below it; absent is fine.

        Exact names only: fsspec's `rm` expands `[`, `?` and `*` in a path as a glob (deleting
        `results1.json` for `results[1].json`, or recursing forever on `x?y`), so the keys are
        listed under `path` and each is deleted by name."""

        def once() -> None:
            self.fs.invalidate_cache(path)
            found = self.fs.find(path, withdirs=True, detail=True) if recursive else {}
            keys = [key for key, info in found.items() if info.get("type") != "directory"]
            if not found and self.fs.isfile(path):
                keys = [path]
            if len(keys) < 64:
                for key in keys:
                    self._remove_key(key)
            else:
                with ThreadPoolExecutor(16) as pool:
                    list(pool.map(self._remove_key, keys))
            if recursive and not isinstance(self, ConditionalStorage):
                # Stores with directories (memory://) keep them empty: remove them deepest first.
                # Never on object stores, where removing the "directory" of a bucket's root
                # would remove the bucket.
                dirs = [key for key, info in found.items() if info.get("type") == "directory"]
                for directory in sorted({*dirs, path}, key=len, reverse=True):
                    with contextlib.suppress(OSError):
                        self.fs.rmdir(directory)
            self.fs.invalidate_cache(path)

        self._retrying("delete", path, once)

    def _remove_key(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(key)

    def disk_usage(self, path: str) -> int:
        """Total bytes of the files under `path` (0 if it does not exist)."""

        def once() -> int:
            try:
                return int(self.fs.du(path, total=True))
            except FileNotFoundError:
                return 0

        return self._retrying("measure", path, once)

    def temporary_entries(self, path: str) -> list[str]:
        """Every `.tmp-*` file or directory under `path`, at any depth (outermost only: a staging
        directory, not what it holds), sorted: writes in progress, or what killed ones left."""

        def once() -> list[str]:
            try:
                found = self.fs.find(path, withdirs=True)
            except FileNotFoundError:
                return []
            base = self.fs._strip_protocol(path).rstrip("/")
            out = set()
            for key in found:
                parts = key[len(base) :].strip("/").split("/")
                for i, part in enumerate(parts):
                    if part.startswith(TMP_PREFIX):
                        out.add("/".join([path.rstrip("/"), *parts[: i + 1]]))
                        break
            return sorted(out)

        return self._retrying("list", path, once)

    def resolves_outside(self, path: str, prefix: str) -> str | None:
        """Where `path` really is, if that is outside `prefix` (through a symbolic link on local
        disk); None when it is inside. Object stores have no links: always None."""
        return None

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

    def read_consistent(self, path: str) -> bytes | None:
        # An object is replaced whole, and `update` here takes no process lock to wait for.
        return self.read(path)

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


def _read_all(fd: int) -> bytes:
    """Everything from `fd`'s offset to its end."""
    size = 1 << 16
    chunk = os.read(fd, size)
    if len(chunk) < size:
        # A short read of a regular file is its end (a signal does not cut a read of a local
        # file short): one system call per small file, not two, and a plan reads one per step.
        return chunk
    chunks = [chunk]
    while chunk := os.read(fd, size):
        chunks.append(chunk)
    return b"".join(chunks)


def _in_directory(directory: str, make: Callable[[], T]) -> T:
    """`make()`, which creates a file in `directory`; the directory is made only if that fails for
    its absence (it usually exists, and a first run of many small steps is bound by file-system
    calls: docs/performance.md)."""
    try:
        return make()
    except FileNotFoundError:
        os.makedirs(directory, exist_ok=True)
        return make()


def write_atomically(path: str, data: bytes) -> None:
    """Replace the local file `path` with `data`, whole or not at all: written to a `.tmp-*` file
    beside it (unique per writer) and renamed over it; the directory is made if needed. A writer
    killed midway leaves only that `.tmp-*` file, which `drydock gc` finds and deletes at any
    depth. The one atomic write of the project: storage and the step library (`steps.files`)."""
    parent = os.path.dirname(path)
    fd, tmp = _in_directory(parent, lambda: tempfile.mkstemp(dir=parent, prefix=TMP_PREFIX))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class LocalStorage(Storage):
    """Local disk: atomic rename for whole writes, `flock` for read-modify-write.

    `update` appends in place when the new content extends the old, so `.status` stays a true
    append-only file. Safe against processes dying at any point; it does not fsync, so a
    machine losing power may lose the last events (they are then redone, never half-trusted).
    """

    def __init__(self, confine: str | None = None) -> None:
        super().__init__(fsspec.filesystem("file"))
        self.root = os.path.realpath(self._local(confine)) if confine else None
        """With `confine` (a prefix): reads, listings and deletions never leave it through a
        symbolic link; a path that resolves outside reads as missing, and deleting one fails."""

    @staticmethod
    def _local(path: str) -> str:
        return path[len("file://") :] if path.startswith("file://") else path

    def inside(self, path: str) -> bool:
        """Whether `path` resolves (symbolic links followed) inside the confining prefix."""
        if self.root is None:
            return True
        real = os.path.realpath(self._local(path))
        return real == self.root or real.startswith(self.root + os.sep)

    def resolves_outside(self, path: str, prefix: str) -> str | None:
        real, root = os.path.realpath(self._local(path)), os.path.realpath(self._local(prefix))
        return None if real == root or real.startswith(root + os.sep) else real

    def read(self, path: str) -> bytes | None:
        return self._read_local(path, shared_lock=False)

    def _read_local(self, path: str, *, shared_lock: bool) -> bytes | None:
        if not self.inside(path):
            return None
        try:
            # os.open, not open(): no buffered-reader object, half the cost per small file, and a
            # cached plan reads one small file per step.
            fd = os.open(self._local(path), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as e:
            raise StorageAccessDenied(f"cannot read {path}: permission denied ({e.strerror})") from e
        try:
            if shared_lock:
                fcntl.flock(fd, fcntl.LOCK_SH)
            return _read_all(fd)
        finally:
            os.close(fd)

    def write(self, path: str, data: bytes) -> None:
        try:
            self._write(self._local(path), data)
        except OSError as e:  # a full disk, a file where a directory should be: one clear error
            raise StorageError(f"write {path!r}: {e.strerror or e}") from e

    def _write(self, path: str, data: bytes) -> None:
        write_atomically(path, data)

    def update(self, path: str, fn: Callable[[bytes | None], bytes | None]) -> bytes | None:
        path = self._local(path)
        fd = _in_directory(os.path.dirname(path), lambda: os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            old = _read_all(fd)
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

    def read_consistent(self, path: str) -> bytes | None:
        # `update` rewrites a file in place (truncate, then write) holding an exclusive flock: a
        # shared one here waits for it, so a reader never takes an empty file for a missing lease.
        return self._read_local(path, shared_lock=True)

    def listdir(self, path: str) -> list[str]:
        if not self.inside(path):
            return []
        try:
            return os.listdir(self._local(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def read_tail(self, path: str, size: int) -> bytes | None:
        if not self.inside(path):
            return None
        return super().read_tail(path, size)

    def delete(self, path: str, recursive: bool = False) -> None:
        local = self._local(path)
        if os.path.islink(local):
            os.unlink(local)  # the link, never what it points to
            return
        if not self.inside(path):
            raise StorageError(
                f"delete {path!r}: it resolves to {os.path.realpath(local)!r}, outside the prefix "
                f"{self.root!r} (through a symbolic link); not deleted"
            )
        try:
            # By name, never as a glob; rmtree removes links inside, not what they point to.
            if recursive and os.path.isdir(local):
                shutil.rmtree(local)
            else:
                os.unlink(local)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(f"delete {path!r}: {e.strerror or e}") from e

    def check_writable(self, prefix: str) -> None:
        path = self._local(prefix)
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StorageError(f"prefix {prefix!r} cannot be created: {e.strerror or e}") from e
        if not os.access(path, os.W_OK | os.X_OK):
            raise StorageError(f"prefix {prefix!r} is not writable (permission denied)")
