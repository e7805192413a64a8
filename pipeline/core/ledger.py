"""Where a step's time went, attempt by attempt, and what it cost: the ledger.

Built from what the engine already keeps in the step directory, no I/O here:

  * `.status`: each attempt's RUNNING (its lease taken, the task handed to the backend) and its
    ending (SUCCESS, FAILED, PREEMPTED, CANCELLED; still running: now);
  * `.logs/attempt-<token>.started`: when the step function was called (on Ray, after the task
    waited for resources);
  * `.logs/attempt-<token>.ledger.json`: the step's own account of its time since then
    (`step_events.account`; a training's activities, `steps.training.ledger`).

Each attempt's held time, RUNNING to its end, is split into `waiting` (for resources, until the
function was called), the step's own activities as it last accounted for them, and `lost`: what
a retry must do again. That is the time after the last account when the attempt did not succeed
(a kill, a hang until the watchdog fired, a crash), and the steps the next attempt computed again
(it resumed from a checkpoint before the attempt's last step: their share of the attempt's step
time, counted exactly as steps). A step that keeps no account has one activity, `work`. The
split sums to the held time by construction; `devices` x held is the attempt's device time.

Goodput is productive time over held time: a training's `steps`, another step's `work`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.records import Event, StatusEvent

__all__ = ["AttemptLedger", "Devices", "StepLedger", "devices_of", "step_ledger"]

PRODUCTIVE = frozenset({"steps", "work"})
"""The activities that count as goodput."""

_ENDINGS = frozenset({Event.SUCCESS, Event.FAILED, Event.PREEMPTED, Event.CANCELLED})
UNFINISHED = "UNFINISHED"
"""The ending of an attempt whose runner stopped without recording one (killed)."""


@dataclass(frozen=True)
class Devices:
    """What a step holds while it runs: `count` devices of `kind` (all hosts together)."""

    kind: str
    """An accelerator ("H100", "v5p"), "GPU" when the type is not given, or "CPU" for a step
    that holds no accelerator (its CPU cores are then its devices)."""
    count: float


def devices_of(resources: Mapping[str, Any] | None) -> Devices:
    """The devices a step with `resources` (`Resources.to_json()`) holds."""
    if not resources:
        return Devices("CPU", 1.0)
    hosts = float(resources.get("hosts") or 1)
    tpu = resources.get("tpu")
    if tpu:
        from pipeline.core.tpu import tpu_slice

        spec = tpu_slice(str(tpu))
        return Devices(spec.generation, float(spec.chips * int(resources.get("slices") or 1)))
    gpus = float(resources.get("gpus") or 0)
    if gpus:
        return Devices(str(resources.get("accelerator") or "GPU"), gpus * hosts)
    return Devices("CPU", float(resources.get("cpus") or 1) * hosts)


@dataclass(frozen=True)
class AttemptLedger:
    """One attempt's held time and its split (see the module docstring)."""

    token: int
    ending: str
    """SUCCESS, FAILED, PREEMPTED, CANCELLED, RUNNING for one still going, or UNFINISHED."""
    held: float
    seconds: Mapping[str, float]
    redone_steps: int = 0
    """Steps of this attempt that the next one computed again (and this one's rewinds)."""

    @property
    def productive(self) -> float:
        return sum(v for k, v in self.seconds.items() if k in PRODUCTIVE)


@dataclass(frozen=True)
class StepLedger:
    """A step's attempts, their totals, and its device time."""

    attempts: tuple[AttemptLedger, ...]
    devices: Devices
    seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def held(self) -> float:
        return sum(a.held for a in self.attempts)

    @property
    def productive(self) -> float:
        return sum(a.productive for a in self.attempts)

    @property
    def goodput(self) -> float | None:
        """Productive time over held time (None before anything was held)."""
        return self.productive / self.held if self.held > 0 else None

    @property
    def device_hours(self) -> float:
        return self.devices.count * self.held / 3600.0

    @property
    def redone_steps(self) -> int:
        return sum(a.redone_steps for a in self.attempts)

    def cost(self, prices: Mapping[str, float]) -> float | None:
        """Its device-hours at `prices` (dollars per device-hour by kind), None for a kind
        without a price (`pipeline.core.prices`)."""
        price = prices.get(self.devices.kind)
        return None if price is None else price * self.device_hours

    def to_json(self, prices: Mapping[str, float] | None = None) -> dict[str, Any]:
        cost = self.cost(prices) if prices is not None else None
        return {
            "devices": {"kind": self.devices.kind, "count": self.devices.count},
            "held_seconds": round(self.held, 3),
            "device_hours": round(self.device_hours, 6),
            "cost_usd": None if cost is None else round(cost, 6),
            "price_per_device_hour": None if prices is None else prices.get(self.devices.kind),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "redone_steps": self.redone_steps,
            "attempts": [
                {
                    "token": a.token,
                    "ending": a.ending,
                    "held_seconds": round(a.held, 3),
                    "seconds": {k: round(v, 3) for k, v in a.seconds.items()},
                    "redone_steps": a.redone_steps,
                }
                for a in self.attempts
            ],
        }


def step_ledger(
    events: Sequence[StatusEvent],
    started: Mapping[int, float],
    accounts: Mapping[int, Mapping[str, Any]],
    resources: Mapping[str, Any] | None,
    now: float,
) -> StepLedger:
    """The ledger of one step directory: its `.status` `events`, when each attempt's function
    started (`started`, by token) and each attempt's last account (`accounts`, by token: the
    parsed `ledger.json`)."""
    said = {t: float(a["time"]) for t, a in accounts.items() if _account_seconds(a) is not None}
    spans = _spans(events, now, said)
    rows: list[dict[str, Any]] = []
    for token, begun, ended, ending in spans:
        start = min(max(started.get(token, begun), begun), ended)
        seconds: dict[str, float] = {"waiting": start - begun}
        account = accounts.get(token)
        kept = _account_seconds(account)
        data = (account or {}).get("data") or {}
        if kept is not None:
            said_at = min(float(account["time"]), ended)  # type: ignore[index]
            for name, value in kept.items():
                seconds[name] = seconds.get(name, 0.0) + value
            # The function's call as its account puts it, against the runner's `.started`: the
            # difference (imports before the step's own clock started, clocks apart) is start-up.
            seconds["startup"] = seconds.get("startup", 0.0) + (said_at - sum(kept.values())) - start
            after = ended - said_at
            # After the last account: an attempt that succeeded was finishing (its commit); any
            # other lost it (killed, hung until the watchdog fired, crashed).
            bucket = "finishing" if ending in (Event.SUCCESS, "RUNNING") else "lost"
            seconds[bucket] = seconds.get(bucket, 0.0) + after
        else:
            bucket = "work" if ending in (Event.SUCCESS, "RUNNING") else "lost"
            seconds[bucket] = ended - start
        rows.append(
            {
                "token": token,
                "ending": ending,
                "held": ended - begun,
                "seconds": seconds,
                "redone": int(data.get("redone_steps") or 0),
                "first": data.get("first_step"),
                "last": data.get("last_step"),
                "steps_done": int(data.get("steps_done") or 0),
                "resumed_from": data.get("resumed_from"),
                "previous_last": data.get("previous_last_step"),
            }
        )
    _redone_by_the_next(rows)
    attempts = tuple(
        AttemptLedger(r["token"], r["ending"], r["held"], r["seconds"], r["redone"]) for r in rows
    )
    totals: dict[str, float] = {}
    for attempt in attempts:
        for name, value in attempt.seconds.items():
            totals[name] = totals.get(name, 0.0) + value
    return StepLedger(attempts, devices_of(resources), totals)


def _spans(
    events: Sequence[StatusEvent], now: float, said: Mapping[int, float]
) -> list[tuple[int, float, float, str]]:
    """(token, RUNNING time, end time, ending) of each attempt, in order. An attempt that has no
    ending when a later one starts was abandoned (its runner was killed): it ended with its last
    account (`said`, by token), or at the latest when the next one started (`UNFINISHED`)."""
    spans: list[tuple[int, float, float, str]] = []
    open_: dict[int, float] = {}
    for event in events:
        if event.event == Event.RUNNING:
            for token, begun in open_.items():
                end = min(said.get(token, event.time), event.time)
                spans.append((token, begun, max(end, begun), UNFINISHED))
            open_ = {event.token: event.time}
        elif event.event in _ENDINGS and event.token in open_:
            begun = open_.pop(event.token)
            spans.append((event.token, begun, max(event.time, begun), event.event))
    for token, begun in open_.items():
        spans.append((token, begun, max(now, begun), "RUNNING"))
    spans.sort(key=lambda s: s[1])
    return spans


def _account_seconds(account: Mapping[str, Any] | None) -> dict[str, float] | None:
    """An account's seconds by activity, or None for a missing or malformed one."""
    if not isinstance(account, Mapping) or not isinstance(account.get("time"), int | float):
        return None
    seconds = account.get("seconds")
    if not isinstance(seconds, Mapping):
        return None
    out = {str(k): float(v) for k, v in seconds.items() if isinstance(v, int | float)}
    return out or None


def _redone_by_the_next(rows: list[dict[str, Any]]) -> None:
    """Steps an attempt did that the next one did again (it resumed from a checkpoint before
    them): counted on the attempt that lost them, their share of its step time moved to lost."""
    for this, following in itertools.pairwise(rows):
        # Exactly, from the next attempt's own reading of the metrics it cut back to its
        # checkpoint; else from this attempt's last account (which may lag its last step).
        resumed, previous = following["resumed_from"], following["previous_last"]
        if isinstance(resumed, int) and isinstance(previous, int):
            redone = previous - resumed
        elif isinstance(this["last"], int) and isinstance(following["first"], int):
            redone = this["last"] - following["first"] + 1
        else:
            continue
        if redone <= 0:
            continue
        seconds = this["seconds"]
        steps = seconds.get("steps", 0.0)
        mean = steps / this["steps_done"] if this["steps_done"] else 0.0
        moved = min(steps, mean * redone)
        seconds["steps"] = steps - moved
        seconds["lost"] = seconds.get("lost", 0.0) + moved
        this["redone"] += redone
