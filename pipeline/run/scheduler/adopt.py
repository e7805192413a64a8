"""Adopting an existing directory as the committed output of a step (`drydock adopt`).

Data tokenized, or a model trained, before a team used Drydock (or by hand) becomes the output of
the step that would have made it, under that step's identity, so that the steps downstream build
on it without recomputing it. Adoption goes through the commit protocol like a run:

  - it lists FROM first and refuses what may not be copied (links leaving FROM, dangling links,
    named pipes, sockets, devices: `pipeline.storage.copying`), before it takes anything;
  - it takes the step's lease and heartbeats it like a run, and its writes are fenced like a
    run's (`pipeline.run.in_step.fence`): the moment the lease may be lost, it stops writing;
  - it copies FROM's files (Drydock's own records in it, if any, are left behind) into a staging
    directory inside the step directory that is not payload, so a copy that does not commit
    leaves nothing a later run could mistake for output, and removes it then;
  - it promotes the staged files into place (replacing whatever a failed attempt left), writes
    `.step.json` with an `adopted` record (from where, by whom, when), commits SUCCESS carrying
    the same record and the digests a cached plan compares, and pins the directory, so that
    `drydock gc` never deletes what may exist nowhere else.

A later plan finds the step CACHED; `drydock explain` says it was adopted.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import platform
import time
from collections.abc import Callable
from typing import Any

import fsspec

from pipeline.core.dag import Dag
from pipeline.core.drift import listing_digest
from pipeline.core.lease import Owner
from pipeline.errors import StepCancelled, StepDeclarationError
from pipeline.run.in_step.fence import Fence, fenced_thread
from pipeline.run.records.provenance import drift_digest_of, input_listing, step_info
from pipeline.run.scheduler.heartbeat import Heartbeat
from pipeline.storage.copying import SourceListing, copy_files, list_source, promote
from pipeline.storage.layout import LOGS_DIR, PINNED, STEP_DIR_MARKERS, TMP_PREFIX
from pipeline.storage.step_store import Acquired, Held, StepStore

__all__ = ["adopt"]

logger = logging.getLogger(__name__)
_DRYDOCK_FILES = frozenset({*STEP_DIR_MARKERS, LOGS_DIR, PINNED})
"""Entries at the top of an adopted directory that are not copied: Drydock's own records."""


def adopt(
    dag: Dag,
    store: StepStore,
    label: str,
    source: str,
    owner: Owner,
    *,
    lease_timeout: float = 90.0,
    heartbeat_interval: float = 30.0,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Commit the files under `source` as the output of step `label`; returns the `adopted`
    record. A missing or empty `source`, one holding entries that may not be copied, or a step
    already committed or running, is a `StepDeclarationError` naming the step, and nothing is
    written. The lease is heartbeated every `heartbeat_interval` seconds and counts as lost
    `lease_timeout` seconds after its last renewal (the run options of the same names)."""
    node = dag.nodes[label]
    step_dir = node.output_path
    listing = _check_source(node.name, source)
    record = store.record(step_dir, with_metadata=False)
    if record.succeeded:
        raise StepDeclarationError(
            node.name, f"{label} is already committed at {step_dir}; nothing adopted", field="STEP"
        )
    asked = clock()
    acquired = store.acquire(step_dir, owner, lease_timeout)
    if isinstance(acquired, Held):
        raise StepDeclarationError(
            node.name, f"{label} is running in {acquired.lease.describe()}", field="STEP"
        )
    if not isinstance(acquired, Acquired):
        raise StepDeclarationError(
            node.name, f"{label} was committed meanwhile; nothing adopted", field="STEP"
        )
    token = acquired.token
    heartbeat = Heartbeat(
        store, owner, lease_timeout, heartbeat_interval, on_lost=lambda _: None, clock=clock
    )
    heartbeat.add(step_dir, label, token, since=asked)
    heartbeat.start()
    fence = Fence(lambda: heartbeat.valid_until(step_dir) - clock(), label)
    staging = f"{step_dir}/{TMP_PREFIX}adopt-{token}"
    committed = promoting = False
    try:
        started = clock()
        with fenced_thread(fence):
            copied = copy_files(store.storage, listing.files, source, staging, fence.check)
            fence.check("replace the output a failed attempt left")
            # Marked first: if this process stops while files are moving in, the next holder of
            # the lease knows they are not a run's output and removes them (docs/reliability.md).
            store.begin_adoption(step_dir)
            promoting = True
            store.clear_payload(step_dir)
            promote(store.storage, staging, copied, step_dir, fence.check)
            adopted = {
                "from": source,
                "by": f"{getpass.getuser()}@{platform.node()}",
                "at": started,
                "files": len(copied),
                **({"skipped": list(listing.skipped)} if listing.skipped else {}),
            }
            info = step_info(dag, label)
            info.update(adopted=adopted, run_id=owner.run_id, attempt=1, token=token, started=started)
            data: dict[str, Any] = {"adopted": adopted, "drift": drift_digest_of(dag, label)}
            # What the adopted output is declared to be made of, as a run would record it; if the
            # inputs cannot be listed here, later plans say the listing was not recorded.
            with contextlib.suppress(Exception):  # adoption does not need the raw inputs
                inputs = input_listing(dag, label)
                if inputs is not None:
                    info["inputs"], data["inputs"] = inputs, listing_digest(inputs)
            fence.check("write .step.json")
            data["step_json"] = store.write_step_json(step_dir, info)
        # The commit is conditional on the fencing token: it needs no fence.
        committed = store.commit(step_dir, owner, token, data=data)
        if not committed:
            raise StepDeclarationError(node.name, f"{label}: lease lost while adopting; nothing committed")
        note = {"pinned_at": adopted["at"], "by": adopted["by"], "reason": f"adopted from {source}"}
        store.storage.write(f"{step_dir}/{PINNED}", json.dumps(note).encode())
        store.end_adoption(step_dir)
        return adopted
    except StepCancelled as e:  # the fence refused a write: the lease may be another's now
        raise StepDeclarationError(
            node.name, f"{label}: lease lost while adopting ({e}); nothing committed", field="STEP"
        ) from e
    finally:
        heartbeat.stop()
        if not committed:
            # Our own staging directory (named by our token): no other runner writes there.
            try:
                store.storage.delete(staging, recursive=True)
                if promoting and fence.remaining() > 0:  # still ours: take back what we moved in
                    store.clear_interrupted_adoption(step_dir)
            except Exception as e:  # gc removes a left-over staging directory; the next attempt
                logger.warning("could not clean up %s: %s", staging, e)  # the moved-in files
            store.release(step_dir, owner, token)


def _check_source(step: str, source: str) -> SourceListing:
    """What to copy from `source`, or one clear error: it is not a directory, it has no files to
    adopt (besides Drydock's own), or it holds entries that may not be copied."""
    try:
        fs, path = fsspec.core.url_to_fs(source)
        if not fs.isdir(path):
            what = "is a file, not a directory" if fs.exists(path) else "does not exist"
            raise StepDeclarationError(step, f"{source} {what}", field="from")
        listing = list_source(source, skip=_DRYDOCK_FILES)
    except StepDeclarationError:
        raise
    except Exception as e:  # a bucket we may not list, an unknown protocol, a permission
        raise StepDeclarationError(
            step, f"{source} cannot be listed: {type(e).__name__}: {e}", field="from"
        ) from e
    if listing.refused:
        shown = "; ".join(listing.refused[:5])
        more = f"; and {len(listing.refused) - 5} more" if len(listing.refused) > 5 else ""
        raise StepDeclarationError(
            step,
            f"{source} holds entries adopt does not copy: {shown}{more}. Nothing adopted: copy "
            "FROM without them (or with the files in place of the links)",
            field="from",
        )
    if not listing.files:
        raise StepDeclarationError(step, f"{source} is empty: there is nothing to adopt", field="from")
    return listing
