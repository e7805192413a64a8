"""One-permutation MinHash in numpy (`steps.data.minhash`): its n-grams, its estimates, its batches."""

from __future__ import annotations

import random

import numpy as np
import pytest

from steps.data import minhash
from steps.data.minhash import ngram_hashes, signatures


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
