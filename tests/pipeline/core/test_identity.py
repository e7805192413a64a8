"""Step identity: what enters it, what does not, and that it is the same everywhere.

Properties are checked with hypothesis on DAGs built by `build_dag`, the way the executor
computes identities.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from pipeline.core.config_walk import to_plain
from pipeline.core.dag import Dag, build_dag
from pipeline.core.graph import descendants
from pipeline.core.identity import (
    HASH_CHARS,
    canonical_json,
    compact_json_encoder,
    compute_identity,
    relativize,
)
from pipeline.step import Resources, Step, output_of, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, fail, write_value

REPO = Path(__file__).resolve().parents[3]
PREFIXES = ["/a/x", "memory://b", "s3://c/d"]

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Cfg:
    output: Any = None
    value: Any = None
    inputs: Any = field(default_factory=list)
    extra: Any = None
    nested: Any = None


@dataclass(frozen=True)
class Inner:
    a: Any = None
    b: Any = None


def fn(config: Cfg) -> None:
    """A step function; identities never run it."""


def other_fn(config: Cfg) -> None:
    """Another step function with the same signature."""


def step(name: str = "s", value: Any = 0, *, inputs: Any = (), version: str | None = None, **kw: Any) -> Step:
    """A step whose identity is `name`, `version`, `versioned(value)` and `inputs`."""
    cfg = Cfg(output=this_output(), value=versioned(value), inputs=list(inputs), **kw)
    return Step(name, fn, cfg, version=version)


def labels(roots: list[Step], prefix: str = "/p") -> dict[str, str]:
    """Step name -> label."""
    dag = build_dag(roots, prefix)
    return {node.name: label for label, node in dag.nodes.items()}


def label(s: Step, prefix: str = "/p") -> str:
    return labels([s], prefix)[s.name]


def canonical(v: Any, prefix: str = "/p") -> str:
    """How `v` enters identity under `prefix`."""
    return canonical_json(relativize(to_plain("s", "v", v, strict=True), prefix))


# Versioned values: everything to_plain accepts (NaN and inf included, they become strings).
keys = st.text(max_size=6)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["", "/", "${prefix}", "nan", "3"])
)
values = st.recursive(
    leaves, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=4), max_leaves=12
)
names = st.from_regex(r"[a-z][a-z0-9_]{0,6}(/[a-z0-9][a-z0-9._-]{0,6}){0,2}", fullmatch=True)
# No part starts with a dot: `..` and `.` are refused as sub-paths (as they must be).
subs = st.none() | st.from_regex(r"[a-z0-9_]{1,6}(/[a-z0-9_][a-z0-9_.]{0,5}){0,2}", fullmatch=True)


def reorder(v: Any) -> Any:
    """The same value with every dict's insertion order reversed."""
    if isinstance(v, dict):
        return {k: reorder(v[k]) for k in reversed(list(v))}
    if isinstance(v, list):
        return [reorder(x) for x in v]
    return v


# Format


@given(name=names, value=values)
@FAST
def test_label_is_name_dash_12_hex(name: str, value: Any) -> None:
    dag = build_dag([step(name, value)], "/p")
    (node,) = dag.nodes.values()
    ident = node.identity
    assert re.fullmatch(rf"{re.escape(name)}-[0-9a-f]{{{HASH_CHARS}}}", ident.label)
    assert HASH_CHARS == 12
    assert re.fullmatch(r"[0-9a-f]{64}", ident.hash)
    assert ident.short == ident.hash[:12] and ident.label == f"{name}-{ident.short}"
    assert node.output_path == f"/p/{ident.label}"


def test_identity_is_sha256_of_canonical_payload() -> None:
    import hashlib

    ident = compute_identity("a/b", "2", {"x.y": [1, "z"]}, {"in": ("f" * 64, "sub")}, "/p")
    assert ident.payload == {
        "name": "a/b",
        "version": "2",
        "versioned": {"x.y": [1, "z"]},
        "inputs": {"in": ["f" * 64, "sub"]},
    }
    assert ident.hash == hashlib.sha256(canonical_json(ident.payload).encode()).hexdigest()


def test_identity_is_pinned() -> None:
    # These labels are in every cached output's path: if this test fails, every existing cache
    # would silently be recomputed. Change them only on purpose, with a note in the changelog.
    up = Step("raw/hello", write_value, WriteConfig(output=this_output(), value=versioned(10)))
    down = Step(
        "counts/hello",
        write_value,
        WriteConfig(output=this_output(), inputs=[output_of(up, "rows.jsonl")], value=versioned(3.0)),
    )
    expected = {"raw/hello": "raw/hello-1f3a9f3fc6b0", "counts/hello": "counts/hello-dc39b9a5c905"}
    assert labels([down], "gs://bucket/runs") == expected
    assert labels([down], "/tmp/elsewhere") == expected


def test_canonical_json_is_compact_sorted_and_rejects_nan() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": None, "c": "é"}]}) == '{"a":[1,{"c":"é","d":null}],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": math.nan})


@given(value=values, ensure_ascii=st.booleans())
@FAST
def test_compact_encoder_writes_what_json_dumps_writes(value: Any, ensure_ascii: bool) -> None:
    """The reusable encoder (built once, not per call) is a drop-in for json.dumps: identities
    and drift digests recorded before it must still match."""
    encode = compact_json_encoder(ensure_ascii=ensure_ascii, allow_nan=True, default=repr)
    expected = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii, default=repr
    )
    assert encode(value) == expected
    if not any(isinstance(x, float) and not math.isfinite(x) for x in _leaves(value)):
        plain = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        assert canonical_json(value) == plain


def test_compact_encoder_renders_unknown_objects_through_default() -> None:
    class Thing:
        pass

    encode = compact_json_encoder(default=lambda v: f"<{type(v).__name__}>")
    assert encode({"b": [Thing()], "a": "é"}) == '{"a":"\\u00e9","b":["<Thing>"]}'
    with pytest.raises(TypeError):
        compact_json_encoder()({"x": Thing()})


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


# Stable across processes


STABILITY_SCRIPT = r"""
import json, sys
from pipeline.core.dag import build_dag
from pipeline.step import Step, output_of, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

out = []
for case in json.load(sys.stdin):
    up = Step(case["up_name"], write_value, WriteConfig(output=this_output(), value=versioned(case["up"])))
    down = Step(
        case["name"],
        write_value,
        WriteConfig(output=this_output(), value=versioned(case["value"]),
                    inputs=[output_of(up, case["sub"])]),
        version=case["version"],
    )
    dag = build_dag([down], case["prefix"])
    out.append({n.name: label for label, n in dag.nodes.items()})
print(json.dumps(out))
"""


def in_process(cases: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for case in cases:
        up = Step(
            case["up_name"], write_value, WriteConfig(output=this_output(), value=versioned(case["up"]))
        )
        down = Step(
            case["name"],
            write_value,
            WriteConfig(
                output=this_output(), value=versioned(case["value"]), inputs=[output_of(up, case["sub"])]
            ),
            version=case["version"],
        )
        out.append(labels([down], case["prefix"]))
    return out


def in_subprocess(cases: list[dict[str, Any]], hash_seed: str) -> list[dict[str, str]]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    proc = subprocess.run(
        [sys.executable, "-c", STABILITY_SCRIPT],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


cases = st.fixed_dictionaries(
    {
        "name": names.filter(lambda n: n != "up"),
        "up_name": st.just("up"),
        "up": values,
        "value": values,
        "sub": subs,
        "version": st.none() | st.text(max_size=5),
        "prefix": st.sampled_from(PREFIXES),
    }
)


@given(batch=st.lists(cases, min_size=80, max_size=100))
# One batch, in two fresh interpreters with different hash seeds; no shrinking, so a failure
# costs no extra subprocesses (the assertion shows the failing case).
@settings(max_examples=1, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
def test_identity_is_stable_across_processes(batch: list[dict[str, Any]]) -> None:
    # Python's json carries every generated value exactly (NaN and dict order included).
    here = in_process(batch)
    for seed in ("0", "4242"):
        there = in_subprocess(batch, seed)
        for case, a, b in zip(batch, here, there, strict=True):
            assert a == b, case


# Independent of dict insertion order


@given(value=values)
@FAST
def test_independent_of_dict_insertion_order(value: Any) -> None:
    a = step("s", value, nested=Inner(a=versioned({"x": 1, "y": value})))
    b = step("s", reorder(value), nested=Inner(a=versioned(reorder({"x": 1, "y": value}))))
    assert label(a) == label(b)


def test_independent_of_dict_order_explicit() -> None:
    assert label(step(value={"a": 1, "b": {"c": 2, "d": 3}})) == label(
        step(value={"b": {"d": 3, "c": 2}, "a": 1})
    )


# Independent of the prefix


# No sub-path part starts with a dot here: `..` and `.` are refused (as they must be), which a
# generated suffix hit once in a few hundred runs.
@given(
    value=values,
    suffix=st.from_regex(r"[a-z0-9_-][a-z0-9_.-]{0,7}(/[a-z0-9_-][a-z0-9_.-]{0,7}){0,2}", fullmatch=True),
)
@FAST
def test_independent_of_prefix(value: Any, suffix: str) -> None:
    def dag_under(prefix: str) -> Dag:
        up = step("up", [value, f"{prefix}/{suffix}"])
        down = step(
            "down",
            {"data": f"{prefix}/{suffix}", "root": prefix, "list": [f"{prefix}/x"]},
            inputs=[output_of(up, suffix)],
            nested=Inner(a=versioned(f"{prefix}/{suffix}"), b=f"{prefix}/unversioned"),
        )
        return build_dag([down], prefix)

    dags = [dag_under(p) for p in PREFIXES]
    assert len({tuple(d.nodes) for d in dags}) == 1
    for d, p in zip(dags, PREFIXES, strict=True):
        for label_, node in d.nodes.items():
            assert node.output_path == f"{p}/{label_}"
    down_payload = next(n for n in dags[0].nodes.values() if n.name == "down").identity.payload
    assert down_payload["versioned"]["value"] == {
        "data": f"${{prefix}}/{suffix}",
        "root": "${prefix}",
        "list": ["${prefix}/x"],
    }
    assert down_payload["versioned"]["nested.a"] == f"${{prefix}}/{suffix}"


def test_prefix_with_trailing_slash_is_the_same_prefix() -> None:
    def one(prefix: str) -> str:
        return label(step(value=f"{prefix.rstrip('/')}/data"), prefix)

    assert one("s3://c/d") == one("s3://c/d/") == one("/a/x/") == one("/a/x")


def test_strings_outside_the_prefix_are_not_relativized() -> None:
    assert relativize("s3://c/dd/x", "s3://c/d") == "s3://c/dd/x"
    assert relativize("/a/xy", "/a/x") == "/a/xy"
    assert relativize("x/a/x/y", "/a/x") == "x/a/x/y"
    assert relativize({"k": ["/a/x/y", "/a/x", 3, None]}, "/a/x") == {
        "k": ["${prefix}/y", "${prefix}", 3, None]
    }
    # A path that only looks like one under the prefix is part of identity as written.
    assert label(step(value="s3://c/dd/x"), "s3://c/d") != label(step(value="/a/xd/x"), "/a/x")


def test_a_path_under_another_prefix_is_not_relativized() -> None:
    # gs://a/data read from a recipe run under s3://b is an absolute external path.
    assert label(step(value="gs://a/data"), "s3://b") != label(step(value="s3://b/data"), "s3://b")
    assert label(step(value="gs://a/data"), "s3://b") == label(step(value="gs://a/data"), "s3://c")


# Changes when what it is made of changes


@given(v1=values, v2=values)
@FAST
def test_changes_iff_a_versioned_value_changes(v1: Any, v2: Any) -> None:
    same = canonical(v1) == canonical(v2)
    assert (label(step("s", v1)) == label(step("s", v2))) == same
    # ... wherever the value sits.
    deep1 = step("s", 0, nested=Inner(b={"k": [1, versioned(v1)]}))
    deep2 = step("s", 0, nested=Inner(b={"k": [1, versioned(v2)]}))
    assert (label(deep1) == label(deep2)) == same


@pytest.mark.parametrize(
    ("v1", "v2"),
    [
        (3, 4),
        (0.5, 0.25),
        ("a", "b"),
        (True, 1),
        (False, 0),
        (None, 0),
        (None, "null"),
        ("", None),
        ([1, 2], [2, 1]),
        ([1], [[1]]),
        ({"a": 1}, {"b": 1}),
        ({"a": 1}, {"a": "1"}),
        (Inner(a=1), {"a": 1, "b": None}),
        (Inner(a=1), Cfg(output=1, value=None, inputs=[], extra=None)),
    ],
)
def test_distinct_values_have_distinct_identities(v1: Any, v2: Any) -> None:
    assert label(step(value=v1)) != label(step(value=v2))


@pytest.mark.parametrize(
    ("v1", "v2"),
    [
        (3, 3.0),
        (-0.0, 0),
        ([1, 2], (1, 2)),
        ({"a": [1.0]}, {"a": (1,)}),
        (2**40, float(2**40)),
    ],
)
def test_equal_values_have_equal_identities(v1: Any, v2: Any) -> None:
    assert label(step(value=v1)) == label(step(value=v2))


def test_versioned_path_enters_identity() -> None:
    a = Step("s", fn, Cfg(output=this_output(), value=versioned(1), extra=2))
    b = Step("s", fn, Cfg(output=this_output(), value=2, extra=versioned(1)))
    assert label(a) != label(b)


def test_marking_a_value_versioned_changes_identity() -> None:
    a = Step("s", fn, Cfg(output=this_output(), value=1))
    b = Step("s", fn, Cfg(output=this_output(), value=versioned(1)))
    assert label(a) != label(b)


def test_surrogate_strings_hash() -> None:
    # A str decoded with surrogateescape (e.g. an undecodable filename) must not crash hashing.
    assert label(step(value="bad-\udc80")) != label(step(value="bad-\udc81"))


@given(name1=names, name2=names)
@FAST
def test_name_enters_identity(name1: str, name2: str) -> None:
    assume(name1 != name2)
    a, b = build_dag([step(name1, 0)], "/p"), build_dag([step(name2, 0)], "/p")
    (na,), (nb,) = a.nodes.values(), b.nodes.values()
    assert na.identity.hash != nb.identity.hash


@given(v1=st.none() | st.text(max_size=8), v2=st.none() | st.text(max_size=8))
@FAST
def test_changes_with_step_version(v1: str | None, v2: str | None) -> None:
    assert (label(step(version=v1)) == label(step(version=v2))) == (v1 == v2)


@given(s1=subs, s2=subs)
@FAST
def test_changes_with_input_subpath(s1: str | None, s2: str | None) -> None:
    up = step("up", 1)
    a = labels([step("down", inputs=[output_of(up, s1)])])
    b = labels([step("down", inputs=[output_of(up, s2)])])
    assert a["up"] == b["up"]
    assert (a["down"] == b["down"]) == (s1 == s2)


def test_input_path_enters_identity() -> None:
    up = step("up", 1)
    a = Step("down", fn, Cfg(output=this_output(), inputs=[output_of(up)]))
    b = Step("down", fn, Cfg(output=this_output(), extra=output_of(up)))
    assert labels([a])["down"] != labels([b])["down"]


def test_a_different_upstream_changes_identity() -> None:
    a = labels([step("down", inputs=[output_of(step("up1", 1))])])
    b = labels([step("down", inputs=[output_of(step("up2", 1))])])
    assert a["down"] != b["down"]


@st.composite
def dags(draw: st.DrawFn) -> tuple[int, list[list[int]], list[bool], int, Any, Any]:
    n = draw(st.integers(2, 8))
    ups = [draw(st.lists(st.integers(0, i - 1), max_size=3, unique=True)) if i else [] for i in range(n)]
    blocking = draw(st.lists(st.booleans(), min_size=n * 3, max_size=n * 3))
    changed = draw(st.integers(0, n - 1))
    v1 = draw(values)
    v2 = draw(values.filter(lambda v: canonical(v) != canonical(v1)))
    return n, ups, blocking, changed, v1, v2


def build_random(
    n: int, ups: list[list[int]], blocking: list[bool], changed: int, value: Any, prefix: str = "/p"
) -> dict[str, str]:
    steps: list[Step] = []
    for i in range(n):
        inputs = [output_of(steps[u], f"o{u}", blocking=blocking[i * 3 + j]) for j, u in enumerate(ups[i])]
        steps.append(step(f"n{i}", value if i == changed else i, inputs=inputs))
    return labels(steps, prefix)


@given(dag=dags())
@FAST
def test_upstream_change_propagates_to_dependents_only(dag: tuple) -> None:
    n, ups, blocking, changed, v1, v2 = dag
    before = build_random(n, ups, blocking, changed, v1)
    after = build_random(n, ups, blocking, changed, v2)
    deps = {f"n{i}": [f"n{u}" for u in ups[i]] for i in range(n)}
    expected = {f"n{changed}"} | descendants(deps, [f"n{changed}"])
    assert {name for name in before if before[name] != after[name]} == expected


def test_upstream_change_chain_and_unrelated_step() -> None:
    def build(v: int) -> dict[str, str]:
        a = step("a", v)
        b = step("b", inputs=[output_of(a)])
        c = step("c", inputs=[output_of(b, "x", blocking=False)])
        u = step("u", 7)
        return labels([c, u])

    one, two = build(1), build(2)
    assert one["u"] == two["u"]
    assert all(one[k] != two[k] for k in "abc")


# Does not change with what is left out


@given(extra1=values, extra2=values, nested=values)
@FAST
def test_unversioned_fields_do_not_enter_identity(extra1: Any, extra2: Any, nested: Any) -> None:
    a = step("s", 1, extra=extra1, nested=Inner(a=extra1, b=versioned(1)))
    b = step("s", 1, extra=extra2, nested=Inner(a=nested, b=versioned(1)))
    assert label(a) == label(b)


def test_unversioned_exotic_fields_do_not_enter_identity() -> None:
    assert label(step(extra={1, 2})) == label(step(extra=object())) == label(step(extra=write_value))


@given(
    cpus=st.floats(0, 64),
    gpus=st.floats(0, 8),
    memory=st.none() | st.sampled_from(["1GiB", "16GiB"]),
    tpu=st.none() | st.sampled_from(["v5p-64", "v4-8"]),
    slices=st.integers(1, 4),
    env=st.dictionaries(st.text(min_size=1, max_size=4), st.text(max_size=4), max_size=2),
    pip=st.lists(st.text(min_size=1, max_size=6), max_size=2).map(tuple),
)
@FAST
def test_resources_do_not_enter_identity(cpus, gpus, memory, tpu, slices, env, pip) -> None:
    res = Resources(cpus=cpus, gpus=gpus, memory=memory, tpu=tpu, slices=slices, env=env, pip=pip)
    base = step("s", 1)
    with_res = Step("s", fn, base.config, resources=res)
    assert label(base) == label(with_res)


def test_description_and_function_do_not_enter_identity() -> None:
    # The function's fingerprint is recorded in .step.json and reported as drift, not identity.
    cfg = Cfg(output=this_output(), value=versioned(1))
    assert label(Step("s", fn, cfg)) == label(Step("s", other_fn, cfg, description="words"))
    assert label(Step("s", fn, cfg)) == label(Step("s", fail, cfg))


@given(dag=dags())
@FAST
def test_blocking_flag_does_not_enter_identity(dag: tuple) -> None:
    n, ups, blocking, changed, v1, _ = dag
    flipped = [not b for b in blocking]
    assert build_random(n, ups, blocking, changed, v1) == build_random(n, ups, flipped, changed, v1)


def test_this_output_sub_does_not_enter_identity() -> None:
    # this_output is where the step writes, a consequence of identity, not part of it.
    a = Step("s", fn, Cfg(output=this_output(), value=versioned(1)))
    b = Step("s", fn, Cfg(output=this_output("sub"), value=versioned(1)))
    assert label(a) == label(b)


@given(value=values)
@FAST
def test_identity_is_a_function_of_the_declaration(value: Any) -> None:
    # Two separately built, equal declarations: one identity, one node.
    s1 = step("x", value, inputs=[output_of(step("up", value), "a")])
    s2 = step("x", value, inputs=[output_of(step("up", value), "a")])
    dag = build_dag([s1, s2], "/p")
    assert len(dag.nodes) == 2
    assert labels([s1]) == labels([s2])
