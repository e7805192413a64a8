"""The write fence: a step attempt whose lease may have expired stops writing files.

The commit protocol fences `.status` and `.lease` (conditional writes under the fencing token),
but not the payload a step function writes. A runner frozen past its lease (SIGSTOP, a paused
VM, a long stall) loses the step to another runner; when it resumes, its step function carries
on from where it stopped, and without a fence it writes into the directory the other runner
has committed by then. This module refuses those writes.

How: one audit hook (`sys.addaudithook`) per process watches the events Python raises before it
opens a file for writing, renames, removes or creates a path. When the running attempt's `Fence`
says its lease may have run out, the hook raises `LeaseExpired` (a `StepCancelled`) in the thread
that tried to write, so the call never happens. The check is local and does no I/O: the deadline
is kept up to date by whoever knows the lease (the executor's heartbeat for the local backend, a
watcher thread reading `.lease` in a Ray worker, see `watch_lease`).

Which threads are fenced:
  - `fenced_thread`: the calling thread only (a context variable), for the local backend, whose
    steps run in threads of the executor: the executor's own writes (`.status`, commits) must
    never be refused, and they happen in other threads.
  - `fenced_process`: every thread of the process except those already running when the fence
    was set up (the host's own, e.g. Ray's), for a Ray worker, which runs one task at a time:
    threads the step function starts are fenced too.

Hooks cannot be removed; outside a fence the hook returns at once, so a process (or a reused Ray
worker) is never left fenced after its step. What it cannot stop: uploads to object stores
(network requests, not files), writes made by native code that bypasses Python's `open`/`os`
(C++ libraries writing on their own), writes through a file that was opened before the
deadline. For the first two, code about to upload or hand data to native code checks the same
deadline itself first (`current_fence`, `step_events.check_lease`). Nor can it stop, in a Ray
worker, a worker whose clock runs behind the clock of the runner that takes over by more than
the lease's margin. A Ray worker on its driver's host also stops
writing as soon as the driver exits (a killed driver's worker lives on for a second or two,
and a rerun on that host takes the step over at once); one on another host cannot see the
driver and goes by the lease's expiry alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

from pipeline.errors import StepCancelled

__all__ = [
    "Fence",
    "LeaseExpired",
    "current_fence",
    "fenced_process",
    "fenced_thread",
    "install",
    "watch_lease",
]

logger = logging.getLogger(__name__)


class LeaseExpired(StepCancelled):
    """A step attempt tried to write after its lease may have expired; the write did not happen."""


# Flags of `open` events that create or change a file (a read-only open passes).
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
# Audit events that change a name or remove/create a path; their first argument is the path.
_CHANGE_EVENTS = frozenset(
    {
        "os.rename",  # also os.replace
        "os.remove",  # also os.unlink
        "os.rmdir",
        "os.mkdir",
        "os.truncate",
        "os.link",
        "os.symlink",
        "shutil.rmtree",
    }
)


@dataclass
class Fence:
    """One step attempt's fence: writes are refused once `remaining()` is not positive."""

    remaining: Callable[[], float]
    """Seconds the attempt's lease is surely still held; zero or less once it may have expired."""
    label: str = ""
    """The step, for error messages."""
    refused: str | None = None
    """The first write refused (so a caller can tell a fenced attempt apart however it ended)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tripped(self) -> bool:
        """Whether any write of this attempt was refused."""
        return self.refused is not None

    def check(self, what: str) -> None:
        """Raise `LeaseExpired` if the lease may have expired; `what` names the write."""
        if self.remaining() > 0:
            return
        self.trip(what, "the lease may have expired")

    def trip(self, what: str, why: str) -> NoReturn:
        """Refuse `what` for `why` (the step learnt it lost its lease some other way): the attempt
        is then reported as one whose writes were refused, however it ends."""
        with self._lock:
            if self.refused is None:
                self.refused = what
        step = f"step {self.label}: " if self.label else ""
        raise LeaseExpired(f"{step}{why}; refused {what}")


_THREAD_FENCE: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("drydock_fence", default=None)
# The process-wide fence of a Ray worker, and the threads it leaves alone (read without a lock:
# the hook must stay cheap, and a tuple swap is atomic).
_process: tuple[Fence, frozenset[int]] | None = None
_install_lock = threading.Lock()
_installed = False


def _writes(event: str, args: tuple) -> bool:
    if event == "open":
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        return bool(flags & _WRITE_FLAGS)
    return event in _CHANGE_EVENTS


def _hook(event: str, args: tuple) -> None:
    # Called for every audit event of the process: return as early as possible.
    if event != "open" and event not in _CHANGE_EVENTS:
        return
    fence = _THREAD_FENCE.get()
    if fence is None:
        process = _process
        if process is None or threading.get_ident() in process[1]:
            return
        fence = process[0]
    if _writes(event, args):
        fence.check(f"{event} {args[0]!r}")


def current_fence() -> Fence | None:
    """The fence over the calling thread's writes, or None where nothing is fenced.

    For writes the audit hook cannot see (uploads, native writers): call `check` on it first. Capture
    it in the step's thread to check it from threads the step starts (a local-backend step's threads
    do not inherit its context).
    """
    fence = _THREAD_FENCE.get()
    if fence is not None:
        return fence
    process = _process
    if process is None or threading.get_ident() in process[1]:
        return None
    return process[0]


def install() -> None:
    """Install the audit hook in this process (once; later calls do nothing)."""
    global _installed
    with _install_lock:
        if not _installed:
            sys.addaudithook(_hook)  # for the life of the process: hooks cannot be removed
            _installed = True


@contextlib.contextmanager
def fenced_thread(fence: Fence) -> Iterator[Fence]:
    """Fence the calling thread's writes (and code running in a copy of its context)."""
    install()
    token = _THREAD_FENCE.set(fence)
    try:
        yield fence
    finally:
        _THREAD_FENCE.reset(token)


@contextlib.contextmanager
def fenced_process(fence: Fence) -> Iterator[Fence]:
    """Fence the writes of every thread of this process but those running now, except the caller.

    For a process that runs one step at a time (a Ray worker). Not reentrant.
    """
    global _process
    install()
    me = threading.get_ident()
    exempt = frozenset(t.ident for t in threading.enumerate() if t.ident is not None and t.ident != me)
    _process = (fence, exempt)
    try:
        yield fence
    finally:
        _process = None


class _Deadline:
    """A wall-clock deadline shared between a watcher thread and a `Fence`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.at = float("-inf")
        self._clock = clock

    def remaining(self) -> float:
        return self.at - self._clock()


@contextlib.contextmanager
def watch_lease(
    read_deadline: Callable[[], float | None],
    interval: float,
    label: str = "",
    clock: Callable[[], float] = time.time,
    initial: float = float("-inf"),
    gone: Callable[[], bool] | None = None,
) -> Iterator[Fence]:
    """A `Fence` whose deadline `read_deadline()` refreshes now and every `interval` seconds.

    `read_deadline` returns the wall-clock time the lease expires while it is still this attempt's,
    -inf once it is not, and None when it cannot tell (a record caught mid-rewrite). Until a read
    tells, the deadline is `initial` (what the submitter knew); when a read cannot tell or raises
    (storage unreachable), the last deadline stands: it runs out by itself if that lasts. The
    watcher is a daemon thread, stopped on exit. With `gone`, the fence also closes as soon as
    `gone()` is true, checked at each write (the lease holder has exited: `pipeline.run.in_step.call_step`).
    """
    deadline = _Deadline(clock)
    deadline.at = initial
    stop = threading.Event()

    def refresh() -> None:
        try:
            value = read_deadline()
        except Exception as e:
            logger.warning("step %s: cannot read its lease to fence its writes: %s", label, e)
            return
        if value is not None:
            deadline.at = value

    def loop() -> None:
        while not stop.wait(interval):
            refresh()

    refresh()
    watcher = threading.Thread(target=loop, name="drydock-fence", daemon=True)
    watcher.start()
    try:
        if gone is None:
            yield Fence(deadline.remaining, label)
        else:

            def remaining() -> float:
                left = deadline.remaining()
                return float("-inf") if left > 0 and gone() else left

            yield Fence(remaining, label)
    finally:
        stop.set()
        watcher.join()
