"""Corrupted metadata, the whole user path through the CLI: what `run`, `status` and `--force` do.

* a `.status` with a corrupt line: `run` stops (exit 2, one line naming the step and the way
  out), `status` shows CORRUPT, `run --force STEP` sets the file aside and reruns the step;
* a `.status` cut short (a torn last line): the torn line is ignored, so a step whose SUCCESS
  was cut off is simply not done, and the next run reruns it;
* a `.step.json` edited by hand (any JSON, or not JSON) or deleted: the step stays cached with no
  note (its SUCCESS records what ran), `explain` says the file changed; `--force` rewrites it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def explain(exp: Experiment, name: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled")
    env.pop("DRYDOCK_PREFIX", None)
    command = [sys.executable, "-m", "pipeline", "explain", str(exp.file), name, "--prefix", str(exp.prefix)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


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


def test_hand_edited_step_json_changes_no_plan_explain_notes_it_and_force_rewrites_it(tmp_path):
    """SUCCESS, written under the lease by the attempt that ran, is the record of what ran; the
    plan reads only `.status` of a cached step, so a `.step.json` edited by hand (its readable
    copy) changes nothing there. `explain` compares the file with the digest SUCCESS recorded."""
    exp = done_experiment(tmp_path)
    edits = {"src/s0": b"[1, 2]", "src/s1": b'{"fn": "x", "prefix": 3}', "src/s2": b'{"name": "src/s2", '}
    for name, content in edits.items():
        (step_dir(exp, name) / ".step.json").write_bytes(content)
    (step_dir(exp, "mid/m0") / ".step.json").unlink()
    planned = plan_json(exp)
    for name in [*edits, "mid/m0"]:
        assert planned[name]["state"] == "CACHED" and planned[name]["reason"] == "cached"
    assert {s["status"] for s in status_json(exp).values()} == {"SUCCESS"}
    assert cli(exp, "run").returncode == 0  # cached: nothing reruns
    for name, what in [("src/s1", "was changed after the step committed"), ("mid/m0", "is missing")]:
        explained = explain(exp, name)
        assert f"note:     its .step.json {what}; its SUCCESS record (what ran) is unchanged" in explained
    assert "note:" not in explain(exp, "mid/m1")

    forced = cli(exp, "run", "--force", "^src/")
    assert forced.returncode == 0, forced.stderr
    for name in edits:
        info = json.loads((step_dir(exp, name) / ".step.json").read_text())
        assert info["name"] == name
    assert "note:" not in explain(exp, "src/s1")


def _running(status: Path) -> None:
    """Make a finished step's `.status` end in RUNNING of a runner that is gone (as after a kill)."""
    lines = status.read_text().splitlines()
    running = [line for line in lines if '"RUNNING"' in line]
    status.write_text("\n".join([*lines, running[-1].replace('"token": 1', '"token": 9')]) + "\n")


def test_metadata_of_the_wrong_type_is_corrupt_everywhere_and_force_gets_past_it(tmp_path):
    """Issue 19: well-formed JSON with fields of the wrong type gave tracebacks in plan, status,
    run and the dashboard (500), and `--force` could not get past them; an unknown event after
    SUCCESS silently un-committed the step."""
    from pipeline.observe.dashboard import step_data
    from pipeline.storage.files import LocalStorage
    from pipeline.storage.step_store import StepStore

    damages = [
        (".status", '{"event": 5, "token": 9, "time": 1.0}', "unknown event 5"),
        (".status", '{"event": "WARNING", "token": 1, "time": 1.0, "data": "x"}', "data 'x' is not a dict"),
        (
            ".status",
            '{"event": "WARNING", "token": 1, "time": 1.0, "message": {}}',
            "message {} is not a str",
        ),
        (".status", '{"event": "WARNING", "token": "1", "time": 1.0}', "token '1' is not a whole number"),
        (".status", '{"event": "RESURRECTED", "token": 1, "time": 1.0}', "unknown event 'RESURRECTED'"),
        (
            ".lease",
            '{"token": 9, "run_id": "r", "host": "h", "pid": 1, "pid_start": null, "expires": "soon"}',
            "expires 'soon'",
        ),
        (
            ".lease",
            '{"token": 9, "run_id": "r", "host": "h", "pid": "1", "pid_start": null, "expires": 1.0}',
            "pid '1'",
        ),
        (
            ".lease",
            '{"token": "x", "run_id": "r", "host": "h", "pid": 1, "pid_start": null, "expires": null}',
            "token 'x'",
        ),
    ]
    for i, (name, damage, expect) in enumerate(damages):
        exp = done_experiment(tmp_path / str(i))
        target = step_dir(exp, "mid/m0")
        status = target / ".status"
        if name == ".lease":
            _running(status)  # a lease matters only while the step is not done
            (target / ".lease").write_text(damage)
        else:
            status.write_text(status.read_text() + damage + "\n")
        refused = cli(exp, "run")
        assert refused.returncode == 2, (damage, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("error: step 'mid/m0': ") and expect in line and "--force" in line, line
        shown = cli(exp, "status", "--json")
        assert shown.returncode == 0, shown.stderr
        assert status_json(exp)["mid/m0"]["status"] == "CORRUPT"
        label = target.relative_to(exp.prefix).as_posix()
        detail = step_data.read_step(StepStore(LocalStorage()), str(exp.prefix), label)
        assert detail.corrupt and expect in detail.corrupt
        forced = cli(exp, "run", "--force", "^mid/m0$")
        assert forced.returncode == 0, (damage, forced.stderr)
        verify(exp)


def test_a_status_we_may_not_read_is_a_permission_error_not_corrupt(tmp_path, monkeypatch, capsys):
    """Tests run as root, where chmod denies nothing: the refusal is the operating system's
    PermissionError, raised by the one call that opens `.status` files on local disk."""
    import pipeline.storage.files as files
    from pipeline import ExecutorMainConfig, run_experiment
    from pipeline.cli import main
    from pipeline.errors import StorageAccessDenied

    prefix = str(tmp_path / "prefix")
    import experiments.hello as hello

    assert run_experiment([hello.summary], ExecutorMainConfig(prefix=prefix, backend="local")).ok
    (status,) = Path(prefix, "raw").glob("hello-*/.status")
    real_open = os.open

    def refusing(path, flags, *args):
        if str(path) == str(status):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(files.os, "open", refusing)
    with pytest.raises(StorageAccessDenied, match=f"cannot read {status}: permission denied"):
        run_experiment([hello.summary], ExecutorMainConfig(prefix=prefix, dry_run=True))
    monkeypatch.chdir(ROOT)
    for command in ("plan", "status"):
        assert main([command, "experiments/hello.py", "--prefix", prefix]) == 2
        err = capsys.readouterr().err
        assert f"cannot read {status}: permission denied" in err and "CORRUPT" not in err, err


def dashboard_pages(prefix: Path, step: Path) -> dict[str, int]:
    """The status code of each page and API answer that shows this step or its experiment."""
    from starlette.testclient import TestClient

    from pipeline.observe.dashboard.app import create_app

    client = TestClient(create_app(str(prefix)), base_url="http://127.0.0.1")
    label = step.relative_to(prefix).as_posix()
    (manifest,) = (prefix / "experiments").glob("*.json")
    paths = ["/", f"/experiments/{manifest.stem}", f"/steps/{label}", "/api/experiments"]
    paths += [f"/api/experiments/{manifest.stem}", f"/api/steps/{label}"]
    return {path: client.get(path).status_code for path in paths}


def test_numbers_out_of_range_are_corrupt_or_not_shown_never_a_crash(tmp_path):
    """Issue 29, part 5: `1e999` (read as infinity) and `1e300` are of the right JSON type but no
    clock or formatter takes them. In `.status` and `.lease` they are damage like a wrong type
    (CORRUPT, the usual way out); in a report, a metrics line or a manifest's timings they are
    not shown, and every page shows the rest."""
    running = '{"event": "RUNNING", "token": 9, "time": 1.0}'
    lease = '{"token": 9, "run_id": "r", "host": "h", "pid": 1, "pid_start": null, "expires": EXPIRES}'
    corrupt = [
        (".status", '{"event": "WARNING", "token": 1, "time": 1e999}', "time inf is not a usable time"),
        (".status", '{"event": "WARNING", "token": 1, "time": 1e300}', "time 1e+300 is not a usable time"),
        (".lease", lease.replace("EXPIRES", "1e999"), "expires inf is not a usable time"),
        (".lease", lease.replace("EXPIRES", "1e300"), "expires 1e+300 is not a usable time"),
    ]
    for i, (name, damage, expect) in enumerate(corrupt):
        exp = done_experiment(tmp_path / f"c{i}")
        target = step_dir(exp, "mid/m0")
        status = target / ".status"
        if name == ".lease":
            _running(status)
            (target / ".lease").write_text(damage)
        else:
            status.write_text(status.read_text() + damage + "\n")
        refused = cli(exp, "run")
        assert refused.returncode == 2, (damage, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith("error: step 'mid/m0': ") and expect in line and "--force" in line, line
        shown = cli(exp, "status")
        assert shown.returncode == 0 and "CORRUPT" in shown.stdout, shown.stderr
        assert status_json(exp)["mid/m0"]["status"] == "CORRUPT"
        assert set(dashboard_pages(exp.prefix, target).values()) == {200}, damage
        forced = cli(exp, "run", "--force", "^mid/m0$")
        assert forced.returncode == 0, (damage, forced.stderr)
        verify(exp)

    # A running step's report, a metrics line and a manifest's timings out of range.
    exp = done_experiment(tmp_path / "shown")
    target = step_dir(exp, "mid/m0")
    status = target / ".status"
    status.write_text(status.read_text() + running.replace("1.0", "2e9") + "\n")
    (target / ".progress").write_text(
        '{"done": 1e999, "total": 10, "unit": "steps", "time": 1e300, "token": 9, '
        '"data": {"eta_seconds": 1e999, "checkpoint_time": 1e300}}'
    )
    (target / "metrics.jsonl").write_text('{"step": 1e999, "loss": 2.0}\n{"step": 3, "loss": 1.0}\n')
    (manifest,) = (exp.prefix / "experiments").glob("*.json")
    data = json.loads(manifest.read_text())
    data["started"], data["updated"] = 1e300, 1e300
    for entry in data["steps"]:
        entry["started"], entry["duration"] = 1e300, 1e300
    manifest.write_text(json.dumps(data).replace("1e+300", "1e999", 1))
    for command in (["status"], ["status", "--json"]):
        shown = cli(exp, *command)
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert set(dashboard_pages(exp.prefix, target).values()) == {200}


@pytest.mark.parametrize(
    ("done", "total"), [(float("nan"), 10), (float("inf"), 10), (5, float("nan")), (1e308, 1e-308), ("x", 10)]
)
def test_progress_never_raises_whatever_it_is_given(tmp_path, done, total):
    from pipeline.run.in_step.step_events import StepContext, progress

    context = StepContext(output_path=str(tmp_path), run_id="r", token=1)
    assert progress(done, total, "steps", context=context) is False
