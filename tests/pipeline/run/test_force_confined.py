"""`--force` empties only its own step, inside its own prefix (issue 29, part 3): never another
prefix's committed step reached through a symbolic link, and on object storage exactly the keys it
lists (fsspec's `rm` would expand `[`, `?` and `*` as a glob)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pytest

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned
from pipeline.core.report import RunReport
from pipeline.storage.opening import open_storage
from tests.pipeline.objstepfns import add_values
from tests.pipeline.run.records.test_recipe import drydock
from tests.pipeline.stepfns import WriteConfig
from tests.s3server import s3_bucket_environment


def committed(step_dir: Path) -> bool:
    lines = (step_dir / ".status").read_text().splitlines()
    return json.loads(lines[-1])["event"] == "SUCCESS"


@pytest.mark.parametrize("link", ["step directory", "group directory"])
def test_force_never_empties_a_step_of_another_prefix_reached_through_a_link(tmp_path, link):
    a, b = tmp_path / "a", tmp_path / "b"
    first = drydock("run", "experiments/hello.py", "--backend", "local", "--prefix", str(b))
    assert first.returncode == 0, first.stderr
    (b_step,) = (b / "raw").glob("hello-*")
    rows = (b_step / "rows.jsonl").read_bytes()
    (a / "raw").mkdir(parents=True)
    if link == "step directory":
        (a / "raw" / b_step.name).symlink_to(b_step)
    else:
        (a / "raw").rmdir()
        (a / "raw").symlink_to(b / "raw")
    forced = drydock(
        "run", "experiments/hello.py", "--backend", "local", "--prefix", str(a), "--force", "raw/hello"
    )
    assert forced.returncode != 0, forced.stdout
    assert f"--force would empty {a}/raw/{b_step.name}, which is {b_step}" in forced.stderr, forced.stderr
    assert "outside the prefix" in forced.stderr
    assert (b_step / "rows.jsonl").read_bytes() == rows and committed(b_step)


def test_force_on_object_storage_deletes_exact_keys_and_never_globs(tmp_path):
    step = Step("data/a", add_values, WriteConfig(this_output(), versioned(1)))
    with s3_bucket_environment("drydock-force"):
        prefix = "s3://drydock-force/runs"
        report = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local"))
        assert isinstance(report, RunReport) and report.ok
        step_dir = next(iter(report.plan.dag.nodes.values())).output_path
        fs = fsspec.filesystem("s3")
        # An earlier version of the step wrote names with glob characters in them.
        for name in (
            "results[1].json",
            "results1.json",
            "x?y",
            "x1y",
            "star*",
            "dir[a]/f.json",
            "dira/f.json",
        ):
            fs.pipe_file(f"{step_dir}/{name}", name.encode())
        forced = run_experiment([step], ExecutorMainConfig(prefix=prefix, backend="local", force="data/a"))
        assert isinstance(forced, RunReport) and forced.ok, forced.outcomes
        fs.invalidate_cache()
        left = sorted(
            p.rsplit("/", 1)[-1] for p in fs.find(step_dir) if "/." not in p.removeprefix("drydock-force")
        )
        assert left == ["value.json"]


def test_deleting_a_name_with_glob_characters_deletes_that_name_only(tmp_path):
    local = tmp_path / "d"
    local.mkdir()
    names = ["results[1].json", "results1.json", "x?y", "x1y", "a*", "ab"]
    with s3_bucket_environment("drydock-delete"):
        for root in (str(local), "s3://drydock-delete/d"):
            storage = open_storage(root)
            for name in names:
                storage.write(f"{root}/{name}", b"x")
            for name in ("results[1].json", "x?y", "a*"):
                storage.delete(f"{root}/{name}", recursive=True)
            assert sorted(storage.listdir(root)) == ["ab", "results1.json", "x1y"], root
    assert sorted(os.listdir(local)) == ["ab", "results1.json", "x1y"]
