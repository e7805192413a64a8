"""Throughput of the data-curation steps on one core: dedupe and decontaminate beside tokenizing.

The corpus is the committed demo corpus (data/corpus, both domains, train split) repeated
`--repeat` times into jsonl files. Each repetition shuffles the words of every document with a
seed of its own, so that the copies are not duplicates of each other (a corpus of copies would
measure the exact-duplicate shortcut, not the MinHash work); sizes and word counts are the
demo's. Everything runs in this process on one core:

  dedupe         steps.data.dedupe.dedupe as dedupe_step declares it: read, normalize, hash,
                 one-permutation MinHash (128 values, 5-grams), the components pass over the LSH
                 bands, write the kept shards and stats
  dedupe (first) the same with the passes as first written (minhash="datasketch",
                 grouping="first_match"): datasketch per document, the LSH pass in one process
  decontaminate  steps.data.decontaminate.decontaminate against the demo's validation files and task
                 rows (13-grams): index the evaluation data, scan, write the kept shards
  tokenize raw   Tokenizer.encode_batch on one thread over the documents in memory (the ceiling
                 of the tokenize step; RAYON_RS_NUM_CPUS=1)

    .venv/bin/python benchmarks/curation.py [--repeat 8] [--runs 3]

Prints megabytes of text per second per core for each (the median of `--runs`), and the load
average before and after.
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py, beside this file, shadows the standard library's `tokenize` (used by
# `inspect`): take this directory off the import path before anything imports it.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ["RAYON_RS_NUM_CPUS"] = "1"  # one thread for tokenizers' encode_batch: per-core figures
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def corpus(repeat: int, workdir: Path) -> tuple[list[str], int]:
    docs = []
    for path in sorted((ROOT / "data" / "corpus").glob("*/train-*.jsonl")):
        docs.extend(json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip())
    texts = []
    for r in range(repeat):
        rng = random.Random(r)
        out = workdir / "in" / f"part-{r:03d}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            for d in docs:
                words = d.split(" ")
                if r:  # the first copy is the corpus itself
                    rng.shuffle(words)
                text = " ".join(words)
                texts.append(text)
                f.write(json.dumps({"text": text}) + "\n")
    return texts, sum(len(t.encode()) for t in texts)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from steps.data.decontaminate import DecontaminateConfig, decontaminate
    from steps.data.dedupe import DedupeConfig, dedupe

    workdir = Path(tempfile.mkdtemp(prefix="drydock-bench-curation-"))
    try:
        texts, size = corpus(args.repeat, workdir)
        mb = size / 1e6
        print(f"corpus: {len(texts):,} documents, {mb:.1f} MB of text in {args.repeat} files")
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        evaluation = [str(p) for p in sorted((ROOT / "data" / "corpus").glob("*/validation-*.jsonl"))]
        evaluation += [str(p) for p in sorted((ROOT / "data" / "tasks").glob("*/test.jsonl"))]
        tok = Tokenizer.from_file(str(ROOT / "data" / "tokenizer" / "tokenizer.json"))

        def run_dedupe(i: int, first: bool = False) -> None:
            passes = ("datasketch", "first_match") if first else ("one_permutation", "components")
            out = str(workdir / f"dedupe-{'first-' if first else ''}{i}")
            dedupe(
                DedupeConfig(inputs=[str(workdir / "in")], output=out, minhash=passes[0], grouping=passes[1])
            )

        def run_decontaminate(i: int) -> None:
            out = str(workdir / f"decontaminate-{i}")
            decontaminate(
                DecontaminateConfig(inputs=[str(workdir / "in")], evaluation=evaluation, output=out)
            )

        def run_tokenize(_i: int) -> None:
            for start in range(0, len(texts), 1024):
                tok.encode_batch(texts[start : start + 1024], add_special_tokens=False)

        results = {}
        for name, fn in (
            ("dedupe", run_dedupe),
            ("dedupe (first)", lambda i: run_dedupe(i, first=True)),
            ("decontaminate", run_decontaminate),
            ("tokenize raw", run_tokenize),
        ):
            seconds = [timed(lambda i=i, fn=fn: fn(i)) for i in range(args.runs)]
            results[name] = statistics.median(seconds)
            runs = ", ".join(f"{s:.2f}" for s in seconds)
            print(f"{name:14s} {mb / results[name]:6.2f} MB/s per core  (median of {runs} s)")
        stats = json.loads((workdir / "dedupe-0" / "stats.json").read_text())["total"]
        print(
            f"dedupe removed {stats['documents_in'] - stats['documents_out']:,} of {stats['documents_in']:,}"
        )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
