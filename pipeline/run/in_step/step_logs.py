"""A step's output copied into its attempt log, `<output>/.logs/attempt-<token>.log`, while it
runs and however it ends (`pipeline.run.in_step.call_step.call_step` uses it).

In a worker process of its own (a Ray worker) the whole process's stdout and stderr are the
step's: file descriptors 1 and 2 go to a local file that is tee'd to the console and copied to
storage every `LOG_SYNC_SECONDS`. In a thread of the executor's process (the local backend)
only what the step's own thread, and the threads it starts, write and log is routed to its log
(`QuietConsole` keeps it off the console unless asked). The copy goes through the attempt's
fence: a stale attempt's log never overwrites its successor's.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.run.in_step.fence import Fence, LeaseExpired

__all__ = ["LOG_SYNC_SECONDS", "QuietConsole", "captured", "captured_thread"]


class _Tee(io.TextIOBase):
    """The real stream, plus the attempt's log copy until `release`. A logging handler that a
    library made during the step (Levanter's, at the start of training) keeps this object as its
    stream after the step: once released it writes to the real stream only, instead of to a
    closed file ("--- Logging error --- ValueError: I/O operation on closed file")."""

    def __init__(self, *streams: Any) -> None:
        self._streams = streams

    def release(self) -> None:
        """Stop copying: from now on write to the real stream alone."""
        self._streams = self._streams[:1]

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()

    def fileno(self) -> int:
        # Libraries that write at the file-descriptor level (faulthandler, C code) get the real stream.
        return self._streams[0].fileno()

    def isatty(self) -> bool:
        return False


LOG_SYNC_SECONDS = 5.0
"""How often a running step's log copy is written out: an attempt killed outright (Ctrl-C of a
Ray run cancels its tasks by killing their workers; a SIGKILL of the runner takes its private Ray
instance down) loses at most this many seconds of its log."""


class _LogSync:
    """Writes the attempt's log copy (`read()`: its bytes so far) to `log_path` every `every`
    seconds while it grows, and once more at the end; never once the attempt's lease may have
    expired (the step directory may then be another runner's). An attempt that wrote nothing
    leaves no log file: an empty one would cost a file (and the `.logs` directory) per step.
    The periodic writes come from one thread per process (`_SYNCER`), not one per attempt."""

    def __init__(self, read: Callable[[], bytes], log_path: str, fence: Fence | None, every: float) -> None:
        from pipeline.storage.opening import open_storage

        self._read, self._path, self._fence, self.every = read, log_path, fence, every
        self._storage = open_storage(log_path)
        self._written = 0
        self._lock = threading.Lock()

    def start(self) -> None:
        _SYNCER.add(self)

    def write(self) -> None:
        with self._lock:
            data = self._read()
            if len(data) == self._written:
                return
            if self._fence is not None and self._fence.remaining() <= 0:
                raise LeaseExpired("the lease may have expired")
            self._storage.write(self._path, data)
            self._written = len(data)

    def stop(self) -> None:
        """No periodic write after this returns (the final one is the caller's)."""
        _SYNCER.remove(self)


class _Syncer:
    """The thread that writes out the log copies of this process's running attempts, each every
    `every` seconds; started on first use."""

    def __init__(self) -> None:
        self._due: dict[_LogSync, float] = {}
        self._changed = threading.Condition()
        self._writing: _LogSync | None = None
        self._thread: threading.Thread | None = None

    def add(self, sync: _LogSync) -> None:
        with self._changed:
            self._due[sync] = time.monotonic() + sync.every
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="drydock-log-sync", daemon=True)
                _ORIGINAL_START(self._thread)  # never routed into the log of the step that starts it
            self._changed.notify()

    def remove(self, sync: _LogSync) -> None:
        with self._changed:
            self._due.pop(sync, None)
            while self._writing is sync:  # a periodic write of it is under way: let it finish
                self._changed.wait()

    def _loop(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                sync = min(self._due, key=self._due.__getitem__, default=None)
                if sync is None or self._due[sync] > now:
                    self._changed.wait(None if sync is None else self._due[sync] - now)
                    continue
                self._due[sync] = now + sync.every
                self._writing = sync
                self._changed.release()
                try:
                    with contextlib.suppress(Exception, LeaseExpired):  # the final write reports
                        sync.write()
                finally:
                    self._changed.acquire()
                    self._writing = None
                    self._changed.notify_all()


_SYNCER = _Syncer()


def _file_reader(local: Any) -> Callable[[], bytes]:
    """What a log copy kept in the temporary file `local` holds so far."""

    def read() -> bytes:
        local.flush()
        with open(local.name, "rb") as f:
            return f.read()

    return read


@contextlib.contextmanager
def captured(
    log_path: str, fence: Fence | None = None, sync_every: float = LOG_SYNC_SECONDS
) -> Iterator[None]:
    """Copy stdout, stderr and log records into `log_path` (any fsspec URL) while streaming them.

    The copy is written out as the step goes (`_LogSync`) and saved however the body ends: the log
    of a failed or interrupted attempt matters most; but not once the attempt's lease may have
    expired, since the step directory may be another runner's.
    """
    with (
        tempfile.NamedTemporaryFile("w+", suffix=".log") as local,
        _log_copy(local, _file_reader(local), log_path, fence, sync_every),
    ):
        handler = logging.StreamHandler(local)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        out, err = sys.stdout, sys.stderr
        tees = _Tee(out, local), _Tee(err, local)
        sys.stdout, sys.stderr = tees
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err
            for tee in tees:
                tee.release()
            root.removeHandler(handler)


@contextlib.contextmanager
def _log_copy(
    local: Any, read: Callable[[], bytes], log_path: str, fence: Fence | None, sync_every: float
) -> Iterator[None]:
    """Write the attempt's local log copy out to `log_path` as it grows (`_LogSync`) and once more
    at the end, after the traceback of whatever ended the body; a failed copy is reported, never
    raised (a log copy must never change how the step ends)."""
    sync = _LogSync(read, log_path, fence, sync_every)
    sync.start()
    try:
        yield
    except BaseException:
        traceback.print_exc(file=local)
        raise
    finally:
        sync.stop()
        try:
            sync.write()
        except (Exception, LeaseExpired) as e:
            print(f"drydock: could not save the step log to {log_path}: {e}", file=sys.stderr)


class _ThreadRouter(io.TextIOBase):
    """`sys.stdout` or `sys.stderr` of a process whose steps run in threads (the local backend):
    what a step's threads write goes to its attempt's log (and to the real stream only when the
    run is verbose); every other thread writes to the real stream. A step's threads are its own
    and those it starts, and those they start (`_inherit_routes`): a checkpoint writer, a data
    loader. Pools started before the step are not its own."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.routes: dict[int, tuple[Any, bool]] = {}

    def write(self, text: str) -> int:
        route = self.routes.get(threading.get_ident())
        if route is None:
            return self.real.write(text)
        log, echo = route
        log.write(text)
        if echo:
            self.real.write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def fileno(self) -> int:
        return self.real.fileno()

    def isatty(self) -> bool:
        route = self.routes.get(threading.get_ident())
        return self.real.isatty() if route is None else False


class _ThreadLogs(logging.Handler):
    """Writes the log records of each step thread to its attempt's log."""

    def __init__(self) -> None:
        super().__init__()
        self.routes: dict[int, Any] = {}
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        log = self.routes.get(record.thread or 0)
        if log is not None:
            # ValueError: the attempt ended while a straggling record was being written.
            with contextlib.suppress(ValueError):
                log.write(self.format(record) + "\n")


class QuietConsole(logging.Filter):
    """On the console handler: leaves out what step threads log (it is in their attempt logs),
    unless the run is verbose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread not in _THREAD_LOGS.routes or _ECHO.get(record.thread or 0, False)


_ROUTING_LOCK = threading.Lock()
_THREAD_LOGS = _ThreadLogs()
_ECHO: dict[int, bool] = {}
_ORIGINAL_START = threading.Thread.start


def _bind(ident: int, route: tuple[Any, bool] | None) -> None:
    """Send what thread `ident` writes and logs to `route` (an attempt's log, echo), or nowhere
    special (None)."""
    with _ROUTING_LOCK:
        for stream in (sys.stdout, sys.stderr):
            if isinstance(stream, _ThreadRouter):
                if route is None:
                    stream.routes.pop(ident, None)
                else:
                    stream.routes[ident] = route
        if route is None:
            _THREAD_LOGS.routes.pop(ident, None)
            _ECHO.pop(ident, None)
        else:
            _THREAD_LOGS.routes[ident] = route[0]
            _ECHO[ident] = route[1]


def _inherit_routes(self: threading.Thread) -> None:
    """`threading.Thread.start`, for a thread started by a routed thread: routed the same way."""
    router = sys.stderr
    route = router.routes.get(threading.get_ident()) if isinstance(router, _ThreadRouter) else None
    if route is not None:
        run = self.run

        def routed_run() -> None:
            _bind(threading.get_ident(), route)
            try:
                run()
            finally:
                _bind(threading.get_ident(), None)

        self.run = routed_run  # type: ignore[method-assign]
    _ORIGINAL_START(self)


def _routers() -> tuple[_ThreadRouter, _ThreadRouter]:
    """The process's stdout and stderr routers, installed on first use (and again if something,
    such as a test harness, replaced them since)."""
    with _ROUTING_LOCK:
        if not isinstance(sys.stdout, _ThreadRouter):
            sys.stdout = _ThreadRouter(sys.stdout)
        if not isinstance(sys.stderr, _ThreadRouter):
            sys.stderr = _ThreadRouter(sys.stderr)
        root = logging.getLogger()
        if _THREAD_LOGS not in root.handlers:
            root.addHandler(_THREAD_LOGS)
        threading.Thread.start = _inherit_routes  # type: ignore[method-assign]
        return sys.stdout, sys.stderr  # type: ignore[return-value]


@contextlib.contextmanager
def captured_thread(
    log_path: str, fence: Fence | None = None, echo: bool = True, sync_every: float = LOG_SYNC_SECONDS
) -> Iterator[None]:
    """`captured` for a step running in a thread of a process shared with other steps: only
    this thread's output and log records, through the process's routers."""
    ident = threading.get_ident()
    # In memory, not a temporary file: a first run of many small steps is bound by how fast the
    # file system makes files (docs/performance.md), and a thread's log needs no file of its own.
    local = _LogBuffer()
    with _log_copy(local, local.contents, log_path, fence, sync_every):
        _routers()
        _bind(ident, (local, echo))
        try:
            yield
        finally:
            _bind(ident, None)


class _LogBuffer(io.StringIO):
    """A step thread's log copy, in memory; written to by the step's threads and read by its
    `_LogSync`."""

    def contents(self) -> bytes:
        return self.getvalue().encode("utf-8", "replace")
