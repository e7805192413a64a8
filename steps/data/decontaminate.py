"""The `decontaminate` step: remove training documents that share a long n-gram with evaluation data.

    clean = decontaminate_step("decontaminate/web", inputs=[deduped / "data"],
                               evaluation=["data/corpus/web/validation-*.jsonl"], tasks=DEMO_TASKS)

Evaluation data is the validation sets (their `text_field`) and the rows of the task-evaluation
step's inline tasks (`tasks`, their test split), jsonl or parquet. Every string in an evaluation
record (and every string in a list, such as a task's choices) is a text of its own. A text is
normalized (NFKC, lower case, punctuation as spaces) and split into words; each run of `ngram`
words (13 by default) is hashed into one set. Texts shorter than `ngram` words give no n-gram
and are counted as `too_short` in the stats: lower `ngram` to check them.

Training shards are streamed, fanned out with `parallel_map` (Ray tasks on a Ray worker, else
local processes), and each shard's result is kept under `.work/`, so a rerun after a kill
redoes only unfinished shards. A document with any n-gram in the set is removed.

Output:

    data/<source>/<file>     the kept records, in the input's format (see steps/data/shards.py)
    stats.json               per source: documents, words and bytes in, removed and out; the
                             evaluation items matched, per evaluation file
    removed/<file>.jsonl     every removed document of the shard (reason `contamination`): its
                             index, the evaluation items (file, index) it matched and the first
                             n-gram shared, an excerpt (`pipeline.observe.evidence`)
    kept/<file>.jsonl        the shard's first kept documents

"Words" are the whitespace-separated words of the normalized text: the step has no tokenizer.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pipeline import OutputOf, Resources, Step, StepDeclarationError, step_function, this_output, versioned
from pipeline.steplib import EVIDENCE_DIR, KEPT_DIR, KEPT_SAMPLE, evidence_line, parallel_map, step_events
from steps.data.minhash import BATCH_BYTES, ngram_hashes
from steps.data.shards import ShardError, is_shard, shard_records, shard_texts, write_kept
from steps.data.sources import (
    InputError,
    RawDataset,
    check_local_inputs_exist,
    input_identity,
    raw_listing,
    read_files,
)
from steps.files import exists, read_json, write_file, write_json

__all__ = ["DecontaminateConfig", "DecontaminateError", "decontaminate", "decontaminate_step", "words"]

_WORD = re.compile(r"[^\w]+")


class DecontaminateError(ValueError):
    """A decontaminate configuration or input that cannot be used."""


@dataclass(frozen=True)
class DecontaminateConfig:
    """Configuration of the decontaminate step."""

    inputs: list[Any]
    """Training shards: paths, globs, directories, `RawDataset`s or `output_of` a step."""
    evaluation: list[Any]
    """Evaluation files (validation sets, task rows): jsonl or parquet, like `inputs`."""
    output: str
    """The step's output directory (`this_output()`)."""
    text_field: str = "text"
    """The field holding a training document's text."""
    ngram: int = 13
    """Words per n-gram."""
    max_matches: int = 10
    """An evaluation n-gram found in more training documents than this is a common phrase, not a
    leaked item, and is ignored."""
    input_root: str | None = None
    """Directory relative inputs and evaluation files are under; not versioned."""
    num_workers: int = 1
    """Shards processed at once."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs and evaluation files (`steps.data.sources`)."""


class TaskRows(Protocol):
    """What decontamination reads of a task (`steps.evaluation.eval_tasks.EvalTask` is one): the
    files of its splits, by split, and which split is its test set."""

    @property
    def data(self) -> Mapping[str, str] | None: ...

    @property
    def test_split(self) -> str: ...


def decontaminate_step(
    name: str,
    *,
    inputs: Sequence[str | RawDataset | OutputOf],
    evaluation: Sequence[str | RawDataset | OutputOf] = (),
    tasks: Sequence[TaskRows] = (),
    text_field: str = "text",
    ngram: int = 13,
    max_matches: int = 10,
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready decontaminate `Step` against `evaluation` files plus the test rows of the inline
    `tasks` (their paths are relative to `input_root`, as the task step's `data_root`)."""
    task_files = [task.data[task.test_split] for task in tasks if task.data]
    everything = [*evaluation, *task_files]
    if not inputs:
        raise StepDeclarationError(name, "no inputs given", field="inputs")
    if not everything:
        raise StepDeclarationError(
            name, "no evaluation data given (evaluation files or inline tasks)", field="evaluation"
        )
    for key, value in (("ngram", ngram), ("max_matches", max_matches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StepDeclarationError(name, f"{key} must be a positive integer, got {value!r}", field=key)

    def ident(specs: Sequence[Any]) -> list[Any]:
        return [None if isinstance(s, OutputOf) else input_identity(s, input_root) for s in specs]

    return Step(
        name=name,
        fn=decontaminate,
        config=DecontaminateConfig(
            inputs=list(inputs),
            evaluation=everything,
            output=this_output(),
            text_field=versioned(text_field),
            ngram=versioned(ngram),
            max_matches=versioned(max_matches),
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned({"inputs": ident(inputs), "evaluation": ident(everything)}),
        ),
        description=f"decontaminate {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


def words(text: str) -> list[str]:
    """The normalized words of `text`: NFKC, lower case, punctuation as spaces."""
    return [w for w in _WORD.sub(" ", unicodedata.normalize("NFKC", text).lower()).split(" ") if w]


# -- the step function ----------------------------------------------------------------------------


def decontaminate_inputs(config: DecontaminateConfig) -> dict[str, dict[str, Any]]:
    """The raw files the step reads (training shards and evaluation files), with fingerprints."""
    groups = {
        "inputs": (config.inputs, config.input_identity.get("inputs")),
        "evaluation": (config.evaluation, config.input_identity.get("evaluation")),
    }
    try:
        return raw_listing(groups, config.input_root, is_shard)
    except InputError as e:
        raise DecontaminateError(str(e)) from e


def _report(config: DecontaminateConfig) -> str | None:
    if not exists(f"{config.output}/stats.json"):
        return None
    total = read_json(f"{config.output}/stats.json")["total"]
    return (
        f"{total['documents_removed']:,} of {total['documents_in']:,} documents removed "
        f"({total['words_removed']:,} words); {total['evaluation_items_matched']:,} evaluation items matched"
    )


def _inputs_exist(config: DecontaminateConfig) -> None:
    """For a step rebuilt from a manifest: its local files are where it says (`--remap` them)."""
    check_local_inputs_exist({"inputs": config.inputs, "evaluation": config.evaluation}, config.input_root)


@step_function(inputs=decontaminate_inputs, report=_report, check=_inputs_exist)
def decontaminate(config: DecontaminateConfig) -> None:
    """Decontaminate `config.inputs` against `config.evaluation` into `config.output`."""
    started = time.time()
    index, eval_files, too_short = _evaluation_index(config)
    shards = _files(config, config.inputs, "inputs")
    args = [(config, path, key, index) for path, key, _source in shards]
    scans: dict[str, dict[str, Any]] = {}
    for done, result in enumerate(parallel_map(_scan, args, max_workers=config.num_workers), 1):
        scans[result["key"]] = result
        step_events.progress(done, len(shards), "shards checked")
    # An n-gram in many training documents is a common phrase or boilerplate ("once upon a time
    # there was a little ..."), not a leaked evaluation item: GPT-3's decontamination ignored
    # 13-grams matching more than 10 training documents for the same reason.
    spread = Counter(h for scan in scans.values() for hit in scan["hits"] for h in hit["hashes"])
    common = {h for h, n in spread.items() if n > config.max_matches}
    removed: dict[str, list[dict[str, Any]]] = {}
    for key, scan in scans.items():
        removed[key] = []
        for hit in scan["hits"]:
            specific = [h for h in hit["hashes"] if h not in common]
            if specific:
                removed[key].append({**hit, "matched": sorted({tuple(index[h]) for h in specific})})
    write_args = [
        (config, path, key, scans[key]["documents"], _removals(removed[key], eval_files))
        for path, key, _source in shards
    ]
    for done, _ in enumerate(parallel_map(_write_shard, write_args, max_workers=config.num_workers), 1):
        step_events.progress(done, len(shards), "shards written")
    _write_outputs(config, shards, scans, removed, eval_files, too_short, len(common), time.time() - started)


def _files(config: DecontaminateConfig, specs: Sequence[Any], what: str) -> list[tuple[str, str, str]]:
    try:
        return read_files(specs, config.input_identity.get(what), config.input_root, is_shard, what)
    except InputError as e:
        raise DecontaminateError(str(e)) from e


def _evaluation_index(config: DecontaminateConfig) -> tuple[dict[int, tuple[int, int]], list[str], int]:
    """n-gram hash -> (evaluation file number, item index), the evaluation files' names, and how
    many evaluation texts were too short to give an n-gram."""
    index: dict[int, tuple[int, int]] = {}
    names = []
    too_short = 0
    for number, (path, key, _source) in enumerate(_files(config, config.evaluation, "evaluation")):
        names.append(key)
        texts, items = [], []
        try:
            for item, record in enumerate(shard_records(path)):
                for text in _strings(record):
                    tokens = words(text)
                    if len(tokens) < config.ngram:
                        too_short += 1
                        continue
                    texts.append(" ".join(tokens))
                    items.append(item)
        except ShardError as e:
            raise DecontaminateError(str(e)) from e
        hashes, first = ngram_hashes(texts, config.ngram, short=False)
        owners = np.repeat(np.asarray(items, dtype=np.int64), np.diff(np.append(first, len(hashes))))
        for h, item in zip(hashes.tolist(), owners.tolist(), strict=True):
            index.setdefault(h, (number, item))
    return index, names, too_short


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _scan(
    config: DecontaminateConfig, path: str, key: str, index: dict[int, tuple[int, int]]
) -> dict[str, Any]:
    """One training shard's documents that share an n-gram with the evaluation data (with the
    n-grams), plus its totals. Kept under `.work/`, so a rerun reuses finished shards."""
    work = f"{config.output}/.work/{key}.ngrams.json"  # (.json: blake2b hashes, before numpy's)
    if exists(work):
        return read_json(work)
    known = np.fromiter(index, dtype=np.uint64, count=len(index))
    totals = {"documents": 0, "words": 0, "bytes": 0}
    hits: list[dict[str, Any]] = []
    batch: list[str] = []  # the normalized words of documents not yet looked up, space-joined
    sizes: list[int] = []
    batch_bytes = 0

    def look_up() -> None:
        hashes, first = ngram_hashes(batch, config.ngram, short=False)
        found = np.flatnonzero(np.isin(hashes, known))
        if len(found):
            owner = np.searchsorted(first, found, side="right") - 1
            for doc in np.unique(owner).tolist():
                mine = found[owner == doc]
                tokens = batch[doc].split(" ")
                start = int(mine[0] - first[doc])  # the first matching n-gram
                hits.append(
                    {
                        "index": totals["documents"] - len(batch) + doc,
                        "hashes": sorted(set(hashes[mine].tolist())),
                        "words": len(tokens),
                        "bytes": sizes[doc],
                        "ngram": " ".join(tokens[start : start + config.ngram]),
                    }
                )
        batch.clear()
        sizes.clear()

    try:
        for text in shard_texts(path, config.text_field):
            tokens = words(text)
            totals["documents"] += 1
            totals["words"] += len(tokens)
            size = len(text.encode("utf-8"))
            totals["bytes"] += size
            batch.append(" ".join(tokens))
            sizes.append(size)
            batch_bytes += size
            if batch_bytes >= BATCH_BYTES:
                look_up()
                batch_bytes = 0
    except ShardError as e:
        raise DecontaminateError(str(e)) from e
    if batch:
        look_up()
    result = {"key": key, **totals, "hits": hits}
    write_json(work, result, indent=None)  # whole or not at all: a killed shard is redone
    return result


def _removals(removed: list[dict[str, Any]], eval_files: list[str]) -> dict[int, dict[str, Any]]:
    """A shard's removed documents by index: the evaluation items each matched, and the n-gram."""
    return {
        r["index"]: {
            "matched": [{"file": eval_files[f], "index": item} for f, item in r["matched"]],
            "ngram": r["ngram"],
        }
        for r in removed
    }


def _write_shard(
    config: DecontaminateConfig, src: str, key: str, documents: int, removed: dict[int, dict[str, Any]]
) -> None:
    """The shard's kept records, and its evidence (`pipeline.observe.evidence`): each removed
    document with the evaluation items it matched and the first n-gram shared."""
    write_kept(src, f"{config.output}/data/{key}", [i not in removed for i in range(documents)])
    lines, sample = [], []
    for i, text in enumerate(shard_texts(src, config.text_field)):
        if i in removed:
            line = evidence_line(i, None, text, "contamination", None, removed[i])
            lines.append(json.dumps(line, ensure_ascii=False))
        elif len(sample) < KEPT_SAMPLE:
            sample.append(json.dumps(evidence_line(i, None, text, None), ensure_ascii=False))
    write_file(f"{config.output}/{EVIDENCE_DIR}/{key}.jsonl", "".join(x + "\n" for x in lines).encode())
    write_file(f"{config.output}/{KEPT_DIR}/{key}.jsonl", "".join(x + "\n" for x in sample).encode())


def _write_outputs(
    config: DecontaminateConfig,
    shards: list[tuple[str, str, str]],
    scans: dict[str, dict[str, Any]],
    removed: dict[str, list[dict[str, Any]]],
    eval_files: list[str],
    too_short: int,
    common: int,
    seconds: float,
) -> None:
    sources: dict[str, dict[str, int]] = {}
    matched: dict[str, set[int]] = {}
    for _path, key, source in shards:
        into = sources.setdefault(source, {})
        for unit in ("documents", "words", "bytes"):
            gone = len(removed[key]) if unit == "documents" else sum(r[unit] for r in removed[key])
            into[f"{unit}_in"] = into.get(f"{unit}_in", 0) + scans[key][unit]
            into[f"{unit}_removed"] = into.get(f"{unit}_removed", 0) + gone
        for r in removed[key]:
            for f, item in r["matched"]:
                matched.setdefault(eval_files[f], set()).add(item)
    for into in sources.values():
        for unit in ("documents", "words", "bytes"):
            into[f"{unit}_out"] = into[f"{unit}_in"] - into[f"{unit}_removed"]
    total = {k: sum(s[k] for s in sources.values()) for k in next(iter(sources.values()))}
    total["evaluation_items_matched"] = sum(len(v) for v in matched.values())
    # As every curation step counts its removals (`pipeline.observe.evidence`): one reason here.
    total["documents_kept"] = total["documents_out"]
    total["reasons"] = (
        {"contamination": {"documents": total["documents_removed"], "bytes": total["bytes_removed"]}}
        if total["documents_removed"]
        else {}
    )
    parameters = {"ngram": config.ngram, "max_matches": config.max_matches, "text_field": config.text_field}
    write_json(
        f"{config.output}/stats.json",
        {
            "parameters": parameters,
            "total": total,
            "sources": sources,
            "evaluation": {
                "files": eval_files,
                "too_short": too_short,
                "common_ngrams_ignored": common,
                "matched": {name: sorted(items) for name, items in matched.items()},
            },
            "seconds": round(seconds, 3),
        },
    )
