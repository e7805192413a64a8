"""Copying a directory from outside the prefix into a step directory (what `drydock adopt` does).

Three jobs, each safe on its own:

  - `list_source`: what under FROM may be copied. Plain files, and links that resolve to a plain
    file inside FROM (copied as that file). Links to a directory inside FROM are skipped (their
    files are copied under their own names, and a loop cannot recurse). Everything else is refused
    before anything is written: a link leaving FROM (its target's content, a credentials file
    say, would be copied into the prefix and pinned), a dangling or looping link, a named pipe, a
    socket, a device. Object stores have no links.
  - `copy_files`: the listed files into a staging directory, calling `check` before each file
    (the caller's lease fence): a copy that loses its lease stops at once.
  - `promote`: the staged files into the step directory, checked again before each move; renames
    on local disk, server-side copies on object stores. The staging directory's name starts with
    the prefix's temporary-file mark, so it is never payload, and gc removes it if a crash leaves it.

Object-store paths go through `cp_file`, `put_file` and `cat_file`, which take exact keys: fsspec's
`copy` and `rm` would expand `[`, `?` and `*` in a name as a glob.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import fsspec
from fsspec.implementations.local import LocalFileSystem

from pipeline.errors import StorageError
from pipeline.storage.files import Storage
from pipeline.storage.layout import TMP_PREFIX

__all__ = ["SourceListing", "copy_files", "list_source", "promote"]


@dataclass(frozen=True)
class SourceListing:
    """What `list_source` found under FROM."""

    files: tuple[tuple[str, str], ...] = ()
    """(name relative to FROM, the path to read its bytes from), sorted by name."""
    skipped: tuple[str, ...] = ()
    """Entries left out on purpose, each as `name (why)`."""
    refused: tuple[str, ...] = field(default=())
    """Entries that may not be copied, each as `name (why)`; non-empty means copy nothing."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "named pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def list_source(source: str, skip: Collection[str] = ()) -> SourceListing:
    """The files under the directory `source` that may be copied; entries at its top named in
    `skip` are left out silently (Drydock's own records). Raises what listing raises."""
    fs, path = fsspec.core.url_to_fs(source)
    if not isinstance(fs, LocalFileSystem):
        base = path.rstrip("/")
        files = []
        for found in sorted(fs.find(base)):
            rel = found[len(base) + 1 :]
            if rel and rel.split("/", 1)[0] not in skip:
                files.append((rel, found))
        return SourceListing(files=tuple(files))
    root = os.path.realpath(path)
    files, skipped, refused = [], [], []

    def walk(directory: str, rel_dir: str) -> None:
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{rel_dir}{entry.name}"
                if not rel_dir and entry.name in skip:
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    walk(entry.path, f"{rel}/")
                elif stat.S_ISREG(st.st_mode):
                    files.append((rel, entry.path))
                elif stat.S_ISLNK(st.st_mode):
                    target = os.path.realpath(entry.path)
                    shown = f"{rel} -> {os.readlink(entry.path)}"
                    if not _inside(target, root):
                        refused.append(f"{shown} (a link leaving FROM)")
                    elif not os.path.exists(target):
                        refused.append(f"{shown} (a dangling or looping link)")
                    elif os.path.isdir(target):
                        skipped.append(f"{shown} (a link to a directory inside FROM: copied by its own name)")
                    elif stat.S_ISREG(os.stat(target).st_mode):
                        files.append((rel, target))
                    else:
                        refused.append(f"{shown} (a link to a {_kind(os.stat(target).st_mode)})")
                else:
                    refused.append(f"{rel} (a {_kind(st.st_mode)})")

    walk(root, "")
    return SourceListing(tuple(files), tuple(skipped), tuple(refused))


def copy_files(
    storage: Storage,
    files: Collection[tuple[str, str]],
    source: str,
    directory: str,
    check: Callable[[str], None],
) -> list[str]:
    """Copy `files` ((relative name, path) from `list_source` of `source`) under `directory`,
    each written whole; `check(what)` is called before each file and raises to stop. Returns the
    relative names copied."""
    src_fs = fsspec.core.url_to_fs(source)[0]
    local_src = isinstance(src_fs, LocalFileSystem)
    names = []
    for rel, path in files:
        target = f"{directory.rstrip('/')}/{rel}"
        check(f"copy {rel}")
        if local_src and isinstance(storage.fs, LocalFileSystem):
            # Beside the target, then renamed: whole or not at all, without holding it in memory.
            temporary = f"{os.path.dirname(target)}/{TMP_PREFIX}{os.path.basename(target)}"
            try:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(path, temporary, follow_symlinks=False)
                os.replace(temporary, target)
            except OSError as e:  # a full disk, a file that went away: one clear error
                raise StorageError(f"copy {path!r} to {target!r}: {e.strerror or e}") from e
        elif type(src_fs) is type(storage.fs):
            storage.fs.makedirs(storage.fs._parent(target), exist_ok=True)
            storage._retrying("copy", target, lambda p=path, t=target: storage.fs.cp_file(p, t))
        elif local_src:  # uploaded in parts, committed whole
            storage._retrying("upload", target, lambda p=path, t=target: storage.fs.put_file(p, t))
        else:
            storage.write(target, src_fs.cat_file(path))
        names.append(rel)
    return names


def promote(
    storage: Storage, staging: str, names: Collection[str], directory: str, check: Callable[[str], None]
) -> None:
    """Move the staged files (`names`, relative to `staging`) into `directory`, then remove
    `staging`. On local disk each top-level entry is renamed into place; on object stores each
    file is copied server-side."""
    if isinstance(storage.fs, LocalFileSystem):
        for top in sorted({name.split("/", 1)[0] for name in names}):
            check(f"promote {top}")
            os.replace(f"{staging}/{top}", f"{directory}/{top}")
        os.rmdir(staging)
        return
    for name in sorted(names):
        check(f"promote {name}")
        storage._retrying(
            "copy", name, lambda n=name: storage.fs.cp_file(f"{staging}/{n}", f"{directory}/{n}")
        )
    storage.delete(staging, recursive=True)
