"""The runner's watchdog: an attempt whose progress has stopped is hung, not slow.

What ends a months-long run is rarely an exception: it is a collective one host never enters, a
filesystem that blocks, a deadlock. The process is alive, its lease is renewed, and nothing
happens. A step function that keeps a pace declares it (`step_function(fn,
watchdog=HangPolicy())`); while an attempt of it runs, this watchdog (one thread in the runner)
reads the step's `.progress` every few seconds and notes when it last changed (on the runner's own
clock, so no two machines' clocks are compared). When it has not changed for longer than the
policy's bound (`factor` x the median time per unit of progress so far, at least `floor`;
`startup` before the first report; or `Resources.hang_timeout`), the watchdog:

1. asks every process of the attempt for its Python stacks (`attempt-<token>.dump`; each
   process's pulse thread saves its own, `pipeline.run.in_step.pulse`), and waits a little for them;
2. reads them, and names the hosts whose step thread is somewhere else than the others: a host
   waiting inside JAX (in a collective, or on a device) is waiting for someone; a host outside
   JAX, or one that saved no stacks at all, is the suspect;
3. hands the runner a `Hang` (`on_hang`): the executor records a HUNG warning with it, stops the
   attempt, and retries it as an infrastructure failure (a preemption: the training resumes from
   its last checkpoint). The same hang again and again is a deterministic one and becomes a
   failure (`Resources.crash_limit`, as for crashes).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.step import HangPolicy
from pipeline.storage.layout import LOGS_DIR, dump_request_name, log_token
from pipeline.storage.step_store import StepStore

__all__ = ["DUMP_WAIT_SECONDS", "Hang", "Watchdog", "describe_stacks"]

logger = logging.getLogger(__name__)

DUMP_WAIT_SECONDS = 20.0
"""How long the watchdog waits for the processes' stacks before it acts without the missing ones."""
HISTORY = 20
"""Progress reports the median time per unit is taken over."""


@dataclass(frozen=True)
class Hang:
    """What the watchdog found: one line for `.status`, and the facts behind it."""

    message: str
    data: Mapping[str, Any]


@dataclass
class _Watched:
    label: str
    step_dir: str
    token: int
    policy: HangPolicy
    fixed: float | None
    seen_at: float
    """When (the runner's clock) the progress was last seen to change, or the watch began."""
    last: tuple[float, float] | None = None
    """The last report: (done, its own time)."""
    unit: str = ""
    reports: list[tuple[float, float]] = field(default_factory=list)
    requested: float | None = None


class Watchdog:
    """Watches the progress of running attempts; calls `on_hang(label, hang)` for a hung one."""

    def __init__(
        self,
        store: StepStore,
        on_hang: Callable[[str, Hang], None],
        *,
        on_report: Callable[[str, Mapping[str, Any]], None] | None = None,
        interval: float = 5.0,
        dump_wait: float = DUMP_WAIT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store, self._on_hang, self._interval = store, on_hang, interval
        self._on_report = on_report
        """Told of each new progress report of a watched attempt (the executor's alerts)."""
        self._dump_wait, self._clock = dump_wait, clock
        self._watched: dict[str, _Watched] = {}
        self._lock = threading.Lock()
        self._reporting = threading.Lock()  # one on_report at a time: the thread's and finish's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, label: str, step_dir: str, token: int, policy: HangPolicy, fixed: float | None) -> None:
        """Watch the attempt with fencing token `token` of step `label` from now on."""
        with self._lock:
            self._watched[label] = _Watched(label, step_dir, token, policy, fixed, self._clock())
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="drydock-watchdog", daemon=True)
                self._thread.start()

    def forget(self, label: str) -> None:
        with self._lock:
            self._watched.pop(label, None)

    def finish(self, label: str) -> None:
        """Stop watching `label`'s attempt, which has ended, after one last look at its progress:
        what it reported since the last look (an alert it asks for at its end) is not lost."""
        with self._lock:
            w = self._watched.pop(label, None)
        if w is None or self._on_report is None:
            return
        try:
            report = self._store.read_progress(w.step_dir)
        except Exception as e:  # the step has ended: a missed report is not worth failing it
            logger.warning("watchdog: cannot look at %s: %s", label, e)
            return
        fresh = report is not None and report.get("token") == w.token
        if fresh and (float(report["done"]), float(report["time"])) != w.last:  # type: ignore[index]
            with self._reporting:
                self._on_report(label, report)  # type: ignore[arg-type]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.check()

    def check(self) -> None:
        """One look at every watched attempt (the thread calls this; tests may too)."""
        with self._lock:
            watched = list(self._watched.values())
        for w in watched:
            try:
                hang = self._look(w)
            except Exception as e:  # storage hiccups: look again next time
                logger.warning("watchdog: cannot look at %s: %s", w.label, e)
                continue
            if hang is not None:
                self.forget(w.label)
                self._on_hang(w.label, hang)

    def _look(self, w: _Watched) -> Hang | None:
        now = self._clock()
        report = self._store.read_progress(w.step_dir)
        if report is not None and report.get("token") == w.token:
            mark = (float(report["done"]), float(report["time"]))
            if mark != w.last:
                if w.last is not None and mark[0] > w.last[0]:
                    w.reports.append(mark)
                    del w.reports[:-HISTORY]
                elif w.last is None:
                    w.reports.append(mark)
                w.last, w.unit, w.seen_at, w.requested = mark, str(report.get("unit") or ""), now, None
                if self._on_report is not None:
                    with self._reporting:
                        self._on_report(w.label, report)
        per_unit = _per_unit(w.reports)
        bound = w.policy.bound(per_unit, w.fixed, reported=w.last is not None)
        stalled = now - w.seen_at
        if stalled <= bound:
            return None
        logs = f"{w.step_dir.rstrip('/')}/{LOGS_DIR}"
        if w.requested is None:
            w.requested = now
            self._store.storage.write(f"{logs}/{dump_request_name(w.token)}", b"")
            logger.warning(
                "%s: no progress for %.0f s (bound %.0f s): asking for its stacks", w.label, stalled, bound
            )
            return None
        names = [n for n in self._store.storage.listdir(logs) if log_token(n) == w.token]
        hosts = sorted({_host_of(n) for n in names if n.endswith(".pulse")})
        stacks = {_host_of(n): n for n in names if n.endswith("-stacks.log")}
        if set(hosts) - set(stacks) and now - w.requested < self._dump_wait:
            return None
        texts = {
            h: (self._store.storage.read(f"{logs}/{n}") or b"").decode("utf-8", "replace")
            for h, n in stacks.items()
        }
        reached = {}
        for name in (n for n in names if n.endswith(".pulse")):
            with contextlib.suppress(ValueError, TypeError):
                done = json.loads(self._store.storage.read(f"{logs}/{name}") or b"{}").get("done")
                if isinstance(done, int | float):
                    reached[_host_of(name)] = done
        saved = [f"{LOGS_DIR}/{n}" for n in sorted(stacks.values())]
        return _hang(w, stalled, bound, hosts, texts, saved, reached)


def _per_unit(reports: list[tuple[float, float]]) -> float | None:
    """The median seconds per unit of progress between consecutive reports."""
    rates = [(t1 - t0) / (d1 - d0) for (d0, t0), (d1, t1) in itertools.pairwise(reports) if d1 > d0]
    return statistics.median(rates) if rates else None


def _host_of(name: str) -> int:
    match = re.search(r"-host-(\d+)", name)
    return int(match.group(1)) if match else 0


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_COLLECTIVES = ("process_allgather", "sync_global_devices", "broadcast_one_to_all", "barrier")


def _step_frames(text: str) -> list[tuple[str, int, str]] | None:
    """The frames (file, line, function; innermost first) of the thread that runs the step, from
    a stacks file `pipeline.run.in_step.pulse` saved; None if it names no such thread."""
    match = re.search(r"^step thread: (0x[0-9a-f]+)", text, re.M)
    if match is None:
        return None
    wanted = int(match.group(1), 16)
    frames: list[tuple[str, int, str]] | None = None
    for line in text.splitlines():
        header = re.match(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", line)
        if header:
            if frames is not None:
                break
            frames = [] if int(header.group(1), 16) == wanted else None
            continue
        frame = _FRAME.match(line)
        if frame and frames is not None:
            frames.append((frame["file"], int(frame["line"]), frame["func"]))
    return frames


def describe_stacks(text: str) -> tuple[bool, str]:
    """(whether the step's thread waits inside JAX, where it is in a few words)."""
    frames = _step_frames(text)
    if not frames:
        return False, "no stack of its step thread"
    for _file, _line, func in frames:
        if func in _COLLECTIVES:
            return True, f"waits in a collective ({func})"
    for file, _line, func in frames:
        if "multihost_utils" in file:
            return True, f"waits in a collective ({func})"
    for file, _line, func in frames[:8]:
        if "/jax/" in file or "/jaxlib/" in file:
            return True, f"waits in JAX ({func})"
    file, line, func = frames[0]
    return False, f"is in {func} at {file.rsplit('/', 1)[-1]}:{line}"


def _hang(
    w: _Watched,
    stalled: float,
    bound: float,
    hosts: list[int],
    texts: Mapping[int, str],
    saved: list[str],
    reached: Mapping[int, float],
) -> Hang:
    """The `Hang` of a watched attempt: how long, where each host is, who to suspect. `reached`:
    how far each host said it got in its pulse (the step's `.progress` is written every few
    seconds at most; each pulse has its process's last report)."""
    where: dict[int, str] = {}
    waiting: list[int] = []
    for host in sorted(set(hosts) | set(texts)):
        if host not in texts:
            where[host] = "saved no stacks (frozen or gone)"
            continue
        in_jax, said = describe_stacks(texts[host])
        where[host] = said
        if in_jax:
            waiting.append(host)
    suspects = [h for h in where if h not in waiting]
    if len(where) > 1:
        named = suspects or sorted(where)
        parts = [f"host {h} {where[h]}" for h in named] + [
            f"host {h} {where[h]}" for h in where if h not in named
        ]
    else:
        parts = [f"its step {said}" for said in where.values()]
    last = max(reached.values()) if reached else (w.last[0] if w.last is not None else None)
    done = f" after {last:g} {w.unit or 'units'}" if last is not None else " before reporting progress"
    message = f"HUNG: no progress for {stalled:.0f} s (bound {bound:.0f} s){done}; " + "; ".join(parts)
    if saved:
        message += f"; stacks in {', '.join(saved)}"
    data = {
        "hung": True,
        "stalled_seconds": round(stalled, 1),
        "bound_seconds": round(bound, 1),
        "done": last,
        "reached": {str(h): d for h, d in sorted(reached.items())},
        "suspects": suspects,
        "hosts": {str(h): where[h] for h in where},
        "stacks": saved,
    }
    return Hang(message, json.loads(json.dumps(data)))
