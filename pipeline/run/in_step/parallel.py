"""Parallel work inside a step, asked of the backend that runs the step.

    for stats in parallel_map(tokenize_shard, [(config, shard) for shard in shards], max_workers=4):
        ...

On the Ray backend the calls become Ray tasks (on any node of the cluster); on the local backend
(or outside a step), local processes. With `max_workers` 1 or a single call, they run here one
by one. Results come in completion order. `fn` must be importable by worker processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from pipeline.run.backends import backend_class
from pipeline.run.in_step import step_events

__all__ = ["parallel_map"]

T = TypeVar("T")


def parallel_map(fn: Callable[..., T], args: Sequence[tuple[Any, ...]], *, max_workers: int) -> Iterator[T]:
    """`fn(*a)` for every `a` in `args`, in parallel on the running step's backend."""
    if not args:
        return
    if max_workers <= 1 or len(args) == 1:
        for a in args:
            yield fn(*a)
        return
    context = step_events.current()
    yield from backend_class(context.backend if context else "local").fan_out(fn, args, max_workers)
