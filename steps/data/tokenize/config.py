"""The tokenize step's config, below the modules that read it (`cache`, `readers`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["TokenizeConfig"]


@dataclass(frozen=True)
class TokenizeConfig:
    """Configuration of the tokenize step."""

    train: list[Any]
    """Training inputs: paths, globs or directories (relative ones are under `input_root`),
    `RawDataset`s (`steps.data.sources.raw_dataset`), or `output_of` an upstream step."""
    tokenizer: str
    """A Hugging Face tokenizer: a local directory (tokenizer.json) or a hub name."""
    output: str
    """The step's output directory (`this_output()`)."""
    validation: list[Any] = field(default_factory=list)
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
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs and the tokenizer (`steps.data.sources`): datasets by name
    and version, paths without their location, a local tokenizer by the hash of its files. The
    locations themselves (`train`, `validation`, `tokenizer`) are recorded but not versioned, so
    the same data in another bucket, region or checkout keeps the step's identity."""
