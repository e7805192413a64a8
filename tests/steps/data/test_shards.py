"""Reading and writing jsonl shards (`steps.data.shards`): one definition of a record for every
step that reads or filters jsonl; msgspec's fast path gives what the reference reader gives, with
the same errors on the same line numbers; a filtered shard holds exactly the records flagged."""

from __future__ import annotations

import gzip
import json
import random

import pytest

from steps.data.shards import ShardError, shard_records, shard_texts, write_kept

LINES = [
    b'{"text": "plain", "id": 1}\n',
    b"\n",
    b"   \t \r\n",  # JSON whitespace only: no record
    b'{"id": 2, "text": "caf\\u00e9 \xe2\x82\xac", "meta": {"a": [1, 2, null]}}\n',
    b'{"text": "nan elsewhere", "score": NaN}\n',  # json.loads reads NaN, msgspec does not
    b'{"text": "first", "text": "last"}\n',
    b'{"text": "windows"}\r\n',
    b'{"text": "cr inside",\r"id": 3}\n',  # a carriage return is JSON whitespace, not a line end
    b'{"text": "lone \\ud800 surrogate"}\n',  # json.loads reads it, msgspec does not
    b'{"big": ' + b"7" * 5000 + b', "text": "long integer elsewhere"}\n',
    b'{"text": "no newline at the end"}',
]
TEXTS = [
    "plain",
    "caf\u00e9 \u20ac",
    "nan elsewhere",
    "last",
    "windows",
    "cr inside",
    "lone \ud800 surrogate",
    "long integer elsewhere",
    "no newline at the end",
]


def by_json(path) -> list[str]:
    return [r["text"] for r in shard_records(str(path))]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_texts_are_those_json_loads_gives(tmp_path, suffix):
    path = tmp_path / f"shard{suffix}"
    raw = b"".join(LINES)
    path.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    texts = list(shard_texts(str(path), "text"))
    assert texts == by_json(path) == TEXTS


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_write_kept_writes_exactly_the_records_flagged(tmp_path, suffix):
    """The n-th flag is the n-th record `shard_texts` read: blank lines, CRLF and a last line
    without a newline do not shift them."""
    src = tmp_path / f"shard{suffix}"
    raw = b"".join(LINES)
    src.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    rng = random.Random(0)
    for trial in range(20):
        keep = [rng.random() < 0.5 for _ in TEXTS]
        dst = tmp_path / f"kept{trial}{suffix}"
        write_kept(str(src), str(dst), keep)
        assert list(shard_texts(str(dst), "text")) == [t for t, k in zip(TEXTS, keep, strict=True) if k]
    with pytest.raises(ShardError, match="9 records for 8 flags"):
        write_kept(str(src), str(tmp_path / f"x{suffix}"), [True] * 8)


def test_another_text_field_of_any_name(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"text": "no", "the body": "yes"}) + "\n")
    assert list(shard_texts(str(path), "the body")) == ["yes"]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (b'{"body": "wrong field"}\n', r"line 11: no text field 'text' \(found: \['body'\]\)"),
        (b'{"text": 5}\n', r"line 11: no text field 'text'"),
        (b'["not", "an object"]\n', r"line 11: no text field 'text' \(found: list\)"),
        (b'{"text": "cut\n', r"line 11: malformed JSON"),
        # What text mode once took for blank lines or line ends are records, and not JSON.
        ("\u00a0\n".encode(), r"line 11: malformed JSON"),
        (b"\x1c\n", r"line 11: malformed JSON"),
        (b"\x0c\n", r"line 11: malformed JSON"),
        (b'{"text": "A"}\r{"text": "B"}\n', r"line 11: malformed JSON .*a carriage return inside"),
        (b'{"text": "ok", "x": "\xff"}\n', r"line 11: not UTF-8"),
    ],
)
def test_errors_name_the_line(tmp_path, bad, message):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(LINES[:-1]) + bad)
    with pytest.raises(ShardError, match=message):
        list(shard_texts(str(path), "text"))
    if "no text field" not in message:  # records need no text field
        with pytest.raises(ShardError, match=message):
            list(shard_records(str(path)))
