"""The interface every backend implements, and the task it is handed.

A backend only runs step functions somewhere. Leases, status events and commits stay in the
executor, on the machine that runs it, so the commit protocol is the same for every backend.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, TypeVar

from pipeline.core.plan import Plan
from pipeline.run.in_step.gang import ALONE, Gang
from pipeline.run.in_step.step_events import StepContext
from pipeline.step import Resources

__all__ = ["Backend", "StepTask"]

T = TypeVar("T")


@dataclass(frozen=True)
class StepTask:
    """One call of a step function, ready to run."""

    label: str
    name: str
    fn: Callable[[Any], Any]
    config: Any
    """The resolved config (placeholders are paths, versioned values unwrapped)."""
    resources: Resources
    output_path: str
    attempt: int = 1
    """Attempt number within this run."""
    token: int = 1
    """The attempt's fencing token: unique and growing across runs (names log files)."""
    run_id: str = ""
    """The executor's run id (for notes the step reports, see `pipeline.run.in_step.step_events`)."""
    lease_remaining: Callable[[], float] | None = None
    """Seconds this attempt's lease is surely still held, as the executor's heartbeat knows it
    (zero or less once it may have expired). Backends running the step in the executor's process
    fence the step's writes with it (`pipeline.run.in_step.fence`); None: no fence."""
    followed: bool = False
    """Other steps of the run follow this one: the runner starts them once it has started."""
    lease_poll: float | None = None
    """For backends running the step in another process: how often that process re-reads the
    step's `.lease` to fence the step's writes at the lease's expiry (see `pipeline.run.in_step.fence`).
    Must leave the executor's renewals time to land: poll + heartbeat interval < lease timeout.
    None: no fence."""

    def context(self, backend: str, gang: Gang = ALONE) -> StepContext:
        """What `pipeline.run.in_step.step_events` needs inside the step function, run by `backend` in
        the process at `gang` (a gang of one unless the step spans hosts)."""
        return StepContext(self.output_path, self.run_id, self.token, backend, gang, self.followed)


class Backend(abc.ABC):
    """Runs step functions. Implementations (`pipeline.run.backends.REGISTRY`): `local`
    (threads of the executor's process) and `ray`."""

    name: str = "backend"
    queues: bool = False
    """Whether an attempt may wait for resources after its lease is taken (Ray's scheduler): then
    its function announces its start (`pipeline.run.in_step.pulse.announce_start`) and `drydock status`
    shows it QUEUED until then. The local backend starts a function as soon as it leases it."""
    remote_workers: bool = False
    """Whether step functions may run on another host than the executor: then they can outlive
    a killed executor for a while, and its steps are taken over only once their leases expire
    (recorded in each `RUNNING` event; see `pipeline.core.records.may_outlive_runner`)."""

    @classmethod
    @abc.abstractmethod
    def create(cls, options: Any, *, verbose: bool = False) -> Backend:
        """The backend, from its own options (`pipeline.run.options`: `--ray.address`, ...);
        with `verbose`, steps' output is streamed to the console too (`--verbose`)."""

    @staticmethod
    def fan_out(fn: Callable[..., T], args: Sequence[tuple[Any, ...]], max_workers: int) -> Iterator[T]:
        """`fn(*a)` for every `a`, in parallel, for a step running on this backend (see
        `pipeline.run.in_step.parallel`); results in completion order. Here: local processes (spawned:
        the executor runs steps in threads, and forking a threaded process is unsafe)."""
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers, mp_context=context) as pool:
            futures = [pool.submit(fn, *a) for a in args]
            for future in as_completed(futures):
                yield future.result()

    def validate(self, plan: Plan) -> list[str]:
        """Raise a `DrydockError` if a step to run can never be scheduled here; return warnings
        about what will run, but worse than the user may expect (followers that must wait)."""
        return []

    def default_concurrency(self) -> int:
        """How many steps run at once when `--max_concurrent` is not given."""
        return 8

    def describe(self) -> str:
        """Where steps run, for the first line of a run: `local threads`, `ray: private local
        instance (2 CPUs)`, `ray: cluster at HOST:PORT (3 nodes: 96 CPUs, 8 GPUs)`."""
        return self.name

    @abc.abstractmethod
    def run(self, task: StepTask) -> None:
        """Run `task.fn(task.config)` and block until it ends.

        Raises what the function raised, or `StepCancelled` after `cancel(task.label)`.
        Called from several executor threads at once.
        """

    @abc.abstractmethod
    def cancel(self, label: str) -> None:
        """Stop the running task `label` as soon as possible; its `run` raises `StepCancelled`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release whatever the backend started."""
