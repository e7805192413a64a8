"""Walking a storage prefix: every step directory under it, for the commands that look at a
whole prefix (`drydock gc`, `pin`) rather than at one experiment's steps.

A step directory is a `<name>-<hash>` directory holding one of the commit protocol's files
(`pipeline.storage.layout.STEP_DIR_MARKERS`); the walk never looks inside one, skips hidden
entries and the manifests, and stops `MAX_DEPTH` name parts deep.
"""

from __future__ import annotations

from pipeline.storage.files import Storage
from pipeline.storage.layout import MANIFEST_DIR, STEP_DIR_MARKERS, split_label

__all__ = ["MAX_DEPTH", "find_step_dirs"]

MAX_DEPTH = 8
"""How many name parts deep step directories are looked for (`a/b/c-<hash>` is 3)."""


def find_step_dirs(storage: Storage, prefix: str) -> list[str]:
    """Paths of every step directory under `prefix` (never looking inside one), sorted."""
    prefix = prefix.rstrip("/")
    found: list[str] = []
    stack = [(prefix, 0)]
    while stack:
        directory, depth = stack.pop()
        for entry in storage.listdir(directory):
            if entry.startswith(".") or (depth == 0 and entry == MANIFEST_DIR):
                continue
            path = f"{directory}/{entry}"
            inside = storage.listdir(path)
            if split_label(entry) and STEP_DIR_MARKERS & set(inside):
                found.append(path)
            # `inside == [entry]`: fsspec lists a file as itself; a file is no directory to walk.
            elif inside and depth + 1 < MAX_DEPTH and inside != [entry]:
                stack.append((path, depth + 1))
    return sorted(found)
