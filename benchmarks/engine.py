"""Engine benchmark: build, identity, planning and execution cost of synthetic layered DAGs.

    .venv/bin/python benchmarks/engine.py [--sizes 1000 10000 100000] [--out PATH]

Each size runs in a fresh subprocess (so peak RSS is per size) and measures:

  build      `build_dag`: discovery, validation, cycle check, one identity per step
  plan/empty `prepare()` against an empty local prefix (build + storage snapshot + make_plan)
  plan/cached `prepare()` against a prefix where every step is done
  rerun      `run_experiment` on that prefix: plan, nothing to execute, the manifest written once;
             the first rerun after a run encodes every step's recipe, the next ones copy them
             from the manifest the previous rerun wrote (`pipeline.run.records.manifest_builder`): both shown
  first run  `run_experiment` on an empty prefix with the local backend (when the prefix is
             populated by the real executor)
  fresh pair what a user meets after adding a step: in a new interpreter, a first run on an empty
             prefix, then one cached rerun (the first after a run); `--repeat` interpreters per
             size (sizes the executor populates), the median of each shown

The DAG has `--layers` layers of equal width; a step in layer L > 0 reads one or two outputs of
layer L-1. Its config is a frozen dataclass with a versioned value, `output_of` inputs and
`this_output`; its function writes one small file. The cached prefix is populated by the real
executor when that is expected to take under `--max-populate-s` seconds, otherwise by writing
`.step.json` and a SUCCESS commit through `StepStore` (acquire + commit), which leaves the same
files the executor would. The output says which.

Figures only: nothing here asserts on time. Targets are printed beside the figures.
"""

from __future__ import annotations

import os
import sys

# Running `python benchmarks/engine.py` puts benchmarks/ on sys.path, not the repository root.
# benchmarks/ must leave it before anything else is imported: its tokenize.py would shadow the
# standard library's, which `dataclasses` -> `inspect` -> `linecache` import (a step function's
# code fingerprint then fails, and so does formatting the traceback of that failure).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse
import gc
import json
import platform
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline import ExecutorMainConfig, Step, output_of, run_experiment, this_output, versioned
from pipeline.core.dag import build_dag
from pipeline.core.plan import State, make_plan
from pipeline.processes import current_owner
from pipeline.run.experiment import prepare, unchanged_steps
from pipeline.run.records.provenance import drift_digest_of, environment_info, step_info
from pipeline.run.scheduler.executor import RunReport
from pipeline.storage.opening import open_storage
from pipeline.storage.step_store import Acquired, StepStore

DEFAULT_SIZES = (1_000, 10_000, 100_000)
DEFAULT_LAYERS = 32

TARGETS = {
    "first_rerun_1k_s": 0.06,
    "first_rerun_10k_s": 0.5,
    "rerun_cached_1k_s": 0.06,
    "rerun_cached_10k_s": 0.5,
    "rerun_cached_100k_s": 12.0,
    "peak_rss_10k_mib": 130.0,
    "peak_rss_100k_mib": 1300.0,
    "first_run_1k_s": 2.0,
    "linear": 1.5,
}
TARGET_TEXT = {
    "first_rerun_1k_s": "first cached rerun after a run, fresh process, 1,000 steps <= 0.06 s",
    "first_rerun_10k_s": "first cached rerun after a run, fresh process, 10,000 steps <= 0.5 s",
    "rerun_cached_1k_s": "cached rerun of 1,000 steps <= 0.06 s",
    "rerun_cached_10k_s": "cached rerun of 10,000 steps <= 0.5 s",
    "rerun_cached_100k_s": "cached rerun of 100,000 steps <= 12 s",
    "peak_rss_10k_mib": "peak RSS of a 10,000-step cached rerun (fresh process) <= 130 MB",
    "peak_rss_100k_mib": "peak RSS of a 100,000-step cached rerun (fresh process) <= 1.3 GB",
    "first_run_1k_s": "first run of 1,000 trivial steps on `local`, fresh process <= 2.0 s",
    "linear": "per-step cost flat from the smallest to the largest size (within 1.5x)",
}


# -- the synthetic experiment --------------------------------------------------------------------


@dataclass(frozen=True)
class LayerConfig:
    seed: int
    """Versioned: part of the identity."""
    inputs: list[str] = field(default_factory=list)
    """`output_of` placeholders of one or two steps of the previous layer."""
    output: str = ""
    """`this_output()`."""
    note: str = "benchmark"
    """Unversioned: recorded in `.step.json`, compared for drift notes."""


def touch(config: LayerConfig) -> None:
    """A trivial step: write one small file into the output directory."""
    os.makedirs(config.output, exist_ok=True)
    with open(os.path.join(config.output, "out.txt"), "w") as f:
        f.write(f"{config.seed} {len(config.inputs)}\n")


def layered_steps(size: int, layers: int) -> list[Step]:
    """`size` steps in `layers` layers; each step of layer L > 0 reads 1-2 steps of layer L-1."""
    width, extra = divmod(size, layers)
    steps: list[Step] = []
    previous: list[Step] = []
    for layer in range(layers):
        current = []
        for j in range(width + (1 if layer < extra else 0)):
            inputs = []
            if previous:
                inputs.append(output_of(previous[j % len(previous)], "out.txt"))
                if j % 2 == 0 and len(previous) > 1:
                    inputs.append(output_of(previous[(j + 1) % len(previous)], "out.txt"))
            config = LayerConfig(seed=versioned(layer * 1_000_003 + j), inputs=inputs, output=this_output())
            current.append(Step(name=f"bench/l{layer:02d}/s{j:06d}", fn=touch, config=config))
        steps.extend(current)
        previous = current
    return steps


# -- measuring -------------------------------------------------------------------------------------


def maxrss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class GcClock:
    """Seconds spent in the cyclic garbage collector, measured with `gc.callbacks`."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._started


GC = GcClock()


def check(ok: bool, what: str) -> None:
    if not ok:
        raise RuntimeError(f"benchmark sanity check failed: {what}")


def measure(fn: Callable[[], None], size: int, repeat: int, budget_s: float) -> dict[str, Any]:
    """Wall time of up to `repeat` calls of `fn` (fewer once `budget_s` is spent).

    `fn` checks its own result and keeps nothing, so one call's garbage never weighs on the
    next; a full collection before each call starts every repeat from the same heap.
    """
    times: list[float] = []
    gc_times: list[float] = []
    for _ in range(repeat):
        gc.collect()
        gc_before = GC.total
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        gc_times.append(GC.total - gc_before)
        if sum(times) >= budget_s:
            break
    median = statistics.median(times)
    return {
        "best_s": min(times),
        "median_s": median,
        "runs": len(times),
        "us_per_step": median / size * 1e6,
        "gc_s": statistics.median(gc_times),
    }


def plan_phases(steps: list[Step], prefix: str) -> dict[str, float]:
    """The phases of `pipeline.run.experiment.prepare`, timed one by one (mirrors its body):
    build, the snapshot of `.status` (and `.lease`) files, the digest check that decides which
    finished steps need their `.step.json` for drift notes, and `make_plan`."""
    gc.collect()
    t0 = time.perf_counter()
    dag = build_dag(steps, prefix)
    t1 = time.perf_counter()
    store = StepStore(open_storage(prefix))
    snapshot = store.records((node.output_path for node in dag.nodes.values()), with_metadata=False)
    t2 = time.perf_counter()
    unchanged = unchanged_steps(dag, store, snapshot)
    t3 = time.perf_counter()
    host = current_owner().host
    info = lambda lb: step_info(dag, lb)  # noqa: E731
    make_plan(dag, snapshot, now=time.time(), local_host=host, current_info=info, unchanged=unchanged)
    t4 = time.perf_counter()
    make_plan(dag, snapshot, now=time.time(), local_host=host)
    t5 = time.perf_counter()
    return {
        "build_s": t1 - t0,
        "snapshot_s": t2 - t1,
        "digests_s": t3 - t2,
        "make_plan_s": t4 - t3,
        "make_plan_no_drift_s": t5 - t4,
    }


def populate_with_store(steps: list[Step], prefix: str) -> None:
    """Leave every step done, as the executor would, without running the executor loop."""
    dag = build_dag(steps, prefix)
    store = StepStore(open_storage(prefix))
    owner = current_owner()
    run_info = environment_info(None)
    for label, node in dag.nodes.items():
        taken = store.acquire(node.output_path, owner, 90.0)
        check(isinstance(taken, Acquired), f"acquire {label}: {taken}")
        assert isinstance(taken, Acquired)
        info = step_info(dag, label)
        info.update(run_info, run_id=owner.run_id, attempt=1, token=taken.token, started=time.time())
        step_json = store.write_step_json(node.output_path, info)
        store.storage.write(f"{node.output_path}/out.txt", b"0\n")
        # The digests the executor records with SUCCESS (pipeline/run/scheduler/executor.py).
        data = {"duration": 0.0, "drift": drift_digest_of(dag, label), "step_json": step_json}
        check(store.commit(node.output_path, owner, taken.token, data=data), f"commit {label}")


def rerun_in_fresh_process(size: int, layers: int, prefix: str) -> dict[str, float]:
    """Wall time and peak RSS of one cached rerun of the experiment in a new interpreter, as
    `drydock run` would do it (the time includes neither the interpreter's start nor imports)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--rerun-only", str(size), "--layers", str(layers)]
    proc = subprocess.run([*cmd, "--prefix", prefix], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"fresh rerun failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rerun_only(size: int, layers: int, prefix: str) -> dict[str, float]:
    """The body of `rerun_in_fresh_process`."""
    steps = layered_steps(size, layers)
    rss_before = peak_rss_of_this_image_mib()
    start = time.perf_counter()
    report = run_experiment(steps, ExecutorMainConfig(prefix=prefix, backend="local", log_level="WARNING"))
    wall = time.perf_counter() - start
    check(isinstance(report, RunReport) and report.ok, "fresh cached rerun failed")
    return {"wall_s": wall, "peak_rss_mib": peak_rss_of_this_image_mib(), "rss_before_mib": rss_before}


def fresh_pair(size: int, layers: int) -> dict[str, float]:
    """In this new interpreter: a first run of the experiment on an empty prefix, then one cached
    rerun (which finds only the run's manifest to reuse). Times exclude the interpreter's start and
    imports, as `rerun_only`'s do."""
    root = tempfile.mkdtemp(prefix=f"drydock-bench-pair-{size}-", dir="/tmp")
    try:
        config = ExecutorMainConfig(prefix=os.path.join(root, "p"), backend="local", log_level="WARNING")
        steps = layered_steps(size, layers)
        start = time.perf_counter()
        report = run_experiment(steps, config, description="engine benchmark")
        first_run = time.perf_counter() - start
        check(isinstance(report, RunReport) and report.ok, "fresh first run failed")
        steps = layered_steps(size, layers)  # declared again, as a user's second `drydock run` does
        start = time.perf_counter()
        report = run_experiment(steps, config, description="engine benchmark")
        rerun = time.perf_counter() - start
        check(isinstance(report, RunReport) and report.ok, "fresh first rerun failed")
        assert isinstance(report, RunReport)
        check(all(o.state == State.CACHED for o in report.outcomes.values()), "the rerun ran steps")
        return {"first_run_s": first_run, "first_rerun_s": rerun}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fresh_pairs(size: int, layers: int, repeat: int) -> dict[str, Any]:
    """`fresh_pair` in `repeat` new interpreters, one after another; the medians and each run."""
    runs = []
    for _ in range(repeat):
        cmd = [sys.executable, os.path.abspath(__file__), "--pair-only", str(size), "--layers", str(layers)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"fresh pair failed: {proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {
        "runs": runs,
        "first_run_median_s": statistics.median(r["first_run_s"] for r in runs),
        "first_rerun_median_s": statistics.median(r["first_rerun_s"] for r in runs),
    }


def peak_rss_of_this_image_mib() -> float:
    """Peak RSS since this program was exec'd: `VmHWM`. (`ru_maxrss` survives `execve`, so a
    process started from a big one reports its parent's size.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return maxrss_mib()


def worker(size: int, layers: int, populate: str, repeat: int, budget_s: float) -> dict[str, Any]:
    """Every measurement for one size, in this (fresh) process."""
    out: dict[str, Any] = {"size": size, "layers": layers, "populate": populate}
    root = tempfile.mkdtemp(prefix=f"drydock-bench-{size}-", dir="/tmp")
    try:
        start = time.perf_counter()
        steps = layered_steps(size, layers)
        out["declare_s"] = time.perf_counter() - start
        out["edges"] = sum(len(s.config.inputs) for s in steps)

        def build() -> None:
            check(len(build_dag(steps, root).nodes) == size, "build_dag lost steps")

        out["build"] = measure(build, size, repeat, budget_s)
        out["rss_after_build_mib"] = maxrss_mib()

        empty = ExecutorMainConfig(prefix=os.path.join(root, "empty"), backend="local")

        def plan_empty() -> None:
            counts = prepare(steps, empty)[2].counts()
            check(counts == {"RUN": size}, f"empty prefix planned as {counts}")

        out["plan_empty"] = measure(plan_empty, size, repeat, budget_s)
        out["plan_empty_phases"] = plan_phases(steps, empty.prefix or "")
        out["rss_after_plan_empty_mib"] = maxrss_mib()

        # First runs, each on a fresh prefix; the last one stays as the cached prefix.
        runs = iter(range(repeat))
        cached = ExecutorMainConfig(prefix=os.path.join(root, "run-0"), backend="local")

        def first_run() -> None:
            # Each on a prefix of its own, all deleted at the end: on ext4 without a journal (this
            # machine), inodes freed in the last minutes are skipped when new files are made, so
            # deleting the previous run's 6,000 files would slow the next run's file creation.
            nonlocal cached
            n = next(runs)
            cached = ExecutorMainConfig(prefix=os.path.join(root, f"run-{n}"), backend="local")
            report = run_experiment(steps, cached, description="engine benchmark")
            check(isinstance(report, RunReport) and report.ok, "first run failed")

        if populate == "executor":
            first = measure(first_run, size, repeat, budget_s)
            first["steps_per_s"] = size / first["median_s"]
            out["first_run"] = first
        else:
            start = time.perf_counter()
            populate_with_store(steps, cached.prefix or "")
            out["populate_store_s"] = time.perf_counter() - start
        out["rss_after_populate_mib"] = maxrss_mib()

        def plan_cached() -> None:
            plan = prepare(steps, cached)[2]
            check(plan.counts() == {"CACHED": size}, f"cached prefix planned as {plan.counts()}")
            check(not any(sp.notes for sp in plan.steps.values()), "unexpected drift notes")

        out["plan_cached"] = measure(plan_cached, size, repeat, budget_s)
        out["plan_cached_phases"] = plan_phases(steps, cached.prefix or "")
        out["rss_after_plan_cached_mib"] = maxrss_mib()

        def rerun() -> None:
            report = run_experiment(steps, cached, description="engine benchmark")
            check(isinstance(report, RunReport) and report.ok, "cached rerun failed")
            assert isinstance(report, RunReport)
            check(all(o.state == State.CACHED for o in report.outcomes.values()), "rerun ran steps")

        # The first cached rerun after a run encodes every recipe; the next ones copy the steps
        # of the manifest it wrote.
        gc.collect()
        start = time.perf_counter()
        rerun()
        out["rerun_first"] = {"wall_s": time.perf_counter() - start}
        out["rerun_cached"] = measure(rerun, size, repeat, budget_s)
        out["peak_rss_mib"] = maxrss_mib()
        # This process's peak includes the first runs; a rerun's own peak needs a fresh process.
        out["rerun_fresh"] = rerun_in_fresh_process(size, layers, cached.prefix or "")
        if populate == "executor":
            out["fresh_pair"] = fresh_pairs(size, layers, repeat)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    # The driver deletes it after the last size, for the same reason as in `first_run`.
    out["root"] = root
    return out


# -- the driver ------------------------------------------------------------------------------------


def run_size(
    size: int, layers: int, populate: str, repeat: int, budget_s: float, timeout_s: float
) -> dict[str, Any]:
    """Run `worker` for one size in a fresh interpreter and return its figures."""
    with tempfile.TemporaryDirectory(prefix="drydock-bench-out-", dir="/tmp") as tmp:
        result_path = os.path.join(tmp, "result.json")
        log_path = os.path.join(tmp, "stderr.log")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            str(size),
            "--layers",
            str(layers),
            "--populate",
            populate,
            "--repeat",
            str(repeat),
            "--budget-s",
            str(budget_s),
            "--result",
            result_path,
        ]
        # The executor prints two lines per step to stderr; keep them out of the figures' way.
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(cmd, stdout=log, stderr=log, timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise SystemExit(
                    f"size {size}: no result after {timeout_s:.0f} s (--timeout-s); its temporary "
                    "prefix is left under /tmp/drydock-bench-*"
                ) from None
        if proc.returncode != 0:
            with open(log_path, "rb") as f:
                tail = f.read()[-4000:].decode(errors="replace")
            raise SystemExit(f"size {size}: worker exited {proc.returncode}\n{tail}")
        with open(result_path) as f:
            return json.load(f)


def machine() -> dict[str, Any]:
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib: float | None = round(pages / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    return {
        "cpus": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m": os.getloadavg()[0],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _per_step(m: dict[str, Any]) -> str:
    share = m["gc_s"] / m["median_s"] * 100 if m["median_s"] else 0.0
    return f"{m['us_per_step']:.1f} us, GC {share:.0f}%"


def render(results: list[dict[str, Any]], info: dict[str, Any]) -> str:
    """The human-readable tables."""
    lines = [
        f"Drydock engine benchmark  ({info['cpus']} cores, {info['memory_gib']} GiB, "
        f"Python {info['python']}; {results[0]['layers'] if results else '?'} layers; "
        "median of up to --repeat runs; GC = share of them spent in the cyclic garbage collector)",
        f"Load average (1 min) before / after: {info['load_average_1m']:.2f} / "
        f"{info.get('load_average_1m_end', float('nan')):.2f}: other processes share these cores.",
        "",
    ]
    header = ["", *(f"{r['size']:,} steps" for r in results), "target"]
    rows: list[list[str]] = []

    def row(title: str, cell: Callable[[dict[str, Any]], str], target: str = "") -> None:
        cells = []
        for r in results:
            try:
                cells.append(cell(r))
            except KeyError:
                cells.append("-")
        rows.append([title, *cells, target])

    linear = "~constant"
    row("build_dag (identity)", lambda r: _ms(r["build"]["median_s"]))
    row("  per step", lambda r: _per_step(r["build"]), linear)
    row("plan, empty prefix", lambda r: _ms(r["plan_empty"]["median_s"]))
    row("  per step", lambda r: _per_step(r["plan_empty"]), linear)
    row("plan, cached prefix", lambda r: _ms(r["plan_cached"]["median_s"]))
    row("  per step", lambda r: _per_step(r["plan_cached"]), linear)
    row(
        "first cached rerun after a run, fresh process",
        lambda r: _ms(r["fresh_pair"]["first_rerun_median_s"]),
        "0.06 / 0.5 s",
    )
    row("  its first run (same process)", lambda r: _ms(r["fresh_pair"]["first_run_median_s"]), "1k: <= 2 s")
    row("first cached rerun after a run, warm", lambda r: _ms(r["rerun_first"]["wall_s"]))
    row("cached rerun (run_experiment)", lambda r: _ms(r["rerun_cached"]["median_s"]), "0.06 / 0.5 / 12 s")
    row("  per step", lambda r: _per_step(r["rerun_cached"]), linear)
    row("first run (local backend)", lambda r: _ms(r["first_run"]["median_s"]), "1k: <= 2 s")
    row("  steps/s", lambda r: f"{r['first_run']['steps_per_s']:,.0f}")
    row("cached rerun, fresh process", lambda r: _ms(r["rerun_fresh"]["wall_s"]))
    row("  its peak RSS", lambda r: f"{r['rerun_fresh']['peak_rss_mib']:,.0f} MiB", "130 MB / 1.3 GB")
    row("peak RSS of this process", lambda r: f"{r['peak_rss_mib']:,.0f} MiB")
    row(
        "  after build / plan (cached)",
        lambda r: f"{r['rss_after_build_mib']:,.0f} / {r['rss_after_plan_cached_mib']:,.0f} MiB",
    )
    row("cached prefix written by", lambda r: r["populate"])
    row("  StepStore writes took", lambda r: _ms(r["populate_store_s"]))
    lines += _table(header, rows)

    lines += ["", "Where planning time goes (one run each; prepare() = build + snapshot + make_plan):"]
    header = header[:-1]
    rows = []
    for key, title in (("plan_empty_phases", "empty"), ("plan_cached_phases", "cached")):
        for phase, name in (
            ("build_s", "build_dag"),
            ("snapshot_s", "storage snapshot"),
            ("digests_s", "drift digests (+ .step.json read where they differ)"),
            ("make_plan_s", "make_plan"),
            ("make_plan_no_drift_s", "make_plan without drift notes"),
        ):
            row(f"{title}: {name}", lambda r, k=key, p=phase: _ms(r[k][p]))
    lines += _table(header, [r[:-1] for r in rows])

    lines += ["", "Targets:"]
    lines += [f"  [{mark}] {text}" for mark, text in verdicts(results)]
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = [f"{{:<{widths[0]}}}", *(f"{{:>{w}}}" for w in widths[1:])]

    def line(cells: list[str]) -> str:
        return "  ".join(f.format(c) for f, c in zip(fmt, cells, strict=True))

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def verdicts(results: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(PASS/MISS/n/a, text with the figure) for each target (issue 17's, on this machine)."""
    by_size = {r["size"]: r for r in results}
    checks: list[tuple[str, int, Callable[[dict[str, Any]], float], str]] = [
        ("first_rerun_1k_s", 1_000, lambda r: r["fresh_pair"]["first_rerun_median_s"], "s"),
        ("first_rerun_10k_s", 10_000, lambda r: r["fresh_pair"]["first_rerun_median_s"], "s"),
        ("rerun_cached_1k_s", 1_000, lambda r: r["rerun_cached"]["median_s"], "s"),
        ("rerun_cached_10k_s", 10_000, lambda r: r["rerun_cached"]["median_s"], "s"),
        ("rerun_cached_100k_s", 100_000, lambda r: r["rerun_cached"]["median_s"], "s"),
        # A cached rerun's own peak, in a fresh process, in MB of 10^6 bytes (ru_maxrss is KiB).
        ("peak_rss_10k_mib", 10_000, lambda r: r["rerun_fresh"]["peak_rss_mib"] * 1.048576, "MB"),
        ("peak_rss_100k_mib", 100_000, lambda r: r["rerun_fresh"]["peak_rss_mib"] * 1.048576, "MB"),
        ("first_run_1k_s", 1_000, lambda r: r["fresh_pair"]["first_run_median_s"], "s"),
    ]
    out = []
    for key, size, figure, unit in checks:
        try:
            value = figure(by_size[size])
        except KeyError:
            out.append(("n/a", f"{TARGET_TEXT[key]} ({size:,} not measured)"))
            continue
        shown = f"{value:.3f} s" if unit == "s" else f"{value:,.0f} MB"
        out.append(("PASS" if value <= TARGETS[key] else "MISS", f"{TARGET_TEXT[key]}: {shown}"))
    if len(results) >= 2:
        worst = []
        for key in ("build", "plan_empty", "plan_cached", "rerun_cached"):
            per_step = [r[key]["us_per_step"] for r in results]
            worst.append((max(per_step) / min(per_step), key))
        ratio, key = max(worst)
        mark = "PASS" if ratio <= TARGETS["linear"] else "MISS"
        out.append((mark, f"{TARGET_TEXT['linear']}: worst spread {ratio:.2f}x ({key})"))
    return out


def measure_sizes(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """Measure each size in a fresh process, smallest first, appending to `results`."""
    rate: float | None = None  # steps/s of the last real first run
    for size in sorted(args.sizes):
        populate = args.populate
        if populate == "auto":
            # Without a measured rate, run the executor only on sizes that are small anyway.
            predicted = size / rate if rate else (0.0 if size <= 10_000 else float("inf"))
            populate = "executor" if predicted < args.max_populate_s else "store"
        print(f"... {size:,} steps (cached prefix via {populate})", file=sys.stderr, flush=True)
        result = run_size(size, args.layers, populate, args.repeat, args.budget_s, args.timeout_s)
        if "first_run" in result:
            rate = result["first_run"]["steps_per_s"]
        results.append(result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--out", help="write the figures as JSON to this path")
    parser.add_argument(
        "--repeat", type=int, default=3, help="repeats of each timed phase (the median is shown)"
    )
    parser.add_argument(
        "--budget-s", type=float, default=20.0, help="stop repeating a phase once it has taken this long"
    )
    parser.add_argument(
        "--populate",
        choices=("auto", "executor", "store"),
        default="auto",
        help="how the cached prefix is filled: the real executor, StepStore writes, or auto "
        "(the executor when the measured rate of a smaller size predicts under --max-populate-s)",
    )
    parser.add_argument("--max-populate-s", type=float, default=180.0)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per size")
    parser.add_argument(
        "--render", metavar="JSON", help="print the tables of an earlier --out file; measure nothing"
    )
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--rerun-only", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pair-only", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.rerun_only is not None:
        print(json.dumps(rerun_only(args.rerun_only, args.layers, args.prefix)))
        return 0
    if args.pair_only is not None:
        print(json.dumps(fresh_pair(args.pair_only, args.layers)))
        return 0
    if args.worker is not None:
        figures = worker(args.worker, args.layers, args.populate, args.repeat, args.budget_s)
        with open(args.result, "w") as f:
            json.dump(figures, f)
        return 0

    if args.render:
        with open(args.render) as f:
            document = json.load(f)
        print(render(document["results"], document["machine"]))
        return 0

    info = machine()
    results: list[dict[str, Any]] = []
    try:
        measure_sizes(args, results)
    finally:
        for result in results:
            shutil.rmtree(result.pop("root", ""), ignore_errors=True)
    info["load_average_1m_end"] = os.getloadavg()[0]
    print(render(results, info))
    if any(r["populate"] == "store" for r in results):
        print(
            "\nNote: for sizes marked 'store', the cached prefix was written through StepStore "
            "(acquire + .step.json + commit per step), not by running the executor, because the "
            f"first run was predicted to take over {args.max_populate_s:.0f} s."
        )
    document = {
        "benchmark": "engine",
        "date": time.strftime("%Y-%m-%d"),
        "machine": info,
        "command": " ".join([".venv/bin/python", "benchmarks/engine.py", *sys.argv[1:]]),
        "targets": {**TARGETS, "text": TARGET_TEXT},
        "verdicts": [{"result": mark, "target": text} for mark, text in verdicts(results)],
        "results": results,
    }
    text = json.dumps(document, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        print(f"\nJSON written to {args.out}")
    else:
        print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
