"""The dashboard served by its real entry point in a child process, queried over loopback HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from tests.pipeline.observe.dashboard.conftest import REPO, start_dashboard, stop


def get(server, path: str) -> httpx.Response:
    return httpx.get(server.url.rstrip("/") + path, timeout=30)


def tree(prefix: str) -> dict[str, tuple[int, int]]:
    """Every file under the prefix with its size and modification time."""
    out = {}
    for root, _dirs, files in os.walk(prefix):
        for name in files:
            stat = os.stat(os.path.join(root, name))
            out[os.path.join(root, name)] = (stat.st_size, stat.st_mtime_ns)
    return out


def test_experiment_list(dashboard, runs):
    response = get(dashboard, "/")
    assert response.status_code == 200 and "text/html" in response.headers["content-type"]
    ids = re.findall(r'<tr class="experiment" data-id="([^"]+)"', response.text)
    assert [i.rsplit("-", 1)[0] for i in ids] == ["broken", "tiny_demo"]
    assert "a training run that diverges" in response.text


def test_experiment_page_has_dag_and_states(dashboard, runs):
    manifest_id = next(i for i in re.findall(r'data-id="([^"]+)"', get(dashboard, "/").text) if "broken" in i)
    page = get(dashboard, f"/experiments/{manifest_id}").text
    nodes = dict(re.findall(r'<g class="node" data-label="([^"]+)" data-state="([^"]+)"', page))
    assert nodes == {
        runs.label(runs.broken, "data/corpus"): "CACHED",
        runs.label(runs.broken, "train/broken"): "FAILED",
        runs.label(runs.broken, "eval/broken"): "BLOCKED",
    }
    assert "loss became NaN at step 3" in page
    assert f"/steps/{runs.label(runs.broken, 'train/broken')}?experiment={manifest_id}" in page


def test_step_page_shows_config_events_logs_metrics(dashboard, runs):
    label = runs.label(runs.demo, "train/tiny")
    page = get(dashboard, f"/steps/{label}").text
    assert re.search(r'<pre class="config" id="config">.*&#34;num_steps&#34;: 40', page, re.S)
    assert re.findall(r'<tr class="event" data-event="(\w+)"', page) == ["RUNNING", "WARNING", "SUCCESS"]
    assert "loss spike at step 30" in page
    assert re.search(
        r'<dd id="progress">100% · 40 of 40 steps · loss 1\.733 · 1\.04k tok/s · ETA 0s · '
        r"on prediction · 1 spike ",
        page,
    )
    # The spike is a row of the interventions table and a marker on the loss chart.
    assert re.search(
        r'<table class="grid" id="interventions">.*<td>30</td><td>spike</td><td>spike at step 30: loss 7.97',
        page,
        re.S,
    )
    chart = json.loads(
        re.search(r'<script type="application/json" id="loss-data">(.*?)</script>', page, re.S)[1]
    )
    assert [(e["step"], e["event"]) for e in chart["events"]] == [(30, "spike")]
    assert f'href="/steps/{label}/logs/attempt-1.log"' in page
    assert "train_tiny: done" in page  # the latest log, inline
    assert '<canvas id="loss-chart">' in page and "/static/chart.umd.min.js" in page

    log = get(dashboard, f"/steps/{label}/logs/attempt-1.log")
    assert log.status_code == 200 and "step 39: loss" in log.text


def test_the_run_page_gathers_prediction_throughput_step_times_hosts_attempts(dashboard, runs):
    label = runs.label(runs.demo, "train/tiny")
    page = get(dashboard, f"/steps/{label}").text
    chart = json.loads(
        re.search(r'<script type="application/json" id="loss-data">(.*?)</script>', page, re.S)[1]
    )
    # The predicted eval loss and its band, as prediction.json has them.
    assert len(chart["prediction"]) == 40 and chart["prediction"][0][0] == 1
    step, loss, low, high = chart["prediction"][-1]
    assert step == 40 and low < loss < high
    assert "the predicted eval loss (chinchilla fit of scaling/ladder) and its band" in page
    # Every evaluation so far against the prediction.
    rows = re.findall(
        r'<tr class="(\w+)"><td>(\d+)</td>', page.split('id="evaluations"')[1].split("</table>")[0]
    )
    assert rows == [("inside", "10"), ("inside", "20"), ("inside", "30")]
    # Throughput and MFU by step; seconds per step (about 1 s, 2.5-2.7 s after an evaluation).
    assert chart["tokens_per_second"][:2] == [1000.0, 1001.0] and chart["mfu"][:3] == [30.0, 30.5, 31.0]
    times = chart["step_seconds"]
    assert times["count"] == 39 and 1.0 <= times["median"] <= 1.2 and 2.5 <= times["max"] <= 2.8
    assert "<h3>Seconds per step</h3>" in page and "<h3>Throughput</h3>" in page
    # Expert balance where router statistics were logged (every 5th step), and the latest figures.
    assert chart["router_steps"] == list(range(0, 40, 5))
    assert chart["router_max_load_ratio"][0] == 3.0 and chart["router_max_load_ratio"][-1] == 1.0 + 2.0 / 36
    assert "<h3>Expert balance</h3>" in page and "latest (step 35): worst 1.056, mean 1.028" in page
    # The host that ran it, from its pulse, with its log; the attempt and how it ended.
    hosts = page.split('id="host-table"')[1].split("</table>")[0]
    assert re.search(r"<td>0</td><td>pid \d+ on ", hosts) and f"/steps/{label}/logs/attempt-1.log" in hosts
    attempts = page.split('id="attempt-table"')[1].split("</table>")[0]
    assert attempts.count('data-outcome="SUCCESS"') == 1
    # Where its device time went (the ledger): one CPU core, one attempt, all of it work.
    ledger = page.split('id="ledger"')[1].split("</section>")[0]
    assert "1 CPU held for" in ledger and "over 1 attempt(s)" in ledger and "goodput 100%" in ledger
    assert "<th>work</th>" in ledger and "<td>SUCCESS</td>" in ledger
    # The API has the same sections.
    run = get(dashboard, f"/api/steps/{label}").json()["run"]
    assert [h["host"] for h in run["hosts"]] == [0] and run["attempts"][0]["outcome"] == "SUCCESS"
    assert [e["verdict"] for e in run["prediction"]["evaluations"]] == ["inside"] * 3


def test_a_failed_steps_page_shows_why_and_the_alert_sent(dashboard, runs):
    label = runs.label(runs.broken, "train/broken")
    page = get(dashboard, f"/steps/{label}").text
    attempts = page.split('id="attempt-table"')[1].split("</table>")[0]
    assert 'data-outcome="FAILED"' in attempts and "<td>error</td>" in attempts
    alerts = page.split('id="alert-table"')[1].split("</table>")[0]
    assert "<td>failed</td>" in alerts and "FloatingPointError: loss became NaN at step 3" in alerts
    assert "<td>yes</td>" in alerts


def test_evaluation_table(dashboard, runs):
    page = get(dashboard, f"/steps/{runs.label(runs.demo, 'eval/tiny')}").text
    table = page[page.index('<table class="grid" id="eval-table">') :]
    rows = re.findall(r"<tr(?: class=\"average\")?><td>(\w+)</td>", table[: table.index("</table>")])
    assert rows == ["code", "web", "average"]


def test_json_api(dashboard, runs):
    experiments = get(dashboard, "/api/experiments").json()
    assert {e["experiment"] for e in experiments} == {"tiny_demo", "broken"}
    demo = next(e for e in experiments if e["experiment"] == "tiny_demo")
    detail = get(dashboard, f"/api/experiments/{demo['id']}").json()
    assert [s["state"] for s in detail["steps"]] == ["SUCCEEDED"] * 3
    step = get(dashboard, f"/api/steps/{runs.label(runs.demo, 'train/tiny')}").json()
    assert step["metrics"]["total_steps"] == 40 and step["logs"] == ["attempt-1.log"]


@pytest.mark.parametrize(
    "path",
    [
        "/experiments/nope-0123456789ab",
        "/steps/nope/x-0123456789ab",
        "/steps/..%2F..%2Fetc-0123456789ab",
        "/steps/train/tiny",
        "/api/steps/nope/x-0123456789ab",
    ],
)
def test_unknown_things_are_404(dashboard, path):
    response = get(dashboard, path)
    assert response.status_code == 404


def test_unknown_log_is_404(dashboard, runs):
    label = runs.label(runs.demo, "train/tiny")
    assert get(dashboard, f"/steps/{label}/logs/attempt-9.log").status_code == 404
    assert "has no log" in get(dashboard, f"/steps/{label}/logs/attempt-9.log").text


def test_read_only(dashboard, runs):
    before = tree(runs.prefix)
    label = runs.label(runs.demo, "train/tiny")
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        response = httpx.request(method, dashboard.url + f"steps/{label}", timeout=30)
        assert response.status_code == 405, method
    for path in ("/", f"/steps/{label}", f"/steps/{label}/logs/attempt-1.log", "/api/experiments"):
        assert get(dashboard, path).status_code == 200
    assert tree(runs.prefix) == before


def test_pages_load_nothing_from_elsewhere(dashboard, runs):
    pages = [get(dashboard, "/").text, get(dashboard, f"/steps/{runs.label(runs.demo, 'train/tiny')}").text]
    for page in pages:
        sources = re.findall(r'(?:src|href)="([^"]+)"', page)
        assert sources and all(s.startswith("/") for s in sources), sources
    # FastAPI's interactive docs would load Swagger UI from a CDN: they are off.
    assert get(dashboard, "/docs").status_code == 404


def test_binds_loopback_by_default(dashboard):
    assert dashboard.url.startswith("http://127.0.0.1:")


def run_main(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from pipeline.cli.dashboard import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_missing_prefix_is_one_clear_error(tmp_path):
    result = run_main("--prefix", str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"error: dashboard --prefix: {str(tmp_path / 'nowhere')!r} is not a directory"
    )
    assert not (tmp_path / "nowhere").exists()


def test_busy_port_is_one_clear_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = run_main("--prefix", str(tmp_path), "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: dashboard --host/--port: cannot listen on 127.0.0.1:{port}")


def test_empty_prefix_page(tmp_path):
    server = start_dashboard(str(tmp_path))
    try:
        page = get(server, "/").text
        assert "No experiments under" in page
    finally:
        stop(server)


def test_ctrl_c_stops_the_dashboard_quietly(tmp_path):
    server = start_dashboard(str(tmp_path))
    assert get(server, "/").status_code == 200
    server.process.send_signal(signal.SIGINT)
    _out, err = server.process.communicate(timeout=30)
    assert server.process.returncode == 0 and "Traceback" not in err, err


def test_importing_the_package_loads_no_web_framework():
    code = (
        "import sys, pipeline, pipeline.observe.dashboard; "
        "loaded = sorted(m for m in ('fastapi', 'uvicorn', 'starlette', 'jinja2') if m in sys.modules); "
        "print(loaded)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_help_and_bad_options(capsys, tmp_path):
    from pipeline.cli.dashboard import main

    assert main(["--help"]) == 0
    assert "--prefix" in capsys.readouterr().out
    assert main(["--port", "eighty"]) == 2
    assert "invalid int value: 'eighty'" in capsys.readouterr().err
    assert main(["--prefix", str(tmp_path), "--port", "70000"]) == 2
    assert "70000 is not a TCP port" in capsys.readouterr().err


def test_step_table_filters_by_state(dashboard, runs):
    manifest_id = next(i for i in re.findall(r'data-id="([^"]+)"', get(dashboard, "/").text) if "broken" in i)
    page = get(dashboard, f"/experiments/{manifest_id}?state=FAILED").text
    assert re.findall(r'<tr class="step" data-label="([^"]+)"', page) == [
        runs.label(runs.broken, "train/broken")
    ]
    assert "1 of 3 steps FAILED" in page
    # The DAG still shows every step.
    assert len(re.findall(r'<g class="node"', page)) == 3
    everything = get(dashboard, f"/experiments/{manifest_id}?all=true").text
    assert len(re.findall(r'<tr class="step"', everything)) == 3


def test_a_bad_experiment_query_is_ignored(dashboard, runs):
    response = get(dashboard, f"/steps/{runs.label(runs.demo, 'train/tiny')}?experiment=a/b")
    assert response.status_code == 200 and 'href="/experiments/' not in response.text


def test_unreadable_prefix_is_a_clear_error(tmp_path):
    """A storage error while serving is a 503 page naming it, not a bare 500 with a traceback."""
    # A manifest name that is a directory: listing works, reading it fails (IsADirectoryError),
    # like an object store refusing one request. Permissions would not do: CI runs as root.
    (tmp_path / "experiments" / "odd-0123456789ab.json").mkdir(parents=True)
    server = start_dashboard(str(tmp_path))
    try:
        response = get(server, "/")
        assert response.status_code == 503 and "cannot read the prefix" in response.text
        api = get(server, "/api/experiments")
        assert api.status_code == 503 and "Is a directory" in api.json()["error"]
    finally:
        stop(server)


def test_a_step_kind_the_dashboard_has_no_code_for_shows_its_report(tmp_path):
    """The report a step declares is recorded with its SUCCESS and rendered generically."""
    from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
    from pipeline.storage.files import LocalStorage
    from pipeline.storage.step_store import StepStore
    from tests.pipeline.observe.dashboard.fixture_steps import (
        CorpusConfig,
        ScoreConfig,
        score_tiny,
        write_corpus,
    )

    prefix = str(tmp_path / "prefix")
    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    score = Step("score/tiny", score_tiny, ScoreConfig(output_of(corpus), this_output()))
    report = run_experiment([score], ExecutorMainConfig(prefix=prefix, backend="local"))
    assert report.ok
    label = next(label for label, node in report.plan.dag.nodes.items() if node.name == "score/tiny")
    (success,) = [e for e in StepStore(LocalStorage()).events(f"{prefix}/{label}") if e.event == "SUCCESS"]
    assert success.data["report"]["tasks scored"] == 2
    server = start_dashboard(prefix)
    try:
        page = get(server, f"/steps/{label}").text
    finally:
        stop(server)
    table = page[page.index('<table class="grid report-table" data-name="tasks">') :]
    table = table[: table.index("</table>")]
    assert re.findall(r"<th>(\w+)</th>", table) == ["task", "accuracy"]
    assert re.findall(r"<tr><td>(\w+)</td><td>([\d.]+)</td></tr>", table) == [
        ("arith", "0.75"),
        ("prose", "0.5"),
    ]
    assert "<th>tasks scored</th><td>2</td>" in page


def test_a_running_step_page_reloads_itself_and_a_finished_one_does_not(dashboard, runs, tmp_path):
    from pipeline.processes import current_owner
    from pipeline.storage.opening import open_storage
    from pipeline.storage.step_store import StepStore

    finished = runs.label(runs.demo, "train/tiny")
    assert 'http-equiv="refresh"' not in get(dashboard, f"/steps/{finished}").text
    # A step another runner (this test, alive) is running now, under the same prefix.
    label = "train/live-0123456789ab"
    step_dir = f"{runs.prefix}/{label}"
    store = StepStore(open_storage(runs.prefix))
    owner = current_owner()
    taken = store.acquire(step_dir, owner, ttl=600)
    try:
        page = get(dashboard, f"/steps/{label}").text
        assert 'http-equiv="refresh" content="10"' in page and "reloads every 10 s" in page
    finally:
        store.release(step_dir, owner, taken.token)
        store.append(step_dir, owner, taken.token, "CANCELLED", "test over")


def test_files_outside_the_prefix_are_never_served_through_a_link(runs, tmp_path):
    """A log linked to a file outside the prefix (issue 19: it was served with 200)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret")
    label = runs.label(runs.demo, "train/tiny")
    link = os.path.join(runs.prefix, label, ".logs", "attempt-9.log")
    os.symlink(secret, link)
    server = start_dashboard(runs.prefix)
    try:
        response = get(server, f"/steps/{label}/logs/attempt-9.log")
        assert response.status_code == 404 and "the secret" not in response.text
        page = get(server, f"/steps/{label}")
        assert page.status_code == 200 and "the secret" not in page.text
    finally:
        stop(server)
        os.unlink(link)


def test_only_requests_naming_this_machine_are_answered(dashboard):
    """DNS rebinding: a page on another site reaching the loopback server by a name it controls."""
    url = dashboard.url.rstrip("/") + "/"
    assert httpx.get(url, headers={"Host": "evil.example"}, timeout=30).status_code == 421
    for host in ("localhost", "127.0.0.1", "localhost:8008", "[::1]:8008"):
        assert httpx.get(url, headers={"Host": host}, timeout=30).status_code == 200, host


def test_allow_host_names_another_host(runs):
    server = start_dashboard(runs.prefix, "--allow-host", "dash.example")
    try:
        url = server.url.rstrip("/") + "/api/experiments"
        assert httpx.get(url, headers={"Host": "dash.example:8008"}, timeout=30).status_code == 200
        assert httpx.get(url, headers={"Host": "other.example"}, timeout=30).status_code == 421
    finally:
        stop(server)


def test_the_dashboard_leaves_out_a_field_that_does_not_apply():
    from pipeline.observe.dashboard.app import _hyperparameters

    info = {
        "identity": {
            "versioned": {"optimizer": {"name": "adamw", "learning_rate": 3e-3, "adam_learning_rate": 3e-3}}
        },
        "inapplicable": ["optimizer.adam_learning_rate"],
    }
    assert _hyperparameters(info) == [("optimizer.name", "adamw"), ("optimizer.learning_rate", 3e-3)]


# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d4944415478da63f8cfc0f01f0005000201a5a0a8b40000000049454e44ae426082"
)


def test_a_steps_figures_are_shown_on_its_page_and_served_as_png_only(dashboard, runs):
    """A fit's `fit.png` (or any PNG a step writes at its top level) is on its page and linked;
    nothing else is served as a figure."""
    label = runs.label(runs.demo, "train/tiny")
    step_dir = os.path.join(runs.prefix, label)
    written = {"fit.png": PNG, "fake.png": b"<script>alert(1)</script>", "notes.txt": b"text"}
    for name, data in written.items():
        with open(os.path.join(step_dir, name), "wb") as f:
            f.write(data)
    try:
        page = get(dashboard, f"/steps/{label}").text
        assert f'<img src="/steps/{label}/figures/fit.png" alt="fit.png"' in page
        figure = get(dashboard, f"/steps/{label}/figures/fit.png")
        assert figure.status_code == 200 and figure.content == PNG
        assert figure.headers["content-type"] == "image/png"
        for name in ("fake.png", "notes.txt", "..%2F..%2Fsecret.png", "missing.png"):
            assert get(dashboard, f"/steps/{label}/figures/{name}").status_code == 404, name
    finally:
        for name in written:
            os.unlink(os.path.join(step_dir, name))


def test_a_curation_steps_data_page_shows_each_reason_with_its_documents_escaped(dashboard, runs):
    label = runs.label(runs.demo, "data/corpus")
    assert 'id="data-page"' in get(dashboard, f"/steps/{label}").text  # the step page links it
    page = get(dashboard, f"/steps/{label}/data")
    assert page.status_code == 200
    html = page.text
    assert "3 of 7 documents kept" in html
    reasons = html[html.index('id="reasons"') : html.index("</table>", html.index('id="reasons"'))]
    assert reasons.index("too_short") < reasons.index("duplicate")  # the largest reason first
    # The documents are text, never markup: a crawled page's script stays inert.
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; hi" in html and "<script>alert" not in html
    # A duplicate beside the document kept for it.
    assert '<div class="pair">' in html and "DOC 0" in html and "docs.jsonl #0" in html
    assert 'id="kept"' in html and "doc-2" in html
    one = get(dashboard, f"/steps/{label}/data?reason=language").text
    assert 'data-reason="language"' in one and 'data-reason="too_short"' not in one and 'id="kept"' not in one
    assert get(dashboard, f"/steps/{label}/data?reason=nothing").status_code == 404
    train = runs.label(runs.demo, "train/tiny")
    assert get(dashboard, f"/steps/{train}/data").status_code == 404  # no evidence: not curation
    assert 'id="data-page"' not in get(dashboard, f"/steps/{train}").text
