"""Run manifests on storage: where they live, how they are written, and reading them back.

A manifest is `<prefix>/experiments/<experiment>-<hash>.json` (the hash is over the DAG's step
labels, so the same experiment run again updates the same file).
`pipeline.run.records.manifest_builder` builds its content; this module names, writes and reads
it. It is written one step per line: readable, and without `indent`, which pushes `json` onto its
slow pure-Python encoder (seconds for a 100,000-step manifest).
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.core.identity import HASH_CHARS
from pipeline.errors import StepDeclarationError
from pipeline.storage.files import Storage
from pipeline.storage.layout import MANIFEST_DIR, TMP_PREFIX, join_path, manifest_name

__all__ = [
    "RUNS_DIR",
    "ManifestError",
    "encode_lines",
    "encoded_head",
    "experiment_name",
    "is_manifest",
    "list_manifests",
    "list_run_records",
    "load_manifest",
    "manifest_path",
    "parse_manifest",
    "run_record_dir",
    "run_record_path",
    "steps_checksum",
    "with_head",
]


class ManifestError(StepDeclarationError):
    """A manifest cannot be read, or is not a Drydock run manifest."""


def is_manifest(path: str) -> bool:
    """Whether a command's argument names a run manifest (`<name>-<hash>.json`) rather than an
    experiment file; `run`, `plan`, `status`, `dag` and `explain` accept either."""
    return path.endswith(".json")


def experiment_name(name: str | None, source_file: str | None) -> str:
    """A file-name-safe experiment name: the given one, else the experiment file's stem."""
    raw = name or (source_file.rsplit("/", 1)[-1].removesuffix(".py") if source_file else "experiment")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("._") or "experiment"


def manifest_path(prefix: str, labels: Iterable[str], experiment: str) -> str:
    """Where the manifest of the DAG with these step labels lives under `prefix`."""
    digest = hashlib.sha256("\n".join(sorted(labels)).encode()).hexdigest()[:HASH_CHARS]
    return join_path(prefix, manifest_name(experiment, digest))


_STEPS_OPEN = b', "steps": [\n'
_STEPS_CLOSE = b"\n]}\n"


def encode_lines(
    head: Mapping[str, Any],
    step_lines: Iterable[str | bytes | tuple[bytes, ...]],
    *,
    checksum: str | None = None,
) -> bytes:
    """A manifest from its fields but `steps`, and each step already encoded as one JSON line:
    text, UTF-8 bytes, or a tuple of byte pieces that make the line when joined. `checksum`: a
    field of the head that gets the CRC-32 of the steps as written (`steps_checksum`)."""
    pieces = [b""]
    for i, line in enumerate(step_lines):
        if i:
            pieces.append(b",\n")
        if isinstance(line, tuple):
            pieces.extend(line)
        else:
            pieces.append(line if isinstance(line, bytes) else line.encode())
    pieces.append(_STEPS_CLOSE)
    if checksum is not None:
        crc = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
        head = {**head, checksum: crc}
    pieces[0] = _head_line(head)
    # One copy, made once: a manifest of 10,000 steps is about 10 MB, and its copies set a
    # cached rerun's peak memory.
    return b"".join(pieces)


def with_head(head: Mapping[str, Any], encoded: bytes) -> bytes:
    """A manifest that `encode_lines` wrote, with its fields but `steps` replaced by `head`."""
    return b"".join((_head_line(head), memoryview(encoded)[encoded.index(b"\n") + 1 :]))


def encoded_head(encoded: bytes) -> dict[str, Any] | None:
    """The fields but `steps` of a manifest as `encode_lines` wrote it (its first line), or None
    for anything else: bytes of another shape, a manifest cut short or indented by hand."""
    end = encoded.find(b"\n")
    first = encoded[: end + 1]
    if end < 0 or not first.endswith(_STEPS_OPEN) or not encoded.endswith(_STEPS_CLOSE):
        return None
    try:
        head = json.loads(first[: -len(_STEPS_OPEN)] + b"}")
    except ValueError:
        return None
    return head if isinstance(head, dict) else None


def steps_checksum(encoded: bytes) -> int:
    """The CRC-32 of the steps of a manifest as `encode_lines` wrote it (all but its first line),
    as its `checksum` field records it: a copy is made only of steps that are the bytes written."""
    return zlib.crc32(memoryview(encoded)[encoded.index(b"\n") + 1 :])


def _head_line(head: Mapping[str, Any]) -> bytes:
    """A manifest's first line: its fields but `steps`, and the opening of the `steps` list."""
    return json.dumps(head, default=str)[:-1].encode() + _STEPS_OPEN


def parse_manifest(data: bytes, location: str) -> dict[str, Any]:
    """A manifest's content; a `ManifestError` naming `location` if it is not one."""
    try:
        manifest = json.loads(data)
    except ValueError as e:
        raise ManifestError(None, f"{location} is not a JSON manifest: {e}", field="MANIFEST") from e
    if not isinstance(manifest, dict) or not isinstance(manifest.get("steps"), list):
        raise ManifestError(
            None, f"{location} is not a Drydock run manifest (no `steps` list)", field="MANIFEST"
        )
    return manifest


def load_manifest(location: str) -> dict[str, Any]:
    """Read a manifest from a local path or any fsspec URL; errors name the location."""
    from pipeline.storage.opening import open_storage

    try:
        data = open_storage(location).read(location)
    except Exception as e:
        raise ManifestError(None, f"cannot read manifest {location!r}: {e}", field="MANIFEST") from e
    if data is None:
        raise ManifestError(None, f"manifest {location!r} does not exist", field="MANIFEST")
    return parse_manifest(data, location)


def manifest_dir(prefix: str) -> str:
    """`<prefix>/experiments`."""
    return join_path(prefix, MANIFEST_DIR)


def list_manifests(storage: Storage, prefix: str) -> list[str]:
    """File names of the manifests under `<prefix>/experiments/`, sorted."""
    return sorted(
        n
        for n in storage.listdir(manifest_dir(prefix))
        if n.endswith(".json") and not n.startswith(TMP_PREFIX)
    )


RUNS_DIR = "runs"
"""`<prefix>/experiments/runs/<experiment>-<hash>/<run id>.json`: one record per run of a DAG, which
the manifest beside it (the latest run's) would otherwise overwrite."""


def run_record_path(manifest: str, run_id: str) -> str:
    """Where the run `run_id` of the manifest at `manifest` keeps its own copy."""
    directory, name = manifest.rsplit("/", 1)
    return f"{directory}/{RUNS_DIR}/{name.removesuffix('.json')}/{run_id}.json"


def list_run_records(storage: Storage, prefix: str, manifest_id: str) -> list[str]:
    """File names of the run records of manifest `manifest_id` (`<experiment>-<hash>`), sorted."""
    directory = run_record_dir(prefix, manifest_id)
    return sorted(
        n for n in storage.listdir(directory) if n.endswith(".json") and not n.startswith(TMP_PREFIX)
    )


def run_record_dir(prefix: str, manifest_id: str) -> str:
    """The directory of the run records of manifest `manifest_id`."""
    return f"{manifest_dir(prefix)}/{RUNS_DIR}/{manifest_id}"
