"""The content of a run manifest: every step with its identity, path, state, timings and recipe.

Built from the plan (when a run starts: states as planned) and again from the run report (when
it ends), from one `ManifestBuilder` per run, so the per-step entries that do not change (names,
paths, deps, recipes) are computed once. It also holds the git commit and package versions of
the run. Each step carries its `recipe` (`pipeline.run.records.recipe`): function, config, version and
resources in a reversible form, so that `drydock rerun MANIFEST` rebuilds the same DAG without
the experiment file. Where it is stored: `pipeline.storage.manifests`.

A run that runs nothing (every step cached) writes steps that depend only on the plan, so its
manifest records a digest of everything they were encoded from (`steps_digest`): the next such
run, finding the same digest in the manifest it replaces, copies that manifest's steps instead of
encoding 10,000 recipes again (the largest part of a cached rerun, measured in
`benchmarks/engine.py`). The first such run after a run that ran steps cannot copy whole lines
(their states and timings differ), but their recipes are what it would encode: every finished
manifest records a digest of what the recipes were encoded from (`recipes_digest`, the same parts
as `steps_digest` without the plan), and a run finding its own copies each step's recipe.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pipeline.core.dag import fn_import_path
from pipeline.core.plan import Plan
from pipeline.core.report import RunReport
from pipeline.run.records import recipe as recipe_module
from pipeline.run.records import recipe_codec
from pipeline.run.records.provenance import drift_digest_of
from pipeline.run.records.recipe import iter_recipes
from pipeline.step import Resources
from pipeline.storage import manifests
from pipeline.storage.manifests import encode_lines, encoded_head, steps_checksum, with_head

__all__ = ["CHECKSUM", "ManifestBuilder"]

CHECKSUM = "steps_crc32"
"""The head field of a finished manifest (one with a `recipes_digest`): the CRC-32 of its steps as
written, so that only bytes no one edited are copied."""


class ManifestBuilder:
    """Builds the manifest of one run, written at its start (`encode()`) and its end
    (`encode(report, last=True)`). Each step's unchanging part (name, paths, deps, recipe) is
    encoded to JSON once: kept as text between the two writes, or, for a run that writes only
    the last one (a cached rerun), made while that one is written and never kept."""

    def __init__(
        self,
        plan: Plan,
        experiment: str,
        description: str,
        run_id: str,
        env: Mapping[str, Any],
        *,
        started: float | None = None,
        source_file: str | None = None,
        recipes: Mapping[str, Any] | None = None,
        runner: Mapping[str, Any] | None = None,
        drift: Mapping[str, str] | None = None,
    ) -> None:
        dag = plan.dag
        self._plan, self._source_file, self._recipes = plan, source_file, recipes
        self._drift = drift
        """Known drift digests by label (`pipeline.run.experiment.unchanged_steps`); with them, a
        run that runs nothing records its `steps_digest`."""
        self._labels = [(label, plan.steps[label].state.value) for label in dag.nodes]
        """(label, planned state) per step, in order."""
        self._static: list[bytes] | None = None
        """Each step's unchanging fields as a JSON object without its closing brace, once made."""
        self._head = {
            "experiment": experiment,
            "description": description,
            "prefix": dag.prefix,
            "run_id": run_id,
            "started": started,
            # Who runs it: gc keeps the steps of an unfinished run whose runner may be alive.
            **({"runner": dict(runner)} if runner else {}),
        }
        self._tail = {
            "roots": list(dag.roots),
            "source_file": os.path.abspath(source_file) if source_file else None,
            **env,
        }

    def encode(
        self,
        report: RunReport | None = None,
        *,
        last: bool = False,
        previous: Callable[[], bytes | None] | None = None,
    ) -> bytes:
        """The manifest as JSON bytes, one step per line (`pipeline.storage.manifests.encode_lines`);
        without `report`, states are the planned ones. `last`: no later `encode` follows, so the
        steps' unchanging parts need not be kept. `previous`: reads the manifest this one
        replaces, whose steps are copied when they are what this one would encode (see the
        module's doc); a function, so that bytes not copied are freed before encoding."""
        head = {
            **self._head,
            "updated": time.time(),
            "finished": report is not None,
            "exit_code": report.exit_code if report is not None else None,
        }
        # The manifest a run starts with is replaced when it ends: it needs no digest.
        recipes_digest, digest = (None, None) if report is None else self._digests(plan=_ran_nothing(report))
        copied: list[tuple[str, str]] | None = None
        if recipes_digest is not None:
            head["recipes_digest"] = recipes_digest
        if digest is not None:
            head["steps_digest"] = digest
            before = previous() if previous is not None else None
            checksum = _copyable(before, digest) if before is not None else None
            if before is not None and checksum is not None:
                return with_head({**head, CHECKSUM: checksum, **self._tail}, before)
            if before is not None and recipes_digest is not None and self._static is None:
                copied = _copied_lines(before, recipes_digest, len(self._labels))
            del before  # 10 MB for 10,000 steps: not kept while the steps are encoded
        if self._static is None and not last:
            self._static = list(self._statics())
        statics = self._static if self._static is not None else self._statics(copied)
        lines = (
            (static, b", ", json.dumps(_outcome(label, planned, report), default=str)[1:].encode())
            for static, (label, planned) in zip(statics, self._labels, strict=True)
        )
        checksum_field = CHECKSUM if recipes_digest is not None else None
        return encode_lines({**head, **self._tail}, lines, checksum=checksum_field)

    def _digests(self, *, plan: bool) -> tuple[str | None, str | None]:
        """Digests of everything the steps are encoded from: (`recipes_digest`, everything but
        the plan: a run's steps and the cached rerun after it share all but their plan and
        outcome; `steps_digest`, with the plan, when `plan`), or (None, None) where a step's
        drift digest is not known (the caller gave none).

        Per step: label, identity (name, version, versioned values, inputs), drift digest (its
        config as plain JSON, with every field, versioned or not, upstream labels, and its code),
        function, description, resources, how its inputs are referenced (by object or name,
        blocking or not, in identity or not), and the types its plain form does not name
        (`ConfigRefs.kinds`), then its plan; for all steps: the prefix (output paths are under
        it), the experiment file, and the source of the code that encodes them."""
        if self._drift is None:
            return None, None
        steps, dag = self._plan.steps, self._plan.dag
        common = [_encoder_fingerprint(), self._tail["source_file"] or "", dag.prefix]
        parts: list[str] = []
        planned: list[str] = []
        fn_paths: dict[int, str] = {}  # most steps share a function
        drift = self._drift
        for label, node in dag.nodes.items():
            step = node.step
            fn = fn_paths.get(id(step.fn)) or fn_paths.setdefault(id(step.fn), fn_import_path(step.fn))
            resources = step.resources
            # How each input is referenced; what it points at is in the identity and drift text.
            inputs = "".join(
                "NB"[type(p.step) is str] + "SB"[p.blocking] + "XI"[p.identity]
                for p in node.refs.inputs.values()
            )
            parts.append(
                f"{label}\t{node.identity.hash}\t{drift.get(label) or drift_digest_of(dag, label)}\t"
                f"{fn}\t{step.description!r}\t"
                f"{'' if resources == _DEFAULT_RESOURCES else repr(resources)}\t{inputs}\t"
                f"{_kinds_text(node.refs.kinds)}"
            )
            if plan:
                sp = steps[label]
                planned.append(f"{sp.state.value}\t{sp.reason!r}")
        recipes = _sha256("\n".join(["recipes", *common, *parts]))
        if not plan:
            return recipes, None
        return recipes, _sha256("\n".join(["steps", *common, *parts, *planned]))

    def _statics(self, copied: list[tuple[str, str]] | None = None) -> Iterator[bytes]:
        """Each step's unchanging fields, its recipe encoded as it comes (the recipes of a large
        DAG never all exist as objects at once), or taken from `copied`: each step's fields
        before its plan and its recipe, as JSON text cut from the manifest of the run before,
        in the order of the steps (`_copied_lines`)."""
        plan, dag = self._plan, self._plan.dag
        if copied is not None:
            for label, (before, recipe) in zip(dag.nodes, copied, strict=True):
                sp = plan.steps[label]
                planned = f'{_PLANNED_KEY}"{sp.state.value}", "reason": {json.dumps(sp.reason)}'
                yield "".join((before, planned, _RECIPE_KEY, recipe)).encode()
            return
        if self._recipes is None:
            entries = iter_recipes(dag, self._source_file)
        else:
            entries = ((label, self._recipes[label]) for label in dag.nodes)
        # iter_recipes yields in the order of dag.nodes.
        for (label, node), (_, recipe) in zip(dag.nodes.items(), entries, strict=True):
            entry = {**_entry(label, node, plan), "recipe": recipe}
            # Bytes: this JSON is ASCII, and 10,000 steps make a manifest of about 10 MB.
            yield json.dumps(entry, default=str)[:-1].encode()


def _entry(label: str, node: Any, plan: Plan) -> dict[str, Any]:
    """A step's unchanging fields but its recipe, in the order `_statics` writes them."""
    return {
        "name": node.name,
        "label": label,
        "hash": node.identity.hash,
        "output_path": node.output_path,
        "fn": fn_import_path(node.step.fn),
        "deps": list(node.deps),
        "soft_deps": list(node.soft_deps),
        "planned": plan.steps[label].state.value,
        "reason": plan.steps[label].reason,
    }


_PLANNED_KEY = ', "planned": '
_RECIPE_KEY = ', "recipe": '
_DECODER = json.JSONDecoder()


def _copied_lines(previous: bytes, digest: str, count: int) -> list[tuple[str, str]] | None:
    """Each step's fields before its plan, and its recipe, as JSON text cut from `previous`, when
    its steps were encoded from what `digest` covers and are the bytes written (its checksum);
    else None.

    A step's line holds its plan and recipe after its name, paths and deps: the first
    `, "planned": ` and the first `, "recipe": ` of the line are those keys (a quote inside a
    JSON string is escaped, so no earlier string holds one), and the decoder finds where the
    recipe ends (what follows, the step's outcome, may hold any key)."""
    if _verified(previous, "recipes_digest", digest) is None:
        return None
    lines = previous.decode().split("\n")[1:-2]  # the head line; the closing `]}` and the end
    if len(lines) != count:
        return None
    copied = []
    for line in lines:
        planned = line.find(_PLANNED_KEY)
        start = line.find(_RECIPE_KEY, planned) + len(_RECIPE_KEY)
        if planned < 0 or start < len(_RECIPE_KEY):
            return None
        try:
            end = _DECODER.raw_decode(line, start)[1]
        except ValueError:
            return None
        copied.append((line[:planned], line[start:end]))
    return copied


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _copyable(previous: bytes, digest: str) -> int | None:
    """The checksum of `previous`'s steps if they can be copied into a manifest whose steps have
    `digest`: written by `encode_lines` with that digest, and the bytes it wrote (unedited)."""
    return _verified(previous, "steps_digest", digest)


def _verified(previous: bytes, key: str, digest: str) -> int | None:
    """The checksum of `previous`'s steps if its head's `key` is `digest` and its steps are the
    bytes `encode_lines` wrote (their CRC is the one recorded), else None."""
    before = encoded_head(previous)
    if before is None or before.get(key) != digest:
        return None
    checksum = before.get(CHECKSUM)
    return checksum if checksum is not None and checksum == steps_checksum(previous) else None


def _ran_nothing(report: RunReport) -> bool:
    """Whether every step's outcome is its planned state and nothing more: its line in the
    manifest is then a function of the plan alone."""
    plan = report.plan.steps
    return all(
        o.state == plan[label].state
        and o.started is None
        and o.attempts == 0
        and o.error is None
        and not o.metrics
        for label, o in report.outcomes.items()
    )


@functools.cache
def _encoder_fingerprint() -> str:
    """A digest of the code that encodes a manifest's steps: a Drydock that encodes them
    differently never copies the steps of a manifest an older one wrote."""
    digest = hashlib.sha256()
    try:
        for path in (recipe_module.__file__, recipe_codec.__file__, manifests.__file__, __file__):
            with open(path or "", "rb") as f:
                digest.update(f.read())
    except OSError:  # code without its files (a frozen build): never the same, never copies
        digest.update(os.urandom(16))
    return digest.hexdigest()


_KINDS_TEXT: dict[frozenset[type], str] = {}


def _kinds_text(kinds: frozenset[type]) -> str:
    """`module:qualname` of each type, sorted; computed once per set of types."""
    text = _KINDS_TEXT.get(kinds)
    if text is None:
        text = _KINDS_TEXT[kinds] = ",".join(sorted(f"{k.__module__}:{k.__qualname__}" for k in kinds))
    return text


_DEFAULT_RESOURCES = Resources()


def _outcome(label: str, planned: str, report: RunReport | None) -> dict[str, Any]:
    """A step's fields that a run fills in: its state, timings, attempts and error."""
    if report is None:
        return {"state": planned}
    outcome = report.outcomes[label]
    return {
        "state": outcome.state.value,
        "started": outcome.started,
        "ended": outcome.ended,
        "duration": outcome.duration,
        "attempts": outcome.attempts,
        "error": outcome.error,
        **({"metrics": dict(outcome.metrics)} if outcome.metrics else {}),
    }
