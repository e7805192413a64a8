"""A run that runs nothing copies the steps of the manifest it replaces when they are what it would
encode (`pipeline.run.records.manifest_builder.ManifestBuilder`), or their recipes when only their
states differ (the first cached rerun after a run), and encodes them whenever anything they are made
from differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.run.records import manifest_builder as manifest_module
from pipeline.run.records.manifest_builder import ManifestBuilder
from pipeline.storage.manifests import encoded_head, with_head
from tests.pipeline.stepfns import WriteConfig, write_value


def steps(
    log_every: int = 10, sleep: float | int = 0.0, as_tuple: bool = False, name: str = "write"
) -> list[Step]:
    a = Step(
        "r/a", write_value, WriteConfig(output=this_output(), value=versioned(1), sleep=sleep, name=name)
    )
    inputs = [output_of(a)]
    b = Step(
        "r/b",
        write_value,
        WriteConfig(
            output=this_output(),
            value=versioned(2),
            log_every=log_every,
            inputs=tuple(inputs) if as_tuple else inputs,  # type: ignore[arg-type]
        ),
    )
    return [a, b]


def manifest_of(prefix: Path) -> tuple[bytes, dict]:
    (path,) = (prefix / "experiments").glob("*.json")
    data = path.read_bytes()
    return data, json.loads(data)


@pytest.fixture
def config(tmp_path) -> ExecutorMainConfig:
    config = ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local", log_level="WARNING")
    assert run_experiment(steps(), config).ok
    return config


def encodings(monkeypatch) -> list[int]:
    """Counts the runs that encode the steps' recipes (as opposed to copying them)."""
    calls: list[int] = []
    original = manifest_module.iter_recipes

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(manifest_module, "iter_recipes", counting)
    return calls


def full_encoding(report) -> bytes:
    """The steps of `report`'s manifest encoded from nothing (no manifest to copy from)."""
    encoded = ManifestBuilder(report.plan, "x", "", "run", {}).encode(report, last=True)
    return encoded[encoded.index(b"\n") :]


@pytest.mark.parametrize("name", ["write", 'a "quoted", "recipe": {"state": 1} name'])
def test_the_first_cached_rerun_after_a_run_copies_its_recipes(tmp_path, monkeypatch, name):
    """The run's manifest records what its recipes were encoded from; the cached rerun after it
    cuts each step's recipe out of it instead of encoding them, and writes the same bytes
    encoding would (a field holding `"recipe": ` text included)."""
    config = ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local", log_level="WARNING")
    assert run_experiment(steps(name=name), config).ok
    _, after_run = manifest_of(Path(config.prefix))
    assert len(after_run["recipes_digest"]) == 64 and "steps_digest" not in after_run
    calls = encodings(monkeypatch)
    report = run_experiment(steps(name=name), config)
    assert report.ok
    first, parsed = manifest_of(Path(config.prefix))
    assert calls == []  # cut from the run's manifest, not encoded
    assert parsed["recipes_digest"] == after_run["recipes_digest"]
    assert [s["recipe"] for s in parsed["steps"]] == [s["recipe"] for s in after_run["steps"]]
    assert parsed["steps"][0]["recipe"]["config"]["fields"]["name"] == name
    assert first[first.index(b"\n") :] == full_encoding(report)


def test_recipes_edited_in_the_runs_manifest_are_not_copied(config, monkeypatch):
    (path,) = (Path(config.prefix) / "experiments").glob("*.json")
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"log_every": 10', b'"log_every": 77', 1))  # same shape and digest
    calls = encodings(monkeypatch)
    assert run_experiment(steps(), config).ok
    assert calls == [1]
    assert b'"log_every": 77' not in path.read_bytes()


def test_a_second_cached_rerun_copies_the_steps_the_first_encoded(config, monkeypatch):
    prefix = Path(config.prefix)
    calls = encodings(monkeypatch)
    assert run_experiment(steps(), config).ok
    first, parsed_first = manifest_of(prefix)
    assert calls == [] and len(parsed_first["steps_digest"]) == 64  # its recipes: the run's
    assert [s["state"] for s in parsed_first["steps"]] == ["CACHED", "CACHED"]

    assert run_experiment(steps(), config).ok
    second, parsed_second = manifest_of(prefix)
    assert calls == []  # copied whole
    assert parsed_second["run_id"] != parsed_first["run_id"]
    assert parsed_second["steps_digest"] == parsed_first["steps_digest"]
    # The steps are the same bytes, and the same as encoding them again would give.
    assert second[second.index(b"\n") :] == first[first.index(b"\n") :]
    assert parsed_second["steps"] == parsed_first["steps"]


@pytest.mark.parametrize(
    "changed",
    [
        {"log_every": 50},  # an unversioned field: the recipe records the new value
        {"sleep": 0},  # 0 and 0.0 are one value to identity and drift, not to the recipe
        {"as_tuple": True},  # so are a list and a tuple of the same items
    ],
)
def test_anything_the_steps_are_encoded_from_changing_encodes_them_again(config, monkeypatch, changed):
    prefix = Path(config.prefix)
    assert run_experiment(steps(), config).ok
    _, before = manifest_of(prefix)
    calls = encodings(monkeypatch)
    assert run_experiment(steps(**changed), config).ok
    _, after = manifest_of(prefix)
    assert calls == [1]
    assert after["steps_digest"] != before["steps_digest"]
    recipes = {s["name"]: s["recipe"]["config"]["fields"] for s in after["steps"]}
    if "log_every" in changed:
        assert recipes["r/b"]["log_every"] == 50
    elif "sleep" in changed:
        assert recipes["r/a"]["sleep"] == 0 and isinstance(recipes["r/a"]["sleep"], int)
    else:
        assert "__tuple__" in recipes["r/b"]["inputs"]


def test_a_run_that_runs_steps_records_no_digest_and_copies_nothing(config, monkeypatch):
    prefix = Path(config.prefix)
    _, after_run = manifest_of(prefix)
    assert "steps_digest" not in after_run  # its outcomes (timings, attempts) are its own
    calls = encodings(monkeypatch)
    changed = [steps()[0], Step("r/c", write_value, WriteConfig(output=this_output(), value=versioned(3)))]
    assert run_experiment(changed, config).ok
    assert calls == [1]


def test_a_manifest_edited_by_hand_is_not_copied(config, monkeypatch):
    prefix = Path(config.prefix)
    assert run_experiment(steps(), config).ok
    _, parsed = manifest_of(prefix)
    (path,) = (prefix / "experiments").glob("*.json")
    parsed["steps"][0]["recipe"]["config"]["fields"]["log_every"] = 99
    path.write_text(json.dumps(parsed, indent=1))  # same digest, another shape
    calls = encodings(monkeypatch)
    assert run_experiment(steps(), config).ok
    _, again = manifest_of(prefix)
    assert calls == [1]
    assert again["steps"][0]["recipe"]["config"]["fields"]["log_every"] == 10


def test_without_drift_digests_a_builder_encodes_every_time(config):
    from pipeline.run.experiment import prepare

    _dag, _store, plan = prepare(steps(), config)
    report = run_experiment(steps(), config)
    builder = ManifestBuilder(plan, "x", "", "run", {})
    encoded = builder.encode(report, last=True)
    assert "steps_digest" not in json.loads(encoded)


def test_head_helpers_round_trip():
    from pipeline.storage.manifests import encode_lines

    data = encode_lines({"a": 1, "b": "x\ny"}, [b'{"n": 1}', b'{"n": 2}'])
    assert encoded_head(data) == {"a": 1, "b": "x\ny"}
    replaced = with_head({"a": 2}, data)
    assert json.loads(replaced) == {"a": 2, "steps": [{"n": 1}, {"n": 2}]}
    assert encoded_head(b"{}") is None and encoded_head(data[:-3]) is None
    assert encoded_head(json.dumps({"steps": []}, indent=1).encode()) is None


def test_steps_edited_in_place_are_not_copied(config, monkeypatch):
    prefix = Path(config.prefix)
    assert run_experiment(steps(), config).ok
    (path,) = (prefix / "experiments").glob("*.json")
    data = path.read_bytes()
    assert data.count(b'"log_every": 10') == 2
    path.write_bytes(data.replace(b'"log_every": 10', b'"log_every": 77', 1))  # same shape and digest
    calls = encodings(monkeypatch)
    assert run_experiment(steps(), config).ok
    assert calls == [1]
    assert b'"log_every": 77' not in path.read_bytes()
