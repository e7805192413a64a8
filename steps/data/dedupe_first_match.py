"""The dedupe step's passes as they were first written (`minhash="datasketch"`,
`grouping="first_match"`): what a recipe recorded before those fields existed reruns, unchanged.

    datasketch_signer   a `datasketch.MinHash` per document: `num_perm` permutations of each word
                        n-gram's SHA-1 (one Python string and bytes object per n-gram)
    first_match_pass    in the step's process, documents in input order: an exact duplicate of
                        one seen before, else LSH (`datasketch.MinHashLSH`) among the documents
                        kept so far; a match at or above the threshold removes the document as a
                        duplicate of the most similar, else it is kept and indexed
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["datasketch_signer", "first_match_pass"]

_SEED = 1  # MinHash permutations: fixed, so signatures are comparable across shards and reruns
_SCHEME = "affine32"  # datasketch 2.0 needs it named when signatures are rebuilt from values


def datasketch_signer(ngram: int, num_perm: int) -> Callable[[list[str]], np.ndarray]:
    """Signatures (uint32, a row per text) of normalized texts, one `datasketch.MinHash` each."""
    from datasketch import MinHash

    permutations = MinHash(num_perm=num_perm, seed=_SEED, scheme=_SCHEME).permutations

    def one_by_one(texts: list[str]) -> np.ndarray:
        rows = []
        for norm in texts:
            words = norm.split(" ")
            grams = [" ".join(words[i : i + ngram]) for i in range(max(1, len(words) - ngram + 1))]
            m = MinHash(num_perm=num_perm, seed=_SEED, permutations=permutations, scheme=_SCHEME)
            m.update_batch([g.encode() for g in grams])
            rows.append(m.hashvalues.astype(np.uint32))
        return np.array(rows, dtype=np.uint32).reshape(len(rows), num_perm)

    return one_by_one


def first_match_pass(
    order: list[str],
    signatures: dict[str, dict[str, np.ndarray]],
    *,
    exact: bool,
    near: bool,
    threshold: float,
    num_perm: int,
) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], int]:
    """Keep flags per shard, the removed documents (kind, similarity, what they duplicate), and
    the number of clusters (kept documents with at least one duplicate removed)."""
    from datasketch import LeanMinHash, MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm) if near else None
    seen: dict[int, tuple[str, int]] = {}
    keep = {key: np.ones(len(signatures[key]["exact"]), dtype=bool) for key in order}
    removed: list[dict[str, Any]] = []
    kept_as: dict[tuple[str, int], tuple[str, int]] = {}  # a removed document -> the kept one
    clusters: set[tuple[str, int]] = set()
    for key in order:
        sig = signatures[key]
        for i, digest in enumerate(sig["exact"].tolist()):
            if exact and digest in seen:
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
                if similarity >= threshold and (best is None or similarity > best[0]):
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
