"""The format of `metrics.jsonl`, the per-step metrics a training step writes in its output.

The engine knows nothing of training, but `drydock status` and the dashboard show a training
step's loss, and the step library reads the file back on resume: this module is the one reader
of the format they share. One JSON object per line with an integer `step`; several lines may
carry one step (Levanter logs evaluation and training metrics separately), later keys winning;
a line cut short by a kill is skipped. A line with an `event` key is an intervention (a loss
spike, a skipped update, a rewind), not a step's metrics: `parse_events` returns those.

Where the lines are. A step on local disk appends to `<output>/metrics.jsonl`. Object stores
cannot append, and republishing one growing file costs the whole file each time (hundreds of MB
for a long run), so a step on object storage writes segments instead:
`<output>/metrics/part-000000.jsonl`, `part-000001.jsonl`, ... Every segment but the last is
closed and never changes; the last is the open one, republished as it grows. The lines of a
step are those of `metrics.jsonl` (if any) followed by those of the segments in number order:
`metrics_files` says which, `read_metrics_data` and `read_metrics_tail` read them with the
reader's own `read`/`listdir` (a `Storage`'s or fsspec's), so this module does no I/O itself.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = [
    "ALIASES",
    "EVENT_KINDS",
    "METRICS_DIR",
    "METRICS_FILE",
    "branch_event",
    "branch_of",
    "metrics_files",
    "parse_events",
    "parse_metrics",
    "read_metrics_data",
    "read_metrics_tail",
    "segment_index",
    "segment_name",
    "step_of",
]

METRICS_FILE = "metrics.jsonl"
METRICS_DIR = "metrics"
"""The directory of the segments of a step whose output is on object storage."""

_SEGMENT = re.compile(r"part-(\d{6,})\.jsonl")


def segment_name(index: int) -> str:
    """The file name of segment `index` (`part-000123.jsonl`)."""
    return f"part-{index:06d}.jsonl"


def segment_index(name: str) -> int | None:
    """The number of the segment named `name`, or None if it is not a segment's name."""
    match = _SEGMENT.fullmatch(name)
    return int(match.group(1)) if match else None


def metrics_files(step_dir: str, listdir: Callable[[str], list[str]]) -> list[str]:
    """The files holding `step_dir`'s metrics lines, in reading order: `metrics.jsonl` if it is
    there, then the segments by number. `listdir(path)` gives the base names in `path` ([] if
    none)."""
    entries = listdir(step_dir)
    files = [f"{step_dir}/{METRICS_FILE}"] if METRICS_FILE in entries else []
    if METRICS_DIR in entries:
        numbered = ((segment_index(n), n) for n in listdir(f"{step_dir}/{METRICS_DIR}"))
        files += [f"{step_dir}/{METRICS_DIR}/{n}" for i, n in sorted(p for p in numbered if p[0] is not None)]
    return files


def read_metrics_data(
    step_dir: str,
    read: Callable[[str], bytes | None],
    listdir: Callable[[str], list[str]],
    *,
    read_all: Callable[[list[str]], list[bytes | None]] | None = None,
) -> bytes | None:
    """All of `step_dir`'s metrics lines as one text, or None if it has none. A segment deleted
    between the listing and the read (a resumed run rewriting them) is skipped. `read_all` reads
    several files at once, in order (a long run on object storage has hundreds of segments, and
    one request after another is latency-bound); by default they are read one by one."""
    files = metrics_files(step_dir, listdir)
    if not files:
        return None
    parts = read_all(files) if read_all is not None else [read(f) for f in files]
    return b"".join(_whole_lines(p) for p in parts if p)


def read_metrics_tail(
    step_dir: str,
    read_tail: Callable[[str, int], bytes | None],
    listdir: Callable[[str], list[str]],
    size: int,
) -> bytes | None:
    """Whole lines from about the last `size` bytes of `step_dir`'s metrics (None if it has none):
    the last file's tail, and the one before's too when the last is shorter (a segment just
    opened). A line cut by the `size` limit is left out."""
    files = metrics_files(step_dir, listdir)
    if not files:
        return None
    tail = b""
    for path in reversed(files):
        want = size - len(tail)
        part = read_tail(path, want) or b""
        if len(part) >= want:  # cut: the first line is probably a piece of one
            whole = part[part.find(b"\n") + 1 :] if b"\n" in part else b""
            return (_whole_lines(whole) if whole else b"") + tail
        tail = _whole_lines(part) + tail if part else tail
    return tail


def _whole_lines(data: bytes) -> bytes:
    """`data` ending in a newline, so that the next file's first line does not join its last."""
    return data if data.endswith(b"\n") else data + b"\n"


ALIASES = {
    "train/loss": "loss",
    "optim/learning_rate": "learning_rate",
    "throughput/tokens_per_second": "tokens_per_second",
    "router/max_load_ratio": "router_max_load_ratio",
}
"""Short names for Levanter's keys. A file still being written has only the long ones; one
compacted at the end of training has both."""


def step_of(record: Any) -> int:
    """A metrics line's step: a whole number from 0 to 2**63 (a float that is one, as some
    writers give, counts). Raises ValueError/KeyError/TypeError for anything else (`1e999`, read
    as infinity, or `1e300`), so that readers skip the line as they skip a torn one."""
    step = record["step"]
    if isinstance(step, bool) or not isinstance(step, int | float):
        raise TypeError(f"step {step!r} is not a number")
    if isinstance(step, float) and not (math.isfinite(step) and step.is_integer()):
        raise ValueError(f"step {step!r} is not a whole number")
    if not 0 <= step < 2**63:
        raise ValueError(f"step {step!r} is out of range")
    return int(step)


def parse_metrics(lines: Iterable[str | bytes], *, up_to: int | None = None) -> list[dict[str, Any]]:
    """One record per step, in step order, with the short aliases (`loss`, `learning_rate`, ...).

    Lines of one step merge (later keys win); torn or foreign lines are skipped; with `up_to`,
    steps after it are dropped.
    """
    merged: dict[int, dict[str, Any]] = {}
    for line in lines:
        try:
            record = json.loads(line)
            step = step_of(record)
        except (ValueError, KeyError, TypeError):
            continue
        if "event" in record:
            continue
        if up_to is None or step <= up_to:
            merged.setdefault(step, {}).update(record)
    out = []
    for step in sorted(merged):
        record = merged[step]
        for key, alias in ALIASES.items():
            if key in record:
                record[alias] = record[key]
        out.append(record)
    return out


EVENT_KINDS = ("spike", "nan", "inf", "skipped_update", "rewind", "off_prediction", "branch")
"""The events a training step records in metrics.jsonl."""


def branch_event(
    trunk: str, step: int, *, name: str | None = None, init: str | None = None
) -> dict[str, Any]:
    """The line a branch's metrics start with: it continues the metrics at `trunk` (an output
    path) from their `step`. Readers draw the branch from the trunk's point at `step` (where it
    left it), so its line forks from the trunk's instead of starting in the air."""
    shown = name or trunk
    message = f"branched from checkpoint {step} of {shown}" + (f" ({init})" if init else "")
    return {"event": "branch", "step": step, "trunk": trunk, "name": shown, "init": init, "message": message}


def branch_of(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The `branch` event among a step's events (see `branch_event`), or None if it is no branch."""
    for event in events:
        if event.get("event") == "branch" and isinstance(event.get("trunk"), str):
            return dict(event)
    return None


def parse_events(lines: Iterable[str | bytes]) -> list[dict[str, Any]]:
    """The event lines (`{"event": kind, "step": N, ...}`), in the order they were written."""
    out = []
    for line in lines:
        # Event lines are rare: skip decoding the others (a long run has hundreds of thousands).
        if (b'"event"' if isinstance(line, bytes) else '"event"') not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and isinstance(record.get("event"), str)
            and type(record.get("step")) is int
            and 0 <= record["step"] < 2**63
        ):
            out.append(record)
    return out
