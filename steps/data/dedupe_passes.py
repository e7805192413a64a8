"""The dedupe step's passes (`steps.data.dedupe`): each shard's exact hashes and MinHash
signatures, written to `.work/` so a killed pass resumes, and the global pass as connected
components of every LSH band's pairs, one `parallel_map` task per band part
(`steps.data.dedupe_bands`). What a document is compared as is `normalize`'s form."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from itertools import islice, pairwise

import numpy as np

from pipeline.steplib import parallel_map, step_events
from steps.data.dedupe_bands import (
    EXACT,
    Removed,
    band_pairs,
    load_pairs,
    lsh_bands,
    merge,
    removals,
    save_pairs,
)
from steps.data.dedupe_config import DedupeConfig
from steps.data.dedupe_first_match import datasketch_signer
from steps.data.minhash import BATCH_BYTES, sign
from steps.data.normalized import normalize, normalized_bytes
from steps.data.shards import ShardError, shard_texts
from steps.files import exists, read_bytes, write_file

__all__ = [
    "DedupeError",
    "band_task",
    "components_pass",
    "exact_hashes",
    "loader",
    "normalize",
    "sign_shard",
    "signer",
    "work_path",
]

_FOLD_AT = 1 << 20  # pairs waiting before the components pass folds them in (16 MiB)


class DedupeError(ValueError):
    """A dedupe configuration or input that cannot be used."""


def sign_shard(
    config: DedupeConfig, path: str, key: str, with_minhash: bool = True
) -> tuple[str, dict[str, np.ndarray]]:
    """One shard's exact hashes, MinHash signatures (unless not `with_minhash`) and text bytes;
    reused if already written."""
    work = work_path(config, key)
    if exists(work):
        with np.load(io.BytesIO(read_bytes(work))) as data:
            if not with_minhash:
                return key, {"documents": np.asarray(len(data["exact"]))}
            return key, {name: data[name] for name in data.files}
    exact: list[np.ndarray] = []
    sigs: list[np.ndarray] = []
    sizes: list[int] = []
    batch: list[str] = []  # texts not yet hashed
    batch_bytes = 0
    sign = signer(config)

    def flush() -> None:
        sizes.extend([len(t) if t.isascii() else len(t.encode("utf-8")) for t in batch])
        data, offsets = normalized_bytes(batch)
        exact.append(exact_hashes(data, offsets))
        if config.near:
            sigs.append(sign(data, offsets))
        batch.clear()

    texts = shard_texts(path, config.text_field)
    try:
        # A few hundred texts at a time: the batch is gathered without Python work per text.
        while chunk := list(islice(texts, 256)):
            batch.extend(chunk)
            batch_bytes += sum(map(len, chunk))
            if batch_bytes >= BATCH_BYTES:
                flush()
                batch_bytes = 0
    except ShardError as e:
        raise DedupeError(str(e)) from e
    if batch:
        flush()
    width = config.num_perm if config.near else 0
    result = {
        "exact": np.concatenate(exact) if exact else np.zeros(0, dtype=np.uint64),
        "bytes": np.array(sizes, dtype=np.int64),
        "minhash": np.concatenate(sigs) if sigs else np.zeros((0, width), dtype=np.uint32),
    }
    out = io.BytesIO()
    np.savez(out, **result)
    write_file(work, out.getvalue())  # whole or not at all: a killed shard is redone
    if not with_minhash:
        return key, {"documents": np.asarray(len(sizes))}
    return key, result


def work_path(config: DedupeConfig, key: str) -> str:
    return f"{config.output}/.work/{key}.npz"


def loader(config: DedupeConfig) -> Callable[[str, str], np.ndarray]:
    def load(key: str, name: str) -> np.ndarray:
        with np.load(io.BytesIO(read_bytes(work_path(config, key)))) as data:
            return data[name]

    return load


def band_task(
    config: DedupeConfig, order: list[str], counts: list[int], band: int, rows: int, part: int
) -> tuple[int, np.ndarray]:
    """One band's part of the components pass (`steps.data.dedupe_bands`); reused if already written."""
    name = "exact" if band == EXACT else f"band{band:03d}"
    work = f"{config.output}/.work/bands/{name}-{part:04d}.npy"
    if exists(work):
        return band, load_pairs(read_bytes(work))
    pairs = band_pairs(
        order,
        counts,
        loader(config),
        band=band,
        rows=rows,
        part=part,
        parts=config.band_parts,
        threshold=config.threshold,
    )
    write_file(work, save_pairs(pairs))  # whole or not at all: a killed task is redone
    return band, pairs


def components_pass(config: DedupeConfig, order: list[str], counts: list[int]) -> Removed:
    """What to remove, from the connected components of every band's pairs (`steps.data.dedupe_bands`)."""
    bands, rows = lsh_bands(config.threshold, config.num_perm) if config.near else (0, 0)
    tasks = ([EXACT] if config.exact else []) + list(range(bands))
    args = [(config, order, counts, band, rows, part) for band in tasks for part in range(config.band_parts)]
    none = np.zeros(0, dtype=np.int64)
    grouped, exact_later = (none, none), [none]
    pending: list[np.ndarray] = []
    waiting = 0
    for done, (band, pairs) in enumerate(parallel_map(band_task, args, max_workers=config.num_workers), 1):
        if band == EXACT:
            exact_later.append(np.unique(pairs[:, 1]))
        pending.append(pairs)
        waiting += len(pairs)
        # Fold the pairs in once they outnumber the documents grouped so far: the process holds
        # at most about twice the grouped documents, and each is re-sorted O(log) times, not
        # once per part.
        if waiting >= max(len(grouped[0]), _FOLD_AT):
            grouped, pending, waiting = merge(grouped, np.concatenate(pending)), [], 0
        step_events.progress(done, len(args), "band parts paired")
    if pending:
        grouped = merge(grouped, np.concatenate(pending))
    removed = removals(order, counts, grouped, np.concatenate(exact_later), sample=config.sample_pairs)
    # The estimated similarity of the sampled near duplicates to the document kept for them.
    load, loaded = loader(config), {}
    for r in removed.sample:
        if r["similarity"] is None:
            for key in (r["doc"][0], r["of"][0]):
                if key not in loaded:
                    loaded[key] = load(key, "minhash")
            a, b = loaded[r["doc"][0]][r["doc"][1]], loaded[r["of"][0]][r["of"][1]]
            r["similarity"] = round(float(np.mean(a == b)), 4)
    return removed


def exact_hashes(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The exact pass's key of each document of a normalized batch (`normalized_bytes`): the
    first 8 bytes of the BLAKE2b of its normalized UTF-8, little-endian, as uint64."""
    view, bounds = memoryview(data), offsets.tolist()
    digests = b"".join(hashlib.blake2b(view[a:b], digest_size=8).digest() for a, b in pairwise(bounds))
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def signer(config: DedupeConfig) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Signatures (uint32, a row per document) of a normalized batch (`normalized_bytes`'s
    buffer and offsets), as `config.minhash` says."""
    if config.minhash == "one_permutation":
        return lambda data, offsets: sign(data, offsets, ngram=config.ngram, num_perm=config.num_perm)
    one_by_one = datasketch_signer(config.ngram, config.num_perm)

    def datasketch(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        raw, bounds = data.tobytes(), offsets.tolist()
        return one_by_one([raw[a:b].decode("utf-8") for a, b in pairwise(bounds)])

    return datasketch
