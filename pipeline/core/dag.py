"""Build and validate an experiment's DAG: discover steps, check them, compute identities.

`build_dag(roots, prefix)` is the single entry point. It follows `output_of` placeholders from
the given steps to every upstream step, then checks, with one clear error each: step names,
step functions, configs, dangling references, cycles (naming the cycle), and two different steps
sharing a name. Identities are computed once per step in topological order (upstream hashes are
memoized, so a 100,000-step DAG costs one hash per step); declarations with equal identities
collapse into one node. No I/O.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pipeline.core import graph
from pipeline.core.collector import collector_paused
from pipeline.core.config_walk import ConfigRefs, collect_refs, resolve_config
from pipeline.core.identity import (
    HASH_CHARS,
    NAME_PART,
    PREFIX_TOKEN,
    Identity,
    compact_json_encoder,
    compute_identity,
)
from pipeline.errors import GraphError, StepDeclarationError
from pipeline.step import OutputOf, Resources, Step, ThisOutput

__all__ = ["Dag", "StepNode", "build_dag", "drift_text", "fn_import_path", "join_path", "resolved_config"]

_NAME_PART = re.compile(rf"^{NAME_PART}$")


# Not frozen, and never assigned to after it is made: a frozen dataclass sets each field in
# __init__ through object.__setattr__, three times the cost of a plain slot, and a plan makes
# one per step (with StepNode, StatusEvent and StepPlan
# unfrozen, a 10,000-step cached plan took 20-40 ms less). `Dag.nodes` is a read-only mapping.
@dataclass(slots=True)
class StepNode:
    """One de-duplicated step of the DAG, with everything planning needs."""

    step: Step
    identity: Identity
    output_path: str
    deps: tuple[str, ...]
    """Labels of upstream steps this one waits for (blocking inputs)."""
    soft_deps: tuple[str, ...]
    """Labels of upstream steps referenced with `blocking=False`."""
    refs: ConfigRefs
    inputs: Mapping[str, str]
    """Dotted config path of each `output_of` -> the upstream step's label."""

    @property
    def label(self) -> str:
        """`name-<12 hex>`, the node's key."""
        return self.identity.label

    @property
    def name(self) -> str:
        return self.step.name


@dataclass(frozen=True)
class Dag:
    """An immutable, validated DAG. `nodes` is in topological order, keyed by label."""

    prefix: str
    nodes: Mapping[str, StepNode]
    roots: tuple[str, ...]

    @property
    def deps(self) -> Mapping[str, tuple[str, ...]]:
        """Blocking dependencies by label."""
        return {label: node.deps for label, node in self.nodes.items()}

    def output_path(self, label: str, sub: str | None = None) -> str:
        """The output directory of a step (or `sub` inside it)."""
        path = self.nodes[label].output_path
        return join_path(path, sub) if sub else path


def join_path(base: str, sub: str) -> str:
    """Join storage paths with `/` (fsspec paths, local or remote)."""
    return f"{base.rstrip('/')}/{sub.strip('/')}"


def fn_import_path(fn: Any) -> str:
    """`module:qualname` of a step function."""
    return f"{fn.__module__}:{fn.__qualname__}"


NAME_MAX = 255
"""Bytes in one file name on the file systems a prefix lives on (ext4, XFS; object keys allow more)."""

_LABEL_LIKE = re.compile(rf".+-[0-9a-f]{{{HASH_CHARS}}}$")


_PLAIN_NAME = re.compile(rf"{NAME_PART}(?:/{NAME_PART})*")
_LABEL_INSIDE = re.compile(rf"-[0-9a-f]{{{HASH_CHARS}}}/")


def validate_name(name: Any) -> None:
    """Raise `StepDeclarationError` unless `name` is a relative slash path of safe parts."""
    # Almost every name is fine: one match decides (ASCII only, so characters are bytes); the
    # checks below find what is wrong with the others, one part at a time.
    short = NAME_MAX - HASH_CHARS - 1
    if (
        type(name) is str
        and len(name) <= short
        and _PLAIN_NAME.fullmatch(name)
        and not _LABEL_INSIDE.search(name)
    ):
        return
    if not isinstance(name, str) or not name:
        raise StepDeclarationError(
            None, f"a step name must be a non-empty string, got {name!r}", field="name"
        )
    if name.startswith("/") or "://" in name:
        raise StepDeclarationError(name, "name must be relative to the prefix, not absolute", field="name")
    parts = name.split("/")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part in ("", ".", ".."):
            raise StepDeclarationError(
                name, f"name part {part!r} is not allowed (no empty parts, '.' or '..')", field="name"
            )
        if not _NAME_PART.match(part):
            raise StepDeclarationError(
                name,
                f"name part {part!r} may only use letters, digits and . _ + = , - "
                "(no spaces, and not starting with '.')",
                field="name",
            )
        # A file name holds at most NAME_MAX bytes; the last part gets "-<12 hex>" added.
        limit = NAME_MAX - (HASH_CHARS + 1 if last else 0)
        if len(part.encode()) > limit:
            raise StepDeclarationError(
                name,
                f"name part {part[:40]!r}... is {len(part.encode())} bytes; a file name holds "
                f"{NAME_MAX}{', and the step adds its 13-character hash' if last else ''}: at most {limit}",
                field="name",
            )
        if not last and _LABEL_LIKE.match(part):
            raise StepDeclarationError(
                name,
                f"name part {part!r} looks like a step label (<name>-<12 hex>): its directory would "
                "be inside that step's output",
                field="name",
            )


def _validate_step(step: Any, referrer: str | None = None) -> None:
    if not isinstance(step, Step):
        where = f" (referenced by {referrer})" if referrer else ""
        raise StepDeclarationError(
            None, f"expected a Step{where}, got {type(step).__name__}: {step!r}", field="steps"
        )
    validate_name(step.name)
    fn = step.fn
    qualname = getattr(fn, "__qualname__", None)
    if not callable(fn) or qualname is None or getattr(fn, "__module__", None) is None:
        raise StepDeclarationError(step.name, f"fn must be a module-level function, got {fn!r}", field="fn")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise StepDeclarationError(
            step.name,
            f"fn {qualname} is a lambda or a nested function; step functions must be defined at "
            "module level so that remote workers can import them",
            field="fn",
        )
    if not _importable(fn):
        raise StepDeclarationError(
            step.name,
            f"fn {fn.__module__}:{qualname} is not importable (module {fn.__module__!r} is not loaded "
            "or does not hold it under that name); define step functions at module level of a "
            "module that remote workers can import",
            field="fn",
        )
    if step.version is not None and not isinstance(step.version, str):
        raise StepDeclarationError(
            step.name, f"version must be a string, got {step.version!r}", field="version"
        )
    if not isinstance(step.resources, Resources):
        raise StepDeclarationError(
            step.name,
            f"resources must be a Resources, got {type(step.resources).__name__}",
            field="resources",
        )
    _validate_gang(step.name, step.resources)


def _validate_gang(name: str, resources: Resources) -> None:
    """The multi-host fields of `resources`: whole numbers that make sense together."""
    for field_name in ("hosts", "slices", "crash_limit"):
        value = getattr(resources, field_name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StepDeclarationError(
                name, f"must be a whole number >= 1, got {value!r}", field=f"resources.{field_name}"
            )
    timeout = resources.hang_timeout
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
    ):
        raise StepDeclarationError(
            name, f"must be a number of seconds > 0, got {timeout!r}", field="resources.hang_timeout"
        )
    if resources.hosts > 1 and resources.tpu:
        raise StepDeclarationError(
            name,
            f"a TPU slice type says how many hosts it has ({resources.tpu}); leave hosts at 1 and "
            "use slices=N for several slices",
            field="resources.hosts",
        )
    accelerator = resources.accelerator
    if accelerator is not None and (not isinstance(accelerator, str) or not resources.gpus):
        raise StepDeclarationError(
            name,
            f"accelerator {resources.accelerator!r} names a GPU type: give it with gpus > 0 (TPU types "
            "come from tpu=...)",
            field="resources.accelerator",
        )


RECIPE_MODULE = "__drydock_recipe__"
"""The module name under which `drydock rerun` executes a recorded experiment file
(pipeline.run.records.recipe). It is never registered in sys.modules, so workers receive its
functions by value, as they do the functions of an experiment file run as `__main__`."""


def _importable(fn: Any) -> bool:
    """Whether `module:qualname` of `fn` leads back to `fn`, as unpickling on a worker does."""
    if fn.__module__ == RECIPE_MODULE:
        return True
    target: Any = sys.modules.get(fn.__module__)
    for part in fn.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is fn


def _validate_sub(step: str, path: str, sub: Any) -> None:
    """A placeholder's sub-path must stay inside the step directory it names."""
    if sub is None:
        return
    if not isinstance(sub, str):
        raise StepDeclarationError(step, f"sub-path must be a string, got {sub!r}", field=path)
    if sub.startswith("/") or "://" in sub or ".." in sub.split("/"):
        raise StepDeclarationError(
            step, f"sub-path {sub!r} must be relative and stay inside the step's directory", field=path
        )


def build_dag(roots: Sequence[Step], prefix: str) -> Dag:
    """Discover, validate and identify every step reachable from `roots`."""
    with collector_paused():  # many small objects, all kept: nothing for the collector to find
        return _build_dag(roots, prefix)


def _build_dag(roots: Sequence[Step], prefix: str) -> Dag:
    if isinstance(roots, Step):
        roots = [roots]
    if not roots:
        raise StepDeclarationError(None, "no steps given", field="steps")
    for step in roots:
        _validate_step(step)
    refs = _discover(roots, prefix)
    inputs = _resolve_inputs(refs)
    edges = {step: [up for up, _ph in step_inputs.values()] for step, step_inputs in inputs.items()}
    cycle = graph.find_cycle(edges)
    if cycle:
        raise GraphError("the steps form a cycle: " + " -> ".join(s.name for s in cycle))
    # Upstreams before dependents, in declaration order: plans read like the experiment file.
    order = graph.depth_first_order(edges, list(roots))
    identities: dict[Step, Identity] = {}
    for step in order:
        upstream = {
            path: (identities[up].hash, ph.sub) for path, (up, ph) in inputs[step].items() if ph.identity
        }
        identities[step] = compute_identity(step.name, step.version, refs[step].versioned, upstream, prefix)
    nodes = _collapse(order, identities, refs, inputs, prefix)
    root_labels = tuple(dict.fromkeys(identities[s].label for s in roots))
    return Dag(prefix=prefix, nodes=MappingProxyType(nodes), roots=root_labels)


_Inputs = dict[str, tuple[Step, OutputOf]]
"""A step's inputs: dotted config path -> (the upstream Step, the placeholder there)."""


def _discover(roots: Sequence[Step], prefix: str) -> dict[Step, ConfigRefs]:
    """Every Step reachable through output_of placeholders, with its config's references."""
    refs: dict[Step, ConfigRefs] = {}
    validated = set(roots)  # a step referenced by many others is checked once
    stack = list(roots)
    while stack:
        step = stack.pop()
        if step in refs:
            continue
        refs[step] = step_refs = collect_refs(step.name, step.config, prefix)
        for path, own in step_refs.own_outputs.items():
            if own.sub is not None:
                _validate_sub(step.name, path, own.sub)
        for path, placeholder in step_refs.inputs.items():
            if placeholder.sub is not None:
                _validate_sub(step.name, path, placeholder.sub)
            up = placeholder.step
            if isinstance(up, Step):
                if up not in validated:
                    _validate_step(up, referrer=f"step {step.name!r} field `{path}`")
                    validated.add(up)
                if up not in refs:  # a step found already needs no second visit
                    stack.append(up)
            elif not isinstance(up, str):
                raise StepDeclarationError(
                    step.name,
                    f"output_of needs a Step or a step name, got {type(up).__name__}",
                    field=path,
                )
    return refs


def _resolve_inputs(refs: Mapping[Step, ConfigRefs]) -> dict[Step, _Inputs]:
    """Each step's inputs as Step objects; a reference by name resolves within the DAG."""
    by_name: dict[str, list[Step]] = {}
    for step in refs:
        by_name.setdefault(step.name, []).append(step)
    inputs: dict[Step, _Inputs] = {}
    for step, step_refs in refs.items():
        inputs[step] = {}
        for path, placeholder in step_refs.inputs.items():
            up = placeholder.step
            if isinstance(up, str):
                candidates = by_name.get(up)
                if not candidates:
                    raise GraphError(
                        f"step {step.name!r}: field `{path}` points at step {up!r}, which is not in the "
                        "DAG; pass that step to executor_main or use output_of(<Step object>)"
                    )
                up = candidates[0]
            inputs[step][path] = (up, placeholder)
    return inputs


def _collapse(
    order: Sequence[Step],
    identities: Mapping[Step, Identity],
    refs: Mapping[Step, ConfigRefs],
    inputs: Mapping[Step, _Inputs],
    prefix: str,
) -> dict[str, StepNode]:
    """One node per identity, in `order`; the same name with different identities is an error."""
    nodes: dict[str, StepNode] = {}
    label_of_name: dict[str, str] = {}
    for step in order:
        ident = identities[step]
        if ident.label in nodes:
            continue
        other = label_of_name.get(step.name)
        if other is not None:
            raise GraphError(
                f"two different steps are named {step.name!r} ({other} and {ident.label}); "
                "give them distinct names or make their versioned values equal"
            )
        label_of_name[step.name] = ident.label
        step_inputs = inputs[step].values()
        deps = tuple(dict.fromkeys(identities[up].label for up, ph in step_inputs if ph.blocking))
        soft = tuple(dict.fromkeys(identities[up].label for up, ph in step_inputs if not ph.blocking))
        nodes[ident.label] = StepNode(
            step=step,
            identity=ident,
            output_path=join_path(prefix, ident.label),
            deps=deps,
            soft_deps=tuple(s for s in soft if s not in deps),
            refs=refs[step],
            inputs={path: identities[up].label for path, (up, _ph) in inputs[step].items()},
        )
    return nodes


def labels_matching(dag: Dag, pattern: str | None) -> set[str]:
    """Labels of steps whose name matches the regex `pattern` (search anywhere in the name)."""
    if not pattern:
        return set()
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise StepDeclarationError(
            None, f"invalid regular expression {pattern!r}: {e}", field="only/force"
        ) from e
    return {label for label, node in dag.nodes.items() if regex.search(node.name)}


def resolved_config(dag: Dag, label: str) -> Any:
    """The config `fn` receives: placeholders replaced by paths, versioned values unwrapped."""
    node = dag.nodes[label]
    # Placeholders are matched by object: the same frozen value may sit at several paths.
    upstream = {id(node.refs.inputs[path]): dag.nodes[up].output_path for path, up in node.inputs.items()}

    def resolve(placeholder: OutputOf | ThisOutput) -> str:
        base = node.output_path if isinstance(placeholder, ThisOutput) else upstream[id(placeholder)]
        return join_path(base, placeholder.sub) if placeholder.sub else base

    return resolve_config(node.step.config, resolve)


def drift_text(dag: Dag, label: str) -> str:
    """The config as drift notes compare it, as canonical JSON: `to_plain` of the resolved config
    with paths under the prefix written relative to it (`${prefix}/...`). Made from the plain form
    that `build_dag` already has (`ConfigRefs.plain`), so no config is walked again."""
    node = dag.nodes[label]
    upstream = {id(node.refs.inputs[path]): up for path, up in node.inputs.items()}

    def render(value: Any) -> str:
        if isinstance(value, OutputOf | ThisOutput):
            base = f"{PREFIX_TOKEN}/{label if isinstance(value, ThisOutput) else upstream[id(value)]}"
            return join_path(base, value.sub) if value.sub else base
        return repr(value)  # never reached: the plain form holds nothing else JSON cannot write

    # One encoder for every call (a cached plan makes one text per step); the placeholders of
    # the step at hand are rendered through this thread's `render`.
    _PLACEHOLDERS.render = render
    try:
        return _DRIFT_JSON(node.refs.plain)
    finally:
        _PLACEHOLDERS.render = None


_PLACEHOLDERS = threading.local()
_DRIFT_JSON = compact_json_encoder(default=lambda value: _PLACEHOLDERS.render(value))
