"""Differences between two JSON-like values, and the drift notes of a cached step.

`json_diff` is the one walk both the plan's drift notes ("unversioned field `log_every`
10→50") and `drydock explain` ("optimizer.lr 0.003→0.001") are written from: dicts key by key,
lists of equal length item by item, anything else compared whole. No I/O here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pipeline.core.identity import relativize

__all__ = ["MISSING", "config_drift", "drift_digest", "drift_digest_of_text", "json_diff", "short"]

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
    text = f"[{json.dumps(fingerprint)},{config_text}]"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


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
