"""Near-duplicate removal side by side: Drydock's dedupe step and datatrove's MinHash stages.

The corpus is `benchmarks/curation.py`'s (the demo corpus repeated `--repeat` times, each copy's
words shuffled so copies are not duplicates) plus one file of planted duplicates, written after
the corpus so that the originals are the ones kept: `--planted` documents copied exactly (upper
case) and as many near copies (one word appended: a Jaccard similarity of about 0.98).

Each contestant runs in a process of its own, one after the other, on one core:

  drydock <minhash>  steps.data.dedupe.dedupe as dedupe_step declares it (one_permutation
                     signatures, components) or as first written (datasketch, first match):
                     the signature pass alone, then the whole step
  datatrove          datatrove 0.10's MinhashDedupSignature, MinhashDedupBuckets,
                     MinhashDedupCluster and MinhashDedupFilter on a LocalPipelineExecutor
                     (one worker): 5-grams of whitespace-split words, 9 bands of 13 hashes (what
                     datasketch's LSH picks for 128 permutations and a threshold of 0.8), 32-bit
                     xxhash, lower case and whitespace normalized as Drydock does (its default
                     also strips punctuation and numbers; that would find other duplicates)

datatrove is not a dependency of the project: give a Python that has it.

    python3.11 -m venv /tmp/dt && /tmp/dt/bin/pip install "datatrove[processing]==0.10.1" orjson
    .venv/bin/python benchmarks/dedupe_datatrove.py --datatrove-python /tmp/dt/bin/python

Prints, per contestant, MB of text per second for the signature pass and for the whole job (each
after the process's start-up, printed apart: imports, and numba loading its compiled kernels), the
peak resident memory of its process, the documents removed, how many of the planted ones it
found, and how its removals overlap Drydock's one-permutation ones; then the load average.
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py, beside this file, shadows the standard library's `tokenize`.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import posixpath
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATATROVE = r"""
import json, sys, time
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature,
)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter
from datatrove.utils.hashing import HashConfig
from datatrove.utils.text import TextNormConfig
from datatrove.utils.word_tokenizers import WordTokenizer

class Words(WordTokenizer):
    def word_tokenize(self, text): return text.split()
    def sent_tokenize(self, text): return [text]
    def span_tokenize(self, text): raise NotImplementedError

data, work = sys.argv[1], sys.argv[2]
config = MinhashConfig(
    n_grams=5, num_buckets=9, hashes_per_bucket=13, hash_config=HashConfig(precision=32),
    norm_config=TextNormConfig(remove_punctuation=False, norm_unicode_diacritics=False, norm_numbers=False),
)
def run(pipeline, tasks=1):
    logs = f"{work}/logs/{time.time_ns()}"
    LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=1, logging_dir=logs).run()
started = time.perf_counter()
run([JsonlReader(data), MinhashDedupSignature(f"{work}/sigs", config=config, language=Words())])
signed = time.perf_counter()
run([MinhashDedupBuckets(f"{work}/sigs", f"{work}/buckets", config=config)], tasks=config.num_buckets)
run([MinhashDedupCluster(f"{work}/buckets", f"{work}/remove", config=config)])
run([JsonlReader(data), MinhashDedupFilter(f"{work}/remove", exclusion_writer=JsonlWriter(f"{work}/removed")),
     JsonlWriter(f"{work}/kept")])
done = time.perf_counter()
print(json.dumps({"signatures": signed - started, "total": done - started}))
"""


def plant(texts: list[str], workdir: Path, count: int) -> set[tuple[str, int]]:
    """Exact (upper-cased) and near (a word appended) copies of `count` documents each, in a
    file after the corpus's; returns their (file, index)."""
    rng = random.Random(0)
    rows = []
    for kind in ("exact", "near"):
        for text in rng.sample(texts, count):
            rows.append(text.upper() if kind == "exact" else f"{text} appended")
    path = workdir / "in" / "planted.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    return {("planted.jsonl", i) for i in range(len(rows))}


def removed_by_drydock(inputs: Path, output: Path) -> set[tuple[str, int]]:
    """(file, index) of every input record the step's evidence says it removed."""
    from steps.data.filtering import read_evidence

    return {(posixpath.basename(e["file"]), e["index"]) for e in read_evidence(str(output))}


def peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def drydock_child(minhash: str, inputs: Path, work: Path) -> None:
    from steps.data.dedupe import DedupeConfig, _shards, dedupe
    from steps.data.dedupe_passes import sign_shard, signer
    from steps.data.normalized import normalized_bytes

    signing = DedupeConfig(inputs=[str(inputs)], output=str(work / "signatures"), minhash=minhash)
    # What a process does once before its first document, timed apart (as datatrove's imports
    # are): importing the signer's library, and for one_permutation loading numba's compiled
    # kernels (compiling them on a machine's first run).
    warm = time.perf_counter()
    signer(signing)(*normalized_bytes(["one document to start with"]))
    started = time.perf_counter()
    for path, key, _source in _shards(signing):
        sign_shard(signing, path, key)
    signed = time.perf_counter()
    # The step as dedupe_step declares it (components), or as first written (first match).
    grouping = "components" if minhash == "one_permutation" else "first_match"
    dedupe(DedupeConfig(inputs=[str(inputs)], output=str(work / "out"), minhash=minhash, grouping=grouping))
    done = time.perf_counter()
    removed = sorted(removed_by_drydock(inputs, work / "out"))
    result = {"signatures": signed - started, "start_up": started - warm, "total": done - signed}
    result["removed"] = removed
    print(json.dumps({**result, "peak_mb": peak_rss_mb()}))


def datatrove_child(python: str, inputs: Path, work: Path) -> dict:
    script = work / "datatrove_job.py"
    script.write_text(DATATROVE)
    measure = (
        "import resource, runpy, sys; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__'); "
        "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    )
    result = subprocess.run(
        [python, "-c", measure, str(script), str(inputs), str(work)], capture_output=True, text=True
    )
    if result.returncode:
        raise SystemExit(f"datatrove failed:\n{result.stderr[-3000:]}")
    lines = result.stdout.strip().splitlines()
    figures = json.loads(lines[-2])
    figures["peak_mb"] = float(lines[-1].split()[1])
    removed = set()
    for path in (work / "removed").glob("*.jsonl*"):
        opener = __import__("gzip").open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            for line in f:
                name, index = json.loads(line)["id"].rsplit("/", 1)
                removed.add((Path(name).name, int(index)))
    figures["removed"] = sorted(removed)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--planted", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--datatrove-python", help="a Python with datatrove installed (else it is left out)")
    parser.add_argument("--child", nargs=3, metavar=("MINHASH", "INPUTS", "WORK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        drydock_child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return

    from benchmarks.curation import corpus

    workdir = Path(tempfile.mkdtemp(prefix="drydock-bench-dedupe-"))
    try:
        texts, size = corpus(args.repeat, workdir)
        planted = plant(texts, workdir, args.planted)
        lines = (workdir / "in" / "planted.jsonl").read_text().splitlines()
        size += sum(len(json.loads(line)["text"].encode()) for line in lines)
        mb = size / 1e6
        inputs = workdir / "in"
        print(f"corpus: {len(texts) + len(planted):,} documents ({len(planted):,} planted), {mb:.1f} MB")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        contestants = ["one_permutation", "datasketch"] + (["datatrove"] if args.datatrove_python else [])
        runs: dict[str, list[dict]] = {name: [] for name in contestants}
        for run in range(args.runs):  # interleaved, so drift in the machine's load hits all alike
            for name in contestants:
                work = workdir / f"{name}-{run}"
                work.mkdir()
                if name == "datatrove":
                    runs[name].append(datatrove_child(args.datatrove_python, inputs, work))
                    continue
                command = ["taskset", "-c", "0"] if shutil.which("taskset") else []
                command += [sys.executable, __file__, "--child", name, str(inputs), str(work)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        reference = {tuple(r) for r in runs["one_permutation"][0]["removed"]}
        header = ("", "signatures", "whole job", "peak RSS", "removed", "planted")
        print("{:16s} {:>12s} {:>12s} {:>9s} {:>8s} {:>9s}  vs one_permutation".format(*header))
        for name in contestants:
            sign = statistics.median(r["signatures"] for r in runs[name])
            total = statistics.median(r["total"] for r in runs[name])
            peak = statistics.median(r["peak_mb"] for r in runs[name])
            removed = {tuple(r) for r in runs[name][0]["removed"]}
            both = len(removed & reference)
            found = len(removed & planted)
            print(
                f"{name:16s} {mb / sign:7.2f} MB/s {mb / total:7.2f} MB/s {peak:6.0f} MB {len(removed):8,d} "
                f"{found:4,d}/{len(planted):,d}  both {both:,d}, only this {len(removed) - both:,d}, "
                f"only one_permutation {len(reference) - both:,d}"
            )
            signing = ", ".join(f"{r['signatures']:.2f}" for r in runs[name])
            whole = ", ".join(f"{r['total']:.2f}" for r in runs[name])
            start_up = ", ".join(f"{r['start_up']:.2f}" for r in runs[name] if "start_up" in r)
            start_up = f"; start-up (once per process, not in the rates) {start_up}" if start_up else ""
            print(f"{'':16s} seconds: signatures {signing}; whole {whole}{start_up}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
