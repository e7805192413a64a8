"""The form the dedupe step compares documents in, one at a time (`normalize`) or a batch at once
as one UTF-8 buffer (`normalized_bytes`, what the signature pass hashes)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import numpy as np

__all__ = ["normalize", "normalized_bytes"]


def normalize(text: str) -> str:
    """The form duplicates are compared in: NFKC, lower case, whitespace runs as one space."""
    # str.split() splits on exactly the characters re's \s matches (str.isspace), three times
    # faster than a regex; ASCII is its own NFKC form.
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    return " ".join(text.lower().split())


def normalized_bytes(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every text in `normalize`'s form as UTF-8, in one buffer (uint8), and the `len + 1`
    offsets of the texts in it: text i is `data[offsets[i]:offsets[i + 1]]`, equal to
    `normalize(texts[i]).encode()`.

    An ASCII text (most of a web crawl) is only lower-cased and has its whitespace collapsed, and
    that is done for the whole batch in one compiled pass (`steps.data.compiled_loops.collapse_ascii`);
    other texts are normalized one by one in Python (NFKC and Unicode case and whitespace), after
    which the same pass leaves them as they are."""
    from steps.data.compiled_loops import collapse_ascii

    parts = [t if t.isascii() else normalize(t) for t in texts]
    # str.isascii is a flag read, and an ASCII str's length is its UTF-8 length.
    lengths = [len(p) if p.isascii() else len(p.encode("utf-8")) for p in parts]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(bytearray("".join(parts).encode("utf-8")), dtype=np.uint8)
    used = collapse_ascii(data, offsets)
    return data[:used], offsets
