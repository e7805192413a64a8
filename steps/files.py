"""Files by path or URL, for every step: read and write whole files, atomically, through fsspec.

A step's output may be a local directory or a URL (`s3://`, `gs://`, `memory://`); every file a
step writes goes through these helpers, so each step works on every prefix. Readers never see
half a file: on local disk a file is written beside its destination and renamed into place, and
an object store replaces an object whole. An upload first checks the running attempt's lease
(`step_events.check_lease`): the write fence sees file writes, not network requests, so an
attempt that has lost its step must not replace the new owner's objects.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.steplib import step_events, write_atomically

__all__ = [
    "exists",
    "local_path",
    "read_bytes",
    "read_json",
    "read_text",
    "save_figure",
    "write_file",
    "write_json",
    "write_text",
]


def local_path(path: str) -> str | None:
    """`path` as a path on this machine's disk (a plain path or a file:// URL), or None for any
    other URL (gs://, s3://, memory://...), where files can only be replaced whole."""
    fs, plain = fsspec.core.url_to_fs(path)
    return plain if isinstance(fs, LocalFileSystem) else None


def exists(path: str) -> bool:
    """Whether a file or directory exists at `path` (a path or URL)."""
    fs, plain = fsspec.core.url_to_fs(path)
    return fs.exists(plain)


def write_file(path: str, data: bytes) -> None:
    """Replace the file at `path` (a path or URL) with `data`; its directory is created if needed."""
    fs, plain = fsspec.core.url_to_fs(path)
    if not isinstance(fs, LocalFileSystem):
        # An upload is not a file write, so the write fence cannot see it: check the lease here.
        step_events.check_lease(f"upload of {path}")
        fs.pipe_file(plain, data)  # object stores have no directories to create
        return
    write_atomically(plain, data)  # storage's own: a killed write leaves a `.tmp-*` that gc finds


def write_text(path: str, text: str) -> None:
    """Replace the file at `path` with `text` (UTF-8)."""
    write_file(path, text.encode("utf-8"))


def write_json(path: str, value: Any, *, indent: int | None = 2) -> None:
    """Replace the file at `path` with `value` as JSON."""
    write_text(path, json.dumps(value, indent=indent))


def read_bytes(path: str) -> bytes:
    """The bytes of the file at `path` (a path or URL); FileNotFoundError if there is none."""
    with fsspec.open(path, "rb") as f:
        return f.read()


def read_text(path: str) -> str:
    """The text of the file at `path` (a path or URL); FileNotFoundError if there is none."""
    with fsspec.open(path, "r", encoding="utf-8") as f:
        return f.read()


def read_json(path: str) -> Any:
    """The JSON value in the file at `path` (a path or URL)."""
    return json.loads(read_text(path))


def save_figure(fig: Any, path: str, **savefig: Any) -> None:
    """Save a matplotlib figure as PNG to `path` (a path or URL)."""
    png = io.BytesIO()
    fig.savefig(png, format="png", **savefig)
    write_file(path, png.getvalue())
