"""MinHash signatures of many documents at once: no Python object per word or n-gram.

    texts = [normalize(t) for t in shard]            # words separated by single spaces
    sigs = signatures(texts, ngram=5, num_perm=128)  # uint32, one row per document

The dedupe step's signature pass (`steps.data.dedupe`). Two costs dominate a per-document MinHash such
as datasketch's: making a Python string, bytes object and SHA-1 per n-gram, and evaluating
`num_perm` hash functions on every n-gram. Both are gone here. `sign` (and `signatures`, which
calls it) computes the signature in one compiled pass over a batch's bytes
(`steps.data.compiled_loops`); `ngram_hashes` computes the same n-gram hashes in numpy (decontamination
uses it, and the tests check the compiled pass against it bit for bit). What is computed:

1. **Shingles.** Every word's hash is a polynomial hash of its bytes (the i-th byte plus one
   times 0x100000001B3^i, arithmetic mod 2^64) plus its length times a constant, mixed by
   splitmix64's finalizer; every n-gram's hash is a polynomial hash of its words' hashes
   the same way, mixed again. Documents of fewer than `ngram` words are one n-gram, as before.
2. **One permutation** (Li, Owen and Zhang 2012). Each n-gram's 64-bit hash picks one of
   `num_perm` bins (its high bits) and gives the bin a 32-bit value (its low bits); a
   document's signature is the minimum value in each bin. That is one hash per n-gram instead of
   `num_perm`, and the probability that two documents agree in a bin is still their Jaccard
   similarity (for the bins neither leaves empty).
3. **Densification** (Shrivastava 2017, "optimal densification"). A document with fewer
   n-grams than bins leaves bins empty; each empty bin takes the value of the first non-empty
   bin along its own fixed, pseudo-random sequence of bins (the same sequence for every
   document), so two documents' densified bins agree with the probability their Jaccard
   similarity gives, and every row is comparable with every other.

The hashes are fixed (no seed to choose), so signatures of different shards, runs and machines
compare. A polynomial hash mod 2^64 can be made to collide by a crafted word (a Thue-Morse
string of 2,048 bytes); a collision merges two n-grams, which moves a similarity by one n-gram.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from steps.data.hash_constants import GRAM_BASE, LENGTH, WORD_BASE

__all__ = ["BATCH_BYTES", "mix", "ngram_hashes", "sign", "signatures"]

BATCH_BYTES = 4 << 20
"""Text signed at once. The compiled pass (`sign`) holds the batch's bytes and 8 bytes per word
of its longest document; `ngram_hashes`'s prefix sums take about 40 bytes per byte of text."""

_U64 = np.uint64
_DENSIFY_SEED = 0x5EED  # the empty bins' probe sequences: fixed, so every run densifies alike
_MAX_PROBES = 4096


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 arrays): every output bit depends on every input bit."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


_POWERS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _powers(base: np.uint64, n: int) -> tuple[np.ndarray, np.ndarray]:
    """base^i and base^-i mod 2^64 for i < n (kept per base, grown as needed: every batch of the
    same size reuses them)."""
    have = _POWERS.get(int(base))
    if have is None or len(have[0]) < n:
        size = max(n, 2 * len(have[0]) if have else 0)
        up = np.full(size, base, dtype=_U64)
        down = np.full(size, _U64(pow(int(base), -1, 1 << 64)), dtype=_U64)
        up[0] = down[0] = 1
        have = _POWERS[int(base)] = (np.cumprod(up, dtype=_U64), np.cumprod(down, dtype=_U64))
    return have[0][:n], have[1][:n]


def _span_hashes(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: np.uint64) -> np.ndarray:
    """sum(values[j] * base^(j - start)) over [start, end) for each span, mod 2^64: prefix sums
    of values weighted by base^j, shifted back by base^-start."""
    up, down = _powers(base, len(values) + 1)  # + 1: an empty span may start at the very end
    prefix = np.zeros(len(values) + 1, dtype=_U64)
    np.multiply(values, up[: len(values)], out=values)
    np.cumsum(values, dtype=_U64, out=prefix[1:])
    return (prefix[ends] - prefix[starts]) * down[starts]


def ngram_hashes(texts: Sequence[str], ngram: int, *, short: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hash of every word n-gram of every text (words split on single spaces), and the
    index of each text's first n-gram. A text of fewer than `ngram` words, the empty text
    included, is one n-gram of all its words; with `short=False` it has none (and the index of
    its first n-gram is that of the next text's). A text must not hold a newline
    (`steps.data.dedupe.normalize` removes them)."""
    if not texts:
        return np.zeros(0, dtype=_U64), np.zeros(0, dtype=np.int64)
    data = np.frombuffer("\n".join(texts).encode("utf-8"), dtype=np.uint8)
    separator = (data == ord(" ")) | (data == ord("\n"))
    cuts = np.flatnonzero(separator)
    word_starts = np.concatenate(([0], cuts + 1))
    word_ends = np.concatenate((cuts, [len(data)]))
    # Bytes count from 1, so that a zero byte still adds to the hash; the length separates words
    # whose bytes sum alike.
    words = _span_hashes(data.astype(_U64) + _U64(1), word_starts, word_ends, WORD_BASE)
    words = mix(words + (word_ends - word_starts).astype(_U64) * LENGTH)
    # Text t's words are those after its t-th newline: the newlines among the cuts.
    newline = data[cuts] == ord("\n")
    first_word = np.concatenate(([0], np.flatnonzero(newline) + 1))
    num_words = np.diff(np.concatenate((first_word, [len(words)])))
    if len(num_words) != len(texts):
        raise ValueError("a text holds a newline: normalize it first")
    if short:
        num_grams = np.maximum(1, num_words - ngram + 1)
    else:  # the empty text is one word of no bytes: no words
        num_words = np.where(
            (num_words == 1) & (word_ends[first_word] == word_starts[first_word]), 0, num_words
        )
        num_grams = np.maximum(0, num_words - ngram + 1)
    first_gram = np.concatenate(([0], np.cumsum(num_grams)[:-1]))
    owner = np.repeat(np.arange(len(texts)), num_grams)
    starts = first_word[owner] + (np.arange(len(owner)) - first_gram[owner])
    lengths = np.minimum(ngram, num_words)[owner]
    grams = _span_hashes(words.copy(), starts, starts + lengths, GRAM_BASE)
    return mix(grams + lengths.astype(_U64) * LENGTH), first_gram


def _probes(num_perm: int) -> np.ndarray:
    """For each bin, the bins an empty one copies from, in order (never itself)."""
    rng = np.random.default_rng(_DENSIFY_SEED)
    offsets = rng.integers(1, num_perm, size=(num_perm, _MAX_PROBES))
    return (np.arange(num_perm)[:, None] + offsets) % num_perm


_PROBES: dict[int, np.ndarray] = {}


def sign(data: np.ndarray, offsets: np.ndarray, *, ngram: int, num_perm: int) -> np.ndarray:
    """One-permutation MinHash signatures (uint32, a row per document) of documents given as
    one UTF-8 buffer (`data`, uint8) and `len + 1` offsets into it, each in `normalize`'s form
    (`steps.data.normalized`): the hashes, bins and densification above, in one compiled pass
    (`steps.data.compiled_loops`)."""
    from steps.data.compiled_loops import sign_one_permutation

    probes = _PROBES.get(num_perm)
    if probes is None:
        # Round by round (see the kernel), in the narrowest integers that hold a bin.
        narrow = np.uint16 if num_perm <= 1 << 16 else np.int64
        probes = _PROBES[num_perm] = np.ascontiguousarray(_probes(num_perm).T.astype(narrow))
    out = np.empty((len(offsets) - 1, num_perm), dtype=np.uint32)
    sign_one_permutation(data, np.asarray(offsets, dtype=np.int64), ngram, probes, out)
    return out


def signatures(texts: Sequence[str], *, ngram: int, num_perm: int) -> np.ndarray:
    """One-permutation MinHash signatures (uint32, shape (len(texts), num_perm)) of the texts'
    word `ngram`s, densified (see the module docstring). Texts are hashed in batches of about
    `BATCH_BYTES`, so memory does not grow with their number."""
    out = np.empty((len(texts), num_perm), dtype=np.uint32)
    begin = 0
    while begin < len(texts):
        end, size = begin, 0
        while end < len(texts) and (end == begin or size < BATCH_BYTES):
            size += len(texts[end])
            end += 1
        batch = [t.encode("utf-8") for t in texts[begin:end]]
        if any(b"\n" in t for t in batch):
            raise ValueError("a text holds a newline: normalize it first")
        offsets = np.zeros(len(batch) + 1, dtype=np.int64)
        np.cumsum([len(t) for t in batch], out=offsets[1:])
        data = np.frombuffer(b"".join(batch), dtype=np.uint8)
        out[begin:end] = sign(data, offsets, ngram=ngram, num_perm=num_perm)
        begin = end
    return out
