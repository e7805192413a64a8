"""Document shards as the data-curation steps read and write them: jsonl or parquet, any fsspec
location, optionally compressed (`.gz`, `.zst`).

`shard_texts(path, text_field)` yields each record's text; `write_kept(src, dst, keep, ...)`
writes the records of `src` whose index `keep` marks to `dst` in the same format and
compression, byte for byte for jsonl lines, so that a filtered shard is the input minus some
records and nothing else. Every error names the file and the line (or row).
"""

from __future__ import annotations

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


def _json_texts(path: str, text_field: str) -> Iterator[str]:
    """The text of every non-empty line of a jsonl shard: what `_json_lines` gives, read faster.

    A line is decoded by msgspec into a struct of the one field, skipping the others without
    making Python objects of them (about three times `json.loads` on short records). A line it
    does not take (not an object, no such text field, JSON that only `json.loads` reads, such as
    NaN, or an error to report) and a line holding a carriage return (text mode, which line
    numbers count in, splits there) go the way `_json_lines` reads them, with the same result or
    the same error."""
    base, compression = split_compression(path)
    if not base.endswith(JSON_SUFFIXES):
        raise ShardError(f"{path}: unknown format; use .jsonl or .parquet (optionally .gz or .zst)")
    decode = _text_decoder(text_field)
    number = 0
    with fsspec.open(path, "rb", compression=compression) as raw:
        for line in raw:
            if b"\r" in line:
                lines = list(io.StringIO(line.decode("utf-8"), newline=None))
            else:
                if line.isspace():
                    number += 1
                    continue
                try:
                    text = decode(line).text
                except msgspec.DecodeError:  # ValidationError included
                    lines = [line.decode("utf-8")]
                else:
                    number += 1
                    yield text
                    continue
            for text_line in lines:
                number += 1
                if text_line.strip():
                    yield _record_text(path, number, _json_record(path, number, text_line), text_field)


@functools.cache
def _text_decoder(text_field: str) -> Callable[[bytes], Any]:
    record = msgspec.defstruct("Record", [("text", str)], rename={"text": text_field})
    return msgspec.json.Decoder(record).decode


def _record_text(path: str, number: int, record: Any, text_field: str) -> str:
    text = record.get(text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        found = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ShardError(f"{path} line {number}: no text field {text_field!r} (found: {found})")
    return text


def _json_record(path: str, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except ValueError as e:
        raise ShardError(f"{path} line {number}: malformed JSON ({e})") from e


def _json_lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, record) of every non-empty line of a jsonl shard."""
    base, compression = split_compression(path)
    if not base.endswith(JSON_SUFFIXES):
        raise ShardError(f"{path}: unknown format; use .jsonl or .parquet (optionally .gz or .zst)")
    with fsspec.open(path, "rb", compression=compression) as raw:
        for number, line in enumerate(io.TextIOWrapper(raw, encoding="utf-8"), 1):
            if line.strip():
                yield number, _json_record(path, number, line)


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
    index = 0
    with fsspec.open(src, "rb", compression=compression) as raw:
        for line in raw:
            if not line.strip():
                continue
            if keep[index]:
                kept.write(line if line.endswith(b"\n") else line + b"\n")
            index += 1
    data = kept.getvalue()
    if compression == "gzip":
        import gzip

        data = gzip.compress(data, mtime=0)
    elif compression == "zstd":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    write_file(dst, data)
