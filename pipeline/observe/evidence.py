"""The format of a curation step's evidence: which documents it removed and why, and a sample of
those it kept. The engine knows nothing of curation, but `drydock data` and the dashboard's data
page show it; this module is the one reader (and writer of the lines) that they and the step
library share (`pipeline.steplib`).

Under a step's output:

    removed/<shard>.jsonl     one JSON line per removed document: `index` (in its input shard),
                              `reason` (the rule), and as the step knows them `id`, `url`,
                              `score` (what the rule measured), `detail` (the language found, the
                              threshold; for a duplicate, `duplicate_of`: the document kept for it,
                              with its own excerpt, and the estimated similarity as `score`),
                              `bytes`, `excerpt` (the text's first `EXCERPT_CHARS` characters)
    kept/<shard>.jsonl        the first `KEPT_SAMPLE` documents the step kept from the shard, in
                              the same form without `reason`
    stats.json                `total`: documents and bytes in, kept and removed, and `reasons`:
                              {reason: {documents, bytes}}

`<shard>` is the input shard's key, with its subdirectories. `read_data_sample` reads the first
documents of each reason (in shard order), which is what both views show.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EVIDENCE_DIR",
    "EXCERPT_CHARS",
    "KEPT_DIR",
    "KEPT_SAMPLE",
    "DataSample",
    "evidence_line",
    "one_line",
    "read_data_sample",
    "render_data_sample",
]

EVIDENCE_DIR = "removed"
KEPT_DIR = "kept"
STATS_FILE = "stats.json"
EXCERPT_CHARS = 600
"""Characters of a document's text kept in its evidence line."""
KEPT_SAMPLE = 20
"""Kept documents sampled per shard."""


def evidence_line(
    index: int,
    record: Any,
    text: str,
    reason: str | None,
    score: float | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One document's line (see the module docstring); `reason` None for a kept one. `record`
    (the input record) gives its `id` and `url` when it has them."""
    line: dict[str, Any] = {"index": index}
    if isinstance(record, dict):
        for key in ("id", "url"):
            if isinstance(record.get(key), str | int):
                line[key] = record[key]
    if reason is not None:
        line["reason"] = reason
    if score is not None:
        line["score"] = round(float(score), 6)
    if detail:
        line["detail"] = dict(detail)
    line["bytes"] = len(text.encode("utf-8"))
    line["excerpt"] = text[:EXCERPT_CHARS]
    return line


@dataclass(frozen=True)
class DataSample:
    """What a curation step kept and removed, as both views show it."""

    total: Mapping[str, Any]
    """stats.json's `total`: documents_in, documents_kept, documents_removed, bytes_in, ..."""
    reasons: Mapping[str, Mapping[str, int]]
    """{reason: {documents, bytes}}, the largest first."""
    removed: Mapping[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The first removed documents of each reason (their lines, with "file": the shard)."""
    kept: list[dict[str, Any]] = field(default_factory=list)
    """The first kept documents sampled."""

    def to_json(self) -> dict[str, Any]:
        """The sample as plain data (`drydock data --json`)."""
        return {
            "total": dict(self.total),
            "reasons": {r: dict(v) for r, v in self.reasons.items()},
            "removed": {r: list(v) for r, v in self.removed.items()},
            "kept": list(self.kept),
        }


def read_data_sample(
    storage: Any, output: str, per_reason: int = 5, kept: int = 5, reason: str | None = None
) -> DataSample | None:
    """The evidence under the step output `output`, read through `storage` (a `Storage`: `read`,
    `listdir`): the totals and reasons of stats.json, the first `per_reason` removed documents of
    each reason (only `reason`'s, if given), the first `kept` kept ones. None where the step wrote
    no evidence (not a curation step, or one from before evidence was written)."""
    removed_files = _files(storage, f"{output}/{EVIDENCE_DIR}")
    stats = _json(storage.read(f"{output}/{STATS_FILE}"))
    if not removed_files and not isinstance(stats, dict):
        return None
    total = stats.get("total", {}) if isinstance(stats, dict) else {}
    reasons = total.get("reasons") if isinstance(total, dict) else None
    if not isinstance(reasons, dict) or not removed_files:
        return None
    ordered = dict(sorted(reasons.items(), key=lambda kv: (-int(kv[1].get("documents", 0)), kv[0])))
    wanted = [reason] if reason is not None else list(ordered)
    samples: dict[str, list[dict[str, Any]]] = {r: [] for r in wanted}
    for path, key in removed_files:
        if all(len(samples[r]) >= per_reason for r in wanted):
            break
        for line in _lines(storage.read(path)):
            r = line.get("reason")
            if r in samples and len(samples[r]) < per_reason:
                samples[r].append({"file": key, **line})
    kept_lines: list[dict[str, Any]] = []
    for path, key in _files(storage, f"{output}/{KEPT_DIR}"):
        if len(kept_lines) >= kept:
            break
        kept_lines.extend(
            {"file": key, **line} for line in _lines(storage.read(path))[: kept - len(kept_lines)]
        )
    return DataSample(
        total={k: v for k, v in total.items() if k != "reasons"},
        reasons=ordered,
        removed=samples,
        kept=kept_lines,
    )


def _files(storage: Any, root: str, prefix: str = "") -> list[tuple[str, str]]:
    """(path, shard key) of every `.jsonl` under `root`, in name order, depth first."""
    out: list[tuple[str, str]] = []
    for name in sorted(storage.listdir(root)):
        path, key = f"{root}/{name}", f"{prefix}{name}"
        if name.endswith(".jsonl"):
            out.append((path, key[: -len(".jsonl")]))
        else:
            out.extend(_files(storage, path, f"{key}/"))
    return out


def _lines(data: bytes | None) -> list[dict[str, Any]]:
    out = []
    for raw in (data or b"").splitlines():
        value = _json(raw)
        if isinstance(value, dict):
            out.append(value)
    return out


def _json(data: bytes | None) -> Any:
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def one_line(text: str, limit: int = 160) -> str:
    """`text` for a terminal: on one line (a newline as "⏎"), anything not printable escaped (a
    crawled page may hold escape sequences), cut at `limit` characters."""
    shown = "".join(
        "⏎"
        if c == "\n"
        else c
        if c.isprintable()
        else f"\\x{ord(c):02x}"
        if ord(c) < 256
        else f"\\u{ord(c):04x}"
        for c in text[: limit + 1]
    )
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def render_data_sample(sample: DataSample, label: str) -> str:
    """What `drydock data` prints: the totals, a row per reason, then the sampled documents."""
    total = sample.total
    documents_in = int(total.get("documents_in", 0))
    kept = int(total.get("documents_kept", total.get("documents_out", 0)))
    bytes_in = int(total.get("bytes_in", 0)) or 1
    lines = [f"{label}: {kept:,} of {documents_in:,} documents kept", ""]
    lines.append(f"  {'reason':<56}{'documents':>10}{'bytes':>14}{'of input':>10}")
    for reason, counts in sample.reasons.items():
        documents, size = int(counts.get("documents", 0)), int(counts.get("bytes", 0))
        lines.append(f"  {one_line(reason, 55):<56}{documents:>10,}{size:>14,}{size / bytes_in:>10.1%}")
    for reason, documents in sample.removed.items():
        if not documents:
            continue
        count = int(sample.reasons.get(reason, {}).get("documents", len(documents)))
        lines += ["", f"removed: {reason} ({len(documents)} of {count:,})"]
        for doc in documents:
            lines += _document_lines(doc)
    if sample.kept:
        lines += ["", f"kept ({len(sample.kept)} of {kept:,})"]
        for doc in sample.kept:
            lines += _document_lines(doc)
    return "\n".join(lines) + "\n"


def _document_lines(doc: Mapping[str, Any]) -> list[str]:
    where = f"{doc.get('file', '?')} #{doc.get('index', '?')}"
    about = [str(doc[k]) for k in ("url", "id") if k in doc][:1]
    if isinstance(doc.get("score"), int | float):
        about.append(f"score {doc['score']:.4g}")
    detail = doc.get("detail") if isinstance(doc.get("detail"), dict) else {}
    twin = detail.get("duplicate_of") if isinstance(detail.get("duplicate_of"), dict) else None
    shown = {k: v for k, v in detail.items() if k != "duplicate_of"}
    if shown:
        about.append(", ".join(f"{k} {v}" for k, v in shown.items()))
    out = [
        f"  {one_line(where + '  ' + '  '.join(about), 150)}",
        f"    {one_line(str(doc.get('excerpt', '')))}",
    ]
    if twin is not None:
        out.append(f"    duplicate of {twin.get('file', '?')} #{twin.get('index', '?')}:")
        out.append(f"    {one_line(str(twin.get('excerpt', '')))}")
    return out
