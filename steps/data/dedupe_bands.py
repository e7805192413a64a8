"""The dedupe step's global pass as connected components, sharded by LSH band (`steps.data.dedupe`,
`grouping="components"`).

    band task (band j, part p)   for every document whose band-j key falls in part p: its key
                                 (a hash of signature values j*r .. (j+1)*r - 1; the exact hash
                                 for the exact "band"); documents of equal key are candidates:
                                 each is paired with the first of its bucket and with the one
                                 before it; near pairs whose estimated similarity is below the
                                 threshold are dropped. Written to .work/bands/<band>-<part>.npz
                                 (a rerun reuses it).
    the step's process           the union of every task's pairs; connected components
                                 (scipy); in each, the first document in input order is kept and
                                 the others are removed as its duplicates

Bands and parts are fanned out with `parallel_map` (Ray tasks on a Ray worker, local processes
otherwise), `bands x parts` tasks in all. A task reads every shard's signature file, one shard at
a time, and holds 16 bytes per document of its part (key and index) plus the signatures of its
candidates: memory falls with `parts`, not with the corpus. The result depends on neither
`parts` nor how tasks are placed: a band's buckets, and so its pairs, are the same however they
are split, and components do not depend on the order pairs arrive in.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from steps.data.minhash import mix

__all__ = ["EXACT", "Removed", "band_pairs", "bucket_pairs", "components", "lsh_bands", "merge", "removals"]

EXACT = -1
"""The band number of the exact-duplicate pass (the key is the normalized text's hash)."""

_U64 = np.uint64
_BAND_BASE = _U64(0x9E3779B97F4A7C15)

Loader = Callable[[str, str], np.ndarray]
"""(shard key, array name) -> that array of the shard's signature file."""


@functools.cache
def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) for a threshold, as datasketch's `MinHashLSH` chooses them (the
    least sum of the false-positive area below the threshold and the false-negative area above,
    weighted equally): the first-match pass's bands, computed here without importing datasketch
    and scipy (half a second) on a 2,001-point Simpson rule, for all (b, r) at once."""
    b, r = np.meshgrid(np.arange(1, num_perm + 1), np.arange(1, num_perm + 1), indexing="ij")
    valid = b * r <= num_perm
    b, r = b[valid].astype(float), r[valid].astype(float)

    def area(lo: float, hi: float, miss: bool) -> np.ndarray:
        s = np.linspace(lo, hi, 2001)
        caught = 1 - (1 - s[None, :] ** r[:, None]) ** b[:, None]
        f = 1 - caught if miss else caught
        weights = np.ones(len(s))
        weights[1:-1:2], weights[2:-1:2] = 4, 2
        return f @ weights * (hi - lo) / (3 * (len(s) - 1))

    error = 0.5 * area(0.0, threshold, miss=False) + 0.5 * area(threshold, 1.0, miss=True)
    best = int(np.argmin(error))  # the first least, in datasketch's order (b, then r)
    return int(b[best]), int(r[best])


def band_keys(minhash: np.ndarray, band: int, rows: int) -> np.ndarray:
    """A 64-bit key per document for signature values band*rows .. band*rows + rows - 1."""
    values = minhash[:, band * rows : (band + 1) * rows].astype(_U64)
    key = np.zeros(len(minhash), dtype=_U64)
    for column in range(rows):  # a polynomial in the values, mod 2^64
        key = key * _BAND_BASE + values[:, column]
    return mix(key + _U64(band + 1))


def bucket_pairs(keys: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Candidate pairs (rows of two document indices, the earlier first) among documents of equal
    key: each document after the first of its bucket with the bucket's first and with the one
    before it. Linear in the bucket's size, where all pairs would be quadratic."""
    if len(keys) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    order = np.lexsort((index, keys))
    keys, index = keys[order], index[order]
    same = np.concatenate(([False], keys[1:] == keys[:-1]))  # not the first of its bucket
    starts = np.flatnonzero(~same)
    first = index[starts[np.cumsum(~same) - 1]]
    members = np.flatnonzero(same)
    pairs = np.concatenate(
        (
            np.stack((first[members], index[members]), axis=1),
            np.stack((index[members - 1], index[members]), axis=1),
        )
    )
    return np.unique(pairs, axis=0) if len(pairs) else pairs.reshape(0, 2)


def band_pairs(
    order: Sequence[str],
    counts: Sequence[int],
    load: Loader,
    *,
    band: int,
    rows: int,
    part: int,
    parts: int,
    threshold: float,
) -> np.ndarray:
    """The verified pairs of one band's part (see the module docstring). `order` and `counts`
    are the shards in input order and their documents; document indices run across them."""
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    keys, index = [], []
    for k, key in enumerate(order):
        if not counts[k]:
            continue
        shard_keys = load(key, "exact") if band == EXACT else band_keys(load(key, "minhash"), band, rows)
        mine = np.flatnonzero(shard_keys % _U64(parts) == _U64(part))
        keys.append(shard_keys[mine])
        index.append(mine.astype(np.int64) + offsets[k])
    if not keys:
        return np.zeros((0, 2), dtype=np.int64)
    pairs = bucket_pairs(np.concatenate(keys), np.concatenate(index))
    if band == EXACT or not len(pairs):
        return pairs
    # Verify: the estimated similarity of each candidate pair, from the signatures of the
    # documents in pairs only, gathered shard by shard.
    needed = np.unique(pairs)
    gathered = []
    for k, key in enumerate(order):
        lo, hi = np.searchsorted(needed, [offsets[k], offsets[k + 1]])
        if hi > lo:
            gathered.append(load(key, "minhash")[needed[lo:hi] - offsets[k]])
    rows_of = np.concatenate(gathered)
    a, b = rows_of[np.searchsorted(needed, pairs[:, 0])], rows_of[np.searchsorted(needed, pairs[:, 1])]
    similarity = (a == b).mean(axis=1)
    return pairs[similarity >= threshold]


def components(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(documents, their survivor): every document in a pair, and the first document (the least
    index) of its connected component."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not len(pairs):
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    nodes, local = np.unique(pairs, return_inverse=True)
    local = local.reshape(-1, 2)
    graph = coo_matrix(
        (np.ones(len(local), dtype=np.int8), (local[:, 0], local[:, 1])), shape=(len(nodes),) * 2
    )
    _count, label = connected_components(graph, directed=False)
    first = np.full(label.max() + 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, label, nodes)  # nodes are sorted: any order works, min is exact
    return nodes, first[label]


@dataclass
class Removed:
    """What the global pass removes: per shard the removed documents' indices and whether each
    is an exact duplicate; a sample of them in input order (kind, similarity, the document kept
    for it), and the number of clusters (kept documents with duplicates removed)."""

    indices: dict[str, np.ndarray]
    exact: dict[str, np.ndarray]
    sample: list[dict[str, Any]]
    clusters: int
    twins: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per shard, for each removed document (as `indices`), the document kept for it: its shard's
    place in the pass's order and its index there."""

    @classmethod
    def of(
        cls,
        order: Sequence[str],
        keep: Mapping[str, np.ndarray],
        removed: list[dict[str, Any]],
        clusters: int,
        *,
        sample: int,
    ) -> Removed:
        """From keep flags and a list of removed documents (the first-match pass's form)."""
        kinds = {r["doc"]: r["kind"] == "exact" for r in removed}
        kept_for = {r["doc"]: r["of"] for r in removed}
        place = {key: k for k, key in enumerate(order)}
        indices = {key: np.flatnonzero(~keep[key]) for key in order}
        exact = {key: np.array([kinds[(key, i)] for i in indices[key].tolist()], dtype=bool) for key in order}
        twins = {}
        for key in order:
            of = [kept_for[(key, i)] for i in indices[key].tolist()]
            twins[key] = (
                np.array([place[k] for k, _ in of], dtype=np.int64),
                np.array([i for _, i in of], dtype=np.int64),
            )
        return cls(indices, exact, removed[:sample], clusters, twins)


def merge(grouped: tuple[np.ndarray, np.ndarray], pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Components so far (`components`' result) joined with more pairs: the step's process folds
    each band part in as it arrives, holding the grouped documents and one part's pairs at a time,
    never every pair at once."""
    nodes, survivors = grouped
    return components(np.concatenate((np.stack((nodes, survivors), axis=1), pairs.reshape(-1, 2))))


def removals(
    order: Sequence[str],
    counts: Sequence[int],
    grouped: tuple[np.ndarray, np.ndarray],
    exact_later: np.ndarray,
    *,
    sample: int,
) -> Removed:
    """What to remove, given the components of every band's pairs (`merge`): in each, all but
    the first document. A removed document is an exact duplicate if it is in `exact_later` (the
    exact pass paired it with an earlier document of the same text); the sample's near
    duplicates have no similarity yet (None)."""
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    nodes, survivors = grouped
    gone = nodes != survivors
    doc, of = nodes[gone], survivors[gone]  # in input order: np.unique sorted the nodes
    is_exact = np.isin(doc, exact_later)
    shard = np.searchsorted(offsets, doc, side="right") - 1
    indices = {key: doc[shard == k] - offsets[k] for k, key in enumerate(order)}
    exact = {key: is_exact[shard == k] for k, key in enumerate(order)}
    twin_shard = np.searchsorted(offsets, of, side="right") - 1
    twin_index = of - offsets[twin_shard]
    twins = {key: (twin_shard[shard == k], twin_index[shard == k]) for k, key in enumerate(order)}

    def where(index: int) -> tuple[str, int]:
        k = int(np.searchsorted(offsets, index, side="right")) - 1
        return order[k], index - int(offsets[k])

    shown = [
        {"kind": "exact" if e else "near", "similarity": 1.0 if e else None, "doc": where(d), "of": where(o)}
        for d, o, e in zip(
            doc[:sample].tolist(), of[:sample].tolist(), is_exact[:sample].tolist(), strict=True
        )
    ]
    return Removed(indices, exact, shown, len(np.unique(survivors)), twins)


def save_pairs(pairs: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, pairs.astype(np.int64))
    return out.getvalue()


def load_pairs(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data))
