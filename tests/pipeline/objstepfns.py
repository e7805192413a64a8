"""Step functions that read and write their outputs through fsspec, so they work on any prefix
(local disk, memory://, s3://). They reuse the configs and call counters of `stepfns`."""

from __future__ import annotations

import json
import time

import fsspec

from pipeline import step_function
from tests.pipeline.stepfns import SleepConfig, WriteConfig, count_call


@step_function
def add_values(config: WriteConfig) -> None:
    """`write_value` through fsspec: `value` plus the values of `inputs`, to `value.json`."""
    count_call(config.counter, config.name)
    total = config.value
    for path in config.inputs:
        with fsspec.open(f"{path.rstrip('/')}/value.json") as f:
            total += json.load(f)["value"]
    with fsspec.open(f"{config.output}/value.json", "w") as f:
        json.dump({"value": total}, f)


@step_function
def sleep_then_add(config: SleepConfig) -> None:
    """`sleep_then_write` through fsspec: note the start locally, sleep, write `value.json`."""
    count_call(config.counter, config.name)
    if config.started_file:
        with open(config.started_file, "a") as f:
            f.write("started\n")
    deadline = time.time() + config.seconds
    while time.time() < deadline:
        time.sleep(0.01)  # short sleeps: a cancelled step stops promptly
    with fsspec.open(f"{config.output}/value.json", "w") as f:
        json.dump({"value": 0}, f)
