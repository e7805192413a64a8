"""The dashboard's readers, on a prefix made by real runs and on hand-made files in the real formats."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from pipeline.core.lease import LeaseRecord
from pipeline.core.records import StatusEvent, StepRecord, parse_status
from pipeline.observe.dashboard import data, step_data
from pipeline.processes import host_id, process_start_time
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore
from tests.pipeline.observe.dashboard.fixture_steps import loss_at


def store_of(prefix: str) -> StepStore:
    return StepStore(open_storage(prefix))


def test_experiments_are_listed_from_manifests(runs):
    experiments = data.list_experiments(open_storage(runs.prefix), runs.prefix)
    by_name = {e.experiment: e for e in experiments}
    assert set(by_name) == {"tiny_demo", "broken"}
    demo, broken = by_name["tiny_demo"], by_name["broken"]
    assert demo.finished and demo.exit_code == 0 and demo.counts == {"SUCCEEDED": 3}
    assert demo.description == "train a tiny model and evaluate it"
    assert broken.exit_code == 1 and broken.counts == {"CACHED": 1, "FAILED": 1, "BLOCKED": 1}
    # Most recently updated first.
    assert [e.experiment for e in experiments] == ["broken", "tiny_demo"]


def test_experiment_joins_manifest_and_status(runs):
    store = store_of(runs.prefix)
    broken_id = next(
        e.id for e in data.list_experiments(store.storage, runs.prefix) if e.experiment == "broken"
    )
    detail = data.read_experiment(store, runs.prefix, broken_id)
    rows = {row.name: row for row in detail.steps}
    assert [row.name for row in detail.steps] == ["data/corpus", "train/broken", "eval/broken"]
    assert rows["data/corpus"].state == "CACHED" and rows["data/corpus"].storage_state == "SUCCESS"
    assert rows["train/broken"].state == "FAILED" and "NaN" in (rows["train/broken"].error or "")
    assert rows["eval/broken"].state == "BLOCKED" and rows["eval/broken"].storage_state is None
    assert rows["eval/broken"].deps == (runs.label(runs.broken, "train/broken"),)
    assert detail.environment["versions"]["python"]


def test_step_detail_reads_every_file(runs):
    label = runs.label(runs.demo, "train/tiny")
    detail = step_data.read_step(store_of(runs.prefix), runs.prefix, label)
    assert detail.state == "SUCCESS" and not detail.stale
    assert [e.event for e in detail.events] == ["RUNNING", "WARNING", "SUCCESS"]
    assert detail.events[1].message.startswith("loss spike at step 30")
    assert detail.step_json is not None and detail.step_json["config"]["num_steps"] == 40
    assert detail.logs == ("attempt-1.log",)
    assert detail.progress is not None and (detail.progress.done, detail.progress.total) == (40, 40)
    assert detail.files == ("metrics.jsonl", "prediction.json", "train_result.json")
    metrics = detail.metrics
    assert metrics is not None and metrics.total_steps == 40 and metrics.steps == tuple(range(40))
    assert metrics.loss[5] == pytest.approx(loss_at(5)) and metrics.loss[30] == pytest.approx(4 * loss_at(30))
    # Lines of one step are merged, and Levanter's long keys get their short aliases.
    assert metrics.last["tokens_per_second"] == 1039.0 and metrics.last["loss"] == pytest.approx(loss_at(39))
    assert detail.results is None

    evaluation = step_data.read_step(store_of(runs.prefix), runs.prefix, runs.label(runs.demo, "eval/tiny"))
    assert evaluation.results is not None and evaluation.results.checkpoint_step == 39
    assert set(evaluation.results.sets) == {"web", "code"}
    assert evaluation.results.sets["web"]["loss"] == pytest.approx(loss_at(39) + 0.1)
    assert evaluation.results.average["loss"] == pytest.approx(loss_at(39) + 0.2)


def test_failed_step_keeps_its_traceback(runs):
    detail = step_data.read_step(store_of(runs.prefix), runs.prefix, runs.label(runs.broken, "train/broken"))
    assert detail.state == "FAILED"
    failed = detail.events[-1]
    assert "FloatingPointError" in failed.data["traceback"]


def test_log_is_read_only_by_a_listed_name(runs):
    storage = open_storage(runs.prefix)
    label = runs.label(runs.demo, "train/tiny")
    text, cut = step_data.read_log(storage, runs.prefix, label, "attempt-1.log")
    assert text.endswith("train_tiny: done\n") and not cut
    for name in ("attempt-2.log", "../.status", "../../experiments"):
        with pytest.raises(data.NotFound):
            step_data.read_log(storage, runs.prefix, label, name)


@pytest.mark.parametrize(
    "label",
    [
        "../etc-0123456789ab",
        "train/../../x-0123456789ab",
        "train/tiny",
        "/abs-0123456789ab",
        "nope-0123456789ab",
    ],
)
def test_bad_or_unknown_labels_are_not_found(runs, label):
    with pytest.raises(data.NotFound):
        step_data.read_step(store_of(runs.prefix), runs.prefix, label)


def test_unknown_experiment_is_not_found(runs):
    with pytest.raises(data.NotFound):
        data.read_experiment(store_of(runs.prefix), runs.prefix, "../broken")


def test_metrics_thinning_keeps_the_last_point_and_skips_torn_lines(tmp_path):
    step_dir = tmp_path / "train" / "long-0123456789ab"
    step_dir.mkdir(parents=True)
    n = step_data.MAX_CHART_POINTS * 3 + 7
    lines = [json.dumps({"step": s, "loss": 1.0 / (s + 1)}) for s in range(n)]
    lines.insert(10, '{"step": 5, "loss": NaN}')  # a NaN loss (json writes it so) is a gap
    lines.append('{"step": 99999, "loss"')  # a torn last line from a kill
    (step_dir / "metrics.jsonl").write_text("\n".join(lines))
    metrics = step_data.read_metrics(open_storage(str(tmp_path)), str(step_dir))
    assert metrics is not None and metrics.total_steps == n
    assert len(metrics.steps) <= step_data.MAX_CHART_POINTS + 1 and metrics.steps[-1] == n - 1
    assert metrics.steps == tuple(sorted(metrics.steps)) and metrics.steps[0] == 0
    assert all(v is None or math.isfinite(v) for v in metrics.loss)


def test_a_step_on_object_storage_charts_its_segments_as_one_file(tmp_path):
    step_dir = tmp_path / "train" / "seg-0123456789ab"
    (step_dir / "metrics").mkdir(parents=True)
    (step_dir / "metrics" / "part-000000.jsonl").write_text(
        '{"step": 0, "loss": 3.0}\n{"step": 1, "loss": 2.0}\n'
    )
    (step_dir / "metrics" / "part-000001.jsonl").write_text(
        '{"step": 2, "loss": 1.0}\n{"event": "spike", "step": 2}\n'
    )
    (step_dir / ".status").write_text("")
    metrics = step_data.read_metrics(open_storage(str(tmp_path)), str(step_dir))
    assert metrics is not None and metrics.steps == (0, 1, 2) and metrics.loss == (3.0, 2.0, 1.0)
    assert [e["event"] for e in metrics.events] == ["spike"]
    detail = step_data.read_step(store_of(str(tmp_path)), str(tmp_path), "train/seg-0123456789ab")
    assert detail.metrics is not None and detail.metrics.total_steps == 3


def test_a_followers_curve_is_read_and_a_malformed_one_ignored(tmp_path):
    step_dir = tmp_path / "eval" / "follow-0123456789ab"
    step_dir.mkdir(parents=True)
    curve = {"ylabel": "accuracy", "steps": [10, 20], "series": {"stories": [0.3, float("nan")], "odd": [1]}}
    (step_dir / "curve.json").write_text(json.dumps(curve))
    detail = step_data.read_step(store_of(str(tmp_path)), str(tmp_path), "eval/follow-0123456789ab")
    # A NaN is a gap; a series of the wrong length is dropped.
    assert detail.curve == {"ylabel": "accuracy", "steps": [10, 20], "series": {"stories": [0.3, None]}}
    (step_dir / "curve.json").write_text(json.dumps({"steps": "not a list"}))
    assert (
        step_data.read_step(store_of(str(tmp_path)), str(tmp_path), "eval/follow-0123456789ab").curve is None
    )


def test_foreign_results_file_is_a_problem_not_a_crash(tmp_path):
    step_dir = tmp_path / "eval" / "odd-0123456789ab"
    step_dir.mkdir(parents=True)
    (step_dir / "results.json").write_text(json.dumps({"accuracy": 0.5}))
    detail = step_data.read_step(store_of(str(tmp_path)), str(tmp_path), "eval/odd-0123456789ab")
    assert detail.results is None
    assert detail.problems == (
        "results.json is not in the evaluate step's format: results.json has no `validation_sets` mapping",
    )


def test_unreadable_manifest_is_listed_with_its_error(tmp_path):
    manifests = tmp_path / "experiments"
    manifests.mkdir()
    (manifests / "half-0123456789ab.json").write_text('{"experiment": "half", "steps": [')
    (manifests / "notes.txt").write_text("not a manifest")
    listed = data.list_experiments(open_storage(str(tmp_path)), str(tmp_path))
    assert [(e.id, bool(e.error)) for e in listed] == [("half-0123456789ab", True)]
    with pytest.raises(ValueError):
        data.read_experiment(store_of(str(tmp_path)), str(tmp_path), "half-0123456789ab")


def test_empty_prefix_has_no_experiments(tmp_path):
    assert data.list_experiments(open_storage(str(tmp_path)), str(tmp_path)) == []


def test_corrupt_status_is_reported(tmp_path):
    step_dir = tmp_path / "data" / "x-0123456789ab"
    step_dir.mkdir(parents=True)
    (step_dir / ".status").write_text("not json\n")
    detail = step_data.read_step(store_of(str(tmp_path)), str(tmp_path), "data/x-0123456789ab")
    assert detail.state is None and detail.corrupt and ".status line 1 is corrupt" in detail.corrupt


def status(*events: str) -> bytes:
    return b"".join(StatusEvent(e, 1, float(i)).dump() for i, e in enumerate(events))


@pytest.mark.parametrize(
    ("manifest", "events", "stale", "shown"),
    [
        ("RUN", (), False, "RUN"),  # planned, not started yet
        ("BLOCKED", (), False, "BLOCKED"),
        ("RUN", ("RUNNING",), False, "RUNNING"),
        ("RUN", ("RUNNING",), True, "STALE"),
        ("RUN", ("RUNNING", "WARNING"), False, "RUNNING"),  # notes do not change the state
        ("RUN", ("RUNNING", "SUCCESS"), False, "SUCCEEDED"),
        ("CACHED", ("RUNNING", "SUCCESS"), False, "CACHED"),
        ("SUCCEEDED", ("RUNNING", "FAILED"), False, "FAILED"),  # a later run failed it: storage is newer
    ],
)
def test_live_state(manifest, events, stale, shown):
    record = StepRecord(parse_status(status(*events)))
    assert data.live_state(manifest, record, stale) == shown


def test_corrupt_status_shows_corrupt():
    assert data.live_state("SUCCEEDED", StepRecord(corrupt="bad line"), False) == "CORRUPT"


def lease(pid: int, expires: float, released: bool = False) -> LeaseRecord:
    return LeaseRecord(1, "run", host_id(), pid, process_start_time(pid), expires, released)


def test_runner_gone_like_drydock_status():
    running = parse_status(status("RUNNING"))
    alive = lease(os.getpid(), expires=200.0)
    assert not data.runner_gone(StepRecord(running, lease=alive), 100.0, host_id())
    assert data.runner_gone(StepRecord(running, lease=alive), 300.0, host_id())  # expired
    assert data.runner_gone(
        StepRecord(running, lease=lease(os.getpid(), 200.0, released=True)), 100.0, host_id()
    )
    assert data.runner_gone(StepRecord(running), 100.0, host_id())  # no lease at all
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    assert data.runner_gone(StepRecord(running, lease=lease(int(dead.stdout), 200.0)), 100.0, host_id())
    done = parse_status(status("RUNNING", "SUCCESS"))
    assert not data.runner_gone(StepRecord(done), 100.0, host_id())


def test_progress_of_the_latest_attempt_only(tmp_path):
    step_dir = tmp_path / "train" / "run-0123456789ab"
    step_dir.mkdir(parents=True)
    events = parse_status(StatusEvent("RUNNING", 1, 1.0).dump() + StatusEvent("RUNNING", 2, 2.0).dump())
    storage = open_storage(str(tmp_path))
    report = {"done": 450, "total": 1000, "unit": "steps", "time": 3.0, "token": 2, "data": {"loss": 2.5}}
    (step_dir / ".progress").write_text(json.dumps(report))
    progress = data.read_progress(storage, str(step_dir), events)
    assert progress == data.Progress(450.0, 1000.0, "steps", 3.0, {"loss": 2.5}) and progress.percent == 45
    (step_dir / ".progress").write_text(json.dumps({**report, "token": 1}))
    assert data.read_progress(storage, str(step_dir), events) is None
    (step_dir / ".progress").write_text("{torn")
    assert data.read_progress(storage, str(step_dir), events) is None


def test_running_step_in_an_experiment_has_state_and_progress(tmp_path):
    """A run in progress: the manifest still says RUN, `.status` says RUNNING under a live lease."""
    label = "train/live-0123456789ab"
    step_dir = tmp_path / label
    step_dir.mkdir(parents=True)
    (step_dir / ".status").write_bytes(StatusEvent("RUNNING", 1, 1.0).dump())
    (step_dir / ".lease").write_bytes(lease(os.getpid(), expires=time.time() + 600).dump())
    (step_dir / ".progress").write_text(
        json.dumps({"done": 3, "total": 4, "unit": "shards", "time": 2.0, "token": 1})
    )
    (tmp_path / "experiments").mkdir()
    manifest = {
        "experiment": "live",
        "finished": False,
        "steps": [{"label": label, "name": "train/live", "state": "RUN"}],
    }
    (tmp_path / "experiments" / "live-0123456789ab.json").write_text(json.dumps(manifest))
    detail = data.read_experiment(store_of(str(tmp_path)), str(tmp_path), "live-0123456789ab")
    (row,) = detail.steps
    assert (row.manifest_state, row.state) == ("RUN", "RUNNING")
    assert row.progress is not None and row.progress.percent == 75
    step = step_data.read_step(store_of(str(tmp_path)), str(tmp_path), label)
    assert step.state == "RUNNING" and not step.stale and step.progress == row.progress


@dataclass(frozen=True)
class FlakyConfig:
    output: str
    flag: str
    value: int = 1


def flaky(config: FlakyConfig) -> None:
    """Fails while the flag file exists."""
    if os.path.exists(config.flag):
        raise RuntimeError("the flag is up")
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "out"), "w") as f:
        f.write(str(config.value))


def test_every_run_keeps_its_history(tmp_path):
    """A failed run, then the same experiment run again: two rows, each with its own outcome;
    a third run with a changed value says what changed."""
    from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned

    prefix, flag = str(tmp_path / "prefix"), tmp_path / "flag"
    config = ExecutorMainConfig(prefix=prefix, backend="local", experiment="hist")

    def steps(value: int) -> list[Step]:
        return [Step("work", flaky, FlakyConfig(this_output(), str(flag), versioned(value)))]

    flag.write_text("up")
    assert not run_experiment(steps(1), config).ok
    flag.unlink()
    assert run_experiment(steps(1), config).ok
    assert run_experiment(steps(1), config).ok  # all cached: no new history row
    assert run_experiment(steps(2), config).ok
    rows = data.list_experiments(open_storage(prefix), prefix)
    assert [(r.experiment, r.exit_code) for r in rows] == [("hist", 0), ("hist", 0), ("hist", 1)]
    newest, second, first = rows
    assert second.id == first.id and second.run != first.run  # the same DAG, two runs
    assert newest.changed == ("work",) and second.changed == () and first.changed == ()
    # What distinguishes the newest run: the versioned value that changed.
    assert newest.differences == ("work: value 1 → 2",)
    assert newest.previous == second.id and first.previous is None
    # A graph that changed its steps (a sweep given another point, a step renamed): the run says
    # which steps came and went, compared with the previous run of the same experiment file.
    grown = [*steps(2), Step("work/value=3", flaky, FlakyConfig(this_output(), str(flag), versioned(3)))]
    assert run_experiment(grown, config).ok
    renamed = [Step("labour", flaky, FlakyConfig(this_output(), str(flag), versioned(2)))]
    assert run_experiment(renamed, config).ok
    latest, bigger = data.list_experiments(open_storage(prefix), prefix)[:2]
    assert bigger.added == ("work/value=3",) and bigger.removed == () and bigger.changed == ()
    assert latest.added == ("labour",) and set(latest.removed) == {"work", "work/value=3"}
    # The failed run's own page shows the step as that run left it.
    detail = data.read_experiment(store_of(prefix), prefix, first.id, run=first.run)
    assert [row.state for row in detail.steps] == ["FAILED"]
    with pytest.raises(data.NotFound):
        data.read_experiment(store_of(prefix), prefix, first.id, run="no-such-run")
