"""Every file and directory name Drydock uses under a storage prefix, in one place.

    <prefix>/<name>-<hash>/                 a step directory; <name>-<hash> is the step's label
        .step.json  .status  .lease         the commit protocol (pipeline.storage.step_store)
        .progress                           the running attempt's last progress report
        .pinned                             `drydock pin`: gc keeps this directory
        .logs/attempt-<token>[...].log      a copy of each attempt's output
        .tmp-*                              a write in progress (or the trace of one that died)
        .status.corrupt-<token>             an unreadable `.status` set aside by `--force`
        <anything else>                     the step's payload
    <prefix>/experiments/<experiment>-<hash>.json   run manifests (pipeline.storage.manifests): the
                                                    latest run of that DAG
    <prefix>/experiments/runs/<experiment>-<hash>/<run id>.json   every run's own record
    <prefix>/experiments/alerts/<run id>.jsonl     the alerts a run sent (--notify)

Path helpers join with `/` (fsspec URLs and local paths alike). No I/O here.
"""

from __future__ import annotations

import re

from pipeline.core.dag import join_path
from pipeline.core.identity import HASH_CHARS, NAME_PART

__all__ = [
    "ADOPTING",
    "ALERTS_DIR",
    "HIDDEN_FILES",
    "LABEL",
    "LEASE",
    "LOGS_DIR",
    "MANIFEST_DIR",
    "PINNED",
    "PROGRESS",
    "STATUS",
    "STEP_DIR_MARKERS",
    "STEP_JSON",
    "TMP_PREFIX",
    "alerts_path",
    "dump_request_name",
    "is_label",
    "is_payload",
    "join_path",
    "log_name",
    "manifest_name",
    "pulse_name",
    "split_label",
    "stacks_name",
    "started_name",
    "started_path",
    "step_dir",
]

STEP_JSON = ".step.json"
STATUS = ".status"
LEASE = ".lease"
PROGRESS = ".progress"
PINNED = ".pinned"
ADOPTING = ".adopting"
"""Written by `drydock adopt` before it moves files into a step directory, removed once it has
committed: a step directory holding it and no SUCCESS holds an interrupted adoption's files,
which the next attempt removes before it starts (an attempt starts from only what it writes)."""
LOGS_DIR = ".logs"
TMP_PREFIX = ".tmp-"
CORRUPT_PREFIX = f"{STATUS}.corrupt-"
HIDDEN_FILES = frozenset({STEP_JSON, STATUS, LEASE, LOGS_DIR, PROGRESS, PINNED, ADOPTING})
"""Drydock's own entries in a step directory (plus `.status.corrupt-*` and `.tmp-*`)."""
STEP_DIR_MARKERS = frozenset({STATUS, STEP_JSON, LEASE})
"""A directory holding any of these is a step directory."""
MANIFEST_DIR = "experiments"
"""Run manifests live in `<prefix>/experiments/`."""
ALERTS_DIR = "alerts"
"""`<prefix>/experiments/alerts/<run id>.jsonl`: the alerts a run sent (`pipeline.run.console.alerts`)."""

_HASH = rf"[0-9a-f]{{{HASH_CHARS}}}"
LABEL = re.compile(rf"^{NAME_PART}(/{NAME_PART})*-{_HASH}$")
"""A step label: a slash-separated name, `-`, and the first HASH_CHARS hex digits of its identity."""
_ENTRY = re.compile(rf"^(.+)-({_HASH})$")


def alerts_path(prefix: str, run_id: str) -> str:
    """Where the run `run_id` records the alerts it sent."""
    return f"{join_path(prefix, MANIFEST_DIR)}/{ALERTS_DIR}/{run_id}.jsonl"


def step_dir(prefix: str, label: str) -> str:
    """A step's directory under the prefix: `<prefix>/<name>-<hash>`."""
    return f"{prefix.rstrip('/')}/{label}"


def is_label(text: str) -> bool:
    """Whether `text` is a step label (and so names a directory inside the prefix)."""
    return bool(LABEL.match(text)) and not any(part in ("", ".", "..") for part in text.split("/"))


def split_label(entry: str) -> tuple[str, str] | None:
    """(`name`, `hash`) of a directory entry named `<name>-<hash>`, else None."""
    match = _ENTRY.match(entry)
    return (match[1], match[2]) if match else None


def is_payload(name: str) -> bool:
    """Whether an entry of a step directory is the step's own output, not Drydock's metadata."""
    return name not in HIDDEN_FILES and not name.startswith((TMP_PREFIX, CORRUPT_PREFIX))


def log_name(token: int, slice_id: int | None = None, host: int | None = None) -> str:
    """The log file of an attempt: of one host of one TPU slice, or of one host of a gang of hosts."""
    if slice_id is not None:
        return f"attempt-{token}-slice-{slice_id}-host-{host}.log"
    return f"attempt-{token}-host-{host}.log" if host is not None else f"attempt-{token}.log"


def _host(host: int | None) -> str:
    return "" if host is None else f"-host-{host}"


def pulse_name(token: int, host: int | None = None) -> str:
    """What a running attempt's process says of itself every few seconds (`pipeline.run.in_step.pulse`)."""
    return f"attempt-{token}{_host(host)}.pulse"


def stacks_name(token: int, host: int | None = None) -> str:
    """The Python stacks a hung attempt's process saved (a log, so the dashboard shows it)."""
    return f"attempt-{token}{_host(host)}-stacks.log"


def started_name(token: int) -> str:
    """Written when an attempt's function starts running (by the gang's first host): the runner
    then starts the steps that follow it (`pipeline.core.run_state`)."""
    return f"attempt-{token}.started"


def started_path(step_dir: str, token: int) -> str:
    """Where the attempt `token` of the step in `step_dir` says its function started."""
    return f"{step_dir.rstrip('/')}/{LOGS_DIR}/{started_name(token)}"


def ledger_name(token: int) -> str:
    """Where attempt `token`'s step said its time went, so far (`step_events.account`)."""
    return f"attempt-{token}.ledger.json"


def ledger_path(step_dir: str, token: int) -> str:
    """The path of `ledger_name(token)` in the step directory `step_dir`."""
    return f"{step_dir.rstrip('/')}/{LOGS_DIR}/{ledger_name(token)}"


def stop_request_name(token: int) -> str:
    """The runner's request to an attempt's processes: stop cleanly (its run's budget is spent)."""
    return f"attempt-{token}.stop"


def dump_request_name(token: int) -> str:
    """The watchdog's request to an attempt's processes: save your stacks."""
    return f"attempt-{token}.dump"


def log_token(name: str) -> int | None:
    """The fencing token in a log file's name, or None."""
    match = re.match(r"^attempt-(\d+)", name)
    return int(match[1]) if match else None


def manifest_name(experiment: str, digest: str) -> str:
    """`experiments/<experiment>-<digest>.json`, relative to the prefix."""
    return f"{MANIFEST_DIR}/{experiment}-{digest}.json"


def manifest_pattern(experiment: str) -> re.Pattern[str]:
    """File names of an experiment's manifests in `experiments/`."""
    return re.compile(rf"^{re.escape(experiment)}-{_HASH}\.json$")
