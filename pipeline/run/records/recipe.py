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

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pipeline.core.config_walk import resolve_config
from pipeline.core.dag import Dag
from pipeline.run.records.recipe_codec import (
    MAIN_MODULE,
    RecipeError,
    Resolver,
    decode_value,
    encode_value,
    importable_name,
    module_name_for_file,
)
from pipeline.step import Resources, Step, hooks_of, is_step_function
from pipeline.storage.manifests import load_manifest

__all__ = [
    "MAIN_MODULE",
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


def steps_from_manifest(
    manifest: Mapping[str, Any], source: str | None = None
) -> tuple[list[Step], list[Step]]:
    """Rebuild every step of a manifest. Returns (all steps in manifest order, the root steps).

    Only step functions run: a function declared with `step_function`, or one defined in the
    experiment file, which must be named by the user (`source`); anything else is a
    `RecipeError` before any step is rebuilt.
    """
    resolve = Resolver(manifest.get("source_file"), source)
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
