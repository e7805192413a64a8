"""Module-level step functions and configs for the engine's tests.

Every function appends one line to `<counter>/<name>.calls` when it runs, so tests (and other
processes) can count exactly how many times each step function executed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from pipeline import step_function


def count_call(counter: str | None, name: str) -> None:
    if counter:
        os.makedirs(counter, exist_ok=True)
        with open(os.path.join(counter, f"{name}.calls"), "a") as f:
            f.write(f"{os.getpid()}\n")


def calls(counter: str, name: str) -> int:
    try:
        with open(os.path.join(counter, f"{name}.calls")) as f:
            return len(f.read().split())
    except FileNotFoundError:
        return 0


@dataclass(frozen=True)
class WriteConfig:
    output: str
    value: int = 0
    counter: str | None = None
    name: str = "write"
    inputs: list[str] = field(default_factory=list)
    sleep: float = 0.0
    log_every: int = 10


@step_function
def write_value(config: WriteConfig) -> None:
    """Write `value` plus the sum of the values of `inputs` to `value.json`."""
    count_call(config.counter, config.name)
    total = config.value
    for path in config.inputs:
        with open(os.path.join(path, "value.json")) as f:
            total += json.load(f)["value"]
    if config.sleep:
        time.sleep(config.sleep)
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "value.json"), "w") as f:
        json.dump({"value": total}, f)


@dataclass(frozen=True)
class FailConfig:
    output: str
    counter: str | None = None
    message: str = "boom"


@step_function
def fail(config: FailConfig) -> None:
    count_call(config.counter, "fail")
    raise ValueError(config.message)


@step_function
def write_nothing(config: FailConfig) -> None:
    count_call(config.counter, "nothing")


# In-process rendezvous for tests that need a step to be running at a known moment.
GATES: dict[str, threading.Event] = {}
STARTED: dict[str, threading.Event] = {}


@dataclass(frozen=True)
class GateConfig:
    output: str
    gate: str
    counter: str | None = None


@step_function
def wait_for_gate(config: GateConfig) -> None:
    """Signal STARTED[gate], block until GATES[gate] is set, then write output."""
    count_call(config.counter, f"gate-{config.gate}")
    STARTED.setdefault(config.gate, threading.Event()).set()
    gate = GATES.setdefault(config.gate, threading.Event())
    while not gate.wait(0.01):  # a Python-level loop so StepCancelled is delivered promptly
        pass
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "done"), "w") as f:
        f.write("ok")


@dataclass(frozen=True)
class SleepConfig:
    output: str
    seconds: float
    counter: str | None = None
    name: str = "sleep"
    started_file: str | None = None


@step_function
def sleep_then_write(config: SleepConfig) -> None:
    """Touch `started_file`, sleep, write output: used to kill a run mid-step."""
    count_call(config.counter, config.name)
    if config.started_file:
        with open(config.started_file, "a") as f:
            f.write(f"{os.getpid()}\n")
    deadline = time.time() + config.seconds
    while time.time() < deadline:
        time.sleep(0.01)
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "value.json"), "w") as f:
        json.dump({"value": 0}, f)
    with open(os.path.join(config.output, "done"), "w") as f:
        f.write("ok")


@step_function
def write_value_fsspec(config: WriteConfig) -> None:
    """Like `write_value`, through fsspec (works for memory:// outputs)."""
    import fsspec

    count_call(config.counter, config.name)
    with fsspec.open(f"{config.output}/value.json", "w") as f:
        json.dump({"value": config.value}, f)


@step_function
def exit_early(config: FailConfig) -> None:
    """A step that calls sys.exit(): a failure of the step, not of the executor."""
    import sys

    count_call(config.counter, "exit")
    sys.exit(3)


@step_function
def warn_then_write(config: WriteConfig) -> None:
    """Report a WARNING note into the step's own .status, then succeed."""
    from pipeline.run.in_step import step_events

    step_events.warn("loss spiked to 9.0 (3.0x the recent median)", {"step": 7})
    write_value(config)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot even describe this error")


@step_function
def fail_unprintably(config: FailConfig) -> None:
    raise Unprintable()
