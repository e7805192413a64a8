"""Tokens per second: the tokenize step vs raw `encode_batch` vs Levanter's own cache builder.

The corpus is the committed demo corpus (data/corpus, both domains, train split), repeated
`--repeat` times into temporary jsonl files so the timing is not dominated by start-up. All
three use the same `tokenizers` tokenizer (data/tokenizer) on the same cores:

  raw       Tokenizer.encode_batch over the documents already in memory (the practical ceiling)
  step      steps.data.tokenize.tokenize: read jsonl, encode, write the Levanter cache, ledgers, stats
  levanter  levanter.data.text.build_lm_dataset_cache on the same files

    .venv/bin/python benchmarks/tokenize.py [--repeat 8] [--runs 3] [--one-core] [--skip-levanter]
                                            [--out results.json]

`--runs N` times raw and the step N times each, alternating, and reports each one's median and
the median of the per-run ratios. `--one-core` pins the process to one CPU and `encode_batch` to
one thread (RAYON_RS_NUM_CPUS=1): a per-core comparison, where overlapping work on another core
cannot hide the step's own costs. The 1-minute load average is printed before and after.
"""

from __future__ import annotations

import sys

# This file's name shadows the standard library's `tokenize` (used by `inspect`): take its
# directory off the import path before anything imports it.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MARIN_PREFIX", tempfile.mkdtemp(prefix="drydock-bench-marin-"))


def corpus(repeat: int, workdir: Path) -> tuple[list[Path], list[str]]:
    docs = []
    for path in sorted((ROOT / "data" / "corpus").glob("*/train-*.jsonl")):
        docs.extend(json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip())
    files = []
    for r in range(repeat):
        out = workdir / f"input-{r:03d}.jsonl"
        with open(out, "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")
        files.append(out)
    return files, docs * repeat


def bench_raw(docs: list[str], tokenizer_dir: Path) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    start = time.perf_counter()
    tokens = 0
    for i in range(0, len(docs), 1024):
        tokens += sum(len(e.ids) + 2 for e in tok.encode_batch(docs[i : i + 1024], add_special_tokens=False))
    return time.perf_counter() - start, tokens


def bench_step(files: list[Path], tokenizer_dir: Path, workdir: Path) -> tuple[float, int]:
    from steps.data.tokenize import TokenizeConfig, tokenize

    out = workdir / "step-out"
    start = time.perf_counter()
    tokenize(TokenizeConfig(train=[str(f) for f in files], tokenizer=str(tokenizer_dir), output=str(out)))
    elapsed = time.perf_counter() - start
    stats = json.loads((out / "stats.json").read_text())
    return elapsed, stats["splits"]["train"]["tokens"]


def bench_levanter(files: list[Path], tokenizer_dir: Path, workdir: Path) -> tuple[float, int]:
    from levanter.data.sharded_datasource import UrlDataSource
    from levanter.data.text.cache import build_lm_dataset_cache
    from levanter.data.text.formats import TextLmDatasetFormat
    from levanter.tokenizers import load_tokenizer

    tok = load_tokenizer(str(tokenizer_dir))
    out = workdir / "levanter-out" / "train"
    start = time.perf_counter()
    cache = build_lm_dataset_cache(
        str(out), UrlDataSource([str(f) for f in files]), TextLmDatasetFormat(), tok
    )
    elapsed = time.perf_counter() - start
    return elapsed, cache.flat_field_length("input_ids")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1, help="alternating runs of raw and the step")
    parser.add_argument("--one-core", action="store_true", help="pin to one CPU, one tokenizer thread")
    parser.add_argument("--skip-levanter", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.one_core:
        # Before `tokenizers` is imported: its thread pool is sized once, from this variable.
        os.environ["RAYON_RS_NUM_CPUS"] = "1"
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    tokenizer_dir = ROOT / "data" / "tokenizer"
    workdir = Path(tempfile.mkdtemp(prefix="drydock-bench-tokenize-"))
    load_before = os.getloadavg()[0]
    try:
        files, docs = corpus(args.repeat, workdir)
        mb = sum(f.stat().st_size for f in files) / 1e6
        # Warm up: imports and the tokenizer's first call are not part of any figure.
        bench_raw(docs[:2000], tokenizer_dir)
        bench_step(files[:1], tokenizer_dir, workdir / "warm")
        runs: dict[str, list[tuple[float, int]]] = {"raw encode_batch": [], "tokenize step": []}
        for i in range(args.runs):
            runs["raw encode_batch"].append(bench_raw(docs, tokenizer_dir))
            runs["tokenize step"].append(bench_step(files, tokenizer_dir, workdir / f"run-{i}"))
        if not args.skip_levanter:
            runs["levanter build_lm_dataset_cache"] = [bench_levanter(files, tokenizer_dir, workdir)]
        raw_s = statistics.median(s for s, _ in runs["raw encode_batch"])
        raw_rate = runs["raw encode_batch"][0][1] / raw_s
        cores = "1 (pinned, one tokenizer thread)" if args.one_core else str(os.cpu_count())
        print(f"corpus: {len(docs):,} documents, {mb:.1f} MB in {len(files)} files; cores: {cores}")
        print(f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")
        print(f"{'':34} {'seconds':>8} {'tokens':>11} {'tokens/s':>11} {'vs raw':>7}   runs (s)")
        result: dict = {"documents": len(docs), "megabytes": mb, "cores": cores, "rows": {}}
        for name, timings in runs.items():
            seconds = statistics.median(s for s, _ in timings)
            tokens = timings[0][1]
            rate = tokens / seconds
            each = ", ".join(f"{s:.2f}" for s, _ in timings)
            print(f"{name:34} {seconds:8.2f} {tokens:11,} {rate:11,.0f} {rate / raw_rate:7.0%}   {each}")
            result["rows"][name] = {
                "seconds": seconds,
                "runs_s": [s for s, _ in timings],
                "tokens": tokens,
                "tokens_per_s": rate,
                "fraction_of_raw": rate / raw_rate,
            }
        # Each run's step against the raw run just before it: the pairs share the machine's state.
        pairs = [r[0] / s[0] for r, s in zip(runs["raw encode_batch"], runs["tokenize step"], strict=True)]
        ratio = statistics.median(pairs)
        print(f"step / raw, paired: median {ratio:.0%} (runs: {', '.join(f'{p:.0%}' for p in pairs)})")
        result["step_vs_raw_paired"] = {"median": ratio, "runs": pairs}
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
