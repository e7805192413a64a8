"""Manifests recorded before the step library had folders (`steps.train_moe:TrainMoeConfig`, ...)
rebuild the same steps: `steps.MOVED` keeps the flat module paths importable.

The fixture holds the recipes of three experiments as the code at commit 9e4b937 (the last with
the flat layout) recorded them: tiny_moe, the hero recipe and the scaling sweep."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipeline.core.dag import build_dag
from pipeline.run.recipe import recipe_entries, steps_from_manifest

ROOT = Path(__file__).resolve().parents[2]
# Recorded in a checkout at another path: its inputs' roots are written `@ROOT@` there.
RECORDED = json.loads(
    gzip.decompress((Path(__file__).parent / "fixtures" / "flat_module_manifests.json.gz").read_bytes())
    .decode()
    .replace("@ROOT@", str(ROOT))
)


@pytest.mark.parametrize("experiment", sorted(RECORDED))
def test_a_manifest_with_the_flat_module_paths_rebuilds_the_same_identities(experiment):
    manifest = RECORDED[experiment]
    flat = {ref.split(":")[0] for ref in _references(manifest)}
    assert any(module.count(".") == 1 for module in flat), "the fixture holds flat paths"
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
