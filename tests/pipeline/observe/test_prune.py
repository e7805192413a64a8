"""Garbage collection never deletes a referenced, pinned, running or leased step output."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.core.lease import Owner
from pipeline.core.records import Event
from pipeline.errors import StepDeclarationError, StorageError
from pipeline.observe.prune import (
    delete_planned,
    parse_age,
    pin,
    plan_gc,
    resolve_step_dir,
)
from pipeline.observe.render import format_size
from pipeline.processes import current_owner
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.files import LocalStorage
from pipeline.storage.prefix_walk import find_step_dirs
from pipeline.storage.step_store import StepStore
from tests.pipeline.stepfns import WriteConfig, write_value


def steps(value: int) -> list[Step]:
    a = Step("data/a", write_value, WriteConfig(this_output(), versioned(value), None, "a"))
    b = Step("train/deep/b", write_value, WriteConfig(this_output(), versioned(1), None, "b", [output_of(a)]))
    return [b]


def run(value: int, prefix: Path, experiment: str) -> RunReport:
    config = ExecutorMainConfig(prefix=str(prefix), backend="local", experiment=experiment)
    report = run_experiment(steps(value), config)
    assert isinstance(report, RunReport) and report.ok
    return report


def labels(report: RunReport) -> set[str]:
    return set(report.plan.dag.nodes)


@pytest.fixture
def prefix(tmp_path: Path) -> Path:
    """Two experiments (`one` and `two`) sharing nothing, plus three steps no manifest lists:
    one RUNNING here, one whose runner failed but still holds a live lease, one RUNNING whose
    runner is gone."""
    root = tmp_path / "prefix"
    run(1, root, "one")
    run(2, root, "two")
    store = StepStore(LocalStorage())
    me = current_owner()
    store.acquire(f"{root}/loose/running-00000000000a", me, 3600)
    token = store.acquire(f"{root}/loose/leased-00000000000b", me, 3600).token
    store.append(f"{root}/loose/leased-00000000000b", me, token, Event.FAILED, "boom")  # lease kept
    ghost = Owner("ghost0000000", me.host, 2**22 + 4321, None)
    store.acquire(f"{root}/loose/stale-00000000000c", ghost, 3600)
    return root


def gc_plan(prefix: Path, keep=None, older_than=None, now=None):
    now = time.time() if now is None else now
    return plan_gc(
        LocalStorage(),
        str(prefix),
        keep=keep,
        older_than=older_than,
        now=now,
        local_host=current_owner().host,
    )


def test_finds_step_dirs_at_any_depth_and_not_inside_them(prefix):
    found = {p[len(str(prefix)) + 1 :] for p in find_step_dirs(LocalStorage(), str(prefix))}
    assert len(found) == 7
    assert {f for f in found if f.startswith("train/deep/b-")}  # nested names
    assert not any(f.startswith("experiments") for f in found)


def test_by_default_every_manifest_is_kept(prefix):
    plan = gc_plan(prefix)
    assert len(plan.manifests) == 2
    assert plan.delete == ()
    reasons = {d.label.split("-")[0]: d.keep_reason for d in plan.keep}
    assert reasons["loose/running"] == "RUNNING"
    assert reasons["loose/leased"].startswith("leased by run ")
    assert reasons["loose/stale"] == "RUNNING"  # a stale RUNNING is left for a rerun to take over


def test_keeping_one_manifest_deletes_the_rest_but_never_pinned_or_running(prefix, tmp_path):
    storage = LocalStorage()
    two = run(2, prefix, "two")  # cached: same labels as the first run of `two`
    two_dirs = sorted(two.plan.dag.nodes[label].output_path for label in two.plan.dag.nodes)
    pinned_dir = two_dirs[0]
    pin(storage, pinned_dir, now=time.time())
    plan = gc_plan(prefix, keep=["one"])
    (manifest,) = plan.manifests
    assert os.path.basename(manifest).startswith("one-")
    assert {d.path for d in plan.delete} == set(two_dirs) - {pinned_dir}
    assert all(d.size > 0 for d in plan.delete)
    deleted, skipped = delete_planned(storage, plan, now=time.time(), local_host=current_owner().host)
    assert skipped == [] and {d.path for d in deleted} == set(two_dirs) - {pinned_dir}
    assert os.path.isdir(pinned_dir)
    for d in plan.keep:
        assert os.path.isdir(d.path), d.label
    # Pins come off: the next collection takes it.
    assert pin(storage, pinned_dir, unpin=True, now=time.time())
    assert [d.path for d in gc_plan(prefix, keep=["one"]).delete] == [pinned_dir]


def test_a_step_that_starts_running_after_listing_is_skipped(prefix):
    plan = gc_plan(prefix, keep=["one"])
    victim = plan.delete[0]
    StepStore(LocalStorage()).acquire(victim.path, current_owner(), 3600, rerun_after=10**6)
    deleted, skipped = delete_planned(LocalStorage(), plan, now=time.time(), local_host=current_owner().host)
    assert [(e.path, why) for e, why in skipped] == [(victim.path, "RUNNING now")]
    assert os.path.isdir(victim.path) and len(deleted) == len(plan.delete) - 1


def test_older_than_keeps_recent_outputs(prefix):
    plan = gc_plan(prefix, keep=["one"], older_than=parse_age("1h"))
    assert plan.delete == () and any(d.keep_reason == "too recent" for d in plan.keep)
    # Two hours on: `two`'s outputs are old enough, and the failed step's lease has expired.
    later = gc_plan(prefix, keep=["one"], older_than=parse_age("1h"), now=time.time() + 7200)
    assert sorted(d.label.split("-")[0] for d in later.delete) == ["data/a", "loose/leased", "train/deep/b"]


def test_leftover_temporary_files_go_only_where_nobody_writes(prefix):
    storage = LocalStorage()
    idle = next(d for d in gc_plan(prefix).keep if d.keep_reason == "in a kept manifest").path
    busy = f"{prefix}/loose/running-00000000000a"
    for directory in (idle, busy):
        Path(directory, ".tmp-abc").write_text("half")
    plan = gc_plan(prefix)
    assert plan.orphans == [f"{idle}/.tmp-abc"]
    delete_planned(storage, plan, now=time.time(), local_host=current_owner().host)
    assert not Path(idle, ".tmp-abc").exists() and Path(busy, ".tmp-abc").exists()
    assert Path(idle, "value.json").exists()


def test_leftovers_are_found_at_any_depth(prefix, tmp_path):
    """The step library writes in subdirectories (`.work/`, `data/...`): a write killed there
    leaves a `.tmp-*` file that gc finds and deletes; a staging directory is one entry."""
    idle = next(d for d in gc_plan(prefix).keep if d.keep_reason == "in a kept manifest").path
    # A real write killed between writing and renaming (os._exit: no cleanup runs).
    script = (
        "import os, sys; from steps.files import write_file; "
        "os.replace = lambda *a: os._exit(9); write_file(sys.argv[1], b'half a shard')"
    )
    target = f"{idle}/.work/bands/band000-0000.npy"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    killed = subprocess.run([sys.executable, "-c", script, target], env=env, timeout=60)
    assert killed.returncode == 9 and not Path(target).exists()
    (leftover,) = Path(idle, ".work", "bands").iterdir()
    assert leftover.name.startswith(".tmp-")
    Path(idle, "data", "deep", ".tmp-staging").mkdir(parents=True)
    Path(idle, "data", "deep", ".tmp-staging", "part").write_text("x")
    plan = gc_plan(prefix)
    assert plan.orphans == sorted([str(leftover), f"{idle}/data/deep/.tmp-staging"])
    delete_planned(LocalStorage(), plan, now=time.time(), local_host=current_owner().host)
    assert not leftover.exists() and not Path(idle, "data", "deep", ".tmp-staging").exists()
    assert Path(idle, "value.json").exists() and Path(idle, "data", "deep").is_dir()


def test_bad_keep_or_manifest_refuses_before_deleting(prefix):
    with pytest.raises(StepDeclarationError, match="manifest 'nope' not found"):
        gc_plan(prefix, keep=["nope"])
    manifest = next((prefix / "experiments").glob("two-*.json"))
    manifest.write_text("{broken")
    with pytest.raises(StorageError, match="unreadable"):
        gc_plan(prefix)


def test_pin_targets_and_ages():
    with pytest.raises(StepDeclarationError, match="--older-than"):
        parse_age("30 days")
    assert parse_age("30d") == 30 * 86400 and parse_age("12h") == 43200 and parse_age("90s") == 90
    assert format_size(512) == "512 B" and format_size(3 * 1024**3) == "3.0 GiB"


def test_resolve_step_dir_by_path_label_or_unique_name(prefix):
    storage = LocalStorage()
    (a_one,) = [p for p in find_step_dirs(storage, str(prefix)) if "data/a-" in p][:1]
    label = a_one[len(str(prefix)) + 1 :]
    assert resolve_step_dir(storage, str(prefix), a_one) == a_one
    assert resolve_step_dir(storage, str(prefix), label) == a_one
    assert resolve_step_dir(storage, str(prefix), "loose/running").endswith("running-00000000000a")
    with pytest.raises(StepDeclarationError, match="2 runs of this step"):
        resolve_step_dir(storage, str(prefix), "data/a")
    with pytest.raises(StepDeclarationError, match="not a step directory"):
        resolve_step_dir(storage, str(prefix), "experiments")


def test_gc_never_follows_a_symbolic_link_out_of_its_prefix(tmp_path):
    """A link inside prefix A to prefix B's directories: `gc --prefix A --yes` deletes nothing of
    B's (issue 19: it used to delete B's committed step, which B's manifest lists)."""
    a, b = tmp_path / "a", tmp_path / "b"
    report = run(1, b, "theirs")
    (b_step,) = [p for p in b.glob("data/a-*")]
    a.mkdir()
    (a / "data").symlink_to(b / "data", target_is_directory=True)  # a whole directory of B's
    (a / "more").mkdir()
    (a / "more" / b_step.name).symlink_to(b_step, target_is_directory=True)  # one step of B's
    before = sorted(str(p) for p in b.rglob("*"))
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "gc", "--prefix", str(a), "--yes"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert result.returncode == 0, result.stderr
    assert sorted(str(p) for p in b.rglob("*")) == before  # every file of B is still there
    assert labels(report)  # B's run is intact: its steps are still committed
    assert StepStore(LocalStorage()).record(str(b_step)).succeeded
    # A link is deleted as a link at most, never what it points to.
    storage = LocalStorage(confine=str(a))
    storage.delete(str(a / "more" / b_step.name), recursive=True)
    assert not (a / "more" / b_step.name).exists() and b_step.is_dir()
    with pytest.raises(StorageError, match="outside the prefix"):
        storage.delete(str(a / "data" / b_step.name), recursive=True)
    assert b_step.is_dir()


WAITING_RUN = """
import os, time
from dataclasses import dataclass
from pipeline import Step, executor_main, output_of, step_function, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

@dataclass(frozen=True)
class WaitConfig:
    upstream: str
    output: str

@step_function
def wait_for_release(config):
    open({started!r}, "w").close()
    while not os.path.exists({release!r}):
        time.sleep(0.02)
    assert os.path.isdir(config.upstream), "the upstream was deleted under the run"
    os.makedirs(config.output, exist_ok=True)
    open(os.path.join(config.output, "done"), "w").close()

up = Step("data/up", write_value, WriteConfig(this_output(), versioned(7)))
down = Step("train/down", wait_for_release, WaitConfig(output_of(up), this_output()))
if __name__ == "__main__":
    executor_main([down])
"""


def test_gc_keeps_what_a_run_in_progress_still_needs(tmp_path):
    """Issue 19: `gc --keep other --yes` during a run of another experiment deleted that run's
    finished upstream (it holds no lease), and the run then failed."""
    prefix = tmp_path / "prefix"
    run(1, prefix, "one")
    started, release = tmp_path / "started", tmp_path / "release"
    exp = tmp_path / "two.py"
    exp.write_text(WAITING_RUN.format(started=str(started), release=str(release)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", str(prefix), "--backend", "local"],
        cwd=Path(__file__).resolve().parents[3],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not started.exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.02)
    plan = gc_plan(prefix, keep=["one"])
    (up,) = [d for d in plan.keep if d.label.startswith("data/up-")]
    assert up.keep_reason.startswith("needed by run ") and "(not finished)" in up.keep_reason
    delete_planned(LocalStorage(), plan, now=time.time(), local_host=current_owner().host)
    release.touch()
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert os.path.isdir(up.path)
    # Once the run has finished, its steps are no longer protected for it.
    assert up.path in {d.path for d in gc_plan(prefix, keep=["one"]).delete}
