"""Lease records and the pure rules that decide whether a lease is still held.

A lease says which runner owns a step right now. It carries a fencing token that grows by one
with every acquisition; status events carry the token of the runner that wrote them, so a
runner that lost its lease can be told apart from the current one. Time and process liveness
are passed in (a clock and an `alive(pid, start)` function: `pipeline.processes.pid_alive` asks
this machine), so these rules are pure and tested without sleeping or processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.usable_numbers import usable_time

__all__ = [
    "CLOCK_SKEW",
    "LeaseRecord",
    "LeaseWatch",
    "Owner",
    "is_stale",
]


@dataclass(frozen=True)
class Owner:
    """The runner that takes leases: one per executor process and run."""

    run_id: str
    host: str
    pid: int
    pid_start: str | None

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host.split('/')[0]})"


@dataclass(frozen=True)
class LeaseRecord:
    """The content of a step's `.lease` file."""

    token: int
    run_id: str
    host: str
    pid: int
    pid_start: str | None
    expires: float
    """Wall-clock time (seconds since the epoch) after which the lease is stale."""
    released: bool = False

    @staticmethod
    def parse(data: bytes | None) -> LeaseRecord | None:
        """The record in `data`, or None for an absent, empty, partially written or damaged file
        (`problem` says what is damaged)."""
        if not data:
            return None
        try:
            raw: Any = json.loads(data)
        except ValueError:
            return None
        if LeaseRecord.problem_of(raw) is not None:
            return None
        return LeaseRecord(**raw)

    @staticmethod
    def problem(data: bytes | None) -> str | None:
        """What is wrong with a `.lease` that is whole JSON but not a lease (a field of the wrong
        type, a missing or unknown one); None for a good, absent or partially written one."""
        if not data:
            return None
        try:
            raw = json.loads(data)
        except ValueError:
            return None  # cut short: a write in progress on a store without atomic replace
        return LeaseRecord.problem_of(raw)

    @staticmethod
    def problem_of(raw: Any) -> str | None:
        """`problem` for a decoded `.lease`."""
        if not isinstance(raw, dict):
            return "not a JSON object"
        kinds: dict[str, tuple[type, ...]] = {
            "token": (int,),
            "run_id": (str,),
            "host": (str,),
            "pid": (int,),
            "pid_start": (str, type(None)),
            "expires": (int, float),
            "released": (bool,),
        }
        unknown = sorted(set(raw) - set(kinds))
        if unknown:
            return f"unknown field(s) {', '.join(unknown)}"
        for name, types in kinds.items():
            if name not in raw:
                if name == "released":
                    continue
                return f"no {name}"
            value = raw[name]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                return f"{name} {value!r} is not {' or '.join(t.__name__ for t in types)}"
        if not usable_time(raw["expires"]):
            return f"expires {raw['expires']!r} is not a usable time (seconds since 1970, before year 10000)"
        for name, most in (("token", 2**63), ("pid", 2**31)):
            if not 0 <= raw[name] < most:
                return f"{name} {raw[name]!r} is out of range"
        return None

    def dump(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    def held_by(self, owner: Owner, token: int) -> bool:
        """Whether this record is `owner`'s live lease with fencing token `token`."""
        return not self.released and self.token == token and self.run_id == owner.run_id

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host.split('/')[0]})"


CLOCK_SKEW = 60.0
"""Seconds by which two runners' clocks may differ (the default of `--clock_skew`)."""


def is_stale(
    lease: LeaseRecord | None,
    now: float,
    local_host: str,
    alive: Callable[[int, str | None], bool] | None = None,
    *,
    skew: float = 0.0,
    trust_pid: bool = True,
) -> bool:
    """Whether a new runner may take this lease over.

    Stale when absent, released, expired more than `skew` seconds ago by the reader's clock
    `now`, or owned by a process on this very host that no longer exists: a run killed on this
    machine never makes the next run wait for its timeout. Not `trust_pid` when the holder's
    step may be running in a worker on another host (`records.may_outlive_runner`), which can
    outlive the holder's process: such a lease is stale only once it expires. `expires` was
    written with the holder's clock: a reader whose clock is ahead by up to `skew` never takes a live lease (a
    waiting runner also judges by watching the lease stop changing, which needs no clock: see
    `LeaseWatch`). `alive(pid, start)` says whether a process of this host lives
    (`pipeline.processes.pid_alive`); without it, only expiry makes a lease stale.
    """
    if lease is None or lease.released or now >= lease.expires + skew:
        return True
    if alive is None:
        return False
    return trust_pid and lease.host == local_host and not alive(lease.pid, lease.pid_start)


class LeaseWatch:
    """Decides that a lease is stale by watching it stop changing, on the watcher's own clock.

    A live holder rewrites its lease at every heartbeat, and a heartbeat comes more often than
    the lease timeout. So a lease that a runner has seen unchanged for `timeout` seconds of its
    own monotonic clock belongs to a holder that is dead or frozen, however the two machines'
    wall clocks differ. (Runners sharing a prefix are assumed to use the same lease settings.)
    """

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self._clock = clock
        self._seen: dict[str, tuple[LeaseRecord, float]] = {}

    def unchanged(self, key: str, lease: LeaseRecord | None, extra: float = 0.0) -> bool:
        """Record a look at `key`'s lease; whether it has stayed exactly `lease` for `timeout`
        (plus `extra` seconds)."""
        now = self._clock()
        if lease is None:
            self._seen.pop(key, None)
            return False
        seen = self._seen.get(key)
        if seen is None or seen[0] != lease:
            self._seen[key] = (lease, now)
            return False
        return now - seen[1] >= self.timeout + extra

    def forget(self, key: str) -> None:
        self._seen.pop(key, None)
