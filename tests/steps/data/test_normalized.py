"""`normalized_bytes`: a batch in `normalize`'s form, ASCII texts collapsed in one compiled pass."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from steps.data.normalized import normalize, normalized_bytes

# ASCII whitespace as str.split() sees it, case, and characters NFKC or Unicode case change.
AWKWARD = (
    " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f" + "AZaz09" + "\u00a0\u2028\u3000\u0085ﬁ\u03a3\u03c3\u03c2İ\u0301é🙂"
)


def as_texts(texts: list[str]) -> list[str]:
    data, offsets = normalized_bytes(texts)
    raw = data.tobytes()
    return [raw[a:b].decode("utf-8") for a, b in pairwise(offsets)]


def test_ascii_and_unicode_texts_come_out_as_normalize_gives_them():
    texts = [
        "  Hello,\tWORLD \r\n again  ",
        "",
        " \t\x1c ",
        "x",
        "Straße ﬁne\u00a0SPACE\u3000wide ΣΑΣ",  # NFKC and Unicode lower case: Python's
        "ALL CAPS\x0bwith\x0cform feeds\x1f",
    ]
    assert as_texts(texts) == [normalize(t) for t in texts]
    assert as_texts([]) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(AWKWARD), max_size=40) | st.text(max_size=20), max_size=12))
def test_every_text_equals_normalize_of_it(texts):
    assert as_texts(texts) == [normalize(t) for t in texts]
