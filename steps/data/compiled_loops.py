"""The curation steps' inner loops, compiled by numba: one pass over a batch's bytes, no Python
object per document, word or n-gram.

Imported on first use (`steps.data.minhash`, `steps.data.normalized`), so that declaring an
experiment does not import numba. The first call in a process compiles (about a second) or loads
the compiled code from numba's cache: `$NUMBA_CACHE_DIR` if set, else `__pycache__` beside this
file, else numba's directory in the user's cache (`~/.cache/numba`). Where none of them is
writable (a read-only install in a hardened container), the kernels are compiled without a cache,
once per process, and a warning says so.

Why numba and not a native MinHash from PyPI (rensa, datasketch's C extensions): the kernels
below compute exactly the hashes that `steps.data.minhash` defines (its numpy reference is in
the tests), so a faster pass is not a new signature and not a new step identity; and a library
that signs a list of strings per document still needs a Python object per word.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

# Numba colours its error messages through colorama, which wraps sys.stdout and registers an
# exit hook on it; under a step's log routing that hook fails at exit on a closed stream.
os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

import numpy as np
from numba import njit

from steps.data.hash_constants import GRAM_BASE, LENGTH, WORD_BASE

logger = logging.getLogger(__name__)

CACHED: dict[str, bool] = {}
"""Whether each kernel's compiled code is cached on disk (False: compiled once per process)."""


def _compiled(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`njit(cache=True, **options)`, or without the cache where numba finds no writable place
    for it (numba raises "cannot cache function ...: no locator available" when it decorates)."""

    def decorate(fn: Callable[..., Any]) -> Any:
        try:
            kernel = njit(cache=True, **options)(fn)
        except RuntimeError as e:
            if "no locator available" not in str(e):
                raise
            logger.warning(
                "numba has no writable cache for %s (not $NUMBA_CACHE_DIR, %s/__pycache__, nor the "
                "user's cache directory): compiling it in each process, about a second; set "
                "NUMBA_CACHE_DIR to a writable directory to keep it",
                fn.__name__,
                os.path.dirname(os.path.abspath(__file__)),
            )
            CACHED[fn.__name__] = False
            return njit(cache=False, **options)(fn)
        CACHED[fn.__name__] = True
        return kernel

    return decorate


_U64 = np.uint64
_ONE, _ZERO = _U64(1), _U64(0)
_LOW32 = _U64(0xFFFFFFFF)
_S27, _S30, _S31, _S32 = _U64(27), _U64(30), _U64(31), _U64(32)
_M1, _M2 = _U64(0xBF58476D1CE4E5B9), _U64(0x94D049BB133111EB)


@njit(inline="always")
def _mix(x: np.uint64) -> np.uint64:
    """splitmix64's finalizer (as `steps.data.minhash.mix`)."""
    x = x ^ (x >> _S30)
    x = x * _M1
    x = x ^ (x >> _S27)
    x = x * _M2
    return x ^ (x >> _S31)


_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A") : ord("Z") + 1] += 32
_SPACE = np.zeros(256, dtype=np.bool_)
_SPACE[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # what str.split() splits ASCII on


@_compiled(nogil=True)
def collapse_ascii(data: np.ndarray, offsets: np.ndarray) -> int:
    """Lower-case ASCII letters and collapse every run of ASCII whitespace (as `str.split` sees it:
    tab to carriage return, the four separators 0x1C-0x1F, space) to one space, dropping it at
    each document's ends, in place. Document d is `data[offsets[d]:offsets[d + 1]]` before and
    after (`offsets` is rewritten); returns the bytes used. Bytes of 0x80 and up are left alone,
    so on text already in `normalize`'s form this changes nothing."""
    written = 0
    start = offsets[0]
    for d in range(len(offsets) - 1):
        end = offsets[d + 1]
        first = offsets[d] = written
        space = False
        for j in range(start, end):
            b = data[j]
            if _SPACE[b]:
                space = True
            else:
                if space and written > first:
                    data[written] = 32
                    written += 1
                space = False
                data[written] = _LOWER[b]
                written += 1
        start = end
    offsets[len(offsets) - 1] = written
    return written


@_compiled(nogil=True)
def sign_one_permutation(
    data: np.ndarray, offsets: np.ndarray, ngram: int, probes: np.ndarray, out: np.ndarray
) -> None:
    """`out[d]` = the densified one-permutation MinHash of document d's word n-grams (words
    split on single spaces; a document of fewer than `ngram` words is one n-gram of them all).
    The hashes, bins and densification are `steps.data.minhash`'s: its module docstring says
    what they are and why. `probes[t, k]` is the t-th bin an empty bin k copies from (uint16,
    round by round, so that the first rounds of every bin share a few cache lines)."""
    num_perm = out.shape[1]
    bins = _U64(num_perm)
    longest = 0
    for d in range(len(offsets) - 1):
        longest = max(longest, offsets[d + 1] - offsets[d])
    words = np.empty(longest + 1, dtype=np.uint64)
    powers = np.empty(ngram + 1, dtype=np.uint64)
    powers[0] = _ONE
    for i in range(1, ngram + 1):
        powers[i] = powers[i - 1] * GRAM_BASE
    # A bin's least value so far, as uint64 so that "no n-gram chose it" is a value above all
    # others (no flag to test per n-gram).
    empty = _ONE << _S32
    sig = np.empty(num_perm, dtype=np.uint64)
    empties = np.empty(num_perm, dtype=np.int64)
    for d in range(len(offsets) - 1):
        # Every word's hash: sum((byte + 1) * WORD_BASE^i), then its length, mixed.
        count = 0
        h, power, length = _ZERO, _ONE, _ZERO
        for j in range(offsets[d], offsets[d + 1]):
            b = data[j]
            if b == 32:
                words[count] = _mix(h + length * LENGTH)
                count += 1
                h, power, length = _ZERO, _ONE, _ZERO
            else:
                h += (_U64(b) + _ONE) * power
                power *= WORD_BASE
                length += _ONE
        words[count] = _mix(h + length * LENGTH)
        count += 1
        # Every n-gram's hash offers its low 32 bits to the bin its high 32 bits choose.
        span = min(ngram, count)
        sig[:] = empty
        for s in range(max(1, count - ngram + 1)):
            g = _ZERO
            for i in range(span):
                g += words[s + i] * powers[i]
            g = _mix(g + _U64(span) * LENGTH)
            k = ((g >> _S32) * bins) >> _S32
            sig[k] = min(sig[k], g & _LOW32)
        # An empty bin copies the first filled bin along its probe sequence (else the lowest
        # filled bin, which the probe table makes vanishingly rare). The empty bins are listed
        # first, without a branch: densifying was half the pass when it tested every bin.
        missing = 0
        for k in range(num_perm):
            out[d, k] = np.uint32(sig[k])
            empties[missing] = k
            missing += sig[k] == empty
        for e in range(missing):
            k = empties[e]
            t = 0
            while t < len(probes) and sig[probes[t, k]] == empty:
                t += 1
            if t < len(probes):
                out[d, k] = np.uint32(sig[probes[t, k]])
            else:
                first = 0
                while sig[first] == empty:
                    first += 1
                out[d, k] = np.uint32(sig[first])


@_compiled(nogil=True)
def repetition_counts(
    hashes: np.ndarray, lengths: np.ndarray, first: np.ndarray, top_ns: np.ndarray, dup_ns: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gopher's n-gram repetition counts of each document of a batch (`steps.data.heuristics`):
    the words' 64-bit hashes and lengths in characters, flat, with each document's first word at
    `first[d]` (its last before `first[d + 1]`, or the end).

    `top[d, k]`: the characters of document d's most frequent `top_ns[k]`-gram (its words and the
    spaces between them) times its count, the first seen among equally frequent ones, as
    datatrove's `Counter.most_common(1)` picks; 0 under n words. `dup[d, k]`: the characters (words
    only) inside `dup_ns[k]`-grams seen before, scanning as datatrove does: after a repeated n-gram
    the scan skips its n words, and skipped positions are not remembered. An n-gram's key is built
    from the (n-1)-gram's at the same place and its last word's hash, for n = 1, 2, ... in turn;
    two different n-grams of one document share a key with odds of about 2^-63 per pair."""
    docs = len(first)
    top = np.zeros((docs, len(top_ns)), dtype=np.int64)
    dup = np.zeros((docs, len(dup_ns)), dtype=np.int64)
    largest = 0
    for n in top_ns:
        largest = max(largest, n)
    for n in dup_ns:
        largest = max(largest, n)
    for d in range(docs):
        start = first[d]
        end = first[d + 1] if d + 1 < docs else len(hashes)
        words = end - start
        size = 1
        while size < 2 * words + 2:
            size *= 2
        mask = np.uint64(size - 1)
        table = np.zeros(size, dtype=np.uint64)  # key (never 0: 0 marks an empty slot)
        counts = np.zeros(size, dtype=np.int64)
        where = np.zeros(size, dtype=np.int64)  # the n-gram's first position
        order = np.zeros(words + 1, dtype=np.int64)  # slots in first-seen order
        keys = np.zeros(words, dtype=np.uint64)
        for n in range(1, min(largest, words) + 1):
            for i in range(words - n + 1):  # keys[i]: the n-gram starting at word i
                keys[i] = _mix(keys[i] * np.uint64(0x100000001B3) + hashes[start + i + n - 1]) | np.uint64(1)
            for k in range(len(top_ns)):
                if top_ns[k] != n:
                    continue
                table[:] = 0
                counts[:] = 0
                seen = 0
                for i in range(words - n + 1):
                    slot = keys[i] & mask
                    while table[slot] != 0 and table[slot] != keys[i]:
                        slot = (slot + np.uint64(1)) & mask
                    if table[slot] == 0:
                        table[slot] = keys[i]
                        where[slot] = i
                        order[seen] = slot
                        seen += 1
                    counts[slot] += 1
                best, best_count = -1, 0
                for s in range(seen):
                    if counts[order[s]] > best_count:
                        best, best_count = order[s], counts[order[s]]
                if best >= 0:
                    letters = 0
                    for j in range(n):
                        letters += lengths[start + where[best] + j]
                    top[d, k] = (letters + n - 1) * best_count
            for k in range(len(dup_ns)):
                if dup_ns[k] != n:
                    continue
                table[:] = 0
                chars = 0
                i = 0
                while i + n <= words:
                    slot = keys[i] & mask
                    while table[slot] != 0 and table[slot] != keys[i]:
                        slot = (slot + np.uint64(1)) & mask
                    if table[slot] == keys[i]:  # seen before: count its words, skip them
                        for j in range(n):
                            chars += lengths[start + i + j]
                        i += n
                    else:
                        table[slot] = keys[i]
                        i += 1
                dup[d, k] = chars
    return top, dup


@njit(inline="always")
def _kind(c: int) -> int:
    """What a code point is to the heuristics' words: 0 whitespace, 1 punctuation or symbol, 2 a
    digit, 3 a letter. ASCII exactly as Python's `str.isspace`/`isalnum` see it; beyond ASCII by
    blocks: Latin-1's punctuation and symbols (NBSP as whitespace), U+2010-U+2BFF (dashes, curly
    quotes, the ellipsis, bullets, currency, arrows, mathematical and other symbols), the CJK
    symbols, the fullwidth ASCII punctuation and the pictographs (emoji) are punctuation, every
    other code point a letter (`steps.data.heuristics` says what differs)."""
    if c < 128:
        if c == 32 or 9 <= c <= 13 or 28 <= c <= 31:
            return 0
        if 48 <= c <= 57:
            return 2
        if 65 <= c <= 90 or 97 <= c <= 122:
            return 3
        return 1
    if c == 0xA0 or c == 0x85 or c == 0x1680 or 0x2000 <= c <= 0x200A or c == 0x2028 or c == 0x2029:
        return 0
    if c == 0x202F or c == 0x205F or c == 0x3000:
        return 0
    if 0xA1 <= c <= 0xBF or c == 0xD7 or c == 0xF7 or 0x2010 <= c <= 0x2BFF or 0x3001 <= c <= 0x303F:
        return 1
    if 0xFF01 <= c <= 0xFF0F or 0xFF1A <= c <= 0xFF20 or 0xFF3B <= c <= 0xFF40 or 0xFF5B <= c <= 0xFF65:
        return 1
    if 0x1F000 <= c <= 0x1FAFF:  # emoji and other pictographs
        return 1
    return 3


@_compiled(nogil=True)
def word_stats(
    data: np.ndarray, offsets: np.ndarray, stop_words: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The words of each document of a batch (UTF-8 `data`, document d in bytes
    `offsets[d]:offsets[d + 1]`): whitespace-separated tokens with a letter or a digit.

    Returns `counts[d]` = (words, their characters, words with a letter, tokens equal to a stop
    word once lower-cased (ASCII): `stop_words` holds their hashes), and, flat over the batch, each
    word's hash and length in characters with the index of each document's first word: what
    `repetition_counts` takes."""
    docs = len(offsets) - 1
    counts = np.zeros((docs, 4), dtype=np.int64)
    hashes = np.empty(len(data) // 2 + 1, dtype=np.uint64)
    lengths = np.empty(len(data) // 2 + 1, dtype=np.int64)
    first = np.empty(docs, dtype=np.int64)
    n = 0
    for d in range(docs):
        first[d] = n
        i, end = offsets[d], offsets[d + 1]
        in_token = False
        h = np.uint64(0)
        low = np.uint64(0)
        chars = 0
        alnum = False
        letter = False
        while i <= end:
            if i < end:
                b = data[i]
                if b < 0x80:
                    c, size = int(b), 1
                elif b >= 0xF0 and i + 3 < end:
                    c = (
                        ((int(b) & 7) << 18)
                        | ((int(data[i + 1]) & 63) << 12)
                        | ((int(data[i + 2]) & 63) << 6)
                        | (int(data[i + 3]) & 63)
                    )
                    size = 4
                elif b >= 0xE0 and i + 2 < end:
                    c = ((int(b) & 15) << 12) | ((int(data[i + 1]) & 63) << 6) | (int(data[i + 2]) & 63)
                    size = 3
                elif b >= 0xC0 and i + 1 < end:
                    c, size = ((int(b) & 31) << 6) | (int(data[i + 1]) & 63), 2
                else:
                    c, size = 0xFFFD, 1  # not UTF-8 here: a letter, as Python's replacement char is
                kind = _kind(c)
            else:
                kind, size = 0, 1  # the end closes the last token
            if kind != 0:
                if not in_token:
                    in_token, h, low, chars, alnum, letter = (
                        True,
                        np.uint64(0xCBF29CE484222325),
                        np.uint64(0xCBF29CE484222325),
                        0,
                        False,
                        False,
                    )
                for j in range(size):
                    byte = np.uint64(data[i + j])
                    h = (h ^ byte) * np.uint64(0x100000001B3)
                    lower = byte + np.uint64(32) if np.uint64(65) <= byte <= np.uint64(90) else byte
                    low = (low ^ lower) * np.uint64(0x100000001B3)
                chars += 1
                alnum = alnum or kind >= 2
                letter = letter or kind == 3
            elif in_token:
                in_token = False
                for s in range(len(stop_words)):
                    if stop_words[s] == low:
                        counts[d, 3] += 1
                        break
                if alnum:
                    counts[d, 0] += 1
                    counts[d, 1] += chars
                    if letter:
                        counts[d, 2] += 1
                    hashes[n] = _mix(h)
                    lengths[n] = chars
                    n += 1
            i += size
    return counts, hashes[:n], lengths[:n], first


@_compiled(nogil=True)
def dfa_visits(
    data: np.ndarray, nextmove: np.ndarray, rowbase: np.ndarray, output: np.ndarray, features: int
) -> tuple[np.ndarray, np.ndarray]:
    """py3langid's feature counts of `data` (UTF-8 bytes; `py3langid.langid.visit_counts`, the
    DFA walk it does in Python): the features visited, in the order first visited, and their
    counts. `steps.data.language` scores them as py3langid does."""
    counts = np.zeros(features, dtype=np.int64)
    order = np.empty(min(len(data), features), dtype=np.int64)
    seen = 0
    state = 0
    for byte in data:
        state = nextmove[rowbase[state] + byte]
        feature = output[state]
        if feature >= 0:
            if counts[feature] == 0:
                order[seen] = feature
                seen += 1
            counts[feature] += 1
    return order[:seen], counts[order[:seen]]
