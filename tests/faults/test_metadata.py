"""Corrupted metadata, the whole user path through the CLI: what `run`, `status` and `--force` do.

* a `.status` with a corrupt line: `run` stops (exit 2, one line naming the step and the way
  out), `status` shows CORRUPT, `run --force STEP` sets the file aside and reruns the step;
* a `.status` cut short (a torn last line): the torn line is ignored, so a step whose SUCCESS
  was cut off is simply not done, and the next run reruns it;
* a `.step.json` edited by hand (any JSON, or not JSON): the step stays cached (identity is its
  directory name) with a note saying the file is unreadable; `--force` rewrites it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.faults.trials import ROOT, Experiment, verify


def cli(exp: Experiment, command: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    env.pop("DRYDOCK_PREFIX", None)
    where = ["--prefix", str(exp.prefix), "--backend", "local"]
    return subprocess.run(
        [sys.executable, "-m", "pipeline", command, str(exp.file), *where, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


def done_experiment(tmp_path: Path) -> Experiment:
    exp = Experiment(tmp_path, pause=0.0).write()
    result = cli(exp, "run")
    assert result.returncode == 0, result.stderr
    return exp


def step_dir(exp: Experiment, name: str) -> Path:
    (found,) = exp.prefix.glob(f"{name}-*")
    return found


def status_json(exp: Experiment) -> dict[str, dict]:
    result = cli(exp, "status", "--json")
    assert result.returncode == 0, result.stderr
    return {s["name"]: s for s in json.loads(result.stdout)["steps"]}


def plan_json(exp: Experiment) -> dict[str, dict]:
    result = cli(exp, "plan", "--json")
    assert result.returncode == 0, result.stderr
    return {s["name"]: s for s in json.loads(result.stdout)["steps"]}


def test_corrupt_status_line_stops_the_run_shows_in_status_and_force_reruns(tmp_path):
    exp = done_experiment(tmp_path)
    target = step_dir(exp, "mid/m0")
    status = target / ".status"
    status.write_bytes(status.read_bytes() + b'{"event": "SUCC\n')  # a line mangled by hand
    before = sorted(p.name for p in exp.prefix.rglob("*"))

    refused = cli(exp, "run")
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: step 'mid/m0': ") and "line 3 is corrupt" in line
    assert "`drydock status`" in line and "`--force`" in line
    assert sorted(p.name for p in exp.prefix.rglob("*")) == before  # nothing written

    shown = cli(exp, "status")
    assert shown.returncode == 0 and "CORRUPT" in shown.stdout
    assert status_json(exp)["mid/m0"]["status"] == "CORRUPT"

    forced = cli(exp, "run", "--force", "^mid/m0$")
    assert forced.returncode == 0, forced.stderr
    assert len(list(target.glob(".status.corrupt-*"))) == 1
    verdict = verify(exp)
    assert len(verdict.committed) == 6
    # The sink read the old m0 and is cached: it still names the old call. Only that is reported.
    assert all(p.startswith("sink-") and "read m0-" in p for p in verdict.problems), verdict.problems
    assert {s["state"] for s in plan_json(exp).values()} == {"CACHED"}


def test_status_cut_short_loses_the_success_and_the_step_reruns(tmp_path):
    exp = done_experiment(tmp_path)
    status = step_dir(exp, "out/sink") / ".status"
    data = status.read_bytes()
    status.write_bytes(data[: len(data) - 10])  # the SUCCESS line loses its end
    planned = plan_json(exp)["out/sink"]
    assert planned["state"] == "RUN" and planned["reason"].startswith("previous attempt was interrupted")
    assert status_json(exp)["out/sink"]["status"] == "RUNNING"
    rerun = cli(exp, "run")
    assert rerun.returncode == 0, rerun.stderr
    verdict = verify(exp)
    assert len(verdict.committed) == 6 and verdict.problems == ()


def test_hand_edited_step_json_is_noted_not_fatal_and_force_rewrites_it(tmp_path):
    exp = done_experiment(tmp_path)
    edits = {"src/s0": b"[1, 2]", "src/s1": b'{"fn": "x", "prefix": 3}', "src/s2": b'{"name": "src/s2", '}
    for name, content in edits.items():
        (step_dir(exp, name) / ".step.json").write_bytes(content)
    planned = plan_json(exp)
    for name in ("src/s0", "src/s2"):
        assert planned[name]["state"] == "CACHED"
        assert planned[name]["reason"] == "cached; .step.json is unreadable; identity matches"
    assert planned["src/s1"]["state"] == "CACHED" and planned["src/s1"]["notes"]
    assert {s["status"] for s in status_json(exp).values()} == {"SUCCESS"}
    assert cli(exp, "run").returncode == 0  # cached: nothing reruns because of a note

    forced = cli(exp, "run", "--force", "^src/")
    assert forced.returncode == 0, forced.stderr
    for name in edits:
        info = json.loads((step_dir(exp, name) / ".step.json").read_text())
        assert info["name"] == name
    assert plan_json(exp)["src/s0"]["reason"] == "cached"
