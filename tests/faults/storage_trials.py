"""Storage faults under a whole executor run: transient failures, and a store that is full.

The executor runs in this process (local backend) against a `memory://` prefix seen through
`tests.faultfs.FaultFS`, so both Drydock's metadata and the step functions' own writes go
through the faulty filesystem:

  flaky   every call fails at random with probability `rate` (an error before the call, a lost
          reply after it, a delay, or a partial write); storage retries its own operations, and
          a step function whose own writes failed (it does not retry them) is retried on its
          `failure_retries` budget (20 here, so that the run finishes);
  full    `FullFS` refuses (ENOSPC) any write that would take the files it holds past a byte
          budget; the run must end with the step FAILED, saying why, and nothing half committed;
          a rerun after space is freed must finish.

Both return `tests.faults.trials.Counts` and are checked with `trials.verify`.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import fsspec

from pipeline import Resources, Step, output_of, this_output, versioned
from pipeline.core.dag import build_dag
from pipeline.core.plan import State, make_plan
from pipeline.processes import current_owner
from pipeline.run.backends.local import LocalBackend
from pipeline.run.records.provenance import step_info
from pipeline.run.scheduler.executor import ExecutionOptions, RunReport, execute
from pipeline.storage.files import Storage
from pipeline.storage.object_stores import RetryPolicy
from pipeline.storage.step_store import StepStore
from tests.faultfs import FaultFS
from tests.faults.stepfns import FILESYSTEMS, PartsConfig, write_parts
from tests.faults.trials import Counts, Experiment, verify

__all__ = ["FullFS", "flaky_trial", "full_trial", "run_in_process"]

ENOSPC_TEXT = os.strerror(errno.ENOSPC)


class FullFS(FaultFS):
    """A FaultFS that also runs out of space: it holds at most `budget` bytes of files."""

    def __init__(self, inner: fsspec.AbstractFileSystem, budget: int, **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.budget = budget
        self.refused = 0
        self._sizes: dict[str, int] = {}
        self._space = threading.Lock()

    def charge(self, path: str, size: int) -> None:
        """Account `path` at `size` bytes, or raise ENOSPC if that would exceed the budget."""
        path = path.split("://", 1)[-1]
        with self._space:
            used = sum(self._sizes.values()) - self._sizes.get(path, 0)
            if used + size > self.budget:
                self.refused += 1
                raise OSError(errno.ENOSPC, ENOSPC_TEXT, path)
            self._sizes[path] = size

    def pipe_file(self, path: str, value: bytes, **kwargs: Any) -> None:
        self.charge(path, len(value))
        super().pipe_file(path, value, **kwargs)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "r" in mode:
            return super().open(path, mode, **kwargs)
        self.charge(path, 0)
        return _Metered(self, path, super().open(path, mode, **kwargs))

    def rm(self, path: str, recursive: bool = False, maxdepth: int | None = None) -> None:
        super().rm(path, recursive=recursive, maxdepth=maxdepth)
        bare = path.split("://", 1)[-1].rstrip("/")
        with self._space:
            for key in [k for k in self._sizes if k == bare or k.startswith(bare + "/")]:
                del self._sizes[key]


class _Metered:
    """A file opened for writing on a FullFS: each write is charged before it happens."""

    def __init__(self, fs: FullFS, path: str, inner: Any) -> None:
        self._fs, self._path, self._inner, self._size = fs, path, inner, 0

    def write(self, data: bytes) -> int:
        self._fs.charge(self._path, self._size + len(data))
        self._size += len(data)
        return self._inner.write(data)

    def close(self) -> None:
        self._inner.close()

    def __enter__(self) -> _Metered:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _steps(exp: Experiment, fs_key: str, retries: int) -> list[Step]:
    steps: dict[str, Step] = {}
    for seed, (name, inputs) in enumerate(exp.shape.items()):
        config = PartsConfig(
            this_output(),
            str(exp.calls),
            versioned(seed),
            exp.parts,
            exp.pause,
            [output_of(steps[i]) for i in inputs],
            fs=fs_key,
        )
        steps[name] = Step(name, write_parts, config, resources=Resources(failure_retries=retries))
    return list(steps.values())


def run_in_process(steps: list[Step], prefix: str, storage: Storage) -> RunReport:
    """Plan and execute `steps` against `storage` with the local backend and short leases."""
    store = StepStore(storage)
    dag = build_dag(steps, prefix)
    snapshot = store.records(node.output_path for node in dag.nodes.values())
    owner = current_owner()
    plan = make_plan(
        dag,
        snapshot,
        now=time.time(),
        local_host=owner.host,
        current_info=lambda label: step_info(dag, label),
    )
    options = ExecutionOptions(
        max_concurrent=2, lease_timeout=3, heartbeat_interval=0.5, wait_poll_interval=0.2
    )
    return execute(plan, store, LocalBackend(), owner, options)


def flaky_trial(workdir: Path, seed: int, rate: float = 0.05) -> Counts:
    """The six-step experiment on a filesystem where every call fails with probability `rate`."""
    exp = Experiment(workdir, pause=0.0)
    workdir.mkdir(parents=True, exist_ok=True)
    key = f"flaky-{uuid.uuid4().hex}"
    prefix = f"memory://{key}"
    kinds = ("error", "lost_reply", "delay", "partial")
    fs = FaultFS(fsspec.filesystem("memory"), rate=rate, seed=seed, random_kinds=kinds)
    FILESYSTEMS[key] = fs
    rng = random.Random(seed)
    storage = Storage(fs, retry=RetryPolicy(tries=8, base=0.01, cap=0.2), uniform=rng.random)
    counts = Counts(trials=1)
    try:
        report = run_in_process(_steps(exp, key, retries=20), prefix, storage)
        counts.faults += len(fs.injected)
        if not report.ok:
            errors = {o.error for o in report.outcomes.values() if o.error}
            counts.problems.append(f"{workdir.name}: the run did not finish: {sorted(errors)}")
        # Check through the wrapped filesystem: the faults were in the calls, not in the data.
        final = verify(exp, fs.inner, prefix)
    finally:
        del FILESYSTEMS[key]
    _count_final(counts, exp, final)
    return counts


def full_trial(workdir: Path, budget: int = 40_000) -> tuple[Counts, RunReport]:
    """Run into a full store, then free space and rerun. Returns the counts and the first report."""
    exp = Experiment(workdir, pause=0.0)
    workdir.mkdir(parents=True, exist_ok=True)
    key = f"full-{uuid.uuid4().hex}"
    prefix = f"memory://{key}"
    fs = FullFS(fsspec.filesystem("memory"), budget)
    FILESYSTEMS[key] = fs
    counts = Counts(trials=1)
    storage = Storage(fs, retry=RetryPolicy(tries=3, base=0.01, cap=0.05))
    try:
        first = run_in_process(_steps(exp, key, retries=0), prefix, storage)
        counts.faults += fs.refused
        after_full = verify(exp, fs.inner, prefix)
        counts.half_committed += len({p.split(":", 1)[0] for p in after_full.problems})
        counts.problems.extend(f"{workdir.name} (full): {p}" for p in after_full.problems)
        fs.budget = 10**9  # space freed
        second = run_in_process(_steps(exp, key, retries=0), prefix, storage)
        if not second.ok:
            errors = {o.error for o in second.outcomes.values() if o.error}
            counts.problems.append(f"{workdir.name}: the rerun with space did not finish: {sorted(errors)}")
        final = verify(exp, fs.inner, prefix)
    finally:
        del FILESYSTEMS[key]
    for key_, call in after_full.committed.items():
        if final.committed.get(key_) != call:
            counts.duplicates += 1
            counts.problems.append(f"{workdir.name}: committed {key_} was replaced by the rerun")
    _count_final(counts, exp, final)
    return counts, first


def _count_final(counts: Counts, exp: Experiment, final: Any) -> None:
    counts.committed += len(final.committed)
    counts.half_committed += len({p.split(":", 1)[0] for p in final.problems})
    counts.problems.extend(f"{exp.workdir.name} (final): {p}" for p in final.problems)
    missing = len(exp.shape) - len(final.committed)
    if missing > 0:
        counts.lost += missing
        counts.problems.append(f"{exp.workdir.name}: {missing} step(s) not committed after the final run")


def failed_states(report: RunReport) -> dict[str, tuple[State, str | None]]:
    """Step name -> (state, error) for the steps of `report` that did not succeed."""
    return {
        report.plan.dag.nodes[label].name: (o.state, o.error)
        for label, o in report.outcomes.items()
        if o.state not in (State.SUCCEEDED, State.CACHED)
    }
