"""What every document filter of the curation steps shares: shards in, kept shards out, and for
each removed document the evidence of why.

A filter step (`steps.data.language`, `heuristics`, `quality`) gives a *judge*: a function from a
batch of records (parsed jsonl objects or parquet rows) to one verdict each, None to keep the
document or a `Removal` (a reason, the score measured, details). `filter_shards` runs it over the
step's input shards, fanned out with `parallel_map` (Ray tasks on a Ray worker, else local
processes), and writes:

    data/<key>              the kept records, in the input's format, byte for byte
                            (`steps.data.shards.write_kept`)
    removed/<key>.jsonl     one line per removed document: its index in the shard, id (when the
                            record has one), reason, score, details, bytes, and an excerpt of its
                            text (`pipeline.observe.evidence` has the format); what the data
                            page, `drydock data` and the tests read instead of re-deriving a
                            removal
    kept/<key>.jsonl        the shard's first kept documents, in the same form (`KEPT_SAMPLE`)
    stats.json              documents and bytes in, kept and removed, per reason and per source,
                            and the step's parameters

A shard is done once `.work/<key>.json` (its totals) exists: written after its kept shard and
its evidence, so a rerun after a kill redoes only the shards without one. A record the judge
cannot read (a missing text field) is an error naming the file and line: the input is not what
the step was declared with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline import OutputOf, StepDeclarationError
from pipeline.steplib import (
    EVIDENCE_DIR,
    KEPT_DIR,
    KEPT_SAMPLE,
    evidence_line,
    parallel_map,
    step_events,
)
from steps.data.shards import ShardError, is_shard, numbered_records, record_text, write_kept
from steps.data.sources import InputError, check_local_inputs_exist, input_identity, raw_listing, read_files
from steps.files import exists, read_json, write_file, write_json

__all__ = [
    "FilterError",
    "Judge",
    "Removal",
    "Tally",
    "filter_shards",
    "read_evidence",
]

BATCH = 512
"""Records handed to a judge at once (a classifier scores a batch faster than one by one)."""


class FilterError(ValueError):
    """A filter step's configuration or input that cannot be used."""


@dataclass(frozen=True)
class Removal:
    """Why one document was removed."""

    reason: str
    """The rule, e.g. "language" or "gopher_repetition.duplicate_line_fraction"."""
    score: float | None = None
    """What the rule measured for this document (the threshold is in `detail` or the step's
    parameters)."""
    detail: Mapping[str, Any] = field(default_factory=dict)
    """Anything else worth seeing beside it (the language found, the threshold)."""


Judge = Callable[[Sequence[Any]], Sequence[Removal | None]]
"""A batch of records -> a verdict for each: None keeps the document."""


class Tally:
    """Documents and bytes in, kept and removed per reason: one shard's, or summed over many."""

    def __init__(self, counts: Mapping[str, Any] | None = None) -> None:
        counts = counts or {}
        self.documents_in = int(counts.get("documents_in", 0))
        self.bytes_in = int(counts.get("bytes_in", 0))
        self.reasons: dict[str, dict[str, int]] = {r: dict(v) for r, v in counts.get("reasons", {}).items()}

    def seen(self, size: int) -> None:
        self.documents_in += 1
        self.bytes_in += size

    def removed(self, reason: str, size: int) -> None:
        into = self.reasons.setdefault(reason, {"documents": 0, "bytes": 0})
        into["documents"] += 1
        into["bytes"] += size

    def add(self, other: Tally) -> None:
        self.documents_in += other.documents_in
        self.bytes_in += other.bytes_in
        for reason, counts in other.reasons.items():
            into = self.reasons.setdefault(reason, {"documents": 0, "bytes": 0})
            for unit in ("documents", "bytes"):
                into[unit] += counts[unit]

    def to_json(self) -> dict[str, Any]:
        removed = sum(v["documents"] for v in self.reasons.values())
        removed_bytes = sum(v["bytes"] for v in self.reasons.values())
        return {
            "documents_in": self.documents_in,
            "documents_kept": self.documents_in - removed,
            "documents_removed": removed,
            "bytes_in": self.bytes_in,
            "bytes_kept": self.bytes_in - removed_bytes,
            "bytes_removed": removed_bytes,
            "reasons": {r: dict(self.reasons[r]) for r in sorted(self.reasons)},
        }


def read_evidence(output: str) -> Iterator[dict[str, Any]]:
    """Every evidence line of a filter step's output, each with its shard's key as "file"."""
    import fsspec

    fs, plain = fsspec.core.url_to_fs(f"{output}/{EVIDENCE_DIR}")
    if not fs.exists(plain):
        return
    for path in sorted(fs.find(plain)):
        if not path.endswith(".jsonl"):
            continue
        key = path[len(plain) + 1 : -len(".jsonl")]
        with fs.open(path, "rb") as f:
            for line in f:
                if line.strip():
                    yield {"file": key, **json.loads(line)}


def filter_shards(
    output: str,
    shards: Sequence[tuple[str, str, str]],
    judge: Judge,
    text_field: str,
    num_workers: int,
    parameters: Mapping[str, Any],
) -> dict[str, Any]:
    """Judge every document of `shards` ((path, key, source) each) and write the step's outputs
    under `output` (see the module docstring); returns what `stats.json` holds. `judge` must
    pickle (a module-level function, or a `functools.partial` of one) to reach other processes."""
    args = [(output, path, key, judge, text_field) for path, key, _source in shards]
    return fan_out(output, shards, _filter_shard, args, num_workers, parameters, "shards filtered")


def fan_out(
    output: str,
    shards: Sequence[tuple[str, str, str]],
    fn: Callable[..., tuple[str, dict[str, Any]]],
    args: Sequence[tuple[Any, ...]],
    num_workers: int,
    parameters: Mapping[str, Any],
    unit: str,
) -> dict[str, Any]:
    """`fn(*a)` for each shard's `a` through `parallel_map`, each returning (key, its `Tally` as
    JSON), with progress in `unit`; then `stats.json` (`summarize`), which is returned."""
    started = time.time()
    tallies: dict[str, Tally] = {}
    for done, (key, counts) in enumerate(parallel_map(fn, args, max_workers=num_workers), 1):
        tallies[key] = Tally(counts)
        step_events.progress(done, len(shards), unit)
    stats = summarize(shards, tallies, parameters, time.time() - started)
    write_json(f"{output}/stats.json", stats)
    return stats


def summarize(
    shards: Sequence[tuple[str, str, str]],
    tallies: Mapping[str, Tally],
    parameters: Mapping[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """`stats.json`: the totals, per source, per shard, and the parameters."""
    total, sources = Tally(), {}
    for _path, key, source in shards:
        total.add(tallies[key])
        sources.setdefault(source, Tally()).add(tallies[key])
    return {
        "parameters": dict(parameters),
        "total": total.to_json(),
        "sources": {s: t.to_json() for s, t in sources.items()},
        "shards": {key: tallies[key].to_json() for _path, key, _source in shards},
        "seconds": round(seconds, 3),
    }


def report(output: str) -> str | None:
    """One line for the end-of-run summary: documents kept, and the largest reasons."""
    if not exists(f"{output}/stats.json"):
        return None
    total = read_json(f"{output}/stats.json")["total"]
    reasons = sorted(total["reasons"].items(), key=lambda kv: -kv[1]["documents"])
    top = ", ".join(f"{r} {v['documents']:,}" for r, v in reasons[:3])
    return (
        f"{total['documents_kept']:,} of {total['documents_in']:,} documents kept "
        f"({total['bytes_kept'] / max(1, total['bytes_in']):.0%} of the bytes)"
        + (f"; removed: {top}" if top else "")
    )


def _filter_shard(
    output: str, path: str, key: str, judge: Judge, text_field: str
) -> tuple[str, dict[str, Any]]:
    work = f"{output}/.work/{key}.json"
    if exists(work):
        return key, read_json(work)
    tally, keep, lines, sample = Tally(), [], [], []
    batch: list[tuple[Any, str]] = []

    def judge_batch() -> None:
        verdicts = judge([record for record, _text in batch])
        if len(verdicts) != len(batch):
            raise FilterError(f"{path}: the judge gave {len(verdicts)} verdicts for {len(batch)} records")
        for (record, text), verdict in zip(batch, verdicts, strict=True):
            size = len(text.encode("utf-8"))
            tally.seen(size)
            if verdict is not None:
                tally.removed(verdict.reason, size)
                line = evidence_line(len(keep), record, text, verdict.reason, verdict.score, verdict.detail)
                lines.append(json.dumps(line, ensure_ascii=False))
            elif len(sample) < KEPT_SAMPLE:
                sample.append(json.dumps(evidence_line(len(keep), record, text, None), ensure_ascii=False))
            keep.append(verdict is None)
        batch.clear()

    try:
        for number, record in numbered_records(path):
            batch.append((record, record_text(path, number, record, text_field)))
            if len(batch) >= BATCH:
                judge_batch()
        if batch:
            judge_batch()
    except ShardError as e:  # the input is not what the step was declared with: name the line
        raise FilterError(str(e)) from e
    write_kept(path, f"{output}/data/{key}", keep)
    write_file(f"{output}/{EVIDENCE_DIR}/{key}.jsonl", "".join(line + "\n" for line in lines).encode())
    write_file(f"{output}/{KEPT_DIR}/{key}.jsonl", "".join(line + "\n" for line in sample).encode())
    counts = tally.to_json()
    write_json(work, counts, indent=None)  # last: the shard is done
    return key, counts


# -- what the filter steps' declarations and step functions share ---------------------------------


def inputs_identity(inputs: Sequence[Any], input_root: str | None) -> dict[str, Any]:
    """What a filter step's identity takes from its inputs (`steps.data.sources`): raw files by
    their fingerprints, an upstream step's output by that step's identity."""
    return {"inputs": [None if isinstance(s, OutputOf) else input_identity(s, input_root) for s in inputs]}


def input_listing(config: Any, accept: Callable[[str], bool] = is_shard) -> dict[str, dict[str, Any]]:
    """The raw files a curation step reads (those `accept` takes), with fingerprints
    (`step_function(inputs=...)`)."""
    try:
        return raw_listing(
            {"inputs": (config.inputs, config.input_identity.get("inputs"))}, config.input_root, accept
        )
    except InputError as e:
        raise FilterError(str(e)) from e


def check_local_inputs(config: Any) -> None:
    """For a step rebuilt from a manifest: its local files are where it says (`--remap` them)."""
    check_local_inputs_exist({"inputs": config.inputs}, config.input_root)


def input_shards(
    config: Any,
    accept: Callable[[str], bool] = is_shard,
    kind: str = "a jsonl or parquet file (optionally .gz or .zst)",
) -> list[tuple[str, str, str]]:
    """(path, key, source) of every file a curation step reads; a file `accept` refuses is an
    error saying it is not `kind`."""
    try:
        return read_files(
            config.inputs, config.input_identity.get("inputs"), config.input_root, accept, "inputs", kind
        )
    except InputError as e:
        raise FilterError(str(e)) from e


def check_number(step: str, name: str, value: Any, low: float, high: float | None = None) -> None:
    """Refuse (one `StepDeclarationError` naming the field) a threshold that is not a number in
    [low, high]."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value == value
    if not ok or value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise StepDeclarationError(step, f"{name} must be a number {bounds}, got {value!r}", field=name)
