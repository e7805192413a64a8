"""`drydock gc --yes`, run again and again while a run goes on in the same prefix, deletes what no
one needs (an unreferenced old output) and nothing the run needs: its running steps, their live
leases, the finished upstreams its later steps still read, and what kept manifests list."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.faults.trials import ROOT, Experiment, verify


def gc(prefix: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
    command = [sys.executable, "-m", "pipeline", "gc", "--prefix", prefix, "--yes"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_gc_again_and_again_during_a_run_deletes_only_what_nobody_needs(tmp_path):
    # Garbage: the committed steps of another experiment, in this prefix but in no manifest of it.
    old = Experiment(tmp_path / "old", shape={"old/a": (), "old/b": ("old/a",)}).write()
    assert (
        subprocess.run(old.command(), cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0
    )
    exp = Experiment(tmp_path / "run", pause=0.3).write()  # six steps of about 1.2 s each
    shutil.copytree(old.prefix / "old", exp.prefix / "old")
    (garbage,) = [p.name for p in (exp.prefix / "old").glob("a-*")]

    runner = exp.start("run")
    outputs = []
    while runner.poll() is None:
        result = gc(str(exp.prefix))
        assert result.returncode == 0, result.stderr
        outputs.append(result.stdout)
    assert runner.wait() == 0, exp.stderr("run")

    assert len(outputs) >= 3, f"gc ran only {len(outputs)} times during the run"
    assert not (exp.prefix / "old").exists() or not list((exp.prefix / "old").glob("*-*"))
    assert any(garbage in out or "deleted 2 step directories" in out for out in outputs), outputs
    verdict = verify(exp)
    assert len(verdict.committed) == 6 and not verdict.problems, verdict
    # Nothing the run made was deleted: a rerun runs nothing.
    rerun = subprocess.run(
        exp.command("--json"),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert {step["state"] for step in json.loads(rerun.stdout)["steps"]} == {"CACHED"}
