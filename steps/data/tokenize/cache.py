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
from typing import Any

import fsspec

from steps.data.tokenize.common import ShardStats
from steps.data.tokenize.config import TokenizeConfig
from steps.data.tokenize.readers import documents
from steps.data.tokenize.tokenizer import load_tokenizer
from steps.files import write_json, write_text

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
    # cache_metadata: this writer is the shard's only one, so its row and token counts need not be
    # read back from the store before every write.
    store = TreeStore.open(
        {"input_ids": np.zeros((0,), dtype=np.int32)}, shard_dir, mode="w", cache_metadata=True
    )
    stats = ShardStats(path=path, shard=shard)
    batch: list[str] = []
    pending = _Pending(store.tree["input_ids"])

    def encode() -> None:
        ids, ends = tok.encode_flat(batch)
        pending.add(ids, ends)
        stats.documents += len(ends)
        stats.tokens += len(ids)
        batch.clear()

    for text in documents(path, config, stats):
        stats.bytes += len(text.encode("utf-8"))
        batch.append(text)
        if len(batch) >= config.batch_size:
            encode()
    if batch:
        encode()
    pending.write()
    stats.seconds = time.time() - started
    write_ledger(shard_dir, None, tok.metadata, rows=stats.documents, tokens=stats.tokens)
    write_json(f"{shard_dir}/{SHARD_MARKER}", asdict(stats))
    return stats


WRITE_TOKENS = 1 << 22
"""Tokens gathered before a write to the shard's store (16 MB of int32)."""


class _Pending:
    """Encoded batches not yet in the store, written `WRITE_TOKENS` at a time as one array and
    its offsets (what `TreeStore.extend` makes of a list of per-document dicts, without the
    per-document objects). Few large writes, not one per batch: the store's files are zarr3
    shards that each write rewrites whole, so 32 writes of 120,000 tokens cost 0.44 s against
    0.05 s for 3 of a million (measured on this machine)."""

    def __init__(self, column: Any) -> None:
        self.column = column
        self.ids: list[Any] = []
        self.ends: list[Any] = []
        self.tokens = 0

    def add(self, ids: Any, ends: Any) -> None:
        self.ids.append(ids)
        self.ends.append(ends + self.tokens)  # end offsets within what is pending
        self.tokens += len(ids)
        if self.tokens >= WRITE_TOKENS:
            self.write()

    def write(self) -> None:
        import numpy as np
        from levanter.store.jagged_array import PreparedBatch

        if not self.ends:
            return
        data, ends = np.concatenate(self.ids), np.concatenate(self.ends)
        self.column.extend(PreparedBatch(data, ends, None))
        self.ids, self.ends, self.tokens = [], [], 0


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
