"""A prefix made by real runs of the executor (local backend), shared by the dashboard's tests.

Two experiments: `tiny_demo` (corpus -> train -> evaluate, all succeed) and `broken` (the same
corpus, cached; a training step that fails; an evaluation blocked by it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.run.scheduler.executor import RunReport
from tests.pipeline.observe.dashboard.fixture_steps import (
    CorpusConfig,
    EvalConfig,
    TrainConfig,
    diverge,
    evaluate_tiny,
    train_tiny,
    write_corpus,
)
from tests.webhook import webhook_server

REPO = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)


@dataclass(frozen=True)
class Runs:
    """The prefix and the reports of the runs that made it."""

    prefix: str
    demo: RunReport
    broken: RunReport

    def label(self, report: RunReport, name: str) -> str:
        return next(label for label, node in report.plan.dag.nodes.items() if node.name == name)


def _run(
    steps: list[Step], prefix: str, experiment: str, description: str, notify: str | None = None
) -> RunReport:
    config = ExecutorMainConfig(prefix=prefix, backend="local", experiment=experiment, notify=notify)
    report = run_experiment(steps, config, description=description)
    assert isinstance(report, RunReport)
    return report


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    prefix = str(tmp_path_factory.mktemp("dashboard") / "prefix")
    corpus = Step("data/corpus", write_corpus, CorpusConfig(this_output(), versioned(3)))
    train = Step("train/tiny", train_tiny, TrainConfig(output_of(corpus), this_output(), versioned(40)))
    evaluate = Step("eval/tiny", evaluate_tiny, EvalConfig(output_of(train), this_output()))
    demo = _run([evaluate], prefix, "tiny_demo", "train a tiny model and evaluate it")
    assert demo.ok
    bad = Step("train/broken", diverge, TrainConfig(output_of(corpus), this_output(), versioned(5)))
    blocked = Step("eval/broken", evaluate_tiny, EvalConfig(output_of(bad), this_output()))
    with webhook_server() as (url, _received):  # its alerts are on the failed step's page
        broken = _run([blocked], prefix, "broken", "a training run that diverges", notify=url)
    assert not broken.ok
    return Runs(prefix, demo, broken)


@dataclass(frozen=True)
class Server:
    """A dashboard process serving on loopback."""

    url: str
    process: subprocess.Popen[str]


def start_dashboard(prefix: str, *extra: str) -> Server:
    """`drydock dashboard`'s entry point in a child process, on a free port; waits for its URL line."""
    code = "import sys; from pipeline.cli.dashboard import main; sys.exit(main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--prefix", prefix, "--port", "0", *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the socket listens before this line is printed
    match = re.search(r"(http://\S+/)", line)
    if match is None:
        process.kill()
        _out, err = process.communicate()
        raise AssertionError(f"the dashboard did not start: {line!r} {err}")
    return Server(match.group(1), process)


def stop(server: Server) -> None:
    server.process.terminate()  # uvicorn shuts down on SIGTERM like on Ctrl-C
    server.process.communicate(timeout=30)


@pytest.fixture(scope="session")
def dashboard(runs: Runs) -> Iterator[Server]:
    server = start_dashboard(runs.prefix)
    yield server
    stop(server)
