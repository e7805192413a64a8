"""What a rewind changes in the next training attempt: the data batches skipped, the learning rate
lowered, the schedule shifted, and a fresh optimizer state."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from levanter.data.dataset import AsyncDataset

from steps.training.spikes import Rewind, data_batch

logger = logging.getLogger(__name__)

__all__ = ["SkippedBatches", "fresh_optimizer_state", "scale_learning_rate", "shift_schedule", "skip_batches"]


class SkippedBatches(AsyncDataset):
    """A training dataset whose batches in `skipped` (inclusive ranges of data batches) are never
    read: training step `s` gets data batch `spikes.data_batch(skipped, s)`."""

    def __init__(self, inner: AsyncDataset, skipped: list[tuple[int, int]], batch_size: int) -> None:
        super().__init__()
        self.inner = inner
        self.skipped = skipped
        self.batch_size = batch_size
        self._count = sum(b - a + 1 for a, b in skipped) * batch_size

    def _index(self, index: int) -> int:
        step, within = divmod(int(index), self.batch_size)
        return data_batch(self.skipped, step) * self.batch_size + within

    async def async_len(self) -> int:
        return max(0, await self.inner.async_len() - self._count)

    def is_finite(self) -> bool:
        return self.inner.is_finite()

    async def get_batch(self, indices: Sequence[int]) -> Sequence[Any]:
        return await self.inner.get_batch([self._index(i) for i in indices])

    async def getitem_async(self, index: int) -> Any:
        return await self.inner.getitem_async(self._index(index))


def skip_batches(data: Any, skipped: list[tuple[int, int]], batch_size: int) -> Any:
    """A copy of the Levanter data config `data` whose training set leaves out `skipped` batches."""
    if not skipped:
        return data
    data = copy.copy(data)
    train_set = data.train_set

    def skipping_train_set(*args: Any, **kwargs: Any) -> AsyncDataset:
        return SkippedBatches(train_set(*args, **kwargs), skipped, batch_size)

    object.__setattr__(data, "train_set", skipping_train_set)
    return data


def scale_learning_rate(optimizer: Any, rewinds: Sequence[Rewind], offset: int = 0) -> Any:
    """A copy of the Levanter optimizer config `optimizer` whose schedule is multiplied by
    `spikes.lr_multiplier(rewinds, step)` (the schedule's count is the optimizer step, which is
    the training step less `offset`: a branch's fresh optimizer counts from the branch point)."""
    windows = [
        (r.lr_from_step, r.lr_until_step, r.lr_factor)
        for r in rewinds
        if r.lr_from_step is not None and r.lr_until_step is not None and r.lr_factor != 1
    ]
    if not windows:
        return optimizer
    optimizer = copy.copy(optimizer)
    scheduler = optimizer.lr_scheduler

    def scaled_scheduler(num_train_steps: int, override_lr: float | None = None) -> Any:
        schedule = scheduler(num_train_steps, override_lr=override_lr)

        def scaled(count: Any) -> Any:
            factor = jnp.ones((), dtype=jnp.float32)
            step = count + offset
            for first, until, scale in windows:
                factor = factor * jnp.where((step >= first) & (step < until), scale, 1.0)
            return schedule(count) * factor

        return scaled

    object.__setattr__(optimizer, "lr_scheduler", scaled_scheduler)
    return optimizer


def shift_schedule(optimizer: Any, steps_done: int) -> Any:
    """A copy of the Levanter optimizer config `optimizer` whose schedule spans the run's steps
    less `steps_done`: for a branch that starts a fresh optimizer (its count 0) at step
    `steps_done`, so its warm-up and decay fit the steps it trains. Unchanged for 0."""
    if not steps_done:
        return optimizer
    optimizer = copy.copy(optimizer)
    scheduler = optimizer.lr_scheduler

    def shifted(num_train_steps: int, override_lr: float | None = None) -> Any:
        return scheduler(num_train_steps - steps_done, override_lr=override_lr)

    object.__setattr__(optimizer, "lr_scheduler", shifted)
    return optimizer


@contextlib.contextmanager
def fresh_optimizer_state(active: bool = True) -> Iterator[None]:
    """While active, Levanter's trainer loads only the model, step and key of the checkpoint it
    initializes from, and initializes the optimizer's state afresh (a branch with init="weights").

    Levanter decides what to read from a checkpoint by the mask `saveable_training_mask` gives;
    `Trainer.initial_state` is its only caller in `levanter.trainer` (saving uses its own module's
    name), so this changes what the initial state loads and nothing it saves."""
    if not active:
        yield
        return
    import levanter.trainer as trainer_module

    original = trainer_module.saveable_training_mask

    def weights_only(state: Any, is_trainable: Any = True) -> Any:
        mask = original(state, is_trainable)
        off = jax.tree_util.tree_map(lambda _: False, mask.opt_state)
        averaging = jax.tree_util.tree_map(lambda _: False, mask.model_averaging)
        return dataclasses.replace(mask, opt_state=off, model_averaging=averaging)

    trainer_module.saveable_training_mask = weights_only
    try:
        yield
    finally:
        trainer_module.saveable_training_mask = original
