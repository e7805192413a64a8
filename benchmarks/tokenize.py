"""Tokens per second: the tokenize step vs raw `encode_batch` vs Levanter's own cache builder.

The corpus is the committed demo corpus (data/corpus, both domains, train split), repeated
`--repeat` times into temporary jsonl files so the timing is not dominated by start-up. All
three use the same `tokenizers` tokenizer (data/tokenizer) on the same cores:

  raw       Tokenizer.encode_batch over the documents already in memory (the practical ceiling)
  step      steps.data.tokenize.tokenize: read jsonl, encode, write the Levanter cache, ledgers, stats
  levanter  levanter.data.text.build_lm_dataset_cache on the same files

    .venv/bin/python benchmarks/tokenize.py [--repeat 8] [--skip-levanter] [--out results.json]
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
    parser.add_argument("--skip-levanter", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    tokenizer_dir = ROOT / "data" / "tokenizer"
    workdir = Path(tempfile.mkdtemp(prefix="drydock-bench-tokenize-"))
    try:
        files, docs = corpus(args.repeat, workdir)
        mb = sum(f.stat().st_size for f in files) / 1e6
        rows = {}
        # Warm up: imports and the tokenizer's first call are not part of any figure.
        bench_raw(docs[:2000], tokenizer_dir)
        bench_step(files[:1], tokenizer_dir, workdir / "warm")
        rows["raw encode_batch"] = bench_raw(docs, tokenizer_dir)
        rows["tokenize step"] = bench_step(files, tokenizer_dir, workdir)
        if not args.skip_levanter:
            rows["levanter build_lm_dataset_cache"] = bench_levanter(files, tokenizer_dir, workdir)
        raw_rate = rows["raw encode_batch"][1] / rows["raw encode_batch"][0]
        print(f"corpus: {len(docs):,} documents, {mb:.1f} MB in {len(files)} files; {os.cpu_count()} cores")
        print(f"{'':34} {'seconds':>8} {'tokens':>11} {'tokens/s':>11} {'vs raw':>7}")
        result = {"documents": len(docs), "megabytes": mb, "cores": os.cpu_count(), "rows": {}}
        for name, (seconds, tokens) in rows.items():
            rate = tokens / seconds
            print(f"{name:34} {seconds:8.2f} {tokens:11,} {rate:11,.0f} {rate / raw_rate:7.0%}")
            result["rows"][name] = {
                "seconds": seconds,
                "tokens": tokens,
                "tokens_per_s": rate,
                "fraction_of_raw": rate / raw_rate,
            }
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
