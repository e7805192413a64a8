"""What the parts of the tokenize step share: its error and the counts of one shard."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardStats", "TokenizeError"]


class TokenizeError(ValueError):
    """Bad input to the tokenize step: names the file (and line) and how to fix it."""


@dataclass
class ShardStats:
    """Counts of one input file (one shard)."""

    path: str
    shard: str
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    skipped: int = 0
    seconds: float = 0.0
