"""A training with a fault planted in one process's data, for the multi-host tests (module-level,
so Ray workers import it)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from levanter.data.dataset import AsyncDataset

from pipeline import current_gang, step_function
from steps.training.train_moe import TRAINING_PACE, TrainMoeConfig, train_moe


class _Poisoned(AsyncDataset):
    """A training set whose examples of data batch `batch` carry a NaN loss weight."""

    def __init__(self, inner: AsyncDataset, batch: int, batch_size: int) -> None:
        super().__init__()
        self.inner, self.batch, self.batch_size = inner, batch, batch_size

    async def async_len(self) -> int:
        return await self.inner.async_len()

    def is_finite(self) -> bool:
        return self.inner.is_finite()

    def _poison(self, index: int, example: Any) -> Any:
        if index // self.batch_size != self.batch:
            return example
        import dataclasses

        return dataclasses.replace(example, loss_weight=example.loss_weight * float("nan"))

    async def get_batch(self, indices: Sequence[int]) -> Sequence[Any]:
        examples = await self.inner.get_batch(indices)
        return [self._poison(int(i), e) for i, e in zip(indices, examples, strict=True)]

    async def getitem_async(self, index: int) -> Any:
        return self._poison(int(index), await self.inner.getitem_async(index))


@dataclass(frozen=True)
class PoisonedTrainConfig:
    train: TrainMoeConfig
    process: int
    """The process of the gang whose share of the data is poisoned."""
    batch: int
    """The data batch whose examples (on that process) get a NaN loss weight."""


@step_function(fresh_process=True, watchdog=TRAINING_PACE)
def poisoned_train(config: PoisonedTrainConfig) -> dict[str, Any]:
    """`train_moe`, with a NaN planted in one process's share of one data batch: the gang's
    loss at that step is NaN for every process, and the spike policy must rewind them all."""
    if current_gang().index == config.process:
        import steps.data.mixture as mixture

        load = mixture.load_data_config

        def poisoned_load(path: str) -> Any:
            data = copy.copy(load(path))
            train_set = data.train_set

            def poisoned_train_set(*args: Any, **kwargs: Any) -> AsyncDataset:
                return _Poisoned(train_set(*args, **kwargs), config.batch, config.train.batch_size)

            object.__setattr__(data, "train_set", poisoned_train_set)
            return data

        mixture.load_data_config = poisoned_load  # type: ignore[assignment]
    return train_moe(config.train)


@dataclass(frozen=True)
class HangingTrainConfig:
    train: TrainMoeConfig
    process: int
    """The process of the gang that stops taking part."""
    step: int
    """At this step's loss, that process never enters the gang's collective."""
    marker: str
    """Made when it hangs: it hangs once (the retry goes through)."""


def _stuck() -> None:
    """Where the hung process waits (short sleeps: a cancellation kills it anyway)."""
    while True:
        time.sleep(0.05)


@step_function(fresh_process=True, watchdog=TRAINING_PACE)
def hanging_train(config: HangingTrainConfig) -> dict[str, Any]:
    """`train_moe`, in which one process of the gang, once, stops at a step's loss instead of
    entering the collective the others wait in: the hang a real pod shows when one host is stuck."""
    if current_gang().index == config.process and not os.path.exists(config.marker):
        import steps.training.tracker as hooks

        decide = hooks.decide_together

        def decide_or_hang(step: int, rewind: Any, guard: Any) -> None:
            if step == config.step:
                open(config.marker, "w").close()
                _stuck()
            decide(step, rewind, guard)

        hooks.decide_together = decide_or_hang  # type: ignore[assignment]
    return train_moe(config.train)
