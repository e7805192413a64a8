"""The `mirror` step: copy a raw dataset to another location (a bucket in another region).

    web = raw_dataset("web", version="2026-11", urls={"us-central1": "gs://us/raw/web",
                                                      "europe-west4": "gs://eu/raw/web"})
    copy = mirror_step("mirror/web-eu", dataset=web, to="gs://eu/raw/web", budget=50 * 2**40)

The step copies every file of the dataset's first location (or `source`) to `to`, keeping the
names under it, and verifies each copy by its size and its content: the checksums where both
stores keep the same kind (GCS md5, S3 ETag of a single-part upload), else an md5 computed on
the side that has none against the other's, else the sha256 of both (local files through the
machine's hash cache, `steps.data.sources.file_sha256`). It is resumable per file: a file already at
the destination with the same size and content is not copied again, so a rerun after a kill
continues where the killed attempt stopped; one of the same size but other bytes (a file fixed
in place) is copied again. Copies within one store are made by the store
(`fs.copy`); across stores the bytes stream through the step's process.

Before anything is copied, the bytes still to copy are compared with `budget`; over it, the step
fails with one error naming the dataset, the bytes and the budget, and copies nothing.

Output: `mirror.json` (source, destination, files and bytes, copied and already there, how each was
verified). The copy itself is outside the prefix, where the dataset declares it: the dataset's
identity does not change, so the steps that read it are not rerun.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline import Resources, Step, StepDeclarationError, step_function, this_output, versioned
from pipeline.steplib import parallel_map, step_events
from steps.data.sources import CHECKSUM_KEYS, InputError, RawDataset, expand_input, file_sha256, list_inputs
from steps.files import exists, read_json, write_json

__all__ = ["MirrorConfig", "MirrorError", "mirror", "mirror_step"]


class MirrorError(ValueError):
    """A copy that cannot be made or verified, or one over its budget."""


@dataclass(frozen=True)
class MirrorConfig:
    """Configuration of the mirror step."""

    dataset: RawDataset
    """The dataset to copy (its identity is versioned; its locations are not)."""
    to: str
    """The destination directory (a URL or path): the dataset's files go under it by name."""
    output: str
    """The step's output directory (`this_output()`), for `mirror.json`."""
    source: str | None = None
    """The location to copy from (default: the dataset's first)."""
    budget: int = 2**30
    """The most bytes this step may copy."""
    num_workers: int = 1
    """Files copied at once (Ray tasks on a Ray worker, else local processes)."""
    identity: dict[str, Any] | None = None
    """The dataset's name and version and the destination: what identity takes."""


def mirror_step(
    name: str,
    *,
    dataset: RawDataset,
    to: str,
    source: str | None = None,
    budget: int = 2**30,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready mirror `Step`: the dataset's name, version and the destination are versioned."""
    if not isinstance(dataset, RawDataset):
        raise StepDeclarationError(name, "dataset must be a raw_dataset(...)", field="dataset")
    if not to:
        raise StepDeclarationError(name, "give a destination", field="to")
    if source is not None and source not in dataset.urls:
        raise StepDeclarationError(name, f"{source!r} is not one of the dataset's urls", field="source")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise StepDeclarationError(name, "budget is a number of bytes >= 0", field="budget")
    identity = {"dataset": dataset.name, "version": dataset.version, "to": to}
    return Step(
        name=name,
        fn=mirror,
        config=MirrorConfig(
            dataset=dataset,
            to=to,
            output=this_output(),
            source=source,
            budget=budget,
            num_workers=num_workers,
            identity=versioned(identity),
        ),
        description=f"mirror {dataset.name} to {to}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


def mirror_inputs(config: MirrorConfig) -> dict[str, dict[str, Any]]:
    """The files the step copies, with fingerprints (recorded; compared by later plans)."""
    try:
        return list_inputs({"source": [_source(config)]}, None)
    except InputError as e:
        raise MirrorError(str(e)) from e


def _source(config: MirrorConfig) -> RawDataset:
    """The dataset reduced to the one location the step copies from."""
    url = config.source or config.dataset.urls[0]
    return RawDataset(config.dataset.name, config.dataset.version, (url,))


def _report(config: MirrorConfig) -> str | None:
    if not exists(f"{config.output}/mirror.json"):
        return None
    done = read_json(f"{config.output}/mirror.json")
    return (
        f"{done['files']:,} files ({done['bytes']:,} bytes) at {done['destination']}: "
        f"{done['copied']:,} copied, {done['already_there']:,} already there"
    )


@step_function(inputs=mirror_inputs, report=_report)
def mirror(config: MirrorConfig) -> None:
    """Copy the dataset's files to `config.to`, resumably, within `config.budget`."""
    started = time.time()
    try:
        files = expand_input(_source(config), None, named=False)
    except InputError as e:
        raise MirrorError(str(e)) from e
    destination = config.to.rstrip("/")
    dst_fs, _ = fsspec.core.url_to_fs(destination)
    todo, there = [], []
    for path, rel, info in files:
        target = f"{destination}/{rel}"
        (there if _same(path, info, target, _info(dst_fs, target)) else todo).append((path, target, info))
    size = sum(int(info.get("size") or 0) for _p, _t, info in todo)
    if size > config.budget:
        raise MirrorError(
            f"mirror of dataset {config.dataset.name!r}: {size:,} bytes to copy to {destination} is over its "
            f"budget of {config.budget:,} bytes (field `budget`); {len(there)} of {len(files)} files are "
            "already there"
        )
    verified: dict[str, int] = {}
    args = [(path, target, dict(info)) for path, target, info in todo]
    for done, how in enumerate(parallel_map(_copy, args, max_workers=config.num_workers), 1):
        verified[how] = verified.get(how, 0) + 1
        step_events.progress(done, len(todo), "files copied")
    write_json(
        f"{config.output}/mirror.json",
        {
            "dataset": config.dataset.name,
            "version": config.dataset.version,
            "source": config.source or config.dataset.urls[0],
            "destination": destination,
            "files": len(files),
            "bytes": sum(int(info.get("size") or 0) for _p, _r, info in files),
            "copied": len(todo),
            "bytes_copied": size,
            "already_there": len(there),
            "verified_by": verified,
            "seconds": round(time.time() - started, 3),
        },
    )


def _info(fs: Any, path: str) -> dict[str, Any] | None:
    try:
        return fs.info(fs._strip_protocol(path))
    except FileNotFoundError:
        return None


def _same(path: str, a: Mapping[str, Any], target: str, b: Mapping[str, Any] | None) -> str | None:
    """How the file at `target` (info `b`) was found to hold the bytes of `path` (info `a`):
    "checksum" (one kind kept by both stores), "md5" or "sha256" (computed); None if it differs
    or is missing. Never by size alone: a file fixed in place keeps its size."""
    if b is None or a.get("size") != b.get("size"):
        return None
    for key in CHECKSUM_KEYS:
        if a.get(key) and b.get(key):
            return "checksum" if str(a[key]).strip('"') == str(b[key]).strip('"') else None
    known_a, known_b = _known_md5(a), _known_md5(b)
    if known_a or known_b:
        md5_a = known_a or _stream_digest(path, hashlib.md5)
        md5_b = known_b or _stream_digest(target, hashlib.md5)
        return "md5" if md5_a == md5_b else None
    return "sha256" if _sha256(path) == _sha256(target) else None


_HEX_MD5 = re.compile(r"^[0-9a-f]{32}$")


def _known_md5(info: Mapping[str, Any]) -> str | None:
    """The md5 (hex) a store keeps for a file, if it keeps one: GCS `md5Hash` (base64), an S3
    ETag of a single-part upload (hex; a multipart ETag has a `-`), an `md5` field."""
    if info.get("md5Hash"):
        try:
            return base64.b64decode(str(info["md5Hash"])).hex()
        except ValueError:
            return None
    for key in ("ETag", "etag", "md5"):
        value = str(info.get(key) or "").strip('"').lower()
        if _HEX_MD5.match(value):
            return value
    return None


def _local(path: str) -> str | None:
    return path.removeprefix("file://") if "://" not in path or path.startswith("file://") else None


def _sha256(path: str) -> str:
    local = _local(path)
    return file_sha256(local) if local is not None else _stream_digest(path, hashlib.sha256)


def _stream_digest(path: str, kind: Any) -> str:
    digest = kind()
    with fsspec.open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()


def _copy(path: str, target: str, info: dict[str, Any]) -> str:
    """Copy one file and verify it; returns how it was verified. A file is written whole or not
    at all (object stores replace objects whole; locally it goes through a temporary name)."""
    src_fs, src = fsspec.core.url_to_fs(path)
    dst_fs, dst = fsspec.core.url_to_fs(target)
    if type(src_fs) is type(dst_fs) and src_fs.protocol == dst_fs.protocol:
        dst_fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        src_fs.cp_file(src, dst)  # made by the store, by exact name: no bytes through this process
    else:  # streamed: an object store commits the upload whole on close; a local file is renamed
        local = isinstance(dst_fs, LocalFileSystem)
        if local:
            dst_fs.makedirs(dst.rsplit("/", 1)[0], exist_ok=True)
        with src_fs.open(src, "rb") as f, dst_fs.open(dst + ".part" if local else dst, "wb") as out:
            shutil.copyfileobj(f, out, 8 * 2**20)
        if local:
            os.replace(dst + ".part", dst)
    how = _same(path, info, target, _info(dst_fs, target))
    if how is None:
        raise MirrorError(f"the copy of {path} at {target} differs from it (size or checksum); run again")
    return how
