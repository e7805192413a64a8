"""The dedupe step's config, below the modules that read it (`dedupe`, `dedupe_passes`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline import added_field

__all__ = ["DedupeConfig"]


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
    """Near duplicates: MinHash values per document (more: a finer estimate, more memory)."""
    sample_pairs: int = 20
    """Removed documents written beside their kept duplicate to `removed_pairs.jsonl`."""
    input_root: str | None = None
    """Directory relative inputs are under; not versioned."""
    num_workers: int = 1
    """Shards processed at once (Ray tasks on a Ray worker, else local processes)."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs (`steps.data.sources`); the locations are not versioned."""
    # Added after identities were made: a recipe recorded before it rebuilds as datasketch (the
    # default here), while `dedupe_step` declares one_permutation.
    minhash: str = added_field("datasketch")
    """Near duplicates: how signatures are computed: `one_permutation` (`steps.data.minhash`: one hash
    per n-gram, binned, densified; vectorized over a batch of documents) or `datasketch` (one
    `datasketch.MinHash` per document, `num_perm` hash functions per n-gram)."""
    grouping: str = added_field("first_match")
    """How duplicates are grouped: `components` (`steps.data.dedupe_bands`: pairs found per LSH band,
    sharded; connected components; the first of each kept) or `first_match` (in one process, each
    document in turn against the documents kept before it). Added like `minhash`."""
    band_parts: int = added_field(1)
    """components: each band's documents are split into this many parts, a task each (a task's
    memory falls with it; what is removed does not change). Not versioned."""
    documents: int | None = added_field(None)
    """About how many documents the inputs hold: a planning hint for the memory figures
    `drydock plan` shows (`preview`). Not versioned."""
