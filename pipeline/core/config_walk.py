"""Walking step configs: one traversal, and what each walk makes of a config.

A config is a dataclass instance (frozen or not) that may nest dataclasses, lists, tuples and
dicts, holding plain values, floats, enums, paths, `versioned` markers and `output_of` /
`this_output` placeholders. Every location has a dotted path (`data.sources.0.path`,
`weights.web`); identities, drift notes and error messages all speak in those paths.

`ConfigWalk` is the traversal, written once: it sorts each value into its kind (by type, learnt
once per type), walks into dataclasses, lists, tuples and dicts with each child's dotted path,
refuses a config that holds itself or a step, and hands each node to its kind's `visit_*` method.
A walk is a subclass that says what each kind becomes:

    collect_refs     `_Collect`   placeholders and versioned values, and the plain form, at once
    to_plain         `_Plain`     plain JSON-ready data (what identities hash)
    resolve_config   `_Resolve`   a copy with placeholders resolved and versioned values unwrapped
    `pipeline.run.records.recipe_codec.encode_value`: the reversible JSON a manifest records

(Decoding a manifest walks JSON, not a config: `recipe_codec.decode_value` is that walk's
inverse.) Pure functions, no I/O.
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
from pathlib import PurePath
from typing import Any, ClassVar

from pipeline.core.identity import relativize
from pipeline.errors import StepDeclarationError
from pipeline.step import ADDED_FIELD, OutputOf, Step, ThisOutput, Versioned, unversioned

__all__ = ["ConfigRefs", "ConfigWalk", "collect_refs", "field_names", "resolve_config", "to_plain"]

logger = logging.getLogger(__name__)

PLAIN_TYPES = frozenset({str, int, bool, type(None)})
"""The exact types every walk passes through `visit_plain` without a dotted path: configs are
mostly such values, and a plan walks every config once per step."""


def join(path: str, key: str | int) -> str:
    """The dotted path of `key` below `path`."""
    return f"{path}.{key}" if path else str(key)


@functools.lru_cache(maxsize=1024)
def field_names(cls: type) -> tuple[str, ...]:
    """Every field of dataclass `cls` (dataclasses.fields() builds a fresh tuple per call)."""
    return tuple(f.name for f in dataclasses.fields(cls))


@functools.cache
def _added_fields(cls: type) -> dict[str, Any]:
    """The fields of `cls` declared with `pipeline.step.added_field`, and their defaults."""
    return {
        f.name: f.default
        for f in dataclasses.fields(cls)
        if f.metadata.get(ADDED_FIELD) and f.default is not dataclasses.MISSING
    }


def identity_fields(value: Any, kind: type) -> tuple[str, ...]:
    """The fields of dataclass `value` that its plain form holds: all of them, except a field
    added later (`added_field`) that holds its default, so identities made before it stay."""
    added = _added_fields(kind)
    names = field_names(kind)
    if not added:
        return names
    # `versioned(default)` holds the default too: a step factory that versions the field keeps
    # the identities made before it existed when it passes the default.
    return tuple(n for n in names if n not in added or unversioned(getattr(value, n)) != added[n])


def _kind_of(cls: type) -> str:
    """The name of the `visit_*` method for values of type `cls` (first match wins: a StrEnum is
    a str, a Step a dataclass, a namedtuple a tuple)."""
    if issubclass(cls, Versioned):
        return "visit_versioned"
    if issubclass(cls, OutputOf):
        return "visit_output_of"
    if issubclass(cls, ThisOutput):
        return "visit_this_output"
    if issubclass(cls, str | int):  # bool is an int; subclasses: StrEnum, IntEnum, IntFlag...
        return "visit_plain_subclass"
    if issubclass(cls, float):
        return "visit_float"
    if issubclass(cls, enum.Enum):
        return "visit_enum"
    if issubclass(cls, Step):
        return "visit_step"
    if hasattr(cls, "__dataclass_fields__") and not issubclass(cls, type):
        return "visit_dataclass"
    if issubclass(cls, PurePath):
        return "visit_path"
    if issubclass(cls, tuple):
        return "visit_namedtuple" if hasattr(cls, "_fields") else "visit_tuple"
    if issubclass(cls, list):
        return "visit_list"
    if issubclass(cls, dict):
        return "visit_dict"
    return "visit_other"


class ConfigWalk:
    """One walk over one step's config: `walk(config)`. Subclasses say what each kind of value
    becomes by overriding its `visit_*` method; containers are walked here and handed over as
    their walked children (`make_dataclass`, `make_list`, `make_tuple`, `make_namedtuple`,
    `make_dict`), so no subclass writes the recursion.

    `plain_is_same`: `visit_plain` returns its value (the loops skip the call)."""

    plain_is_same: bool = False
    _visits: ClassVar[dict[type, Callable[..., Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._visits = {}  # type -> this class's visit method, learnt on first sight

    def __init__(self, step: str) -> None:
        self.step = step
        self.met: set[type] = set()
        """Every type this walk met, but for the plain ones (str, int, bool, None)."""
        self._open: set[int] = set()

    def walk(self, value: Any, path: str = "") -> Any:
        """What `value`, at dotted `path`, becomes."""
        kind = type(value)
        if kind in PLAIN_TYPES:
            return self.visit_plain(value)
        self.met.add(kind)
        visit = self._visits.get(kind)
        if visit is None:
            visit = self._visits[kind] = getattr(type(self), _kind_of(kind))
        return visit(self, value, path)

    # -- what a value becomes: defaults -----------------------------------------------------------

    def fields(self, value: Any, kind: type) -> tuple[str, ...]:
        """The fields of a dataclass this walk visits (all of them)."""
        return field_names(kind)

    def visit_plain(self, value: Any) -> Any:
        return value

    def visit_plain_subclass(self, value: Any, path: str) -> Any:
        return self.visit_plain(value)

    def visit_float(self, value: float, path: str) -> Any:
        return value

    def visit_versioned(self, value: Versioned, path: str) -> Any:
        return self.walk(value.value, path)

    def visit_output_of(self, value: OutputOf, path: str) -> Any:
        return value

    def visit_this_output(self, value: ThisOutput, path: str) -> Any:
        return value

    def visit_enum(self, value: enum.Enum, path: str) -> Any:
        return self.walk(value.value, path)

    def visit_step(self, value: Step, path: str) -> Any:
        # A Step is a dataclass; walking into it would adopt the other step's placeholders and
        # versioned values as this step's own, with no DAG edge.
        raise StepDeclarationError(
            self.step,
            f"holds step {value.name!r} itself; use output_of(step) or step / 'sub' for its output path",
            field=path,
        )

    def visit_path(self, value: PurePath, path: str) -> Any:
        return self.visit_other(value, path)

    def visit_other(self, value: Any, path: str) -> Any:
        return value

    def odd_key(self, key: Any, path: str) -> Any:
        """What a dict key that is not a string becomes."""
        raise StepDeclarationError(
            self.step, f"dict keys must be strings, got {key!r} ({type(key).__name__})", field=path
        )

    # -- containers: walked here, built by the subclass --------------------------------------------

    def visit_dataclass(self, value: Any, path: str) -> Any:
        self._enter(value, path)
        kind = type(value)
        items = self.start_dataclass(value)
        plain = None if self.plain_is_same else self.visit_plain
        visits, met = self._visits, self.met
        for name in self.fields(value, kind):
            child = getattr(value, name)
            child_kind = type(child)
            if child_kind in PLAIN_TYPES:
                items[name] = child if plain is None else plain(child)
                continue
            # `walk`, inlined: a plan walks every config of the DAG, and this is its inner loop.
            visit = visits.get(child_kind)
            if visit is None:
                items[name] = self.walk(child, join(path, name))
            else:
                met.add(child_kind)
                items[name] = visit(self, child, join(path, name))
        self._open.discard(id(value))
        return self.make_dataclass(value, items, path)

    def visit_list(self, value: list[Any], path: str) -> Any:
        return self.make_list(value, self._walk_items(value, path), path)

    def visit_tuple(self, value: tuple[Any, ...], path: str) -> Any:
        return self.make_tuple(value, self._walk_items(value, path), path)

    def visit_namedtuple(self, value: tuple[Any, ...], path: str) -> Any:
        return self.make_namedtuple(value, self._walk_items(value, path), path)

    def visit_dict(self, value: dict[Any, Any], path: str) -> Any:
        self._enter(value, path)
        items: dict[Any, Any] = {}
        walk = self.walk
        for key, child in value.items():
            if not isinstance(key, str):
                key = self.odd_key(key, path)
            items[key] = walk(child, join(path, key))
        self._open.discard(id(value))
        return self.make_dict(value, items, path)

    def start_dataclass(self, value: Any) -> dict[str, Any]:
        """The dict a dataclass's walked fields are added to."""
        return {}

    def make_dataclass(self, value: Any, items: dict[str, Any], path: str) -> Any:
        return items

    def make_list(self, value: list[Any], items: list[Any], path: str) -> Any:
        return items

    def make_tuple(self, value: tuple[Any, ...], items: list[Any], path: str) -> Any:
        return items

    def make_namedtuple(self, value: tuple[Any, ...], items: list[Any], path: str) -> Any:
        return self.make_tuple(value, items, path)

    def make_dict(self, value: dict[Any, Any], items: dict[Any, Any], path: str) -> Any:
        return items

    def _walk_items(self, value: list[Any] | tuple[Any, ...], path: str) -> list[Any]:
        self._enter(value, path)
        out: list[Any] = []
        plain = None if self.plain_is_same else self.visit_plain
        visits, met = self._visits, self.met
        for i, child in enumerate(value):
            child_kind = type(child)
            if child_kind in PLAIN_TYPES:
                out.append(child if plain is None else plain(child))
                continue
            visit = visits.get(child_kind)  # `walk`, inlined (see visit_dataclass)
            if visit is None:
                out.append(self.walk(child, join(path, i)))
            else:
                met.add(child_kind)
                out.append(visit(self, child, join(path, i)))
        self._open.discard(id(value))
        return out

    def _enter(self, value: Any, path: str) -> None:
        # A config that contains itself would recurse forever; configs are trees.
        if id(value) in self._open:
            raise StepDeclarationError(
                self.step, "config refers to itself (configs must be trees)", field=path
            )
        self._open.add(id(value))


# -- the plain form: to_plain --------------------------------------------------------------------


def plain_float(value: float) -> Any:
    """Floats as identities write them: integral ones as ints, NaN and infinities as strings."""
    if math.isnan(value) or math.isinf(value):
        return repr(value)
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


class _Plain(ConfigWalk):
    """`to_plain`: dataclasses become dicts with their `__class__`, tuples lists, enums their
    value, floats canonical; strings under `prefix` relative to it."""

    def __init__(
        self,
        step: str,
        *,
        strict: bool,
        prefix: str | None = None,
        render: Callable[[OutputOf | ThisOutput], Any] | None = None,
    ) -> None:
        super().__init__(step)
        self.strict = strict
        self.prefix = prefix
        self.render = render
        self.plain_is_same = prefix is None  # with a prefix, strings change

    def fields(self, value: Any, kind: type) -> tuple[str, ...]:
        return identity_fields(value, kind)

    def visit_plain(self, value: Any) -> Any:
        if self.prefix is not None and type(value) is str:
            return relativize(value, self.prefix)
        return value

    def visit_plain_subclass(self, value: Any, path: str) -> Any:
        if self.prefix is not None and isinstance(value, str):
            return relativize(value, self.prefix)
        return value

    def visit_float(self, value: float, path: str) -> Any:
        return plain_float(value)

    def visit_output_of(self, value: OutputOf, path: str) -> Any:
        if self.render is not None:
            return self.render(value)
        upstream = value.step if isinstance(value.step, str) else value.step.name
        return {"__output_of__": upstream, "sub": value.sub}

    def visit_this_output(self, value: ThisOutput, path: str) -> Any:
        return self.render(value) if self.render is not None else {"__this_output__": value.sub}

    def visit_other(self, value: Any, path: str) -> Any:
        if self.strict:
            raise StepDeclarationError(
                self.step,
                f"versioned value of type {type(value).__name__} cannot be part of an identity; "
                "use None, bool, int, float, str, or lists, dicts and dataclasses of those",
                field=path or "<config>",
            )
        return repr(value)

    def odd_key(self, key: Any, path: str) -> Any:
        return super().odd_key(key, path) if self.strict else repr(key)

    def start_dataclass(self, value: Any) -> dict[str, Any]:
        return {"__class__": type(value).__qualname__}


def to_plain(
    step: str,
    path: str,
    value: Any,
    *,
    strict: bool,
    render: Callable[[OutputOf | ThisOutput], Any] | None = None,
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
    return _Plain(step, strict=strict, prefix=prefix, render=render).walk(value, path)


# -- references and the plain form in one walk: collect_refs ----------------------------------------


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
    (`pipeline.run.records.manifest_builder` reuses a manifest's encoded steps on that condition)."""


# Met by every walk, and named by the plain form itself: not among a config's `kinds`.
_NAMED_BY_PLAIN = frozenset({list, dict, Versioned, OutputOf, ThisOutput})


class _Collect(_Plain):
    """`collect_refs`: the plain form (not strict), with placeholders left in place and each
    one, and each versioned value, recorded by its dotted path."""

    def __init__(self, step: str, prefix: str | None) -> None:
        super().__init__(step, strict=False, prefix=prefix)
        self.versioned: dict[str, Any] = {}
        self.inputs: dict[str, OutputOf] = {}
        self.own_outputs: dict[str, ThisOutput] = {}
        self.in_versioned = False

    def visit_versioned(self, value: Versioned, path: str) -> Any:
        inner = value.value
        outer, self.in_versioned = self.in_versioned, True
        plain = self.walk(inner, path)
        self.in_versioned = outer
        if path not in self.versioned:
            # to_plain of a plain str, int, bool or None (without a prefix) is the value itself.
            simple = type(inner) in PLAIN_TYPES
            self.versioned[path] = inner if simple else to_plain(self.step, path, inner, strict=True)
        return plain

    def visit_output_of(self, value: OutputOf, path: str) -> Any:
        if self.in_versioned and not value.identity:
            raise StepDeclarationError(
                self.step,
                "output_of(..., identity=False) cannot be versioned: it stays out of identity",
                field=path,
            )
        self.inputs[path] = value
        return value

    def visit_this_output(self, value: ThisOutput, path: str) -> Any:
        self.own_outputs[path] = value
        return value

    def odd_key(self, key: Any, path: str) -> Any:
        return ConfigWalk.odd_key(self, key, path)


_KINDS: dict[frozenset[type], frozenset[type]] = {}


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
    walk = _Collect(step_name, prefix)
    plain = walk.walk(config)
    # Interned: the steps of a large DAG mostly share a handful of sets of types.
    met = frozenset(walk.met)
    kinds = _KINDS.get(met)
    if kinds is None:
        kinds = _KINDS[met] = met - _NAMED_BY_PLAIN
    return ConfigRefs(walk.versioned, walk.inputs, walk.own_outputs, plain, kinds)


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


# -- a copy with placeholders resolved: resolve_config ---------------------------------------------


class _Resolve(ConfigWalk):
    """`resolve_config`: placeholders resolved, versioned values unwrapped, everything else the
    same object (a container none of whose children changed is returned as it is)."""

    plain_is_same = True

    def __init__(self, resolve: Callable[[OutputOf | ThisOutput], Any]) -> None:
        super().__init__("")
        self.resolve = resolve

    def visit_output_of(self, value: OutputOf, path: str) -> Any:
        return self.resolve(value)

    def visit_this_output(self, value: ThisOutput, path: str) -> Any:
        return self.resolve(value)

    def visit_enum(self, value: enum.Enum, path: str) -> Any:
        return value

    def odd_key(self, key: Any, path: str) -> Any:
        return key

    def make_dataclass(self, value: Any, items: dict[str, Any], path: str) -> Any:
        changed = {name: new for name, new in items.items() if new is not getattr(value, name)}
        if not changed:
            return value
        # A shallow copy with its fields set directly: frozen dataclasses and fields with
        # init=False survive.
        clone = copy.copy(value)
        for name, new in changed.items():
            object.__setattr__(clone, name, new)
        return clone

    def make_list(self, value: list[Any], items: list[Any], path: str) -> Any:
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(items)

    make_tuple = make_list

    def make_namedtuple(self, value: tuple[Any, ...], items: list[Any], path: str) -> Any:
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        return type(value)(*items)

    def make_dict(self, value: dict[Any, Any], items: dict[Any, Any], path: str) -> Any:
        if all(items[k] is v for k, v in value.items()):
            return value
        out = copy.copy(value)  # its own type: OrderedDict, a defaultdict's factory
        out.update(items)
        return out


def resolve_config(config: Any, resolve: Callable[[OutputOf | ThisOutput], Any]) -> Any:
    """A copy of `config` with placeholders replaced by `resolve(...)` and versioned values unwrapped.

    Dataclasses are shallow-copied and their fields set directly, so frozen dataclasses and
    fields with `init=False` survive. Containers are rebuilt with their own type.
    """
    return _Resolve(resolve).walk(config)
