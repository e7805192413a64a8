"""Web curation's stages, a core each, beside datatrove's on the same records.

The records: every HTML page of the demo crawl (data/web, `scripts/make_web_crawl.py`) repeated
`--repeat` times, and the text Drydock extracts from them. Each round runs, one after the other,
each in a process of its own on one core (CPU seconds of that process, after its imports; each
stage runs twice over the records and the second pass is timed, for both contestants):

  drydock     steps.data.extract.html_to_text (Resiliparse, ftfy where needed) over the HTML;
              steps.data.language.identify (py3langid) and steps.data.heuristics.judge_texts
              (Gopher quality and repetition, C4, FineWeb, in batches of 512) and the quality
              classifier's score over the texts
  datatrove   datatrove 0.10's Trafilatura extractor over the same HTML; its GopherQualityFilter,
              GopherRepetitionFilter, C4QualityFilter and FineWebQualityFilter, chained as
              Drydock's heuristics step chains them (a document one removes goes no further), over
              the same texts; its LanguageFilter where its fastText model is at hand (it is a
              download: not on this machine)

Prints, per stage and contestant, the median MB/s over the rounds (of HTML for extraction, of
text for the rest) and the documents removed, then the load average before and after.

datatrove is not a dependency of the project: give a Python that has it.

    python3.11 -m venv /tmp/dt && /tmp/dt/bin/pip install "datatrove[processing]==0.10.1" lxml_html_clean
    .venv/bin/python benchmarks/curation_web.py --datatrove-python /tmp/dt/bin/python
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py, beside this file, shadows the standard library's `tokenize`.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DRYDOCK = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
from steps.data.extract import html_to_text
from steps.data.heuristics import HeuristicsConfig, judge_texts
from steps.data.language import identify
from steps.data.quality import QualityClassifier
pages = [json.loads(line)["html"] for line in open(sys.argv[1])]
texts = [json.loads(line)["text"] for line in open(sys.argv[2])]
classifier = QualityClassifier.load(sys.argv[4])
html_to_text(pages[0].encode()); identify(texts[0]); judge_texts(HeuristicsConfig([], ""), texts[:4])
classifier.score(texts[:512])  # its first call grows the hashing tables: warm, as the others are
def timed(fn):
    fn()  # a pass to warm (allocations, caches), then the timed one
    started = time.process_time(); removed = fn(); return time.process_time() - started, removed
out = {}
raw = [p.encode() for p in pages]
out["extract"] = timed(lambda: sum(not html_to_text(b) for b in raw))
out["language"] = timed(lambda: sum(identify(t)[0] != "en" for t in texts))
config = HeuristicsConfig([], "")
batches = [texts[i:i + 512] for i in range(0, len(texts), 512)]
out["heuristics"] = timed(lambda: sum(r is not None for b in batches for r in judge_texts(config, b)))
out["quality"] = timed(lambda: int(sum((classifier.score(b) < 0.5).sum() for b in batches)))
print(json.dumps(out))
"""

DATATROVE = r"""
import json, sys, time, logging
logging.disable(logging.WARNING)
from datatrove.data import Document
from datatrove.pipeline.extractors import Trafilatura
from datatrove.pipeline.filters import (
    C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter,
)
pages = [json.loads(line)["html"] for line in open(sys.argv[1])]
texts = [json.loads(line)["text"] for line in open(sys.argv[2])]
extractor = Trafilatura(favour_precision=True, timeout=None)
filters = [GopherQualityFilter(), GopherRepetitionFilter(), C4QualityFilter(), FineWebQualityFilter()]
def keep(doc):
    for f in filters:
        verdict = f.filter(doc)
        if verdict is False or (isinstance(verdict, tuple) and verdict[0] is False):
            return False
    return True
keep(Document(text=texts[0], id="0")); extractor.extract(pages[0])
def timed(fn):
    fn()  # a pass to warm (allocations, caches), then the timed one
    started = time.process_time(); removed = fn(); return time.process_time() - started, removed
out = {}
out["extract"] = timed(lambda: sum(not extractor.extract(p) for p in pages))
documents = lambda: (Document(text=t, id=str(i)) for i, t in enumerate(texts))
out["heuristics"] = timed(lambda: sum(not keep(d) for d in documents()))
try:
    from datatrove.pipeline.filters import LanguageFilter
    language = LanguageFilter(languages=["en"])
    language.filter(Document(text=texts[0], id="0"))
    out["language"] = timed(lambda: sum(not language.filter(d) for d in documents()))
except Exception as e:
    out["language_error"] = f"{type(e).__name__}: {str(e)[:120]}"
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=4, help="copies of the demo crawl's pages")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--datatrove-python", help="a Python with datatrove 0.10 installed")
    args = parser.parse_args()
    from steps.data.extract import html_to_text, read_pages

    load_before = os.getloadavg()
    pages = [
        p.body.decode("utf-8", "replace")
        for path in sorted((ROOT / "data" / "web").glob("crawl-*.warc.gz"))
        for p in read_pages(str(path))
        if p.status == 200 and not p.truncated and "html" in p.content_type
    ] * args.repeat
    texts = [t for t in (html_to_text(p.encode()) for p in pages) if t]
    html_mb = sum(len(p.encode()) for p in pages) / 1e6
    text_mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{len(pages):,} pages ({html_mb:.1f} MB of HTML), {len(texts):,} texts ({text_mb:.1f} MB)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "pages.jsonl").write_text("".join(json.dumps({"html": p}) + "\n" for p in pages))
        (work / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        classifier = _classifier(work)
        runs: dict[str, list[dict]] = {"drydock": [], "datatrove": []}
        for _ in range(args.rounds):
            runs["drydock"].append(_run(sys.executable, DRYDOCK, work, classifier))
            if args.datatrove_python:
                runs["datatrove"].append(_run(args.datatrove_python, DATATROVE, work, classifier))
    sizes = {"extract": html_mb, "language": text_mb, "heuristics": text_mb, "quality": text_mb}
    print(f"\n{'stage':<12}{'contestant':<12}{'MB/s a core':>12}{'removed':>10}   (median of {args.rounds})")
    for stage in ("extract", "language", "heuristics", "quality"):
        for who, results in runs.items():
            timings = [r[stage] for r in results if stage in r]
            if not timings:
                note = next((r.get(f"{stage}_error") for r in results if f"{stage}_error" in r), None)
                if results and note:
                    print(f"{stage:<12}{who:<12}{'not run':>12}   {note}")
                continue
            rate = statistics.median(sizes[stage] / seconds for seconds, _removed in timings)
            print(f"{stage:<12}{who:<12}{rate:>12.2f}{timings[0][1]:>10,}")
    load_after = os.getloadavg()
    before, after = (f"{x[0]:.2f} {x[1]:.2f}" for x in (load_before, load_after))
    print(f"\nload average (1 and 5 minutes) before {before}, after {after}")


def _classifier(work: Path) -> str:
    """The demo recipe's classifier (prose against search-engine bait), trained once here."""
    from steps.data.quality import QualityClassifierConfig, train_quality_classifier

    output = str(work / "classifier")
    train_quality_classifier(
        QualityClassifierConfig(
            positive=["data/corpus/prose/train-*.jsonl"],
            negative=["data/web/low_quality.jsonl"],
            output=output,
            input_root=str(ROOT),
        )
    )
    return output


def _run(python: str, script: str, work: Path, classifier: str) -> dict:
    done = subprocess.run(
        [python, "-c", script, str(work / "pages.jsonl"), str(work / "texts.jsonl"), str(ROOT), classifier],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{python}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
