"""Manifests recorded by earlier layouts of the step library rebuild the same steps: before it had
folders (`steps.train_moe:TrainMoeConfig`, ...), and before the models moved to `steps/models` and
each step kind's config to a module of its own (`steps.training.models:MoeModelConfig`,
`steps.data.dedupe:DedupeConfig`, ...). `steps.MOVED` keeps the old module paths importable, and
a module a class left still holds it by name.

The fixtures hold the recipes of three experiments as the code recorded them at commit 9e4b937
(the last with the flat layout) and at 264e513 (the last with the models under steps/training):
tiny_moe, the hero recipe and the scaling sweep."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline.core.dag import build_dag
from pipeline.run.records.recipe import recipe_entries, steps_from_manifest

ROOT = Path(__file__).resolve().parents[2]
# Recorded in a checkout at another path: its inputs' roots are written `@ROOT@` there.


def _recorded(name: str) -> dict:
    fixture = Path(__file__).parent / "fixtures" / f"{name}_module_manifests.json.gz"
    return json.loads(gzip.decompress(fixture.read_bytes()).decode().replace("@ROOT@", str(ROOT)))


RECORDED = {
    (layout, experiment): manifest
    for layout in ("flat", "folder")
    for experiment, manifest in _recorded(layout).items()
}
OLD_PATH = {
    "flat": lambda module: module.count(".") == 1,  # steps.train_moe
    "folder": lambda module: module == "steps.training.models",
}


@pytest.mark.parametrize(("layout", "experiment"), sorted(RECORDED))
def test_a_manifest_with_old_module_paths_rebuilds_the_same_identities(layout, experiment):
    manifest = RECORDED[layout, experiment]
    recorded = {ref.split(":")[0] for ref in _references(manifest)}
    assert any(OLD_PATH[layout](module) for module in recorded), "the fixture holds the old paths"
    _steps, roots = steps_from_manifest(manifest)
    dag = build_dag(roots, "gs://bucket/runs")
    assert sorted(dag.nodes) == sorted(step["label"] for step in manifest["steps"])
    # Recorded again now, the same steps name the modules that hold them today.
    now = {ref.split(":")[0] for ref in _references({"steps": list(recipe_entries(dag).values())})}
    assert now and all(
        module.count(".") >= 2 or module == "steps.files" for module in now if module.startswith("steps.")
    )


def _references(manifest: dict) -> list[str]:
    found: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if (
                    key in ("fn", "__dataclass__", "__enum__", "class")
                    and isinstance(inner, str)
                    and ":" in inner
                ):
                    found.append(inner)
                walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk(manifest)
    return found
