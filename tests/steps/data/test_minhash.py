"""One-permutation MinHash (`steps.data.minhash`): its n-grams, its estimates, its batches, and
the compiled pass against the numpy definition it replaced."""

from __future__ import annotations

import random

import numpy as np
import pytest

from steps.data import minhash
from steps.data.minhash import _probes, ngram_hashes, sign, signatures
from steps.data.normalized import normalized_bytes


def grams(text: str, n: int = 5) -> set[str]:
    words = text.split(" ")
    return {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def jaccard(a: str, b: str) -> float:
    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def test_n_grams_are_the_word_n_grams_of_each_text_and_nothing_across_texts():
    texts = ["a b c d e f", "", "x y", "a b c d e f", "b c d e f"]
    hashes, first = ngram_hashes(texts, 5)
    # 2 five-grams, the empty text and the two-word text one n-gram each, then 2 and 1.
    assert first.tolist() == [0, 2, 3, 4, 6] and len(hashes) == 7
    assert hashes[0:2].tolist() == hashes[4:6].tolist()  # equal text, equal n-grams
    assert hashes[1] == hashes[6]  # "b c d e f" wherever it stands
    assert len(set(hashes.tolist())) == 4  # and nothing else alike: no n-gram spans two texts
    one, _ = ngram_hashes(["x y"], 5)
    assert one[0] == hashes[3]  # its neighbours do not change a text's hashes
    with pytest.raises(ValueError, match="newline"):
        ngram_hashes(["a\nb"], 5)


def test_without_short_texts_a_text_of_fewer_words_has_no_n_gram():
    """As decontaminate counts them: the empty text and a text under `ngram` words give none."""
    texts = ["a b c", "", "a b c d e f", "x"]
    hashes, first = ngram_hashes(texts, 5, short=False)
    assert first.tolist() == [0, 0, 0, 2] and len(hashes) == 2
    assert hashes.tolist() == ngram_hashes(["a b c d e f"], 5)[0].tolist()
    assert len(ngram_hashes(["", "a"], 1, short=False)[0]) == 1  # the empty text has no word
    # ... last, too (its empty word starts at the very end of the batch)
    hashes, first = ngram_hashes(["a b", ""], 1, short=False)
    assert first.tolist() == [0, 2] and hashes.tolist() == ngram_hashes(["a b"], 1)[0].tolist()


def test_word_order_and_word_boundaries_matter():
    (a, b, c), _ = ngram_hashes(["ab c", "a bc", "c ab"], 5)
    assert len({a, b, c}) == 3


def test_agreement_estimates_the_jaccard_similarity_without_bias():
    """Pairs of random-word documents of 3 to 800 words with up to a quarter of their words
    changed: the share of equal bins is within 0.02 of the true Jaccard similarity on average
    and within 0.15 for each pair (a MinHash of 128 values has a standard deviation up to 0.044)."""
    rng = random.Random(0)
    vocabulary = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 8))) for _ in range(3000)]
    errors = []
    for _ in range(300):
        length = rng.choice([3, 10, 40, 200, 800])
        a = [rng.choice(vocabulary) for _ in range(length)]
        b = list(a)
        for _ in range(rng.randint(0, max(1, length // 4))):
            b[rng.randrange(length)] = rng.choice(vocabulary)
        x, y = " ".join(a), " ".join(b)
        sig = signatures([x, y], ngram=5, num_perm=128)
        errors.append(float(np.mean(sig[0] == sig[1])) - jaccard(x, y))
    assert abs(np.mean(errors)) < 0.02
    assert max(abs(e) for e in errors) < 0.15


def test_a_short_text_fills_every_bin_and_texts_sharing_nothing_agree_nowhere():
    sig = signatures(["one two", "three four five", "one two"], ngram=5, num_perm=64)
    assert sig.shape == (3, 64) and sig.dtype == np.uint32
    assert len(set(sig[0].tolist())) == 1  # one n-gram: every empty bin copies the one filled
    assert (sig[0] == sig[2]).all() and not (sig[0] == sig[1]).any()


@pytest.mark.parametrize("num_perm", [2, 100, 128, 256])
def test_any_number_of_bins_and_batches_of_any_size_give_the_same_rows(monkeypatch, num_perm):
    rng = random.Random(num_perm)
    texts = [" ".join(str(rng.randrange(50)) for _ in range(rng.randint(0, 300))) for _ in range(60)]
    whole = signatures(texts, ngram=3, num_perm=num_perm)
    monkeypatch.setattr(minhash, "BATCH_BYTES", 200)  # a batch of one to a few texts
    assert (signatures(texts, ngram=3, num_perm=num_perm) == whole).all()
    assert (signatures(texts[::-1], ngram=3, num_perm=num_perm) == whole[::-1]).all()


def reference_signatures(texts: list[str], ngram: int, num_perm: int) -> np.ndarray:
    """The one-permutation signatures as the numpy pass computed them before the compiled one
    (`ngram_hashes`, one sort of (document, bin, value) keys, densification by rounds of probes):
    an independent definition of the same values."""
    u64 = np.uint64
    hashes, first_gram = ngram_hashes(texts, ngram)
    owner = np.repeat(np.arange(len(texts), dtype=u64), np.diff(np.append(first_gram, len(hashes))))
    bins = ((hashes >> u64(32)) * u64(num_perm)) >> u64(32)
    keys = np.sort((((owner * u64(num_perm)) + bins) << u64(32)) | (hashes & u64(0xFFFFFFFF)))
    cell = keys >> u64(32)
    first = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    sig = np.zeros((len(texts), num_perm), dtype=np.uint32)
    empty = np.ones((len(texts), num_perm), dtype=bool)
    flat = cell[first].astype(np.int64)
    sig.reshape(-1)[flat] = (keys[first] & u64(0xFFFFFFFF)).astype(np.uint32)
    empty.reshape(-1)[flat] = False
    probes = _probes(num_perm)
    out = sig.copy()
    for d, k in zip(*np.nonzero(empty), strict=True):
        filled = ~empty[d][probes[k]]
        out[d, k] = sig[d, probes[k][np.argmax(filled)] if filled.any() else np.argmax(~empty[d])]
    return out


def random_texts(seed: int, count: int) -> list[str]:
    """Normalized texts of 0 to 400 words: short words that repeat, and some beyond ASCII."""
    rng = random.Random(seed)
    words = ["a", "bb", "ccc", "dé", "ψυχή", "日本語", "x" * 40, "🙂", "0", "z"] + [str(i) for i in range(40)]
    return [
        " ".join(rng.choice(words) for _ in range(rng.choice([0, 1, 2, 4, 5, 6, 30, 400])))
        for _ in range(150)
    ]


@pytest.mark.parametrize(("ngram", "num_perm"), [(5, 128), (1, 2), (3, 100), (5, 256), (13, 64)])
def test_the_compiled_pass_signs_exactly_as_the_numpy_definition(ngram, num_perm):
    """The compiled pass is not a new signature: bit for bit the values the numpy pass gave, so
    steps signed before and after it compare, and remove the same documents."""
    texts = random_texts(ngram * 1000 + num_perm, 150)
    assert (
        signatures(texts, ngram=ngram, num_perm=num_perm) == reference_signatures(texts, ngram, num_perm)
    ).all()
    data, offsets = normalized_bytes(texts)  # already normalized: the same bytes
    assert (
        sign(data, offsets, ngram=ngram, num_perm=num_perm)
        == signatures(texts, ngram=ngram, num_perm=num_perm)
    ).all()


# Computed by the numpy pass before the compiled one replaced it.
PINNED_LONG = [1167145498, 2964040420, 2964040420, 1167145498]
PINNED_SHORT = [3343043291] * 4


def test_signatures_are_pinned():
    """A change to any hash, bin or probe shows here, not as a silent change of what is removed."""
    sig = signatures(["the quick brown fox jumps over the lazy dog", "x"], ngram=5, num_perm=128)
    assert sig[0, :4].tolist() == PINNED_LONG and sig[1, :4].tolist() == PINNED_SHORT
    with pytest.raises(ValueError, match="newline"):
        signatures(["a\nb"], ngram=5, num_perm=128)
