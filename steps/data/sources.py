"""Raw inputs of data steps: where their files are, what identifies them, and what they held.

An input is a path, glob or directory (local ones relative to `input_root`, or a URL), or a
`RawDataset`: a named, versioned dataset with one or more locations (mirrors) of the same files.

**Identity** (`input_identity`) is what a step's identity takes from an input. It never depends
on where the data lives, so that copying raw data to another bucket or region (a failover, a
move to cheaper storage) does not fork every step downstream:

    RawDataset            {"dataset": name, "version": version}; content-addressed datasets
                          add the digest of their listing
    relative local path   as written (it is under `input_root`, which is not versioned)
    absolute local path   relative to `input_root` when under it, else normalized
    URL                   its path inside the bucket: scheme and bucket dropped, so
                          gs://us/raw/web/*.jsonl and s3://eu/raw/web/*.jsonl are one input

**Listing** (`list_inputs`): every file of the inputs with a fingerprint, keyed by a name that does
not depend on the location either. The fingerprint is the size plus a checksum the object store
keeps (GCS `md5Hash`/`crc32c`, S3 `ETag`), or for a local file the sha256 of its content (size and
modification time above `HASH_LIMIT`; hashes are cached per machine by inode, size, modification
and change time, see `_HashCache`). Steps that read raw inputs record their listing when they
run (`step_function(inputs=...)`); each later plan lists again and notes what changed
("input listing changed: 1 file modified"), so a cached step never goes stale silently.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from pipeline import StepDeclarationError
from pipeline.steplib import cache_dir

__all__ = [
    "CHECKSUM_KEYS",
    "DEFAULT_BUDGET",
    "HASH_LIMIT",
    "InputError",
    "RawDataset",
    "current_region",
    "expand_input",
    "file_sha256",
    "input_identity",
    "list_inputs",
    "raw_dataset",
    "raw_listing",
    "read_files",
    "tokenizer_identity",
]

DEFAULT_BUDGET = 2**30
"""The default cross-region budget of a raw dataset: 1 GiB per step. Small on purpose: reading a
pretraining corpus across regions costs egress per byte, so it must be asked for."""

HASH_LIMIT = 256 * 2**20
"""Local files up to this size are fingerprinted by a content hash; larger ones by size and
modification time (hashing a large local corpus on every plan would cost more than it is worth)."""

CHECKSUM_KEYS = ("md5Hash", "crc32c", "ETag", "etag", "md5", "checksum")
"""Checksums an object store keeps per object (fsspec info keys), in order of preference."""
_GLOB_CHARS = "*?["


class InputError(ValueError):
    """An input cannot be found, listed or read."""


@dataclass(frozen=True)
class RawDataset:
    """A named, versioned raw dataset: the same files at one or more locations (mirrors).

    Identity is the name and version, not the locations: the same dataset read from another
    bucket or region keeps every identity downstream. Declare it with `raw_dataset`.
    """

    name: str
    version: str
    urls: tuple[str, ...]
    """Locations of the same files: each a path, glob or directory (local or a URL)."""
    content_digest: str | None = None
    """For a content-addressed dataset: the digest of its listing, taken when declared."""
    regions: tuple[str | None, ...] = ()
    """The region of each location, where declared (`urls` as a mapping); else empty."""
    cross_region_budget: int = DEFAULT_BUDGET
    """The most bytes a step may read from a location in another region than its own."""

    def region_of(self, url: str) -> str | None:
        """The declared region of one of the dataset's locations (None: not declared)."""
        return dict(zip(self.urls, self.regions, strict=False)).get(url)

    def location(self, region: str | None = None) -> str:
        """The location a step in `region` reads from: the one declared in that region, else the
        first (docs/data.md, "Mirrors and a cross-region budget")."""
        for url, where in zip(self.urls, self.regions, strict=False):
            if region is not None and where == region:
                return url
        return self.urls[0]


def current_region() -> str | None:
    """The region this process runs in, as its host declares it: `DRYDOCK_REGION` (set it in each
    node's environment, e.g. before `ray start`, or in a step's `Resources(env=...)`)."""
    return os.environ.get("DRYDOCK_REGION") or None


def raw_dataset(
    name: str,
    *,
    version: str,
    urls: Sequence[str] | Mapping[str, str],
    content_addressed: bool = False,
    cross_region_budget: int = DEFAULT_BUDGET,
    input_root: str | None = None,
) -> RawDataset:
    """Declare a raw dataset by name and version, readable at each of `urls` (mirrors).

    `urls` is a list of locations, or a mapping region -> location; with regions, a step reads the
    location in its own region (`current_region`) and may read at most `cross_region_budget`
    bytes from another region. By default the identity is `name` and `version`: files added or
    changed under the URLs give a drift note on cached steps, not a new identity (bump `version`
    to rerun). With `content_addressed=True` the listing is taken now and its digest joins the
    identity, so any change reruns what reads it (the files must be readable when the experiment
    is planned).
    """
    where = f"raw dataset {name!r}"
    if not name or "/" in name:
        raise StepDeclarationError(None, f"{where}: a dataset name is non-empty and has no '/'", field="name")
    if not version:
        raise StepDeclarationError(None, f"{where}: declare a version", field="version")
    regions: tuple[str | None, ...] = ()
    if isinstance(urls, Mapping):
        regions, urls = tuple(urls), list(urls.values())
    if isinstance(urls, str) or not urls or not all(isinstance(u, str) and u for u in urls):
        raise StepDeclarationError(
            None, f"{where}: declares no URLs; give one or more locations", field="urls"
        )
    if (
        isinstance(cross_region_budget, bool)
        or not isinstance(cross_region_budget, int)
        or cross_region_budget < 0
    ):
        raise StepDeclarationError(
            None, f"{where}: cross_region_budget is a number of bytes >= 0", field="cross_region_budget"
        )
    dataset = RawDataset(name, str(version), tuple(urls), None, regions, cross_region_budget)
    if not content_addressed:
        return dataset
    try:
        listing = {key: _fingerprint(path, info) for path, key, info in expand_input(dataset, input_root)}
        _HASHES.save()
    except InputError as e:
        raise StepDeclarationError(None, f"{where}: content-addressed, but {e}", field="urls") from e
    return dataclasses.replace(dataset, content_digest=listing_digest(listing))


# -- identity ------------------------------------------------------------------------------------


def input_identity(spec: str | RawDataset, root: str | None) -> Any:
    """What a step's identity takes from one input (see the module docstring)."""
    if isinstance(spec, RawDataset):
        out = {"dataset": spec.name, "version": spec.version}
        if spec.content_digest:
            out["content"] = spec.content_digest
        return out
    if "://" in spec and not spec.startswith("file://"):
        return spec.split("://", 1)[1].split("/", 1)[1] if "/" in spec.split("://", 1)[1] else ""
    path = spec.removeprefix("file://")
    if not os.path.isabs(path):
        return posixpath.normpath(path)
    path = os.path.normpath(path)
    if root is not None and "://" not in root:
        base = os.path.normpath(os.path.abspath(root))
        if path == base or path.startswith(base + os.sep):
            return os.path.relpath(path, base)
    return path


def tokenizer_identity(spec: str, root: str | None) -> str:
    """A local tokenizer directory by the hash of its files (so a colleague's checkout elsewhere
    has the same identity); a hub name or URL as written."""
    if "://" in spec:
        return spec
    candidate = spec if os.path.isabs(spec) or root is None else os.path.join(root, spec)
    if not os.path.isdir(candidate):
        return spec
    digest = hashlib.sha256()
    for name in sorted(os.listdir(candidate)):
        path = os.path.join(candidate, name)
        if os.path.isfile(path) and not name.startswith("."):
            digest.update(name.encode() + b"\0")
            digest.update(_sha256_file(path).encode() + b"\0")
    return f"sha256:{digest.hexdigest()[:32]}"


# -- expanding and listing -----------------------------------------------------------------------


def expand_input(
    spec: str | RawDataset,
    root: str | None,
    accept: Callable[[str], bool] | None = None,
    *,
    named: bool = True,
    reading: bool = False,
) -> list[tuple[str, str, dict[str, Any]]]:
    """(path or URL, location-independent key, fsspec info) of every file under one input, in a
    stable order; of a directory's files only those `accept` takes. A key is the input's identity
    (`input_identity`) up to its glob, plus the file's path under it; with `named=False` (an
    upstream step's output, whose path says nothing lasting) only the path under it. A missing
    path, an empty glob or a directory with nothing accepted is an `InputError`; so is a listing
    that cannot be read (naming the input and why)."""
    region = current_region()
    raw = spec.location(region) if isinstance(spec, RawDataset) else spec
    url = raw if ("://" in raw or os.path.isabs(raw) or root is None) else os.path.join(root, raw)
    shown = f"dataset {spec.name!r} at {raw!r}" if isinstance(spec, RawDataset) else repr(raw)
    try:
        fs, path = fsspec.core.url_to_fs(url)
        remote = "://" in url and not url.startswith("file://")
        if any(ch in path for ch in _GLOB_CHARS):
            found = {p: i for p, i in fs.glob(path, detail=True).items() if i.get("type") != "directory"}
            base = path[: min(path.index(ch) for ch in _GLOB_CHARS if ch in path)].rsplit("/", 1)[0]
            if not found:
                raise InputError(f"input {shown} matches no files")
            kind = "glob"
        elif not fs.exists(path):
            raise InputError(f"input {shown} does not exist")
        elif fs.isdir(path):
            found = {p: i for p, i in fs.find(path, detail=True).items() if accept is None or accept(p)}
            base, kind = path.rstrip("/"), "dir"
            if not found:
                raise InputError(f"input directory {shown} holds no files to read")
        else:
            found = {path: fs.info(path)}
            base, kind = (path.rsplit("/", 1)[0] if "/" in path else ""), "file"
    except InputError:
        raise
    except Exception as e:  # a bucket we may not list, a network error, a missing filesystem
        raise InputError(f"input {shown} cannot be listed: {type(e).__name__}: {e}") from e
    if not named:
        prefix = ""
    elif isinstance(spec, RawDataset):
        prefix = spec.name
    else:
        # The input's own identity, up to the part its files are named relative to.
        ident = str(input_identity(spec, root))
        if kind == "glob":
            ident = ident[: min(ident.index(ch) for ch in _GLOB_CHARS if ch in ident)]
        prefix = ident.rstrip("/") if kind == "dir" else (ident.rsplit("/", 1)[0] if "/" in ident else "")
    if reading and isinstance(spec, RawDataset):
        _check_budget(spec, raw, region, sum(int(i.get("size") or 0) for i in found.values()))
    out = []
    for p in sorted(found):
        rel = posixpath.relpath(p, base) if base else p
        key = f"{prefix}/{rel}" if prefix else rel
        out.append((fs.unstrip_protocol(p) if remote else p, key, found[p]))
    return out


def check_local_inputs_exist(groups: Mapping[str, Sequence[Any]], root: str | None) -> None:
    """Each local raw input of `groups` (field -> specs) names files that exist: `ValueError`
    ("field[i]: input ... matches no files") otherwise. Upstream outputs and URLs are left to the
    step (reading storage is its job). For a step rebuilt from a manifest, whose identities were
    recorded rather than computed from the files (a colleague's checkout elsewhere, `--remap`)."""
    if root is not None and "://" in root:
        return
    for field_name, specs in groups.items():
        for i, spec in enumerate(specs):
            if not isinstance(spec, str) or "://" in spec:
                continue  # an upstream step's output (a placeholder), a dataset, a URL
            try:
                expand_input(spec, root)
            except InputError as e:
                under = f" under {root}" if root is not None and not os.path.isabs(spec) else ""
                raise ValueError(f"{field_name}[{i}]: {e}{under}") from None


def _check_budget(dataset: RawDataset, url: str, region: str | None, size: int) -> None:
    """Refuse to read more than the dataset's budget from a location in another region. Known
    only where both regions are: this process's (`current_region`) and the location's."""
    source = dataset.region_of(url)
    if region is None or source is None or source == region or size <= dataset.cross_region_budget:
        return
    raise InputError(
        f"dataset {dataset.name!r}: reading {size:,} bytes from {url} (region {source}) in region "
        f"{region} is over its cross-region budget of {dataset.cross_region_budget:,} bytes; add a "
        f"location in {region} (the mirror step copies one) or raise cross_region_budget"
    )


def list_inputs(
    inputs: Mapping[str, Iterable[str | RawDataset]],
    root: str | None,
    accept: Callable[[str], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """`{"<group>:<key>": fingerprint}` of every file under `inputs` (group -> specs, e.g. train and
    validation). Raises `InputError` for an input that is missing or cannot be listed."""
    out: dict[str, dict[str, Any]] = {}
    for group, specs in inputs.items():
        for spec in specs:
            try:
                found = expand_input(spec, root, accept)
            except InputError as e:
                raise InputError(f"{group} {e}") from e
            for path, key, info in found:
                out[f"{group}:{key}"] = _fingerprint(path, info)
    _HASHES.save()
    return out


def listing_digest(listing: Mapping[str, Mapping[str, Any]]) -> str:
    """A short hash of a listing (what a content-addressed dataset's identity takes)."""
    text = "\n".join(f"{k}\t{sorted(v.items())}" for k, v in sorted(listing.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _fingerprint(path: str, info: Mapping[str, Any]) -> dict[str, Any]:
    size = info.get("size")
    out: dict[str, Any] = {"size": int(size) if size is not None else None}
    for key in CHECKSUM_KEYS:
        value = info.get(key)
        if value:
            out[key.lower()] = str(value).strip('"')
            return out
    if "://" not in path or path.startswith("file://"):
        local = path.removeprefix("file://")
        st = os.stat(local)
        # A pipe or device has no content to hash without consuming it: its mtime stands in.
        if stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT:
            out["sha256"] = _HASHES.sha256(local, st)
        else:
            out["mtime"] = int(st.st_mtime)
    return out


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class _HashCache:
    """The sha256 of local files, remembered by (device, inode, size, modification time, change
    time; both in ns) in `<cache dir>/file-hashes.json`, so that a plan hashes only the local
    inputs that changed since the last plan on this machine. The change time (ctime) is what the
    kernel sets on every write, rename or replacement and no tool can set back: a file deleted
    and made anew with the same size and a restored modification time (as `tar x`, `cp -p` and
    `rsync -a` do), which ext4 often gives the same inode, has a new ctime, so it is hashed
    again. A file written in place within one clock tick of the last hash with the same size and
    both times unchanged would still be taken as unchanged (as git's index does, this costs a
    rehash of nothing). The cache dir is `DRYDOCK_CACHE_DIR`, else
    `$XDG_CACHE_HOME/drydock` (`~/.cache/drydock`); a cache that cannot be read or written is
    simply not used."""

    LIMIT = 50_000  # entries kept; past it the cache starts again (a rehash costs time, not results)

    def __init__(self) -> None:
        self._entries: dict[str, list[Any]] | None = None
        self._dirty = False

    @staticmethod
    def location() -> str:
        return cache_dir("file-hashes.json")

    def sha256(self, path: str, st: os.stat_result) -> str:
        if self._entries is None:
            try:
                with open(self.location()) as f:
                    loaded = json.load(f)
                self._entries = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                self._entries = {}
        key = os.path.abspath(path)
        stamp = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        entry = self._entries.get(key)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stamp:
            return str(entry[1])
        digest = _sha256_file(path)
        if len(self._entries) >= self.LIMIT:
            self._entries = {}
        self._entries[key] = [stamp, digest]
        self._dirty = True
        return digest

    def save(self) -> None:
        if not self._dirty or self._entries is None:
            return
        target = self.location()
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            temporary = f"{target}.{os.getpid()}.tmp"
            with open(temporary, "w") as f:
                json.dump(self._entries, f)
            os.replace(temporary, target)  # concurrent plans: the last one's cache wins
            self._dirty = False
        except OSError:
            pass


_HASHES = _HashCache()


def file_sha256(path: str) -> str:
    """The sha256 of the local file `path`, through this machine's hash cache (`_HashCache`)."""
    digest = _HASHES.sha256(path, os.stat(path))
    _HASHES.save()
    return digest


# -- for steps that read raw inputs ---------------------------------------------------------------
# Their configs hold the inputs as given (`specs`: locations, not versioned) and, per group of
# inputs, what identity took from each (`input_identity[group]`, None for an upstream output).


def _identities(specs: Sequence[Any], identities: Sequence[Any] | None) -> Sequence[Any]:
    # A config built by hand, without identities: every input is raw.
    return identities if identities else [""] * len(specs)


def raw_listing(
    groups: Mapping[str, tuple[Sequence[Any], Sequence[Any] | None]],
    root: str | None,
    accept: Callable[[str], bool] | None = None,
) -> dict[str, dict[str, Any]]:
    """The listing of a step's raw inputs (group -> (specs, identities)) for `step_function(inputs=
    ...)`: upstream steps' outputs are left out, their identities say what they hold."""
    raw = {
        group: [
            s for s, ident in zip(specs, _identities(specs, identities), strict=True) if ident is not None
        ]
        for group, (specs, identities) in groups.items()
    }
    return list_inputs(raw, root, accept)


def read_files(
    specs: Sequence[Any],
    identities: Sequence[Any] | None,
    root: str | None,
    accept: Callable[[str], bool],
    what: str,
    kind: str = "a jsonl or parquet file (optionally .gz or .zst)",
) -> list[tuple[str, str, str]]:
    """(path, key, source) of every file a step reads from `specs`, in order, within the datasets'
    cross-region budgets. `source` names the input (a dataset's name, a path as declared) for
    per-source stats; `key` is the file's location-independent name (relative to an upstream
    output). A file `accept` refuses (matched by a glob or named directly) is an `InputError`
    saying it is not `kind`."""
    out = []
    for spec, identity in zip(specs, _identities(specs, identities), strict=True):
        source = spec.name if isinstance(spec, RawDataset) else str(spec if identity is None else identity)
        try:
            found = expand_input(spec, root, accept=accept, named=identity is not None, reading=True)
        except InputError as e:
            raise InputError(f"{what}: {e}") from e
        for path, key, _info in found:
            if not accept(path):
                raise InputError(f"{what} file {path!r}: not {kind}")
            out.append((path, key, source))
    return out
