"""Recipes: write a DAG's steps into its manifest, and rebuild the same steps from it.

The manifest (`pipeline.storage.manifests`) records, per step, its function's import path and its
config in a reversible JSON form, so `drydock rerun MANIFEST` can rebuild the DAG without the
experiment file: every dataclass, enum, tuple, placeholder and `versioned` marker comes back as
it was, so the rebuilt steps have the identities the manifest lists.

    {"__dataclass__": "steps.training.train_moe:TrainMoeConfig", "fields": {...}}
    {"__versioned__": 3}      {"__output_of__": "tokenized/x-0123abcd4567", "ref": "label", "sub": ...}
    {"__this_output__": null} {"__tuple__": [...]}  {"__enum__": "mod:Cls", "value": ...}
    {"__float__": "nan"}      {"__dict__": {...}}   (a dict whose keys could be mistaken for markers)

Code is recorded by reference (`module:qualname`), not by value: a recipe reruns against the
code that is installed. A function or class defined in the experiment file run as a script lives
in `__main__`; it is recorded under the file's importable module name when there is one
(`experiments.hello`), otherwise by the file's path, which `rerun` executes to find it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import importlib.util
import math
import os
import runpy
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import PurePath
from typing import Any

from pipeline.core.configs import resolve_config
from pipeline.core.dag import RECIPE_MODULE, Dag
from pipeline.errors import StepDeclarationError
from pipeline.step import OutputOf, Resources, Step, ThisOutput, Versioned, hooks_of, is_step_function
from pipeline.storage.manifests import load_manifest

__all__ = [
    "RecipeError",
    "encode_step",
    "iter_recipes",
    "load_recipe",
    "rebuild_recipe",
    "recipe_code",
    "recipe_entries",
    "remap_recipe",
    "rerun_argv",
    "steps_from_manifest",
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


def encode_value(
    value: Any, labels: Mapping[int, str], step: str, path: str = "", main_module: str | None = None
) -> Any:
    """`value` as reversible JSON data; `labels` maps `id(Step)` to that step's label.

    `main_module` is the importable name of the experiment file, for code defined in `__main__`.
    """
    if type(value) in _PLAIN:  # the common case first: configs are mostly plain values
        return value
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, Versioned):
        return {"__versioned__": encode_value(value.value, labels, step, path, main_module)}
    if isinstance(value, OutputOf):
        # A Step is recorded by its label (unique in the DAG); a by-name reference stays a name.
        by_name = isinstance(value.step, str)
        upstream = value.step if by_name else labels[id(value.step)]
        return {
            "__output_of__": upstream,
            "ref": "name" if by_name else "label",
            "sub": value.sub,
            "blocking": value.blocking,
            **({} if value.identity else {"identity": False}),
        }
    if isinstance(value, ThisOutput):
        return {"__this_output__": value.sub}
    if isinstance(value, enum.Enum):
        ref = importable_name(type(value), main_module)
        return {"__enum__": ref, "value": encode_value(value.value, labels, step, path, main_module)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            name: encode_value(getattr(value, name), labels, step, _join(path, name), main_module)
            for name in _field_names(type(value))
        }
        return {"__dataclass__": _class_ref(type(value), step, path, main_module), "fields": fields}
    if isinstance(value, PurePath):
        return {"__path__": str(value), "class": _class_ref(type(value), step, path, main_module)}
    if isinstance(value, tuple):
        items = [encode_value(v, labels, step, _join(path, i), main_module) for i, v in enumerate(value)]
        if hasattr(value, "_fields"):  # namedtuple
            return {"__tuple__": items, "class": _class_ref(type(value), step, path, main_module)}
        return {"__tuple__": items}
    if isinstance(value, list):
        return [encode_value(v, labels, step, _join(path, i), main_module) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise RecipeError(step, "dict keys must be strings to be recorded in a manifest", field=path)
        out = {k: encode_value(v, labels, step, _join(path, k), main_module) for k, v in value.items()}
        return {"__dict__": out} if any(k in _MARKERS for k in value) else out
    raise RecipeError(
        step,
        f"a value of type {type(value).__name__} cannot be recorded in a manifest; use None, bool, "
        "int, float, str, enums, paths, or lists, tuples, dicts and dataclasses of those",
        field=path or "config",
    )


@functools.lru_cache(maxsize=1024)
def _field_names(cls: type) -> tuple[str, ...]:
    # dataclasses.fields() builds a fresh tuple per call; a large DAG asks per config, per run.
    return tuple(f.name for f in dataclasses.fields(cls))


_PLAIN = frozenset({str, int, bool, type(None)})


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _class_ref(cls: type, step: str, path: str, main_module: str | None) -> str:
    if "<locals>" in cls.__qualname__:
        raise RecipeError(
            step,
            f"class {cls.__qualname__} is defined inside a function; define config classes at "
            "module level so that a manifest can rebuild them",
            field=path or "config",
        )
    return importable_name(cls, main_module)


def encode_step(
    dag: Dag, label: str, labels: Mapping[int, str], main_module: str | None = None
) -> dict[str, Any]:
    """The `recipe` entry of one manifest step: everything `Step(...)` was called with."""
    step = dag.nodes[label].step
    if step.resources == _DEFAULT_RESOURCES:  # most steps: encoded once, not once per step
        resources = _DEFAULT_RESOURCES_ENCODED
    else:
        resources = encode_value(step.resources, labels, step.name, "resources", main_module)
    return {
        "fn": importable_name(step.fn, main_module),
        "version": step.version,
        "description": step.description,
        "config": encode_value(step.config, labels, step.name, "", main_module),
        "resources": resources,
    }


_DEFAULT_RESOURCES = Resources()
_DEFAULT_RESOURCES_ENCODED = encode_value(_DEFAULT_RESOURCES, {}, "", "resources")


def recipe_entries(dag: Dag, source_file: str | None = None) -> dict[str, dict[str, Any] | str]:
    """The recipe of every step by label; a step that cannot be recorded gets its error message.

    A recipe that cannot be recorded does not stop the run: the manifest says why, and only
    `drydock rerun` of that manifest fails, naming the step and field. `source_file` is the
    experiment file, whose code runs as `__main__`.
    """
    return dict(iter_recipes(dag, source_file))


def iter_recipes(dag: Dag, source_file: str | None = None) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """`recipe_entries` one step at a time: a manifest encodes each as it comes, so the recipes of
    a large DAG never all exist as objects at once."""
    main_module = module_name_for_file(source_file) if source_file else None
    # Every declared Step object maps to its de-duplicated node's label.
    labels: dict[int, str] = {}
    for label, node in dag.nodes.items():
        labels[id(node.step)] = label
        for path, upstream in node.inputs.items():
            placeholder = node.refs.inputs[path]
            if isinstance(placeholder.step, Step):
                labels[id(placeholder.step)] = upstream
    for label in dag.nodes:
        try:
            yield label, encode_step(dag, label, labels, main_module)
        except RecipeError as e:
            yield label, str(e)


# -- rebuilding ---------------------------------------------------------------------------------


class _Resolver:
    """Imports `module:qualname` references. `__main__` ones (defined in the experiment file) come
    from the file the user named (`--source FILE`), never from a file the manifest names: a
    manifest is data anyone may have edited, and executing a file runs whatever it holds."""

    def __init__(self, source_file: str | None, named: str | None = None) -> None:
        self.source_file = source_file
        self.named = named
        self._main: types.SimpleNamespace | None = None

    def __call__(self, ref: str, step: str, field: str) -> Any:
        module_name, _, qualname = ref.partition(":")
        if not qualname:
            raise RecipeError(step, f"malformed reference {ref!r} (expected module:qualname)", field=field)
        try:
            if module_name == MAIN_MODULE:
                obj: Any = self._main_namespace(step, field)
            else:
                obj = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise RecipeError(
                step,
                f"cannot import {ref} ({e}); is the code that wrote this manifest installed?",
                field=field,
            ) from e
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


def decode_value(
    data: Any, steps: Mapping[str, Step], resolve: Callable[[str, str, str], Any], step: str, path: str = ""
) -> Any:
    """Inverse of `encode_value`; `steps` maps labels of already rebuilt upstream steps."""
    if isinstance(data, list):
        return [decode_value(v, steps, resolve, step, _join(path, i)) for i, v in enumerate(data)]
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
            decode_value(v, steps, resolve, step, _join(path, i)) for i, v in enumerate(data["__tuple__"])
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
            name: decode_value(v, steps, resolve, step, _join(path, name))
            for name, v in data["fields"].items()
        }
        return _build_dataclass(cls, values, step, path)
    if "__dict__" in data:
        data = data["__dict__"]
    return {k: decode_value(v, steps, resolve, step, _join(path, k)) for k, v in data.items()}


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


def steps_from_manifest(
    manifest: Mapping[str, Any], source: str | None = None
) -> tuple[list[Step], list[Step]]:
    """Rebuild every step of a manifest. Returns (all steps in manifest order, the root steps).

    Only step functions run: a function declared with `step_function`, or one defined in the
    experiment file, which must be named by the user (`source`); anything else is a
    `RecipeError` before any step is rebuilt.
    """
    resolve = _Resolver(manifest.get("source_file"), source)
    for entry in manifest.get("steps", []):
        _check_code(entry)
    rebuilt: dict[str, Step] = {}
    for entry in manifest["steps"]:
        label, name = entry.get("label"), entry.get("name")
        recipe = entry.get("recipe")
        if isinstance(recipe, str):  # recorded as the reason it could not be recorded
            raise RecipeError(name, f"was not recorded in the manifest: {recipe}", field="recipe")
        if not isinstance(recipe, dict):
            raise RecipeError(
                name,
                "the manifest has no recipe for this step (written by an older Drydock); "
                "rerun the experiment file instead",
                field="recipe",
            )
        fn = resolve(recipe["fn"], name, "fn")
        if not (str(recipe["fn"]).startswith(f"{MAIN_MODULE}:") or is_step_function(fn)):
            raise RecipeError(
                name,
                f"{recipe['fn']} is not a step function (declared with pipeline.step_function); a "
                "shared recipe runs nothing else",
                field="fn",
            )
        config = decode_value(recipe["config"], rebuilt, resolve, name)
        _run_check(fn, config, name)
        resources = decode_value(recipe["resources"], rebuilt, resolve, name, "resources")
        if not isinstance(resources, Resources):
            raise RecipeError(name, "recorded resources are not a Resources", field="resources")
        rebuilt[label] = Step(
            name=name,
            fn=fn,
            config=config,
            description=recipe.get("description", ""),
            resources=resources,
            version=recipe.get("version"),
        )
    roots = [rebuilt[label] for label in manifest.get("roots", []) if label in rebuilt]
    return list(rebuilt.values()), roots or list(rebuilt.values())


def _run_check(fn: Callable[..., Any], config: Any, name: str | None) -> None:
    """The step library's own checks of a rebuilt config (`StepHooks.check`): a manifest's config
    did not come through the helper that checks it when a file declares the step."""
    check = hooks_of(fn).check
    if check is None:
        return
    try:
        # Versioned values unwrapped, as the helper saw them; paths stay placeholders.
        check(resolve_config(config, lambda placeholder: placeholder))  # type: ignore[arg-type,return-value]
    except ValueError as e:
        field, sep, message = str(e).partition(": ")
        if not sep or " " in field.split("(")[0].strip():
            field, message = "config", str(e)
        raise RecipeError(name, message, field=field) from e


def _check_code(entry: Any) -> None:
    """A manifest entry's recorded function must be a `module:qualname` string."""
    recipe = entry.get("recipe") if isinstance(entry, dict) else None
    if isinstance(recipe, dict) and not (isinstance(recipe.get("fn"), str) and ":" in recipe["fn"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        raise RecipeError(name, f"malformed function reference {recipe.get('fn')!r}", field="fn")


def recipe_code(manifest: Mapping[str, Any]) -> dict[str, list[str]]:
    """The code a manifest's recipe runs: each recorded function (`module:qualname`) and the steps
    that run it, for a person to read before running someone else's recipe."""
    out: dict[str, list[str]] = {}
    for entry in manifest.get("steps", []):
        recipe = entry.get("recipe") if isinstance(entry, dict) else None
        if isinstance(recipe, dict) and isinstance(recipe.get("fn"), str):
            out.setdefault(recipe["fn"], []).append(str(entry.get("name")))
    return out


def load_recipe(
    location: str, source: str | None = None, remaps: Sequence[tuple[str, str]] = ()
) -> tuple[dict[str, Any], list[Step]]:
    """Read the manifest at `location` and rebuild its root steps, checking their identities.

    The rebuilt DAG must have exactly the recorded labels: a difference means the installed code
    is not the code that wrote the manifest (a config class gained a field, say), and the rerun
    would quietly compute different steps, so it is an error that names them.
    """
    manifest = load_manifest(location)
    if remaps:
        manifest = remap_recipe(manifest, remaps)
    return manifest, rebuild_recipe(manifest, location, source)


def rebuild_recipe(manifest: dict[str, Any], location: str, source: str | None = None) -> list[Step]:
    """The root steps of a loaded manifest's recipe, their identities checked (see `load_recipe`)."""
    from pipeline.core.dag import build_dag

    _all, roots = steps_from_manifest(manifest, source)
    # Identities do not depend on the prefix (paths under it are relative), so any prefix will do.
    dag = build_dag(roots, manifest.get("prefix") or "memory://recipe")
    recorded = [entry["label"] for entry in manifest["steps"]]
    missing = [label for label in recorded if label not in dag.nodes]
    if missing or len(dag.nodes) != len(recorded):
        extra = [label for label in dag.nodes if label not in set(recorded)]
        raise RecipeError(
            None,
            f"the installed code rebuilds different identities than {location} records: "
            f"recorded {', '.join(missing[:3]) or '-'}, rebuilt {', '.join(extra[:3]) or '-'}; "
            "check out the commit the manifest names (`git`) to rerun it exactly",
            field="MANIFEST",
        )
    return roots


def remap_recipe(manifest: Mapping[str, Any], remaps: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """`manifest` with every path its steps' configs record under an `OLD` of `remaps` moved under
    its `NEW` (`--remap /home/alice/drydock=/home/bob/drydock`: where a colleague's checkout, data
    or tokenizer lives here). A path is under OLD if it is OLD or starts with `OLD/`. Identities
    do not change where a path is kept out of them (an input root; content-addressed inputs).
    An OLD that no recorded path starts with is a `RecipeError` (a typo would silently do nothing)."""
    used = {old: False for old, _new in remaps}

    def move(value: Any) -> Any:
        if isinstance(value, str):
            for old, new in remaps:
                base = old.rstrip("/")
                if value == base or value.startswith(base + "/"):
                    used[old] = True
                    return new.rstrip("/") + value[len(base) :]
            return value
        if isinstance(value, list):
            return [move(v) for v in value]
        if isinstance(value, dict):
            return {k: move(v) for k, v in value.items()}
        return value

    out = dict(manifest)
    out["steps"] = [
        {**entry, "recipe": {**entry["recipe"], "config": move(entry["recipe"].get("config"))}}
        if isinstance(entry, dict) and isinstance(entry.get("recipe"), dict)
        else entry
        for entry in manifest.get("steps", [])
    ]
    unused = [old for old, hit in used.items() if not hit]
    if unused:
        raise RecipeError(None, f"no path the recipe records is under {unused[0]!r}", field="--remap")
    return out


def rerun_argv(manifest: Mapping[str, Any], options: Sequence[str]) -> list[str]:
    """The executor options of a rerun: the recorded prefix and experiment name unless given."""
    argv = list(options)
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    if "--prefix" not in given and manifest.get("prefix"):
        argv += ["--prefix", manifest["prefix"]]
    if "--experiment" not in given and manifest.get("experiment"):
        argv += ["--experiment", manifest["experiment"]]
    return argv
