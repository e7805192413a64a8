"""Garbage collection of step outputs (`drydock gc`) and pins that protect them (`drydock pin`).

`plan_gc` walks the prefix for step directories (`<name>-<12 hex>` holding a `.status`,
`.step.json` or `.lease`) and sorts each into *keep* (with the reason) or *delete*. A step is
kept when any kept manifest lists it, when it is pinned (a `.pinned` marker, which never enters
identity), when its last state is RUNNING, when another runner holds a live lease on it, or,
with `older_than`, when its last status event is more recent than that. By default every
manifest under `<prefix>/experiments/` is kept, so only outputs no run manifest mentions go.
Leftover `.tmp-*` files of interrupted writes inside idle step directories are listed too.

`delete_planned` re-reads every directory just before removing it and skips any that started
running, got leased or got pinned since the plan was made. Nothing else here deletes.
"""

from __future__ import annotations

import getpass
import json
import platform
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.core.lease import CLOCK_SKEW, is_stale
from pipeline.core.records import Event
from pipeline.errors import StepDeclarationError, StorageError
from pipeline.processes import pid_alive, runner_alive
from pipeline.storage.files import Storage
from pipeline.storage.layout import (
    MANIFEST_DIR,
    PINNED,
    STEP_DIR_MARKERS,
    manifest_pattern,
    split_label,
)
from pipeline.storage.prefix_walk import find_step_dirs
from pipeline.storage.step_store import StepStore

__all__ = [
    "GcPlan",
    "StepDir",
    "delete_planned",
    "kept_labels",
    "parse_age",
    "pin",
    "plan_gc",
    "resolve_step_dir",
]


@dataclass(frozen=True)
class StepDir:
    """A step directory found under the prefix, and why it stays or goes."""

    path: str
    label: str
    """Relative to the prefix: `train/tiny-0a1b2c3d4e5f`."""
    state: str | None
    last_time: float | None
    size: int
    keep_reason: str = ""
    """Empty: to be deleted."""
    orphans: tuple[str, ...] = ()
    """`.tmp-*` leftovers inside it, at any depth (the step library writes in subdirectories)."""


@dataclass(frozen=True)
class GcPlan:
    """What `drydock gc` would do."""

    prefix: str
    manifests: tuple[str, ...]
    """The manifests whose steps are kept."""
    keep: tuple[StepDir, ...] = field(default=())
    delete: tuple[StepDir, ...] = field(default=())

    @property
    def orphans(self) -> list[str]:
        """`.tmp-*` leftovers in kept directories that no runner is using (deleted with the rest)."""
        return [o for d in self.keep if not _busy(d.keep_reason) for o in d.orphans]


def _busy(reason: str) -> bool:
    return reason == Event.RUNNING or reason.startswith("leased")


def parse_age(text: str) -> float:
    """Seconds in `30d`, `12h`, `45m`, `90s` or `2w`; a malformed age is a StepDeclarationError."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not match:
        raise StepDeclarationError(
            None,
            f"cannot read the age {text!r}; write a number and a unit: 90s, 45m, 12h, 30d, 2w",
            field="--older-than",
        )
    return float(match[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}[match[2]]


def _manifest_locations(storage: Storage, prefix: str, keep: str) -> list[str]:
    """The manifests `keep` names: a path or URL, a file name under `<prefix>/experiments/`, or
    an experiment name (every `<name>-<hash>.json` of it)."""
    candidates = [keep]
    relative = "://" not in keep and not keep.startswith("/")
    if relative:
        base = f"{prefix}/{MANIFEST_DIR}/{keep}"
        candidates += [base, f"{base}.json"]
    for path in candidates:
        if storage.read(path) is not None:
            return [path]
    if relative:
        pattern = manifest_pattern(keep)
        directory = f"{prefix}/{MANIFEST_DIR}"
        found = sorted(f"{directory}/{n}" for n in storage.listdir(directory) if pattern.match(n))
        if found:
            return found
    raise StepDeclarationError(
        None,
        f"manifest {keep!r} not found (as a path, or a file or experiment name in {prefix}/{MANIFEST_DIR}/)",
        field="--keep",
    )


def kept_labels(storage: Storage, prefix: str, keep: Sequence[str] | None) -> tuple[list[str], set[str]]:
    """(kept manifest paths, labels of the steps they list). No `keep`: every manifest of the prefix."""
    if keep:
        paths = list(dict.fromkeys(p for k in keep for p in _manifest_locations(storage, prefix, k)))
    else:
        directory = f"{prefix}/{MANIFEST_DIR}"
        paths = [f"{directory}/{n}" for n in sorted(storage.listdir(directory)) if n.endswith(".json")]
    labels: set[str] = set()
    for path in paths:
        raw = storage.read(path)
        try:
            manifest = json.loads(raw or b"")
            steps = manifest["steps"]
            labels.update(str(step["label"]) for step in steps)
        except (ValueError, KeyError, TypeError) as e:
            # A manifest that cannot be read protects nothing we can name: refuse rather than guess.
            raise StorageError(
                f"manifest {path} is unreadable ({e}); fix or remove it before collecting garbage"
            ) from e
    return paths, labels


def running_labels(storage: Storage, prefix: str, local_host: str) -> dict[str, str]:
    """Steps of the runs under `prefix` that have not finished and whose runner may be alive, with
    why they are kept: such a run still needs its finished upstreams, which hold no lease.

    A runner on this host is alive if its process is; one on another host is taken to be (its
    manifest is finished by a rerun of the experiment, or by the run itself).
    """
    directory = f"{prefix}/{MANIFEST_DIR}"
    out: dict[str, str] = {}
    for name in sorted(storage.listdir(directory)):
        if not name.endswith(".json"):
            continue
        try:
            manifest = json.loads(storage.read(f"{directory}/{name}") or b"")
            if manifest.get("finished", True):
                continue
            if runner_alive(manifest.get("runner"), local_host) is False:
                continue  # killed on this machine: nothing runs for it any more
            why = f"needed by run {manifest.get('run_id')} of {name} (not finished)"
            for step in manifest["steps"]:
                out.setdefault(str(step["label"]), why)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue  # an unreadable manifest is kept_labels' to refuse
    return out


def _inspect(
    store: StepStore, path: str, now: float, local_host: str
) -> tuple[str, str | None, float | None]:
    """(reason to keep or "", last state, last event time) of one step directory, read now."""
    record = store.record(path, with_metadata=False)
    names = set(store.storage.listdir(path))
    state = "CORRUPT" if record.corrupt else record.state
    last = record.last
    when = last.time if last else None
    if PINNED in names:
        return "pinned", state, when
    if state == Event.RUNNING:
        return "RUNNING", state, when
    lease = record.lease if record.lease is not None else store.lease(path)
    # With the clock-skew allowance a run uses before taking a lease over: a lease that looks
    # expired by a few seconds may be a live runner's whose clock is behind ours.
    if lease is not None and not is_stale(lease, now, local_host, pid_alive, skew=CLOCK_SKEW):
        return f"leased by {lease.describe()}", state, when
    return "", state, when


def plan_gc(
    storage: Storage,
    prefix: str,
    *,
    keep: Sequence[str] | None,
    older_than: float | None,
    now: float,
    local_host: str,
) -> GcPlan:
    """Sort every step directory under `prefix` into keep (with a reason) and delete. Reads only."""
    prefix = prefix.rstrip("/")
    manifests, labels = kept_labels(storage, prefix, keep)
    running = running_labels(storage, prefix, local_host)
    store = StepStore(storage)
    kept: list[StepDir] = []
    doomed: list[StepDir] = []
    for path in find_step_dirs(storage, prefix):
        label = path[len(prefix) + 1 :]
        reason, state, when = _inspect(store, path, now, local_host)
        if not reason and label in labels:
            reason = "in a kept manifest"
        if not reason and label in running:
            reason = running[label]
        if not reason and older_than is not None and when is not None and now - when < older_than:
            reason = "too recent"
        orphans = tuple(storage.temporary_entries(path))
        size = storage.disk_usage(path)
        entry = StepDir(path, label, state, when, size, reason, orphans)
        (kept if reason else doomed).append(entry)
    return GcPlan(prefix, tuple(manifests), tuple(kept), tuple(doomed))


def delete_planned(
    storage: Storage, plan: GcPlan, *, now: float, local_host: str
) -> tuple[list[StepDir], list[tuple[StepDir, str]]]:
    """Delete the planned step directories and orphan files. Returns (deleted, skipped with why).

    Each directory is inspected again right before it goes: one that a runner started or leased,
    or that someone pinned, since `plan` was made is skipped.
    """
    store = StepStore(storage)
    deleted: list[StepDir] = []
    skipped: list[tuple[StepDir, str]] = []
    for entry in plan.delete:
        reason, _state, _when = _inspect(store, entry.path, now, local_host)
        if reason:
            skipped.append((entry, f"{reason} now"))
            continue
        try:
            storage.delete(entry.path, recursive=True)
        except StorageError as e:  # e.g. it leads out of the prefix through a symbolic link
            skipped.append((entry, str(e)))
            continue
        deleted.append(entry)
    for entry in plan.keep:
        if not entry.orphans or _busy(entry.keep_reason):
            continue
        reason, _state, _when = _inspect(store, entry.path, now, local_host)
        if not _busy(reason):  # nobody is writing there: the .tmp-* files are leftovers
            for orphan in entry.orphans:
                storage.delete(orphan, recursive=True)  # a staging directory too
    return deleted, skipped


def resolve_step_dir(storage: Storage, prefix: str | None, target: str) -> str:
    """The step directory `target` names: a path or URL, a label under `prefix`, or a step name
    with exactly one directory under `prefix`."""
    candidates = [target.rstrip("/")]
    if prefix and "://" not in target and not target.startswith("/"):
        candidates.append(f"{prefix.rstrip('/')}/{target.strip('/')}")
    for path in candidates:
        if STEP_DIR_MARKERS & set(storage.listdir(path)):
            return path
    if prefix and "://" not in target and not target.startswith("/"):
        name = target.strip("/")
        head, _, base = name.rpartition("/")
        parent = f"{prefix.rstrip('/')}/{head}" if head else prefix.rstrip("/")
        matches = sorted(e for e in storage.listdir(parent) if (split_label(e) or ("", ""))[0] == base)
        if len(matches) == 1:
            return f"{parent}/{matches[0]}"
        if len(matches) > 1:
            raise StepDeclarationError(
                name,
                f"{len(matches)} runs of this step under {prefix}: "
                + ", ".join(f"{head + '/' if head else ''}{m}" for m in matches)
                + "; name one by its label",
                field="PATH|LABEL",
            )
    raise StepDeclarationError(
        None, f"{target!r} is not a step directory (no .status or .step.json there)", field="PATH|LABEL"
    )


def pin(storage: Storage, step_dir: str, *, unpin: bool = False, now: float) -> bool:
    """Write (or with `unpin`, remove) the `.pinned` marker; returns whether it was there before."""
    marker = f"{step_dir.rstrip('/')}/{PINNED}"
    existed = storage.read(marker) is not None
    if unpin:
        storage.delete(marker)
    else:
        note = {"pinned_at": now, "by": f"{getpass.getuser()}@{platform.node()}"}
        storage.write(marker, json.dumps(note).encode())
    return existed
