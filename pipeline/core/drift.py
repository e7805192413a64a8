"""Differences between two JSON-like values, and the drift notes of a cached step.

`json_diff` is the one walk both the plan's drift notes ("unversioned field `log_every`
10→50") and `drydock explain` ("optimizer.lr 0.003→0.001") are written from: dicts key by key,
lists of equal length item by item, anything else compared whole. No I/O here.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pipeline.core.identity import relativize

__all__ = [
    "MISSING",
    "config_drift",
    "drift_digest",
    "drift_digest_of_text",
    "json_diff",
    "listing_digest",
    "listing_drift",
    "short",
]

MISSING: Any = object()
"""Stands for a key that one side of a diff does not have."""


def json_diff(old: Any, new: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted path, old, new) for every leaf that differs; MISSING for an absent key."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            out.extend(json_diff(old.get(key, MISSING), new.get(key, MISSING), sub))
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        out = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out.extend(json_diff(a, b, f"{path}.{i}" if path else str(i)))
        return out
    return [(path or "<config>", old, new)]


def short(value: Any, width: int = 40) -> str:
    """`repr(value)` cut to `width` characters; `(absent)` for MISSING."""
    text = "(absent)" if value is MISSING else repr(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def drift_digest(fingerprint: str, config: Any) -> str:
    """A short hash of what drift notes compare: the code fingerprint and the relativized config
    (`dag.drift_text`). Recorded with SUCCESS, so a cached plan diffs `.step.json` only when it
    differs."""
    text = json.dumps([fingerprint, config], sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def drift_digest_of_text(fingerprint: str, config_text: str) -> str:
    """`drift_digest(fingerprint, config)` from the config's JSON already written the same way
    (`dag.drift_text`): the same bytes are hashed, without building the config as objects."""
    text = f"[{_quoted(fingerprint)},{config_text}]"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@functools.lru_cache(maxsize=4096)
def _quoted(fingerprint: str) -> str:
    # A cached plan asks once per step, for the few functions its steps share.
    return json.dumps(fingerprint)


def config_drift(
    stored: Mapping[str, Any] | None, current: Mapping[str, Any], *, limit: int = 5
) -> list[str]:
    """Human notes on how a cached step's recorded config and code (its `.step.json`) differ
    from the current ones."""
    if stored is None:
        return ["metadata missing (.step.json); identity matches"]
    # A hand-edited file may be any JSON: never trust its shape (identity is in the path anyway).
    if not isinstance(stored, Mapping) or stored.get("__corrupt__"):
        return [".step.json is unreadable; identity matches"]
    notes = []
    old_fn, new_fn = stored.get("fn"), current["fn"]
    old_fn = old_fn if isinstance(old_fn, Mapping) else {}
    if old_fn.get("fingerprint") and old_fn.get("fingerprint") != new_fn["fingerprint"]:
        notes.append(f"code of `{new_fn['import_path'].rsplit(':', 1)[-1]}` changed since")
    old_prefix = stored.get("prefix")
    old_cfg = relativize(stored.get("config", {}), old_prefix if isinstance(old_prefix, str) else "")
    new_cfg = relativize(current["config"], current["prefix"])
    changes = json_diff(old_cfg, new_cfg)
    for path, old, new in changes[:limit]:
        notes.append(f"unversioned field `{path}` {short(old)}→{short(new)}")
    if len(changes) > limit:
        notes.append(f"... and {len(changes) - limit} more unversioned changes")
    return notes


def listing_digest(listing: Mapping[str, Any]) -> str:
    """A short hash of an input listing (`StepHooks.inputs`): recorded with SUCCESS, so a cached
    plan diffs the listing recorded in `.step.json` only when the current one hashes differently."""
    text = json.dumps(listing, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# Fingerprint fields that say nothing about content on their own: compared only when both sides
# have no checksum in common (a local file too large to hash keeps its modification time).
_WEAK = ("size", "mtime")


def listing_drift(old: Any, new: Mapping[str, Mapping[str, Any]], *, limit: int = 5) -> list[str]:
    """Notes on how the files a cached step read (`old`, its recorded listing) differ from those
    there now: `input listing changed: 3 files added, 1 modified`, then a line per file (up to
    `limit`). A file is modified when its size differs, or a checksum both sides have differs
    (two mirrors in stores with different checksums compare by size)."""
    if not isinstance(old, Mapping):
        return ["input listing not recorded when it ran; the files now cannot be compared"]
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    modified = []
    for key in sorted(set(old) & set(new)):
        a, b = old[key], new[key]
        a = a if isinstance(a, Mapping) else {}
        common = [k for k in set(a) & set(b) if k not in _WEAK]
        keys = common or [k for k in _WEAK if k in a and k in b]
        if a.get("size") != b.get("size") or any(a[k] != b[k] for k in keys):
            modified.append(key)
    if not (added or removed or modified):
        return []
    counts = [
        f"{len(names)} {'file' if len(names) == 1 else 'files'} {what}" if i == 0 else f"{len(names)} {what}"
        for i, (names, what) in enumerate(
            (n, w) for n, w in ((added, "added"), (modified, "modified"), (removed, "removed")) if n
        )
    ]
    notes = ["input listing changed: " + ", ".join(counts)]
    changes = [
        *(("added", k) for k in added),
        *(("modified", k) for k in modified),
        *(("removed", k) for k in removed),
    ]
    for what, key in changes[:limit]:
        notes.append(f"{what} {key}")
    if len(changes) > limit:
        notes.append(f"... and {len(changes) - limit} more changed input files")
    return notes
