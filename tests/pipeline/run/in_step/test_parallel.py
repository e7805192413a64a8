"""Parallel work inside a step goes to the backend running it (`pipeline.run.in_step.parallel`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned
from pipeline.run.in_step import step_events
from pipeline.run.in_step.parallel import parallel_map


def square_and_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_sequential_with_one_worker_in_this_process():
    results = list(parallel_map(square_and_pid, [(1,), (2,), (3,)], max_workers=1))
    assert [r for r, _pid in results] == [1, 4, 9]
    assert {pid for _r, pid in results} == {os.getpid()}


def test_outside_a_step_or_on_the_local_backend_in_local_processes():
    results = sorted(parallel_map(square_and_pid, [(i,) for i in range(4)], max_workers=2))
    assert [r for r, _pid in results] == [0, 1, 4, 9]
    assert os.getpid() not in {pid for _r, pid in results}


@dataclass(frozen=True)
class FanConfig:
    output: str
    n: int = 3


def fan_out_step(config: FanConfig) -> None:
    context = step_events.current()
    assert context is not None and context.backend == "local"
    values = sorted(
        r for r, _pid in parallel_map(square_and_pid, [(i,) for i in range(config.n)], max_workers=2)
    )
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "squares.txt"), "w") as f:
        f.write(",".join(map(str, values)))


def test_a_step_on_the_local_backend_knows_its_backend_and_fans_out(tmp_path):
    step = Step("fan", fan_out_step, FanConfig(this_output(), versioned(3)))
    report = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local"))
    assert report.ok
    (out,) = (tmp_path / "p").glob("fan-*/squares.txt")
    assert out.read_text() == "0,1,4"
