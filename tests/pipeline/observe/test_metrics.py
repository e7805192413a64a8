"""Where a step's metrics lines are: metrics.jsonl, segments, or both, read through a real Storage."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.observe.metrics import (
    metrics_files,
    parse_events,
    parse_metrics,
    read_metrics_data,
    read_metrics_tail,
    segment_index,
    segment_name,
)
from pipeline.storage.opening import open_storage


def _line(step: int, **values: object) -> str:
    return json.dumps({"step": step, **values}) + "\n"


def _segmented(step_dir: Path, parts: list[str]) -> None:
    (step_dir / "metrics").mkdir(parents=True)
    for i, text in enumerate(parts):
        (step_dir / "metrics" / segment_name(i)).write_text(text)


def test_segment_names_sort_and_parse():
    assert segment_name(7) == "part-000007.jsonl" and segment_index("part-000007.jsonl") == 7
    assert segment_index("part-1234567.jsonl") == 1234567  # past a million segments, still read
    for other in ("part-7.jsonl", "part-000007.jsonl.tmp", "metrics.jsonl", "part-00000x.jsonl"):
        assert segment_index(other) is None


def test_the_file_from_before_segments_comes_first_then_segments_by_number(tmp_path):
    step_dir = tmp_path / "train" / "x-0123456789ab"
    _segmented(step_dir, [_line(2, loss=2.0), _line(3, loss=1.5)])
    (step_dir / "metrics" / "part-000010.jsonl").write_text(_line(4, loss=1.0))  # a gap is fine
    (step_dir / "metrics" / "notes.txt").write_text("not metrics")
    (step_dir / "metrics.jsonl").write_text(_line(1, loss=3.0))
    storage = open_storage(str(tmp_path))
    names = [p.rsplit("/", 1)[1] for p in metrics_files(str(step_dir), storage.listdir)]
    assert names == ["metrics.jsonl", "part-000000.jsonl", "part-000001.jsonl", "part-000010.jsonl"]
    data = read_metrics_data(str(step_dir), storage.read, storage.listdir)
    assert [r["loss"] for r in parse_metrics(data.splitlines())] == [3.0, 2.0, 1.5, 1.0]
    assert read_metrics_data(str(tmp_path / "none"), storage.read, storage.listdir) is None


def test_a_torn_last_line_of_one_file_never_joins_the_next_files_first(tmp_path):
    step_dir = tmp_path / "s"
    _segmented(
        step_dir,
        [_line(1, loss=3.0) + '{"step": 2, "lo', _line(2, loss=2.0) + '{"event": "spike", "step": 2}'],
    )
    storage = open_storage(str(tmp_path))
    data = read_metrics_data(str(step_dir), storage.read, storage.listdir)
    assert [r["step"] for r in parse_metrics(data.splitlines())] == [1, 2]
    assert [e["event"] for e in parse_events(data.splitlines())] == ["spike"]


def test_the_tail_reaches_into_the_segment_before_a_short_open_one(tmp_path):
    step_dir = tmp_path / "s"
    closed = "".join(_line(s, loss=1.0 / (s + 1), pad="x" * 50) for s in range(100))
    _segmented(step_dir, [closed, '{"step": 100, "eval/loss": 0.5}\n{"step": 101, "train/lo'])
    storage = open_storage(str(tmp_path))
    tail = read_metrics_tail(str(step_dir), storage.read_tail, storage.listdir, 1000)
    lines = tail.splitlines()
    assert 900 <= len(tail) <= 1000
    assert json.loads(lines[0])["step"] > 80  # the cut first line was left out: every line parses
    assert all(json.loads(line) for line in lines[:-1])
    assert lines[-2] == b'{"step": 100, "eval/loss": 0.5}' and lines[-1] == b'{"step": 101, "train/lo'
    small = read_metrics_tail(str(step_dir), storage.read_tail, storage.listdir, 10**6)
    assert small == read_metrics_data(str(step_dir), storage.read, storage.listdir)  # all of it, when short
    assert read_metrics_tail(str(tmp_path / "none"), storage.read_tail, storage.listdir, 100) is None
