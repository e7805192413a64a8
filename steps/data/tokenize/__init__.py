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
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from pipeline import OutputOf, Resources, Step, StepDeclarationError, step_function, this_output, versioned
from pipeline.steplib import parallel_map, step_events
from steps.data.sources import (
    InputError,
    RawDataset,
    check_local_inputs_exist,
    input_identity,
    raw_listing,
    tokenizer_identity,
)
from steps.data.tokenize.cache import read_marker, tokenize_shard, write_ledger
from steps.data.tokenize.common import ShardStats, TokenizeError
from steps.data.tokenize.config import TokenizeConfig
from steps.data.tokenize.readers import expand_inputs, is_data_file
from steps.data.tokenize.tokenizer import _looks_like_hub_name, load_tokenizer, resolve_tokenizer
from steps.files import write_json
from steps.imports import LEVANTER, import_ml

__all__ = ["ShardStats", "TokenizeConfig", "TokenizeError", "tokenize", "tokenize_step"]

SPLITS = ("train", "validation")


def tokenize_step(
    name: str,
    *,
    train: Sequence[str | RawDataset | OutputOf],
    tokenizer: str,
    validation: Sequence[str | RawDataset | OutputOf] = (),
    text_field: str = "text",
    text_mode: str = "document",
    on_bad_line: str = "fail",
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready tokenize `Step`. The inputs' identities (`steps.data.sources`), the tokenizer's, the
    text field and policies are versioned.

    Local inputs and a local tokenizer directory are checked before anything runs (remote ones
    when the step runs): a missing one is a `StepDeclarationError` naming the field.
    """
    check_local_inputs(name, {"train": train, "validation": validation}, tokenizer, input_root)
    identity = {
        split: [None if isinstance(spec, OutputOf) else input_identity(spec, input_root) for spec in specs]
        for split, specs in (("train", train), ("validation", validation))
    }
    identity["tokenizer"] = tokenizer_identity(tokenizer, input_root)
    return Step(
        name=name,
        fn=tokenize,
        config=TokenizeConfig(
            train=list(train),
            validation=list(validation),
            tokenizer=tokenizer,
            text_field=versioned(text_field),
            text_mode=versioned(text_mode),
            on_bad_line=versioned(on_bad_line),
            output=this_output(),
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned(identity),
        ),
        description=f"tokenize {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


def check_local_inputs(
    name: str, inputs: dict[str, Sequence[Any]], tokenizer: str, input_root: str | None
) -> None:
    """Refuse local input files and a local tokenizer directory that do not exist."""
    if input_root is not None and "://" in input_root:
        return  # everything is remote: checked when the step runs
    for split, specs in inputs.items():
        for i, spec in enumerate(specs):
            if isinstance(spec, OutputOf | RawDataset) or "://" in spec:
                continue
            try:
                expand_inputs([spec], input_root, split)
            except TokenizeError as e:
                raise StepDeclarationError(name, str(e), field=f"{split}[{i}]") from e
    candidate = (
        tokenizer if os.path.isabs(tokenizer) or input_root is None else os.path.join(input_root, tokenizer)
    )
    if "://" in tokenizer or os.path.isdir(candidate):
        return  # a URL, or a directory that exists
    first = tokenizer.split("/", 1)[0]
    looks_local = tokenizer.startswith((".", "/")) or (
        input_root is not None and os.path.exists(os.path.join(input_root, first))
    )
    if looks_local or not _looks_like_hub_name(tokenizer):
        raise StepDeclarationError(name, f"no tokenizer directory {candidate}", field="tokenizer")


# -- the step function ----------------------------------------------------------------------------


def tokenize_inputs(config: TokenizeConfig) -> dict[str, dict[str, Any]]:
    """The raw files the step reads, with their fingerprints (`steps.data.sources.list_inputs`):
    recorded when it runs, listed again by each plan to note what changed since. Upstream steps'
    outputs are left out: their identities already say what they hold."""
    groups = {
        split: (specs, config.input_identity.get(split))
        for split, specs in (("train", config.train), ("validation", config.validation))
    }
    try:
        return raw_listing(groups, config.input_root, accept=is_data_file)
    except InputError as e:
        raise TokenizeError(str(e)) from e


def _inputs_exist(config: TokenizeConfig) -> None:
    """For a step rebuilt from a manifest: its local files and tokenizer are where it says (a
    checkout elsewhere: `--remap OLD=NEW`)."""
    check_local_inputs_exist({"train": config.train, "validation": config.validation}, config.input_root)
    try:
        check_local_inputs(None, {}, config.tokenizer, config.input_root)
    except StepDeclarationError as e:
        raise ValueError(f"tokenizer: {str(e).split(': ', 1)[-1]}") from None


@step_function(inputs=tokenize_inputs, check=_inputs_exist)
def tokenize(config: TokenizeConfig) -> None:
    """Tokenize every split of `config` into a Levanter cache under `config.output`."""
    import_ml(*LEVANTER)
    _check_config(config)
    # Workers (and Levanter, later) need a tokenizer path that does not depend on their cwd.
    config = dataclasses.replace(config, tokenizer=resolve_tokenizer(config.tokenizer, config.input_root))
    # Fail on a bad tokenizer before touching any input.
    info = load_tokenizer(config.tokenizer).info
    jobs: dict[str, list[tuple[str, str]]] = {}
    for split in SPLITS:
        inputs = config.train if split == "train" else config.validation
        files = expand_inputs(inputs, config.input_root, split)
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
        previous = read_marker(f"{split_dir}/{shard}")
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
        for result in parallel_map(tokenize_shard, args, max_workers=config.num_workers):
            done[result.shard] = result
            bar.advance(result.documents, result.tokens)
            # For `drydock status` from any machine (the bar above is only on this console).
            tokens = sum(s.tokens for s in done.values())
            step_events.progress(len(done), len(files), f"{split} shards", data={"tokens": tokens})
    ordered = [done[shard] for _path, shard in files]
    write_ledger(split_dir, ordered, load_tokenizer(config.tokenizer).metadata)
    return ordered


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
