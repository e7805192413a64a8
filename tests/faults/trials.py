"""Fault-injection trials against real executor processes, and the checks that count the damage.

One implementation serves `tests/faults/` (a few trials each) and `benchmarks/faults.py` (many).
Every trial runs the real CLI (`python -m pipeline run FILE ...`) in subprocesses on a fresh
local prefix, injects one kind of fault, and returns `Counts`:

  kill    SIGKILL the executor at a random moment of a six-step experiment, then rerun it;
  race    four executors start on one experiment and prefix at once;
  pause   SIGSTOP a runner mid-step until its lease expires, let a second runner take the step
          over and commit, then SIGCONT the first;
  flaky, full   storage faults under an in-process run (see `tests.faults.storage_trials`).

Kill trials run with `--backend local` (threads) or `ray`; with Ray the kill is timed from the
first step call, since starting Ray takes most of a run.

The step function (`tests.faults.stepfns.write_parts`) leaves a manifest and a call log, so a
trial can tell, for every step whose `.status` ends in SUCCESS, whether its output is complete,
produced by one call that finished, under the fencing token that committed it.

Definitions used in the counts (also in docs/reliability.md):
  committed       steps whose `.status` ends in SUCCESS at the end of the trial;
  duplicate       a step function call that started after its step was committed, or (race)
                  any call beyond the first of a step, or a committed output replaced later;
  half-committed  a committed step whose output fails its check (missing or altered part,
                  manifest of an unfinished call, manifest from another attempt than the
                  committing one, an upstream read that is no longer the committed upstream);
  lost            a step that is not committed after the final run completed;
  redone          a call that finished but whose runner died before it could commit, so the
                  rerun ran it again (expected after a crash: at-least-once, never committed twice).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import fsspec

from pipeline.core.records import Event, last_state, parse_status
from pipeline.storage.files import LocalStorage
from pipeline.storage.layout import HIDDEN_FILES
from pipeline.storage.step_store import StepStore
from tests.faults.stepfns import MANIFEST

__all__ = [
    "DIAMOND",
    "Counts",
    "Experiment",
    "calibrate",
    "kill_trial",
    "one_trial",
    "pause_trial",
    "race_trial",
    "run_trials",
    "summarize",
    "verify",
]

ROOT = Path(__file__).resolve().parents[2]

DIAMOND: Mapping[str, tuple[str, ...]] = {
    "src/s0": (),
    "src/s1": (),
    "src/s2": (),
    "mid/m0": ("src/s0", "src/s1"),
    "mid/m1": ("src/s1", "src/s2"),
    "out/sink": ("mid/m0", "mid/m1"),
}
"""Three sources, two joins, one sink: six steps, three levels."""

FAST_LEASES = ("--lease_timeout", "3", "--heartbeat_interval", "0.5", "--wait_poll_interval", "0.2")

_TEMPLATE = """
from pipeline import Step, executor_main, output_of, this_output, versioned
from tests.faults.stepfns import PartsConfig, write_parts

CALLS = {calls!r}
SHAPE = {shape!r}
steps = {{}}
for seed, (name, inputs) in enumerate(SHAPE.items()):
    config = PartsConfig(this_output(), CALLS, versioned(seed + {seed_base}), {parts}, {pause},
                         [output_of(steps[i]) for i in inputs])
    steps[name] = Step(name, write_parts, config)

if __name__ == "__main__":
    executor_main(list(steps.values()), description="fault-injection trial")
"""


@dataclass
class Counts:
    """What a set of trials did and found. Adding two Counts sums them."""

    trials: int = 0
    faults: int = 0
    """Faults injected: kills that landed while the run was unfinished, racing runners beyond
    the first, pauses that outlived the lease."""
    committed: int = 0
    duplicates: int = 0
    half_committed: int = 0
    lost: int = 0
    redone: int = 0
    problems: list[str] = field(default_factory=list)
    """One line per duplicate, half-committed or lost output, and per unexpected exit."""

    def __add__(self, other: Counts) -> Counts:
        out = Counts()
        for f in fields(Counts):
            setattr(out, f.name, getattr(self, f.name) + getattr(other, f.name))
        return out

    @property
    def clean(self) -> bool:
        """No duplicate, half-committed or lost output, and no unexpected exit."""
        return not (self.duplicates or self.half_committed or self.lost or self.problems)

    def row(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(Counts) if f.name != "problems"}


# -- the experiment and its runners ---------------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    """An experiment file, its prefix and its call log, all under one trial directory."""

    workdir: Path
    shape: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DIAMOND))
    parts: int = 4
    pause: float = 0.05
    backend: str = "local"
    max_concurrent: int = 2
    store: str | None = None
    """An object-store URL (`s3://bucket`) to keep the prefix in instead of local disk; each
    experiment gets a directory of its own there. The call log stays on local disk."""
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def file(self) -> Path:
        return self.workdir / "experiment.py"

    @property
    def prefix(self) -> Path:
        return self.workdir / "prefix"

    @property
    def target(self) -> str:
        """The prefix as the runners are given it: a local path, or a URL in `store`."""
        return f"{self.store.rstrip('/')}/{self.workdir.name}-{self.tag}" if self.store else str(self.prefix)

    @property
    def calls(self) -> Path:
        return self.workdir / "calls.log"

    def write(self) -> Experiment:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A per-trial seed base keeps identities distinct from other trials' (nothing shared).
        source = _TEMPLATE.format(
            calls=str(self.calls),
            shape=dict(self.shape),
            seed_base=0,
            parts=self.parts,
            pause=self.pause,
        )
        self.file.write_text(textwrap.dedent(source))
        return self

    def command(self, *extra: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            str(self.file),
            "--prefix",
            self.target,
            "--backend",
            self.backend,
            "--max_concurrent",
            str(self.max_concurrent),
            *FAST_LEASES,
            *extra,
        ]

    def start(self, name: str, *extra: str) -> subprocess.Popen:
        """Start a runner; its stdout and stderr go to `<workdir>/<name>.out|.err`."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["RAY_AUTH_MODE"] = "disabled"
        env.pop("DRYDOCK_PREFIX", None)
        with open(self.workdir / f"{name}.out", "wb") as out, open(self.workdir / f"{name}.err", "wb") as err:
            return subprocess.Popen(self.command(*extra), stdout=out, stderr=err, env=env, cwd=ROOT)

    def stderr(self, name: str, lines: int = 8) -> str:
        try:
            text = (self.workdir / f"{name}.err").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def finish(self, proc: subprocess.Popen, name: str, counts: Counts, timeout: float = 120) -> int:
        """Wait for a runner that should succeed; an exit other than 0 is recorded as a problem."""
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            counts.problems.append(f"{self.workdir.name}: runner {name} did not finish in {timeout}s")
            return -1
        if code != 0:
            counts.problems.append(f"{self.workdir.name}: runner {name} exited {code}: {self.stderr(name)}")
        return code

    def calls_log(self) -> list[dict]:
        try:
            text = self.calls.read_text()
        except FileNotFoundError:
            return []
        # A line cut by a kill cannot happen (one write per line), but stay robust.
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_for_call(self, event: str = "start", count: int = 1, timeout: float = 60) -> None:
        """Block until the call log holds `count` lines of `event` (an event another process writes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(1 for c in self.calls_log() if c["event"] == event) >= count:
                return
            time.sleep(0.005)
        raise TimeoutError(f"{self.calls}: no {count} `{event}` line(s) within {timeout}s")


# -- checking a prefix --------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What a prefix holds after a run: committed steps, and what is wrong with them."""

    committed: Mapping[str, str]
    """Step directory base name -> call id of its committed output."""
    success_time: Mapping[str, float]
    """Step directory base name -> time of its first SUCCESS event."""
    problems: tuple[str, ...]
    """One line per committed step whose output fails its check."""


def _digest(fs: fsspec.AbstractFileSystem, path: str) -> str | None:
    try:
        return hashlib.sha256(fs.cat_file(path)).hexdigest()
    except FileNotFoundError:
        return None


def verify(
    exp: Experiment, fs: fsspec.AbstractFileSystem | None = None, prefix: str | None = None
) -> Verdict:
    """Check every committed step under the prefix against its manifest and the call log.

    `fs` and `prefix` default to where the experiment keeps its prefix (`exp.target`).
    """
    if fs is None:
        fs, prefix = fsspec.core.url_to_fs(prefix or exp.target)
    prefix = prefix or str(exp.prefix)
    finished = {c["call"] for c in exp.calls_log() if c["event"] == "finish"}
    committed: dict[str, str] = {}
    success_time: dict[str, float] = {}
    manifests: dict[str, dict] = {}
    problems: list[str] = []
    try:
        found = fs.find(prefix)
    except FileNotFoundError:
        found = []
    for status in sorted(p for p in found if p.endswith("/.status")):
        step_dir = status.rsplit("/", 1)[0]
        key = step_dir.rsplit("/", 1)[-1]
        events = parse_status(fs.cat_file(status), status)
        last = last_state(events)
        if last is None or last.event != Event.SUCCESS:
            continue
        success_time[key] = min(e.time for e in events if e.event == Event.SUCCESS)
        try:
            manifest = json.loads(fs.cat_file(f"{step_dir}/{MANIFEST}"))
        except (FileNotFoundError, ValueError) as e:
            problems.append(f"{key}: committed without a readable manifest ({type(e).__name__})")
            continue
        manifests[key] = manifest
        committed[key] = manifest["call"]
        if manifest["call"] not in finished:
            problems.append(f"{key}: committed output is from call {manifest['call']}, which never finished")
        if manifest["token"] is not None and manifest["token"] != last.token:
            problems.append(
                f"{key}: output written by the attempt with token {manifest['token']}, "
                f"committed by token {last.token}"
            )
        for name, digest in manifest["parts"].items():
            actual = _digest(fs, f"{step_dir}/{name}")
            if actual != digest:
                what = "missing" if actual is None else "altered after the manifest was written"
                problems.append(f"{key}: {name} is {what}")
        payload = {
            name
            for name in (e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(step_dir, detail=False))
            if name not in HIDDEN_FILES and not name.startswith((".tmp-", ".status.corrupt-"))
        }
        extra = payload - set(manifest["parts"]) - {MANIFEST}
        if extra:
            problems.append(f"{key}: files not in its manifest: {sorted(extra)}")
    for key, manifest in manifests.items():
        for upstream, call in manifest["inputs"].items():
            if committed.get(upstream) != call:
                problems.append(
                    f"{key}: read {upstream} from call {call}, but the committed {upstream} is "
                    f"from call {committed.get(upstream)}"
                )
    return Verdict(committed, success_time, tuple(problems))


def _add_verdict(counts: Counts, exp: Experiment, verdict: Verdict, phase: str) -> None:
    counts.half_committed += len({p.split(":", 1)[0] for p in verdict.problems})
    counts.problems.extend(f"{exp.workdir.name} ({phase}): {p}" for p in verdict.problems)


def _final_checks(exp: Experiment, counts: Counts, verdict: Verdict, expected_steps: int) -> None:
    """Lost steps and calls that ran although their step was already committed."""
    _add_verdict(counts, exp, verdict, "final")
    counts.committed += len(verdict.committed)
    missing = expected_steps - len(verdict.committed)
    if missing > 0:
        counts.lost += missing
        counts.problems.append(f"{exp.workdir.name}: {missing} step(s) not committed after the final run")
    for call in exp.calls_log():
        if call["event"] != "start":
            continue
        done_at = verdict.success_time.get(call["step"])
        if done_at is not None and call["time"] > done_at:
            counts.duplicates += 1
            counts.problems.append(f"{exp.workdir.name}: {call['step']} started again after its commit")


# -- the trials ---------------------------------------------------------------------------------


def kill_trial(
    workdir: Path, rng: random.Random, span: float, *, backend: str = "local", store: str | None = None
) -> Counts:
    """SIGKILL the executor `uniform(0, span)` seconds after it starts, check, rerun, check.

    `span` should be about the duration of an uninterrupted run (see `calibrate`), so kills
    land in planning, in steps, between steps and around commits alike.
    """
    exp = Experiment(workdir, backend=backend, store=store).write()
    counts = Counts(trials=1)
    proc = exp.start("killed")
    if backend == "ray":
        # Starting Ray takes most of a run: measure from the first step call instead.
        exp.wait_for_call("start", timeout=300)
    time.sleep(rng.uniform(0, span))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        counts.faults += 1
    proc.wait(60)
    if proc.returncode not in (0, -signal.SIGKILL):
        detail = exp.stderr("killed")
        counts.problems.append(f"{workdir.name}: killed runner exited {proc.returncode}: {detail}")
    after_kill = verify(exp)
    _add_verdict(counts, exp, after_kill, "after kill")
    exp.finish(exp.start("rerun"), "rerun", counts)
    final = verify(exp)
    for key, call in after_kill.committed.items():
        if final.committed.get(key) != call:
            counts.duplicates += 1
            counts.problems.append(f"{workdir.name}: committed {key} was replaced by the rerun")
    _final_checks(exp, counts, final, len(exp.shape))
    finished = [c for c in exp.calls_log() if c["event"] == "finish"]
    counts.redone += len(finished) - len({c["step"] for c in finished})
    return counts


def calibrate(workdir: Path, *, backend: str = "local", store: str | None = None) -> float:
    """Seconds of one uninterrupted run of the trial experiment (process start to exit)."""
    exp = Experiment(workdir, backend=backend, store=store).write()
    started = time.monotonic()
    counts = Counts()
    exp.finish(exp.start("calibrate"), "calibrate", counts)
    if counts.problems:
        raise RuntimeError("; ".join(counts.problems))
    return time.monotonic() - started


def race_trial(
    workdir: Path, runners: int = 4, *, backend: str = "local", store: str | None = None
) -> Counts:
    """`runners` executors start at once on one experiment and prefix: each step runs once."""
    exp = Experiment(workdir, backend=backend, store=store).write()
    counts = Counts(trials=1, faults=runners - 1)
    procs = [exp.start(f"racer{i}") for i in range(runners)]
    for i, proc in enumerate(procs):
        exp.finish(proc, f"racer{i}", counts)
    final = verify(exp)
    _final_checks(exp, counts, final, len(exp.shape))
    starts: dict[str, int] = {}
    for call in exp.calls_log():
        if call["event"] == "start":
            starts[call["step"]] = starts.get(call["step"], 0) + 1
    for step, n in sorted(starts.items()):
        if n > 1:
            counts.duplicates += n - 1
            counts.problems.append(f"{workdir.name}: {step} ran {n} times under {runners} racing runners")
    return counts


def pause_trial(workdir: Path, rng: random.Random) -> Counts:
    """Freeze runner A mid-step past its lease; B takes over and commits; A resumes.

    A must neither commit nor alter B's committed output, and both runners exit 0 (A counts
    the step as done by another runner).
    """
    exp = Experiment(workdir, shape={"slow/step": ()}, parts=12, pause=0.2).write()
    counts = Counts(trials=1)
    first = exp.start("paused")
    exp.wait_for_call("start")
    time.sleep(rng.uniform(0, 1.0))
    first.send_signal(signal.SIGSTOP)
    counts.faults += 1
    try:
        # B sees a live lease, waits until it expires (3 s), takes over, runs and commits.
        exp.finish(exp.start("taker"), "taker", counts)
    finally:
        first.send_signal(signal.SIGCONT)
    exp.finish(first, "paused", counts)
    final = verify(exp)
    _final_checks(exp, counts, final, 1)
    (status,) = exp.prefix.rglob(".status")
    events = StepStore(LocalStorage()).events(str(status.parent))
    successes = [e for e in events if e.event == Event.SUCCESS]
    if len(successes) != 1:
        counts.duplicates += max(0, len(successes) - 1)
        counts.problems.append(f"{workdir.name}: {len(successes)} SUCCESS events")
    starts = [c for c in exp.calls_log() if c["event"] == "start"]
    if successes and starts and successes[0].token == starts[0]["token"]:
        counts.problems.append(f"{workdir.name}: the paused runner's attempt was committed")
    return counts


KINDS = ("kill", "race", "pause", "flaky", "full")


def one_trial(
    kind: str,
    workdir: Path,
    seed: int,
    *,
    span: float = 1.5,
    backend: str = "local",
    store: str | None = None,
) -> Counts:
    """One trial of `kind` (see KINDS) in a fresh `workdir`, with its own random seed. `store`
    (kill and race trials): keep the prefix in that object store instead of on local disk."""
    rng = random.Random(seed)
    if kind == "kill":
        return kill_trial(workdir, rng, span, backend=backend, store=store)
    if kind == "race":
        return race_trial(workdir, backend=backend, store=store)
    if kind == "pause":
        return pause_trial(workdir, rng)
    # Imported here: storage_trials builds on this module.
    from tests.faults import storage_trials

    if kind == "flaky":
        return storage_trials.flaky_trial(workdir, seed)
    if kind == "full":
        return storage_trials.full_trial(workdir, budget=rng.randrange(20_000, 120_000))[0]
    raise ValueError(f"unknown trial kind {kind!r}; choose one of {', '.join(KINDS)}")


def run_trials(
    kind: str, n: int, root: Path, seed: int = 0, *, backend: str = "local", span: float | None = None
) -> Counts:
    """`n` trials of `kind` one after another in fresh directories under `root`, summed."""
    if kind == "kill" and span is None:
        span = calibrate(root / "calibrate", backend=backend)
    total = Counts()
    for i in range(n):
        total = total + one_trial(kind, root / f"{kind}-{i:04d}", seed + i, span=span or 0.0, backend=backend)
    return total


def summarize(rows: Sequence[tuple[str, Counts]]) -> str:
    """A plain-text table of counts by trial kind."""
    header = ["kind", "trials", "faults", "committed", "duplicates", "half_committed", "lost", "redone"]
    lines = [" ".join(f"{h:>14}" for h in header)]
    for kind, c in rows:
        values = [kind, *(str(v) for v in c.row().values())]
        lines.append(" ".join(f"{v:>14}" for v in values))
    return "\n".join(lines)
