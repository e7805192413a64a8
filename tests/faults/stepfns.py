"""A step function whose output can be checked after a crash: parts, a manifest, a call log.

`write_parts` writes `parts` files one by one (slowly, without atomic renames, so a kill can land
between or inside writes), then `MANIFEST.json` with the SHA-256 of every part, a unique call id,
the attempt's fencing token and the call ids of the upstream outputs it read. It appends one
`start` and one `finish` line to a call log kept outside the prefix. After a trial,
`tests.faults.trials` checks every committed step against this record: complete, produced by one
call that finished, under the token that committed it.

Imported by experiment files run in other processes, so it imports nothing heavy. Writes go
through fsspec, so the same function runs on local disk, memory:// or a fault-injecting filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import fsspec

from pipeline import step_function
from pipeline.run.in_step import step_events

__all__ = ["FILESYSTEMS", "MANIFEST", "PartsConfig", "log_call", "write_parts"]

MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class PartsConfig:
    """Config of `write_parts`."""

    output: str
    """The step's own output directory (`this_output()`)."""
    calls: str
    """The call log: a file outside the prefix that every call appends to."""
    seed: int = 0
    """Versioned: gives each step its identity."""
    parts: int = 4
    """How many part files the step writes."""
    pause: float = 0.05
    """Seconds between part writes: the window in which faults land."""
    inputs: list[str] = field(default_factory=list)
    """Upstream output directories (`output_of(...)`); their manifests are read and recorded."""
    fs: str | None = None
    """Key of a filesystem in `FILESYSTEMS` to write through (same process only); None: the
    local disk for plain paths, fsspec for URLs."""


FILESYSTEMS: dict[str, Any] = {}
"""In-process fsspec filesystems by key, for trials whose step writes go through a faulty one."""


def _filesystem(config: PartsConfig) -> Any:
    if config.fs is not None:
        return FILESYSTEMS[config.fs]
    if "://" in config.output:
        return fsspec.filesystem(config.output.split("://", 1)[0])
    return fsspec.filesystem("file")


def log_call(path: str, record: dict) -> None:
    """Append one JSON line to the call log (one `write` on an O_APPEND descriptor: atomic)."""
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@step_function
def write_parts(config: PartsConfig) -> None:
    """Write `parts` files and a manifest of their digests, logging the call's start and finish."""
    context = step_events.current()
    call = uuid.uuid4().hex
    step = config.output.rstrip("/").rsplit("/", 1)[-1]
    base = {"call": call, "step": step, "pid": os.getpid(), "token": context.token if context else None}
    log_call(config.calls, {**base, "event": "start", "time": time.time()})
    fs = _filesystem(config)
    upstream = {}
    for path in config.inputs:
        upstream[path.rstrip("/").rsplit("/", 1)[-1]] = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))["call"]
    fs.makedirs(config.output, exist_ok=True)
    digests = {}
    for i in range(config.parts):
        # Deliberately plain writes in place: a fault may leave a part missing or half written.
        data = f"{call}:{i}:".encode() + os.urandom(4096)
        name = f"part-{i}"
        with fs.open(f"{config.output}/{name}", "wb") as f:
            f.write(data)
        digests[name] = hashlib.sha256(data).hexdigest()
        time.sleep(config.pause)
    manifest = {"call": call, "token": base["token"], "parts": digests, "inputs": upstream}
    with fs.open(f"{config.output}/{MANIFEST}", "wb") as f:
        f.write(json.dumps(manifest, sort_keys=True).encode())
    log_call(config.calls, {**base, "event": "finish", "time": time.time()})
