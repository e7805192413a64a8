"""The dashboard's chart of a training's metrics: what parsing every line gives, closed segments
parsed once."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.usable_numbers import finite_or_none
from pipeline.observe.dashboard import chart, step_data
from pipeline.observe.dashboard.records import Metrics
from pipeline.observe.metrics import parse_events, parse_metrics, read_metrics_data, segment_name
from pipeline.storage.opening import open_storage


def reference(storage, directory: str, max_points: int = step_data.MAX_CHART_POINTS) -> Metrics | None:
    """The chart as built before summaries: every line of every file parsed at every read."""
    text = read_metrics_data(directory, storage.read, storage.listdir)
    if text is None:
        return None
    ordered = parse_metrics(text.splitlines())
    stride = max(1, math.ceil(len(ordered) / max_points))
    shown = ordered[::stride]
    if ordered and shown[-1] is not ordered[-1]:
        shown.append(ordered[-1])
    routed = [r for r in ordered if r.get("router_max_load_ratio") is not None]
    routed_shown = routed[:: max(1, math.ceil(len(routed) / max_points))]
    if routed and routed_shown[-1] is not routed[-1]:
        routed_shown.append(routed[-1])
    return Metrics(
        steps=tuple(int(r["step"]) for r in shown),
        loss=tuple(finite_or_none(r.get("loss")) for r in shown),
        learning_rate=tuple(finite_or_none(r.get("learning_rate")) for r in shown),
        total_steps=len(ordered),
        last=ordered[-1] if ordered else {},
        eval_steps=tuple(int(r["step"]) for r in ordered if "eval/loss" in r),
        eval_loss=tuple(finite_or_none(r["eval/loss"]) for r in ordered if "eval/loss" in r),
        events=tuple(step_data._event(e) for e in parse_events(text.splitlines())),
        tokens_per_second=tuple(finite_or_none(r.get("tokens_per_second")) for r in shown),
        mfu=tuple(finite_or_none(r.get("throughput/mfu", r.get("mfu"))) for r in shown),
        step_seconds=chart.step_time_summary(
            [
                b["wall_time"] - a["wall_time"]
                for a, b in itertools.pairwise(ordered)
                if b["step"] == a["step"] + 1
                and all(finite_or_none(r.get("wall_time")) is not None for r in (a, b))
                and b["wall_time"] > a["wall_time"]
            ]
        ),
        router_steps=tuple(int(r["step"]) for r in routed_shown),
        router_max_load_ratio=tuple(finite_or_none(r["router_max_load_ratio"]) for r in routed_shown),
        router_mean_max_load_ratio=tuple(
            finite_or_none(r.get("router/mean_max_load_ratio")) for r in routed_shown
        ),
    )


def _lines(rng: random.Random, steps: int) -> list[str]:
    """A training's lines as the tracker writes them: several per step, evaluations now and then,
    events, a rewind that logs steps again, an alias written directly, a null, a foreign line."""
    lines = []
    step = 0
    while step < steps:
        record = {"step": step, "train/loss": rng.uniform(1, 5), "optim/learning_rate": 1e-3}
        if rng.random() < 0.9:  # the tracker's clock, which a rewind's repeated steps move on
            record["wall_time"] = 1000.0 + len(lines) * rng.uniform(0.5, 2.0)
        lines.append(json.dumps(record))
        if rng.random() < 0.3:
            figures = {
                "throughput/tokens_per_second": rng.uniform(1e3, 1e4),
                "throughput/mfu": rng.uniform(1, 60),
            }
            lines.append(json.dumps({"step": step, **figures}))
        if rng.random() < 0.2:  # router statistics, now and then (a null one too)
            ratio = rng.choice([rng.uniform(1, 4), None])
            lines.append(
                json.dumps({"step": step, "router/max_load_ratio": ratio, "router/mean_max_load_ratio": 1.5})
            )
        if rng.random() < 0.1:
            lines.append(json.dumps({"step": step, "eval/loss": rng.choice([rng.uniform(1, 3), None])}))
        if rng.random() < 0.05:
            lines.append(json.dumps({"event": "spike", "step": step, "loss": 9.0}))
        if rng.random() < 0.03:
            lines.append(json.dumps({"step": step, "loss": rng.uniform(1, 5)}))  # the short key alone
        if rng.random() < 0.02:
            lines.append('{"not": "metrics"}')
        if rng.random() < 0.02 and step > 5:
            lines.append(json.dumps({"event": "rewind", "step": step, "number": 1}))
            step -= rng.randint(1, 5)  # the steps after the checkpoint are logged again
        step += 1
    return lines


def _write(directory: Path, lines: list[str], cuts: list[int]) -> None:
    """`lines` as segments cut at `cuts` (line indices), the last one cut off mid-line."""
    (directory / "metrics").mkdir(parents=True, exist_ok=True)
    for old in (directory / "metrics").iterdir():
        old.unlink()
    bounds = [0, *sorted(set(cuts)), len(lines)]
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        text = "".join(line + "\n" for line in lines[a:b])
        if i == len(bounds) - 2:
            text += '{"step": 99999, "train/lo'  # the tracker half-way through a line
        (directory / "metrics" / segment_name(i)).write_text(text)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    steps=st.integers(1, 300),
    segments=st.integers(1, 6),
    points=st.integers(3, 50),
)
def test_the_chart_is_what_parsing_every_line_gives(tmp_path_factory, seed, steps, segments, points):
    rng = random.Random(seed)
    directory = tmp_path_factory.mktemp("chart") / "train" / "x-0123456789ab"
    lines = _lines(rng, steps)
    _write(directory, lines, [rng.randrange(len(lines) + 1) for _ in range(segments - 1)])
    storage = open_storage(str(directory.parent.parent))
    read_all = step_data._read_all(storage)
    for _ in range(2):  # the second time from the summaries of the closed segments
        got = chart.read_chart(
            str(directory), storage.listdir, read_all, points, finite_or_none, step_data._event
        )
        assert got == reference(storage, str(directory), points)


def test_the_step_time_distribution():
    summary = chart.step_time_summary([1.0] * 90 + [2.0] * 9 + [10.0])
    assert summary is not None
    assert (summary["count"], summary["median"], summary["p90"], summary["max"]) == (100, 1.0, 1.0, 10.0)
    assert summary["p99"] == 2.0 and sum(summary["counts"]) == 100
    assert summary["edges"][0] == 1.0 and summary["edges"][-1] == 10.0 and summary["counts"][-1] == 1
    assert chart.step_time_summary([3.0]) is None
    same = chart.step_time_summary([2.0, 2.0])
    assert same is not None and same["counts"] == [2]


def test_closed_segments_are_parsed_once_and_a_rewritten_one_again(tmp_path):
    directory = tmp_path / "train" / "x-0123456789ab"
    lines = [json.dumps({"step": s, "train/loss": 3.0 - s / 100}) for s in range(300)]
    _write(directory, lines, [100, 200])
    storage = open_storage(str(tmp_path))
    read_all = step_data._read_all(storage)
    hits = chart._CACHE.hits
    first = step_data.read_metrics(storage, str(directory))
    assert chart._CACHE.hits == hits  # nothing summarized yet
    assert step_data.read_metrics(storage, str(directory)) == first
    assert chart._CACHE.hits == hits + 2  # the two closed segments; the open one is parsed again
    # A resume cut the second segment at step 150 and the run went on from there with new values.
    lines = lines[:151] + [json.dumps({"step": s, "train/loss": 1.0}) for s in range(151, 260)]
    _write(directory, lines, [100, 151])
    after = chart.read_chart(
        str(directory), storage.listdir, read_all, 2000, finite_or_none, step_data._event
    )
    assert after == reference(storage, str(directory), 2000)
    assert after is not None and after.total_steps == 260 and after.loss[-1] == 1.0
