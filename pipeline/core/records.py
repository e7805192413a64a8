"""What a step directory's metadata says, as values: status events, records, the state vocabulary.

`.status` is append-only JSON lines, one `StatusEvent` each; `parse_status` reads them (a final
line without a newline is a write in progress and is skipped; any other malformed line makes the
file corrupt). A `StepRecord` is one step directory's snapshot entry: its events, its lease and,
for a finished step, its `.step.json`. Planning and every view of a step read these records;
only `pipeline.storage` produces them from files. No I/O here.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.lease import LeaseRecord, is_stale
from pipeline.core.usable_numbers import usable_time
from pipeline.errors import StorageError

__all__ = [
    "ANNOUNCES_START",
    "NOTES",
    "REMOTE_WORKERS",
    "Event",
    "StatusEvent",
    "StepRecord",
    "complete_lines",
    "last_state",
    "may_outlive_runner",
    "parse_status",
]


class Event(enum.StrEnum):
    """The events of `.status`, as written on disk. States change a step's state; notes do not."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PREEMPTED = "PREEMPTED"
    WARNING = "WARNING"


NOTES = frozenset({Event.WARNING})
"""Events a running step reports about itself; they never change the step's state."""


# Not frozen, and never assigned to after it is made: a frozen dataclass sets each field in
# __init__ through object.__setattr__, three times the cost of a plain slot, and a plan makes
# two of these per finished step (with StepNode, StatusEvent and StepPlan
# unfrozen, a 10,000-step cached plan took 20-40 ms less). Records hold them in tuples.
@dataclass(slots=True)
class StatusEvent:
    """One line of `.status`."""

    event: str
    token: int
    time: float
    run_id: str = ""
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def dump(self) -> bytes:
        raw: dict[str, Any] = {"event": str(self.event), "token": self.token, "time": round(self.time, 6)}
        if self.run_id:
            raw["run_id"] = self.run_id
        if self.message:
            raw["message"] = self.message
        if self.data:
            raw["data"] = dict(self.data)
        # Keys of the line sorted; inside `data` in the writer's order (a report's table columns).
        return json.dumps({k: raw[k] for k in sorted(raw)}).encode() + b"\n"


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


_KNOWN_EVENTS = frozenset(e.value for e in Event)
_DECODER = json.JSONDecoder()
"""What `json.loads` of a str uses (its default decoder), without its per-call checks."""


def _event(raw: Any) -> StatusEvent:
    """One `.status` line's event; TypeError/ValueError naming the field for anything else: an
    unknown event (which would otherwise silently follow a SUCCESS and un-commit the step) or a
    field of the wrong type. `raw` comes from the JSON decoder, whose values are of exact types
    (never subclasses), so `type(...) is` checks suffice and cost a plan least."""
    if type(raw) is not dict:
        raise TypeError("not a JSON object")
    event, token, when = raw["event"], raw["token"], raw["time"]
    if type(event) is not str or event not in _KNOWN_EVENTS:
        raise ValueError(f"unknown event {event!r}")
    if type(token) is not int:  # a bool is not a whole number here
        raise TypeError(f"token {token!r} is not a whole number")
    if type(when) is not float and type(when) is not int:
        raise TypeError(f"time {when!r} is not a number")
    if not usable_time(when):
        raise ValueError(f"time {when!r} is not a usable time (seconds since 1970, before year 10000)")
    run_id, message, data = raw.get("run_id", ""), raw.get("message", ""), raw.get("data", {})
    if type(run_id) is not str:
        raise TypeError(f"run_id {run_id!r} is not a str")
    if type(message) is not str:
        raise TypeError(f"message {message!r} is not a str")
    if type(data) is not dict:
        raise TypeError(f"data {data!r} is not a dict")
    return StatusEvent(event, token, float(when), run_id, message, data)


def parse_status(data: bytes | None, path: str = ".status") -> tuple[StatusEvent, ...]:
    """Events of a `.status` file. A final line without newline is a write in progress: skipped."""
    if not data:
        return ()
    try:
        # Decoded once for the whole file, then parsed as json.loads parses a str: half the cost
        # of json.loads(bytes) per line, and a cached plan parses one `.status` per step.
        text = data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return _parse_lines(data.split(b"\n"), path)  # as bytes, so the error names the bad line
    complete = text[: text.rfind("\n") + 1]
    events = _parse_whole(complete)
    return events if events is not None else _parse_lines(text.split("\n"), path)


def _parse_whole(complete: str) -> tuple[StatusEvent, ...] | None:
    """The complete lines parsed as one JSON array (one decoder call per file, not per line), or
    None if that does not give as many valid events as there are lines; then `_parse_lines`
    parses the file line by line and names the line at fault."""
    if not complete:
        return ()
    lines = complete.count("\n")
    try:
        raw = _DECODER.decode("[" + complete[:-1].replace("\n", ",") + "]")
        if len(raw) != lines:  # a line that was not one JSON value (or was blank)
            return None
        return tuple(map(_event, raw))
    except (ValueError, KeyError, TypeError):
        return None


def _parse_lines(lines: list[str] | list[bytes], path: str) -> tuple[StatusEvent, ...]:
    events = []
    for number, line in enumerate(lines[:-1], 1):  # the last element is empty or an unfinished line
        if not line.strip():
            continue
        try:
            events.append(_event(_DECODER.decode(line) if isinstance(line, str) else json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise StorageError(
                f"{path} line {number} is corrupt ({e}); see it with `drydock status` and "
                "rerun the step with `--force` to start it over"
            ) from e
    return tuple(events)


@dataclass(frozen=True, slots=True)
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

    def lease_stale(
        self,
        now: float,
        local_host: str,
        alive: Callable[[int, str | None], bool] | None = None,
        *,
        skew: float = 0.0,
    ) -> bool:
        """`is_stale` for this step's lease: a dead holder's pid counts only when its attempt's
        workers cannot outlive it (`may_outlive_runner`)."""
        trust_pid = not may_outlive_runner(self.events, self.lease)
        return is_stale(self.lease, now, local_host, alive, skew=skew, trust_pid=trust_pid)

    @property
    def succeeded(self) -> bool:
        return self.state == Event.SUCCESS

    @property
    def latest_run(self) -> StatusEvent | None:
        """The RUNNING event that started the latest attempt."""
        for event in reversed(self.events):
            if event.event == Event.RUNNING:
                return event
        return None

    @property
    def attempts(self) -> int:
        """RUNNING events recorded: attempts started, over all runs."""
        return sum(1 for e in self.events if e.event == Event.RUNNING)


ANNOUNCES_START = "announces_start"
"""The `RUNNING` event's data key saying the attempt's function writes `.logs/attempt-<token>.started`
when it starts: the backend may hold it queued for resources after its lease is taken (Ray), so
until the marker exists the attempt is queued, not running (`drydock status`)."""

REMOTE_WORKERS = "remote_workers"
"""The `RUNNING` event's data key saying the attempt's step runs in workers that may be on
another host than its runner (a Ray cluster), so they may outlive the runner's process."""


def may_outlive_runner(events: tuple[StatusEvent, ...], lease: LeaseRecord | None) -> bool:
    """Whether the attempt holding `lease` runs its step where it may outlive its runner: its
    `RUNNING` event says `remote_workers`. Then a dead runner's process does not make its lease
    stale (`is_stale(trust_pid=False)`): the lease must expire, which also fences the workers."""
    if lease is None:
        return False
    for event in reversed(events):
        if event.event == Event.RUNNING and event.token == lease.token:
            return event.data.get(REMOTE_WORKERS) is True
    return False
