"""What a running attempt's process says of itself, and how it answers the watchdog.

Every process that runs a step function (the one process of a step, or each host of a gang) keeps
a pulse thread while the function runs. Every `PULSE_SECONDS` it writes
`<step>/.logs/attempt-<token>[-host-<h>].pulse`: which process it is, where it runs, and its last
progress report (what it did, and when). The dashboard's run page shows these (per-host
liveness, the age of each host's last progress), and the runner's watchdog reads them
(`pipeline.run.scheduler.watchdog`).

When the watchdog decides an attempt is hung it writes `<step>/.logs/attempt-<token>.dump`. Each
pulse thread that sees it saves the Python stacks of every thread of its process
(`faulthandler`, which works from this thread while the step's own thread is stuck in C code, a
collective say) to `attempt-<token>[-host-<h>]-stacks.log`, naming the thread that runs the step.
A frozen or dead process writes neither pulses nor stacks, which is evidence too.

The pulse thread runs inside the attempt's write fence: a process whose lease may have expired
stops saying anything into the step directory.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterator

from pipeline.run.in_step import step_events
from pipeline.run.in_step.fence import LeaseExpired
from pipeline.run.in_step.step_events import StepContext
from pipeline.storage.layout import (
    LOGS_DIR,
    dump_request_name,
    pulse_name,
    stacks_name,
    started_path,
    stop_request_name,
)

__all__ = ["PULSE_SECONDS", "announce_start", "pulse"]

logger = logging.getLogger(__name__)

PULSE_SECONDS = 5.0
"""How often a running attempt's process writes its pulse and looks for a dump request."""


def _host(context: StepContext) -> int | None:
    return context.gang.index if context.gang.size > 1 else None


def dump_stacks(step_thread: int, header: str) -> str:
    """The Python stacks of every thread of this process, as faulthandler writes them, after a
    header naming the thread that runs the step."""
    with tempfile.TemporaryFile("w+") as f:
        f.write(f"{header}\nstep thread: {step_thread:#018x}\n\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read()


def announce_start(context: StepContext) -> None:
    """Say that the attempt's function is starting (`<step>/.logs/attempt-<token>.started`), once,
    from the gang's first host, on a backend where it may queue for resources after its lease is
    taken (Ray; `Backend.queues`): until then `drydock status` shows it QUEUED, and it times the
    attempt from here. The
    runner also holds the steps that follow it (evaluations of its checkpoints) until then, so
    that they never take the resources it needs to start. A failed write is logged, never
    raised: the followers then start when this step ends, and status shows it queued."""
    # On the local backend a function starts as soon as its lease is taken: nothing to announce
    # unless steps follow it (then the marker is what releases them). Ray's tasks may queue.
    if context.gang.index != 0 or (context.backend == "local" and not context.followed):
        return
    from pipeline.storage.opening import open_storage

    path = started_path(context.output_path, context.token)
    record = {"time": time.time(), "where": f"pid {os.getpid()} on {socket.gethostname()}"}
    try:
        step_events.check_lease(f"the start marker {path}")
        open_storage(context.output_path).write(path, json.dumps(record).encode())
    except (Exception, LeaseExpired) as e:  # storage, or a lost lease: the step goes on
        logger.warning("could not write %s: %s", path, e)


class _Pulse:
    def __init__(self, context: StepContext, step_thread: int, every: float) -> None:
        from pipeline.storage.opening import open_storage

        self.context, self.step_thread, self.every = context, step_thread, every
        base = f"{context.output_path.rstrip('/')}/{LOGS_DIR}"
        host = _host(context)
        self.pulse_path = f"{base}/{pulse_name(context.token, host)}"
        self.stacks_path = f"{base}/{stacks_name(context.token, host)}"
        self.request_path = f"{base}/{dump_request_name(context.token)}"
        self.stop_path = f"{base}/{stop_request_name(context.token)}"
        self.stop_heard = False
        self.storage = open_storage(context.output_path)
        self.started = time.time()
        self.dumped = False
        self.stop = threading.Event()
        self.where = f"pid {os.getpid()} on {socket.gethostname()}"
        # Taken in the step's thread: this thread checks the same fence before each write.
        self.guard = step_events.lease_guard()

    def beat(self) -> None:
        """Write the pulse once, and save the stacks if the watchdog asked and they are not saved."""
        report = step_events.local_progress(self.context.output_path)
        gang = self.context.gang
        record = {
            "host": gang.index,
            "hosts": gang.size,
            "where": self.where,
            "time": time.time(),
            "started": self.started,
            **(
                {"done": report[0], "total": report[1], "unit": report[2], "progress_time": report[3]}
                if report is not None
                else {}
            ),
        }
        self.guard(f"the pulse {self.pulse_path}")
        self.storage.write(self.pulse_path, json.dumps(record).encode())
        if not self.stop_heard and (request := self.storage.read(self.stop_path)) is not None:
            try:
                message = str(json.loads(request).get("message") or "stopped by its run")
            except (ValueError, AttributeError):
                message = "stopped by its run"
            # Told again at the next beat until the step listens (a training, once it trains).
            self.stop_heard = step_events.stop_requested(message)
        if not self.dumped and self.storage.read(self.request_path) is not None:
            header = f"host {gang.index} of {gang.size}, {self.where}"
            stacks = dump_stacks(self.step_thread, header)
            self.guard(f"the stacks {self.stacks_path}")
            self.storage.write(self.stacks_path, stacks.encode())
            self.dumped = True

    def loop(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.beat()
            except BaseException as e:  # a lost lease (the fence) or storage: the step goes on
                logger.debug("pulse of %s: %s", self.pulse_path, e)


@contextlib.contextmanager
def pulse(context: StepContext, every: float = PULSE_SECONDS) -> Iterator[None]:
    """Keep this process's pulse for the step in `context` while the body runs (the step function,
    called from this thread)."""
    beating = _Pulse(context, threading.get_ident(), every)
    thread = threading.Thread(target=beating.loop, name="drydock-pulse", daemon=True)
    thread.start()
    try:
        yield
    finally:
        beating.stop.set()
        thread.join(timeout=every + 5)
