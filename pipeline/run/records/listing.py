"""Input listings of cached steps: what changed in the files outside the prefix they read.

A step function that reads raw data declares `step_function(inputs=...)`: a listing of those
files, each by a location-independent name with a fingerprint. The executor records the listing
in `.step.json` when the step starts and its digest with SUCCESS. Planning lists the inputs of
every cached step with such a hook again: an equal digest says nothing changed (no read of
`.step.json`); else the recorded listing is diffed (`pipeline.core.drift.listing_drift`) and the
plan notes what changed on the cached step ("input listing changed: 1 file modified"). The step
stays cached: its identity is what decides (a versioned dataset, a content-addressed one reruns).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pipeline.core.dag import Dag
from pipeline.core.drift import listing_digest, listing_drift
from pipeline.core.records import StepRecord
from pipeline.run.records.provenance import input_listing
from pipeline.step import hooks_of
from pipeline.storage.step_store import StepStore

__all__ = ["input_notes"]


def input_notes(dag: Dag, store: StepStore, snapshot: dict[str, StepRecord]) -> dict[str, list[str]]:
    """Label -> notes on how the inputs of each cached step changed since it ran (only labels with
    something to say). Lists inputs (I/O outside the prefix); a listing that fails is a note too:
    the step is cached, so a plan never fails on it."""
    notes: dict[str, list[str]] = {}
    for label, node in dag.nodes.items():
        record = snapshot.get(node.output_path)
        if hooks_of(node.step.fn).inputs is None or record is None or not record.succeeded:
            continue
        recorded = record.last.data if record.last is not None else {}
        digest = recorded.get("inputs") if isinstance(recorded, Mapping) else None
        try:
            current = input_listing(dag, label) or {}
        except Exception as e:  # shown on the cached step, never raised
            notes[label] = [f"input listing cannot be read now: {e}"]
            continue
        if digest is not None and digest == listing_digest(current):
            continue
        step_json = record.step_json
        if step_json is None:
            step_json = store.read_step_json(node.output_path)
            snapshot[node.output_path] = replace(record, step_json=step_json)
        old = step_json.get("inputs") if isinstance(step_json, Mapping) and digest is not None else None
        found = listing_drift(old, current)
        if found:
            notes[label] = found
    return notes
