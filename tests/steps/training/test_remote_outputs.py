"""train_moe and evaluate with their outputs on object storage: moto's S3 server on loopback.

The writers (metrics.jsonl, its uploader, the checkpoint-time publishing, summary.json, results.json,
loss.png) are tested one by one against the server; one slow test runs a whole experiment with an
`s3://` prefix (tokenize, mixture, train_moe killed after a checkpoint and resumed, evaluate), with
Levanter's checkpoints and the Hugging Face export on the same server.

Levanter hands tensorstore (checkpoints, token caches) the endpoint in `AWS_ENDPOINT_URL`, not the
S3-specific `AWS_ENDPOINT_URL_S3` that boto3 and s3fs also read, so the fixture sets both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import fsspec
import jax.numpy as jnp
import pytest

from pipeline.core.records import Event
from pipeline.observe.render import format_preview
from pipeline.processes import current_owner
from pipeline.run.in_step import step_events
from pipeline.run.in_step.fence import Fence, LeaseExpired, fenced_thread
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import StepStore
from steps.evaluation.evaluate import EvaluateConfig, plot_loss
from steps.evaluation.evaluate import report as evaluate_report
from steps.files import write_file
from steps.training.attempt_loop import latest_step
from steps.training.checkpointer import MetricsCheckpointerConfig
from steps.training.checkpoints import checkpoint_to_evaluate
from steps.training.metrics_file import (
    MetricsUploader,
    begin_metrics,
    publish_metrics,
    read_events,
    read_metrics,
    write_metrics,
)
from steps.training.spikes import SpikePolicy
from steps.training.tracker import JsonlTracker
from tests.s3server import s3_bucket_environment
from tests.steps.tiny import EXPERIMENT, QWEN, ROOT, seed
from tests.steps.tiny import command as tiny_command

BUCKET = "drydock-train-test"


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """A moto server with a bucket; this process's environment points at it while the module runs."""
    # Levanter hands AWS_ENDPOINT_URL (not the S3-specific variable) to TensorStore.
    with s3_bucket_environment(BUCKET, AWS_ENDPOINT_URL="{endpoint}") as variables:
        yield variables


@pytest.fixture
def url(s3_env) -> str:
    """A fresh directory URL in the bucket."""
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"


def cat(path: str) -> str:
    with fsspec.open(path, "r") as f:
        return f.read()


def glob(pattern: str) -> list[str]:
    """The URLs matching an s3:// `pattern` now (s3fs would otherwise answer from its listing cache)."""
    s3 = fsspec.filesystem("s3")
    s3.invalidate_cache()
    return ["s3://" + p for p in s3.glob(pattern.removeprefix("s3://"))]


def exists(path: str) -> bool:
    fs, plain = fsspec.core.url_to_fs(path)
    fs.invalidate_cache()
    return fs.exists(plain)


def append(path: Path, *records: dict) -> None:
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


# -- metrics.jsonl by URL ----------------------------------------------------------------------------


def test_metrics_are_written_and_read_by_url(url):
    path = f"{url}/train/metrics.jsonl"
    assert read_metrics(path) == []  # nothing there yet
    write_metrics(path, [{"step": 1, "train/loss": 3.0}, {"step": 2, "train/loss": 2.5}])
    records = read_metrics(path)
    assert [(r["step"], r["loss"]) for r in records] == [(1, 3.0), (2, 2.5)]
    assert [r["step"] for r in read_metrics(path, up_to=1)] == [1]


def test_resume_keeps_the_remote_lines_up_to_the_checkpoint_in_both_copies(url, tmp_path):
    remote = f"{url}/metrics.jsonl"
    lines = [{"step": s, "train/loss": 5.0 - s / 10} for s in range(10)]
    lines += [{"step": s, "router/max_load_ratio": 1.5} for s in range(0, 10, 5)]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 10, "train/lo'  # torn by a kill
    write_file(remote, text.encode())
    local = str(tmp_path / "scratch" / "metrics.jsonl")

    kept = begin_metrics(remote, local, resumed_from=5)

    assert [r["step"] for r in kept] == [0, 1, 2, 3, 4, 5]
    assert kept[5]["router_max_load_ratio"] == 1.5 and kept[5]["loss"] == pytest.approx(4.5)
    for copy in (local, remote):  # the lines as written, the steps after the checkpoint dropped
        assert [json.loads(line)["step"] for line in _raw(copy).splitlines()] == [0, 1, 2, 3, 4, 5, 0, 5]
    begin_metrics(remote, local, resumed_from=None)  # a fresh start keeps nothing
    assert _raw(remote) == "" and cat(local) == ""
    assert not exists(remote)  # the file from before segments is gone, not left empty


def _raw(path: str) -> str:
    """The metrics lines of `path`'s output as stored: the file itself or its segments, in order."""
    fs, plain = fsspec.core.url_to_fs(path)
    fs.invalidate_cache()
    files = [plain] if fs.exists(plain) else []
    files += sorted(fs.glob(posixpath.join(posixpath.dirname(plain), "metrics", "part-*.jsonl")))
    return "".join(fs.cat_file(f).decode() for f in files)


def _segments(path: str) -> dict[str, bytes]:
    """The segments beside `path` (a metrics.jsonl URL) by name, with their content."""
    fs, plain = fsspec.core.url_to_fs(path)
    fs.invalidate_cache()
    found = sorted(fs.glob(posixpath.join(posixpath.dirname(plain), "metrics", "part-*.jsonl")))
    return {posixpath.basename(f): fs.cat_file(f) for f in found}


def test_segments_close_at_their_size_and_are_never_written_again(url, tmp_path):
    local = tmp_path / "metrics.jsonl"
    remote = f"{url}/metrics.jsonl"
    uploader = MetricsUploader(str(local), remote, interval=3600, segment_bytes=200)
    sent = 0
    seen: dict[str, bytes] = {}
    for step in range(40):
        append(local, {"step": step, "train/loss": 3.0 - step / 100})
        assert uploader.upload()
        segments = _segments(remote)
        *earlier, last = sorted(segments)
        for name in earlier:  # closed: a segment keeps its bytes once the next one is written
            assert len(segments[name]) >= 200
            assert seen.setdefault(name, segments[name]) == segments[name]
        sent += len(segments[last])  # the open one (or the one this upload filled and closed)
    assert len(segments) >= 5
    assert b"".join(segments.values()) == local.read_bytes()
    assert [r["step"] for r in read_metrics(remote)] == list(range(40))
    # Each upload sent the open segment only: a bounded size, not the whole file.
    assert uploader.bytes_uploaded <= sent + 200 * len(segments)
    assert uploader.bytes_uploaded < 40 * local.stat().st_size / 4


def test_a_resume_keeps_the_segments_before_the_checkpoint_and_loses_or_doubles_no_line(url, tmp_path):
    remote = f"{url}/metrics.jsonl"
    first = tmp_path / "first.jsonl"
    rewind = {"event": "rewind", "step": 31, "number": 1}
    with MetricsUploader(str(first), remote, interval=3600, segment_bytes=150) as uploader:
        for step in range(30):
            append(first, {"step": step, "train/loss": 2.0})
            if step % 7 == 0:
                append(first, {"event": "spike", "step": step})
            uploader.upload()
    before = _segments(remote)
    assert len(before) >= 4
    # A rewind (recorded in rewinds.json) back to the checkpoint at step 20: its line is added.
    second = tmp_path / "second.jsonl"
    kept = begin_metrics(remote, str(second), resumed_from=20, rewinds=[rewind])
    assert [r["step"] for r in kept] == list(range(21))
    after = _segments(remote)
    unchanged = [n for n in before if after.get(n) == before[n]]
    assert unchanged and unchanged == sorted(before)[: len(unchanged)]  # the leading ones untouched
    assert b"".join(after.values()) == second.read_bytes()
    # The resumed attempt appends after them; the steps after 20 come again, each once.
    with MetricsUploader(str(second), remote, interval=3600, segment_bytes=150, already_published=True):
        for step in range(21, 30):
            append(second, {"step": step, "train/loss": 1.0})
    lines = [json.loads(line) for line in _raw(remote).splitlines()]
    assert [r["step"] for r in lines if "event" not in r] == list(range(30))
    assert [(e["event"], e["step"]) for e in read_events(remote)] == [
        ("spike", 0),
        ("spike", 7),
        ("spike", 14),
        ("rewind", 31),
    ]
    assert [r["loss"] for r in read_metrics(remote)] == [2.0] * 21 + [1.0] * 9
    # Resuming again from the same checkpoint changes nothing already there and adds no rewind line.
    settled = _segments(remote)
    begin_metrics(remote, str(tmp_path / "third.jsonl"), resumed_from=29, rewinds=[rewind])
    assert _segments(remote) == settled


def test_a_kill_while_the_segments_are_rewritten_loses_and_doubles_nothing(url, tmp_path, monkeypatch):
    remote = f"{url}/metrics.jsonl"
    local = tmp_path / "first.jsonl"
    with MetricsUploader(str(local), remote, interval=3600, segment_bytes=100) as uploader:
        for step in range(20):
            append(local, {"step": step, "train/loss": 2.0})
            if step == 3:
                append(local, {"event": "spike", "step": 3})
            uploader.upload()
    fs = fsspec.filesystem("s3")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed before the stale segments were deleted")

    monkeypatch.setattr(fs, "rm", killed)  # fsspec hands every caller this one cached instance
    with pytest.raises(KeyboardInterrupt):
        begin_metrics(remote, str(tmp_path / "second.jsonl"), resumed_from=6)
    monkeypatch.undo()
    left = [json.loads(line)["step"] for line in _raw(remote).splitlines()]
    assert max(left) == 19 and left.count(6) == 1  # the cut segment rewritten, the stale ones still there
    begin_metrics(remote, str(tmp_path / "third.jsonl"), resumed_from=6)  # the next attempt
    lines = [json.loads(line) for line in _raw(remote).splitlines()]
    assert [r["step"] for r in lines if "event" not in r] == list(range(7))
    assert [e["step"] for e in read_events(remote)] == [3]


# -- the uploader ------------------------------------------------------------------------------------


def test_upload_sends_whole_lines_and_only_when_the_file_changed(url, tmp_path):
    local = tmp_path / "metrics.jsonl"
    remote = f"{url}/metrics.jsonl"
    uploader = MetricsUploader(str(local), remote, interval=3600)
    assert not uploader.upload() and not _segments(remote)  # no file yet: nothing to publish
    append(local, {"step": 1, "train/loss": 3.0})
    with local.open("a") as f:
        f.write('{"step": 2, "train/lo')  # the tracker half-way through a line
    assert uploader.upload()
    assert [r["step"] for r in read_metrics(remote)] == [1]
    assert _raw(remote).endswith("}\n")
    assert not uploader.upload()  # unchanged since: no second request
    with local.open("a") as f:
        f.write('ss": 2.5}\n')
    assert uploader.upload() and uploader.uploads == 2
    assert [r["loss"] for r in read_metrics(remote)] == [3.0, 2.5]
    assert not exists(remote)  # only segments: metrics.jsonl itself is never written


def test_uploader_publishes_while_running_and_the_rest_when_closed(url, tmp_path):
    local = tmp_path / "metrics.jsonl"
    remote = f"{url}/metrics.jsonl"
    append(local, {"step": 1, "train/loss": 3.0})
    with MetricsUploader(str(local), remote, interval=0.05) as uploader:
        deadline = time.monotonic() + 60
        while uploader.uploads == 0:  # the thread's first periodic upload
            assert time.monotonic() < deadline, "no periodic upload"
            time.sleep(0.01)
        assert [r["step"] for r in read_metrics(remote)] == [1]
    # A long interval: only close() can publish what is appended now. (A later uploader of the
    # same file continues what is published.)
    with MetricsUploader(str(local), remote, interval=3600, already_published=True) as uploader:
        append(local, {"step": 2, "train/loss": 2.5})
        assert publish_metrics(str(local))  # what the checkpointer does, through the running uploader
        append(local, {"step": 3, "train/loss": 2.0})
    assert [r["step"] for r in read_metrics(remote)] == [1, 2, 3]
    append(local, {"step": 4, "train/loss": 1.5})
    assert not publish_metrics(str(local))  # closed: no longer registered


def test_a_copy_already_published_is_uploaded_only_once_it_changes(url, tmp_path):
    remote = f"{url}/metrics.jsonl"
    local = str(tmp_path / "metrics.jsonl")
    begin_metrics(remote, local, resumed_from=None)
    writer = tmp_path / "writer.jsonl"  # meanwhile, the host whose tracker writes
    append(writer, {"step": 1, "train/loss": 3.0})
    MetricsUploader(str(writer), remote, interval=3600).close()
    # Another host of a TPU pod: its tracker is a no-op, so its copy never changes.
    with MetricsUploader(local, remote, interval=0.01, already_published=True) as uploader:
        assert not publish_metrics(local)
    assert uploader.uploads == 0 and [r["step"] for r in read_metrics(remote)] == [1]
    # The writing host's next attempt learns which segment is open and appends to it.
    with MetricsUploader(str(writer), remote, interval=3600, already_published=True) as uploader:
        append(writer, {"step": 2, "train/loss": 2.5})
    assert uploader.uploads == 1 and [r["step"] for r in read_metrics(remote)] == [1, 2]
    assert list(_segments(remote)) == ["part-000000.jsonl"]


def test_a_failed_run_still_publishes_its_metrics_and_keeps_its_own_error(url, tmp_path):
    local = tmp_path / "metrics.jsonl"
    remote = f"{url}/metrics.jsonl"
    with (
        pytest.raises(RuntimeError, match="training failed"),
        MetricsUploader(str(local), remote, interval=3600),
    ):
        append(local, {"step": 7, "train/loss": 2.0})
        raise RuntimeError("training failed")
    assert [r["step"] for r in read_metrics(remote)] == [7]


def test_the_upload_interval_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="interval must be positive, got 0"):
        MetricsUploader(str(tmp_path / "m.jsonl"), "s3://bucket/m.jsonl", interval=0)
    with pytest.raises(ValueError, match="segment size must be positive, got 0"):
        MetricsUploader(str(tmp_path / "m.jsonl"), "s3://bucket/m.jsonl", interval=1, segment_bytes=0)


# -- the tracker with an s3:// step -----------------------------------------------------------------


def test_tracker_appends_locally_and_warns_and_reports_progress_into_an_s3_step(url, tmp_path):
    step_dir = f"{url}/train/x-abc"
    store = StepStore(open_storage(step_dir))
    owner = current_owner()
    token = store.acquire(step_dir, owner, ttl=60).token
    local = tmp_path / "scratch" / "metrics.jsonl"
    with step_events.bind(step_events.StepContext(step_dir, owner.run_id, token)):
        tracker = JsonlTracker(str(local), SpikePolicy(), summary_path=f"{step_dir}/summary.json")
    with MetricsUploader(str(local), f"{step_dir}/metrics.jsonl", interval=3600):
        # As Levanter logs a 12-step run: 0-based step indices, run_progress = step / num_train_steps.
        for step in range(1, 12):
            tracker.log({"train/loss": 2.0 if step < 11 else 9.0, "run_progress": step / 12}, step=step)
        tracker.log_summary({"parameter_count": 1234})
    assert [r["step"] for r in read_metrics(f"{step_dir}/metrics.jsonl")] == list(range(1, 12))
    events = store.events(step_dir)
    assert [e.event for e in events] == [Event.RUNNING, "WARNING"]
    assert events[1].message.startswith("loss spike at step 11: 9.0000 is 4.5x")
    progress = json.loads(cat(f"{step_dir}/.progress"))
    assert progress["done"] == 12 and progress["total"] == 12
    assert progress["data"]["loss"] == 9.0 and progress["data"]["interventions"] == {"spike_steps": 1}
    assert json.loads(cat(f"{step_dir}/summary.json")) == {"parameter_count": 1234}


def test_tracker_refuses_a_path_it_cannot_append_to(url):
    with pytest.raises(ValueError, match="must be a local path"):
        JsonlTracker(f"{url}/metrics.jsonl", SpikePolicy())


# -- checkpoints on s3 ------------------------------------------------------------------------------


def save_checkpoint(checkpoints: str, step: int, metrics_path: str) -> None:
    """A real Levanter checkpoint of a small tree, through the checkpointer train_moe configures."""
    config = MetricsCheckpointerConfig(
        metrics_path=metrics_path, base_path=checkpoints, append_run_id_to_base_path=False, keep=None
    )
    checkpointer = config.create("test")
    checkpointer.save_checkpoint({"w": jnp.arange(4.0)}, step, f"step-{step}")
    checkpointer.wait_until_finished()


def test_metrics_are_published_before_a_checkpoint_is_saved(url, tmp_path):
    local = tmp_path / "metrics.jsonl"
    remote = f"{url}/metrics.jsonl"
    checkpoints = f"{url}/checkpoints"
    with MetricsUploader(str(local), remote, interval=3600):  # no periodic upload during the test
        append(local, *({"step": s, "train/loss": 3.0} for s in range(4)))
        save_checkpoint(checkpoints, 3, str(local))
        # The lines up to the checkpoint's step are on the output: a resume from it loses nothing.
        assert [r["step"] for r in read_metrics(remote)] == [0, 1, 2, 3]
    assert latest_step(checkpoints) == (f"{checkpoints}/step-3", 3)
    assert latest_step(f"{url}/nothing-here") == (None, None)


# -- an attempt past its lease: what the write fence cannot see -------------------------------------


def _files(root: Path | str) -> dict[str, tuple[bytes, float]]:
    """Every file under `root` (a path or URL): its bytes and modification time."""
    fs, plain = fsspec.core.url_to_fs(str(root))
    fs.invalidate_cache()
    found = {}
    for path in fs.find(plain):
        info = fs.info(path)
        modified = info.get("mtime") or info.get("LastModified")
        found[path] = (
            fs.cat_file(path),
            modified.timestamp() if hasattr(modified, "timestamp") else modified,
        )
    return found


def test_an_attempt_past_its_lease_uploads_nothing(url, tmp_path):
    remote = f"{url}/metrics.jsonl"
    local = tmp_path / "metrics.jsonl"
    left = [60.0]
    fence = Fence(lambda: left[0], "train/x")
    with fenced_thread(fence):
        uploader = MetricsUploader(str(local), remote, interval=3600)
        append(local, {"step": 1, "train/loss": 3.0})
        assert uploader.upload()  # the lease is held
        published = _files(url)
        append(local, {"step": 2, "train/loss": 2.5})
        left[0] = 0.0  # paused past the lease: another runner may own the output now
        with pytest.raises(LeaseExpired, match=r"refused upload of s3://.*/metrics/part-000000\.jsonl"):
            uploader.upload()
        with pytest.raises(LeaseExpired, match=r"refused upload of s3://.*/summary\.json"):
            write_file(f"{url}/summary.json", b"{}")
        with pytest.raises(LeaseExpired, match="rewrite of the metrics segments"):
            begin_metrics(remote, str(tmp_path / "again.jsonl"), resumed_from=None)
    assert _files(url) == published


def test_an_attempt_past_its_lease_leaves_its_ledger_as_last_written(url):
    """The ledger (`.logs/attempt-<token>.ledger.json`) is the attempt's own file, but under the
    step's output all the same: once the lease may have expired, its accounts are dropped."""
    step_dir = f"{url}/train/ledger-abc"
    store = StepStore(open_storage(step_dir))
    owner = current_owner()
    token = store.acquire(step_dir, owner, ttl=60).token
    left = [60.0]
    with (
        step_events.bind(step_events.StepContext(step_dir, owner.run_id, token)),
        fenced_thread(Fence(lambda: left[0], "train/x")),
    ):
        guard = step_events.lease_guard()
        assert step_events.account({"steps": 5.0}, {"last_step": 4}, guard=guard)
        written = _files(f"{step_dir}/.logs")
        left[0] = 0.0
        assert not step_events.account({"steps": 9.0}, {"last_step": 8}, guard=guard)
        assert not step_events.account({"steps": 9.0}, {"last_step": 8})  # the thread's own fence
    assert len(written) == 1 and _files(f"{step_dir}/.logs") == written


def test_an_upload_that_passed_its_check_before_a_pause_cannot_replace_a_newer_attempts_segment(
    url, tmp_path
):
    """The lease check and the upload are two moments: a process frozen between them sends the
    upload when it thaws. The segment write is conditional, so the newer attempt's bytes win."""
    remote = f"{url}/metrics.jsonl"
    stale_file, newer_file = tmp_path / "stale.jsonl", tmp_path / "newer.jsonl"
    stale = MetricsUploader(str(stale_file), remote, interval=3600)
    append(stale_file, *({"step": s, "train/loss": 3.0} for s in range(4)))
    assert stale.upload()
    append(stale_file, {"step": 4, "train/loss": 3.0})  # logged, about to be uploaded: then frozen
    # Meanwhile a newer attempt resumes from the checkpoint at step 2 and uploads its own lines.
    begin_metrics(remote, str(newer_file), resumed_from=2)
    newer = MetricsUploader(str(newer_file), remote, interval=3600, already_published=True)
    append(newer_file, {"step": 3, "train/loss": 1.0})
    assert newer.upload()
    theirs = _segments(remote)
    fence = Fence(lambda: 60.0, "train/x")  # its clock says the lease is still held
    with fenced_thread(fence):
        stale._guard = step_events.lease_guard()  # as if made in this (fenced) step thread
        with pytest.raises(LeaseExpired, match="another attempt of this step has rewritten it"):
            stale.upload()
    assert fence.tripped and _segments(remote) == theirs
    assert [r["loss"] for r in read_metrics(remote)] == [3.0, 3.0, 3.0, 1.0]


def test_the_upload_thread_stops_once_the_lease_may_have_expired(url, tmp_path):
    remote = f"{url}/metrics.jsonl"
    local = tmp_path / "metrics.jsonl"
    left = [60.0]
    with fenced_thread(Fence(lambda: left[0], "train/x")):
        uploader = MetricsUploader(str(local), remote, interval=0.02).start()
    append(local, {"step": 1, "train/loss": 3.0})
    deadline = time.monotonic() + 60
    while uploader.uploads == 0:
        assert time.monotonic() < deadline, "no periodic upload"
        time.sleep(0.01)
    left[0] = 0.0
    append(local, {"step": 2, "train/loss": 2.5})
    deadline = time.monotonic() + 60
    while uploader._thread is not None and uploader._thread.is_alive():
        assert time.monotonic() < deadline, "the upload thread kept going"
        time.sleep(0.01)
    assert [r["step"] for r in read_metrics(remote)] == [1]
    with pytest.raises(LeaseExpired):
        uploader.close()  # the last upload is refused too, and says why


def test_a_checkpoint_is_not_handed_to_tensorstore_past_the_lease_nor_over_another_attempts(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    metrics = str(tmp_path / "metrics.jsonl")
    save_checkpoint(str(checkpoints), 5, metrics)  # the new owner's checkpoint
    theirs = _files(checkpoints)
    left = [0.0]
    # A stale attempt resumed after its lease expired: its next checkpoint is refused before
    # TensorStore writes a byte.
    with (
        fenced_thread(Fence(lambda: left[0], "train/x")),
        pytest.raises(LeaseExpired, match="checkpoint of step 6"),
    ):
        save_checkpoint(str(checkpoints), 6, metrics)
    # Its clock says the lease is still held (skew), but another attempt saved this step: refused,
    # and the attempt is marked as one whose writes were refused.
    left[0] = 60.0
    fence = Fence(lambda: left[0], "train/x")
    with fenced_thread(fence), pytest.raises(LeaseExpired, match="another attempt of this step has saved it"):
        save_checkpoint(str(checkpoints), 5, metrics)
    assert fence.tripped
    assert _files(checkpoints) == theirs
    # The same attempt may save one step twice (Levanter's forced final save after an interval one).
    config = MetricsCheckpointerConfig(
        metrics_path=metrics, base_path=str(checkpoints), append_run_id_to_base_path=False, keep=None
    )
    checkpointer = config.create("test")
    for _ in range(2):
        checkpointer.save_checkpoint({"w": jnp.arange(4.0)}, 7, "step-7")
        checkpointer.wait_until_finished()
    assert latest_step(str(checkpoints)) == (str(checkpoints / "step-7"), 7)


def test_evaluate_finds_checkpoints_and_writes_its_files_by_url(url, tmp_path):
    train, output = f"{url}/train", f"{url}/evaluate"
    save_checkpoint(f"{train}/checkpoints", 2, str(tmp_path / "unused.jsonl"))
    save_checkpoint(f"{train}/checkpoints", 5, str(tmp_path / "unused.jsonl"))
    config = EvaluateConfig(train=train, data=f"{url}/mixture", output=output)
    assert checkpoint_to_evaluate(config.train, None) == (f"{train}/checkpoints/step-5", 5)
    assert checkpoint_to_evaluate(train, 2)[1] == 2
    with pytest.raises(FileNotFoundError, match="checkpoint_step 3: no complete checkpoint"):
        checkpoint_to_evaluate(train, 3)
    # Uncompacted lines, as while training runs: the plot merges them per step.
    write_file(
        f"{train}/metrics.jsonl",
        "".join(json.dumps({"step": s, "train/loss": 3.0 - s / 10}) + "\n" for s in range(6)).encode(),
    )
    plot_loss(f"{train}/metrics.jsonl", f"{output}/loss.png", 5, {"prose": {"loss": 2.4}})
    with fsspec.open(f"{output}/loss.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert evaluate_report(config) is None  # no results.json yet
    result = {
        "checkpoint": f"{train}/checkpoints/step-5",
        "checkpoint_step": 5,
        "validation_sets": {"prose": {"loss": 2.4, "bits_per_byte": 0.9, "perplexity": 11.0}},
        "average": {"loss": 2.4, "bits_per_byte": 0.9, "perplexity": 11.0},
    }
    write_file(f"{output}/results.json", json.dumps(result).encode())
    text = format_preview(evaluate_report(config))  # as the end-of-run summary prints it
    assert "prose" in text and "2.400" in text and f"loss plot:  {output}/loss.png" in text


# -- a whole experiment on s3 -------------------------------------------------------------------------


def _run_until_a_checkpoint(
    command: list[str], env: dict[str, str], cwd: Path, prefix: str
) -> tuple[subprocess.Popen, list[bytes], threading.Thread]:
    """Start a run and return once its training has a complete checkpoint at step 10: the process,
    its stderr (read to the end by the thread returned, so that a chatty run never blocks on a
    full pipe)."""
    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 900
    while not glob(f"{prefix}/train/test-*/checkpoints/step-10/metadata.json"):
        assert proc.poll() is None, b"".join(stderr)[-3000:].decode(errors="replace")
        assert time.monotonic() < deadline, "no checkpoint at step 10"
        time.sleep(0.1)
    return proc, stderr, reader


@pytest.mark.slow
def test_a_training_runner_paused_past_its_lease_changes_no_byte_of_the_new_owners_output(s3_env, tmp_path):
    """SIGSTOP a runner after its first checkpoint, let a second take the step over and finish,
    then SIGCONT the first: its training resumes where it stopped, and every upload and checkpoint
    save it then tries is refused, so the new owner's objects stay as they were."""
    steps = 30
    prefix = f"s3://{BUCKET}/paused-{uuid.uuid4().hex[:12]}"
    exp = tmp_path / "exp.py"
    # Uploads every second: the paused runner has lines to upload when it resumes.
    text = EXPERIMENT.format(root=str(ROOT), model=dict(QWEN), optimizer=dict(name="adamw"), steps=steps)
    exp.write_text(
        text.replace("router_stats_interval=5)", "router_stats_interval=5, metrics_upload_seconds=1)")
    )
    env = {**os.environ, **s3_env, "PYTHONPATH": str(ROOT), "DRYDOCK_SCRATCH": str(tmp_path / "scratch")}
    env["RAY_AUTH_MODE"] = "disabled"
    leases = ["--lease_timeout", "5", "--heartbeat_interval", "1", "--wait_poll_interval", "0.5"]
    command = tiny_command(exp, prefix, *leases)

    paused, stderr, reader = _run_until_a_checkpoint(command, env, tmp_path, prefix)
    paused.send_signal(signal.SIGSTOP)
    try:
        time.sleep(6)  # past its lease
        owner = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert owner.returncode == 0, owner.stderr[-3000:]
        (train,) = [p for p in glob(f"{prefix}/train/test-*") if not p.endswith(".json")]
        outcome = json.loads(cat(f"{train}/train_result.json"))
        assert outcome["resumed_from_step"] >= 10 and outcome["final_step"] == steps - 1
        committed = {
            p: v for p, v in _files(train).items() if posixpath.basename(p) not in {".lease", ".progress"}
        }
        assert any("/checkpoints/step-" in p for p in committed) and any(
            "/metrics/part-" in p for p in committed
        )
    finally:
        paused.send_signal(signal.SIGCONT)
    paused.wait(300)
    reader.join(30)
    log = b"".join(stderr).decode(errors="replace")
    assert "lease" in log, log[-3000:]  # it learnt that it had lost the step
    after = {p: v for p, v in _files(train).items() if posixpath.basename(p) not in {".lease", ".progress"}}
    assert after == committed, sorted(
        p for p in set(after) | set(committed) if after.get(p) != committed.get(p)
    )
    records = read_metrics(f"{train}/metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == list(range(2, steps))  # each step once


def test_the_scaling_fit_reads_its_evaluations_and_writes_its_files_by_url(url, tmp_path):
    """steps.scaling reads results.json and writes fit.json and fit.png through fsspec (it used
    built-in `open` and could not use an s3:// prefix)."""
    from steps.scaling.fit import report as scaling_report
    from steps.scaling.fit import scaling_fit
    from tests.steps.scaling.test_scaling import step_config

    local = step_config(tmp_path / "local")
    points = []
    for point in local.points:
        remote = f"{url}/{Path(point.evaluation).name}"
        write_file(f"{remote}/results.json", (Path(point.evaluation) / "results.json").read_bytes())
        points.append(dataclasses.replace(point, evaluation=remote))
    target_eval = f"{url}/eval-target"
    write_file(f"{target_eval}/results.json", (Path(local.target.evaluation) / "results.json").read_bytes())
    config = dataclasses.replace(
        local,
        points=points,
        target=dataclasses.replace(local.target, evaluation=target_eval),
        output=f"{url}/fit",
    )
    assert scaling_report(config) is None  # nothing written yet
    scaling_fit(config)
    fit = json.loads(cat(f"{url}/fit/fit.json"))
    assert (
        fit["methods"]["chinchilla"]["fit"]["num_points"] == 9 and fit["target"]["measured_loss"] is not None
    )
    with fsspec.open(f"{url}/fit/fit.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert f"fit:  {url}/fit/fit.json" in scaling_report(config)
    assert not (tmp_path / "local" / "fit").exists()


def fake_checkpoints(root: str, steps: list[int]) -> None:
    """Checkpoint directories as Levanter leaves them: data files, then metadata.json last."""
    fs, plain = fsspec.core.url_to_fs(root)
    for step in steps:
        fs.pipe_file(f"{plain}/step-{step}/d/shard-0", b"x" * 100)
        fs.pipe_file(f"{plain}/step-{step}/metadata.json", json.dumps({"step": step}).encode())


def test_rewinds_and_retention_delete_exactly_their_checkpoints_on_object_storage(url):
    # Issue 31, part 0: what a rewind and the retention policy delete, on the moto server.
    from steps.training.checkpoints import complete_checkpoints, delete_checkpoints, prune_checkpoints

    root = f"{url}/checkpoints"
    fake_checkpoints(root, [10, 20, 30, 40, 50])
    assert delete_checkpoints(root, after=30, set_aside="/unused-on-object-stores") == [40, 50]
    fs, plain = fsspec.core.url_to_fs(root)
    fs.invalidate_cache()
    assert sorted(complete_checkpoints(root)) == [10, 20, 30]
    assert not fs.exists(f"{plain}/step-40") and not fs.exists(f"{plain}/step-50/d/shard-0")
    # Retention: the newest two interval checkpoints, every multiple of 20, and the final one.
    fake_checkpoints(root, [40, 50, 55])
    assert prune_checkpoints(root, interval=10, keep=2, keep_every=20, final_step=55) == [10, 30]
    fs.invalidate_cache()
    assert sorted(complete_checkpoints(root)) == [20, 40, 50, 55]
    with pytest.raises(TypeError):
        delete_checkpoints(root, after=None)  # type: ignore[arg-type]  # "all of them" is gone


def moto_pid(endpoint: str) -> int:
    """The pid of the moto server answering at `endpoint` (the test suite's own)."""
    port = endpoint.rsplit(":", 1)[1]
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    (pid,) = [
        int(line.split()[0]) for line in out.splitlines() if f"moto.server -H 127.0.0.1 -p {port}" in line
    ]
    return pid


def status_events(step: str) -> list[dict]:
    return [json.loads(line) for line in cat(f"{step}/.status").splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize(("outage", "lost"), [(20.0, True), (3.0, False)])
def test_a_storage_outage_longer_than_the_lease_ends_the_attempt_and_the_runner_takes_its_step_back(
    s3_env, tmp_path, outage, lost
):
    """Issue 31, part 4: the object store stops answering (its server frozen: every request hangs)
    for `outage` seconds during a training, on a lease of 8 s. Longer than the lease: the attempt's
    lease counts as lost, its writes are fenced, it ends without committing, and the runner takes
    its own step back once the store answers and resumes it from its checkpoint. Shorter: nothing
    happens but a pause."""
    steps = 30
    prefix = f"s3://{BUCKET}/outage-{uuid.uuid4().hex[:12]}"
    exp = tmp_path / "exp.py"
    text = EXPERIMENT.format(root=str(ROOT), model=dict(QWEN), optimizer=dict(name="adamw"), steps=steps)
    exp.write_text(
        text.replace("router_stats_interval=5)", "router_stats_interval=5, metrics_upload_seconds=1)")
    )
    env = {**os.environ, **s3_env, "PYTHONPATH": str(ROOT), "DRYDOCK_SCRATCH": str(tmp_path / "scratch")}
    env["RAY_AUTH_MODE"] = "disabled"
    leases = ["--lease_timeout", "8", "--heartbeat_interval", "1", "--wait_poll_interval", "0.5"]
    command = tiny_command(exp, prefix, *leases)
    proc, stderr, reader = _run_until_a_checkpoint(command, env, tmp_path, prefix)
    server = moto_pid(s3_env["AWS_ENDPOINT_URL_S3"])
    os.kill(server, signal.SIGSTOP)  # every request now hangs, as in a real outage
    try:
        time.sleep(outage)
    finally:
        os.kill(server, signal.SIGCONT)
    assert proc.wait(600) == 0, b"".join(stderr).decode(errors="replace")[-3000:]
    reader.join(30)
    (train,) = [p for p in glob(f"{prefix}/train/test-*") if not p.endswith(".json")]
    events = [e["event"] for e in status_events(train)]
    if lost:  # two attempts: the lost one wrote nothing more, the second committed
        assert events == ["RUNNING", "RUNNING", "SUCCESS"], events
        outcome = json.loads(cat(f"{train}/train_result.json"))
        assert outcome["resumed_from_step"] >= 10
    else:
        assert events == ["RUNNING", "SUCCESS"], events
    records = read_metrics(f"{train}/metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == list(range(2, steps))  # none lost, none twice


@pytest.mark.slow
def test_a_ray_run_on_an_object_store_with_a_follower_is_killed_and_resumed(s3_env, tmp_path):
    """Issue 31, part 4: the configuration of a real cluster run, on this machine: the Ray backend
    (a private instance of two CPUs), a prefix on object storage (moto), a training and a follower
    evaluating its checkpoints as they land. The runner is killed after a checkpoint (what it had
    published by then survives); the rerun resumes both, every checkpoint is evaluated once, and
    nothing lands on local disk but the killed attempt's scratch copy."""
    steps = 30
    prefix = f"s3://{BUCKET}/ray-{uuid.uuid4().hex[:12]}"
    exp = tmp_path / "exp.py"
    text = EXPERIMENT.format(root=str(ROOT), model=dict(QWEN), optimizer=dict(name="adamw"), steps=steps)
    # The evaluation follows the training: it runs beside it, evaluating each checkpoint that lands.
    text = text.replace("max_batches=4)", "max_batches=4, follow=True)")
    # Never upload by the clock here: what survives the kill was published at the checkpoint.
    text = text.replace("router_stats_interval=5)", "router_stats_interval=5, metrics_upload_seconds=3600)")
    assert "follow=True" in text and "metrics_upload_seconds=3600" in text
    exp.write_text(text)
    cwd, scratch = tmp_path / "cwd", tmp_path / "scratch"
    cwd.mkdir()
    env = {**os.environ, **s3_env, "PYTHONPATH": str(ROOT), "DRYDOCK_SCRATCH": str(scratch)}
    env["RAY_AUTH_MODE"] = "disabled"
    seed(prefix)
    command = [sys.executable, "-m", "pipeline", "run", str(exp), "--prefix", prefix, "--ray.num_cpus", "2"]
    proc, _, _ = _run_until_a_checkpoint(command, env, cwd, prefix)
    proc.send_signal(signal.SIGKILL)  # the runner; its private Ray instance goes with it
    proc.wait(30)
    (train,) = [p for p in glob(f"{prefix}/train/test-*") if not p.endswith(".json")]
    assert not exists(f"{train}/train_result.json")
    assert read_metrics(f"{train}/metrics.jsonl"), "nothing published before the checkpoint"

    rerun = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    outcome = json.loads(cat(f"{train}/train_result.json"))
    assert outcome["resumed_from_step"] >= 10 and outcome["final_step"] == steps - 1
    assert outcome["final_checkpoint"] == f"{train}/checkpoints/step-{steps - 1}"
    records = read_metrics(f"{train}/metrics.jsonl")
    assert [r["step"] for r in records if "loss" in r] == list(range(2, steps))  # each step once
    assert any("router_max_load_ratio" in r for r in records)
    for name in ("levanter_model.json", "summary.json", f"hf/step-{steps - 1}/config.json"):
        assert exists(f"{train}/{name}"), name
    assert glob(f"{train}/logs/*"), "Levanter's log was not uploaded"
    (evaluation,) = [p for p in glob(f"{prefix}/evaluate/test-*") if not p.endswith(".json")]
    evaluated = sorted(
        int(p.rsplit("step-", 1)[1].removesuffix(".json")) for p in glob(f"{evaluation}/results/step-*.json")
    )
    assert evaluated == [10, 20, steps - 1]
    results = json.loads(cat(f"{evaluation}/results.json"))
    assert results["checkpoint_step"] == steps - 1
    assert set(results["validation_sets"]) == {"prose", "arithmetic"}
    assert exists(f"{evaluation}/loss.png")
    # Nothing landed on local disk (no "s3:" directory); of the scratch copies, only the killed
    # attempt's is left.
    assert list(cwd.iterdir()) == []
    assert len(list(scratch.iterdir())) == 1
