"""build_dag: discovery, validation (one clear error each), de-duplication and edges."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from pipeline.core.dag import Dag, build_dag, fn_import_path, join_path, labels_matching
from pipeline.errors import DrydockError, GraphError, StepDeclarationError
from pipeline.step import OutputOf, Resources, Step, output_of, this_output, versioned
from tests.pipeline.stepfns import WriteConfig, write_value

PREFIX = "/runs"


@dataclass(frozen=True)
class Cfg:
    output: Any = None
    value: Any = None
    inputs: list[Any] = field(default_factory=list)
    extra: Any = None


@dataclass
class MutableCfg:
    output: Any = None
    value: Any = None
    dep: Any = None


def fn(config: Any) -> None:
    """A module-level step function; build_dag never calls it."""


class Holder:
    @staticmethod
    def method(config: Any) -> None:
        """A function reachable by `module:qualname` (Holder.method)."""


def mk(name: str, value: Any = 0, *inputs: Any, **kw: Any) -> Step:
    return Step(name, fn, Cfg(output=this_output(), value=versioned(value), inputs=list(inputs)), **kw)


def by_name(dag: Dag) -> dict[str, str]:
    return {node.name: label for label, node in dag.nodes.items()}


def message(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg, "errors are one sentence"
    assert isinstance(excinfo.value, DrydockError)
    return msg


def rotations(*names: str) -> list[str]:
    """Every way `names` (a cycle) can be written starting at one of its steps."""
    return [" -> ".join([*names[i:], *names[:i], names[i]]) for i in range(len(names))]


# A valid DAG


def test_build_dag_discovers_upstreams_and_orders_them() -> None:
    a = mk("raw/a", 1)
    b = mk("raw/b", 2)
    c = mk("mix/c", 3, a / "x", output_of(b))
    d = mk("train/d", 4, output_of(c, "data"))
    dag = build_dag([d], PREFIX)
    names = by_name(dag)
    assert set(names) == {"raw/a", "raw/b", "mix/c", "train/d"}
    order = [dag.nodes[label].name for label in dag.nodes]
    assert order.index("raw/a") < order.index("mix/c") < order.index("train/d")
    assert order.index("raw/b") < order.index("mix/c")
    assert dag.roots == (names["train/d"],)
    assert dag.nodes[names["mix/c"]].deps == (names["raw/a"], names["raw/b"])
    assert dag.nodes[names["mix/c"]].inputs == {"inputs.0": names["raw/a"], "inputs.1": names["raw/b"]}
    assert dag.deps[names["train/d"]] == (names["mix/c"],)
    assert dag.nodes[names["raw/a"]].deps == ()
    for label, node in dag.nodes.items():
        assert node.label == label
        assert node.output_path == f"{PREFIX}/{label}"
    assert dag.output_path(names["raw/a"], "x/y") == f"{PREFIX}/{names['raw/a']}/x/y"
    assert dag.prefix == PREFIX


def test_build_dag_follows_declaration_order() -> None:
    a, b = mk("a"), mk("b")
    c = mk("c", 0, output_of(b), output_of(a))
    assert [n.name for n in build_dag([c], PREFIX).nodes.values()] == ["b", "a", "c"]
    assert [n.name for n in build_dag([a, b], PREFIX).nodes.values()] == ["a", "b"]


def test_a_single_step_may_be_passed_bare() -> None:
    dag = build_dag(mk("solo"), PREFIX)  # type: ignore[arg-type]
    assert [n.name for n in dag.nodes.values()] == ["solo"]


def test_roots_are_deduplicated() -> None:
    a = mk("a")
    b = mk("b", 0, output_of(a))
    dag = build_dag([b, a, b], PREFIX)
    names = by_name(dag)
    assert dag.roots == (names["b"], names["a"])


def test_dag_is_immutable() -> None:
    dag = build_dag([mk("a")], PREFIX)
    with pytest.raises(TypeError):
        dag.nodes["x"] = None  # type: ignore[index]


@pytest.mark.parametrize(
    "name", ["a", "tokenized/fineweb", "a.b", "x_1/y-2+z=3", "A/B/C", "_private", "v1.0/data", "9lives"]
)
def test_valid_names(name: str) -> None:
    (node,) = build_dag([mk(name)], PREFIX).nodes.values()
    assert node.name == name
    assert node.label.startswith(f"{name}-")


def test_deep_chain_builds_without_recursion() -> None:
    s = mk("s0")
    for i in range(1, 10_000):
        s = mk(f"s{i}", i, output_of(s))
    dag = build_dag([s], PREFIX)
    assert len(dag.nodes) == 10_000
    assert [n.name for n in dag.nodes.values()] == [f"s{i}" for i in range(10_000)]


# Cycles


def test_cycle_through_a_list_mutated_after_creation() -> None:
    a = mk("a")
    b = mk("b", 0, output_of(a))
    a.config.inputs.append(output_of(b))  # the frozen dataclass holds a mutable list
    with pytest.raises(GraphError) as err:
        build_dag([b], PREFIX)
    msg = message(err)
    assert msg.startswith("the steps form a cycle: ")
    assert msg.removeprefix("the steps form a cycle: ") in rotations("a", "b")


def test_cycle_through_a_mutable_dataclass_config() -> None:
    a = Step("a", fn, MutableCfg(output=this_output()))
    b = Step("b", fn, MutableCfg(output=this_output(), dep=output_of(a)))
    c = Step("c", fn, MutableCfg(output=this_output(), dep=b / "ckpt"))
    a.config.dep = output_of(c)
    with pytest.raises(GraphError) as err:
        build_dag([c], PREFIX)
    # Arrows read "depends on": c needs b, b needs a, a needs c.
    assert message(err).removeprefix("the steps form a cycle: ") in rotations("c", "b", "a")


def test_cycle_message_names_only_the_cycle() -> None:
    a, b = mk("loop/a"), mk("loop/b")
    a.config.inputs.append(output_of(b))
    b.config.inputs.append(output_of(a))
    tail = mk("tail", 0, output_of(a))
    with pytest.raises(GraphError) as err:
        build_dag([tail], PREFIX)
    msg = message(err)
    assert msg.removeprefix("the steps form a cycle: ") in rotations("loop/a", "loop/b")
    assert "tail" not in msg


def test_self_cycle_by_object_and_by_name() -> None:
    a = mk("a")
    a.config.inputs.append(output_of(a))
    with pytest.raises(GraphError, match=re.escape("the steps form a cycle: a -> a")):
        build_dag([a], PREFIX)
    b = mk("b", 0, output_of("b", "x"))
    with pytest.raises(GraphError, match=re.escape("the steps form a cycle: b -> b")):
        build_dag([b], PREFIX)


def test_cycle_through_a_name_reference() -> None:
    a = mk("a", 0, output_of("b"))
    b = mk("b", 0, output_of(a))
    with pytest.raises(GraphError) as err:
        build_dag([b], PREFIX)
    assert message(err).removeprefix("the steps form a cycle: ") in rotations("a", "b")


# Names


def test_two_different_steps_with_one_name() -> None:
    a1, a2 = mk("data/a", 1), mk("data/a", 2)
    b = mk("b", 0, output_of(a1), output_of(a2))
    with pytest.raises(GraphError) as err:
        build_dag([b], PREFIX)
    msg = message(err)
    assert "two different steps are named 'data/a'" in msg
    l1, l2 = (build_dag([s], PREFIX).roots[0] for s in (a1, a2))
    assert l1 in msg and l2 in msg


def test_two_different_roots_with_one_name() -> None:
    with pytest.raises(GraphError, match="two different steps are named 'x'"):
        build_dag([mk("x", 1), mk("x", 2)], PREFIX)


def test_same_name_differing_only_by_version_is_two_steps() -> None:
    with pytest.raises(GraphError, match="named 'x'"):
        build_dag([mk("x", 1), mk("x", 1, version="2")], PREFIX)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("..", "'..'"),
        ("../x", "'..'"),
        ("a/../b", "'..'"),
        ("a/.", "'.'"),
        ("/abs", "absolute"),
        ("s3://x", "absolute"),
        ("file:///x", "absolute"),
        ("a b", "'a b'"),
        ("a//b", "''"),
        ("a/", "''"),
        (".hidden", "'.hidden'"),
        ("a/.hidden", "'.hidden'"),
        ("a\\b", "'a\\\\b'"),
        ("tab\tname", "letters, digits"),
        ("ünï", "letters, digits"),
        ("-dash", "letters, digits"),
    ],
)
def test_invalid_names(name: str, why: str) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([mk(name)], PREFIX)
    msg = message(err)
    assert msg.startswith(f"step {name!r}, field `name`: ")
    assert why in msg
    assert err.value.field == "name"


@pytest.mark.parametrize("name", ["", None, 3, b"raw"])
def test_name_must_be_a_non_empty_string(name: Any) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([Step(name, fn, Cfg())], PREFIX)
    assert message(err) == f"experiment, field `name`: a step name must be a non-empty string, got {name!r}"


def test_invalid_name_of_a_discovered_upstream() -> None:
    bad = mk("../escape")
    with pytest.raises(StepDeclarationError, match=r"step '\.\./escape', field `name`"):
        build_dag([mk("ok", 0, output_of(bad))], PREFIX)


# output_of by name


def test_name_reference_resolves_within_the_dag() -> None:
    up = mk("raw/up", 1)
    down = mk("down", 0, output_of("raw/up", "rows.jsonl"))
    dag = build_dag([up, down], PREFIX)
    names = by_name(dag)
    assert dag.nodes[names["down"]].deps == (names["raw/up"],)
    assert dag.nodes[names["down"]].inputs == {"inputs.0": names["raw/up"]}
    # A name reference is the same input as an object reference: same identity.
    by_object = build_dag([mk("down", 0, output_of(up, "rows.jsonl"))], PREFIX)
    assert by_name(by_object)["down"] == names["down"]


def test_name_reference_to_a_step_reached_through_another() -> None:
    up = mk("up", 1)
    mid = mk("mid", 0, output_of(up))
    down = mk("down", 0, output_of("up"))
    names = by_name(build_dag([mid, down], PREFIX))
    assert set(names) == {"up", "mid", "down"}


def test_name_reference_to_a_step_not_in_the_dag() -> None:
    down = mk("eval/down", 0, mk("present", 1) / "x", output_of("train/missing", "ckpt"))
    with pytest.raises(GraphError) as err:
        build_dag([down], PREFIX)
    msg = message(err)
    assert "step 'eval/down'" in msg
    assert "field `inputs.1`" in msg
    assert "'train/missing'" in msg and "not in the DAG" in msg


@pytest.mark.parametrize("bad", [None, 42, Cfg(), ["up"]])
def test_output_of_something_that_is_not_a_step(bad: Any) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([mk("down", 0, mk("up") / "x", output_of(bad))], PREFIX)
    msg = message(err)
    assert msg.startswith("step 'down', field `inputs.1`: output_of needs a Step or a step name")
    assert type(bad).__name__ in msg


# Configs and functions


@pytest.mark.parametrize("config", [{"n": versioned(1)}, [1], "config", 7, None, Cfg])
def test_config_must_be_a_dataclass_instance(config: Any) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([Step("tok/x", fn, config)], PREFIX)
    msg = message(err)
    assert msg.startswith("step 'tok/x', field `config`: config must be a dataclass instance")


def test_config_of_a_discovered_upstream_must_be_a_dataclass() -> None:
    up = Step("up", fn, {"output": this_output()})
    with pytest.raises(StepDeclarationError, match=r"step 'up', field `config`"):
        build_dag([mk("down", 0, output_of(up))], PREFIX)


def test_unhashable_versioned_value_names_step_and_field() -> None:
    s = Step("train", fn, Cfg(output=this_output(), extra={"opt": versioned({"betas": {0.9, 0.95}})}))
    with pytest.raises(StepDeclarationError) as err:
        build_dag([s], PREFIX)
    msg = message(err)
    assert msg.startswith("step 'train', field `extra.opt.betas`: versioned value of type set")


def test_a_step_object_in_a_config_must_be_output_of() -> None:
    up = mk("up", 5)
    with pytest.raises(StepDeclarationError) as err:
        build_dag([Step("down", fn, Cfg(output=this_output(), extra=up))], PREFIX)
    assert message(err).startswith("step 'down', field `extra`: holds step 'up' itself; use output_of")


def _nested_fn() -> Any:
    def inner(config: Any) -> None:
        pass

    return inner


@pytest.mark.parametrize(
    ("bad_fn", "expected"),
    [
        (lambda config: None, "is a lambda or a nested function"),
        (_nested_fn(), "is a lambda or a nested function"),
        (functools.partial(fn), "must be a module-level function"),
        ("tests.pipeline.core.test_dag:fn", "must be a module-level function"),
        (None, "must be a module-level function"),
    ],
)
def test_fn_must_be_a_module_level_function(bad_fn: Any, expected: str) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([Step("s", bad_fn, Cfg())], PREFIX)
    msg = message(err)
    assert msg.startswith("step 's', field `fn`: ")
    assert expected in msg


def test_fn_of_a_discovered_upstream_is_checked() -> None:
    up = Step("up", lambda c: None, Cfg(output=this_output()))
    with pytest.raises(StepDeclarationError, match=r"step 'up', field `fn`: .*lambda"):
        build_dag([mk("down", 0, output_of(up))], PREFIX)


def test_importable_functions_are_accepted() -> None:
    dag = build_dag([Step("a", Holder.method, Cfg()), Step("b", fn, Cfg())], PREFIX)
    assert [fn_import_path(n.step.fn) for n in dag.nodes.values()] == [
        "tests.pipeline.core.test_dag:Holder.method",
        "tests.pipeline.core.test_dag:fn",
    ]


def test_version_must_be_a_string() -> None:
    with pytest.raises(
        StepDeclarationError, match=r"step 's', field `version`: version must be a string, got 2"
    ):
        build_dag([Step("s", fn, Cfg(), version=2)], PREFIX)  # type: ignore[arg-type]


def test_resources_must_be_resources() -> None:
    with pytest.raises(StepDeclarationError, match=r"step 's', field `resources`: .*got dict"):
        build_dag([Step("s", fn, Cfg(), resources={"cpus": 4})], PREFIX)  # type: ignore[arg-type]


# The roots list


@pytest.mark.parametrize("item", ["raw/a", None, fn, Cfg(), output_of("raw/a")])
def test_roots_must_be_steps(item: Any) -> None:
    with pytest.raises(StepDeclarationError) as err:
        build_dag([mk("ok"), item], PREFIX)
    msg = message(err)
    assert msg.startswith("experiment, field `steps`: expected a Step, got ")
    assert type(item).__name__ in msg


def test_roots_must_not_be_empty() -> None:
    with pytest.raises(StepDeclarationError, match="no steps given"):
        build_dag([], PREFIX)


# De-duplication


def test_equal_declarations_collapse_into_one_node() -> None:
    def tok() -> Step:
        return Step("tok", fn, Cfg(output=this_output(), value=versioned({"vocab": 32000})))

    t1, t2 = tok(), tok()
    assert t1 is not t2
    a = mk("a", 0, output_of(t1))
    b = mk("b", 0, output_of(t2, None))
    dag = build_dag([a, b, tok()], PREFIX)
    names = by_name(dag)
    assert sorted(names) == ["a", "b", "tok"]
    assert dag.nodes[names["a"]].deps == dag.nodes[names["b"]].deps == (names["tok"],)
    assert dag.roots == (names["a"], names["b"], names["tok"])


def test_declarations_differing_only_in_unversioned_fields_collapse() -> None:
    s1 = Step("s", fn, Cfg(output=this_output(), value=versioned(1), extra="log every 10"))
    s2 = Step("s", fn, Cfg(output=this_output(), value=versioned(1), extra="log every 50"))
    dag = build_dag([s1, s2], PREFIX)
    assert len(dag.nodes) == 1
    assert len(dag.roots) == 1


def test_one_upstream_used_twice_is_one_dep() -> None:
    up = mk("up")
    dag = build_dag([mk("down", 0, output_of(up, "a"), output_of(up, "b"))], PREFIX)
    names = by_name(dag)
    node = dag.nodes[names["down"]]
    assert node.deps == (names["up"],)
    assert node.inputs == {"inputs.0": names["up"], "inputs.1": names["up"]}


# blocking=False


def test_non_blocking_inputs_are_soft_deps() -> None:
    train = mk("train", 1)
    evaluate = mk("eval", 0, output_of(train, "checkpoints", blocking=False))
    dag = build_dag([evaluate], PREFIX)
    names = by_name(dag)
    node = dag.nodes[names["eval"]]
    assert node.deps == ()
    assert node.soft_deps == (names["train"],)
    assert node.inputs == {"inputs.0": names["train"]}
    assert dag.deps[names["eval"]] == ()
    assert names["train"] in dag.nodes


def test_non_blocking_inputs_still_enter_identity() -> None:
    def eval_label(train_value: int | None) -> str:
        inputs = [] if train_value is None else [output_of(mk("train", train_value), blocking=False)]
        return by_name(build_dag([mk("eval", 0, *inputs)], PREFIX))["eval"]

    assert eval_label(1) != eval_label(None)
    assert eval_label(1) != eval_label(2)
    assert eval_label(1) == eval_label(1)
    blocking = by_name(build_dag([mk("eval", 0, output_of(mk("train", 1)))], PREFIX))["eval"]
    assert blocking == eval_label(1)


def test_blocking_and_non_blocking_on_one_upstream_is_a_dep() -> None:
    up = mk("up")
    dag = build_dag([mk("down", 0, output_of(up, blocking=False), output_of(up))], PREFIX)
    names = by_name(dag)
    node = dag.nodes[names["down"]]
    assert node.deps == (names["up"],)
    assert node.soft_deps == ()


def test_soft_deps_keep_their_order() -> None:
    a, b, c = mk("a"), mk("b"), mk("c")
    down = mk("down", 0, output_of(b, blocking=False), output_of(a), output_of(c, blocking=False))
    dag = build_dag([down], PREFIX)
    names = by_name(dag)
    node = dag.nodes[names["down"]]
    assert node.deps == (names["a"],)
    assert node.soft_deps == (names["b"], names["c"])


# identity=False


def test_an_input_outside_identity_is_waited_for_but_never_reruns_the_step() -> None:
    def labels(fit_value: int) -> dict[str, str]:
        fit = mk("fit", fit_value)
        return by_name(build_dag([mk("train", 0, output_of(fit, "fit.json", identity=False))], PREFIX))

    one, two = labels(1), labels(2)
    assert one["fit"] != two["fit"]  # the consulted step changed...
    assert one["train"] == two["train"]  # ...the step that consults it did not
    assert one["train"] == by_name(build_dag([mk("train", 0)], PREFIX))["train"]
    dag = build_dag([mk("train", 0, output_of(mk("fit", 1), identity=False))], PREFIX)
    node = dag.nodes[by_name(dag)["train"]]
    assert node.deps == (by_name(dag)["fit"],)  # it still waits for the fit
    assert (mk("fit", 1) / "x").identity is True
    assert OutputOf(mk("fit", 1), None, True, False).__truediv__("x").identity is False


def test_an_input_outside_identity_cannot_be_versioned() -> None:
    step = mk("train", versioned(output_of(mk("fit", 1), identity=False)))
    with pytest.raises(StepDeclarationError) as excinfo:
        build_dag([step], PREFIX)
    assert "identity=False) cannot be versioned" in message(excinfo) and "`value`" in message(excinfo)


# step / "sub"


def test_step_slash_sub_is_output_of() -> None:
    up = mk("up")
    assert up / "sub" == output_of(up, "sub")
    assert isinstance(up / "sub", OutputOf)
    assert (up / "sub").blocking is True
    assert up / "a" / "b" == output_of(up, "a/b")
    assert output_of(up, "a/") / "b" == output_of(up, "a/b")
    assert output_of(up) / "b" == output_of(up, "b")
    assert output_of(up, "a", blocking=False) / "b" == output_of(up, "a/b", blocking=False)
    assert up / "sub" != output_of(mk("up"), "sub"), "steps compare by object"


def test_step_slash_sub_is_the_same_input_in_the_dag() -> None:
    up = mk("up", 3)
    slash = build_dag([mk("down", 0, up / "data" / "train")], PREFIX)
    explicit = build_dag([mk("down", 0, output_of(up, "data/train"))], PREFIX)
    assert list(slash.nodes) == list(explicit.nodes)
    node = slash.nodes[by_name(slash)["down"]]
    assert node.identity.payload["inputs"]["inputs.0"][1] == "data/train"


# Helpers


def test_join_path() -> None:
    assert join_path("s3://b/p/", "/x/y/") == "s3://b/p/x/y"
    assert join_path("/runs", "a-123") == "/runs/a-123"


def test_labels_matching() -> None:
    a, b = mk("raw/a"), mk("raw/b")
    c = mk("train/c", 0, output_of(a), output_of(b))
    dag = build_dag([c], PREFIX)
    names = by_name(dag)
    assert labels_matching(dag, "^raw/") == {names["raw/a"], names["raw/b"]}
    assert labels_matching(dag, None) == set()
    with pytest.raises(StepDeclarationError, match=r"field `only/force`: invalid regular expression"):
        labels_matching(dag, "(")


def test_resources_ride_along() -> None:
    res = Resources(cpus=4, gpus=1, tpu="v5p-64", slices=2)
    dag = build_dag([mk("s", resources=res)], PREFIX)
    (node,) = dag.nodes.values()
    assert node.step.resources == res


@pytest.mark.parametrize("sub", ["../escape", "/abs/path", "a/../../b", "s3://bucket/x"])
def test_sub_paths_must_stay_inside_the_step_directory(sub):
    up = Step("up", write_value, WriteConfig(output=this_output()))
    down = Step("down", write_value, WriteConfig(output=this_output(), inputs=[output_of(up, sub)]))
    with pytest.raises(StepDeclarationError, match=r"step 'down', field `inputs.0`: sub-path"):
        build_dag([down], "/p")
    mine = Step("mine", write_value, WriteConfig(output=this_output(sub)))
    with pytest.raises(StepDeclarationError, match=r"step 'mine', field `output`: sub-path"):
        build_dag([mine], "/p")
