"""`drydock adopt`: an existing directory becomes a step's committed output, downstream builds on it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.observe.prune import plan_gc
from pipeline.processes import current_owner
from pipeline.storage.opening import open_storage

ROOT = Path(__file__).resolve().parents[3]


def drydock(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_adopted_directory_is_cached_used_downstream_explained_and_kept(tmp_path):
    prefix = str(tmp_path / "prefix")
    made_by_hand = tmp_path / "old-rows"
    made_by_hand.mkdir()
    # Rows made before Drydock, all with value 9 (write_rows would give i * 7 % 10).
    (made_by_hand / "rows.jsonl").write_text(
        "".join(json.dumps({"id": i, "value": 9}) + "\n" for i in range(10))
    )
    (made_by_hand / ".status").write_text("not Drydock's: left behind\n")

    adopted = drydock("adopt", "experiments/hello.py", "raw/hello", str(made_by_hand), "--prefix", prefix)
    assert adopted.returncode == 0, adopted.stderr
    assert f"adopted {made_by_hand} (1 files) as raw/hello-" in adopted.stdout
    (step_dir,) = Path(prefix, "raw").glob("hello-*")
    step_json = json.loads((step_dir / ".step.json").read_text())
    assert step_json["adopted"]["from"] == str(made_by_hand) and "@" in step_json["adopted"]["by"]
    last = json.loads((step_dir / ".status").read_text().splitlines()[-1])
    assert last["event"] == "SUCCESS" and last["data"]["adopted"]["from"] == str(made_by_hand)

    # The run builds on it: raw/hello cached with no drift note, counts/hello reads the adopted rows.
    run = drydock("run", "experiments/hello.py", "--prefix", prefix, "--backend", "local", "--json")
    assert run.returncode == 0, run.stderr
    states = {s["name"]: (s["state"], s["reason"]) for s in json.loads(run.stdout)["steps"]}
    assert states["raw/hello"] == ("CACHED", "cached")
    (counts_dir,) = Path(prefix, "counts").glob("hello-*")
    assert json.loads((counts_dir / "counts.json").read_text()) == {"rows": 10, "above": 10}

    explained = drydock("explain", "experiments/hello.py", "raw/hello", "--prefix", prefix)
    assert explained.returncode == 0, explained.stderr
    assert f"adopted:  not made by a run: {made_by_hand} adopted by " in explained.stdout

    # gc keeps it even when no manifest lists it: it may exist nowhere else.
    shutil.rmtree(Path(prefix, "experiments"))
    plan = plan_gc(
        open_storage(prefix),
        prefix,
        keep=None,
        older_than=None,
        now=time.time(),
        local_host=current_owner().host,
    )
    reasons = {d.label: d.keep_reason for d in plan.keep}
    assert reasons[step_dir.relative_to(prefix).as_posix()] == "pinned"
    assert any(d.label.startswith("counts/hello-") for d in plan.delete)

    again = drydock("adopt", "experiments/hello.py", "raw/hello", str(made_by_hand), "--prefix", prefix)
    assert again.returncode == 2
    assert again.stderr.startswith("error: step 'raw/hello', field `STEP`: raw/hello-")
    assert "is already committed" in again.stderr


def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path):
    prefix = tmp_path / "prefix"
    empty = tmp_path / "empty"
    empty.mkdir()
    a_file = tmp_path / "rows.jsonl"
    a_file.write_text("{}\n")
    cases = [
        (str(tmp_path / "missing"), f"step 'raw/hello', field `from`: {tmp_path / 'missing'} does not exist"),
        (str(empty), f"step 'raw/hello', field `from`: {empty} is empty: there is nothing to adopt"),
        (str(a_file), f"step 'raw/hello', field `from`: {a_file} is a file, not a directory"),
    ]
    for source, message in cases:
        result = drydock("adopt", "experiments/hello.py", "raw/hello", source, "--prefix", str(prefix))
        assert result.returncode == 2 and result.stderr.strip() == f"error: {message}", result.stderr
    result = drydock("adopt", "experiments/hello.py", "raw/helo", str(empty), "--prefix", str(prefix))
    assert result.returncode == 2 and "no step named 'raw/helo'" in result.stderr
    assert "did you mean raw/hello?" in result.stderr
    assert not list(prefix.glob("raw/hello-*/.status"))  # nothing committed, nothing started


def test_adopting_into_an_object_store_prefix_from_local_disk_and_from_the_store(tmp_path):
    # (hello's step functions read local files only: the plan shows the adopted step committed)
    import fsspec

    import experiments.hello as hello
    from pipeline import ExecutorMainConfig, run_experiment
    from pipeline.core.dag import build_dag
    from pipeline.run.scheduler.adopt import adopt
    from pipeline.storage.step_store import StepStore
    from tests.s3server import s3_bucket_environment

    with s3_bucket_environment("drydock-adopt"):
        fs = fsspec.filesystem("s3")
        rows = "".join(json.dumps({"id": i, "value": 5}) + "\n" for i in range(4)).encode()
        local = tmp_path / "rows"
        local.mkdir()
        (local / "rows.jsonl").write_bytes(rows)
        fs.pipe_file("drydock-adopt/old/rows/rows.jsonl", rows)
        for n, source in enumerate([str(local), "s3://drydock-adopt/old/rows"]):
            prefix = f"s3://drydock-adopt/runs-{n}"
            dag = build_dag([hello.counts], prefix)
            (label,) = [label for label in dag.nodes if label.startswith("raw/hello-")]
            adopt(dag, StepStore(open_storage(prefix)), label, source, current_owner())
            assert fs.cat_file(f"drydock-adopt/runs-{n}/{label}/rows.jsonl") == rows
            plan = run_experiment([hello.counts], ExecutorMainConfig(prefix=prefix, dry_run=True))
            assert plan.steps[label].state.value == "CACHED" and plan.steps[label].reason == "cached"


def step_dir_of(prefix: Path) -> Path | None:
    found = list(prefix.glob("raw/hello-*"))
    return found[0] if found else None


def test_entries_that_may_not_be_copied_are_refused_in_one_line_and_nothing_is_written(tmp_path):
    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = hunter2\n")
    cases = {
        "a link leaving FROM": lambda d: (d / "creds").symlink_to(secret),
        "a dangling or looping link": lambda d: (d / "gone").symlink_to(d / "nowhere"),
        "a dangling or looping link ": lambda d: (
            (d / "a").symlink_to(d / "b"),
            (d / "b").symlink_to(d / "a"),
        ),
        "a named pipe": lambda d: os.mkfifo(d / "sub" / "pipe"),
        "a link leaving FROM ": lambda d: (d / "up").symlink_to(tmp_path),  # to a directory
    }
    for n, (what, make) in enumerate(cases.items()):
        source = tmp_path / f"from-{n}"
        (source / "sub").mkdir(parents=True)
        (source / "rows.jsonl").write_text('{"id": 0, "value": 1}\n')
        (source / "sub" / "more.jsonl").write_text('{"id": 1, "value": 2}\n')
        make(source)
        prefix = tmp_path / f"prefix-{n}"
        result = drydock("adopt", "experiments/hello.py", "raw/hello", str(source), "--prefix", str(prefix))
        assert result.returncode == 2, (what, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(
            f"error: step 'raw/hello', field `from`: {source} holds entries adopt does not"
        )
        assert f"({what.strip()})" in lines[0], lines[0]
        step_dir = step_dir_of(prefix)
        assert step_dir is None or not any(step_dir.iterdir()), list(step_dir.iterdir())
        assert "hunter2" not in "".join(p.read_text() for p in prefix.rglob("*") if p.is_file())


def test_a_link_to_a_directory_inside_from_is_skipped_and_said_so(tmp_path):
    source = tmp_path / "from"
    (source / "step-100").mkdir(parents=True)
    (source / "step-100" / "rows.jsonl").write_text('{"id": 0, "value": 1}\n')
    (source / "latest").symlink_to(source / "step-100")
    (source / "rows.jsonl").symlink_to(source / "step-100" / "rows.jsonl")  # a file link inside: copied
    prefix = tmp_path / "prefix"
    result = drydock("adopt", "experiments/hello.py", "raw/hello", str(source), "--prefix", str(prefix))
    assert result.returncode == 0, result.stderr
    assert "skipped 1: latest -> " in result.stdout and "a link to a directory inside FROM" in result.stdout
    step_dir = step_dir_of(prefix)
    assert step_dir is not None
    assert sorted(
        p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if not p.name.startswith(".")
    ) == [
        "rows.jsonl",
        "step-100",
        "step-100/rows.jsonl",
    ]
    assert not (step_dir / "rows.jsonl").is_symlink()


def test_a_stalled_adopt_loses_its_lease_and_leaves_the_new_owners_output_alone(tmp_path):
    # 6,000 small files: the copy takes seconds, long enough to freeze the adopt in the middle.
    source = tmp_path / "from"
    for i in range(60):
        shard = source / f"shard-{i:02d}"
        shard.mkdir(parents=True)
        for j in range(100):
            (shard / f"part-{j:03d}.txt").write_text(f"{i} {j}\n")
    (source / "rows.jsonl").write_text("".join(json.dumps({"id": i, "value": 9}) + "\n" for i in range(10)))
    prefix = tmp_path / "prefix"
    lease = ["--lease_timeout", "3", "--heartbeat_interval", "0.5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    command = ["adopt", "experiments/hello.py", "raw/hello", str(source), "--prefix", str(prefix), *lease]
    adopter = subprocess.Popen(
        [sys.executable, "-m", "pipeline", *command],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            step_dir = step_dir_of(prefix)
            staged = list(step_dir.glob(".tmp-adopt-*/shard-0*")) if step_dir else []
            if len(staged) >= 2 or adopter.poll() is not None:
                break
            time.sleep(0.02)
        assert adopter.poll() is None, "the copy finished before it could be frozen; make FROM larger"
        os.kill(adopter.pid, signal.SIGSTOP)  # a paused VM, a long GC stall
        assert step_dir is not None
        assert not (step_dir / "shard-00").exists()  # staged, not visible as output
        # A runner on the same prefix sees the lease unchanged for its timeout, takes the step
        # over, and commits its own output.
        run = drydock("run", "experiments/hello.py", "--prefix", str(prefix), "--backend", "local", *lease)
        assert run.returncode == 0, run.stderr
    finally:
        os.kill(adopter.pid, signal.SIGCONT)
    out, err = adopter.communicate(timeout=120)
    assert adopter.returncode == 2, (out, err)
    assert "lease lost while adopting" in err and "nothing committed" in err, err
    # The new owner's output is exactly what its run wrote: no adopted file, no staging left.
    assert sorted(p.name for p in step_dir.iterdir() if not p.name.startswith(".")) == ["rows.jsonl"]
    assert not list(step_dir.glob(".tmp-*"))
    rows = [json.loads(line) for line in (step_dir / "rows.jsonl").read_text().splitlines()]
    assert [r["value"] for r in rows] == [i * 7 % 10 for i in range(10)]
    assert "adopted" not in json.loads((step_dir / ".step.json").read_text())
    last = json.loads((step_dir / ".status").read_text().splitlines()[-1])
    assert last["event"] == "SUCCESS" and "adopted" not in (last.get("data") or {})


KILLED_MID_PROMOTION = """
import os, signal, sys
import pipeline.run.scheduler.adopt as adopt

def half_then_killed(storage, staging, names, directory, check):
    # Move half the staged entries into the step directory as promote does, then die as SIGKILL
    # does: no finally clause, no cleanup, the lease left to expire.
    tops = sorted({name.split("/", 1)[0] for name in names})
    for top in tops[: len(tops) // 2]:
        os.replace(f"{staging}/{top}", f"{directory}/{top}")
    os.kill(os.getpid(), signal.SIGKILL)

adopt.promote = half_then_killed
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_attempt_after_an_adopt_killed_mid_promotion_commits_only_its_own_output(tmp_path):
    """Regression: an adopt killed while moving its staged files in left them in the step
    directory, and the next run's attempt committed its own output with them mixed in."""
    source = tmp_path / "from"
    for i in range(40):
        (source / f"shard-{i:02d}").mkdir(parents=True)
        (source / f"shard-{i:02d}" / "part.txt").write_text(f"{i}\n")
    (source / "rows.jsonl").write_text(json.dumps({"id": 0, "value": 9}) + "\n")
    prefix = tmp_path / "prefix"
    lease = ["--lease_timeout", "2", "--heartbeat_interval", "0.5"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    command = ["adopt", "experiments/hello.py", "raw/hello", str(source), "--prefix", str(prefix), *lease]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MID_PROMOTION, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    step_dir = step_dir_of(prefix)
    assert step_dir is not None
    moved_in = [p.name for p in step_dir.iterdir() if not p.name.startswith(".")]
    assert len(moved_in) == 20 and "rows.jsonl" in moved_in  # what the run below starts from

    run = drydock("run", "experiments/hello.py", "--prefix", str(prefix), "--backend", "local", *lease)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in step_dir.iterdir() if not p.name.startswith(".")) == ["rows.jsonl"]
    assert "removed 20 entries an interrupted `drydock adopt` had moved in" in run.stderr
    rows = [json.loads(line) for line in (step_dir / "rows.jsonl").read_text().splitlines()]
    assert [r["value"] for r in rows] == [i * 7 % 10 for i in range(10)]
    assert not (step_dir / ".adopting").exists()
