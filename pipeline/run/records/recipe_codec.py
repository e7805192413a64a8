"""The reversible JSON form of a recipe's configs: `encode_value` writes any config a step may
hold (dataclasses, enums, tuples, paths, placeholders, `versioned` markers) as JSON data, and
`decode_value` rebuilds the same objects from it, resolving each recorded `module:qualname`
reference through a `Resolver` that refuses what its marker does not allow. Used by
`pipeline.run.records.recipe`, which writes and rebuilds whole steps."""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.util
import math
import os
import runpy
import types
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

from pipeline.core.config_walk import ConfigWalk, join
from pipeline.core.dag import RECIPE_MODULE
from pipeline.errors import StepDeclarationError
from pipeline.step import OutputOf, Step, ThisOutput, Versioned

__all__ = [
    "MAIN_MODULE",
    "RecipeError",
    "Resolver",
    "decode_value",
    "encode_value",
    "importable_name",
    "module_name_for_file",
]

MAIN_MODULE = "__main__"
_MARKERS = (
    "__dataclass__",
    "__versioned__",
    "__output_of__",
    "__this_output__",
    "__tuple__",
    "__enum__",
    "__float__",
    "__dict__",
    "__path__",
)


class RecipeError(StepDeclarationError):
    """A step cannot be recorded in, or rebuilt from, a manifest."""


# -- recording ----------------------------------------------------------------------------------


def importable_name(obj: Any, main_module: str | None = None) -> str:
    """`module:qualname` of a function or class; `__main__` becomes `main_module` when known."""
    module = obj.__module__
    if module in (MAIN_MODULE, RECIPE_MODULE):
        # Code of the experiment file itself (also when a rerun loaded it from the recorded path).
        module = main_module or MAIN_MODULE
    return f"{module}:{obj.__qualname__}"


def module_name_for_file(path: str) -> str | None:
    """The dotted module name that imports the file at `path` (walking up through packages)."""
    path = os.path.abspath(path)
    directory, name = os.path.split(path)
    parts = [os.path.splitext(name)[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    if len(parts) == 1:
        # Importable only while its own directory is on sys.path (as when run as a script):
        # the file's path is the more faithful reference.
        return None
    dotted = ".".join(parts)
    try:
        spec = importlib.util.find_spec(dotted)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if origin is None or not os.path.exists(origin) or not os.path.samefile(origin, path):
        return None
    return dotted


class _Encode(ConfigWalk):
    """`encode_value`: every kind of value as JSON data `decode_value` rebuilds it from."""

    plain_is_same = True

    def __init__(self, labels: Mapping[int, str], step: str, main_module: str | None) -> None:
        super().__init__(step)
        self.labels = labels
        self.main_module = main_module

    def visit_float(self, value: float, path: str) -> Any:
        return value if math.isfinite(value) else {"__float__": repr(value)}

    def visit_versioned(self, value: Versioned, path: str) -> Any:
        return {"__versioned__": self.walk(value.value, path)}

    def visit_output_of(self, value: OutputOf, path: str) -> Any:
        # A Step is recorded by its label (unique in the DAG); a by-name reference stays a name.
        by_name = isinstance(value.step, str)
        upstream = value.step if by_name else self.labels[id(value.step)]
        return {
            "__output_of__": upstream,
            "ref": "name" if by_name else "label",
            "sub": value.sub,
            "blocking": value.blocking,
            **({} if value.identity else {"identity": False}),
        }

    def visit_this_output(self, value: ThisOutput, path: str) -> Any:
        return {"__this_output__": value.sub}

    def visit_enum(self, value: enum.Enum, path: str) -> Any:
        ref = importable_name(type(value), self.main_module)
        return {"__enum__": ref, "value": self.walk(value.value, path)}

    def visit_path(self, value: PurePath, path: str) -> Any:
        return {"__path__": str(value), "class": self._class_ref(type(value), path)}

    def visit_other(self, value: Any, path: str) -> Any:
        raise RecipeError(
            self.step,
            f"a value of type {type(value).__name__} cannot be recorded in a manifest; use None, bool, "
            "int, float, str, enums, paths, or lists, tuples, dicts and dataclasses of those",
            field=path or "config",
        )

    def odd_key(self, key: Any, path: str) -> Any:
        raise RecipeError(self.step, "dict keys must be strings to be recorded in a manifest", field=path)

    def make_dataclass(self, value: Any, items: dict[str, Any], path: str) -> Any:
        return {"__dataclass__": self._class_ref(type(value), path), "fields": items}

    def make_tuple(self, value: tuple[Any, ...], items: list[Any], path: str) -> Any:
        return {"__tuple__": items}

    def make_namedtuple(self, value: tuple[Any, ...], items: list[Any], path: str) -> Any:
        return {"__tuple__": items, "class": self._class_ref(type(value), path)}

    def make_dict(self, value: dict[Any, Any], items: dict[Any, Any], path: str) -> Any:
        return {"__dict__": items} if any(k in _MARKERS for k in items) else items

    def _class_ref(self, cls: type, path: str) -> str:
        if "<locals>" in cls.__qualname__:
            raise RecipeError(
                self.step,
                f"class {cls.__qualname__} is defined inside a function; define config classes at "
                "module level so that a manifest can rebuild them",
                field=path or "config",
            )
        return importable_name(cls, self.main_module)


def encode_value(
    value: Any, labels: Mapping[int, str], step: str, path: str = "", main_module: str | None = None
) -> Any:
    """`value` as reversible JSON data; `labels` maps `id(Step)` to that step's label.

    `main_module` is the importable name of the experiment file, for code defined in `__main__`.
    """
    return _Encode(labels, step, main_module).walk(value, path)


# -- rebuilding ---------------------------------------------------------------------------------


class Resolver:
    """Imports `module:qualname` references. `__main__` ones (defined in the experiment file) come
    from the file the user named (`--source FILE`), never from a file the manifest names: a
    manifest is data anyone may have edited, and executing a file runs whatever it holds."""

    def __init__(self, source_file: str | None, named: str | None = None) -> None:
        self.source_file = source_file
        self.named = named
        self._main: types.SimpleNamespace | None = None

    def __call__(self, ref: str, step: str, field: str, *, moved_from: frozenset[str] = frozenset()) -> Any:
        module_name, _, qualname = ref.partition(":")
        if not qualname:
            raise RecipeError(step, f"malformed reference {ref!r} (expected module:qualname)", field=field)
        try:
            if module_name == MAIN_MODULE:
                return self._lookup(self._main_namespace(step, field), qualname)
            return self._lookup(importlib.import_module(module_name), qualname)
        except (ImportError, AttributeError) as e:
            moved = moved_reference(ref)
            if moved is not None and moved not in moved_from:  # a table that loops ends here
                return self(moved, step, field, moved_from=moved_from | {ref})
            raise RecipeError(
                step,
                f"cannot import {ref} ({e}); is the code that wrote this manifest installed?",
                field=field,
            ) from e

    @staticmethod
    def _lookup(obj: Any, qualname: str) -> Any:
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def _main_namespace(self, step: str, field: str) -> types.SimpleNamespace:
        if self._main is None:
            if self.named is None:
                raise RecipeError(
                    step,
                    f"is defined in the experiment file {self.source_file!r}, and Drydock does not run a "
                    "file a manifest names; to run it, name it yourself: --source FILE (or run the "
                    "file), or move the code into an importable module",
                    field=field,
                )
            if not os.path.isfile(self.named):
                raise RecipeError(step, f"--source {self.named!r} is not a file", field="--source")
            # Not as __main__: the file declares its steps but must not run executor_main.
            self._main = types.SimpleNamespace(**runpy.run_path(self.named, run_name=RECIPE_MODULE))
        return self._main


MOVED_TABLE = "MOVED"
"""The name of the table a package keeps of what moved in it: `{old: new}`, each a module path
(`"steps.train_moe": "steps.training.train_moe"`: everything in it) or a reference
(`"steps.scaling:ScalingFitConfig": "steps.scaling.fit:ScalingFitConfig"`: that name)."""


def moved_reference(ref: str) -> str | None:
    """Where `module:qualname`, recorded by an older layout of its package, lives now, from a
    `MOVED` table in the module or one of the packages above it (`steps.MOVED`), or None.
    Consulted only for a reference that no longer imports, here where manifests are decoded:
    nothing is installed in the import system, and code importing an old path fails as it should."""
    module_name, _, qualname = ref.partition(":")
    parts = module_name.split(".")
    for package in (".".join(parts[:end]) for end in range(len(parts), 0, -1)):
        try:
            table = getattr(importlib.import_module(package), MOVED_TABLE, None)
        except ImportError:
            continue
        if not isinstance(table, Mapping):
            continue
        moved = table.get(ref)
        if isinstance(moved, str) and moved != ref:
            return moved
        # The longest moved module that holds it: `steps.moe` for `steps.moe.sub:X` as for `steps.moe:X`.
        for end in range(len(parts), 0, -1):
            new = table.get(".".join(parts[:end]))
            if isinstance(new, str):
                target = ".".join([new, *parts[end:]])
                return None if target == module_name else f"{target}:{qualname}"
    return None


def decode_value(
    data: Any, steps: Mapping[str, Step], resolve: Callable[[str, str, str], Any], step: str, path: str = ""
) -> Any:
    """Inverse of `encode_value`; `steps` maps labels of already rebuilt upstream steps."""
    if isinstance(data, list):
        return [decode_value(v, steps, resolve, step, join(path, i)) for i, v in enumerate(data)]
    if not isinstance(data, dict):
        return data
    if "__versioned__" in data:
        return Versioned(decode_value(data["__versioned__"], steps, resolve, step, path))
    if "__output_of__" in data:
        upstream = data["__output_of__"]
        target: Step | str = upstream
        if data.get("ref") == "label":
            if upstream not in steps:
                raise RecipeError(
                    step,
                    f"points at step {upstream!r}, which the manifest does not list before it",
                    field=path,
                )
            target = steps[upstream]
        return OutputOf(
            target, data.get("sub"), data.get("blocking", True), data.get("identity", True) is not False
        )
    if "__this_output__" in data:
        return ThisOutput(data["__this_output__"])
    if "__float__" in data:
        return float(data["__float__"])
    # Each marker builds only its own kind of class: a manifest naming any other callable (say
    # `os:system`) is refused before it is called.
    if "__tuple__" in data:
        items = [
            decode_value(v, steps, resolve, step, join(path, i)) for i, v in enumerate(data["__tuple__"])
        ]
        if "class" not in data:
            return tuple(items)
        cls = _checked(
            resolve(data["class"], step, path), data["class"], _is_namedtuple, "a namedtuple", step, path
        )
        return cls(*items)
    if "__path__" in data:
        cls = _checked(
            resolve(data["class"], step, path), data["class"], _is_path_class, "a path class", step, path
        )
        return cls(str(data["__path__"]))
    if "__enum__" in data:
        cls = _checked(
            resolve(data["__enum__"], step, path), data["__enum__"], _is_enum, "an enum", step, path
        )
        return cls(decode_value(data["value"], steps, resolve, step, path))
    if "__dataclass__" in data:
        cls = resolve(data["__dataclass__"], step, path)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise RecipeError(
                step, f"{data['__dataclass__']} is no longer a dataclass", field=path or "config"
            )
        values = {
            name: decode_value(v, steps, resolve, step, join(path, name))
            for name, v in data["fields"].items()
        }
        return _build_dataclass(cls, values, step, path)
    if "__dict__" in data:
        data = data["__dict__"]
    return {k: decode_value(v, steps, resolve, step, join(path, k)) for k, v in data.items()}


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, tuple) and hasattr(obj, "_fields")


def _is_path_class(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, PurePath)


def _is_enum(obj: Any) -> bool:
    return isinstance(obj, type) and issubclass(obj, enum.Enum)


def _checked(obj: Any, ref: Any, test: Callable[[Any], bool], kind: str, step: str, path: str) -> Any:
    """`obj` if `test(obj)`, else the RecipeError that names the step, the field and `ref`."""
    if not test(obj):
        raise RecipeError(
            step, f"{ref} is not {kind}; a recipe builds nothing else here", field=path or "config"
        )
    return obj


def _build_dataclass(cls: type, values: Mapping[str, Any], step: str, path: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise RecipeError(
            step,
            f"{cls.__qualname__} no longer has field(s) {', '.join(unknown)} recorded in the manifest",
            field=path or "config",
        )
    init = {name: v for name, v in values.items() if fields[name].init}
    try:
        obj = cls(**init)
    except Exception as e:  # the class's own __init__/__post_init__ validation
        raise RecipeError(step, f"cannot rebuild {cls.__qualname__}: {e}", field=path or "config") from e
    # Exactly the recorded values, also for fields that __post_init__ derives or init=False hides.
    for name, v in values.items():
        object.__setattr__(obj, name, v)
    return obj
