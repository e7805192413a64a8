"""The `drydock` command and `python FILE`, in real subprocesses: caching across processes,
concurrent runners, SIGKILL and Ctrl-C, JSON output, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.core.records import Event
from pipeline.storage.files import LocalStorage
from pipeline.storage.step_store import StepStore
from tests.pipeline.stepfns import calls

ROOT = Path(__file__).resolve().parents[3]
DRYDOCK = [sys.executable, "-m", "pipeline"]

EXPERIMENT = """
from pipeline import Step, executor_main, output_of, this_output, versioned
from tests.pipeline.stepfns import SleepConfig, WriteConfig, sleep_then_write, write_value

COUNTER = {counter!r}
A_VALUE = {a_value}
SLEEP = {sleep}
STARTED = {started!r}

layer1 = [
    Step(f"layer1/s{{i}}", sleep_then_write,
         SleepConfig(this_output(), versioned(SLEEP), COUNTER, f"l1-{{i}}", STARTED))
    for i in range(3)
]
a = Step("data/a", write_value, WriteConfig(this_output(), versioned(A_VALUE), COUNTER, "a",
                                            [output_of(s) for s in layer1]))
b = Step("data/b", write_value, WriteConfig(this_output(), versioned(10), COUNTER, "b", [output_of(a)]))

if __name__ == "__main__":
    executor_main([b], description="cli test")
"""


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    out.pop("DRYDOCK_PREFIX", None)
    return out


def write_experiment(tmp_path: Path, a_value: int = 1, sleep: float = 0.0, name: str = "exp.py") -> Path:
    path = tmp_path / name
    source = EXPERIMENT.format(
        counter=str(tmp_path / "calls"), a_value=a_value, sleep=sleep, started=str(tmp_path / "started")
    )
    path.write_text(textwrap.dedent(source))
    return path


def local(args: tuple[str, ...]) -> list[str]:
    """`drydock CMD FILE --backend local ...`: these tests are about the engine, not Ray."""
    return [*args[:2], "--backend", "local", *args[2:]] if len(args) >= 2 else list(args)


def drydock(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*DRYDOCK, *local(args)], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=timeout
    )


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*DRYDOCK, *local(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )


def wait_for_file(path: Path, lines: int = 1, timeout: float = 30) -> None:
    # Waits on an event another process writes to a file; bounded, no fixed sleep.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().split()) >= lines:
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} did not get {lines} line(s) within {timeout}s")


def step_dirs(prefix: Path) -> list[Path]:
    """Every step directory under the prefix (those with a .status)."""
    return sorted(p.parent for p in prefix.glob("*/*/.status"))


def test_run_twice_second_run_executes_nothing(tmp_path):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    first = drydock("run", str(exp), "--prefix", str(prefix))
    assert first.returncode == 0, first.stderr
    assert calls(str(tmp_path / "calls"), "a") == 1
    second = drydock("run", str(exp), "--prefix", str(prefix), "--json")
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)  # stdout holds the JSON and nothing else
    assert {s["state"] for s in out["steps"]} == {"CACHED"}
    for name in ["l1-0", "l1-1", "l1-2", "a", "b"]:
        assert calls(str(tmp_path / "calls"), name) == 1
    manifests = list((prefix / "experiments").glob("exp-*.json"))
    assert len(manifests) == 1
    manifest = json.loads(manifests[0].read_text())
    assert manifest["experiment"] == "exp" and manifest["finished"]
    assert {s["state"] for s in manifest["steps"]} == {"CACHED"}
    assert manifest["versions"]["python"]
    assert manifest["steps"][-1]["fn"] == "tests.pipeline.stepfns:write_value"


def test_plan_json_is_machine_readable_and_writes_nothing(tmp_path):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    result = drydock("plan", str(exp), "--prefix", str(prefix), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [s["name"] for s in plan["steps"]] == ["layer1/s0", "layer1/s1", "layer1/s2", "data/a", "data/b"]
    for s in plan["steps"]:
        assert {"name", "hash", "output_path", "state", "reason"} <= s.keys()
        assert s["state"] == "RUN" and s["reason"] == "no output yet"
        assert s["output_path"] == f"{prefix}/{s['name']}-{s['hash']}"
    assert not prefix.exists()


def test_python_file_and_dry_run_flag(tmp_path):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    result = subprocess.run(
        [sys.executable, str(exp), "--prefix", str(prefix), "--backend", "local", "--dry_run", "true"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Plan" in result.stdout and "data/b-" in result.stdout
    assert not prefix.exists()
    bare = subprocess.run(
        [sys.executable, str(exp), "--prefix", str(prefix), "--dry_run"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert bare.returncode == 0, bare.stderr


def test_changed_versioned_value_reruns_downstream_only(tmp_path):
    prefix = tmp_path / "prefix"
    assert drydock("run", str(write_experiment(tmp_path)), "--prefix", str(prefix)).returncode == 0
    changed = write_experiment(tmp_path, a_value=2, name="exp2.py")
    plan = json.loads(drydock("plan", str(changed), "--prefix", str(prefix), "--json").stdout)
    assert {s["name"]: s["state"] for s in plan["steps"]} == {
        "layer1/s0": "CACHED",
        "layer1/s1": "CACHED",
        "layer1/s2": "CACHED",
        "data/a": "RUN",
        "data/b": "RUN",
    }
    assert drydock("run", str(changed), "--prefix", str(prefix)).returncode == 0
    counter = str(tmp_path / "calls")
    assert [calls(counter, n) for n in ["l1-0", "a", "b"]] == [1, 2, 2]


def test_two_concurrent_runs_execute_every_step_once(tmp_path):
    exp, prefix = write_experiment(tmp_path, sleep=0.4), tmp_path / "prefix"
    args = ("run", str(exp), "--prefix", str(prefix), "--wait_poll_interval", "0.05")
    procs = [start(*args), start(*args)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    assert any("by another runner" in err or "WAIT" in err for _out, err in outs), "the runs did not overlap"
    counter = str(tmp_path / "calls")
    assert {n: calls(counter, n) for n in ["l1-0", "l1-1", "l1-2", "a", "b"]} == dict.fromkeys(
        ["l1-0", "l1-1", "l1-2", "a", "b"], 1
    )
    store = StepStore(LocalStorage())
    for d in step_dirs(prefix):
        events = [e.event for e in store.events(str(d))]
        assert events == [Event.RUNNING, Event.SUCCESS], (d, events)


def test_sigkill_mid_step_next_run_takes_over_at_once(tmp_path):
    exp, prefix = write_experiment(tmp_path, sleep=30), tmp_path / "prefix"
    proc = start("run", str(exp), "--prefix", str(prefix), "--max_concurrent", "1")
    wait_for_file(tmp_path / "started")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    store = StepStore(LocalStorage())
    killed = [d for d in prefix.glob("layer1/*") if store.events(str(d))]
    assert len(killed) == 1
    assert [e.event for e in store.events(str(killed[0]))] == [Event.RUNNING]  # never SUCCESS
    assert not (killed[0] / "done").exists()
    # The next run does not wait out the 90 s lease: the owner process is gone.
    plan = json.loads(drydock("plan", str(exp), "--prefix", str(prefix), "--json").stdout)
    reasons = {s["output_path"]: (s["state"], s["reason"]) for s in plan["steps"]}
    state, reason = reasons[str(killed[0])]
    assert state == "RUN" and reason.startswith("previous attempt was interrupted (its runner, pid"), reason


def test_sigkill_then_rerun_completes(tmp_path):
    exp, prefix = write_experiment(tmp_path, sleep=0.5), tmp_path / "prefix"
    proc = start("run", str(exp), "--prefix", str(prefix), "--max_concurrent", "1")
    wait_for_file(tmp_path / "started")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    result = drydock("run", str(exp), "--prefix", str(prefix), "--json")
    assert result.returncode == 0, result.stderr
    states = {s["name"]: s["state"] for s in json.loads(result.stdout)["steps"]}
    assert set(states.values()) <= {"SUCCEEDED", "CACHED"}
    store = StepStore(LocalStorage())
    for d in step_dirs(prefix):
        events = store.events(str(d))
        assert events[-1].event == Event.SUCCESS
        # Every SUCCESS follows a RUNNING with the same token: the function returned in that attempt.
        assert events[-2].event == Event.RUNNING and events[-2].token == events[-1].token
        assert (d / "done").exists() or (d / "value.json").exists()


def test_ctrl_c_cancels_cleanly_and_releases_leases(tmp_path):
    exp, prefix = write_experiment(tmp_path, sleep=30), tmp_path / "prefix"
    proc = start("run", str(exp), "--prefix", str(prefix), "--max_concurrent", "1")
    wait_for_file(tmp_path / "started")
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    store = StepStore(LocalStorage())
    started = [d for d in prefix.glob("layer1/*") if store.events(str(d))]
    assert len(started) == 1
    assert [e.event for e in store.events(str(started[0]))] == [Event.RUNNING, Event.CANCELLED]
    assert store.lease(str(started[0])).released
    manifest = json.loads(next((prefix / "experiments").glob("*.json")).read_text())
    assert manifest["exit_code"] == 130


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("Step('a b', write_value, WriteConfig(this_output()))", "name part 'a b'"),
        ("Step('../x', write_value, WriteConfig(this_output()))", "name part '..'"),
        ("Step('x', write_value, {'output': this_output()})", "config must be a dataclass"),
        ("Step('x', lambda c: None, WriteConfig(this_output()))", "lambda"),
        ("Step('x', write_value, WriteConfig(this_output(), value=versioned({1, 2})))", "field `value`"),
    ],
)
def test_bad_declarations_exit_2_with_one_line_and_write_nothing(tmp_path, source, message):
    exp = tmp_path / "bad.py"
    exp.write_text(
        "from pipeline import Step, executor_main, this_output, versioned\n"
        "from tests.pipeline.stepfns import WriteConfig, write_value\n"
        f"step = {source}\n"
        "if __name__ == '__main__':\n    executor_main([step])\n"
    )
    prefix = tmp_path / "prefix"
    result = drydock("run", str(exp), "--prefix", str(prefix))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not prefix.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus"),
        (["--backend", "nope"], "unknown backend 'nope'"),
        (["--max_concurrent", "zero"], "max_concurrent"),
        (["--only", "("], "invalid regular expression"),
        (["--log_level", "chatty"], "unknown log level 'chatty'"),
        (["--wait_poll_interval", "-1"], "field `--wait_poll_interval`: must be positive"),
    ],
)
def test_bad_options_exit_2(tmp_path, args, message):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    result = drydock("run", str(exp), "--prefix", str(prefix), *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not prefix.exists()


def test_cli_usage_errors(tmp_path):
    assert drydock().returncode == 2
    assert "unknown command" in drydock("launch", "x.py").stderr
    assert "does not exist" in drydock("run", str(tmp_path / "missing.py")).stderr
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    result = drydock("run", str(empty))
    assert result.returncode == 2 and "did not call executor_main" in result.stderr


@pytest.mark.parametrize(
    "command", ["run", "plan", "status", "rerun", "dag", "explain", "compare", "gc", "pin", "adopt"]
)
def test_a_commands_help_before_its_file_is_its_usage(command):
    """`drydock rerun --help` with no manifest yet: the command's usage, exit 0."""
    result = drydock(command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: drydock {command} ") and not result.stderr


def test_an_experiments_help_lists_each_option_once_and_ends_cleanly(tmp_path):
    result = drydock("run", str(write_experiment(tmp_path)), "--help")
    assert result.returncode == 0 and not result.stderr, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.startswith("  --")]
    assert "--ray" in listed and len(listed) == len(set(listed)), listed


def test_status_shows_what_storage_says(tmp_path):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    drydock("run", str(exp), "--prefix", str(prefix), "--only", "layer1/s0")
    result = drydock("status", str(exp), "--prefix", str(prefix), "--json")
    assert result.returncode == 0, result.stderr
    status = {s["name"]: s["status"] for s in json.loads(result.stdout)["steps"]}
    assert status == {
        "layer1/s0": "SUCCESS",
        "layer1/s1": None,
        "layer1/s2": None,
        "data/a": None,
        "data/b": None,
    }
    table = drydock("status", str(exp), "--prefix", str(prefix))
    assert "SUCCESS" in table.stdout and "NOT STARTED" in table.stdout
    # A corrupt .status: planning refuses with one line, status shows it, --force is the way out.
    (status_file,) = prefix.glob("layer1/s0-*/.status")
    status_file.write_text("{not json\n")
    refused = drydock("run", str(exp), "--prefix", str(prefix))
    assert refused.returncode == 2 and "line 1 is corrupt" in refused.stderr
    shown = json.loads(drydock("status", str(exp), "--prefix", str(prefix), "--json").stdout)
    assert shown["steps"][0]["status"] == "CORRUPT"
    assert drydock("run", str(exp), "--prefix", str(prefix), "--force", "layer1/s0").returncode == 0


def test_json_stdout_stays_clean_when_steps_print(tmp_path):
    exp = tmp_path / "printer.py"
    exp.write_text(
        "from pipeline import Step, executor_main, this_output, versioned\n"
        "from tests.pipeline.stepfns import SleepConfig, sleep_then_write\n"
        "config = SleepConfig(this_output(), versioned(0.0), started_file='/dev/stdout')\n"
        "step = Step('noisy', sleep_then_write, config)\n"
        "if __name__ == '__main__':\n    executor_main([step])\n"
    )
    result = drydock("run", str(exp), "--prefix", str(tmp_path / "prefix"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["steps"][0]["state"] == "SUCCEEDED"


def test_a_fully_cached_run_does_not_start_ray(tmp_path):
    exp, prefix = write_experiment(tmp_path), tmp_path / "prefix"
    assert drydock("run", str(exp), "--prefix", str(prefix)).returncode == 0
    code = textwrap.dedent(f"""
        import sys
        from pipeline.cli import main
        code = main(["run", {str(exp)!r}, "--prefix", {str(prefix)!r}, "--backend", "ray"])
        print(code, "ray" in sys.modules)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT)
    assert result.stdout.strip().splitlines()[-1] == "0 False", result.stderr


def test_engine_imports_no_ml_library(tmp_path):
    exp = write_experiment(tmp_path)
    code = textwrap.dedent(f"""
        import sys
        from pipeline.cli import main
        main(["run", {str(exp)!r}, "--prefix", {str(tmp_path / "prefix")!r}, "--backend", "local"])
        heavy = ("jax", "levanter", "ray", "torch", "haliax", "tensorflow")
        heavy = sorted(m for m in heavy if m in sys.modules)
        print("heavy modules:", ",".join(heavy) or "none")
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "heavy modules: none"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "import nosuchmodule_for_drydock\n",
            "ModuleNotFoundError: No module named 'nosuchmodule_for_drydock' (FILE:1)",
        ),
        (
            "x = 1\nfrom pipeline import nonexistent_name\n",
            "ImportError: cannot import name 'nonexistent_name'",
        ),
        ("def broken(:\n    pass\n", "SyntaxError: invalid syntax"),
        (
            "from steps.training.train_moe import OptimizerSpec\n\nOptimizerSpec(learning_rat=3e-3)\n",
            "TypeError: OptimizerSpec.__init__() got an unexpected keyword argument 'learning_rat' (FILE:3)",
        ),
        ("x = 1\ny = undefined_name + x\n", "NameError: name 'undefined_name' is not defined (FILE:2)"),
    ],
)
def test_an_experiment_file_that_cannot_load_is_one_line_and_exit_2(tmp_path, source, message):
    path = tmp_path / "exp.py"
    path.write_text(source)
    result = drydock("run", str(path), "--prefix", str(tmp_path / "prefix"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot load experiment file {path}: "), lines
    assert message.replace("FILE", str(path)) in lines[0]
    assert not (tmp_path / "prefix").exists()


def test_a_closed_stdout_pipe_ends_quietly(tmp_path):
    """`drydock plan FILE | head -1`: the reader goes away; no BrokenPipeError traceback."""
    for command in (
        [*DRYDOCK, "plan", "experiments/moe_535b_a23b.py", "--prefix", str(tmp_path), "--json"],
        [
            sys.executable,
            "experiments/moe_535b_a23b.py",
            "--prefix",
            str(tmp_path),
            "--dry_run",
            "true",
            "--json",
        ],
    ):
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), cwd=ROOT
        )
        assert process.stdout is not None and process.stderr is not None
        # Read nothing and close: the plan (about 60 KB of JSON with --json) then fills the pipe.
        process.stdout.close()
        err = process.stderr.read().decode()
        assert process.wait(60) == 141, err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_drydock_dag_draws_a_non_blocking_input_dashed(tmp_path):
    path = tmp_path / "follow.py"
    path.write_text(
        textwrap.dedent(
            """
            from pipeline import Step, executor_main, output_of, this_output
            from tests.pipeline.stepfns import WriteConfig, write_value

            train = Step("train", write_value, WriteConfig(this_output()))
            follows = [output_of(train, blocking=False)]
            follower = Step("eval", write_value, WriteConfig(this_output(), inputs=follows))
            if __name__ == "__main__":
                executor_main([follower])
            """
        )
    )
    mermaid = drydock("dag", str(path), "--prefix", str(tmp_path / "p"))
    assert mermaid.returncode == 0, mermaid.stderr
    assert " -.-> " in mermaid.stdout and " --> " not in mermaid.stdout
    dot = drydock("dag", str(path), "--prefix", str(tmp_path / "p"), "--format", "dot")
    assert "[style=dashed]" in dot.stdout


def test_small_wording(tmp_path):
    """One step is `1 step`; `explain` counts the fields it lists; `--help` says each default once."""
    path = tmp_path / "one.py"
    path.write_text(
        textwrap.dedent(
            """
            from pipeline import Step, executor_main, this_output, versioned
            from tests.pipeline.stepfns import WriteConfig, write_value

            one = Step("one", write_value, WriteConfig(this_output(), versioned(3)))
            if __name__ == "__main__":
                executor_main([one])
            """
        )
    )
    plan = drydock("plan", str(path), "--prefix", str(tmp_path / "p"))
    assert "— 1 step (" in plan.stdout, plan.stdout
    explained = subprocess.run(
        [*DRYDOCK, "explain", str(path), "one", "--prefix", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    ).stdout.splitlines()
    (header,) = [line for line in explained if "versioned fields (" in line]
    count = int(header.split("(")[1].split(")")[0])
    start = explained.index(header)
    listed = [line for line in explained[start + 1 :] if line.startswith("      ")]
    assert count == len(listed) >= 1
    helped = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60
    )
    assert helped.returncode == 0 and "(default: None)" not in helped.stdout
    assert "(default: 90.0)" in " ".join(helped.stdout.split())  # a default the text does not say


@pytest.mark.parametrize("latest", [False, True], ids=["file", "latest"])
def test_a_watch_started_before_the_run_follows_it_to_the_end(tmp_path, latest):
    """`drydock status FILE --watch` (or `status --latest --watch`) in a second terminal a moment
    before `drydock run FILE`: it waits for the run and follows it."""
    exp, prefix = write_experiment(tmp_path, sleep=0.5), tmp_path / "prefix"
    target = ["--latest"] if latest else [str(exp)]
    watcher = subprocess.Popen(
        [*DRYDOCK, "status", *target, "--prefix", str(prefix), "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    # The watch is up and waits, having seen nothing running: it says so on stderr.
    assert watcher.stderr is not None
    first = ""
    while "waiting" not in first:
        line = watcher.stderr.readline()
        assert line, (first, watcher.communicate())  # it ended instead
        first += line
    assert watcher.poll() is None
    run = drydock("run", str(exp), "--prefix", str(prefix))
    assert run.returncode == 0, run.stderr
    # The run says where its manifest is as it starts, for a watcher by manifest.
    assert "follow it with: drydock status " in run.stderr and "--watch" in run.stderr
    out, err = watcher.communicate(timeout=60)
    assert watcher.returncode == 0, first + err
    assert "5 success" in out  # the last table: every step done


def test_status_latest_and_a_prefix_that_does_not_exist(tmp_path):
    prefix = tmp_path / "prefix"
    missing = drydock("status", str(write_experiment(tmp_path)), "--prefix", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "does not exist: nothing has run there" in missing.stderr
    none_yet = subprocess.run(
        [*DRYDOCK, "status", "--latest", "--prefix", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert none_yet.returncode == 2 and "does not exist" in none_yet.stderr
    assert drydock("run", str(write_experiment(tmp_path, a_value=1)), "--prefix", str(prefix)).returncode == 0
    assert (
        drydock(
            "run", str(write_experiment(tmp_path, a_value=2, name="other.py")), "--prefix", str(prefix)
        ).returncode
        == 0
    )
    latest = subprocess.run(
        [*DRYDOCK, "status", "--latest", "--prefix", str(prefix), "--json"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert latest.returncode == 0, latest.stderr
    names = {s["name"] for s in json.loads(latest.stdout)["steps"]}
    assert "data/a" in names
    # The newest run is other.py's: its data/a has the new identity (value 2).
    labels = [s["label"] for s in json.loads(latest.stdout)["steps"] if s["name"] == "data/a"]
    other = subprocess.run(
        [*DRYDOCK, "plan", str(tmp_path / "other.py"), "--prefix", str(prefix), "--json"],
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert labels == [s["label"] for s in json.loads(other.stdout)["steps"] if s["name"] == "data/a"]


def test_a_mutable_config_class_is_warned_about_and_errors_stay_on_one_line(tmp_path):
    path = tmp_path / "mutable.py"
    path.write_text(
        textwrap.dedent(
            """
            import os
            from dataclasses import dataclass
            from pipeline import Step, executor_main, this_output

            @dataclass
            class Loose:
                output: str

            def fail(config: Loose) -> None:
                os.makedirs(config.output, exist_ok=True)
                raise RuntimeError("a long error message " * 12)

            step = Step("loose", fail, Loose(this_output()))
            if __name__ == "__main__":
                executor_main([step])
            """
        )
    )
    result = drydock("run", str(path), "--prefix", str(tmp_path / "p"))
    assert result.returncode == 1
    assert "config class Loose is not frozen" in result.stderr
    # The end-of-run table, read from a pipe, keeps the failed step's error on one line.
    (row,) = [
        line
        for line in result.stderr.splitlines()
        if "FAILED" in line and "loose-" in line and ":" not in line[:9]
    ]
    assert "RuntimeError: a long error message" in row


FOLLOWED = """
from pipeline import Resources, Step, executor_main, output_of, this_output
from tests.pipeline.run.backends.rayfns import FollowConfig, ProduceConfig, follow_items, produce

train = Step("train/x", produce, ProduceConfig(this_output()), resources=Resources(cpus={cpus}))
followers = [
    Step(f"evaluate/{{kind}}", follow_items, FollowConfig(this_output(), output_of(train, blocking=False)))
    for kind in ("loss", "tasks")
]
if __name__ == "__main__":
    executor_main(followers)
"""


@pytest.mark.parametrize(("cpus", "warned"), [(1, True), (0, False)])
def test_plan_warns_when_a_training_and_its_followers_cannot_run_at_once(tmp_path, cpus, warned):
    exp = tmp_path / "followed.py"
    exp.write_text(FOLLOWED.format(cpus=cpus))
    command = [*DRYDOCK, "plan", str(exp), "--prefix", str(tmp_path / "p"), "--ray.num_cpus", "2"]
    result = subprocess.run(command, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    warning = (
        "warning: step 'train/x' and the 2 step(s) that follow it (evaluate/loss, evaluate/tasks) need "
        "3 CPU at once; the cluster has 2: the followers start once it has started"
    )
    assert (warning in result.stderr) is warned, result.stderr
    as_json = subprocess.run(
        [*command, "--json"], capture_output=True, text=True, env=env(), cwd=ROOT, timeout=60
    )
    assert bool(json.loads(as_json.stdout).get("warnings")) is warned
