"""The dedupe step's components pass (`steps.data.dedupe_bands`): buckets, verification, components,
parts, a killed pass resumed, and the pass sharded on a loopback Ray cluster."""

from __future__ import annotations

import json
import os
import posixpath
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from steps.data.dedupe import DedupeConfig, dedupe
from steps.data.dedupe_bands import EXACT, band_pairs, bucket_pairs, components, merge
from tests.steps.data.test_dedupe import near_copy, unique_docs, write_jsonl

ROOT = Path(__file__).resolve().parents[3]


def test_a_bucket_pairs_each_member_with_its_first_and_the_one_before():
    keys = np.array([7, 3, 7, 7, 3, 9], dtype=np.uint64)
    index = np.array([10, 11, 12, 13, 14, 15])
    assert bucket_pairs(keys, index).tolist() == [[10, 12], [10, 13], [11, 14], [12, 13]]
    assert bucket_pairs(keys[:1], index[:1]).shape == (0, 2)


def test_each_component_keeps_its_first_document():
    pairs = np.array([[4, 9], [9, 2], [5, 6], [6, 8]])
    nodes, survivors = components(pairs)
    assert dict(zip(nodes.tolist(), survivors.tolist(), strict=True)) == {2: 2, 4: 2, 9: 2, 5: 5, 6: 5, 8: 5}
    assert components(np.zeros((0, 2), dtype=np.int64))[0].shape == (0,)
    # Folded in one pair at a time, as the step's process does with each band part's pairs.
    none = np.zeros(0, dtype=np.int64)
    grouped = (none, none)
    for pair in pairs[::-1]:
        grouped = merge(grouped, pair)
    assert [g.tolist() for g in grouped] == [nodes.tolist(), survivors.tolist()]


def test_a_band_pairs_only_documents_similar_enough():
    """Three documents share band 0's values; only two agree elsewhere: the third is a false
    collision and is dropped by the verification. The exact band pairs equal text hashes."""
    rng = np.random.default_rng(0)
    minhash = rng.integers(0, 2**32, size=(3, 16), dtype=np.uint32)
    minhash[:, :4] = minhash[0, :4]  # band 0 (4 rows) alike
    minhash[2] = minhash[0]
    minhash[2, 15] += 1  # 15 of 16 values alike: 0.94
    shards = {"a": {"minhash": minhash[:2], "exact": np.array([5, 6], dtype=np.uint64)}}
    shards["b"] = {"minhash": minhash[2:], "exact": np.array([5], dtype=np.uint64)}

    def load(key: str, name: str) -> np.ndarray:
        return shards[key][name]

    common = {"rows": 4, "part": 0, "parts": 1, "threshold": 0.8}
    assert band_pairs(["a", "b"], [2, 1], load, band=0, **common).tolist() == [[0, 2]]
    assert band_pairs(["a", "b"], [2, 1], load, band=EXACT, **common).tolist() == [[0, 2]]
    # A band split into parts finds the same pairs, each in one part.
    parts = [
        band_pairs(["a", "b"], [2, 1], load, band=0, **{**common, "part": p, "parts": 3}) for p in range(3)
    ]
    assert np.concatenate(parts).tolist() == [[0, 2]]


def spread_corpus(root: Path, shards: int = 6, per_shard: int = 60) -> set[tuple[str, int]]:
    """Shards of unique documents, each after the first holding exact and near copies of
    documents of earlier shards; returns the copies' (file, index)."""
    rng = random.Random(11)
    docs = unique_docs(shards * per_shard, seed=5)
    planted = set()
    for s in range(shards):
        texts = docs[s * per_shard : (s + 1) * per_shard]
        for k in range(4 if s else 0):
            original = docs[rng.randrange(s * per_shard)]  # from any earlier shard
            texts.append(original.upper() if k % 2 else near_copy(original, rng))
            planted.add((f"s{s}.jsonl", len(texts) - 1))
        write_jsonl(root / f"s{s}.jsonl", texts)
    return planted


def removed_by(out: Path, inputs: Path) -> set[tuple[str, int]]:
    """(file name, index) of every document the step's evidence says it removed."""
    from steps.data.filtering import read_evidence

    return {(posixpath.basename(e["file"]), e["index"]) for e in read_evidence(str(out))}


def test_parts_and_passes_remove_the_same_documents(tmp_path, monkeypatch):
    import steps.data.dedupe_passes

    planted = spread_corpus(tmp_path / "in")
    results = {}
    for name, extra in {
        "one part": {"minhash": "one_permutation", "grouping": "components"},
        "five parts": {"minhash": "one_permutation", "grouping": "components", "band_parts": 5},
        "first match": {"minhash": "one_permutation", "grouping": "first_match"},
        "folded part by part": {"minhash": "one_permutation", "grouping": "components", "band_parts": 5},
    }.items():
        if name == "folded part by part":  # the step's process folds each part in as it comes
            monkeypatch.setattr(steps.data.dedupe_passes, "_FOLD_AT", 1)
        dedupe(DedupeConfig(inputs=[str(tmp_path / "in")], output=str(tmp_path / name), **extra))
        results[name] = removed_by(tmp_path / name, tmp_path / "in")
    assert results["one part"] == results["five parts"] == results["first match"] == planted
    assert results["folded part by part"] == planted
    stats = [
        json.loads((tmp_path / n / "stats.json").read_text())["total"]
        for n in ("five parts", "folded part by part")
    ]
    assert stats[0] == stats[1]
    assert len(list((tmp_path / "five parts" / ".work" / "bands").glob("*.npy"))) == 5 * 10  # exact + 9 bands


SCRIPT = """
import sys
from pipeline import Resources, executor_main
from steps.data.dedupe import dedupe_step

if __name__ == "__main__":
    inputs, workers, parts = sys.argv.pop(1), int(sys.argv.pop(1)), int(sys.argv.pop(1))
    # One CPU for the step's own process: on Ray its shards and band parts are tasks of their own.
    step = dedupe_step(
        "dedupe/spread", inputs=[inputs], num_workers=workers, band_parts=parts, resources=Resources(cpus=1)
    )
    executor_main([step])
"""


def run_dedupe(
    tmp_path: Path, inputs: Path, prefix: Path, *extra: str, workers: int = 1, parts: int = 1, **popen
):
    script = tmp_path / "spread.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", **popen.pop("env", {})}
    command = [
        sys.executable,
        str(script),
        str(inputs),
        str(workers),
        str(parts),
        "--prefix",
        str(prefix),
        *extra,
    ]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    )


def test_a_pass_killed_midway_resumes_from_the_band_parts_it_finished(tmp_path):
    """The run is killed (SIGKILL, its whole process group) once some band parts are written and
    others are not; the rerun takes the step back, keeps the finished parts (not rewritten) and
    removes what an uninterrupted run removes."""
    planted = spread_corpus(tmp_path / "in", shards=8, per_shard=400)
    prefix = tmp_path / "prefix"
    run = run_dedupe(tmp_path, tmp_path / "in", prefix, "--backend", "local", parts=8, start_new_session=True)
    total = 10 * 8
    finished: list[Path] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and run.poll() is None:
        finished = sorted(prefix.glob("dedupe/spread-*/.work/bands/*.npy"))
        if finished:
            break
        time.sleep(0.002)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    finished = sorted(prefix.glob("dedupe/spread-*/.work/bands/*.npy"))
    assert 0 < len(finished) < total, f"the kill came at {len(finished)} of {total} band parts"
    before = {p: p.stat().st_mtime_ns for p in finished}
    # The killed run's lease must lapse before another run may take the step.
    rerun = run_dedupe(tmp_path, tmp_path / "in", prefix, "--backend", "local", parts=8)
    _out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert {p: p.stat().st_mtime_ns for p in finished} == before
    (step_dir,) = prefix.glob("dedupe/spread-*")
    assert len(list(step_dir.glob(".work/bands/*.npy"))) == total
    assert removed_by(step_dir, tmp_path / "in") == planted


@pytest.mark.slow
def test_the_pass_sharded_across_a_cluster_removes_what_one_process_removes(tmp_path):
    """On a loopback Ray cluster of a head and two worker nodes, with band parts fanned out as
    Ray tasks, the step removes exactly what it removes in one process with one part."""
    from tests.raycluster import ray_cluster, ray_env

    planted = spread_corpus(tmp_path / "in", shards=6, per_shard=100)
    alone = run_dedupe(tmp_path, tmp_path / "in", tmp_path / "alone", "--backend", "local")
    _out, err = alone.communicate(timeout=300)
    assert alone.returncode == 0, err[-3000:]
    (alone_dir,) = (tmp_path / "alone").glob("dedupe/spread-*")
    with ray_cluster([({}, None), ({}, None)], head_cpus=1, worker_cpus=1) as address:
        sharded = run_dedupe(
            tmp_path,
            tmp_path / "in",
            tmp_path / "sharded",
            "--backend",
            "ray",
            "--ray.address",
            address,
            workers=3,
            parts=3,
            env={k: v for k, v in ray_env().items() if k == "PYTHONPATH"},
        )
        _out, err = sharded.communicate(timeout=400)
    assert sharded.returncode == 0, err[-3000:]
    (sharded_dir,) = (tmp_path / "sharded").glob("dedupe/spread-*")
    assert len(list(sharded_dir.glob(".work/bands/*.npy"))) == 10 * 3
    assert removed_by(sharded_dir, tmp_path / "in") == removed_by(alone_dir, tmp_path / "in") == planted
    stats = [json.loads((d / "stats.json").read_text())["total"] for d in (alone_dir, sharded_dir)]
    assert stats[0] == stats[1]


@pytest.mark.parametrize("num_perm", [16, 128, 256])
@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
def test_the_bands_are_datasketchs(threshold, num_perm):
    """The (bands, rows) datasketch's MinHashLSH would use (its own search, with scipy's quad)."""
    from datasketch.lsh import _optimal_param

    from steps.data.dedupe_bands import lsh_bands

    assert lsh_bands(threshold, num_perm) == _optimal_param(threshold, num_perm, 0.5, 0.5)
