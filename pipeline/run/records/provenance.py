"""What Drydock records about a step and a run, besides identity.

`.step.json` holds the identity inputs plus what identity leaves out on purpose: the full
resolved config, a fingerprint of the step function's source, the dependencies, the git commit
and package versions. Planning compares these with the current declaration to write drift notes
("unversioned field `log_every` 10→50", "code of `train` changed since"). No storage I/O here.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import inspect
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.core.config_walk import to_plain
from pipeline.core.dag import Dag, drift_text, fn_import_path, resolved_config
from pipeline.core.drift import drift_digest_of_text, listing_digest
from pipeline.run.options import redact_argv
from pipeline.run.records.hooks import call_hook, step_summary
from pipeline.step import hooks_of, inapplicable_fields

__all__ = [
    "code_fingerprint",
    "drift_digest_of",
    "environment_info",
    "input_listing",
    "step_info",
]

# Distributions whose versions go into manifests; read from metadata, never imported.
_TRACKED_DISTRIBUTIONS = (
    "drydock",
    "marin-levanter",
    "jax",
    "jaxlib",
    "ray",
    "fsspec",
    "draccus",
    "tokenizers",
    "numpy",
)


@functools.lru_cache(maxsize=4096)
def _fingerprint_cached(fn: Callable[..., Any]) -> str:
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = fn_import_path(fn)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def code_fingerprint(fn: Callable[..., Any]) -> str:
    """A short hash of the step function's source (its import path if the source is unavailable)."""
    try:
        return _fingerprint_cached(fn)
    except TypeError:  # unhashable callable
        return hashlib.sha256(fn_import_path(fn).encode()).hexdigest()[:16]


def drift_digest_of(dag: Dag, label: str) -> str:
    """The drift digest of a step as declared now (`pipeline.core.drift.drift_digest`): recorded
    with its SUCCESS, compared by later plans."""
    return drift_digest_of_text(code_fingerprint(dag.nodes[label].step.fn), drift_text(dag, label))


def input_listing(dag: Dag, label: str, config: Any | None = None) -> dict[str, Any] | None:
    """The step's raw inputs as its `inputs` hook lists them now (`pipeline.step.StepHooks`), or
    None if it declares none. What the hook raises (a listing that cannot be read) passes."""
    hook = hooks_of(dag.nodes[label].step.fn).inputs
    if hook is None:
        return None
    return dict(hook(resolved_config(dag, label) if config is None else config))


def step_info(dag: Dag, label: str, config: Any | None = None) -> dict[str, Any]:
    """The `.step.json` content of a step (without run-specific fields)."""
    node = dag.nodes[label]
    if config is None:
        config = resolved_config(dag, label)
    fn = node.step.fn
    return {
        "name": node.name,
        "label": label,
        "hash": node.identity.hash,
        "identity": dict(node.identity.payload),
        "description": node.step.description,
        "prefix": dag.prefix,
        "output_path": node.output_path,
        "fn": {
            "import_path": fn_import_path(fn),
            "file": _source_file(fn),
            "fingerprint": code_fingerprint(fn),
        },
        "config": to_plain(node.name, "", config, strict=False),
        "config_class": f"{type(node.step.config).__module__}:{type(node.step.config).__qualname__}",
        "deps": [dag.nodes[d].output_path for d in node.deps],
        "soft_deps": [dag.nodes[d].output_path for d in node.soft_deps],
        "resources": node.step.resources.to_json(),
        # Fields that mean nothing here (a Muon-only rate of an AdamW run): views leave them out.
        **({"inapplicable": skipped} if (skipped := inapplicable_fields(node.step.config)) else {}),
    }


@functools.lru_cache(maxsize=4096)
def _source_file_cached(fn: Callable[..., Any]) -> str | None:
    return inspect.getsourcefile(fn)


def _source_file(fn: Callable[..., Any]) -> str | None:
    try:
        return _source_file_cached(fn)
    except TypeError:
        return None


@functools.lru_cache(maxsize=8)
def _git_info(directory: str) -> dict[str, Any] | None:
    try:
        commit = subprocess.run(
            ["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        return {"commit": commit.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=1)
def _versions() -> tuple[tuple[str, str], ...]:
    """Python's and the tracked packages' versions: read once per process (reading package
    metadata costs milliseconds, as much as planning a thousand cached steps)."""
    versions = [("python", platform.python_version())]
    for dist in _TRACKED_DISTRIBUTIONS:
        try:
            versions.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(versions)


def environment_info(source_file: str | None = None) -> dict[str, Any]:
    """Git commit of the experiment's repository and versions of the packages that matter."""
    directory = os.path.dirname(os.path.abspath(source_file)) if source_file else os.getcwd()
    return {
        "git": _git_info(directory),
        "versions": dict(_versions()),
        "argv": redact_argv(sys.argv),  # a webhook URL (--notify) is a secret
        "host": platform.node(),
    }


def attempt_info(
    dag: Dag, label: str, config: Any, run_info: Mapping[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """The `.step.json` of an attempt of `label` given `config` (the caller adds the attempt's
    run id, number, token and start), and the digest of the step's input listing if it has one.

    The listing is taken before the step reads its inputs: the record of what this attempt was
    given. A listing that cannot be read fails the attempt with the hook's error."""
    info = step_info(dag, label, config)
    info.update(run_info)
    summary = step_summary(dag.nodes[label].step.fn, config)
    if summary:
        info["summary"] = summary
    listing = input_listing(dag, label, config)
    inputs = None
    if listing is not None:
        info["inputs"] = listing
        inputs = listing_digest(listing)
    return info, inputs


def success_data(
    dag: Dag, label: str, config: Any, duration: float, step_json: str, inputs: str | None
) -> dict[str, Any]:
    """What a SUCCESS of `label` records: its duration, the digests that let a later plan skip
    reading and diffing `.step.json` (`pipeline.core.drift`), and its `report` and `metrics`
    hooks' values where JSON can hold them (the dashboard shows the report without importing
    step code; `compare` compares the metrics across runs)."""
    data: dict[str, Any] = {
        "duration": duration,
        "drift": drift_digest_of(dag, label),
        "step_json": step_json,
    }
    if inputs is not None:
        data["inputs"] = inputs  # a later plan lists the inputs again and compares
    hooks = hooks_of(dag.nodes[label].step.fn)
    report = _recordable(call_hook(hooks.report, config, "no report"))
    if report is not None:
        data["report"] = report
    metrics = _recordable(call_hook(hooks.metrics, config, "no metrics"))
    if isinstance(metrics, Mapping):
        data["metrics"] = dict(metrics)
    return data


def _recordable(value: Any) -> Any:
    """`value` if it can be written into `.status` as JSON, else None."""
    if value is None:
        return None
    try:
        json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return None
    return value
