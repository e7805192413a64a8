"""Walking step configs: the one traversal (`ConfigWalk`), and collect_refs, resolve_config,
to_plain and the manifest encoder made of it, on nested configs."""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict, defaultdict, namedtuple
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline.core.config_walk import collect_refs, resolve_config, to_plain
from pipeline.core.drift import drift_digest, drift_digest_of_text
from pipeline.errors import DrydockError, StepDeclarationError
from pipeline.step import (
    OutputOf,
    Step,
    ThisOutput,
    Versioned,
    added_field,
    output_of,
    this_output,
    versioned,
)
from tests.pipeline.stepfns import WriteConfig, write_value


@dataclass(frozen=True)
class Source:
    path: Any
    weight: Any = 1.0


@dataclass(frozen=True)
class Data:
    sources: Any
    weights: Any = field(default_factory=dict)
    cache: Any = None


@dataclass(frozen=True)
class Nested:
    data: Data
    lr: Any
    output: Any
    steps: Any = 100
    tags: Any = ()


@dataclass
class Mutable:
    value: Any = None
    items: Any = field(default_factory=list)


@dataclass(frozen=True)
class WithInitFalse:
    inp: Any
    derived: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "derived", 41)


@dataclass(frozen=True, slots=True)
class Slotted:
    inp: Any
    n: Any = 1


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


Pair = namedtuple("Pair", ["left", "right"])

UP = Step("up", write_value, WriteConfig(output=this_output()))
OTHER = Step("other", write_value, WriteConfig(output=this_output(), value=versioned(1)))


def nested_config() -> Nested:
    return Nested(
        data=Data(
            sources=[
                Source(path=output_of(UP, "a.jsonl"), weight=versioned(0.5)),
                Source(path=versioned("gs://bucket/raw"), weight=2),
            ],
            weights={"web": versioned(3), "code": 1, "deep": {"x": (output_of("other"), versioned("v"))}},
            cache=this_output("cache"),
        ),
        lr=versioned(3e-4),
        output=this_output(),
        tags=(versioned("t0"), "t1", UP / "sub/dir"),
    )


# collect_refs


def test_collect_refs_finds_everything_by_dotted_path() -> None:
    refs = collect_refs("train", nested_config())
    assert refs.versioned == {
        "data.sources.0.weight": 0.5,
        "data.sources.1.path": "gs://bucket/raw",
        "data.weights.web": 3,
        "data.weights.deep.x.1": "v",
        "lr": 3e-4,
        "tags.0": "t0",
    }
    assert refs.inputs == {
        "data.sources.0.path": OutputOf(UP, "a.jsonl"),
        "data.weights.deep.x.0": OutputOf("other"),
        "tags.2": OutputOf(UP, "sub/dir"),
    }
    assert refs.own_outputs == {"data.cache": ThisOutput("cache"), "output": ThisOutput()}


def test_collect_refs_keeps_declaration_order() -> None:
    refs = collect_refs("train", nested_config())
    assert list(refs.inputs) == ["data.sources.0.path", "data.weights.deep.x.0", "tags.2"]
    assert list(refs.own_outputs) == ["data.cache", "output"]


def test_collect_refs_empty_config() -> None:
    refs = collect_refs("s", Mutable())
    assert (refs.versioned, refs.inputs, refs.own_outputs) == ({}, {}, {})


def test_collect_refs_on_plain_dataclass_and_top_level_values() -> None:
    cfg = Mutable(value=versioned([1, 2.0, {"k": None}]), items=[this_output("x"), output_of(UP)])
    refs = collect_refs("s", cfg)
    assert refs.versioned == {"value": [1, 2, {"k": None}]}
    assert refs.inputs == {"items.1": OutputOf(UP)}
    assert refs.own_outputs == {"items.0": ThisOutput("x")}


def test_collect_refs_versioned_dataclass_is_plain_with_class() -> None:
    cfg = Mutable(value=versioned(Source(path="p", weight=2.0)))
    assert collect_refs("s", cfg).versioned == {"value": {"__class__": "Source", "path": "p", "weight": 2}}


@dataclass(frozen=True)
class SourceLater:
    """`Source` as it became after a release added a field."""

    path: Any
    weight: Any = 1.0
    window: Any = added_field(None)


SourceLater.__qualname__ = "Source"  # the same class, one release later


def test_a_field_added_later_leaves_identities_made_before_it_alone() -> None:
    before = collect_refs("s", Mutable(value=versioned(Source(path="p", weight=2.0))))
    after = collect_refs("s", Mutable(value=versioned(SourceLater(path="p", weight=2.0))))
    assert after.versioned == before.versioned
    assert to_plain("s", "", SourceLater(path="p"), strict=True) == to_plain(
        "s", "", Source(path="p"), strict=True
    )
    # Set to anything but its default, it is part of identity like any field.
    set_ = collect_refs("s", Mutable(value=versioned(SourceLater(path="p", weight=2.0, window=8))))
    assert set_.versioned["value"] == {"__class__": "Source", "path": "p", "weight": 2, "window": 8}
    assert set_.versioned != before.versioned


def test_a_field_added_later_and_versioned_one_by_one_holds_its_default_too() -> None:
    """A step factory that versions each field (`window=versioned(None)`) keeps the identities
    made before the field existed while it passes the default."""
    before = collect_refs("s", Source(path=versioned("p"), weight=versioned(2.0)))
    same = collect_refs("s", SourceLater(path=versioned("p"), weight=versioned(2.0), window=versioned(None)))
    assert same.versioned == before.versioned == {"path": "p", "weight": 2}
    other = collect_refs("s", SourceLater(path=versioned("p"), weight=versioned(2.0), window=versioned(4)))
    assert other.versioned == {"path": "p", "weight": 2, "window": 4}


def test_collect_refs_versioned_enum_is_its_value() -> None:
    cfg = Mutable(value=versioned(Color.RED), items=[versioned(Color.BLUE)])
    assert collect_refs("s", cfg).versioned == {"value": "red", "items.0": 2}


def test_collect_refs_placeholders_inside_a_versioned_value() -> None:
    # A placeholder inside a versioned container is still an input (it adds an edge).
    cfg = Mutable(value=versioned({"src": output_of(UP, "x"), "n": 3}))
    refs = collect_refs("s", cfg)
    assert refs.inputs == {"value.src": OutputOf(UP, "x")}
    assert refs.versioned["value"]["n"] == 3


def test_collect_refs_nested_versioned_records_both_paths() -> None:
    cfg = Mutable(value=versioned({"a": versioned(1), "b": 2}))
    refs = collect_refs("s", cfg)
    assert refs.versioned == {"value": {"a": 1, "b": 2}, "value.a": 1}


def test_collect_refs_shared_subobject_is_not_a_self_reference() -> None:
    shared = [versioned(1)]
    cfg = Mutable(value=shared, items=shared)
    assert collect_refs("s", cfg).versioned == {"value.0": 1, "items.0": 1}


def test_collect_refs_self_referencing_config_is_an_error() -> None:
    cfg = Mutable()
    cfg.items.append(cfg)
    with pytest.raises(StepDeclarationError, match=r"step 's', field `items.0`.*refers to itself"):
        collect_refs("s", cfg)


def _encode(step: str, config: Any) -> Any:
    from pipeline.run.records.recipe_codec import encode_value

    return encode_value(config, {}, step)


WALKS = {
    "collect_refs": lambda cfg: collect_refs("s", cfg),
    "to_plain": lambda cfg: to_plain("s", "", cfg, strict=False),
    "resolve_config": lambda cfg: resolve_config(cfg, lambda placeholder: "x"),
    "encode_value": lambda cfg: _encode("s", cfg),
}


@pytest.mark.parametrize("walk", sorted(WALKS))
def test_every_walk_is_the_one_traversal_and_refuses_a_config_that_holds_itself(walk) -> None:
    # Once only collect_refs checked; the others recursed until Python's stack ran out.
    cfg = Mutable(value={"k": [1]})
    cfg.value["k"].append((cfg,))
    with pytest.raises(StepDeclarationError, match=r"field `value.k.1.0`.*refers to itself"):
        WALKS[walk](cfg)


@pytest.mark.parametrize("walk", sorted(WALKS))
def test_every_walk_refuses_a_step_held_in_a_config(walk) -> None:
    with pytest.raises(StepDeclarationError, match=r"field `items.1`.*holds step 'up' itself"):
        WALKS[walk](Mutable(items=[1, UP]))


def test_a_new_walk_is_a_subclass_that_says_what_each_kind_becomes() -> None:
    from pipeline.core.config_walk import ConfigWalk

    class Labels(ConfigWalk):
        """Each placeholder's dotted path, and every other value left out."""

        def __init__(self) -> None:
            super().__init__("s")
            self.found: list[str] = []

        def visit_output_of(self, value: OutputOf, path: str) -> Any:
            self.found.append(path)

        def visit_this_output(self, value: ThisOutput, path: str) -> Any:
            self.found.append(path)

    walk = Labels()
    walk.walk(nested_config())
    refs = collect_refs("s", nested_config())
    assert walk.found and set(walk.found) == {*refs.inputs, *refs.own_outputs}
    assert Source in walk.met and Data in walk.met


def test_collect_refs_dict_keys_must_be_strings() -> None:
    cfg = Mutable(value={"ok": {1: "x"}})
    with pytest.raises(StepDeclarationError, match=r"step 'd', field `value.ok`.*keys must be strings"):
        collect_refs("d", cfg)


def test_collect_refs_step_object_instead_of_output_of_is_an_error() -> None:
    # Putting a Step where output_of(step) belongs must not silently merge the other step's
    # config (its this_output, versioned values) into this one.
    cfg = Mutable(value=UP)
    with pytest.raises(StepDeclarationError) as err:
        collect_refs("down", cfg)
    msg = str(err.value)
    assert "step 'down'" in msg and "field `value`" in msg and "output_of" in msg
    assert err.value.step == "down" and err.value.field == "value"


@pytest.mark.parametrize("config", [{"a": 1}, [1, 2], "cfg", 3, None, Source])
def test_collect_refs_config_must_be_a_dataclass_instance(config) -> None:
    with pytest.raises(StepDeclarationError) as err:
        collect_refs("tok/x", config)
    msg = str(err.value)
    assert msg.startswith("step 'tok/x', field `config`:")
    assert "dataclass" in msg
    assert isinstance(err.value, DrydockError)


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [
        ({1, 2}, "set"),
        (frozenset({1}), "frozenset"),
        (write_value, "function"),
        (object(), "object"),
        (b"bytes", "bytes"),
        (1 + 2j, "complex"),
        (range(3), "range"),
    ],
)
def test_unhashable_versioned_values_name_the_step_and_field(bad, type_name) -> None:
    cfg = Nested(
        data=Data(sources=[Source(path="p"), Source(path="q", weight=versioned({"k": [1, bad]}))]),
        lr=1,
        output=this_output(),
    )
    with pytest.raises(StepDeclarationError) as err:
        collect_refs("train/moe", cfg)
    msg = str(err.value)
    assert "step 'train/moe'" in msg
    assert "field `data.sources.1.weight.k.1`" in msg
    assert type_name in msg
    assert err.value.field == "data.sources.1.weight.k.1"


def test_unhashable_top_level_versioned_value() -> None:
    with pytest.raises(StepDeclarationError, match=r"step 's', field `value`: .*set"):
        collect_refs("s", Mutable(value=versioned({1})))


def test_unversioned_exotic_values_are_fine() -> None:
    # Only versioned values must be canonical JSON; anything else is merely recorded.
    cfg = Mutable(value={1.5j, 2}, items=[write_value, object()])
    refs = collect_refs("s", cfg)
    assert refs.versioned == {}


# to_plain


def test_to_plain_integral_floats_are_ints() -> None:
    assert to_plain("s", "x", 3.0, strict=True) == 3
    assert type(to_plain("s", "x", 3.0, strict=True)) is int
    assert to_plain("s", "x", -0.0, strict=True) == 0
    assert json.dumps(to_plain("s", "x", [3, 3.0], strict=True)) == "[3, 3]"
    assert to_plain("s", "x", 0.1, strict=True) == 0.1
    assert to_plain("s", "x", 1e300, strict=True) == 1e300


@pytest.mark.parametrize("special", [math.nan, math.inf, -math.inf])
def test_to_plain_nan_and_inf_are_strings(special) -> None:
    plain = to_plain("s", "x", special, strict=True)
    assert isinstance(plain, str)
    assert plain == repr(special)
    json.dumps(plain, allow_nan=False)


def test_to_plain_bool_is_not_int() -> None:
    assert to_plain("s", "x", True, strict=True) is True
    assert to_plain("s", "x", 1, strict=True) == 1
    assert json.dumps(to_plain("s", "x", True, strict=True)) != json.dumps(to_plain("s", "x", 1, strict=True))


def test_to_plain_dataclasses_carry_their_class() -> None:
    @dataclass(frozen=True)
    class A:
        x: Any

    @dataclass(frozen=True)
    class B:
        x: Any

    a = to_plain("s", "", A(1.0), strict=True)
    b = to_plain("s", "", B(1.0), strict=True)
    assert a == {"__class__": A.__qualname__, "x": 1}
    assert a != b


def test_to_plain_containers() -> None:
    value = {"t": (1, 2.0), "l": [Color.BLUE, None], "d": {"k": Versioned(4.0)}}
    assert to_plain("s", "", value, strict=True) == {"t": [1, 2], "l": [2, None], "d": {"k": 4}}


def test_to_plain_placeholders() -> None:
    assert to_plain("s", "", OutputOf(UP, "x"), strict=True) == {"__output_of__": "up", "sub": "x"}
    assert to_plain("s", "", OutputOf("up"), strict=True) == {"__output_of__": "up", "sub": None}
    assert to_plain("s", "", ThisOutput("c"), strict=True) == {"__this_output__": "c"}


def test_to_plain_not_strict_uses_repr() -> None:
    value = {"fn": write_value, "s": {3}, 4: "int key"}
    plain = to_plain("s", "", value, strict=False)
    assert plain == {"fn": repr(write_value), "s": "{3}", "4": "int key"}
    json.dumps(plain)


def test_to_plain_strict_names_the_dotted_path() -> None:
    with pytest.raises(StepDeclarationError, match=r"field `a.b.2`"):
        to_plain("s", "a", {"b": [1, 2, {3}]}, strict=True)
    with pytest.raises(StepDeclarationError, match=r"field `a`.*keys must be strings"):
        to_plain("s", "a", {1: 2}, strict=True)


def test_to_plain_full_config_is_json() -> None:
    plain = to_plain("s", "", nested_config(), strict=False)
    text = json.dumps(plain, sort_keys=True)
    assert json.loads(text)["data"]["sources"][0]["path"] == {"__output_of__": "up", "sub": "a.jsonl"}
    assert plain["lr"] == 3e-4


# resolve_config


def fake_resolve(placeholder: OutputOf | ThisOutput) -> str:
    if isinstance(placeholder, ThisOutput):
        return "/out/me" + (f"/{placeholder.sub}" if placeholder.sub else "")
    name = placeholder.step if isinstance(placeholder.step, str) else placeholder.step.name
    return f"/out/{name}" + (f"/{placeholder.sub}" if placeholder.sub else "")


def test_resolve_config_nested() -> None:
    cfg = nested_config()
    out = resolve_config(cfg, fake_resolve)
    assert out == Nested(
        data=Data(
            sources=[Source(path="/out/up/a.jsonl", weight=0.5), Source(path="gs://bucket/raw", weight=2)],
            weights={"web": 3, "code": 1, "deep": {"x": ("/out/other", "v")}},
            cache="/out/me/cache",
        ),
        lr=3e-4,
        output="/out/me",
        tags=("t0", "t1", "/out/up/sub/dir"),
    )
    # Types survive: frozen dataclasses, lists stay lists, tuples stay tuples.
    assert type(out) is Nested and type(out.data) is Data and type(out.data.sources[0]) is Source
    assert type(out.data.sources) is list and type(out.tags) is tuple
    assert type(out.data.weights["deep"]["x"]) is tuple
    with pytest.raises(AttributeError):
        out.lr = 1  # type: ignore[misc]


def test_resolve_config_leaves_the_original_untouched() -> None:
    cfg = nested_config()
    before = repr(cfg)
    resolve_config(cfg, fake_resolve)
    assert repr(cfg) == before
    assert isinstance(cfg.lr, Versioned)
    assert isinstance(cfg.output, ThisOutput)


def test_resolve_config_without_placeholders_returns_the_same_objects() -> None:
    cfg = Nested(data=Data(sources=[Source("a")], weights={"w": 1}), lr=1, output="/x")
    assert resolve_config(cfg, fake_resolve) is cfg
    # Only the branch that changed is copied; the rest is shared.
    cfg2 = Nested(data=cfg.data, lr=versioned(2), output="/x")
    out = resolve_config(cfg2, fake_resolve)
    assert out is not cfg2 and out.lr == 2 and out.data is cfg.data


def test_resolve_config_unwraps_every_versioned() -> None:
    cfg = Mutable(value=versioned({"a": versioned(1), "b": [versioned(Source(versioned("p")))]}))
    out = resolve_config(cfg, fake_resolve)
    assert out.value == {"a": 1, "b": [Source("p")]}

    def walk(v: Any) -> None:
        assert not isinstance(v, Versioned | OutputOf | ThisOutput)
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif hasattr(v, "__dataclass_fields__"):
            for name in v.__dataclass_fields__:
                walk(getattr(v, name))

    walk(out)


def test_resolve_config_keeps_mutable_dataclasses_and_their_type() -> None:
    cfg = Mutable(value=this_output(), items=[output_of("up")])
    out = resolve_config(cfg, fake_resolve)
    assert type(out) is Mutable and out == Mutable("/out/me", ["/out/up"])
    assert cfg.value == ThisOutput()


def test_resolve_config_keeps_init_false_fields() -> None:
    cfg = WithInitFalse(inp=output_of(UP))
    assert cfg.derived == 41
    out = resolve_config(cfg, fake_resolve)
    assert out.inp == "/out/up" and out.derived == 41


def test_resolve_config_slotted_frozen_dataclass() -> None:
    out = resolve_config(Slotted(inp=output_of(UP, "s"), n=versioned(2)), fake_resolve)
    assert type(out) is Slotted and out.inp == "/out/up/s" and out.n == 2


def test_resolve_config_keeps_container_types() -> None:
    cfg = Mutable(
        value=OrderedDict([("b", this_output()), ("a", 1)]),
        items=[Pair(versioned(1), output_of(UP)), defaultdict(list, {"k": this_output("k")})],
    )
    out = resolve_config(cfg, fake_resolve)
    assert type(out.value) is OrderedDict and list(out.value) == ["b", "a"]
    assert out.value["b"] == "/out/me"
    assert type(out.items[0]) is Pair and out.items[0] == Pair(1, "/out/up")
    assert type(out.items[1]) is defaultdict and out.items[1]["k"] == "/out/me/k"
    assert out.items[1].default_factory is list


def test_resolve_config_gets_each_placeholder_object() -> None:
    seen: list[Any] = []

    def record(p: OutputOf | ThisOutput) -> str:
        seen.append(p)
        return "x"

    cfg = nested_config()
    resolve_config(cfg, record)
    refs = collect_refs("s", cfg)
    assert {id(p) for p in seen} == {id(p) for p in [*refs.inputs.values(), *refs.own_outputs.values()]}


# the plain form collect_refs makes in the same walk


class Shade(enum.StrEnum):
    DARK = "dark"


@pytest.mark.parametrize("prefix", [None, "/p", "gs://b/"])
def test_collect_refs_plain_form_is_to_plain_with_placeholders_left_in_place(prefix) -> None:
    """Drift digests recorded by earlier versions were made with `to_plain(config, strict=False,
    render=..., prefix=...)`: the plain form from the identity walk, rendered the same way, must be
    exactly that (or every cached step of an existing prefix would get its `.step.json` diffed)."""
    config = Nested(
        data=Data(
            sources=[
                Source(path=output_of(UP, "a.jsonl"), weight=versioned(0.5)),
                Source(path="/p/raw/x", weight=float("nan")),
                Source(path="gs://b/raw", weight=2.0),
            ],
            weights={"web": versioned(3), "deep": {"x": (output_of("other"), versioned("v"))}},
            cache=this_output("cache"),
        ),
        lr=versioned(3e-4),
        output=this_output(),
        steps=Color.BLUE,
        tags=(Shade.DARK, Pair(1, [True, None]), Mutable(1), object.__new__(Color).__class__, 1e300),
    )
    rendered = {}

    def render(ph: OutputOf | ThisOutput) -> str:
        return rendered.setdefault(id(ph), f"${{prefix}}/rendered-{len(rendered)}")

    expected = to_plain("s", "", config, strict=False, render=render, prefix=prefix)
    plain = collect_refs("s", config, prefix).plain
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=render)
    assert text == json.dumps(expected, sort_keys=True, separators=(",", ":"), default=repr)
    assert drift_digest_of_text("0123abcd", text) == drift_digest("0123abcd", expected)


def test_a_field_that_applies_only_sometimes_keeps_its_identity_and_is_named_where_it_does_not():
    """`applies_when`: the Muon-only rate of an optimizer spec. Marking the field changes no
    identity; `.step.json` lists it as inapplicable for AdamW, so views leave it out."""
    from pipeline.core.dag import build_dag
    from pipeline.run.records.provenance import step_info
    from pipeline.step import Step, applies_when, inapplicable_fields, this_output, versioned

    @dataclass(frozen=True)
    class Plain:
        name: str = "adamw"
        adam_learning_rate: float = 3e-3

    @dataclass(frozen=True)
    class Marked:
        name: str = "adamw"
        adam_learning_rate: float = applies_when(3e-3, field="name", equals="muon")

    @dataclass(frozen=True)
    class Train:
        output: str
        optimizer: Any

    def identity(spec: Any) -> dict:
        dag = build_dag([Step("t", write_value, Train(this_output(), versioned(spec)))], "/p")
        (node,) = dag.nodes.values()
        return {k: v for k, v in node.identity.payload["versioned"]["optimizer"].items() if k != "__class__"}

    assert identity(Marked()) == identity(Plain())
    assert inapplicable_fields(Train("/o", versioned(Marked()))) == ["optimizer.adam_learning_rate"]
    assert inapplicable_fields(Train("/o", versioned(Marked(name="muon")))) == []
    dag = build_dag([Step("t", write_value, Train(this_output(), versioned(Marked())))], "/p")
    (label,) = dag.nodes
    assert step_info(dag, label)["inapplicable"] == ["optimizer.adam_learning_rate"]
