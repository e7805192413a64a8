"""The commit protocol of step directories, on one `Storage`.

Per step directory (names in `pipeline.storage.layout`):

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

Status appends drop an unterminated last line (the trace of a write that failed half-way)
instead of building on it. The records read here are values of `pipeline.core.records`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.core.lease import LeaseRecord, Owner, is_stale
from pipeline.core.ledger import StepLedger, step_ledger
from pipeline.core.records import (
    ANNOUNCES_START,
    NOTES,
    REMOTE_WORKERS,
    Event,
    StatusEvent,
    StepRecord,
    complete_lines,
    last_state,
    may_outlive_runner,
    parse_status,
)
from pipeline.core.usable_numbers import finite_number, usable_time
from pipeline.errors import StorageAccessDenied, StorageError
from pipeline.processes import pid_alive
from pipeline.storage.files import Storage
from pipeline.storage.layout import (
    ADOPTING,
    CORRUPT_PREFIX,
    LEASE,
    PROGRESS,
    STATUS,
    STEP_JSON,
    is_payload,
    ledger_path,
    started_path,
)
from pipeline.storage.opening import map_reads

__all__ = ["Acquired", "AlreadyDone", "Held", "StepStore", "content_digest"]

T = TypeVar("T")


def content_digest(data: bytes) -> str:
    """A short hash of a file's bytes."""
    return hashlib.sha256(data).hexdigest()[:16]


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
        except StorageAccessDenied:
            raise  # not corrupt: the file may be fine, we may not read it
        except StorageError as e:
            return StepRecord(lease=self.lease(step_dir), corrupt=str(e))
        step_json = None
        lease = None
        if (last := last_state(events)) is not None and last.event == Event.SUCCESS:
            if with_metadata:
                step_json = self.read_step_json(step_dir)
        else:
            data = self.storage.read_consistent(f"{step_dir}/{LEASE}")
            problem = LeaseRecord.problem(data)
            if problem is not None:
                corrupt = (
                    f"{step_dir}/{LEASE} is corrupt ({problem}); rerun the step with `--force` to "
                    "start it over"
                )
                return StepRecord(events, corrupt=corrupt)
            lease = LeaseRecord.parse(data)
        return StepRecord(events, step_json, lease)

    def ledger(self, step_dir: str, record: StepRecord, now: float) -> StepLedger | None:
        """The step's ledger (`pipeline.core.ledger`) from `record` (read with metadata, for its
        resources), each attempt's `.started` marker and its account; None before any attempt."""
        if record.corrupt or not record.events:
            return None
        started: dict[int, float] = {}
        accounts: dict[int, Any] = {}
        for token in sorted({e.token for e in record.events if e.event == Event.RUNNING}):
            reads = (
                (started_path(step_dir, token), started, "time"),
                (ledger_path(step_dir, token), accounts, None),
            )
            for path, into, key in reads:
                data = self.storage.read(path)
                if data is None:
                    continue
                try:
                    value = json.loads(data)
                except ValueError:
                    continue  # a malformed marker or account says nothing
                if key is None:
                    into[token] = value
                elif isinstance(value, dict) and finite_number(value.get(key)):
                    into[token] = float(value[key])
        resources = (record.step_json or {}).get("resources")
        return step_ledger(record.events, started, accounts, resources, now)

    def records(
        self, step_dirs: Iterable[str], *, with_metadata: bool = True, threads: int = 16
    ) -> dict[str, StepRecord]:
        """Records of many step directories: the snapshot a plan is made from."""
        dirs = list(dict.fromkeys(step_dirs))

        def one(d: str) -> StepRecord:
            return self.record(d, with_metadata=with_metadata)

        return self._each(dirs, one, threads)

    def _each(self, dirs: list[str], fn: Callable[[str], T], threads: int) -> dict[str, T]:
        return dict(zip(dirs, map_reads(self.storage, fn, dirs, threads=threads), strict=True))

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
        """The `.lease` record, read consistently with its renewals (`Storage.read_consistent`):
        reading a lease half-rewritten made a lone run's commit think it had lost the lease."""
        return LeaseRecord.parse(self.storage.read_consistent(f"{step_dir}/{LEASE}"))

    def progress(self, step_dir: str, events: tuple[StatusEvent, ...]) -> Mapping[str, Any] | None:
        """The `.progress` report (`pipeline.run.in_step.step_events.progress`) of the latest attempt in
        `events`; None without one, or when it is unreadable or an earlier attempt's."""
        runs = [e for e in events if e.event == Event.RUNNING]
        if not runs:
            return None
        report = self.read_progress(step_dir)
        # An earlier attempt's progress says nothing about this one.
        if report is None or report.get("token") != runs[-1].token:
            return None
        return report

    def read_progress(self, step_dir: str) -> dict[str, Any] | None:
        """The step's `.progress` report as it is, whichever attempt wrote it; None without one
        or when it is unreadable."""
        raw = self.storage.read(f"{step_dir}/{PROGRESS}")
        if not raw:
            return None
        try:
            report = json.loads(raw)
        except ValueError:
            return None
        return report if isinstance(report, dict) and _usable_progress(report) else None

    def clear_payload(self, step_dir: str) -> list[str]:
        """Delete the step's own output (not Drydock's files): a forced rerun starts from nothing.
        Call only while holding the step's lease. Returns the names deleted."""
        names = [name for name in self.storage.listdir(step_dir) if is_payload(name)]
        for name in names:
            self.storage.delete(f"{step_dir}/{name}", recursive=True)
        return names

    def begin_adoption(self, step_dir: str) -> None:
        """Mark the step directory as receiving an adoption's files (`ADOPTING`), before the first
        is moved in. Call only while holding the step's lease."""
        self.storage.write(f"{step_dir}/{ADOPTING}", b"drydock adopt: files being moved in\n")

    def end_adoption(self, step_dir: str) -> None:
        """Remove the mark `begin_adoption` wrote (after the commit, or after clearing)."""
        self.storage.delete(f"{step_dir}/{ADOPTING}")

    def clear_interrupted_adoption(self, step_dir: str) -> list[str]:
        """If an adoption was stopped after moving files in and before committing, delete its
        files (the step's payload) and its mark: an attempt must not commit files its function
        never wrote. Call only while holding the step's lease. Returns the names deleted."""
        if self.storage.read(f"{step_dir}/{ADOPTING}") is None:
            return []
        removed = self.clear_payload(step_dir)
        self.end_adoption(step_dir)
        return removed

    def has_payload(self, step_dir: str) -> bool:
        """Whether the step wrote anything besides Drydock's own metadata."""
        return any(is_payload(name) for name in self.storage.listdir(step_dir))

    # -- writing ------------------------------------------------------------------------------

    def write_step_json(self, step_dir: str, info: Mapping[str, Any]) -> str:
        """Write `.step.json`; returns its `content_digest`, for the SUCCESS event."""
        data = json.dumps(info, indent=2, sort_keys=True).encode()
        self.storage.write(f"{step_dir}/{STEP_JSON}", data)
        return content_digest(data)

    def step_json_digest(self, step_dir: str) -> str | None:
        """The `content_digest` of `.step.json` as it is now (None if there is none): equal to the
        one recorded at commit unless someone changed the file since."""
        data = self.storage.read(f"{step_dir}/{STEP_JSON}")
        return None if data is None else content_digest(data)

    def acquire(
        self,
        step_dir: str,
        owner: Owner,
        ttl: float,
        *,
        rerun_after: int | None = None,
        attempt: int = 1,
        skew: float = 0.0,
        stale: LeaseRecord | None = None,
        remote_workers: bool = False,
        announces_start: bool = False,
    ) -> Acquired | Held | AlreadyDone:
        """Take the step's lease and record RUNNING, or say who holds it / that it is done.

        `rerun_after`: with `--force`, the number of status events seen at plan time; RUNNING may
        then follow a SUCCESS only if no event was added since (one forced rerun, not one per runner).
        A lease held by another runner is taken over if `is_stale` with `skew` says so, or if it
        is still exactly `stale`, a record the caller has watched stay unchanged (`LeaseWatch`).
        `remote_workers`: the caller's backend may run the step on another host, where it can
        outlive the caller (recorded in `RUNNING`; see `may_outlive_runner`).
        `announces_start`: the attempt's function will write its `.started` marker (a backend that may
        queue it after this lease: Ray), recorded in `RUNNING` for `drydock status`.
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
            trust_pid = not may_outlive_runner(events, current)
            if not is_stale(current, now, owner.host, pid_alive, skew=skew, trust_pid=trust_pid) and (
                stale is None or current != stale
            ):
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
            self.storage.write(f"{step_dir}/{CORRUPT_PREFIX}{token}", corrupt)
            self.storage.write(status_path, b"")
            rerun_after = 0

        def start(old: bytes | None) -> bytes | None:
            current = parse_status(old, status_path)
            if self._done(current, rerun_after) or any(e.token >= token for e in current):
                return None
            data: dict[str, Any] = {"attempt": attempt}
            if remote_workers:
                data[REMOTE_WORKERS] = True
            if announces_start:
                data[ANNOUNCES_START] = True
            event = StatusEvent(Event.RUNNING, token, self.clock(), owner.run_id, data=data)
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
        if last is None or last.event != Event.SUCCESS:
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
            if newest != token or (last is not None and last.event == Event.SUCCESS):
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
        ok = self.append(step_dir, owner, token, Event.SUCCESS, data=data, require_lease=True)
        self.release(step_dir, owner, token)
        return ok


def _usable_progress(report: Mapping[str, Any]) -> bool:
    """Whether a `.progress` report's numbers can be shown: `done` and `total` finite (total may
    be absent), `time` a usable time. One that is not is ignored like one that cannot be read."""
    total = report.get("total")
    return (
        finite_number(report.get("done"))
        and (total is None or finite_number(total))
        and usable_time(report.get("time"))
    )
