"""Levanter checkpoints of a training output: `<output>/checkpoints/step-N/`, found by path or URL.

A checkpoint is complete once its `metadata.json` is there (Levanter writes it last).
"""

from __future__ import annotations

import fsspec

from steps.files import exists, read_json

__all__ = ["checkpoint_at", "checkpoints_dir", "latest_checkpoint"]


def checkpoints_dir(output: str) -> str:
    """Where a training output keeps its checkpoints."""
    return f"{output.rstrip('/')}/checkpoints"


def latest_checkpoint(root: str) -> tuple[str, int] | None:
    """The latest complete checkpoint under `root` (a path or URL) and its step; None if none."""
    # Levanter's discovery lists and reads through fsspec, so URLs work; it returns them as URLs.
    from levanter.checkpoint import discover_latest_checkpoint

    fs, plain = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()  # listings cached by this process may predate checkpoints written since
    if not fs.exists(plain):
        return None
    latest = discover_latest_checkpoint(root)
    if latest is None:
        return None
    return latest, int(read_json(f"{latest}/metadata.json")["step"])


def checkpoint_at(root: str, step: int) -> str | None:
    """The complete checkpoint of `step` under `root`, or None."""
    path = f"{root.rstrip('/')}/step-{step}"
    return path if exists(f"{path}/metadata.json") else None
