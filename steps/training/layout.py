"""The layout a training actually uses, read off its arrays: the device mesh, and per parameter its
partition spec and the shape each device holds.

    describe_layout(model, mesh) -> {"mesh": ..., "devices": ..., "parameters": {...}}

train_moe writes it to `layout.json` in its output at the first watch step (the leader of a gang),
so what ran can be checked against what the recipe declared (`MeshSpec`): an expert axis of 4
shows the experts' weights split four ways (`"per_device": [1, ...]` of 4 experts), and a layout
that was never applied shows every parameter on `data` alone.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LAYOUT_FILE", "describe_layout"]

LAYOUT_FILE = "layout.json"


def describe_layout(tree: Any, mesh: Any) -> dict[str, Any]:
    """Mesh axes and sizes, each mesh position's (process, device id), and for every array leaf of
    `tree` (by its path) its global shape, partition spec and per-device shard shape."""
    import jax

    parameters: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if not isinstance(leaf, jax.Array):
            continue
        sharding = leaf.sharding
        spec = getattr(sharding, "spec", None)
        parameters[jax.tree_util.keystr(path)] = {
            "shape": list(leaf.shape),
            "spec": None if spec is None else [_axes(entry) for entry in spec],
            "per_device": list(sharding.shard_shape(leaf.shape)),
        }
    return {
        "mesh": {str(name): int(size) for name, size in mesh.shape.items()},
        "devices": [[int(d.process_index), int(d.id)] for d in mesh.devices.flat],
        "parameters": parameters,
    }


def _axes(entry: Any) -> list[str] | None:
    """One dimension of a PartitionSpec as a list of mesh axes (None: replicated)."""
    if entry is None:
        return None
    return [str(a) for a in entry] if isinstance(entry, tuple | list) else [str(entry)]
