"""Reading the tokenize step's inputs: expanding paths and globs, and documents per format.

Formats are chosen by extension: `.jsonl`/`.json`/`.ndjson` (a text field per record),
`.parquet` (a text column), `.txt`/`.text`/`.md` (a document per file, or per line), each
optionally compressed (`.gz`, `.zst`). Everything is read through fsspec.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator, Sequence

import fsspec

from steps.data.shards import JSON_SUFFIXES, ShardError, jsonl_lines, parse_record, split_compression
from steps.data.sources import InputError, RawDataset, expand_input
from steps.data.tokenize.common import ShardStats, TokenizeError
from steps.data.tokenize.config import TokenizeConfig

__all__ = ["documents", "expand_inputs", "is_data_file"]

_TEXT_SUFFIXES = (".txt", ".text", ".md")


def expand_inputs(inputs: Sequence[str | RawDataset], root: str | None, split: str) -> list[str]:
    """Every input file, in a stable order; a missing path or an empty glob is an error."""
    files: list[str] = []
    for spec in inputs:
        try:
            found = expand_input(spec, root, accept=is_data_file, reading=True)
        except InputError as e:
            raise TokenizeError(f"{split} {e}") from e
        for path, _key, _info in found:
            if not is_data_file(path):
                raise TokenizeError(
                    f"{split} input {path!r}: unknown format; use .jsonl, .json, .parquet or .txt "
                    "(optionally .gz or .zst)"
                )
            files.append(path)
    return list(dict.fromkeys(files))


def is_data_file(path: str) -> bool:
    base, _ = split_compression(path)
    return base.endswith((*JSON_SUFFIXES, *_TEXT_SUFFIXES, ".parquet"))


def documents(path: str, config: TokenizeConfig, stats: ShardStats) -> Iterator[str]:
    base, compression = split_compression(path)
    if base.endswith(".parquet"):
        yield from _parquet_documents(path, config, stats)
        return
    try:
        if base.endswith(_TEXT_SUFFIXES):
            with fsspec.open(path, "rb", compression=compression) as raw:
                yield from _text_documents(io.TextIOWrapper(raw, encoding="utf-8", errors="strict"), config)
        else:
            yield from _json_documents(path, config, stats)
    except UnicodeDecodeError as e:
        raise TokenizeError(f"{path}: not UTF-8 text ({e})") from e
    except (gzip.BadGzipFile, EOFError, OSError) as e:
        raise TokenizeError(f"{path}: cannot read ({type(e).__name__}: {e})") from e


def _text_documents(stream: io.TextIOBase, config: TokenizeConfig) -> Iterator[str]:
    if config.text_mode == "document":
        text = stream.read()
        if text.strip():
            yield text
        return
    for line in stream:
        if line.strip():
            yield line.rstrip("\n")


def _json_documents(path: str, config: TokenizeConfig, stats: ShardStats) -> Iterator[str]:
    # Records as every curation step reads them (`jsonl_lines`), so that tokenize counts and
    # numbers the lines of a shard that dedupe or decontaminate filtered as they did.
    for number, line in jsonl_lines(path):
        try:
            record = parse_record(path, number, line)
        except ShardError as e:
            _bad(config, stats, str(e))
            continue
        text = record.get(config.text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            fields = sorted(record) if isinstance(record, dict) else type(record).__name__
            _bad(
                config, stats, f"{path} line {number}: no text field {config.text_field!r} (found: {fields})"
            )
            continue
        yield text


def _parquet_documents(path: str, config: TokenizeConfig, stats: ShardStats) -> Iterator[str]:
    import pyarrow.parquet as pq

    with fsspec.open(path, "rb") as f:
        table = pq.ParquetFile(f)
        if config.text_field not in table.schema_arrow.names:
            raise TokenizeError(
                f"{path}: no column {config.text_field!r} (columns: {table.schema_arrow.names}); "
                "set text_field"
            )
        row = 0
        for batch in table.iter_batches(columns=[config.text_field]):
            for value in batch.column(0).to_pylist():
                row += 1
                if not isinstance(value, str):
                    _bad(config, stats, f"{path} row {row}: {config.text_field!r} is {value!r}, not text")
                    continue
                yield value


def _bad(config: TokenizeConfig, stats: ShardStats, message: str) -> None:
    if config.on_bad_line == "fail":
        raise TokenizeError(
            f"{message}; fix the input or set on_bad_line='skip' to skip and count such lines"
        )
    stats.skipped += 1
