"""`pipeline.observe.compare`: rows from real runs of the executor (local backend), in milliseconds."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.observe.compare import (
    best_row,
    compare_rows,
    differing_params,
    leading_params,
    loss_curves,
    manifest_steps,
    rows_csv,
    rows_json,
    sort_rows,
    table_rows,
)
from pipeline.storage.manifests import list_manifests, load_manifest, manifest_dir
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore
from tests.pipeline.observe.dashboard.fixture_steps import (
    CorpusConfig,
    EvalConfig,
    FitConfig,
    PredictedTrainConfig,
    ScoreConfig,
    TrainConfig,
    evaluate_tiny,
    fit_tiny,
    loss_at,
    score_tiny,
    train_tiny,
    write_corpus,
)

ROOT = Path(__file__).resolve().parents[3]


def sweep(learning_rates: list[float]) -> list[Step]:
    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    out = []
    for i, lr in enumerate(learning_rates):
        train = Step(
            f"train/lr{i}",
            train_tiny,
            TrainConfig(output_of(corpus), this_output(), versioned(20), versioned(lr), None),
        )
        out.append(Step(f"eval/lr{i}", evaluate_tiny, EvalConfig(output_of(train), this_output())))
        out.append(Step(f"tasks/lr{i}", score_tiny, ScoreConfig(output_of(train), this_output())))
    return out


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("compare") / "prefix")
    for name, rates in (("one", [1e-3]), ("two", [1e-2]), ("grid", [1e-3, 3e-3, 1e-2])):
        report = run_experiment(
            sweep(rates), ExecutorMainConfig(prefix=root, backend="local", experiment=name)
        )
        assert report.ok
    return root


def steps_of(prefix: str, experiment: str):
    storage = open_storage(prefix)
    (name,) = [n for n in list_manifests(storage, prefix) if n.startswith(f"{experiment}-")]
    return manifest_steps(load_manifest(f"{manifest_dir(prefix)}/{name}"), experiment, prefix)


def test_one_row_per_training_with_its_evaluations_metrics(prefix):
    store = StepStore(open_storage(prefix))
    rows = compare_rows(steps_of(prefix, "one") + steps_of(prefix, "two"), store)
    assert [(r.run, r.name) for r in rows] == [("one", "train/lr0"), ("two", "train/lr0")]
    for row, lr in zip(rows, (1e-3, 1e-2), strict=True):
        assert row.metrics["train/loss"] == pytest.approx(loss_at(19) * (1 + lr))
        assert row.metrics["eval/web/loss"] == pytest.approx(loss_at(19) + 0.1)
        assert row.metrics["task/arith/acc"] == 0.75
        assert row.params["learning_rate"] == lr and row.params["data/corpus.documents"] == 3
    # Only what differs is a column; the corpus and the step count agree.
    assert differing_params(rows) == ["learning_rate"]
    # What each row held, from its ledger: a CPU core for as long as the training step ran.
    for row in rows:
        events = store.events(row.output_path)
        held = events[-1].time - events[0].time
        assert row.device_time["device_hours"] == pytest.approx(held / 3600)
        assert row.device_time["goodput"] == pytest.approx(1.0)  # no account: all of it work
    header, _body, _left = table_rows(rows)
    assert {"device-h", "cost $", "goodput"} <= set(header)


def test_a_sweep_gives_a_row_per_training_and_sorts(prefix):
    store = StepStore(open_storage(prefix))
    rows = compare_rows(steps_of(prefix, "grid"), store)
    assert sorted(r.name for r in rows) == ["train/lr0", "train/lr1", "train/lr2"]
    ordered = sort_rows(rows, "train/loss", descending=True)
    assert [r.params["learning_rate"] for r in ordered] == [1e-2, 3e-3, 1e-3]
    with pytest.raises(KeyError):
        sort_rows(rows, "no/such/metric")
    table = list(csv.reader(io.StringIO(rows_csv(ordered))))
    assert table[0][:3] == ["run", "step", "learning_rate"] and len(table) == 4
    document = rows_json(ordered)
    assert document["params"] == ["learning_rate"] and "task/prose/acc" in document["metrics"]
    curves = loss_curves(store, ordered)
    assert len(curves) == 3 and len(curves[0]["train"]) == 20 and [p[0] for p in curves[0]["eval"]] == [10]
    # An output on object storage has the same lines in segments: the same curve.
    out = Path(ordered[0].output_path)
    lines = (out / "metrics.jsonl").read_text().splitlines(keepends=True)
    (out / "metrics").mkdir()
    (out / "metrics" / "part-000000.jsonl").write_text("".join(lines[:7]))
    (out / "metrics" / "part-000001.jsonl").write_text("".join(lines[7:]))
    (out / "metrics.jsonl").rename(out / "moved.jsonl")
    try:
        assert loss_curves(store, ordered) == curves
    finally:
        (out / "moved.jsonl").rename(out / "metrics.jsonl")
        shutil.rmtree(out / "metrics")


def test_a_failed_or_unfinished_step_gives_no_row(tmp_path):
    from tests.pipeline.observe.dashboard.fixture_steps import diverge

    root = str(tmp_path / "prefix")
    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    bad = Step("train/bad", diverge, TrainConfig(output_of(corpus), this_output(), versioned(5)))
    report = run_experiment([bad], ExecutorMainConfig(prefix=root, backend="local", experiment="bad"))
    assert not report.ok
    assert compare_rows(steps_of(root, "bad"), StepStore(open_storage(root))) == []


def test_a_run_record_carries_the_metrics_it_recorded(prefix):
    """The manifest of a run keeps each committed step's metrics: the dashboard lists a training's
    final loss per run without reading every step."""
    import json

    storage = open_storage(prefix)
    (name,) = [n for n in list_manifests(storage, prefix) if n.startswith("one-")]
    manifest = json.loads(storage.read(f"{manifest_dir(prefix)}/{name}"))
    recorded = {s["name"]: s.get("metrics") for s in manifest["steps"]}
    assert recorded["train/lr0"] == {"train/loss": pytest.approx(loss_at(19) * 1.001)}
    assert recorded["data/corpus"] is None
    from pipeline.observe.dashboard import data

    (row,) = [r for r in data.list_experiments(storage, prefix) if r.experiment == "one"]
    assert row.metrics["train/lr0: train/loss"] == pytest.approx(loss_at(19) * 1.001)


def test_the_best_row_is_the_lowest_loss_or_the_highest_score_and_a_tie_has_none():
    from pipeline.observe.compare import Row, best_row, group_of

    def row(name: str, lr: float, **metrics: float) -> Row:
        return Row(
            "run", f"{name}-0123456789ab", name, f"/p/{name}", {"optimizer.learning_rate": lr}, metrics
        )

    rows = [
        row(
            "a",
            1e-3,
            **{"train/loss": 2.0, "eval/prose/loss": 2.5, "eval/average/loss": 2.4, "task/x/acc": 0.3},
        ),
        row(
            "b",
            3e-3,
            **{"train/loss": 1.5, "eval/prose/loss": 2.6, "eval/average/loss": 2.2, "task/x/acc": 0.5},
        ),
    ]
    assert best_row(rows) == ("eval/average/loss", rows[1])  # the average eval loss, lowest
    assert best_row(rows, "eval/prose/loss") == ("eval/prose/loss", rows[0])
    assert best_row(rows, "task/x/acc") == ("task/x/acc", rows[1])  # a score: highest
    tied = [row("c", 1e-2, **{"train/loss": 1.5}), row("d", 1e-1, **{"train/loss": 1.5})]
    assert best_row(tied) is None and best_row(rows[:1]) is None
    assert group_of(rows[1], ["optimizer.learning_rate"]) == "learning_rate=0.003"


def test_a_branch_is_drawn_from_where_it_left_its_trunk(tmp_path):
    """A branch's metrics start with a `branch` line (train_moe writes it): its curves begin at
    the trunk's values at the branch step, so the line forks from the trunk's."""
    from pipeline.observe.compare import Row
    from pipeline.observe.metrics import branch_event

    trunk, branch = tmp_path / "train" / "trunk-1", tmp_path / "train" / "cool-2"
    trunk.mkdir(parents=True)
    branch.mkdir(parents=True)
    lines = [{"step": s, "loss": 5.0 - 0.1 * s} for s in range(1, 21)] + [{"step": 10, "eval/loss": 4.2}]
    (trunk / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    forked = [branch_event(str(trunk), 10, name="train/trunk", init="weights+optimizer")]
    forked += [{"step": s, "loss": 4.0 - 0.2 * (s - 10)} for s in range(11, 16)]
    (branch / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in forked))
    rows = [
        Row("run", "train/trunk-1", "train/trunk", str(trunk)),
        Row("run", "train/cool-2", "train/cool", str(branch)),
    ]
    store = StepStore(open_storage(str(tmp_path)))
    plain, drawn = loss_curves(store, rows)
    assert "branch" not in plain and plain["train"][0] == [1, 4.9]
    assert drawn["branch"] == {"trunk": "train/trunk", "step": 10}
    assert drawn["train"][:2] == [
        [10, pytest.approx(4.0)],
        [11, pytest.approx(3.8)],
    ]  # the trunk's step 10, then its own
    assert drawn["eval"] == [[10, 4.2]]
    # The run page lists it among the step's events, where it branched.
    from pipeline.observe.dashboard.step_data import read_metrics

    chart = read_metrics(open_storage(str(tmp_path)), str(branch))
    assert [(e["event"], e["step"], e["message"]) for e in chart.events] == [
        ("branch", 10, "branched from checkpoint 10 of train/trunk (weights+optimizer)")
    ]
    # A trunk gone (collected, or another prefix): the branch is drawn from its own first step.
    shutil.rmtree(trunk)
    (alone,) = loss_curves(store, rows[1:])
    assert (
        alone["branch"]["step"] == 10
        and alone["train"][0] == [11, pytest.approx(3.8)]
        and alone["eval"] == []
    )


def ladder() -> list[Step]:
    """A ladder as a researcher builds one: a trunk training and two cooldown branches of it, an
    evaluation of each, a fit over the evaluations, and a target training compared with the fit."""

    def training(name: str, data: Step, steps: int, lr: float, config: type = TrainConfig, **more) -> Step:
        fields = config(output_of(data), this_output(), versioned(steps), versioned(lr), None, **more)
        return Step(name, train_tiny, fields)

    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    trunk = training("train/trunk", corpus, 20, 1e-3)
    branches = [training(f"train/branch{n}", trunk, n, 1e-3) for n in (10, 15)]
    evaluations = [
        Step(f"eval/{t.name.split('/')[1]}", evaluate_tiny, EvalConfig(output_of(t), this_output()))
        for t in (trunk, *branches)
    ]
    settings = FitConfig(
        tuple(output_of(e) for e in evaluations), this_output(), versioned((4, 5, 6)), versioned("kaplan")
    )
    fit = Step("scaling/fit", fit_tiny, settings)
    consulted = output_of(fit, identity=False)
    target = training("train/target", corpus, 20, 3e-3, PredictedTrainConfig, fit=consulted)
    return [fit, Step("eval/target", evaluate_tiny, EvalConfig(output_of(target), this_output()))]


def test_a_ladder_gives_a_row_per_training_branches_included_and_only_identity_fields(tmp_path):
    """Regression: cooldown branches were folded into their trunk's row as columns (their
    evaluations lost), and the target's fields included everything upstream of the fit it is
    compared with (333 "differing fields" on a 7-training ladder)."""
    root = str(tmp_path / "prefix")
    report = run_experiment(ladder(), ExecutorMainConfig(prefix=root, backend="local", experiment="ladder"))
    assert report.ok
    rows = compare_rows(steps_of(root, "ladder"), StepStore(open_storage(root)))
    assert sorted(r.name for r in rows) == ["train/branch10", "train/branch15", "train/target", "train/trunk"]
    for row in rows:  # each with its own evaluation's metrics, under their plain names
        assert set(row.metrics) >= {"train/loss", "eval/web/loss", "eval/code/loss"}, row
        assert not any(":" in m for m in row.metrics), row.metrics
    # The trunk and the target tie exactly on every eval loss: no best is named; by train/loss one is.
    assert best_row(rows) is None
    assert best_row(rows, "train/loss")[1].name == "train/trunk"
    branch = next(r for r in rows if r.name == "train/branch10")
    assert branch.metrics["eval/web/loss"] == pytest.approx(loss_at(9) + 0.1)
    params = differing_params(rows)
    assert not [p for p in params if p.startswith(("scaling/fit", "eval/"))], params
    assert {"num_steps", "learning_rate"} <= set(params)
    # Own fields lead; upstream ones (the branches' trunk) follow.
    assert set(leading_params(rows)[:2]) == {"num_steps", "learning_rate"}
    # The terminal table at 100 columns: every line fits, what differs first, the rest named.
    (manifest,) = (Path(root) / "experiments").glob("ladder-*.json")
    shown = subprocess.run(
        [sys.executable, "-m", "pipeline", "compare", str(manifest)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100, shown.stdout
    header = next(line for line in lines if "step" in line and "num_steps" in line)
    assert max(header.index("num_steps"), header.index("learning_rate")) < header.index("eval/")
    footer = " ".join(lines[lines.index(next(x for x in lines if "more columns did not fit" in x)) :])
    assert "--all shows them" in footer and "train/trunk.learning_rate" in footer
    assert sum(1 for line in lines if line.startswith("│ train/")) == 4
