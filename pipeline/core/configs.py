"""Walking step configs: find placeholders and versioned values, and resolve them.

A config is a dataclass instance (frozen or not) that may nest dataclasses, lists, tuples and
dicts. Every location has a dotted path (`data.sources.0.path`, `weights.web`); identities,
drift notes and error messages all speak in those paths. Pure functions, no I/O.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipeline.core.identity import relativize
from pipeline.errors import StepDeclarationError
from pipeline.step import ADDED_FIELD, OutputOf, Step, ThisOutput, Versioned, unversioned

__all__ = ["ConfigRefs", "collect_refs", "resolve_config", "to_plain"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConfigRefs:
    """What a config declares, by dotted path."""

    versioned: dict[str, Any]
    """Versioned values, unwrapped and converted to plain JSON-ready values."""
    inputs: dict[str, OutputOf]
    """`output_of` placeholders."""
    own_outputs: dict[str, ThisOutput]
    """`this_output` placeholders."""
    plain: Any = None
    """The config as drift notes compare it: `to_plain` (not strict) with strings under the
    prefix relative to it, but with the placeholder objects left in place, to be rendered once
    the labels are known (`dag.drift_text`). Made in the same walk that finds the references."""
    kinds: frozenset[type] = frozenset()
    """The types in the config that its plain form does not name: dataclasses (the plain form
    has their qualified name, not their module), enums, tuples, floats, paths and other leaves.
    With `plain`, they say whether a recipe made from the config would encode the same
    (`pipeline.run.manifest_builder` reuses a manifest's encoded steps on that condition)."""


_LEAVES = frozenset({str, int, float, bool, type(None)})


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


@functools.lru_cache(maxsize=1024)
def _field_names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() builds a fresh tuple per call; a large DAG asks once per config.
    return tuple(f.name for f in dataclasses.fields(cls))


_NO_DEFAULT: Any = object()


@functools.cache
def _added_fields(cls: type) -> dict[str, Any]:
    """The fields of `cls` declared with `pipeline.step.added_field`, and their defaults."""
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.metadata.get(ADDED_FIELD) and f.default is not dataclasses.MISSING
    }


def _fields_of(value: Any, kind: type) -> tuple[str, ...]:
    """The fields of dataclass `value` that its plain form holds: all of them, except a field
    added later (`added_field`) that holds its default, so identities made before it stay."""
    added = _added_fields(kind)
    names = _field_names(kind)
    if not added:
        return names
    # `versioned(default)` holds the default too: a step factory that versions the field keeps
    # the identities made before it existed when it passes the default.
    return tuple(n for n in names if n not in added or unversioned(getattr(value, n)) != added[n])


def collect_refs(step_name: str, config: Any, prefix: str | None = None) -> ConfigRefs:
    """Find every placeholder and versioned value in `config`, and its plain form (`plain`, with
    strings under `prefix` written relative to it), in one walk.

    Raises `StepDeclarationError` (naming the step and field) if the config is not a dataclass
    instance or a versioned value cannot be written as canonical JSON.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise StepDeclarationError(
            step_name,
            f"config must be a dataclass instance, got {type(config).__name__}; "
            "wrap the step's parameters in a @dataclass(frozen=True)",
            field="config",
        )
    _warn_if_mutable(step_name, type(config))
    found = _Found()
    plain = _collect(step_name, config, "", False, found, set(), prefix)
    kinds = frozenset(found.kinds)
    # Interned: the steps of a large DAG mostly share a handful of sets of types.
    kinds = _KINDS.setdefault(kinds, kinds)
    return ConfigRefs(found.versioned, found.inputs, found.own_outputs, plain, kinds)


_KINDS: dict[frozenset[type], frozenset[type]] = {}


class _Found:
    """What `_collect` finds, as it finds it (a ConfigRefs is made once, at the end)."""

    __slots__ = ("inputs", "kinds", "own_outputs", "versioned")

    def __init__(self) -> None:
        self.versioned: dict[str, Any] = {}
        self.inputs: dict[str, OutputOf] = {}
        self.own_outputs: dict[str, ThisOutput] = {}
        self.kinds: set[type] = set()


_WARNED: set[type] = set()


def _warn_if_mutable(step_name: str, cls: type) -> None:
    """A config class that is not frozen gets one warning: the step function could change the
    config it is handed, and the identity computed from it would no longer say what ran."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or params.frozen or cls in _WARNED:
        return
    _WARNED.add(cls)
    logger.warning(
        "step %r: config class %s is not frozen; declare it @dataclass(frozen=True) so that no step "
        "function can change a config after its identity is computed",
        step_name,
        cls.__qualname__,
    )


def _collect(
    step: str, value: Any, path: str, in_versioned: bool, refs: _Found, seen: set[int], prefix: str | None
) -> Any:
    """Record `value`'s references in `refs` and return its plain form: `to_plain(value,
    strict=False, prefix=prefix)`, case for case and in the same order, except that placeholders
    stay as they are.

    Plain strings, ints, bools and None inside containers are handled in the container's loop,
    without a call or a dotted path: configs are mostly such values, and a plan walks every
    config once per step."""
    kind = type(value)
    if kind is str:  # the common cases first: configs are mostly plain values
        return relativize(value, prefix) if prefix is not None else value
    if kind is int or kind is bool or value is None:
        return value
    # The markers before the generic checks below (none of them is a str, number or enum).
    if isinstance(value, Versioned):
        inner = value.value
        plain = _collect(step, inner, path, True, refs, seen, prefix)
        if path not in refs.versioned:
            # to_plain of a plain str, int, bool or None (without a prefix) is the value itself.
            simple = type(inner) in _SIMPLE
            refs.versioned[path] = inner if simple else to_plain(step, path, inner, strict=True)
        return plain
    if isinstance(value, OutputOf):
        if in_versioned and not value.identity:
            raise StepDeclarationError(
                step,
                "output_of(..., identity=False) cannot be versioned: it stays out of identity",
                field=path,
            )
        refs.inputs[path] = value
        return value
    if isinstance(value, ThisOutput):
        refs.own_outputs[path] = value
        return value
    if kind is list or kind is tuple or kind is dict:  # containers next: no leaf checks for them
        is_dataclass = False
        if kind is tuple:
            refs.kinds.add(tuple)
    else:
        refs.kinds.add(kind)  # a float, enum, dataclass, path, subclass of a plain type...
        leaf = _plain_leaf(value, prefix)  # subclasses of str, int and float
        if leaf is not _NOT_A_LEAF:
            return leaf
        if isinstance(value, enum.Enum):
            return _collect(step, value.value, path, in_versioned, refs, seen, prefix)
        if isinstance(value, Step):
            # A Step is a dataclass; walking into it would adopt the other step's placeholders and
            # versioned values as this step's own, with no DAG edge.
            raise StepDeclarationError(
                step,
                f"holds step {value.name!r} itself; use output_of(step) or step / 'sub' for its output path",
                field=path,
            )
        is_dataclass = hasattr(kind, "__dataclass_fields__") and not isinstance(value, type)
        if not (is_dataclass or isinstance(value, list | tuple | dict)):
            return repr(value)
    # A config that contains itself would recurse forever; configs are trees.
    if id(value) in seen:
        raise StepDeclarationError(step, "config refers to itself (configs must be trees)", field=path)
    seen.add(id(value))
    out: Any
    if is_dataclass:
        out = {"__class__": kind.__qualname__}
        for name in _fields_of(value, kind):
            child = getattr(value, name)
            child_kind = type(child)
            if child_kind is str:
                out[name] = relativize(child, prefix) if prefix is not None else child
            elif child_kind is int or child_kind is bool or child is None:
                out[name] = child
            else:
                out[name] = _collect(step, child, _join(path, name), in_versioned, refs, seen, prefix)
    elif isinstance(value, dict):
        out = {}
        for key, child in value.items():
            if not isinstance(key, str):
                raise StepDeclarationError(
                    step, f"dict keys must be strings, got {key!r} ({type(key).__name__})", field=path
                )
            out[key] = _collect(step, child, _join(path, key), in_versioned, refs, seen, prefix)
    else:
        out = []
        for i, child in enumerate(value):
            child_kind = type(child)
            if child_kind is str:
                out.append(relativize(child, prefix) if prefix is not None else child)
            elif child_kind is int or child_kind is bool or child is None:
                out.append(child)
            else:
                out.append(_collect(step, child, _join(path, i), in_versioned, refs, seen, prefix))
    seen.discard(id(value))
    return out


_SIMPLE = frozenset({str, int, bool, type(None)})


_NOT_A_LEAF: Any = object()


def _plain_leaf(value: Any, prefix: str | None) -> Any:
    """The plain form of a str, int, bool, None or float (strings under `prefix` relative to it,
    floats canonical), or `_NOT_A_LEAF` for anything else."""
    if isinstance(value, str):
        return relativize(value, prefix) if prefix is not None else value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return _plain_float(value)
    return _NOT_A_LEAF


def _plain_float(value: float) -> Any:
    """Floats as identities write them: integral ones as ints, NaN and infinities as strings."""
    if math.isnan(value) or math.isinf(value):
        return repr(value)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def to_plain(
    step: str,
    path: str,
    value: Any,
    *,
    strict: bool,
    render: Callable[[OutputOf | ThisOutput], str] | None = None,
    prefix: str | None = None,
) -> Any:
    """Convert a config value to plain JSON-ready data.

    Dataclasses become dicts with a `__class__` key (so two config classes with the same fields
    differ), tuples become lists, enums their value, floats are canonical (integral floats
    become ints, so `versioned(3)` and `versioned(3.0)` are one identity; NaN/inf are strings).
    Placeholders become `{"__output_of__": ...}` markers, or `render(placeholder)` when given.
    With `prefix`, strings under it are written relative to it (`identity.relativize`). With
    `strict`, anything else is an error naming the field; without it (recording a full config),
    it becomes its `repr`.
    """
    leaf = _plain_leaf(value, prefix)
    if leaf is not _NOT_A_LEAF:
        return leaf
    if isinstance(value, enum.Enum):
        return to_plain(step, path, value.value, strict=strict, render=render, prefix=prefix)
    if isinstance(value, Versioned):
        return to_plain(step, path, value.value, strict=strict, render=render, prefix=prefix)
    if render is not None and isinstance(value, OutputOf | ThisOutput):
        return render(value)
    if isinstance(value, OutputOf):
        upstream = value.step if isinstance(value.step, str) else value.step.name
        return {"__output_of__": upstream, "sub": value.sub}
    if isinstance(value, ThisOutput):
        return {"__this_output__": value.sub}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {"__class__": type(value).__qualname__}
        for name in _fields_of(value, type(value)):
            out[name] = to_plain(
                step, _join(path, name), getattr(value, name), strict=strict, render=render, prefix=prefix
            )
        return out
    if isinstance(value, list | tuple):
        return [
            to_plain(step, _join(path, i), v, strict=strict, render=render, prefix=prefix)
            for i, v in enumerate(value)
        ]
    if isinstance(value, dict):
        result = {}
        for k, v in value.items():
            if not isinstance(k, str):
                if strict:
                    raise StepDeclarationError(step, f"dict keys must be strings, got {k!r}", field=path)
                k = repr(k)
            result[k] = to_plain(step, _join(path, k), v, strict=strict, render=render, prefix=prefix)
        return result
    if strict:
        raise StepDeclarationError(
            step,
            f"versioned value of type {type(value).__name__} cannot be part of an identity; "
            "use None, bool, int, float, str, or lists, dicts and dataclasses of those",
            field=path or "<config>",
        )
    return repr(value)


def resolve_config(config: Any, resolve: Callable[[OutputOf | ThisOutput], str]) -> Any:
    """A copy of `config` with placeholders replaced by `resolve(...)` and versioned values unwrapped.

    Dataclasses are shallow-copied and their fields set directly, so frozen dataclasses and
    fields with `init=False` survive. Containers are rebuilt with their own type.
    """
    if isinstance(config, Versioned):
        return resolve_config(config.value, resolve)
    if isinstance(config, OutputOf | ThisOutput):
        return resolve(config)
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        changed = {}
        for f in dataclasses.fields(config):
            old = getattr(config, f.name)
            new = resolve_config(old, resolve)
            if new is not old:
                changed[f.name] = new
        if not changed:
            return config
        clone = copy.copy(config)
        for name, new in changed.items():
            object.__setattr__(clone, name, new)
        return clone
    if isinstance(config, list | tuple):
        items = [resolve_config(v, resolve) for v in config]
        if all(a is b for a, b in zip(items, config, strict=True)):
            return config
        if isinstance(config, tuple) and hasattr(config, "_fields"):  # namedtuple
            return type(config)(*items)
        return type(config)(items)
    if isinstance(config, dict):
        resolved = {k: resolve_config(v, resolve) for k, v in config.items()}
        if all(resolved[k] is config[k] for k in config):
            return config
        out = copy.copy(config)
        out.update(resolved)
        return out
    return config
