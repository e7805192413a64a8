"""End to end: the dashboard on loopback, loaded by headless Chromium through Playwright.

Uses Debian's `chromium` (installed by `.ci/run`; or $DRYDOCK_CHROMIUM), not a browser downloaded
by Playwright. Without it the test is skipped, unless DRYDOCK_REQUIRE_BROWSER=1 (set in CI), where
a missing browser fails.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.pipeline.observe.dashboard.conftest import REPO

# DRYDOCK_CHROMIUM points the test at another Chromium build (or, to check the skip, at none).
CHROMIUM = os.environ.get("DRYDOCK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
DOCS_IMAGES = os.path.join(REPO, "docs", "images")
# `DRYDOCK_UPDATE_SCREENSHOTS=1 pytest tests/pipeline/observe/dashboard` refreshes the docs' screenshots;
# otherwise a test run leaves the checkout untouched.
UPDATE_DOCS = os.environ.get("DRYDOCK_UPDATE_SCREENSHOTS") == "1"


@pytest.fixture(scope="module")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        if os.environ.get("DRYDOCK_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DRYDOCK_REQUIRE_BROWSER=1 but there is no Chromium at {CHROMIUM}")
        pytest.skip(
            f"no Chromium at {CHROMIUM} (apt-get install chromium; CI sets DRYDOCK_REQUIRE_BROWSER=1)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # --no-sandbox: CI and containers run as root, where Chromium's sandbox refuses to start.
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith("http://127.0.0.1:") else outside.append(r.url))
    yield page
    context.close()
    assert errors == [], f"JavaScript errors: {errors}"
    assert outside == [], f"requests outside the dashboard: {outside}"


def test_dashboard_in_a_browser(dashboard, runs, page, tmp_path):
    # The experiment list.
    page.goto(dashboard.url)
    rows = page.locator("tr.experiment")
    assert rows.count() == 2
    assert page.locator("#experiments").inner_text().count("tiny_demo") >= 1
    page.screenshot(path=str(tmp_path / "experiments.png"), full_page=True)

    # An experiment: clicking a DAG node opens its step.
    page.get_by_role("link", name="tiny_demo").click()
    page.wait_for_selector("#dag svg")
    assert page.locator("#dag g.node").count() == 3
    assert page.locator('#steps tr.step[data-state="SUCCEEDED"]').count() == 3
    page.screenshot(path=str(tmp_path / "experiment.png"), full_page=True)
    train = runs.label(runs.demo, "train/tiny")
    page.locator(f'#dag g.node[data-label="{train}"]').click()
    page.wait_for_url(f"**/steps/{train}?experiment=*")

    # The step page: config, status events, logs, and the loss chart drawn by Chart.js.
    assert '"num_steps": 40' in page.locator("#config").inner_text()
    events = page.locator("#events tr.event")
    assert [events.nth(i).get_attribute("data-event") for i in range(events.count())] == [
        "RUNNING",
        "WARNING",
        "SUCCESS",
    ]
    assert "train_tiny: done" in page.locator("#latest-log").inner_text()
    chart = page.evaluate(
        """() => {
            const canvas = document.getElementById("loss-chart");
            const chart = Chart.getChart(canvas);
            const meta = chart.getDatasetMeta(0);
            const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let painted = 0;
            for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) painted++;
            return {
                labels: chart.data.datasets.map((d) => d.label),
                markers: chart.data.datasets.filter((d) => d.label === "interventions")
                    .map((d) => d.data.map((p) => [p.x, p.message])),
                points: chart.data.datasets[0].data.length,
                first: chart.data.datasets[0].data[0],
                laidOut: meta.data.filter((p) => Number.isFinite(p.x) && Number.isFinite(p.y)).length,
                yMax: chart.scales.y.max,
                painted: painted,
                width: canvas.width,
            };
        }"""
    )
    assert chart["labels"] == [
        "train loss",
        "eval loss",
        "predicted (low)",  # the band's lower edge (not in the legend)
        "predicted interval",
        "predicted eval loss",
        "interventions",
        "learning rate",
    ]
    assert chart["markers"] == [[[30, "spike at step 30: loss 7.97"]]]  # the spike, marked where it is
    assert chart["points"] == 40 and chart["laidOut"] == 40
    assert chart["first"] == {"x": 0, "y": 7.5}
    assert chart["yMax"] >= 4 * 2.0  # the spike at step 30 is on the chart
    assert chart["width"] > 0 and chart["painted"] > 1000
    # Log scale and smoothing switch on the same chart.
    page.locator("#loss-log").check()
    assert page.evaluate("() => Chart.getChart('loss-chart').options.scales.y.type") == "logarithmic"
    page.locator("#loss-smooth").check()
    smoothed = page.evaluate("() => Chart.getChart('loss-chart').data.datasets[0].data[30].y")
    assert smoothed < 4 * 2.0  # the spike at step 30 is averaged down
    page.locator("#loss-log").uncheck()
    page.locator("#loss-smooth").uncheck()
    # The versioned values as a table; what the step reads, linked.
    assert "num_steps" in page.locator("#hyperparameters").inner_text()
    assert runs.label(runs.demo, "data/corpus") in page.locator("#inputs").inner_text()
    page.screenshot(path=str(tmp_path / "step.png"), full_page=True)
    page.locator("#training").screenshot(path=str(tmp_path / "loss-chart.png"))
    assert os.path.getsize(tmp_path / "step.png") > 10_000
    # The run page's other charts: throughput and MFU, seconds per step; drawn, not just declared.
    drawn = page.evaluate(
        """() => ["throughput-chart", "step-time-chart"].map((id) => {
            const chart = Chart.getChart(id);
            return [chart.config.type, chart.data.datasets.map((d) => d.label), chart.width > 0];
        })"""
    )
    assert drawn == [["line", ["tokens/s", "MFU %"], True], ["bar", ["steps"], True]]
    assert page.locator("#host-table tr.alive, #host-table tr.silent").count() == 1
    assert page.locator("#evaluations tr.inside").count() == 3
    # The docs show the run page from the loss to the attempts.
    if UPDATE_DOCS:
        page.set_viewport_size({"width": 1000, "height": 2400})
        top, bottom = page.evaluate(
            """() => {
                const box = (id) => document.getElementById(id).getBoundingClientRect();
                return [box("training").top + window.scrollY, box("attempts").bottom + window.scrollY];
            }"""
        )
        clip = {"x": 0, "y": top - 10, "width": 1000, "height": bottom - top + 20}
        page.screenshot(path=os.path.join(DOCS_IMAGES, "dashboard-run.png"), clip=clip, full_page=True)
        page.set_viewport_size({"width": 1280, "height": 720})

    # The docs show the step page as a user sees it first.
    if UPDATE_DOCS:
        page.screenshot(path=os.path.join(DOCS_IMAGES, "dashboard.png"))

    # A log opens from its link.
    page.locator("#host-table").get_by_role("link", name="attempt-1.log").click()  # the host's log
    assert "step 39: loss" in page.locator("#log").inner_text()

    # The failed experiment: its DAG shows each step's state (the docs show this page too).
    page.get_by_role("link", name="experiments").click()
    page.get_by_role("link", name="broken", exact=True).click()
    nodes = page.locator("#dag g.node")
    states = {
        nodes.nth(i).get_attribute("data-label"): nodes.nth(i).get_attribute("data-state") for i in range(3)
    }
    assert states == {
        runs.label(runs.broken, "data/corpus"): "CACHED",
        runs.label(runs.broken, "train/broken"): "FAILED",
        runs.label(runs.broken, "eval/broken"): "BLOCKED",
    }
    page.screenshot(path=str(tmp_path / "broken.png"), full_page=True)
    if UPDATE_DOCS:
        page.screenshot(path=os.path.join(DOCS_IMAGES, "dashboard-experiment.png"))
    # A failed step's page says why at the top.
    page.locator(f'#dag g.node[data-label="{runs.label(runs.broken, "train/broken")}"]').click()
    page.wait_for_url("**/steps/train/broken-*")
    assert "loss became NaN at step 3" in page.locator("#failure").inner_text()
    # ...how its attempt ended, and the alert the run sent about it.
    assert page.locator('#attempt-table tr[data-outcome="FAILED"]').count() == 1
    assert "loss became NaN at step 3" in page.locator("#alert-table").inner_text()


def test_a_curation_steps_data_page_in_a_browser(dashboard, runs, page, tmp_path):
    """From the step page to what the step removed and why; one reason at a time."""
    label = runs.label(runs.demo, "data/corpus")
    page.goto(f"{dashboard.url}steps/{label}")
    page.locator("#data-page").click()
    page.wait_for_url(f"**/steps/{label}/data")
    rows = page.locator("#reasons tbody tr")
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())] == [
        "too_short",
        "duplicate",
        "language",
    ]
    # The crawled text is shown as text: the script is on the page as characters, and never ran.
    assert "<script>alert('x')</script> hi" in page.locator('section[data-reason="too_short"]').inner_text()
    pair = page.locator('section[data-reason="duplicate"] .pair')
    assert "document 0" in pair.inner_text() and "DOC 0" in pair.inner_text()
    page.screenshot(path=str(tmp_path / "data.png"), full_page=True)
    if UPDATE_DOCS:
        page.screenshot(path=os.path.join(DOCS_IMAGES, "dashboard-data.png"))
    page.locator("#reasons").get_by_role("link", name="language").click()
    assert page.locator("section.reason").count() == 1
    assert "ist eine Farbe" in page.locator('section[data-reason="language"]').inner_text()


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """A prefix with two runs of a small sweep (two trainings, their evaluations and task scores)."""
    from pipeline import ExecutorMainConfig, run_experiment
    from tests.pipeline.observe.dashboard.conftest import start_dashboard, stop
    from tests.pipeline.observe.test_compare import sweep

    prefix = str(tmp_path_factory.mktemp("compare_page") / "prefix")
    for name, rates in (("lr_low", [1e-3]), ("lr_grid", [3e-3, 3e-2])):
        config = ExecutorMainConfig(prefix=prefix, backend="local", experiment=name)
        assert run_experiment(sweep(rates), config).ok
    # A follower's curve so far, as steps.evaluation.follow writes it, in one evaluation's directory.
    import glob
    import json

    evaluation = sorted(glob.glob(os.path.join(prefix, "eval", "lr0-*")))[0]
    curve = {
        "ylabel": "eval loss",
        "steps": [10, 20, 30],
        "series": {"web loss": [3.0, 2.5, 2.2], "code loss": [3.3, 2.8, 2.4]},
    }
    with open(os.path.join(evaluation, "curve.json"), "w") as f:
        json.dump(curve, f)
    # A task follower's curve: accuracy with standard errors and chance (steps.evaluation.follow.curve).
    for i, tasks in enumerate(sorted(glob.glob(os.path.join(prefix, "tasks", "lr*-*")))):
        scores = {
            "ylabel": "accuracy",
            "steps": [10, 20, 30],
            "series": {"arith": [0.26 + 0.02 * i, 0.30 + 0.03 * i, 0.31 + 0.05 * i]},
            "errors": {"arith": [0.025, 0.026, 0.026]},
            "levels": {"arith": 0.25},
        }
        with open(os.path.join(tasks, "curve.json"), "w") as f:
            json.dump(scores, f)
    server = start_dashboard(prefix)
    yield server, os.path.relpath(evaluation, prefix)
    stop(server)


def test_compare_page_in_a_browser(compared, page, tmp_path):
    compared, curve_label = compared
    # Tick both runs on the experiment list, then compare them.
    page.goto(compared.url)
    boxes = page.locator('#experiments input[type="checkbox"]')
    assert boxes.count() == 2
    for i in range(2):
        boxes.nth(i).check()
    page.get_by_role("button", name="compare the ticked runs").click()
    page.wait_for_url("**/compare?run=*")
    # One row per training (the grid run has two), the field that differs, the metrics.
    rows = page.locator("#comparison tr.row")
    assert rows.count() == 3
    header = page.locator("#comparison thead").inner_text()
    assert "learning_rate" in header and "train/loss" in header and "task/arith/acc" in header
    assert "documents" not in header  # the same in every row: not a column
    # Task scores side by side, one column per row.
    assert page.locator("#task-scores thead th").count() == 4
    # One chart: every training's loss curve overlaid, drawn by Chart.js.
    page.wait_for_function("() => window.Chart && Chart.getChart('compare-chart')")
    datasets = page.evaluate("() => Chart.getChart('compare-chart').data.datasets.map(d => d.label)")
    assert sorted(d.endswith(" (eval)") for d in datasets) == [False] * 3 + [True] * 3
    # Coloured by the swept value, not by run: each curve is named by its learning rate.
    assert {d.removesuffix(" (eval)") for d in datasets} == {
        "learning_rate=0.001",
        "learning_rate=0.003",
        "learning_rate=0.03",
    }
    # The legend: one short entry per training (its eval curve shares its colour), below the plot.
    legend = page.evaluate(
        "() => { const c = Chart.getChart('compare-chart'); "
        "return [c.options.plugins.legend.position, c.legend.legendItems.map(i => i.text)]; }"
    )
    assert legend[0] == "bottom" and sorted(legend[1]) == [
        "learning_rate=0.001",
        "learning_rate=0.003",
        "learning_rate=0.03",
    ]
    assert "value of learning_rate." in page.locator("#colours").inner_text()
    # The eval losses tie (no winner is marked); the training loss picks one.
    assert page.locator("#best").count() == 0
    page.goto(page.url + "&best=train/loss")
    assert page.locator("#best").inner_text().startswith("★ best by train/loss: train/lr0 (2.734)")
    (best,) = page.locator("#comparison tr.best").all()
    assert "0.001" in best.inner_text()
    # Task score by checkpoint across runs: a line per training, error bars, the chance line.
    page.wait_for_function("() => Chart.getChart('compare-tasks-chart')")
    tasks = page.evaluate(
        "() => Chart.getChart('compare-tasks-chart').data.datasets.map(d => [d.label, !!d.errors])"
    )
    assert ["chance", False] in tasks and sum(1 for _label, bars in tasks if bars) == 3, tasks
    evals = page.evaluate("() => Chart.getChart('compare-evals-chart').data.datasets.map(d => d.label)")
    assert sorted(label.split(" ", 1)[1] for label in evals) == ["code loss", "web loss"], evals
    # The log-scale switch, as on a step's page.
    page.locator("#compare-log").check()
    assert page.evaluate("() => Chart.getChart('compare-chart').options.scales.y.type") == "logarithmic"
    page.locator("#compare-log").uncheck()
    page.screenshot(path=str(tmp_path / "compare.png"), full_page=True)
    if UPDATE_DOCS:
        page.screenshot(path=os.path.join(DOCS_IMAGES, "dashboard-compare.png"), full_page=True)
    # A step that follows a training shows its curve by checkpoint (curve.json), drawn by Chart.js.
    page.locator("#comparison tr.row a", has_text="train/lr0").first.click()
    page.wait_for_url("**/steps/train/lr0-*")
    assert page.locator("#follow-curve").count() == 0
    page.goto(compared.url + "steps/" + curve_label)
    page.wait_for_function("() => window.Chart && Chart.getChart('curve-chart')")
    labels = page.evaluate("() => Chart.getChart('curve-chart').data.datasets.map(d => d.label)")
    assert sorted(labels) == ["code loss", "web loss"]
    # A run that is not there is a 404 page, not a traceback.
    page.goto(compared.url + "compare?run=nope")
    assert "no experiment 'nope'" in page.locator("#error").inner_text()
