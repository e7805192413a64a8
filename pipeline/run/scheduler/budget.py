"""A run's budget: the device-hours (or dollars) an experiment's steps may hold, every attempt of
every step together, earlier runs included (the ledger's held time, `pipeline.core.ledger`).

Before anything runs, `check_plan` refuses a run whose steps have spent the budget already, or
whose steps to run are estimated to spend more than is left (each step function's `estimate`
hook, seconds, times the devices its `Resources` hold; steps without an estimate count nothing,
and the refusal names what it counted). While the run goes, `BudgetWatch` adds the time its
steps hold; once the budget is spent the runner starts nothing more and asks the steps in flight
to stop cleanly (`.logs/attempt-<token>.stop`, heard by a step that keeps a pace: a training
saves a checkpoint and ends `StepStopped`, recorded CANCELLED). A step that cannot stop (no
handler) finishes. Raise the budget and run again: the training resumes from its checkpoint.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.core.dag import resolved_config
from pipeline.core.ledger import devices_of
from pipeline.core.plan import Plan, State
from pipeline.errors import StepDeclarationError
from pipeline.step import hooks_of
from pipeline.storage.layout import LOGS_DIR, stop_request_name
from pipeline.storage.step_store import StepStore

__all__ = [
    "Budget",
    "BudgetWatch",
    "check_plan",
    "estimate_text",
    "estimated",
    "step_estimate",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Budget:
    """At most `device_hours` device-hours and at most `dollars` (at the price table) in all."""

    device_hours: float | None = None
    dollars: float | None = None

    @property
    def is_set(self) -> bool:
        return self.device_hours is not None or self.dollars is not None

    def over(self, hours: float, dollars: float | None) -> str | None:
        """What `hours` (and `dollars`, None if some device has no price) exceed, in words."""
        if self.device_hours is not None and hours >= self.device_hours:
            return f"{hours:.4g} device-hours, the budget being {self.device_hours:g}"
        if self.dollars is not None and dollars is not None and dollars >= self.dollars:
            return f"${dollars:,.2f}, the budget being ${self.dollars:,.2f}"
        return None

    def field(self) -> str:
        return "--budget_device_hours" if self.device_hours is not None else "--budget_dollars"


def _spent_by(plan: Plan, store: StepStore, labels: Any, now: float, prices: Mapping[str, float]) -> dict:
    out = {}
    for label in labels:
        node = plan.dag.nodes[label]
        ledger = store.ledger(node.output_path, store.record(node.output_path, with_metadata=True), now)
        if ledger is not None:
            out[label] = (ledger.device_hours, ledger.cost(prices))
    return out


def _total(by_step: Mapping[str, tuple[float, float | None]]) -> tuple[float, float | None]:
    hours = sum(h for h, _ in by_step.values())
    costs = [c for _, c in by_step.values()]
    return hours, None if any(c is None for c in costs) else sum(c for c in costs if c is not None)


def step_estimate(plan: Plan, label: str, prices: Mapping[str, float]) -> tuple[float, float | None] | None:
    """Device-hours and dollars (None without a price) step `label` is estimated to hold: its
    function's `estimate` (seconds) times the devices its `Resources` hold; None without one."""
    node = plan.dag.nodes[label]
    estimate = hooks_of(node.step.fn).estimate
    if estimate is None:
        return None
    try:
        seconds = estimate(resolved_config(plan.dag, label))
    except Exception as e:  # an estimate only informs: the step counts as one without
        logger.debug("estimate of %s: %s", node.name, e)
        return None
    if seconds is None:
        return None
    devices = devices_of(node.step.resources.to_json())
    hours = devices.count * float(seconds) / 3600.0
    price = prices.get(devices.kind)
    return hours, None if price is None else price * hours


def estimate_text(plan: Plan, label: str, prices: Mapping[str, float]) -> str | None:
    """What `drydock plan` shows of a step's estimate: `1,812 device-hours on 64 H100 (~$12,467 at
    list price)`."""
    found = step_estimate(plan, label, prices)
    if found is None:
        return None
    hours, dollars = found
    devices = devices_of(plan.dag.nodes[label].step.resources.to_json())
    cost = f" (~${dollars:,.0f} at the price table)" if dollars is not None else ""
    return f"{hours:,.4g} device-hours on {devices.count:g} {devices.kind}{cost}"


def estimated(plan: Plan, prices: Mapping[str, float]) -> tuple[float, float | None, list[str]]:
    """Device-hours and dollars the steps this plan will run are estimated to hold, and the
    names of those without an estimate (they count nothing)."""
    hours, dollars, unknown = 0.0, 0.0, []
    priced = True
    for label in plan.in_state(State.RUN):
        found = step_estimate(plan, label, prices)
        if found is None:
            unknown.append(plan.dag.nodes[label].name)
            continue
        hours += found[0]
        priced = priced and found[1] is not None
        dollars += found[1] or 0.0
    return hours, (dollars if priced else None), unknown


def check_plan(
    budget: Budget, plan: Plan, store: StepStore, now: float, prices: Mapping[str, float]
) -> dict[str, tuple[float, float | None]]:
    """Refuse (one `StepDeclarationError` naming the option) a run whose budget is spent already,
    or whose estimate exceeds what is left. Returns what each step of the plan has spent so far
    (device-hours, dollars), every attempt in every run: what `BudgetWatch` starts from."""
    if not budget.is_set:
        return {}
    before = _spent_by(plan, store, plan.dag.nodes, now, prices)
    used_hours, used_dollars = _total(before)
    spent_already = budget.over(used_hours, used_dollars)
    if spent_already:
        raise StepDeclarationError(
            None,
            f"the budget is spent: the experiment's steps have held {spent_already}; raise it",
            field=budget.field(),
        )
    hours, dollars, unknown = estimated(plan, prices)
    total_dollars = None if dollars is None or used_dollars is None else used_dollars + dollars
    over = budget.over(used_hours + hours, total_dollars)
    if over:
        unestimated = f" ({len(unknown)} step(s) without an estimate counted as nothing)" if unknown else ""
        raise StepDeclarationError(
            None,
            f"the steps to run are estimated at {hours:.4g} device-hours, {used_hours:.4g} are held "
            f"already: {over}{unestimated}",
            field=budget.field(),
        )
    return before


class BudgetWatch:
    """The budget while the run goes: what earlier runs spent, plus what the steps this run
    touches hold now (re-read from their ledgers at each check)."""

    def __init__(
        self,
        budget: Budget,
        plan: Plan,
        store: StepStore,
        before: Mapping[str, tuple[float, float | None]],
        prices: Mapping[str, float],
    ):
        self.budget, self.plan, self.store, self.prices = budget, plan, store, prices
        self.before = dict(before)
        """What each step had spent when the run was planned (`check_plan`)."""
        self.spent: str | None = None
        """Why the run stopped, once its budget is spent."""

    def check(self, touched: Any, now: float) -> str | None:
        """The budget's verdict with the steps `touched` by this run re-read: None while some is
        left, else (the first time) what was spent."""
        if not self.budget.is_set or self.spent is not None:
            return None
        current = dict(self.before)
        current.update(_spent_by(self.plan, self.store, touched, now, self.prices))
        hours, dollars = _total(current)
        over = self.budget.over(hours, dollars)
        if over:
            self.spent = f"the run's budget is spent: its steps have held {over}"
        return self.spent

    def ask_to_stop(self, labels: Any) -> list[str]:
        """Ask the running attempts of `labels` to stop cleanly; returns those asked."""
        asked = []
        for label in labels:
            path = self.plan.dag.nodes[label].output_path
            run = self.store.record(path, with_metadata=False).latest_run
            if run is None:
                continue
            request = json.dumps({"message": f"stopped by budget ({self.spent})"}).encode()
            try:
                self.store.storage.write(
                    f"{path.rstrip('/')}/{LOGS_DIR}/{stop_request_name(run.token)}", request
                )
                asked.append(label)
            except Exception as e:  # it then runs to its end
                logger.warning("could not ask %s to stop: %s", label, e)
        return asked
