"""Document shards as the data-curation steps read and write them: jsonl or parquet, any fsspec
location, optionally compressed (`.gz`, `.zst`).

`shard_texts(path, text_field)` yields each record's text; `write_kept(src, dst, keep, ...)`
writes the records of `src` whose index `keep` marks to `dst` in the same format and
compression, byte for byte for jsonl lines, so that a filtered shard is the input minus some
records and nothing else. Every error names the file and the line (or row).
"""

from __future__ import annotations

import decimal
import functools
import io
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fsspec
import msgspec

from steps.files import write_file

__all__ = [
    "JSON_SUFFIXES",
    "ShardError",
    "is_shard",
    "jsonl_lines",
    "numbered_records",
    "parse_record",
    "record_text",
    "shard_records",
    "shard_texts",
    "split_compression",
    "write_kept",
]

_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
"""Extensions of JSON-lines files (before a compression suffix)."""


class ShardError(ValueError):
    """A shard that cannot be read: its format, a malformed record, a missing text field."""


def split_compression(path: str) -> tuple[str, str | None]:
    """(the lower-cased name without its compression suffix, fsspec's name of the compression)."""
    lower = path.lower()
    for suffix, compression in _COMPRESSIONS.items():
        if lower.endswith(suffix):
            return lower[: -len(suffix)], compression
    return lower, None


def is_shard(path: str) -> bool:
    """Whether `path` is a jsonl or parquet file (optionally compressed)."""
    base, _ = split_compression(path)
    return base.endswith((*JSON_SUFFIXES, ".parquet"))


def shard_texts(path: str, text_field: str) -> Iterator[str]:
    """The text of every record of a shard, in order."""
    base, _ = split_compression(path)
    if base.endswith(".parquet"):
        yield from _parquet_texts(path, text_field)
        return
    yield from _json_texts(path, text_field)


def shard_records(path: str) -> Iterator[Any]:
    """Every record of a shard as a value: a JSON record per line, or a parquet row as a dict."""
    base, _ = split_compression(path)
    if base.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb") as f:
            yield from pq.read_table(f).to_pylist()
        return
    for _number, record in _json_lines(path):
        yield record


def numbered_records(path: str) -> Iterator[tuple[int, Any]]:
    """`shard_records` with each record's line number (a parquet row's number, from 1), for
    errors that name it (`record_text`)."""
    base, _ = split_compression(path)
    if base.endswith(".parquet"):
        yield from enumerate(shard_records(path), 1)
        return
    yield from _json_lines(path)


def _json_texts(path: str, text_field: str) -> Iterator[str]:
    """The text of every record of a jsonl shard: what `_json_lines` gives, read faster.

    A line is decoded by msgspec into a struct of the one field, skipping the others without
    making Python objects of them (about three times `json.loads` on short records). msgspec
    skips the other fields without checking their UTF-8, so a line that is not ASCII is checked
    first. A line it does not take (not an object, no such text field, JSON that only `json.loads`
    reads, such as NaN or a lone surrogate, or an error to report) goes the way `_json_lines`
    reads it, with the same result or the same error."""
    decode = _text_decoder(text_field)
    for number, line in jsonl_lines(path):
        try:
            if not line.isascii():
                line.decode("utf-8")
            text = decode(line).text
        except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError included
            yield record_text(path, number, parse_record(path, number, line), text_field)
        else:
            yield text


@functools.cache
def _text_decoder(text_field: str) -> Callable[[bytes], Any]:
    record = msgspec.defstruct("Record", [("text", str)], rename={"text": text_field})
    return msgspec.json.Decoder(record).decode


def record_text(path: str, number: int, record: Any, text_field: str) -> str:
    """The text of `record` (line or row `number` of `path`), or a `ShardError` naming both."""
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ShardError(f"{path} line {number}: no text field {text_field!r} (found: {found})")
    return text


def _parse_int(digits: str) -> int | decimal.Decimal:
    # Python refuses to convert integers of over 4,300 digits (sys.get_int_max_str_digits);
    # a record is valid JSON whatever its numbers, so a long one is kept exact as a Decimal.
    try:
        return int(digits)
    except ValueError:
        return decimal.Decimal(digits)


def parse_record(path: str, number: int, line: bytes) -> Any:
    """The JSON value of one record line (see `jsonl_lines`); a `ShardError` naming the file and
    line if it is not UTF-8 or not one JSON value."""
    try:
        return json.loads(line.decode("utf-8"), parse_int=_parse_int)
    except UnicodeDecodeError as e:
        raise ShardError(f"{path} line {number}: not UTF-8 ({e})") from e
    except ValueError as e:
        hint = ""
        if b"\r" in line.rstrip(b"\r\n"):
            hint = "; records end at \\n only, a carriage return inside a line does not end one"
        raise ShardError(f"{path} line {number}: malformed JSON ({e}){hint}") from e


_JSON_WHITESPACE = b" \t\r\n"


def jsonl_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of every record of a jsonl shard: the one definition of a record
    that every step reading or filtering jsonl shares, so that the n-th record read is the n-th
    record written.

    As JSON Lines defines it: lines end at `\\n` only (a `\\r` before it is JSON whitespace; a
    bare `\\r` inside a line is not a separator), a line holding only JSON whitespace (space, tab,
    CR) is no record but is counted in the line numbers, and any other line is one record, even
    one `str.strip` would find blank (a no-break space, U+001C): it must then parse as JSON or
    be an error naming its line."""
    base, compression = split_compression(path)
    if not base.endswith(JSON_SUFFIXES):
        raise ShardError(f"{path}: unknown format; use .jsonl or .parquet (optionally .gz or .zst)")
    with fsspec.open(path, "rb", compression=compression) as raw:
        for number, line in enumerate(raw, 1):
            # isspace() is a fast pre-check; \x0b and \x0c are whitespace to it, not to JSON.
            if line.isspace() and not line.strip(_JSON_WHITESPACE):
                continue
            yield number, line


def _json_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, record) of every record of a jsonl shard."""
    for number, line in jsonl_lines(path):
        yield number, parse_record(path, number, line)


def _parquet_texts(path: str, text_field: str) -> Iterator[str]:
    import pyarrow.parquet as pq

    with fsspec.open(path, "rb") as f:
        table = pq.ParquetFile(f)
        if text_field not in table.schema_arrow.names:
            raise ShardError(f"{path}: no column {text_field!r} (columns: {table.schema_arrow.names})")
        row = 0
        for batch in table.iter_batches(columns=[text_field]):
            for value in batch.column(0).to_pylist():
                row += 1
                if not isinstance(value, str):
                    raise ShardError(f"{path} row {row}: {text_field!r} is {value!r}, not text")
                yield value


def write_kept(src: str, dst: str, keep: Sequence[bool]) -> None:
    """Write the records of `src` marked in `keep` (one flag per record, in order) to `dst`, in
    the format and compression of `src`. Replaces `dst` whole (atomically on local disk)."""
    base, compression = split_compression(src)
    if base.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        with fsspec.open(src, "rb") as f:
            table = pq.read_table(f)
        out = io.BytesIO()
        pq.write_table(table.filter(pa.array(list(keep), type=pa.bool_())), out)
        write_file(dst, out.getvalue())
        return
    kept = io.BytesIO()
    records = 0
    for index, (_number, line) in enumerate(jsonl_lines(src)):
        if index < len(keep) and keep[index]:
            kept.write(line if line.endswith(b"\n") else line + b"\n")
        records = index + 1
    if records != len(keep):
        raise ShardError(f"{src}: {records} records for {len(keep)} flags")
    data = kept.getvalue()
    if compression == "gzip":
        import gzip

        data = gzip.compress(data, mtime=0)
    elif compression == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    write_file(dst, data)
