"""The `dedupe` step: remove exact and near-duplicate documents from jsonl/parquet shards.

    deduped = dedupe_step("dedupe/web", inputs=[web], threshold=0.8, num_workers=8)
    tokenize_step("tokenized/web", train=[deduped / "data"], ...)

Three passes:

1. **Signatures, per shard** (fanned out with `parallel_map`: Ray tasks on a Ray worker, else
   local processes; resumable per shard). Each document gets a hash of its normalized text
   (Unicode NFKC, lower case, runs of whitespace as one space) and a MinHash signature of
   `num_perm` values over its word `ngram`s: by default one-permutation MinHash with
   densification, computed for thousands of documents at once in one compiled pass over their
   bytes (`steps.data.minhash`, `steps.data.compiled_loops`);
   `minhash="datasketch"`, one `datasketch.MinHash` per document with `num_perm` permutations,
   is how steps made before that were computed (their recipes still rerun it). A shard's
   signatures are written to `.work/` under the output; a rerun after a kill reuses the
   finished ones.
2. **The global pass**, by default as connected components (`steps.data.dedupe_bands`): each LSH
   band (9 bands of 13 values for 128 values at 0.8), and an exact pass over the normalized
   texts' hashes, is split into `band_parts` parts fanned out like the shards (resumable per
   part); documents of equal band key are paired and pairs whose estimated Jaccard similarity is
   below `threshold` dropped. In each connected component of all the pairs the first document in
   input order is kept, so duplicates across shards are found as well as within one.
   `grouping="first_match"` is the pass as first written (`steps.data.dedupe_first_match`): in the
   step's process, each document against the documents kept before it.
3. **Kept documents, per shard** (fanned out, resumable): each shard's kept records are
   written to `data/<name>` in the input's format and compression, byte for byte, beside the
   evidence of what it lost.

Output:

    data/<source>/<file>     the kept records; <source>/<file> is the input's location-independent
                             name (steps.data.sources), so `output_of(step, "data")` reads them all
    stats.json               documents and bytes in and out per source, exact and near duplicates,
                             clusters, the parameters
    removed/<file>.jsonl     every removed document of the shard: `exact_duplicate` or
                             `near_duplicate`, the document kept for it (`duplicate_of`: file and
                             index), and for the first `TWIN_SAMPLE` of each shard the kept one's
                             excerpt and the estimated similarity (`pipeline.observe.evidence`)
    kept/<file>.jsonl        the shard's first kept documents
    removed_pairs.jsonl      a sample of removed documents beside the one each duplicates
    .work/                   per-shard signatures and per-band-part pairs (kept: a rerun with
                             --force recomputes them)

Memory: a signing task holds a batch of about 4 MB of text; a band part, 16 bytes per document of
its part and the signatures of its candidates; the step's process, a count per shard, the
documents that have duplicates (16 bytes each) and the pairs not yet folded in (about as many). With
`documents=` (a planning hint, not versioned) `drydock plan` states these for the corpus.
first_match holds every signature in the step's process (512 bytes per document at 128).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline import (
    OutputOf,
    Resources,
    Step,
    StepDeclarationError,
    step_function,
    this_output,
    versioned,
)
from pipeline.steplib import (
    EVIDENCE_DIR,
    EXCERPT_CHARS,
    KEPT_DIR,
    KEPT_SAMPLE,
    evidence_line,
    format_size,
    parallel_map,
    step_events,
)
from steps.data.dedupe_bands import (
    Removed,
    lsh_bands,
)
from steps.data.dedupe_config import DedupeConfig
from steps.data.dedupe_first_match import first_match_pass
from steps.data.dedupe_passes import DedupeError, components_pass, loader, normalize, sign_shard, work_path
from steps.data.shards import is_shard, shard_texts, write_kept
from steps.data.sources import (
    InputError,
    RawDataset,
    check_local_inputs_exist,
    input_identity,
    raw_listing,
    read_files,
)
from steps.files import exists, read_bytes, read_json, write_file, write_json

__all__ = ["DedupeConfig", "DedupeError", "dedupe", "dedupe_step", "normalize", "removed_indices"]

MINHASH = ("one_permutation", "datasketch")
TWIN_SAMPLE = 20
"""Removed documents per shard whose evidence carries the kept document's excerpt and the
estimated similarity (every one names the kept document)."""
GROUPING = ("components", "first_match")


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
    minhash: str = "one_permutation",
    grouping: str = "components",
    band_parts: int = 1,
    documents: int | None = None,
) -> Step:
    """A ready dedupe `Step`. The inputs' identities, the text field, what is removed and the
    MinHash parameters are versioned; a bad parameter is a `StepDeclarationError` naming it."""
    _check(
        name,
        threshold=threshold,
        ngram=ngram,
        num_perm=num_perm,
        inputs=inputs,
        sample_pairs=sample_pairs,
        minhash=minhash,
        grouping=grouping,
        band_parts=band_parts,
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
            minhash=versioned(minhash),
            grouping=versioned(grouping),
            band_parts=band_parts,
            documents=documents,
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
    for key, allowed in (("minhash", MINHASH), ("grouping", GROUPING)):
        if values[key] not in allowed:
            raise StepDeclarationError(
                step, f"{key} must be one of {', '.join(allowed)}, got {values[key]!r}", field=key
            )
    parts = values["band_parts"]
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise StepDeclarationError(
            step, f"band_parts must be a positive integer, got {parts!r}", field="band_parts"
        )


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


def preview(config: DedupeConfig) -> str:
    """The passes, and with `documents` what each task and the step's process hold, for the plan."""
    lines = [
        f"signatures: {config.minhash}, {config.num_perm} values of word {config.ngram}-grams per document"
    ]
    signature_bytes = 4 * config.num_perm + 16
    docs = config.documents
    if config.grouping == "components":
        bands, rows = lsh_bands(config.threshold, config.num_perm) if config.near else (0, 0)
        passes = bands + int(config.exact)
        lines.append(
            f"global pass: components; {bands} bands of {rows} values (threshold {config.threshold})"
            + (" and the exact pass" if config.exact else "")
            + f", {config.band_parts} part(s) each: {passes * config.band_parts} tasks, "
            + f"{config.num_workers} at once"
        )
        if docs:
            lines.append(
                f"memory for {docs:,} documents: a band part {format_size(16 * docs / config.band_parts)} "
                f"and {4 * config.num_perm} bytes per candidate; the step's process 16 bytes per "
                f"document with a duplicate ({format_size(0.16 * docs)} per 1% of them); "
                f"signatures on disk {format_size(signature_bytes * docs)}"
            )
    else:
        lines.append("global pass: first_match, in the step's process")
        if docs:
            lines.append(
                f"memory for {docs:,} documents: the step's process {format_size(signature_bytes * docs)}"
            )
    if not docs:
        lines.append("(documents=N gives the memory figures)")
    return "\n".join(lines)


@step_function(inputs=dedupe_inputs, report=_report, check=_inputs_exist, preview=preview)
def dedupe(config: DedupeConfig) -> None:
    """Deduplicate `config.inputs` into `config.output` (see the module docstring)."""
    names = ("threshold", "ngram", "num_perm", "inputs", "sample_pairs", "minhash", "grouping", "band_parts")
    _check(None, **{k: getattr(config, k) for k in names})
    shards = _shards(config)
    started = time.time()
    # Components read the signatures from .work/ in their band tasks: the step's process keeps
    # a count per shard, and then the removed documents' indices.
    whole = config.grouping == "first_match"
    args = [(config, path, key, whole) for path, key, _source in shards]
    signatures: dict[str, dict[str, np.ndarray]] = {}
    for done, (key, sig) in enumerate(parallel_map(sign_shard, args, max_workers=config.num_workers), 1):
        signatures[key] = sig
        step_events.progress(done, len(shards), "shards signed")
    order = [key for _path, key, _source in shards]
    if whole:
        flags = {k: getattr(config, k) for k in ("exact", "near", "threshold", "num_perm")}
        removed = Removed.of(order, *first_match_pass(order, signatures, **flags), sample=config.sample_pairs)
    else:
        removed = components_pass(config, order, [int(signatures[key]["documents"]) for key in order])
    write_args = [
        (config, path, key, removed.indices[key], removed.exact[key], removed.twins[key], shards)
        for path, key, _source in shards
    ]
    tallies = {}
    for done, (key, tally) in enumerate(
        parallel_map(_write_shard, write_args, max_workers=config.num_workers), 1
    ):
        tallies[key] = tally
        step_events.progress(done, len(shards), "shards written")
    _write_pairs(config, shards, removed.sample)
    _write_stats(config, shards, tallies, removed, time.time() - started)


def removed_indices(source: str, kept: str, text_field: str = "text") -> list[int]:
    """Indices of the records of the input shard `source` that `kept`, the step's output for it
    (`<output>/data/...`), does not hold. The step keeps a shard's records in their order, so
    one pass over both finds them; a kept record that is not the next one of the input is a
    `DedupeError` (the two files do not belong together)."""
    kept_texts = iter(shard_texts(kept, text_field))
    current = next(kept_texts, None)
    removed = []
    for i, text in enumerate(shard_texts(source, text_field)):
        if text == current:
            current = next(kept_texts, None)
        else:
            removed.append(i)
    if current is not None:
        raise DedupeError(f"{kept} holds records that are not those of {source}, in order")
    return removed


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


def _write_shard(
    config: DedupeConfig,
    src: str,
    key: str,
    removed: np.ndarray,
    exact: np.ndarray,
    twins: tuple[np.ndarray, np.ndarray],
    shards: list[tuple[str, str, str]],
) -> tuple[str, dict[str, Any]]:
    """Write the shard's kept records and its evidence; its documents and bytes in and kept, and
    its removals per reason."""
    with np.load(io.BytesIO(read_bytes(work_path(config, key)))) as data:
        sizes = data["bytes"]
    keep = np.ones(len(sizes), dtype=bool)
    keep[removed] = False
    write_kept(src, f"{config.output}/data/{key}", keep.tolist())
    lines, sample, reasons = _evidence(config, src, key, removed, exact, twins, shards)
    write_file(f"{config.output}/{EVIDENCE_DIR}/{key}.jsonl", "".join(line + "\n" for line in lines).encode())
    write_file(f"{config.output}/{KEPT_DIR}/{key}.jsonl", "".join(line + "\n" for line in sample).encode())
    tally = {"documents_in": len(sizes), "documents_out": int(keep.sum()), "bytes_in": int(sizes.sum())}
    return key, {**tally, "bytes_out": int(sizes[keep].sum()), "reasons": reasons}


def _evidence(
    config: DedupeConfig,
    src: str,
    key: str,
    removed: np.ndarray,
    exact: np.ndarray,
    twins: tuple[np.ndarray, np.ndarray],
    shards: list[tuple[str, str, str]],
) -> tuple[list[str], list[str], dict[str, dict[str, int]]]:
    """The shard's evidence lines (`pipeline.observe.evidence`), its kept sample, and its removals
    per reason. Every removed document names the document kept for it; the first `TWIN_SAMPLE`
    also carry its excerpt and, for a near duplicate, the estimated similarity (the share of equal
    MinHash values): that costs reading the kept documents' shards, so it is done for what the
    views show, not for every removal."""
    gone = {int(i): j for j, i in enumerate(removed.tolist())}
    texts: dict[int, str] = {}
    sample: list[str] = []
    for i, text in enumerate(shard_texts(src, config.text_field)):
        if i in gone:
            texts[i] = text
        elif len(sample) < KEPT_SAMPLE:
            sample.append(json.dumps(evidence_line(i, None, text, None), ensure_ascii=False))
    twin_shard, twin_index = twins
    shown = min(TWIN_SAMPLE, len(removed))
    wanted: dict[int, set[int]] = {}
    for j in range(shown):
        wanted.setdefault(int(twin_shard[j]), set()).add(int(twin_index[j]))
    twin_texts: dict[tuple[int, int], str] = {}
    for shard, indices in wanted.items():
        last = max(indices)
        for i, text in enumerate(shard_texts(shards[shard][0], config.text_field)):
            if i in indices:
                twin_texts[(shard, i)] = text[:EXCERPT_CHARS]
            if i >= last:
                break
    load, signatures = loader(config), {}

    def signature(shard_key: str, index: int) -> np.ndarray | None:
        if shard_key not in signatures:
            signatures[shard_key] = load(shard_key, "minhash")
        rows = signatures[shard_key]
        return rows[index] if index < len(rows) and rows.shape[1] else None

    lines: list[str] = []
    reasons: dict[str, dict[str, int]] = {}
    for j, index in enumerate(removed.tolist()):
        shard, twin = int(twin_shard[j]), int(twin_index[j])
        reason = "exact_duplicate" if exact[j] else "near_duplicate"
        detail: dict[str, Any] = {"duplicate_of": {"file": shards[shard][1], "index": twin}}
        score: float | None = 1.0 if exact[j] else None
        if j < shown:
            detail["duplicate_of"]["excerpt"] = twin_texts.get((shard, twin), "")
            if not exact[j]:
                a, b = signature(key, index), signature(shards[shard][1], twin)
                score = None if a is None or b is None else round(float(np.mean(a == b)), 4)
        line = evidence_line(index, None, texts[index], reason, score, detail)
        into = reasons.setdefault(reason, {"documents": 0, "bytes": 0})
        into["documents"] += 1
        into["bytes"] += line["bytes"]
        lines.append(json.dumps(line, ensure_ascii=False))
    return lines, sample, reasons


def _write_pairs(
    config: DedupeConfig, shards: list[tuple[str, str, str]], sample: list[dict[str, Any]]
) -> None:
    """A sample of removed documents beside the one each duplicates, for inspection."""
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
    tallies: dict[str, dict[str, int]],
    removed: Removed,
    seconds: float,
) -> None:
    sources: dict[str, dict[str, int]] = {}
    reasons: dict[str, dict[str, int]] = {}
    for _path, key, source in shards:
        s = sources.setdefault(source, dict.fromkeys(_TALLIES, 0))
        for name, value in tallies[key].items():
            if name == "reasons":
                for reason, counts in value.items():
                    into = reasons.setdefault(reason, {"documents": 0, "bytes": 0})
                    into["documents"] += counts["documents"]
                    into["bytes"] += counts["bytes"]
                continue
            s[name] += value
        exact = int(removed.exact[key].sum())
        s["exact_removed"] += exact
        s["near_removed"] += len(removed.exact[key]) - exact
    total = {k: sum(s[k] for s in sources.values()) for k in _TALLIES}
    write_json(
        f"{config.output}/stats.json",
        {
            "parameters": {
                "exact": config.exact,
                "near": config.near,
                "threshold": config.threshold,
                "ngram": config.ngram,
                "num_perm": config.num_perm,
                "minhash": config.minhash,
                "grouping": config.grouping,
                "text_field": config.text_field,
            },
            "total": {**total, "clusters": removed.clusters, "reasons": dict(sorted(reasons.items()))},
            "sources": sources,
            "files": {key: tallies[key]["documents_out"] for _p, key, _s in shards},
            "seconds": round(seconds, 3),
        },
    )


_TALLIES = ("documents_in", "documents_out", "bytes_in", "bytes_out", "exact_removed", "near_removed")
