"""From raw web crawl to a training mixture: the curation stages a pretraining corpus goes through.

    extract/web            the demo crawl's WARC files (data/web, made by scripts/make_web_crawl.py)
                           to plain text: main content only, Unicode repaired; images, PDFs, empty
                           pages and a cut record counted, not failed
    language/web           English kept (py3langid)
    heuristics/web         Gopher quality and repetition, C4 and FineWeb rules, datatrove's
                           thresholds
    quality/classifier     a hashed n-gram logistic regression: the demo prose corpus (positive)
                           against examples of search-engine bait (negative, data/web/
                           low_quality.jsonl); at scale, a curated set against a random sample
                           of the crawl, as DCLM trains its filter
    quality/web            documents the classifier scores under 0.5 removed
    dedupe/web             exact and near duplicates (MinHash LSH)
    decontaminate/web      documents sharing a 13-gram with the demo tasks' test rows removed
    tokenized/web, tokenized/arithmetic   the committed BPE tokenizer
    mixture/web            web text and arithmetic, 3:1

Each filter writes what it removed and why (`removed/*.jsonl`) beside its counts (`stats.json`);
`drydock data experiments/web_to_tokens.py <step>` prints samples of both. About 15 s of steps
(35 to 65 s with Ray's start, on 2 cores); a second run finds every step cached.
"""

from __future__ import annotations

import os

from pipeline import executor_main
from steps.data.decontaminate import decontaminate_step
from steps.data.dedupe import dedupe_step
from steps.data.extract import extract_step
from steps.data.heuristics import heuristics_step
from steps.data.language import language_step
from steps.data.mixture import mixture_step
from steps.data.quality import quality_classifier_step, quality_filter_step
from steps.data.tokenize import tokenize_step
from steps.evaluation.demo_tasks import DEMO_TASKS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = "data/tokenizer"
BATCH_SIZE = 8
SEQ_LEN = 128
NUM_STEPS = 60

pages = extract_step("extract/web", inputs=["data/web/crawl-*.warc.gz"], input_root=ROOT)
english = language_step("language/web", inputs=[pages / "data"], languages=["en"])
clean = heuristics_step("heuristics/web", inputs=[english / "data"])
classifier = quality_classifier_step(
    "quality/classifier",
    positive=["data/corpus/prose/train-*.jsonl"],
    negative=["data/web/low_quality.jsonl"],
    input_root=ROOT,
)
good = quality_filter_step("quality/web", inputs=[clean / "data"], classifier=classifier, min_score=0.5)
unique = dedupe_step("dedupe/web", inputs=[good / "data"])
decontaminated = decontaminate_step(
    "decontaminate/web", inputs=[unique / "data"], tasks=DEMO_TASKS, input_root=ROOT
)

web = tokenize_step(
    "tokenized/web",
    train=[decontaminated / "data"],
    validation=["data/corpus/prose/validation-*.jsonl"],
    tokenizer=TOKENIZER,
    input_root=ROOT,
)
arithmetic = tokenize_step(
    "tokenized/arithmetic",
    train=["data/corpus/arithmetic/train-*.jsonl"],
    validation=["data/corpus/arithmetic/validation-*.jsonl"],
    tokenizer=TOKENIZER,
    input_root=ROOT,
)
mixture = mixture_step(
    "mixture/web",
    components={"web": web, "arithmetic": arithmetic},
    weights={"web": 0.75, "arithmetic": 0.25},
    target_tokens=NUM_STEPS * BATCH_SIZE * SEQ_LEN,
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    validation=["web", "arithmetic"],
    max_epochs=2,
)

if __name__ == "__main__":
    executor_main(
        [mixture], description="web crawl to a training mixture: extract, filter, dedupe, tokenize, mix"
    )
