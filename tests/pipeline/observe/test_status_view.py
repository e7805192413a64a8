"""The status view on real step directories: states, attempts, progress, metrics tail, watch."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

from rich.console import Console

from pipeline.core.lease import Owner
from pipeline.core.records import Event
from pipeline.observe.status import (
    StepEntry,
    StepStatus,
    entries_from_manifest,
    progress_text,
    read_status,
    status_json,
    status_table,
    watch,
)
from pipeline.processes import current_owner
from pipeline.run.in_step import step_events
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore

TTL = 3600.0  # leases taken here stay live for the whole test


def _entries(prefix: str) -> list[StepEntry]:
    return [
        StepEntry("data/a-000000000001", "data/a", f"{prefix}/data/a-000000000001"),
        StepEntry(
            "train/b-000000000002", "train/b", f"{prefix}/train/b-000000000002", ("data/a-000000000001",)
        ),
        StepEntry(
            "eval/c-000000000003", "eval/c", f"{prefix}/eval/c-000000000003", ("train/b-000000000002",)
        ),
        StepEntry("eval/d-000000000004", "eval/d", f"{prefix}/eval/d-000000000004"),
    ]


def _render(table) -> str:
    console = Console(file=io.StringIO(), width=250, record=True)
    console.print(table)
    return console.export_text()


def _setup(tmp_path):
    prefix = str(tmp_path / "prefix")
    store = StepStore(LocalStorage())
    me = current_owner()
    a, b, c, d = _entries(prefix)
    # a: failed once, then succeeded on attempt 2.
    token = store.acquire(a.output_path, me, TTL).token
    store.append(a.output_path, me, token, Event.FAILED, "ValueError: boom")
    store.release(a.output_path, me, token)
    token = store.acquire(a.output_path, me, TTL, attempt=2).token
    store.commit(a.output_path, me, token)
    # b: running here, now, with progress and training metrics (its function has started).
    running = store.acquire(b.output_path, me, TTL).token
    started = Path(b.output_path) / ".logs" / f"attempt-{running}.started"
    started.parent.mkdir(parents=True, exist_ok=True)
    started.write_text(json.dumps({"time": time.time(), "where": "here"}))
    # c: RUNNING, but its runner (a pid that does not exist on this host) is gone.
    ghost = Owner("ghostrun0000", me.host, 2**22 + 12345, None)
    store.acquire(c.output_path, ghost, TTL)
    return store, me, running, [a, b, c, d]


def test_states_attempts_and_staleness(tmp_path):
    store, me, _token, entries = _setup(tmp_path)
    rows = {r.entry.name: r for r in read_status(entries, store, now=time.time(), local_host=me.host)}
    assert rows["data/a"].state == "SUCCESS" and rows["data/a"].attempt == 2
    assert (
        rows["train/b"].state == "RUNNING"
        and rows["train/b"].holder == f"pid {me.pid} on {me.host.split('/')[0]}"
    )
    assert rows["eval/c"].state == "STALE" and "gone" in rows["eval/c"].detail
    assert rows["eval/d"].state == "NOT STARTED" and rows["eval/d"].attempt is None
    assert rows["train/b"].duration(rows["train/b"].started + 90) == 90
    text = _render(status_table(list(rows.values()), now=rows["data/a"].ended + 30))
    assert "RUNNING" in text and "STALE" in text and "NOT STARTED" in text
    assert "SUCCESS 30s ago" in text


def test_progress_and_training_metrics_show_for_the_current_attempt(tmp_path):
    store, me, token, entries = _setup(tmp_path)
    b = entries[1]
    context = step_events.StepContext(b.output_path, me.run_id, token)
    assert step_events.progress(300, 1000, "steps", data={"loss": 3.5}, context=context, clock=lambda: 1e9)
    # Within PROGRESS_INTERVAL: folded into the next report, not written.
    assert not step_events.progress(310, 1000, "steps", context=context, clock=lambda: 1e9 + 0.5)
    # metrics.jsonl longer than the tail that is read: the last step and loss still come out.
    with open(os.path.join(b.output_path, "metrics.jsonl"), "w") as f:
        for step in range(300):  # 0-based step indices, as Levanter logs them: 300 steps done
            record = {"step": step, "train/loss": 10.0 / (step + 1), "wall_time": 1.0, "pad": "x" * 60}
            f.write(json.dumps(record) + "\n")
        f.write(json.dumps({"step": 299, "eval/loss": 1.0}) + "\n")
        f.write('{"step": 300, "train/lo')  # a line being written
    (row,) = [r for r in read_status(entries, store, now=time.time(), local_host=me.host) if r.entry == b]
    assert row.progress is not None and row.progress["done"] == 300 and row.progress["total"] == 1000
    assert row.train_step == 299 and row.loss == 10.0 / 300
    assert os.path.getsize(os.path.join(b.output_path, "metrics.jsonl")) > 16 * 1024  # beyond the tail
    assert progress_text(row).startswith("████░░░░░░░░ 30%") and "300/1,000 steps" in progress_text(row)
    # On object storage the same lines are in segments; a segment just opened holds no loss yet.
    segments = os.path.join(b.output_path, "metrics")
    os.makedirs(segments)
    os.rename(os.path.join(b.output_path, "metrics.jsonl"), os.path.join(segments, "part-000000.jsonl"))
    with open(os.path.join(segments, "part-000001.jsonl"), "w") as f:
        f.write('{"step": 300, "train/lo')
    (row,) = [r for r in read_status(entries, store, now=time.time(), local_host=me.host) if r.entry == b]
    assert row.train_step == 299 and row.loss == 10.0 / 300
    # A later attempt of the same step does not show the earlier attempt's progress.
    store.release(b.output_path, me, token)
    store.acquire(b.output_path, me, TTL, attempt=2)
    (row,) = [r for r in read_status(entries, store, now=time.time(), local_host=me.host) if r.entry == b]
    assert row.progress is None and row.attempt == 2


def test_a_running_training_shows_its_live_figures_in_the_table_and_the_json(tmp_path):
    store, me, token, entries = _setup(tmp_path)
    b = entries[1]
    context = step_events.StepContext(b.output_path, me.run_id, token)
    figures = {
        "loss": 3.5,
        "tokens_per_second": 24_468.0,
        "steps_per_second": 2.0,
        "eta_seconds": 350.0,
        "checkpoint_step": 250,
        "checkpoint_time": 1e9 - 120,
        "interventions": {"spike_steps": 2, "rewinds": 1, "nan_steps": 0},
    }
    step_events.progress(300, 1000, "steps", data=figures, context=context, clock=lambda: 1e9)
    (row,) = [r for r in read_status(entries, store, now=1e9 + 50, local_host=me.host) if r.entry == b]
    text = progress_text(row, now=1e9 + 50)
    # The ETA counts down from when the report was written; the checkpoint's age from its time.
    assert "300/1,000 steps" in text and "24.5k tok/s  ETA 5m00s  ckpt 2m50s ago  2 spikes, 1 rewind" in text
    (shown,) = [r for r in status_json([row], now=1e9 + 50)]
    assert shown["figures"] == {
        "step": 300,
        "total": 1000,
        "loss": 3.5,
        "tokens_per_second": 24_468.0,
        "steps_per_second": 2.0,
        "eta_seconds": 300.0,
        "checkpoint_step": 250,
        "checkpoint_age_seconds": 170.0,
        "interventions": {"spike_steps": 2, "rewinds": 1},
    }
    # MFU, where the hardware's peak is known, replaces tokens/s.
    step_events.progress(
        400, 1000, "steps", data={**figures, "mfu": 41.5}, context=context, clock=lambda: 1e9 + 60
    )
    (row,) = [r for r in read_status(entries, store, now=1e9 + 60, local_host=me.host) if r.entry == b]
    assert "MFU 41.5%" in progress_text(row, now=1e9 + 60) and "tok/s" not in progress_text(row, now=1e9 + 60)


def test_progress_outside_a_step_only_logs(tmp_path, caplog, monkeypatch):
    # Outside a step every caller shares one pace (a step function called directly by an earlier
    # test reported 100% of its own work there): start from none.
    monkeypatch.setattr(step_events, "_progress_state", {})
    caplog.set_level("INFO", logger="pipeline.run.in_step.step_events")
    assert not step_events.progress(5, 10, "shards", clock=lambda: 0.0)
    assert "50% (5 of 10 shards)" in caplog.text


def test_json_rows_and_manifest_entries(tmp_path):
    store, me, _token, entries = _setup(tmp_path)
    manifest = {
        "steps": [
            {"label": e.label, "name": e.name, "output_path": e.output_path, "deps": list(e.deps)}
            for e in entries
        ]
    }
    assert entries_from_manifest(manifest) == entries
    out = status_json(read_status(entries, store, now=time.time(), local_host=me.host), time.time())
    assert [r["table_state"] for r in out] == ["SUCCESS", "RUNNING", "STALE", "NOT STARTED"]
    assert json.loads(json.dumps(out))[0]["attempt"] == 2


def test_watch_refreshes_until_nothing_runs(tmp_path):
    store, me, token, entries = _setup(tmp_path)
    b = entries[1]
    loads: list[int] = []

    def load():
        loads.append(1)
        return read_status(entries, store, now=time.time(), local_host=me.host)

    context = step_events.StepContext(b.output_path, me.run_id, token)
    step_events.progress(3, 4, "shards", context=context, clock=lambda: 2e9)

    def sleep(seconds: float) -> None:
        assert seconds == 0.5
        store.commit(b.output_path, me, token)  # the running step finishes between two refreshes

    console = Console(file=io.StringIO(), width=250, record=True, force_terminal=False)
    rows = watch(load, console, interval=0.5, title="t", sleep=sleep, wait_for_start=0)
    assert len(loads) == 2
    (done,) = [r for r in rows if r.entry == b]
    assert done.state == "SUCCESS" and done.progress is not None
    assert progress_text(done) == ""  # a finished step shows no stale bar
    assert "Ctrl-C to stop watching" in console.export_text()


def test_a_watch_started_before_the_run_waits_for_it_and_follows_it_to_the_end(tmp_path):
    """`drydock status FILE --watch` in a second terminal, a moment before the run starts."""
    entries = [StepEntry("a-0123456789ab", "a", str(tmp_path / "a-0123456789ab"))]
    phases = iter(["before", "before", "running", "between", "finished"])
    phase = {"now": "before"}
    states = {"before": "NOT STARTED", "running": "RUNNING", "between": "SUCCESS", "finished": "SUCCESS"}
    clock = {"t": 0.0}

    def load():
        return [StepStatus(entries[0], states[phase["now"]])]

    def sleep(seconds: float) -> None:
        clock["t"] += seconds
        phase["now"] = next(phases)

    console = Console(file=io.StringIO(), width=250, record=True, force_terminal=False)
    # The run's manifest says it goes on until its end ("between": its step is done, the run is not).
    going = lambda rows: phase["now"] in ("running", "between")  # noqa: E731
    rows = watch(
        load, console, interval=1.0, title="t", run_going=going, clock=lambda: clock["t"], sleep=sleep
    )
    assert rows[0].state == "SUCCESS" and phase["now"] == "finished"


def test_a_watch_of_nothing_gives_up_after_the_wait(tmp_path):
    entries = [StepEntry("a-0123456789ab", "a", str(tmp_path / "a-0123456789ab"))]
    clock = {"t": 0.0}
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock["t"] += seconds

    console = Console(file=io.StringIO(), width=250, record=True, force_terminal=False)
    load = lambda: [StepStatus(entries[0], "NOT STARTED")]  # noqa: E731
    watch(load, console, interval=10.0, title="t", wait_for_start=30, clock=lambda: clock["t"], sleep=sleep)
    assert sleeps == [10.0, 10.0, 10.0]


def test_a_narrow_terminal_never_cuts_a_step_name_short():
    label = "train/scaling/d128-s1600-with-a-long-suffix-0123456789ab"
    rows = [StepStatus(StepEntry(label, label.rsplit("-", 1)[0], f"/prefix/{label}"), "RUNNING")]
    console = Console(file=io.StringIO(), width=90, record=True, force_terminal=False)
    console.print(status_table(rows, now=time.time()))
    assert label in console.export_text()


def test_an_attempt_whose_function_has_not_started_is_queued_and_timed_from_its_start(tmp_path):
    """Regression: steps whose Ray tasks waited for resources showed RUNNING, their durations
    rising (5 "running" on 2 CPUs); they are QUEUED until their function starts."""
    store, me = StepStore(LocalStorage()), current_owner()
    entry = StepEntry("train/q-000000000009", "train/q", str(tmp_path / "train" / "q-000000000009"))
    token = store.acquire(entry.output_path, me, TTL, announces_start=True).token  # as Ray's do
    (row,) = read_status([entry], store, now=time.time(), local_host=me.host)
    assert row.state == "QUEUED" and "has not started" in row.detail
    marker = Path(entry.output_path) / ".logs" / f"attempt-{token}.started"
    marker.parent.mkdir(parents=True, exist_ok=True)
    began = time.time() + 30  # it waited 30 s for resources
    marker.write_text(json.dumps({"time": began, "where": "pid 1 on node"}))
    (row,) = read_status([entry], store, now=began + 5, local_host=me.host)
    assert row.state == "RUNNING" and row.started == began and row.duration(began + 5) == 5
    # The local backend starts a function as it leases it, and writes no marker: RUNNING.
    local = StepEntry("train/l-000000000010", "train/l", str(tmp_path / "train" / "l-000000000010"))
    store.acquire(local.output_path, me, TTL)
    (row,) = read_status([local], store, now=time.time(), local_host=me.host)
    assert row.state == "RUNNING"
