"""Graph algorithms on `{node: [upstream, ...]}` mappings: cycles, orders, closures, deep chains."""

from __future__ import annotations

import itertools
import random
import sys

import pytest

from pipeline.core.graph import (
    ancestors,
    depth_first_order,
    descendants,
    find_cycle,
    reverse,
    topological_order,
)

DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def chain(n: int) -> dict[int, list[int]]:
    """0 <- 1 <- 2 <- ... <- n-1 (each node depends on the previous one)."""
    return {i: [i - 1] if i else [] for i in range(n)}


def assert_is_cycle(deps, cycle) -> None:
    assert cycle is not None
    assert len(cycle) >= 2
    assert cycle[0] == cycle[-1]
    assert len(set(cycle[:-1])) == len(cycle) - 1, "a cycle visits each node once"
    for node, up in itertools.pairwise(cycle):
        assert up in deps[node], f"{node} -> {up} is not an edge"


def assert_topological(deps, order) -> None:
    assert sorted(map(repr, order)) == sorted(map(repr, deps))
    position = {n: i for i, n in enumerate(order)}
    for node, ups in deps.items():
        for up in ups:
            assert position[up] < position[node], f"{up} must come before {node}"


# find_cycle


@pytest.mark.parametrize(
    "deps",
    [
        {},
        {"a": []},
        DIAMOND,
        chain(50),
        {"a": ["b", "b"], "b": []},  # a repeated edge is not a cycle
    ],
)
def test_find_cycle_none_when_acyclic(deps) -> None:
    assert find_cycle(deps) is None


def test_find_cycle_two_nodes_returns_the_path() -> None:
    assert find_cycle({"a": ["b"], "b": ["a"]}) == ["a", "b", "a"]


def test_find_cycle_self_loop() -> None:
    assert find_cycle({"a": ["a"]}) == ["a", "a"]


def test_find_cycle_returns_only_the_cycle_not_the_path_into_it() -> None:
    # x -> y -> a -> b -> c -> a: the cycle is a, b, c; x and y merely lead to it.
    deps = {"x": ["y"], "y": ["a"], "a": ["b"], "b": ["c"], "c": ["a"]}
    cycle = find_cycle(deps)
    assert cycle == ["a", "b", "c", "a"]


def test_find_cycle_in_a_graph_with_an_acyclic_part_first() -> None:
    deps = {**DIAMOND, "p": ["q", "d"], "q": ["r"], "r": ["p"]}
    cycle = find_cycle(deps)
    assert_is_cycle(deps, cycle)
    assert set(cycle) == {"p", "q", "r"}


def test_find_cycle_is_deterministic() -> None:
    deps = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": ["b"]}
    first = find_cycle(deps)
    assert_is_cycle(deps, first)
    assert all(find_cycle(dict(deps)) == first for _ in range(5))


@pytest.mark.parametrize("none_pos", ["upstream", "downstream"])
def test_find_cycle_treats_none_as_an_ordinary_node(none_pos) -> None:
    # Nodes are any hashable values, None included: it must not be mistaken for "no more edges".
    deps = {"a": [None], None: ["a"]} if none_pos == "upstream" else {None: ["a"], "a": [None]}
    cycle = find_cycle(deps)
    assert_is_cycle(deps, cycle)
    assert set(cycle) == {"a", None}
    with pytest.raises(ValueError):
        topological_order(deps)


def test_find_cycle_none_node_acyclic() -> None:
    deps = {None: [], "a": [None], "b": ["a", None]}
    assert find_cycle(deps) is None
    assert topological_order(deps) == [None, "a", "b"]


def test_find_cycle_on_random_graphs_agrees_with_topological_order() -> None:
    rng = random.Random(1234)
    seen = {"acyclic": 0, "cyclic": 0}
    for _ in range(300):
        n = rng.randint(1, 12)
        deps = {i: rng.sample(range(n), rng.randint(0, min(3, n))) for i in range(n)}
        cycle = find_cycle(deps)
        if cycle is None:
            assert_topological(deps, topological_order(deps))
            seen["acyclic"] += 1
        else:
            assert_is_cycle(deps, cycle)
            with pytest.raises(ValueError, match="cycle"):
                topological_order(deps)
            seen["cyclic"] += 1
    # Both kinds were drawn often enough to mean something.
    assert min(seen.values()) >= 30, seen


# topological_order


def test_topological_order_diamond() -> None:
    assert topological_order(DIAMOND) == ["a", "b", "c", "d"]


def test_topological_order_follows_insertion_order_for_independent_nodes() -> None:
    assert topological_order({"z": [], "y": [], "x": []}) == ["z", "y", "x"]
    assert topological_order({"x": [], "z": [], "y": []}) == ["x", "z", "y"]


def test_topological_order_puts_upstreams_first_whatever_the_key_order() -> None:
    deps = {"d": ["b", "c"], "c": ["a"], "b": ["a"], "a": []}
    order = topological_order(deps)
    assert_topological(deps, order)
    assert order[0] == "a" and order[-1] == "d"


def test_topological_order_is_deterministic() -> None:
    rng = random.Random(7)
    nodes = list(range(200))
    deps = {n: rng.sample(nodes[:n], min(n, 3)) for n in nodes}
    shuffled = dict(sorted(deps.items(), key=lambda kv: rng.random()))
    order = topological_order(shuffled)
    assert_topological(deps, order)
    for _ in range(5):
        assert topological_order(dict(shuffled)) == order


def test_topological_order_handles_repeated_edges() -> None:
    deps = {"a": [], "b": ["a", "a", "a"], "c": ["b", "a", "b"]}
    assert topological_order(deps) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "deps",
    [
        {"a": ["a"]},
        {"a": ["b"], "b": ["a"]},
        {"root": [], "a": ["root", "c"], "b": ["a"], "c": ["b"], "leaf": ["c"]},
    ],
)
def test_topological_order_raises_on_cycle(deps) -> None:
    with pytest.raises(ValueError, match="cycle"):
        topological_order(deps)


def test_topological_order_empty() -> None:
    assert topological_order({}) == []


# depth_first_order


def test_depth_first_order_lists_upstreams_first_in_declaration_order() -> None:
    # d's upstreams are listed (b, c); each is preceded by its own upstreams.
    assert depth_first_order(DIAMOND, ["d"]) == ["a", "b", "c", "d"]
    assert depth_first_order({**DIAMOND, "d": ["c", "b"]}, ["d"]) == ["a", "c", "b", "d"]


def test_depth_first_order_only_reachable_nodes_each_once() -> None:
    deps = {**DIAMOND, "x": [], "y": ["x"]}
    assert depth_first_order(deps, ["b"]) == ["a", "b"]
    assert depth_first_order(deps, ["y", "d", "y", "b"]) == ["x", "y", "a", "b", "c", "d"]
    assert depth_first_order(deps, []) == []


def test_depth_first_order_is_topological_on_random_dags() -> None:
    rng = random.Random(99)
    for _ in range(100):
        n = rng.randint(1, 15)
        deps = {i: rng.sample(range(i), rng.randint(0, min(3, i))) for i in range(n)}
        roots = rng.sample(range(n), rng.randint(1, n))
        order = depth_first_order(deps, roots)
        assert set(order) == set(roots) | ancestors(deps, roots)
        assert_topological({k: deps[k] for k in order}, order)


def test_depth_first_order_treats_none_as_an_ordinary_node() -> None:
    deps = {None: [], "a": [None], "b": ["a", None]}
    assert depth_first_order(deps, ["b"]) == [None, "a", "b"]


# reverse, ancestors, descendants


def test_reverse_lists_each_dependent_once_in_order() -> None:
    deps = {"a": [], "b": ["a", "a"], "c": ["a"], "d": ["c", "b"]}
    assert reverse(deps) == {"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}


def test_ancestors() -> None:
    assert ancestors(DIAMOND, ["d"]) == {"a", "b", "c"}
    assert ancestors(DIAMOND, ["b"]) == {"a"}
    assert ancestors(DIAMOND, ["a"]) == set()
    assert ancestors(DIAMOND, ["b", "c"]) == {"a"}
    assert ancestors(DIAMOND, []) == set()


def test_descendants() -> None:
    assert descendants(DIAMOND, ["a"]) == {"b", "c", "d"}
    assert descendants(DIAMOND, ["b"]) == {"d"}
    assert descendants(DIAMOND, ["d"]) == set()
    assert descendants(DIAMOND, ["b", "c"]) == {"d"}


def test_closures_exclude_the_start_nodes_unless_reachable_from_another() -> None:
    deps = {"a": [], "b": ["a"], "c": ["b"]}
    assert ancestors(deps, ["c", "b"]) == {"a", "b"}
    assert descendants(deps, ["a", "b"]) == {"b", "c"}


def test_closures_on_disconnected_components() -> None:
    deps = {**DIAMOND, "x": [], "y": ["x"]}
    assert ancestors(deps, ["y"]) == {"x"}
    assert descendants(deps, ["a"]) == {"b", "c", "d"}
    assert descendants(deps, ["x"]) == {"y"}


def test_closures_terminate_on_cycles() -> None:
    deps = {"a": ["c"], "b": ["a"], "c": ["b"], "d": ["a"]}
    assert ancestors(deps, ["d"]) == {"a", "b", "c"}
    assert ancestors(deps, ["a"]) == {"a", "b", "c"}
    assert descendants(deps, ["a"]) == {"a", "b", "c", "d"}


# Deep graphs must not hit the recursion limit.

DEEP = 20_000


def test_deep_chain_needs_no_recursion() -> None:
    assert sys.getrecursionlimit() < DEEP
    deps = chain(DEEP)
    assert find_cycle(deps) is None
    assert topological_order(deps) == list(range(DEEP))
    assert depth_first_order(deps, [DEEP - 1]) == list(range(DEEP))
    assert ancestors(deps, [DEEP - 1]) == set(range(DEEP - 1))
    assert descendants(deps, [0]) == set(range(1, DEEP))


def test_deep_chain_reversed_insertion_order() -> None:
    deps = dict(reversed(list(chain(DEEP).items())))
    assert find_cycle(deps) is None
    assert topological_order(deps) == list(range(DEEP))


def test_deep_cycle_is_found_in_full() -> None:
    deps = chain(DEEP)
    deps[0] = [DEEP - 1]
    cycle = find_cycle(deps)
    assert_is_cycle(deps, cycle)
    assert len(cycle) == DEEP + 1
    with pytest.raises(ValueError):
        topological_order(deps)
