"""A small three-step experiment: write rows, count them, summarize.

Runs in a second on the `local` backend and shows the whole API:

    drydock run experiments/hello.py            # runs all three steps
    drydock run experiments/hello.py            # again: every step CACHED, nothing runs
    drydock plan experiments/hello.py --json    # the plan as JSON
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from pipeline import Resources, Step, executor_main, output_of, step_function, this_output, versioned


@dataclass(frozen=True)
class RowsConfig:
    n: int
    output: str
    seed: int = 0


@step_function
def write_rows(config: RowsConfig) -> None:
    """Write `n` JSON rows to `rows.jsonl`."""
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "rows.jsonl"), "w") as f:
        for i in range(config.n):
            f.write(json.dumps({"id": i, "value": (i * 7 + config.seed) % 10}) + "\n")


@dataclass(frozen=True)
class CountConfig:
    rows: str
    threshold: int
    output: str


@step_function
def count_rows(config: CountConfig) -> None:
    """Count rows whose value is at least `threshold`."""
    with open(config.rows) as f:
        rows = [json.loads(line) for line in f]
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "counts.json"), "w") as f:
        json.dump({"rows": len(rows), "above": sum(r["value"] >= config.threshold for r in rows)}, f)


@dataclass(frozen=True)
class SummaryConfig:
    counts: list[str]
    output: str


@step_function
def summarize(config: SummaryConfig) -> None:
    """Gather several count files into one summary."""
    summary = {}
    for path in config.counts:
        with open(path) as f:
            summary[path.rsplit("/", 2)[-2]] = json.load(f)
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


raw = Step(name="raw/hello", fn=write_rows, config=RowsConfig(n=versioned(10), output=this_output()))
counts = Step(
    name="counts/hello",
    fn=count_rows,
    config=CountConfig(rows=output_of(raw, "rows.jsonl"), threshold=versioned(3), output=this_output()),
    resources=Resources(cpus=1),
)
summary = Step(
    name="summary/hello",
    fn=summarize,
    config=SummaryConfig(counts=[counts / "counts.json"], output=this_output()),
)

if __name__ == "__main__":
    executor_main([summary], description="count rows")
