"""The token cache the tokenize step writes: one Levanter TreeStore per input file (a shard).

    <split>/part-00000/                     a shard's TreeStore
    <split>/part-00000/.drydock-shard.json  its counts; written when the shard is complete
    <split>/shard_ledger.json               the split's sharded-layout ledger, written last

A shard is complete once its marker is written; a rerun skips complete shards and redoes the rest.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import fsspec

from steps.data.tokenize.common import ShardStats
from steps.data.tokenize.readers import documents
from steps.data.tokenize.tokenizer import load_tokenizer
from steps.files import write_json, write_text

if TYPE_CHECKING:
    from steps.data.tokenize import TokenizeConfig

__all__ = ["LEDGER", "SHARD_MARKER", "read_marker", "tokenize_shard", "write_ledger"]

SHARD_MARKER = ".drydock-shard.json"
LEDGER = "shard_ledger.json"


def tokenize_shard(config: TokenizeConfig, split_dir: str, path: str, shard: str) -> ShardStats:
    """Tokenize one input file into the TreeStore `<split_dir>/<shard>`; its marker is written last."""
    import numpy as np
    from levanter.store.tree_store import TreeStore

    started = time.time()
    shard_dir = f"{split_dir}/{shard}"
    fs, local = fsspec.core.url_to_fs(shard_dir)
    if fs.exists(local):
        fs.rm(local, recursive=True)  # a partial shard from an interrupted attempt
    tok = load_tokenizer(config.tokenizer)
    store = TreeStore.open(
        {"input_ids": np.zeros((0,), dtype=np.int32)}, shard_dir, mode="w", cache_metadata=False
    )
    stats = ShardStats(path=path, shard=shard)
    batch: list[str] = []

    def flush() -> None:
        ids = tok.encode(batch)
        store.extend([{"input_ids": np.asarray(x, dtype=np.int32)} for x in ids])
        stats.documents += len(ids)
        stats.tokens += sum(len(x) for x in ids)
        batch.clear()

    for text in documents(path, config, stats):
        stats.bytes += len(text.encode("utf-8"))
        batch.append(text)
        if len(batch) >= config.batch_size:
            flush()
    if batch:
        flush()
    stats.seconds = time.time() - started
    write_ledger(shard_dir, None, tok.metadata, rows=stats.documents, tokens=stats.tokens)
    write_json(f"{shard_dir}/{SHARD_MARKER}", asdict(stats))
    return stats


def read_marker(shard_dir: str) -> ShardStats | None:
    try:
        with fsspec.open(f"{shard_dir}/{SHARD_MARKER}", "r") as f:
            return ShardStats(**json.load(f))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def write_ledger(
    cache_dir: str,
    shards: list[ShardStats] | None,
    metadata: dict[str, Any],
    *,
    rows: int = 0,
    tokens: int = 0,
) -> None:
    """A Levanter `CacheLedger`: for one shard (`shards` None) or the sharded split (its shards)."""
    from levanter.store.cache import CACHE_LAYOUT_SHARDED, CacheLedger, CacheMetadata

    meta = CacheMetadata(preprocessor_metadata=metadata)
    if shards is None:
        ledger = CacheLedger(
            total_num_rows=rows,
            shard_rows={},
            is_finished=True,
            field_counts={"input_ids": tokens},
            metadata=meta,
        )
    else:
        ledger = CacheLedger(
            total_num_rows=sum(s.documents for s in shards),
            shard_rows={s.shard: s.documents for s in shards},
            is_finished=True,
            finished_shards=[s.shard for s in shards],
            field_counts={"input_ids": sum(s.tokens for s in shards)},
            field_counts_by_shard={s.shard: {"input_ids": s.tokens} for s in shards},
            layout=CACHE_LAYOUT_SHARDED,
            metadata=meta,
        )
    write_text(f"{cache_dir}/{LEDGER}", ledger.to_json())  # type: ignore[attr-defined]
