"""The `tokenize` step: raw text files -> a Levanter token cache, plus `stats.json`.

Inputs are fsspec paths, globs or directories (local, memory://, gs://, s3://, hf:// where
the filesystem is installed), or `output_of(...)` an upstream step. Formats are chosen by
extension: `.jsonl`/`.json` (optionally `.gz`/`.zst`), `.parquet`, and `.txt` (optionally
compressed; one document per file, or per line with `text_mode="line"`).

Output layout, read directly by Levanter's `LmDataConfig` (`DatasetComponent(cache_dir=<output>)`):

    <output>/train/shard_ledger.json             sharded-layout ledger, written last
    <output>/train/part-00000/                   one TreeStore per input file (a shard)
    <output>/train/part-00000/.drydock-shard.json  this shard's stats; written when the shard is complete
    <output>/validation/...                      the same for validation inputs
    <output>/stats.json                          documents, tokens, bytes per split and per input file

Each input file is one shard. By default shards are tokenized one after another in the step's
process (the `tokenizers` library already uses every core inside `encode_batch`); with
`num_workers > 1` they run in parallel, as Ray tasks when the step runs on a Ray worker (fanning
out over a cluster), else in local processes. A shard is complete once its marker is
written; a rerun after a crash or preemption skips complete shards and redoes the rest.

Every document becomes `[bos] + tokens + [eos]` (bos only if the tokenizer has one), as
Levanter's own cache builder does with `enforce_bos`/`enforce_eos`.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec

from pipeline import Resources, Step, step_events, this_output, versioned
from pipeline.run.parallel import parallel_map
from steps.files import write_json, write_text

__all__ = ["TokenizeConfig", "TokenizeError", "tokenize", "tokenize_step"]

SHARD_MARKER = ".drydock-shard.json"
LEDGER = "shard_ledger.json"
SPLITS = ("train", "validation")
_TEXT_SUFFIXES = (".txt", ".text", ".md")
_JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


class TokenizeError(ValueError):
    """Bad input to the tokenize step: names the file (and line) and how to fix it."""


@dataclass(frozen=True)
class TokenizeConfig:
    """Configuration of the tokenize step."""

    train: list[str]
    """Training inputs: paths, globs or directories; relative ones are under `input_root`."""
    tokenizer: str
    """A Hugging Face tokenizer: a local directory (tokenizer.json) or a hub name."""
    output: str
    """The step's output directory (`this_output()`)."""
    validation: list[str] = field(default_factory=list)
    """Validation inputs, like `train`."""
    text_field: str = "text"
    """The field holding the document text in jsonl and parquet inputs."""
    text_mode: str = "document"
    """For text files: "document" (a file is a document) or "line" (each non-empty line is one)."""
    on_bad_line: str = "fail"
    """A malformed record: "fail" (the error names file and line) or "skip" (skip and count it)."""
    input_root: str | None = None
    """Directory that relative input paths are under (default: the working directory). Kept out of
    identity so that a recipe's identities do not depend on where its checkout lives."""
    num_workers: int = 1
    """Shards tokenized at once. 1: one after another in the step's process (`encode_batch` already
    uses every core). More: as Ray tasks when the step runs on a Ray worker, else local processes."""
    batch_size: int = 1024
    """Documents per `encode_batch` call."""


@dataclass
class ShardStats:
    """Counts of one input file (one shard)."""

    path: str
    shard: str
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    skipped: int = 0
    seconds: float = 0.0


def tokenize_step(
    name: str,
    *,
    train: Sequence[str],
    tokenizer: str,
    validation: Sequence[str] = (),
    text_field: str = "text",
    text_mode: str = "document",
    on_bad_line: str = "fail",
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready tokenize `Step`. Inputs, tokenizer, text field and policies are versioned."""
    return Step(
        name=name,
        fn=tokenize,
        config=TokenizeConfig(
            train=versioned(list(train)),
            validation=versioned(list(validation)),
            tokenizer=versioned(tokenizer),
            text_field=versioned(text_field),
            text_mode=versioned(text_mode),
            on_bad_line=versioned(on_bad_line),
            output=this_output(),
            input_root=input_root,
            num_workers=num_workers,
        ),
        description=f"tokenize {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


# -- the step function ----------------------------------------------------------------------------


def tokenize(config: TokenizeConfig) -> None:
    """Tokenize every split of `config` into a Levanter cache under `config.output`."""
    _check_config(config)
    # Workers (and Levanter, later) need a tokenizer path that does not depend on their cwd.
    config = dataclasses.replace(config, tokenizer=_resolve_tokenizer(config.tokenizer, config.input_root))
    # Fail on a bad tokenizer before touching any input.
    info = _load_tokenizer(config.tokenizer).info
    jobs: dict[str, list[tuple[str, str]]] = {}
    for split in SPLITS:
        inputs = config.train if split == "train" else config.validation
        files = _expand_inputs(inputs, config.input_root, split)
        jobs[split] = [(path, f"part-{i:05d}") for i, path in enumerate(files)]
    stats: dict[str, Any] = {
        "tokenizer": config.tokenizer,
        **info,
        "text_field": config.text_field,
        "splits": {},
    }
    for split, files in jobs.items():
        if not files:
            continue
        shard_stats = _tokenize_split(config, split, files)
        totals = {
            k: sum(getattr(s, k) for s in shard_stats) for k in ("documents", "tokens", "bytes", "skipped")
        }
        if totals["documents"] == 0:
            raise TokenizeError(
                f"{split} inputs hold no documents (after skipping {totals['skipped']} bad lines)"
            )
        stats["splits"][split] = {**totals, "files": [asdict(s) for s in shard_stats]}
    write_json(f"{config.output}/stats.json", stats)


def _check_config(config: TokenizeConfig) -> None:
    if not config.train:
        raise TokenizeError("no train inputs given (field `train`)")
    if config.text_mode not in ("document", "line"):
        raise TokenizeError(f"text_mode must be 'document' or 'line', got {config.text_mode!r}")
    if config.on_bad_line not in ("fail", "skip"):
        raise TokenizeError(f"on_bad_line must be 'fail' or 'skip', got {config.on_bad_line!r}")
    scheme = config.output.split("://", 1)[0] if "://" in config.output else "file"
    if scheme not in ("file", "gs", "s3"):
        raise TokenizeError(
            f"cannot write a token cache to {config.output!r}: Levanter writes caches with tensorstore, "
            "which supports local paths, gs:// and s3://; use such a prefix"
        )


def _tokenize_split(config: TokenizeConfig, split: str, files: list[tuple[str, str]]) -> list[ShardStats]:
    split_dir = f"{config.output}/{split}"
    done: dict[str, ShardStats] = {}
    todo = []
    for path, shard in files:
        previous = _read_marker(f"{split_dir}/{shard}")
        if previous is not None and previous.path == path:
            done[shard] = previous
        else:
            todo.append((path, shard))
    if done:
        print(f"tokenize {split}: {len(done)} of {len(files)} shards already complete; resuming", flush=True)
    args = [(config, split_dir, path, shard) for path, shard in todo]
    with _Progress(
        split, sum(s.documents for s in done.values()), sum(s.tokens for s in done.values())
    ) as bar:
        for result in parallel_map(_tokenize_shard, args, max_workers=config.num_workers):
            done[result.shard] = result
            bar.advance(result.documents, result.tokens)
            # For `drydock status` from any machine (the bar above is only on this console).
            tokens = sum(s.tokens for s in done.values())
            step_events.progress(len(done), len(files), f"{split} shards", data={"tokens": tokens})
    ordered = [done[shard] for _path, shard in files]
    _write_ledger(split_dir, ordered, _load_tokenizer(config.tokenizer).metadata)
    return ordered


# -- one shard ------------------------------------------------------------------------------------


def _tokenize_shard(config: TokenizeConfig, split_dir: str, path: str, shard: str) -> ShardStats:
    """Tokenize one input file into the TreeStore `<split_dir>/<shard>`; its marker is written last."""
    import numpy as np
    from levanter.store.tree_store import TreeStore

    started = time.time()
    shard_dir = f"{split_dir}/{shard}"
    fs, local = fsspec.core.url_to_fs(shard_dir)
    if fs.exists(local):
        fs.rm(local, recursive=True)  # a partial shard from an interrupted attempt
    tok = _load_tokenizer(config.tokenizer)
    store = TreeStore.open(
        {"input_ids": np.zeros((0,), dtype=np.int32)}, shard_dir, mode="w", cache_metadata=False
    )
    stats = ShardStats(path=path, shard=shard)
    batch: list[str] = []

    def flush() -> None:
        ids = tok.encode(batch)
        store.extend([{"input_ids": np.asarray(x, dtype=np.int32)} for x in ids])
        stats.documents += len(ids)
        stats.tokens += sum(len(x) for x in ids)
        batch.clear()

    for text in _documents(path, config, stats):
        stats.bytes += len(text.encode("utf-8"))
        batch.append(text)
        if len(batch) >= config.batch_size:
            flush()
    if batch:
        flush()
    stats.seconds = time.time() - started
    _write_ledger(shard_dir, None, tok.metadata, rows=stats.documents, tokens=stats.tokens)
    write_json(f"{shard_dir}/{SHARD_MARKER}", asdict(stats))
    return stats


def _read_marker(shard_dir: str) -> ShardStats | None:
    try:
        with fsspec.open(f"{shard_dir}/{SHARD_MARKER}", "r") as f:
            return ShardStats(**json.load(f))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _write_ledger(
    cache_dir: str,
    shards: list[ShardStats] | None,
    metadata: dict[str, Any],
    *,
    rows: int = 0,
    tokens: int = 0,
) -> None:
    """A Levanter `CacheLedger`: for one shard (`shards` None) or the sharded split (its shards)."""
    from levanter.store.cache import CACHE_LAYOUT_SHARDED, CacheLedger, CacheMetadata

    meta = CacheMetadata(preprocessor_metadata=metadata)
    if shards is None:
        ledger = CacheLedger(
            total_num_rows=rows,
            shard_rows={},
            is_finished=True,
            field_counts={"input_ids": tokens},
            metadata=meta,
        )
    else:
        ledger = CacheLedger(
            total_num_rows=sum(s.documents for s in shards),
            shard_rows={s.shard: s.documents for s in shards},
            is_finished=True,
            finished_shards=[s.shard for s in shards],
            field_counts={"input_ids": sum(s.tokens for s in shards)},
            field_counts_by_shard={s.shard: {"input_ids": s.tokens} for s in shards},
            layout=CACHE_LAYOUT_SHARDED,
            metadata=meta,
        )
    write_text(f"{cache_dir}/{LEDGER}", ledger.to_json())  # type: ignore[attr-defined]


# -- inputs ---------------------------------------------------------------------------------------


def _expand_inputs(inputs: Sequence[str], root: str | None, split: str) -> list[str]:
    """Every input file, in a stable order; a missing path or an empty glob is an error."""
    files: list[str] = []
    for raw in inputs:
        spec = raw if ("://" in raw or os.path.isabs(raw) or root is None) else os.path.join(root, raw)
        fs, path = fsspec.core.url_to_fs(spec)
        remote = "://" in spec and not spec.startswith("file://")
        if any(ch in path for ch in "*?["):
            found = sorted(p for p in fs.glob(path) if not fs.isdir(p))
            if not found:
                raise TokenizeError(f"{split} input {raw!r} matches no files")
        elif not fs.exists(path):
            raise TokenizeError(f"{split} input {raw!r} does not exist")
        elif fs.isdir(path):
            found = sorted(p for p in fs.find(path) if _is_data_file(p))
            if not found:
                raise TokenizeError(f"{split} input directory {raw!r} holds no jsonl, parquet or text files")
        else:
            found = [path]
        for p in found:
            if not _is_data_file(p):
                raise TokenizeError(
                    f"{split} input {p!r}: unknown format; use .jsonl, .json, .parquet or .txt "
                    "(optionally .gz or .zst)"
                )
        files.extend(fs.unstrip_protocol(p) if remote else p for p in found)
    return list(dict.fromkeys(files))


def _split_suffix(path: str) -> tuple[str, str | None]:
    name = path.lower()
    for suffix, compression in _COMPRESSIONS.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], compression
    return name, None


def _is_data_file(path: str) -> bool:
    base, _ = _split_suffix(path)
    return base.endswith((*_JSON_SUFFIXES, *_TEXT_SUFFIXES, ".parquet"))


def _documents(path: str, config: TokenizeConfig, stats: ShardStats) -> Iterator[str]:
    base, compression = _split_suffix(path)
    if base.endswith(".parquet"):
        yield from _parquet_documents(path, config, stats)
        return
    with fsspec.open(path, "rb", compression=compression) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
        try:
            if base.endswith(_TEXT_SUFFIXES):
                yield from _text_documents(stream, config)
            else:
                yield from _json_documents(stream, path, config, stats)
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


def _json_documents(
    stream: io.TextIOBase, path: str, config: TokenizeConfig, stats: ShardStats
) -> Iterator[str]:
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            _bad(config, stats, f"{path} line {number}: malformed JSON ({e})")
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


# -- tokenizers -----------------------------------------------------------------------------------


@dataclass
class _Tokenizer:
    backend: Any
    bos_id: int | None
    eos_id: int
    vocab_size: int

    def encode(self, texts: list[str]) -> list[list[int]]:
        head = [self.bos_id] if self.bos_id is not None else []
        return [
            head + e.ids + [self.eos_id] for e in self.backend.encode_batch(texts, add_special_tokens=False)
        ]

    @property
    def info(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "bos_id": self.bos_id, "eos_id": self.eos_id}

    @property
    def metadata(self) -> dict[str, Any]:
        return {
            "tokenizer_vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "writer": "drydock.tokenize",
        }


_TOKENIZERS: dict[str, _Tokenizer] = {}


def _load_tokenizer(spec: str) -> _Tokenizer:
    """Load (once per process) a tokenizer from a local directory or, if reachable, the hub."""
    if spec in _TOKENIZERS:
        return _TOKENIZERS[spec]
    from tokenizers import Tokenizer

    if os.path.isdir(spec):
        path = os.path.join(spec, "tokenizer.json")
        try:
            backend = Tokenizer.from_file(path)
        except Exception as e:
            raise TokenizeError(f"tokenizer {spec!r} is unreadable: {path}: {e}") from e
        special = _special_tokens(spec)
    elif os.path.sep in spec and not _looks_like_hub_name(spec):
        raise TokenizeError(f"tokenizer {spec!r} is not a directory")
    else:
        try:
            backend = Tokenizer.from_pretrained(spec)
            special = _hub_special_tokens(spec)
        except Exception as e:
            raise TokenizeError(
                f"tokenizer {spec!r} is not a local directory and could not be fetched from the Hugging Face "
                f"hub ({type(e).__name__}); the hub may be unreachable from here: pass a local tokenizer "
                "directory instead"
            ) from e
    eos = special.get("eos_token")
    eos_id = backend.token_to_id(eos) if eos else None
    if eos_id is None:
        raise TokenizeError(f"tokenizer {spec!r} has no eos_token in its tokenizer_config.json")
    bos = special.get("bos_token")
    bos_id = backend.token_to_id(bos) if bos else None
    tok = _Tokenizer(backend, bos_id, eos_id, backend.get_vocab_size(with_added_tokens=True))
    _TOKENIZERS[spec] = tok
    return tok


def _resolve_tokenizer(spec: str, root: str | None) -> str:
    """An absolute directory for a local tokenizer (relative ones are under `root`); names stay names."""
    if "://" in spec:
        return spec
    candidate = spec if os.path.isabs(spec) or root is None else os.path.join(root, spec)
    return os.path.abspath(candidate) if os.path.isdir(candidate) else spec


def _looks_like_hub_name(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/"))


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<|endoftext|>", ...}
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(directory: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(directory, name)) as f:
                raw = json.load(f)
        except FileNotFoundError:
            continue
        except ValueError as e:
            raise TokenizeError(f"tokenizer {directory!r}: {name} is not valid JSON ({e})") from e
        for key in ("bos_token", "eos_token"):
            text = _token_text(raw.get(key))
            if text:
                out[key] = text
    return out


def _hub_special_tokens(name: str) -> dict[str, str]:
    from huggingface_hub import hf_hub_download

    return _special_tokens(os.path.dirname(hf_hub_download(name, "tokenizer_config.json")))


# -- progress -------------------------------------------------------------------------------------


class _Progress:
    """A progress line per split: documents and tokens, with tokens per second."""

    def __init__(self, split: str, documents: int, tokens: int) -> None:
        from rich.progress import Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("tokenize {task.fields[split]}"),
            TextColumn("{task.fields[documents]:,} docs"),
            TextColumn("{task.completed:,.0f} tokens"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
        )
        self._task = self._progress.add_task(
            "tokenize", split=split, documents=documents, rate="", completed=tokens, total=None
        )
        self._documents = documents
        self._started = time.time()
        self._new_tokens = 0

    def __enter__(self) -> _Progress:
        self._progress.start()
        return self

    def advance(self, documents: int, tokens: int) -> None:
        self._documents += documents
        self._new_tokens += tokens
        rate = self._new_tokens / max(time.time() - self._started, 1e-9)
        self._progress.update(
            self._task, advance=tokens, documents=self._documents, rate=f"{rate:,.0f} tok/s"
        )

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()
