"""Fixes to Levanter that train_moe applies only when a probe shows the bug is present: Mixtral's
differentiable logging, evaluation's host-tag arrays, TensorStore's cache after a rewind."""

from __future__ import annotations

import functools
import logging
from typing import Any

import jax
import jax.numpy as jnp
import levanter.eval
import levanter.tracker
import levanter.tracker.tracker_fns as tracker_fns
import numpy as np
from levanter.tracker.tracker import NoopTracker

from steps.training import ledger
from steps.training.tracker import evaluating

logger = logging.getLogger(__name__)

__all__ = [
    "fix_eval_tag_arrays",
    "fix_mixtral_jit_log",
    "fresh_tensorstore_cache",
    "jit_log_breaks_grad",
    "keep_alive_while_evaluating",
]

_ORIGINAL_JIT_LOG = tracker_fns.jit_log


def _differentiable_jit_log(metrics: Any, *, step: int | None = None) -> None:
    # Same as Levanter's jit_log, with jax.debug.callback (which has a JVP rule and is called on
    # primal values only) instead of io_callback (which has none).
    if tracker_fns._global_tracker is None:
        tracker_fns._log_missing_tracker_once()
        return
    if not tracker_fns._should_use_callback:
        tracker_fns._global_tracker.log(metrics, step=step, commit=False)
        return
    jax.debug.callback(functools.partial(tracker_fns._do_jit_log, step=step), metrics)


def jit_log_breaks_grad() -> bool:
    """Whether `levanter.tracker.jit_log` inside a differentiated function fails (the Mixtral bug)."""

    def f(x: jax.Array) -> jax.Array:
        levanter.tracker.jit_log({"probe": x})
        return x * x

    with tracker_fns.current_tracker(NoopTracker()):
        try:
            jax.jit(jax.grad(f))(jnp.float32(1.0)).block_until_ready()
        except ValueError as e:
            if "do not support JVP" in str(e):
                return True
            raise
    return False


def fix_mixtral_jit_log() -> bool:
    """Make Levanter's in-loss router logging differentiable, if (and only if) it is not.

    Levanter's Mixtral calls `levanter.tracker.jit_log` inside the loss, and `jit_log` uses
    `io_callback`, which cannot be differentiated: training fails at its first step with "IO
    callbacks do not support JVP". Swapping the transport keeps every router statistic. Returns
    whether the fix is in place; a Levanter that fixed the bug is left alone.
    """
    if levanter.tracker.jit_log is _differentiable_jit_log:
        return True
    if not jit_log_breaks_grad():
        logger.info("levanter.tracker.jit_log is differentiable in this Levanter; no fix needed")
        return False
    logger.info("Mixtral: routing levanter.tracker.jit_log through jax.debug.callback (differentiable)")
    tracker_fns.jit_log = _differentiable_jit_log
    levanter.tracker.jit_log = _differentiable_jit_log
    return True


def _host_tag_arrays(self: Any) -> list[Any]:
    # As Levanter's DomainTaggedDataset._compute_tag_arrays, but host (numpy) arrays: the loader
    # stacks them into the batch and places the batch on the devices itself.
    arrays = []
    for _dataset, tags in self.datasets:
        array = np.zeros(self.num_tags, dtype=np.int32)
        array[[self.tag_to_index[tag] for tag in tags]] = 1
        arrays.append(array)
    return arrays


def fix_eval_tag_arrays() -> bool:
    """Make Levanter's evaluation work on more than one device; whether it was needed.

    Levanter's `DomainTaggedDataset` makes each validation set's tag array with `jnp.asarray`
    while the trainer's mesh is current: with several devices (one process's, or a gang's) that
    is an array on all of them, and the data loader, which stacks a batch on one device before
    placing it, fails ("Received incompatible devices for jitted computation ... device ids [0,
    2048]"). Host arrays are what the loader expects. Applied only with more than one device.
    """
    if jax.device_count() == 1:
        return False
    from levanter.eval import DomainTaggedDataset

    DomainTaggedDataset._compute_tag_arrays = _host_tag_arrays  # type: ignore[method-assign]
    return True


def fresh_tensorstore_cache() -> None:
    """Give JAX's checkpoint serialization a new TensorStore context, so a new, empty cache.

    JAX keeps one context (with a 10 GB cache pool) for the whole process and binds it as the
    default argument of its serialization functions. A rewind moves checkpoints away and the
    training saves the same steps again at the same paths; with the old cache, TensorStore took
    the new OCDBT database for the old one and read data files that were no longer there
    ("Error reading Byte range ... step-40/d/..."). Called after every rewind.
    """
    import jax.experimental.array_serialization.serialization as serialization
    import jax.experimental.array_serialization.tensorstore_impl as impl
    import tensorstore as ts

    old = impl._TS_CONTEXT
    new = ts.Context(old.spec)
    for module in (impl, serialization):
        for name, value in list(vars(module).items()):
            if value is old:
                setattr(module, name, new)
            elif callable(value) and getattr(value, "__defaults__", None):
                value.__defaults__ = tuple(new if d is old else d for d in value.__defaults__)


def keep_alive_while_evaluating() -> None:
    """Make Levanter's in-training evaluation callback report progress while it runs
    (`steps.training.tracker.evaluating`): train_lm builds it with `levanter.eval.cb_tagged_lm_evaluate`,
    looked up on the module at each call, so wrapping that attribute wraps every evaluation."""
    original = levanter.eval.cb_tagged_lm_evaluate
    if getattr(original, "_drydock_keepalive", False):
        return

    @functools.wraps(original)
    def build(*args: Any, **kwargs: Any) -> Any:
        callback = original(*args, **kwargs)

        # Levanter passes `force=` to hooks whose signature takes it: the wrapper shows the
        # callback's own signature (`inspect.signature` follows `__wrapped__`).
        @functools.wraps(callback)
        def evaluate(*cb_args: Any, **cb_kwargs: Any) -> Any:
            with evaluating(), ledger.phase("evaluation"):
                return callback(*cb_args, **cb_kwargs)

        return evaluate

    build._drydock_keepalive = True  # type: ignore[attr-defined]
    levanter.eval.cb_tagged_lm_evaluate = build


def time_restores() -> None:
    """Give the time Levanter spends loading a checkpoint to the ledger's `restore`: its
    `load_checkpoint_or_initialize` calls `levanter.checkpoint.load_checkpoint`, looked up on the
    module at each call."""
    import levanter.checkpoint

    original = levanter.checkpoint.load_checkpoint
    if getattr(original, "_drydock_timed", False):
        return

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        with ledger.phase("restore"):
            return original(*args, **kwargs)

    load._drydock_timed = True  # type: ignore[attr-defined]
    levanter.checkpoint.load_checkpoint = load
