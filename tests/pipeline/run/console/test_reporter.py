"""The run's progress lines: one per state change for small runs, summaries for large ones."""

from __future__ import annotations

from pipeline import ExecutorMainConfig, Step, run_experiment, this_output, versioned
from pipeline.run.console.reporter import SUMMARIZE_ABOVE, Reporter
from tests.pipeline.stepfns import WriteConfig, write_value


def test_a_small_run_gets_a_line_per_state_change():
    lines: list[str] = []
    report = Reporter(lines.append, total=2)
    report("a", "RUNNING")
    report("a", "SUCCEEDED", "0.10s")
    report("b", "FAILED", "boom")
    assert lines == ["RUNNING    a", "SUCCEEDED  [1/2] a  0.10s", "FAILED     [2/2] b  boom"]


def test_a_large_run_prints_summaries_and_every_failure():
    lines: list[str] = []
    now = [0.0]
    total = SUMMARIZE_ABOVE + 100
    report = Reporter(lines.append, total=total, summary_interval=1.0, clock=lambda: now[0])
    for i in range(total - 1):
        now[0] = i * 0.01  # 100 steps a second: a summary a second, not a line a step
        report(f"s{i}", "RUNNING")
        report(f"s{i}", "SUCCEEDED")
    report("last", "FAILED", "boom")
    summaries = [line for line in lines if line.startswith("progress")]
    assert 2 <= len(summaries) <= 4, lines
    assert lines[-1] == f"FAILED     [{total}/{total}] last  boom"
    assert not [line for line in lines if line.startswith(("RUNNING", "SUCCEEDED"))]


def test_log_level_warning_prints_no_progress_lines(tmp_path, capfd):
    step = Step("quiet/a", write_value, WriteConfig(output=this_output(), value=versioned(1)))
    config = ExecutorMainConfig(prefix=str(tmp_path / "p"), backend="local", log_level="WARNING")
    assert run_experiment([step], config).ok
    assert "SUCCEEDED" not in capfd.readouterr().err
    again = ExecutorMainConfig(prefix=str(tmp_path / "q"), backend="local")
    assert run_experiment([step], again).ok
    assert "SUCCEEDED" in capfd.readouterr().err
