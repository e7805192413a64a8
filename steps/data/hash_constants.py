"""The constants that define the n-gram hashes of `steps.data.minhash`, shared with its compiled
pass (`steps.data.compiled_loops`): changing one changes every signature, and so every dedupe's result."""

from __future__ import annotations

import numpy as np

__all__ = ["GRAM_BASE", "LENGTH", "WORD_BASE"]

WORD_BASE = np.uint64(0x100000001B3)  # FNV's 64-bit prime: odd, so it has an inverse mod 2^64
GRAM_BASE = np.uint64(0x9E3779B97F4A7C15)  # the golden ratio's odd 64-bit constant
LENGTH = np.uint64(0xD6E8FEB86659FD93)
