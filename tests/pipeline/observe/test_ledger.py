"""The ledger's split of a step's held time, from `.status`, the `.started` markers and the step's
own accounts: it sums to the held time, the steps a retry computes again are counted exactly,
and what no account covers is lost unless the attempt succeeded."""

from __future__ import annotations

import pytest

from pipeline.core.ledger import Devices, devices_of, step_ledger
from pipeline.core.records import StatusEvent


def ev(event: str, token: int, time: float) -> StatusEvent:
    return StatusEvent(event, token, time)


def account(time: float, data: dict | None = None, **seconds: float) -> dict:
    return {"time": time, "seconds": seconds, "data": data or {}}


def sums(ledger) -> None:
    for attempt in ledger.attempts:
        assert sum(attempt.seconds.values()) == pytest.approx(attempt.held, rel=1e-9), attempt


def test_a_notice_then_a_resume_split_the_time_and_redo_nothing():
    events = [
        ev("RUNNING", 1, 100.0),
        ev("PREEMPTED", 1, 171.0),
        ev("RUNNING", 2, 180.0),
        ev("SUCCESS", 2, 260.0),
    ]
    started = {1: 104.0, 2: 181.0}
    accounts = {
        # Attempt 1: called at 104 (its clock says 104.5: half a second of imports before it), last
        # account at 170.5 after step 41; attempt 2 resumed from 41 and the metrics it cut end at 41.
        1: account(
            170.5,
            {"first_step": 0, "last_step": 41, "steps_done": 41},
            startup=20.0,
            compilation=10.0,
            steps=34.0,
            checkpoints=2.0,
        ),
        2: account(
            259.0,
            {
                "first_step": 42,
                "last_step": 79,
                "steps_done": 37,
                "resumed_from": 41,
                "previous_last_step": 41,
            },
            startup=5.0,
            restore=3.0,
            compilation=1.0,
            steps=68.0,
            finishing=1.0,
        ),
    }
    ledger = step_ledger(events, started, accounts, {"gpus": 8, "hosts": 2, "accelerator": "H100"}, now=300.0)
    sums(ledger)
    first, second = ledger.attempts
    assert (first.ending, second.ending) == ("PREEMPTED", "SUCCESS")
    assert first.seconds["waiting"] == 4.0 and second.seconds["waiting"] == 1.0
    assert first.seconds["startup"] == pytest.approx(20.5)  # its clock started half a second late
    assert first.seconds["lost"] == pytest.approx(0.5)  # after its last account, before PREEMPTED
    assert second.seconds["finishing"] == pytest.approx(2.0)  # its own 1 s and the commit's 1 s
    assert ledger.redone_steps == 0 and first.seconds["steps"] == 34.0
    assert ledger.devices == Devices("H100", 16.0)
    assert ledger.held == 151.0 and ledger.device_hours == pytest.approx(16 * 151 / 3600)
    assert ledger.goodput == pytest.approx((34.0 + 68.0) / 151.0)


def test_a_killed_runners_attempt_loses_the_steps_after_its_checkpoint_exactly():
    # The runner was SIGKILLed: attempt 1 has no ending; its last account (step 25) lags the step it
    # reached (27), which the next attempt read from the metrics it cut back to checkpoint 20.
    events = [ev("RUNNING", 1, 0.0), ev("RUNNING", 2, 50.0), ev("SUCCESS", 2, 120.0)]
    accounts = {
        1: account(40.0, {"first_step": 0, "last_step": 25, "steps_done": 25}, startup=15.0, steps=25.0),
        2: account(
            119.0,
            {
                "first_step": 21,
                "last_step": 59,
                "steps_done": 38,
                "resumed_from": 20,
                "previous_last_step": 27,
            },
            startup=10.0,
            steps=58.0,
        ),
    }
    ledger = step_ledger(events, {}, accounts, None, now=200.0)
    sums(ledger)
    first = ledger.attempts[0]
    assert first.ending == "UNFINISHED" and first.held == 40.0  # ended with its last account
    assert first.redone_steps == 7  # steps 21..27, exactly
    assert first.seconds["lost"] == pytest.approx(7.0)  # 7 of its 25 one-second steps
    assert first.seconds["steps"] == pytest.approx(18.0)
    assert ledger.devices == Devices("CPU", 1.0)


def test_steps_without_an_account_are_work_or_lost_and_a_running_one_counts_to_now():
    events = [ev("RUNNING", 1, 0.0), ev("FAILED", 1, 10.0), ev("RUNNING", 2, 20.0)]
    ledger = step_ledger(events, {2: 25.0}, {}, {"tpu": "v5p-64", "slices": 2}, now=40.0)
    sums(ledger)
    failed, running = ledger.attempts
    assert failed.seconds == {"waiting": 0.0, "lost": 10.0}
    assert running.ending == "RUNNING" and running.seconds == {"waiting": 5.0, "work": 15.0}
    assert ledger.devices == Devices("v5p", 64.0)  # 32 chips a slice, two slices
    assert ledger.goodput == pytest.approx(15.0 / 30.0)


def test_a_rewind_in_an_attempt_is_its_own_lost_work():
    events = [ev("RUNNING", 1, 0.0), ev("SUCCESS", 1, 100.0)]
    accounts = {
        1: account(
            99.0,
            {"first_step": 0, "last_step": 89, "steps_done": 89, "redone_steps": 9},
            startup=10.0,
            steps=80.0,
            lost=9.0,
        )
    }
    ledger = step_ledger(events, {1: 0.0}, accounts, {"cpus": 2}, now=100.0)
    sums(ledger)
    assert ledger.redone_steps == 9 and ledger.seconds["lost"] == 9.0
    assert devices_of({"cpus": 2, "hosts": 3}) == Devices("CPU", 6.0)


def test_cost_is_device_hours_at_the_price_table_the_user_may_override(tmp_path, monkeypatch):
    from pipeline.core.prices import DEFAULT_PRICES, price_table
    from pipeline.errors import StepDeclarationError

    events = [ev("RUNNING", 1, 0.0), ev("SUCCESS", 1, 1800.0)]
    ledger = step_ledger(events, {}, {}, {"gpus": 8, "accelerator": "H100"}, now=1800.0)
    assert ledger.device_hours == 4.0
    assert ledger.cost(price_table()) == pytest.approx(4.0 * DEFAULT_PRICES["H100"])
    mine = tmp_path / "prices.json"
    mine.write_text('{"H100": 2.5, "GB200": 9}')
    monkeypatch.setenv("DRYDOCK_PRICES", str(mine))
    table = price_table()
    assert table["H100"] == 2.5 and table["GB200"] == 9.0 and table["v5p"] == DEFAULT_PRICES["v5p"]
    assert ledger.to_json(table)["cost_usd"] == 10.0
    unpriced = step_ledger(events, {}, {}, {"gpus": 1, "accelerator": "B200"}, now=1800.0)
    assert unpriced.cost(table) is None and unpriced.to_json(table)["cost_usd"] is None
    mine.write_text('{"H100": -1}')
    with pytest.raises(StepDeclarationError, match="the price of 'H100' must be a number of dollars >= 0"):
        price_table()


def test_the_ledger_table_lines_up_each_step_and_the_runs_total():
    from rich.console import Console

    from pipeline.observe.status import StepEntry, StepStatus, ledger_table

    events = [ev("RUNNING", 1, 0.0), ev("SUCCESS", 1, 3600.0)]
    ledgers = {
        "a-1": step_ledger(events, {}, {}, {"gpus": 2, "accelerator": "H100"}, now=3600.0),
        "b-2": step_ledger(events, {}, {}, {"gpus": 1, "accelerator": "H100"}, now=3600.0),
    }
    rows = [StepStatus(StepEntry(label, label, f"/p/{label}"), "SUCCESS") for label in ledgers]
    console = Console(width=200, record=True)
    console.print(ledger_table(rows, ledgers, {"H100": 2.0}))
    lines = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in console.export_text().splitlines()
        if line.startswith("│")
    }
    header = ["devices", "held", "work", "device-h", "cost $", "goodput", "redone"]  # no waiting: none
    assert dict(zip(header, lines["a-1"], strict=True))["cost $"] == "4"
    total = dict(zip(header, lines["all"], strict=True))
    assert (total["device-h"], total["cost $"], total["goodput"]) == ("3", "6", "100%"), total
