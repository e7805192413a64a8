"""Metrics uploads on object storage: bytes sent per hour of a long run, against moto's S3 server.

    .venv/bin/python benchmarks/metrics_upload.py [--at 1000 100000 390251] [--step-seconds 10]
        [--interval 30] [--hours 6] [--segment-bytes 1048576]

A training step whose output is on object storage appends its metrics lines to a local file and
publishes them every `--interval` seconds. This replays that for the hero run (390,251 steps)
with synthetic lines shaped like a real train_moe line (~600 bytes per step, the keys Levanter
logs) at `--step-seconds` per step, at several points of the run (`--at`, a step number):

  whole file   what the uploader did before segments: the whole file, every interval. One upload
               of the file as it is at that step is timed against moto; an hour has
               3600 / max(interval, 10 x upload time) of them (the uploader's busy back-off).
  segments     `steps.training.metrics_file.MetricsUploader` as it is: the lines up to that step are published
               first (as the run would have), then `--hours` hours of lines are appended and
               uploaded at every interval, and the bytes it sent are counted (`bytes_uploaded`).

Then it reads each row's segments back and times it: `steps.training.metrics_file.read_metrics` and the
dashboard's chart (reading and parsing every line), the chart again (as a reload of the page
does: the closed segments' summaries are kept), and the bytes alone three ways (one GET
after another, parallel GETs as the dashboard and `compare` do, fsspec's concurrent `cat` as
the step library does).

moto runs on the same two cores: upload times are about this machine, not about S3. The byte
counts do not depend on the server. Figures only: nothing is asserted.
"""

from __future__ import annotations

import os
import sys

# benchmarks/ must leave sys.path before anything else is imported: its tokenize.py would shadow
# the standard library's (see benchmarks/engine.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import json
import platform
import statistics
import tempfile
import time
import uuid

import fsspec

from pipeline.observe.dashboard.step_data import read_metrics as dashboard_metrics
from pipeline.observe.metrics import read_metrics_data
from pipeline.storage.opening import map_reads, open_storage
from steps.files import write_file
from steps.training.metrics_file import SEGMENT_BYTES, MetricsUploader, _read_lines, read_metrics
from tests.s3server import moto_s3, s3_environment

BUCKET = "drydock-metrics-bench"
HERO_STEPS = 390_251
MB = 1e6


def line(step: int) -> bytes:
    """One step's metrics line, with the keys (and about the size) of a real train_moe line."""
    loss = 2.0 + 6.0 / (1 + step / 1000)
    record = {
        "step": step,
        "optim/learning_rate": 3e-4 * (1 - step / HERO_STEPS),
        "wall_time": 1.8e9 + step * 10.0,
        "train/loss": loss,
        "global_step": step,
        "run_progress": step / HERO_STEPS,
        "throughput/total_tokens": step * 46_137_344,
        "throughput/total_gflops": step * 6.3e9,
        "throughput/examples_per_second": 1126.4 + (step % 7) * 0.013,
        "throughput/tokens_per_second": 4613734.4 + (step % 11) * 0.17,
        "throughput/duration": 10.0 + (step % 13) * 1e-4,
        "throughput/gflops_per_second": 6.3e8 + (step % 5) * 0.31,
        "throughput/hook_time": 0.0035551449982449412,
        "throughput/loading_time": 7.900800119386986e-05,
    }
    return json.dumps(record).encode() + b"\n"


def fill(path: str, steps: int) -> int:
    """Write the lines of steps 0..steps-1 to `path`; its size."""
    with open(path, "wb") as f:
        for start in range(0, steps, 10_000):
            f.write(b"".join(line(s) for s in range(start, min(steps, start + 10_000))))
    return os.path.getsize(path)


def whole_file(root: str, local: str, interval: float, repeats: int = 2) -> tuple[float, float, float]:
    """(bytes per upload, seconds per upload, uploads per hour) of republishing the whole file."""
    with open(local, "rb") as f:
        data = f.read()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        write_file(f"{root}/whole/metrics.jsonl", data)
        times.append(time.perf_counter() - started)
    seconds = statistics.median(times)
    return len(data), seconds, 3600 / max(interval, 10 * seconds)


def segments(
    root: str, local: str, at: int, hours: float, step_seconds: float, interval: float, segment_bytes: int
) -> tuple[float, int, int, float]:
    """(bytes per hour, largest upload, segments, seconds per upload) of `hours` of uploads by
    MetricsUploader after step `at`."""
    remote = f"{root}/seg-{at}/metrics.jsonl"
    uploader = MetricsUploader(local, remote, interval, segment_bytes=segment_bytes)
    # The run so far, published as it would have been: a segment_bytes chunk at a time.
    with open(local, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    os.truncate(local, 0)
    chunk: list[bytes] = []
    with open(local, "ab") as f:
        for text in lines:
            chunk.append(text)
            if sum(map(len, chunk)) >= segment_bytes:
                f.write(b"".join(chunk))
                f.flush()
                uploader.upload()
                chunk = []
        f.write(b"".join(chunk))
    uploader.upload()
    sent_before, uploads_before = uploader.bytes_uploaded, uploader.uploads
    largest = 0
    step, due = at, 0.0
    elapsed = 0.0
    uploads = round(hours * 3600 / interval)
    for _ in range(uploads):
        due += interval / step_seconds
        with open(local, "ab") as f:
            while due >= 1:
                f.write(line(step))
                step += 1
                due -= 1
        sent = uploader.bytes_uploaded
        started = time.perf_counter()
        uploader.upload()
        elapsed += time.perf_counter() - started
        largest = max(largest, uploader.bytes_uploaded - sent)
    per_hour = (uploader.bytes_uploaded - sent_before) / hours
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    count = len(fs.ls(remote.removeprefix("s3://").rsplit("/", 1)[0] + "/metrics"))
    started = time.perf_counter()
    records = read_metrics(remote)
    reads = {"read_metrics": time.perf_counter() - started}
    assert len(records) == step and records[-1]["step"] == step - 1, "lines lost or doubled"
    storage, directory = open_storage(root), remote.rsplit("/", 1)[0]
    started = time.perf_counter()
    chart = dashboard_metrics(storage, directory)
    reads["dashboard"] = time.perf_counter() - started
    assert chart is not None and chart.total_steps == step
    started = time.perf_counter()  # a reload of the page: the closed segments are summarized
    dashboard_metrics(storage, directory)
    reads["dashboard again"] = time.perf_counter() - started
    # The bytes alone, three ways: one GET after another, parallel GETs, fsspec's concurrent cat.
    many = lambda paths: map_reads(storage, storage.read, paths, minimum=8)  # noqa: E731
    for name, kwargs in (("bytes one by one", {}), ("bytes parallel", {"read_all": many})):
        started = time.perf_counter()
        read_metrics_data(directory, storage.read, storage.listdir, **kwargs)
        reads[name] = time.perf_counter() - started
    started = time.perf_counter()
    _read_lines(remote)
    reads["bytes fsspec cat"] = time.perf_counter() - started
    READS[at] = reads
    return per_hour, largest, count, elapsed / max(1, uploader.uploads - uploads_before)


READS: dict[int, dict[str, float]] = {}
"""Seconds to read each row's segments back, by reader."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--at", type=int, nargs="+", default=[1_000, 100_000, HERO_STEPS])
    parser.add_argument("--step-seconds", type=float, default=10.0)
    parser.add_argument("--interval", type=float, default=30.0)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--segment-bytes", type=int, default=SEGMENT_BYTES)
    args = parser.parse_args()
    print(
        f"python {platform.python_version()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
        f"moto server on 127.0.0.1; {args.step_seconds:g} s per step, an upload every "
        f"{args.interval:g} s, segments of {args.segment_bytes:,} bytes"
    )
    with moto_s3() as endpoint, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(s3_environment(endpoint))
        fsspec.filesystem("s3").mkdir(BUCKET)
        root = f"s3://{BUCKET}/bench-{uuid.uuid4().hex[:8]}"
        print(
            f"{'at step':>9}  {'file':>9}  {'whole file: per upload':>27}  {'per hour':>11}  "
            f"{'segments: per hour':>19}  {'largest':>9}  {'segments':>8}  {'s/upload':>8}"
        )
        for at in args.at:
            local = os.path.join(scratch, f"metrics-{at}.jsonl")
            size = fill(local, at)
            whole, seconds, per_hour = whole_file(root, local, args.interval)
            seg_hour, largest, count, seg_seconds = segments(
                root, local, at, args.hours, args.step_seconds, args.interval, args.segment_bytes
            )
            print(
                f"{at:>9,}  {size / MB:7.1f}MB  {whole / MB:9.1f} MB in {seconds:6.2f} s  "
                f"{per_hour * whole / MB:9.0f}MB  {seg_hour / MB:17.2f}MB  {largest / MB:7.2f}MB  "
                f"{count:>8}  {seg_seconds:8.3f}"
            )
            os.remove(local)
        print(f"{args.hours:g} simulated hours per row; load {os.getloadavg()[0]:.2f}")
        print(
            "reading the segments back (s): "
            + "; ".join(
                f"at {at:,}: " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in reads.items())
                for at, reads in READS.items()
            )
        )


if __name__ == "__main__":
    main()
