"""`drydock status|dag|explain|gc|pin` and the plan's identity line, in real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pydot

ROOT = Path(__file__).resolve().parents[3]

EXPERIMENT = '''
import json, os, time
from dataclasses import dataclass
from pipeline import Step, executor_main, output_of, this_output, versioned, step_events

A_VALUE = {a_value}
RELEASE = {release!r}

@dataclass(frozen=True)
class Config:
    output: str
    value: int
    inputs: tuple = ()

def write(config):
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "value.json"), "w") as f:
        json.dump({{"value": config.value}}, f)

def train(config):
    """Reports progress and metrics, then holds until the test creates RELEASE."""
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({{"step": 29, "train/loss": 2.5}}) + "\\n")  # index 29: 30 steps done
    step_events.progress(30, 40, "steps", data={{"loss": 2.5}})
    while RELEASE and not os.path.exists(RELEASE):
        time.sleep(0.02)
    write(config)

a = Step("data/a", write, Config(this_output(), versioned(A_VALUE)))
b = Step("train/b", train, Config(this_output(), versioned(7), (output_of(a),)))
c = Step("eval/c", write, Config(this_output(), versioned(1), (output_of(b), output_of(a))))

if __name__ == "__main__":
    executor_main([c], description="observe test")
'''


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    out["RAY_AUTH_MODE"] = "disabled"
    out.pop("DRYDOCK_PREFIX", None)
    return out


def experiment(tmp_path: Path, a_value: int = 1, release: str = "") -> Path:
    path = tmp_path / f"exp{a_value}.py"
    path.write_text(textwrap.dedent(EXPERIMENT.format(a_value=a_value, release=release)))
    return path


def drydock(*args: str, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=timeout,
        input=stdin,
    )


def run(exp: Path, prefix: Path) -> subprocess.CompletedProcess:
    result = drydock("run", str(exp), "--prefix", str(prefix), "--backend", "local")
    assert result.returncode == 0, result.stderr
    return result


def wait_for(condition, what: str, limit: float = 60.0) -> None:
    """Wait for an event another process causes (a deadline only against hanging forever)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def test_run_lines_count_finished_steps(tmp_path):
    result = run(experiment(tmp_path), tmp_path / "prefix")
    finished = [line for line in result.stderr.splitlines() if " SUCCEEDED  [" in line]
    assert [line.split("[")[1].split("]")[0] for line in finished] == ["1/3", "2/3", "3/3"]


def test_status_table_json_and_manifest(tmp_path):
    exp, prefix = experiment(tmp_path), tmp_path / "prefix"
    run(exp, prefix)
    table = drydock("status", str(exp), "--prefix", str(prefix))
    assert table.returncode == 0, table.stderr
    for column in ("step", "state", "attempt", "duration", "last event", "progress", "output"):
        assert column in table.stdout
    assert "30/40 steps" in table.stdout and "loss 2.5" in table.stdout
    doc = json.loads(drydock("status", str(exp), "--prefix", str(prefix), "--json").stdout)
    assert doc["counts"] == {"SUCCESS": 3}
    (train,) = [s for s in doc["steps"] if s["name"] == "train/b"]
    assert train["train_step"] == 29 and train["loss"] == 2.5 and train["attempt"] == 1
    # The manifest alone is enough: no experiment file, no step code.
    (manifest,) = (prefix / "experiments").glob("*.json")
    from_manifest = json.loads(drydock("status", str(manifest), "--json").stdout)
    assert [s["label"] for s in from_manifest["steps"]] == [s["label"] for s in doc["steps"]]
    assert {s["table_state"] for s in from_manifest["steps"]} == {"SUCCESS"}
    assert {s["state"] for s in from_manifest["steps"]} == {"SUCCEEDED"}  # as the run recorded it


def start_held_run(tmp_path: Path) -> tuple[Path, Path, Path, subprocess.Popen]:
    """A run of `experiment` whose training waits for its release file: (the experiment file, the
    prefix, the release file, the runner)."""
    release = tmp_path / "release"
    exp, prefix = experiment(tmp_path, release=str(release)), tmp_path / "prefix"
    runner = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), "--backend", "local"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    return exp, prefix, release, runner


def test_status_watch_follows_a_run_until_it_ends(tmp_path):
    exp, prefix, release, runner = start_held_run(tmp_path)
    try:
        wait_for(lambda: list(prefix.glob("train/b-*/.progress")), "the training step to report progress")
        running = json.loads(drydock("status", str(exp), "--prefix", str(prefix), "--json").stdout)
        (train,) = [s for s in running["steps"] if s["name"] == "train/b"]
        assert train["table_state"] == "RUNNING" and train["live"] and train["progress"]["done"] == 30
        assert train["state"] == "WAIT"  # the plan: another runner holds it
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "status",
                str(exp),
                "--prefix",
                str(prefix),
                "--watch",
                "--interval",
                "0.2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
            cwd=ROOT,
        )
        release.write_text("go")
        out, err = watcher.communicate(timeout=120)  # returns only because watching ends by itself
        assert watcher.returncode == 0, err
        assert "3 success" in out
    finally:
        release.write_text("go")
        runner.communicate(timeout=120)
    assert runner.returncode == 0


def test_dag_formats(tmp_path):
    exp, prefix = experiment(tmp_path), tmp_path / "prefix"
    run(exp, prefix)
    mermaid = drydock("dag", str(exp), "--prefix", str(prefix))
    assert mermaid.stdout.startswith("flowchart LR") and mermaid.stdout.count(" --> ") == 3
    dot = drydock("dag", str(exp), "--prefix", str(prefix), "--format", "dot").stdout
    (graph,) = pydot.graph_from_dot_data(dot)
    assert len(graph.get_edges()) == 3
    page = tmp_path / "dag.html"
    made = drydock("dag", str(exp), "--prefix", str(prefix), "--format", "html", "--output", str(page))
    assert made.returncode == 0 and "wrote" in made.stderr
    html = page.read_text()
    svg = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])
    states = {g.get("data-state") for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("data-state")}
    assert states == {"SUCCESS"}
    bad = drydock("dag", str(exp), "--prefix", str(prefix), "--format", "png")
    assert bad.returncode == 2 and "unknown format 'png'" in bad.stderr and not bad.stdout


def test_plan_and_explain_say_what_changed(tmp_path):
    prefix = tmp_path / "prefix"
    run(experiment(tmp_path, a_value=1), prefix)
    changed = experiment(tmp_path, a_value=2)
    plan = drydock("plan", str(changed), "--prefix", str(prefix))
    assert "new identity: value 1→2 (vs data/a-" in plan.stdout
    plan_json = json.loads(drydock("plan", str(changed), "--prefix", str(prefix), "--json").stdout)
    explained = {s["name"]: s.get("explain") for s in plan_json["steps"]}
    assert explained["train/b"].startswith("new identity: upstream data/a changed: value 1→2")
    result = drydock("explain", str(changed), "eval/c", "--prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    assert "input inputs.0: upstream train/b changed" in result.stdout
    assert result.stdout.count("value 1→2") == 2  # through train/b, and directly
    missing = drydock("explain", str(changed), "eval/x", "--prefix", str(prefix))
    assert missing.returncode == 2 and "no step named 'eval/x'" in missing.stderr
    typo = drydock("explain", str(changed), "trian/b", "--prefix", str(prefix))
    assert typo.returncode == 2 and "did you mean train/b?" in typo.stderr


def test_gc_and_pin(tmp_path):
    prefix = tmp_path / "prefix"
    run(experiment(tmp_path, a_value=1), prefix)
    run(experiment(tmp_path, a_value=2), prefix)
    keep = ["--prefix", str(prefix), "--keep", "exp1"]
    listed = drydock("gc", *keep, "--dry_run")
    assert listed.returncode == 0 and "garbage: 3 step directories" in listed.stdout
    assert "dry run: nothing deleted" in listed.stdout and len(list(prefix.glob("*/*-*/.status"))) == 6
    declined = drydock("gc", *keep, stdin="n\n")
    assert declined.returncode == 1 and len(list(prefix.glob("*/*-*/.status"))) == 6
    (a2,) = [p for p in prefix.glob("data/a-*") if json.loads((p / "value.json").read_text())["value"] == 2]
    pinned = drydock("pin", f"data/{a2.name}", "--prefix", str(prefix))
    assert pinned.returncode == 0 and (a2 / ".pinned").exists()
    done = drydock("gc", *keep, "--yes")
    assert done.returncode == 0 and "deleted 2 step directories" in done.stdout
    assert a2.exists() and len(list(prefix.glob("*/*-*/.status"))) == 4
    assert drydock("pin", str(a2), "--unpin").stdout.startswith("unpinned")
    assert drydock("gc", *keep, "--yes").returncode == 0 and not a2.exists()
    bad = drydock("gc", "--prefix", str(prefix), "--older-than", "soon")
    assert bad.returncode == 2 and "--older-than" in bad.stderr


def test_status_watch_of_a_killed_run_ends_after_the_wait(tmp_path):
    """Regression: after `kill -9` of the driver its manifest says `finished: false` for ever, and
    `status MANIFEST --watch` redrew for ever though plain `status` shows the step STALE."""
    _exp, prefix, _release, runner = start_held_run(tmp_path)
    try:
        wait_for(lambda: list(prefix.glob("train/b-*/.progress")), "the training step to report progress")
    finally:
        runner.kill()
        runner.communicate(timeout=60)
    (manifest,) = (prefix / "experiments").glob("*.json")
    assert json.loads(manifest.read_text())["finished"] is False
    watch = [sys.executable, "-m", "pipeline", "status", str(manifest), "--watch", "--interval", "0.2"]
    watcher = subprocess.run(
        [*watch, "--wait", "2"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60
    )
    assert watcher.returncode == 0, watcher.stderr
    assert "STALE" in watcher.stdout
