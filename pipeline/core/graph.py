"""Graph algorithms on a dependency mapping `{node: [upstream, ...]}`. Pure functions, no I/O.

Nodes are any hashable values; every node must appear as a key. Orders are deterministic:
they follow the mapping's insertion order, so plans and manifests are stable across runs.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

__all__ = ["ancestors", "depth_first_order", "descendants", "find_cycle", "reverse", "topological_order"]

N = TypeVar("N", bound=Hashable)

_DONE = object()  # end of a node's upstreams; not None, which is a valid node


def find_cycle(deps: Mapping[N, Sequence[N]]) -> list[N] | None:
    """A cycle as a list of nodes `[a, b, ..., a]`, or None if the graph is acyclic."""
    white, grey, black = 0, 1, 2
    color: dict[N, int] = dict.fromkeys(deps, white)
    for start in deps:
        if color[start] != white:
            continue
        # Iterative DFS: deep DAGs (a 10,000-step chain) must not hit the recursion limit.
        path: list[N] = [start]
        stack: list[Iterable[N]] = [iter(deps[start])]
        color[start] = grey
        while stack:
            nxt = next(stack[-1], _DONE)  # type: ignore[call-overload]
            if nxt is _DONE:
                color[path.pop()] = black
                stack.pop()
                continue
            if color[nxt] == grey:
                return [*path[path.index(nxt) :], nxt]
            if color[nxt] == white:
                color[nxt] = grey
                path.append(nxt)
                stack.append(iter(deps[nxt]))
    return None


def topological_order(deps: Mapping[N, Sequence[N]]) -> list[N]:
    """Every node after all of its upstreams. Raises ValueError on a cycle."""
    indegree = {n: len(set(ups)) for n, ups in deps.items()}
    downstream = reverse(deps)
    ready = [n for n, d in indegree.items() if d == 0]
    order: list[N] = []
    i = 0
    while i < len(ready):
        node = ready[i]
        i += 1
        order.append(node)
        for child in downstream[node]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) != len(deps):
        raise ValueError("graph has a cycle")
    return order


def depth_first_order(deps: Mapping[N, Sequence[N]], roots: Sequence[N]) -> list[N]:
    """Nodes reachable from `roots`, each after its upstreams, in the order they are declared.

    Upstreams come first in the order they are listed, so a plan reads the way the experiment
    file declares its steps. The graph must be acyclic (check with `find_cycle` first).
    """
    order: list[N] = []
    done: set[N] = set()
    for root in roots:
        if root in done:
            continue
        done.add(root)
        stack: list[tuple[N, Iterator[N]]] = [(root, iter(deps[root]))]
        while stack:
            node, ups = stack[-1]
            nxt = next(ups, _DONE)
            if nxt is _DONE:
                stack.pop()
                order.append(node)
            elif nxt not in done:
                done.add(nxt)
                stack.append((nxt, iter(deps[nxt])))
    return order


def reverse(deps: Mapping[N, Sequence[N]]) -> dict[N, list[N]]:
    """The downstream mapping `{node: [dependents, ...]}`, each dependent listed once."""
    out: dict[N, list[N]] = {n: [] for n in deps}
    for node, ups in deps.items():
        for up in dict.fromkeys(ups):
            out[up].append(node)
    return out


def ancestors(deps: Mapping[N, Sequence[N]], nodes: Iterable[N]) -> set[N]:
    """All transitive upstreams of `nodes` (not including the nodes themselves)."""
    return _closure(deps, nodes)


def descendants(deps: Mapping[N, Sequence[N]], nodes: Iterable[N]) -> set[N]:
    """All transitive dependents of `nodes` (not including the nodes themselves)."""
    return _closure(reverse(deps), nodes)


def _closure(edges: Mapping[N, Sequence[N]], nodes: Iterable[N]) -> set[N]:
    seen: set[N] = set()
    stack = [up for n in nodes for up in edges[n]]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(edges[node])
    return seen
