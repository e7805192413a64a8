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

from steps.data.minhash import GRAM_BASE, LENGTH, WORD_BASE

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
