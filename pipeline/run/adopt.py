"""Adopting an existing directory as the committed output of a step (`drydock adopt`).

Data tokenized, or a model trained, before a team used Drydock (or by hand) becomes the output of
the step that would have made it, under that step's identity, so that the steps downstream build
on it without recomputing it. Adoption goes through the commit protocol like a run: it takes the
step's lease, copies the directory's files into the step directory (Drydock's own files in it,
if any, are left behind), writes `.step.json` with an `adopted` record (from where, by whom,
when), commits SUCCESS carrying the same record and the digests a cached plan compares, and pins
the directory, so that `drydock gc` never deletes what may exist nowhere else. A later plan finds
the step CACHED; `drydock explain` says it was adopted.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import platform
import time
from typing import Any

import fsspec

from pipeline.core.dag import Dag
from pipeline.core.drift import listing_digest
from pipeline.core.lease import Owner
from pipeline.errors import StepDeclarationError
from pipeline.run.provenance import drift_digest_of, input_listing, step_info
from pipeline.storage.layout import LOGS_DIR, PINNED, STEP_DIR_MARKERS
from pipeline.storage.step_store import Acquired, Held, StepStore

__all__ = ["adopt"]

_LEASE_SECONDS = 3600.0  # a copy of a large directory into an object store can take a while
_DRYDOCK_FILES = frozenset({*STEP_DIR_MARKERS, LOGS_DIR, PINNED})
"""Entries at the top of an adopted directory that are not copied: Drydock's own records."""


def adopt(dag: Dag, store: StepStore, label: str, source: str, owner: Owner) -> dict[str, Any]:
    """Commit the files under `source` as the output of step `label`; returns the `adopted`
    record. A missing or empty `source`, or a step already committed or running, is a
    `StepDeclarationError` naming the step, and nothing is written."""
    node = dag.nodes[label]
    step_dir = node.output_path
    _check_source(node.name, source)
    record = store.record(step_dir, with_metadata=False)
    if record.succeeded:
        raise StepDeclarationError(
            node.name, f"{label} is already committed at {step_dir}; nothing adopted", field="STEP"
        )
    acquired = store.acquire(step_dir, owner, _LEASE_SECONDS)
    if isinstance(acquired, Held):
        raise StepDeclarationError(
            node.name, f"{label} is running in {acquired.lease.describe()}", field="STEP"
        )
    if not isinstance(acquired, Acquired):
        raise StepDeclarationError(
            node.name, f"{label} was committed meanwhile; nothing adopted", field="STEP"
        )
    token = acquired.token
    committed = False
    try:
        started = time.time()
        copied = store.storage.copy_in(source, step_dir, skip=_DRYDOCK_FILES)
        adopted = {
            "from": source,
            "by": f"{getpass.getuser()}@{platform.node()}",
            "at": started,
            "files": len(copied),
        }
        info = step_info(dag, label)
        info.update(adopted=adopted, run_id=owner.run_id, attempt=1, token=token, started=started)
        data: dict[str, Any] = {"adopted": adopted, "drift": drift_digest_of(dag, label)}
        # What the adopted output is declared to be made of, as a run would record it; if the
        # inputs cannot be listed here, later plans say the listing was not recorded.
        with contextlib.suppress(Exception):  # adoption does not need the raw inputs
            listing = input_listing(dag, label)
            if listing is not None:
                info["inputs"], data["inputs"] = listing, listing_digest(listing)
        data["step_json"] = store.write_step_json(step_dir, info)
        committed = store.commit(step_dir, owner, token, data=data)
        if not committed:
            raise StepDeclarationError(node.name, f"{label}: lease lost while adopting; nothing committed")
        note = {"pinned_at": adopted["at"], "by": adopted["by"], "reason": f"adopted from {source}"}
        store.storage.write(f"{step_dir}/{PINNED}", json.dumps(note).encode())
        return adopted
    finally:
        if not committed:
            store.release(step_dir, owner, token)


def _check_source(step: str, source: str) -> None:
    """One clear error unless `source` is a directory with files to adopt (besides Drydock's own)."""
    try:
        fs, path = fsspec.core.url_to_fs(source)
        if not fs.isdir(path):
            what = "is a file, not a directory" if fs.exists(path) else "does not exist"
            raise StepDeclarationError(step, f"{source} {what}", field="from")
        base = path.rstrip("/")
        files = [p for p in fs.find(path) if p[len(base) + 1 :].split("/", 1)[0] not in _DRYDOCK_FILES]
    except StepDeclarationError:
        raise
    except Exception as e:  # a bucket we may not list, an unknown protocol
        raise StepDeclarationError(
            step, f"{source} cannot be listed: {type(e).__name__}: {e}", field="from"
        ) from e
    if not files:
        raise StepDeclarationError(step, f"{source} is empty: there is nothing to adopt", field="from")
