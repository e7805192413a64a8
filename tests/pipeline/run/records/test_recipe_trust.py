"""A manifest is data anyone may have edited: reading one never runs code it names beyond the
step functions and classes a recipe is made of, and never executes a file it names (issue 19)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.run.records.recipe import recipe_code
from tests.pipeline.run.records.test_recipe import drydock, the_manifest

EXPERIMENT = """
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

step = Step("data/a", write_value, WriteConfig(this_output(), versioned(1)))
if __name__ == "__main__":
    executor_main([step])
"""


def recorded_manifest(tmp_path: Path) -> tuple[Path, dict]:
    exp = tmp_path / "exp.py"
    exp.write_text(EXPERIMENT)
    result = drydock("run", str(exp), "--backend", "local", "--prefix", str(tmp_path / "runs"))
    assert result.returncode == 0, result.stderr
    manifest = the_manifest(tmp_path / "runs")
    return manifest, json.loads(manifest.read_text())


def tampered(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(data))
    return path


def refused_without_running(tmp_path: Path, path: Path, marker: Path, expect: str) -> None:
    for command in (
        ["plan", str(path)],
        ["rerun", str(path), "--backend", "local"],
        ["explain", str(path), "data/a"],
    ):
        result = drydock(*command, "--prefix", str(tmp_path / "elsewhere"))
        assert result.returncode == 2, (command, result.stderr)
        assert expect in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert not marker.exists(), f"{command} ran the manifest's command"
    assert not (tmp_path / "elsewhere").exists()


def test_a_value_marker_never_calls_a_callable_of_another_kind(tmp_path):
    _manifest, data = recorded_manifest(tmp_path)
    marker = tmp_path / "pwned"
    fields = data["steps"][0]["recipe"]["config"]["fields"]
    for value, kind in (
        ({"__tuple__": [f"touch {marker}"], "class": "os:system"}, "is not a namedtuple"),
        ({"__path__": f"touch {marker}", "class": "os:system"}, "is not a path class"),
        ({"__enum__": "os:system", "value": f"touch {marker}"}, "is not an enum"),
    ):
        fields["name"] = value
        refused_without_running(tmp_path, tampered(tmp_path, data), marker, kind)


def test_a_recipe_runs_only_step_functions(tmp_path):
    _manifest, data = recorded_manifest(tmp_path)
    marker = tmp_path / "pwned"
    data["steps"][0]["recipe"]["fn"] = "os:system"
    data["steps"][0]["recipe"]["config"] = f"touch {marker}"
    refused_without_running(tmp_path, tampered(tmp_path, data), marker, "os:system is not a step function")


def test_a_file_the_manifest_names_is_never_executed_unless_the_user_names_it(tmp_path):
    _manifest, data = recorded_manifest(tmp_path)
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\n")
    data["source_file"] = str(evil)
    data["steps"][0]["recipe"]["fn"] = "__main__:write_value"
    refused_without_running(
        tmp_path, tampered(tmp_path, data), marker, "does not run a file a manifest names"
    )
    # The plan still shows what the recipe would run, before it refuses.
    plan = drydock("plan", str(tampered(tmp_path, data)))
    assert plan.returncode == 2 and "code this recipe runs:\n  __main__:write_value  (data/a)" in plan.stderr


def test_the_plan_of_a_manifest_lists_the_code_it_would_run(tmp_path):
    manifest, data = recorded_manifest(tmp_path)
    assert recipe_code(data) == {"tests.pipeline.stepfns:write_value": ["data/a"]}
    result = drydock("plan", str(manifest))
    assert result.returncode == 0, result.stderr
    assert "code this recipe runs:\n  tests.pipeline.stepfns:write_value  (data/a)" in result.stderr
