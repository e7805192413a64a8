"""Recipes: a manifest records every step's function and config, and `drydock rerun MANIFEST`
rebuilds the same DAG (same identities) without the experiment file."""

from __future__ import annotations

import enum
import json
import math
import os
import subprocess
import sys
import textwrap
from collections import namedtuple
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from pipeline import Resources, Step, output_of, this_output, versioned
from pipeline.core.dag import build_dag
from pipeline.run.records.recipe import RecipeError, load_recipe, recipe_entries, steps_from_manifest
from tests.pipeline.stepfns import WriteConfig, calls, write_value

ROOT = Path(__file__).resolve().parents[4]


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


Pair = namedtuple("Pair", ["left", "right"])


@dataclass(frozen=True)
class Inner:
    rate: float
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RichConfig:
    output: str
    inputs: list[str]
    inner: Inner
    weights: dict[str, float]
    color: Color = Color.RED
    pair: Pair = field(default_factory=lambda: Pair(1, 2))
    where: PurePosixPath = field(default_factory=lambda: PurePosixPath("a/b"))
    odd_keys: dict[str, int] = field(default_factory=dict)
    special: tuple[float, ...] = ()
    derived: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", len(self.inputs))


def rich_dag(prefix: str):
    a = Step("data/a", write_value, WriteConfig(this_output(), versioned(1)))
    b = Step("data/b", write_value, WriteConfig(this_output(), versioned(2), inputs=[output_of(a)]))
    rich = Step(
        "rich/config",
        write_value,
        RichConfig(
            output=this_output("out"),
            inputs=[
                output_of(a, "value.json"),
                output_of("data/b", blocking=False),
                b / "x",
                output_of(b, "y", identity=False),
            ],
            inner=versioned(Inner(rate=3e-4, tags=("x", "y"))),
            weights={"web": versioned(0.7), "code": 0.3},
            color=versioned(Color.BLUE),
            pair=Pair(versioned(5), "r"),
            odd_keys={"__tuple__": 1, "__versioned__": 2},
            special=(math.inf, -math.inf, 1.5),
        ),
        description="every kind of value",
        resources=Resources(cpus=2, memory="1GiB", custom={"TPU": 4}, env={"A": "1"}, pip=("x==1",)),
        version="v2",
    )
    return build_dag([rich, b], prefix)


def manifest_for(dag, source_file: str | None = None) -> dict:
    """A manifest as `build_manifest` writes it, through JSON and back."""
    recipes = recipe_entries(dag, source_file)
    steps = [
        {"label": label, "name": node.name, "recipe": recipes[label]} for label, node in dag.nodes.items()
    ]
    return json.loads(json.dumps({"steps": steps, "roots": list(dag.roots), "source_file": source_file}))


def test_every_kind_of_config_value_comes_back_with_the_same_identity():
    dag = rich_dag("/tmp/prefix-a")
    steps, roots = steps_from_manifest(manifest_for(dag))
    rebuilt = build_dag(roots, "/tmp/prefix-b")  # identities do not depend on the prefix
    assert list(rebuilt.nodes) == list(dag.nodes)
    for label, node in dag.nodes.items():
        again = rebuilt.nodes[label].step
        assert again.fn is node.step.fn
        assert again.resources == node.step.resources
        assert again.version == node.step.version and again.description == node.step.description
    original = next(n.step.config for n in dag.nodes.values() if n.name == "rich/config")
    config = next(n.step.config for n in rebuilt.nodes.values() if n.name == "rich/config")
    assert type(config.pair) is Pair and config.color.value is Color.BLUE
    assert config.special == (math.inf, -math.inf, 1.5)
    assert config.odd_keys == {"__tuple__": 1, "__versioned__": 2}
    assert config.where == PurePosixPath("a/b") and config.inner.value.tags == ("x", "y")
    assert config.derived == original.derived == 4
    assert config.inputs[3].identity is False and config.inputs[2].identity is True
    assert len(steps) == 3


def test_a_value_that_cannot_be_recorded_names_the_step_and_field():
    bad = Step("bad/step", write_value, WriteConfig(this_output(), versioned(1), name=object()))  # type: ignore[arg-type]
    dag = build_dag([bad], "/tmp/p")
    manifest = manifest_for(dag)
    (recipe,) = [s["recipe"] for s in manifest["steps"]]
    assert isinstance(recipe, str) and "bad/step" in recipe and "`name`" in recipe
    with pytest.raises(RecipeError, match=r"bad/step.*recipe.*object"):
        steps_from_manifest(manifest)


def test_a_manifest_whose_values_changed_is_refused(tmp_path):
    dag = rich_dag(str(tmp_path))
    manifest = manifest_for(dag)
    # Someone edits the recorded value by hand (or the code changed what it rebuilds).
    entry = next(s for s in manifest["steps"] if s["name"] == "data/a")
    entry["recipe"]["config"]["fields"]["value"] = {"__versioned__": 99}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(manifest))
    with pytest.raises(RecipeError, match="different identities"):
        load_recipe(str(path))


# -- through the real command line ---------------------------------------------------------------


def drydock(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DRYDOCK_PREFIX", None)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def states(result: subprocess.CompletedProcess) -> dict[str, str]:
    assert result.returncode == 0, result.stderr[-3000:]
    return {s["label"]: s["state"] for s in json.loads(result.stdout)["steps"]}


def the_manifest(prefix: Path) -> Path:
    (manifest,) = (prefix / "experiments").glob("*.json")
    return manifest


def test_rerun_of_an_experiment_manifest_is_cached_at_its_prefix_and_identical_elsewhere(tmp_path):
    prefix = tmp_path / "runs"
    first = states(
        drydock("run", "experiments/hello.py", "--backend", "local", "--prefix", str(prefix), "--json")
    )
    manifest = the_manifest(prefix)
    recorded = json.loads(manifest.read_text())
    assert recorded["steps"][0]["recipe"]["fn"] == "experiments.hello:write_rows"

    # Default prefix: the manifest's own, where everything is done.
    again = states(drydock("rerun", str(manifest), "--backend", "local", "--json"))
    assert again == dict.fromkeys(first, "CACHED")
    # `plan` and `status` accept a manifest where they accept a file.
    assert states(drydock("plan", str(manifest), "--json")) == dict.fromkeys(first, "CACHED")
    assert drydock("status", str(manifest)).returncode == 0

    # Elsewhere: the same identities, computed afresh, from a directory without the experiment.
    other = tmp_path / "other"
    fresh = states(drydock("rerun", str(manifest), "--backend", "local", "--prefix", str(other), "--json"))
    assert set(fresh) == set(first) and set(fresh.values()) == {"SUCCEEDED"}
    for label in first:
        a = json.loads((prefix / label / "counts.json").read_text()) if "counts" in label else None
        if a is not None:
            assert json.loads((other / label / "counts.json").read_text()) == a


EXPERIMENT = """
from dataclasses import dataclass
from pipeline import Step, executor_main, this_output, versioned
from tests.pipeline.stepfns import count_call


@dataclass(frozen=True)
class LocalConfig:
    output: str
    value: int
    counter: str


def local_fn(config: LocalConfig) -> None:
    count_call(config.counter, "local")
    import os
    os.makedirs(config.output, exist_ok=True)
    open(os.path.join(config.output, "v.txt"), "w").write(str(config.value))


step = Step("local/step", local_fn, LocalConfig(this_output(), versioned(7), {counter!r}))

if __name__ == "__main__":
    executor_main([step])
"""


def test_code_defined_in_the_experiment_file_reruns_only_from_a_file_the_user_names(tmp_path):
    source = tmp_path / "exp.py"
    counter = tmp_path / "calls"
    source.write_text(textwrap.dedent(EXPERIMENT.format(counter=str(counter))))
    prefix = tmp_path / "runs"
    first = states(drydock("run", str(source), "--backend", "local", "--prefix", str(prefix), "--json"))
    manifest = the_manifest(prefix)
    assert json.loads(manifest.read_text())["steps"][0]["recipe"]["fn"] == "__main__:local_fn"
    # The manifest names the file, but Drydock runs a file only when the user names it.
    refused = drydock("rerun", str(manifest), "--backend", "local", "--prefix", str(tmp_path / "a"))
    assert refused.returncode == 2 and "does not run a file a manifest names" in refused.stderr
    assert "--source FILE" in refused.stderr and not (tmp_path / "a").exists()
    named = ("--source", str(source))
    assert states(
        drydock("rerun", str(manifest), *named, "--backend", "local", "--json", cwd=tmp_path)
    ) == dict.fromkeys(first, "CACHED")
    assert states(
        drydock(
            "rerun", str(manifest), *named, "--backend", "local", "--prefix", str(tmp_path / "b"), "--json"
        )
    ) == dict.fromkeys(first, "SUCCEEDED")
    assert calls(str(counter), "local") == 2

    # A named file that is not there: one clear error, nothing written.
    source.unlink()
    third = drydock("rerun", str(manifest), *named, "--backend", "local", "--prefix", str(tmp_path / "c"))
    assert third.returncode == 2
    assert third.stderr.strip().startswith("error: step 'local/step', field `--source`")
    assert "Traceback" not in third.stderr and not (tmp_path / "c").exists()


def test_rerun_of_a_missing_or_malformed_manifest_is_one_clear_error(tmp_path):
    missing = drydock("rerun", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a manifest"}')
    result = drydock("rerun", str(bad))
    assert result.returncode == 2 and "not a Drydock run manifest" in result.stderr
    assert "Traceback" not in result.stderr
