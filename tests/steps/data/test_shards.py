"""Reading jsonl shards' texts (`steps.data.shards.shard_texts`): msgspec's fast path gives what
`json.loads` line by line gives, and the same errors on the same line numbers."""

from __future__ import annotations

import gzip
import json

import pytest

from steps.data.shards import ShardError, shard_records, shard_texts

LINES = [
    b'{"text": "plain", "id": 1}\n',
    b"\n",
    b"   \t \n",
    "\u00a0\u2028 \n".encode(),  # Unicode whitespace only: a blank line to text mode
    b'{"id": 2, "text": "caf\\u00e9 \xe2\x82\xac", "meta": {"a": [1, 2, null]}}\n',
    b'{"text": "nan elsewhere", "score": NaN}\n',  # json.loads reads NaN, msgspec does not
    b'{"text": "first", "text": "last"}\n',
    b'{"text": "windows"}\r\n',
    b'{"text": "old mac"}\r{"text": "two lines"}\n',  # text mode splits at a lone carriage return
    b'{"text": "no newline at the end"}',
]


def by_json(path) -> list[str]:
    return [r["text"] for r in shard_records(str(path))]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_texts_are_those_json_loads_gives(tmp_path, suffix):
    path = tmp_path / f"shard{suffix}"
    raw = b"".join(LINES)
    path.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    texts = list(shard_texts(str(path), "text"))
    assert texts == by_json(path)
    assert texts[3:6] == ["last", "windows", "old mac"]


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
    ],
)
def test_errors_name_the_line_text_mode_counts(tmp_path, bad, message):
    """After a line that a lone carriage return splits in two, the bad line is line 11."""
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join(LINES[:-1]) + bad)
    with pytest.raises(ShardError, match=message):
        list(shard_texts(str(path), "text"))
    if "malformed" in message:  # records need no text field
        with pytest.raises(ShardError, match=message):
            list(shard_records(str(path)))


def test_invalid_utf8_fails_as_text_mode_does(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"text": "\xff"}\n')
    with pytest.raises(UnicodeDecodeError):
        list(shard_texts(str(path), "text"))
