"""The `dedupe` step: remove exact and near-duplicate documents from jsonl/parquet shards.

    deduped = dedupe_step("dedupe/web", inputs=[web], threshold=0.8, num_workers=8)
    tokenize_step("tokenized/web", train=[deduped / "data"], ...)

Three passes:

1. **Signatures, per shard** (fanned out with `parallel_map`: Ray tasks on a Ray worker, else
   local processes; resumable per shard). Each document gets a hash of its normalized text
   (Unicode NFKC, lower case, runs of whitespace as one space) and a MinHash signature
   (`datasketch`, `num_perm` permutations) of its word `ngram`s. A shard's signatures are
   written to `.work/` under the output; a rerun after a kill reuses the finished ones.
2. **The global pass**, in the step's process: documents in input order; one whose normalized
   hash was seen before is an exact duplicate; else MinHash LSH (`datasketch.MinHashLSH`)
   finds earlier documents whose estimated Jaccard similarity is at least `threshold`, and the
   document is a near duplicate of the most similar one. The first of each cluster is kept, so
   duplicates across shards are found as well as within one.
3. **Kept documents, per shard** (fanned out, resumable): each shard's kept records are
   written to `data/<name>` in the input's format and compression, byte for byte.

Output:

    data/<source>/<file>     the kept records; <source>/<file> is the input's location-independent
                             name (steps.sources), so `output_of(step, "data")` reads them all
    stats.json               documents and bytes in and out per source, exact and near duplicates,
                             clusters, the parameters
    removed_pairs.jsonl      a sample of removed documents beside the one each duplicates
    .work/                   per-shard signatures (kept: a rerun with --force recomputes them)

The global pass holds every signature in memory: 4 bytes x `num_perm` per document (512 MB per
million documents at 128). Beyond one host's memory, the LSH bands would have to be sharded;
this step does not do that.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline import (
    OutputOf,
    Resources,
    Step,
    StepDeclarationError,
    step_events,
    step_function,
    this_output,
    versioned,
)
from pipeline.run.parallel import parallel_map
from steps.files import exists, read_bytes, read_json, write_file, write_json
from steps.shards import ShardError, is_shard, shard_texts, write_kept
from steps.sources import (
    InputError,
    RawDataset,
    check_local_inputs_exist,
    input_identity,
    raw_listing,
    read_files,
)

__all__ = ["DedupeConfig", "DedupeError", "dedupe", "dedupe_step", "normalize"]

_SPACE = re.compile(r"\s+")
_SEED = 1  # MinHash permutations: fixed, so signatures are comparable across shards and reruns
_SCHEME = "affine32"  # datasketch 2.0 needs it named when signatures are rebuilt from values


class DedupeError(ValueError):
    """A dedupe configuration or input that cannot be used."""


@dataclass(frozen=True)
class DedupeConfig:
    """Configuration of the dedupe step."""

    inputs: list[Any]
    """Shards: paths, globs or directories (relative ones under `input_root`), `RawDataset`s, or
    `output_of` an upstream step. jsonl or parquet, optionally .gz/.zst."""
    output: str
    """The step's output directory (`this_output()`)."""
    text_field: str = "text"
    """The field (jsonl) or column (parquet) holding the text."""
    exact: bool = True
    """Remove exact duplicates (equal normalized text)."""
    near: bool = True
    """Remove near duplicates (MinHash LSH)."""
    threshold: float = 0.8
    """Near duplicates: the estimated Jaccard similarity of their word n-grams, in (0, 1]."""
    ngram: int = 5
    """Near duplicates: words per n-gram (shorter documents are one n-gram)."""
    num_perm: int = 128
    """Near duplicates: MinHash permutations (more: a finer estimate, more memory)."""
    sample_pairs: int = 20
    """Removed documents written beside their kept duplicate to `removed_pairs.jsonl`."""
    input_root: str | None = None
    """Directory relative inputs are under; not versioned."""
    num_workers: int = 1
    """Shards processed at once (Ray tasks on a Ray worker, else local processes)."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs (`steps.sources`); the locations are not versioned."""


def dedupe_step(
    name: str,
    *,
    inputs: Sequence[str | RawDataset | OutputOf],
    text_field: str = "text",
    exact: bool = True,
    near: bool = True,
    threshold: float = 0.8,
    ngram: int = 5,
    num_perm: int = 128,
    sample_pairs: int = 20,
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready dedupe `Step`. The inputs' identities, the text field, what is removed and the
    MinHash parameters are versioned; a bad parameter is a `StepDeclarationError` naming it."""
    _check(
        name, threshold=threshold, ngram=ngram, num_perm=num_perm, inputs=inputs, sample_pairs=sample_pairs
    )
    identity = [None if isinstance(s, OutputOf) else input_identity(s, input_root) for s in inputs]
    return Step(
        name=name,
        fn=dedupe,
        config=DedupeConfig(
            inputs=list(inputs),
            output=this_output(),
            text_field=versioned(text_field),
            exact=versioned(exact),
            near=versioned(near),
            threshold=versioned(float(threshold)),
            ngram=versioned(ngram),
            num_perm=versioned(num_perm),
            sample_pairs=sample_pairs,
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned({"inputs": identity}),
        ),
        description=f"dedupe {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


def _check(step: str | None, **values: Any) -> None:
    threshold = values["threshold"]
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
        raise StepDeclarationError(step, f"threshold must be in (0, 1], got {threshold!r}", field="threshold")
    for key in ("ngram", "num_perm"):
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StepDeclarationError(step, f"{key} must be a positive integer, got {value!r}", field=key)
    if values["num_perm"] < 2:
        raise StepDeclarationError(step, "num_perm must be at least 2", field="num_perm")
    if not values["inputs"]:
        raise StepDeclarationError(step, "no inputs given", field="inputs")


def normalize(text: str) -> str:
    """The form duplicates are compared in: NFKC, lower case, whitespace runs as one space."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


# -- the step function ----------------------------------------------------------------------------


def dedupe_inputs(config: DedupeConfig) -> dict[str, dict[str, Any]]:
    """The raw shards the step reads, with fingerprints (recorded; compared by later plans)."""
    try:
        return raw_listing(
            {"inputs": (config.inputs, config.input_identity.get("inputs"))}, config.input_root, is_shard
        )
    except InputError as e:
        raise DedupeError(str(e)) from e


def _report(config: DedupeConfig) -> str | None:
    if not exists(f"{config.output}/stats.json"):
        return None
    total = read_json(f"{config.output}/stats.json")["total"]
    return (
        f"{total['documents_in']:,} documents in, {total['documents_out']:,} kept: "
        f"{total['exact_removed']:,} exact and {total['near_removed']:,} near duplicates removed"
    )


def _inputs_exist(config: DedupeConfig) -> None:
    """For a step rebuilt from a manifest: its local inputs are where it says (`--remap` them)."""
    check_local_inputs_exist({"inputs": config.inputs}, config.input_root)


@step_function(inputs=dedupe_inputs, report=_report, check=_inputs_exist)
def dedupe(config: DedupeConfig) -> None:
    """Deduplicate `config.inputs` into `config.output` (see the module docstring)."""
    _check(
        None, **{k: getattr(config, k) for k in ("threshold", "ngram", "num_perm", "inputs", "sample_pairs")}
    )
    shards = _shards(config)
    started = time.time()
    args = [(config, path, key) for path, key, _source in shards]
    signatures: dict[str, dict[str, np.ndarray]] = {}
    for done, (key, sig) in enumerate(parallel_map(_signatures, args, max_workers=config.num_workers), 1):
        signatures[key] = sig
        step_events.progress(done, len(shards), "shards signed")
    order = [key for _path, key, _source in shards]
    keep, removed, clusters = _global_pass(config, order, signatures)
    write_args = [(path, f"{config.output}/data/{key}", keep[key]) for path, key, _source in shards]
    for done, _ in enumerate(parallel_map(_write_shard, write_args, max_workers=config.num_workers), 1):
        step_events.progress(done, len(shards), "shards written")
    _write_pairs(config, shards, removed)
    _write_stats(config, shards, signatures, keep, removed, clusters, time.time() - started)


def _shards(config: DedupeConfig) -> list[tuple[str, str, str]]:
    """(path, key, source) of every input shard; source names the input for the stats."""
    try:
        out = read_files(
            config.inputs, config.input_identity.get("inputs"), config.input_root, is_shard, "inputs"
        )
    except InputError as e:
        raise DedupeError(str(e)) from e
    keys = [key for _p, key, _s in out]
    if len(set(keys)) != len(keys):
        raise DedupeError("two inputs have files of the same name; give each input its own directory")
    return out


def _signatures(config: DedupeConfig, path: str, key: str) -> tuple[str, dict[str, np.ndarray]]:
    """One shard's exact hashes, MinHash signatures and text bytes; reused if already written."""
    work = f"{config.output}/.work/{key}.npz"
    if exists(work):
        with np.load(io.BytesIO(read_bytes(work))) as data:
            return key, {name: data[name] for name in data.files}
    from datasketch import MinHash

    permutations = MinHash(num_perm=config.num_perm, seed=_SEED, scheme=_SCHEME).permutations
    exact, sigs, sizes = [], [], []
    try:
        for text in shard_texts(path, config.text_field):
            norm = normalize(text)
            exact.append(int.from_bytes(hashlib.blake2b(norm.encode(), digest_size=8).digest(), "little"))
            sizes.append(len(text.encode("utf-8")))
            if config.near:
                words = norm.split(" ")
                n = config.ngram
                grams = [" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))]
                m = MinHash(num_perm=config.num_perm, seed=_SEED, permutations=permutations, scheme=_SCHEME)
                m.update_batch([g.encode() for g in grams])
                sigs.append(m.hashvalues.astype(np.uint32))
    except ShardError as e:
        raise DedupeError(str(e)) from e
    result = {
        "exact": np.array(exact, dtype=np.uint64),
        "bytes": np.array(sizes, dtype=np.int64),
        "minhash": np.array(sigs, dtype=np.uint32).reshape(len(sigs), config.num_perm if config.near else 0),
    }
    out = io.BytesIO()
    np.savez(out, **result)
    write_file(work, out.getvalue())  # whole or not at all: a killed shard is redone
    return key, result


def _global_pass(
    config: DedupeConfig, order: list[str], signatures: dict[str, dict[str, np.ndarray]]
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
    """Keep flags per shard, the removed documents (kind, similarity, what they duplicate), and
    the number of clusters (kept documents with at least one duplicate removed)."""
    from datasketch import LeanMinHash, MinHashLSH

    lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm) if config.near else None
    seen: dict[int, tuple[str, int]] = {}
    keep = {key: np.ones(len(signatures[key]["exact"]), dtype=bool) for key in order}
    removed: list[dict[str, Any]] = []
    kept_as: dict[tuple[str, int], tuple[str, int]] = {}  # a removed document -> the kept one
    clusters: set[tuple[str, int]] = set()
    for key in order:
        sig = signatures[key]
        for i, digest in enumerate(sig["exact"].tolist()):
            if config.exact and digest in seen:
                # The first with this text may itself be a near duplicate: name the kept one.
                of = kept_as.get(seen[digest], seen[digest])
                keep[key][i] = False
                kept_as[(key, i)] = of
                removed.append({"kind": "exact", "similarity": 1.0, "doc": (key, i), "of": of})
                clusters.add(of)
                continue
            seen.setdefault(digest, (key, i))
            if lsh is None:
                continue
            values = sig["minhash"][i]
            best = None
            for candidate in lsh.query(LeanMinHash(seed=_SEED, hashvalues=values, scheme=_SCHEME)):
                other_key, j = candidate
                similarity = float(np.mean(signatures[other_key]["minhash"][j] == values))
                if similarity >= config.threshold and (best is None or similarity > best[0]):
                    best = (similarity, (other_key, j))
            if best is not None:
                keep[key][i] = False
                kept_as[(key, i)] = best[1]
                removed.append(
                    {"kind": "near", "similarity": round(best[0], 4), "doc": (key, i), "of": best[1]}
                )
                clusters.add(best[1])
            else:  # only kept documents are indexed, so a match always names a kept one
                lsh.insert((key, i), LeanMinHash(seed=_SEED, hashvalues=values, scheme=_SCHEME))
    return keep, removed, len(clusters)


def _write_shard(src: str, dst: str, keep: np.ndarray) -> None:
    write_kept(src, dst, keep.tolist())


def _write_pairs(
    config: DedupeConfig, shards: list[tuple[str, str, str]], removed: list[dict[str, Any]]
) -> None:
    """A sample of removed documents beside the one each duplicates, for inspection."""
    sample = removed[: config.sample_pairs]
    wanted = {ref for r in sample for ref in (r["doc"], r["of"])}
    texts: dict[tuple[str, int], str] = {}
    for path, key, _source in shards:
        indices = {i for k, i in wanted if k == key}
        if indices:
            for i, text in enumerate(shard_texts(path, config.text_field)):
                if i in indices:
                    texts[(key, i)] = text
    lines = []
    for r in sample:
        lines.append(
            json.dumps(
                {
                    "kind": r["kind"],
                    "similarity": r["similarity"],
                    "removed": {"file": r["doc"][0], "index": r["doc"][1], "text": texts[r["doc"]][:1000]},
                    "kept": {"file": r["of"][0], "index": r["of"][1], "text": texts[r["of"]][:1000]},
                }
            )
        )
    write_file(f"{config.output}/removed_pairs.jsonl", "".join(line + "\n" for line in lines).encode())


def _write_stats(
    config: DedupeConfig,
    shards: list[tuple[str, str, str]],
    signatures: dict[str, dict[str, np.ndarray]],
    keep: dict[str, np.ndarray],
    removed: list[dict[str, Any]],
    clusters: int,
    seconds: float,
) -> None:
    kinds: dict[tuple[str, int], str] = {r["doc"]: r["kind"] for r in removed}
    sources: dict[str, dict[str, int]] = {}
    for _path, key, source in shards:
        s = sources.setdefault(
            source,
            {
                "documents_in": 0,
                "documents_out": 0,
                "bytes_in": 0,
                "bytes_out": 0,
                "exact_removed": 0,
                "near_removed": 0,
            },
        )
        sizes, flags = signatures[key]["bytes"], keep[key]
        s["documents_in"] += len(flags)
        s["documents_out"] += int(flags.sum())
        s["bytes_in"] += int(sizes.sum())
        s["bytes_out"] += int(sizes[flags].sum())
        for i in np.flatnonzero(~flags).tolist():
            s[f"{kinds[(key, i)]}_removed"] += 1
    total = {k: sum(s[k] for s in sources.values()) for k in next(iter(sources.values()))}
    write_json(
        f"{config.output}/stats.json",
        {
            "parameters": {
                "exact": config.exact,
                "near": config.near,
                "threshold": config.threshold,
                "ngram": config.ngram,
                "num_perm": config.num_perm,
                "text_field": config.text_field,
            },
            "total": {**total, "clusters": clusters},
            "sources": sources,
            "files": {key: int(keep[key].sum()) for _p, key, _s in shards},
            "seconds": round(seconds, 3),
        },
    )
