"""Build the demo's offline task suite from the demo corpus: two multiple-choice tasks.

    python scripts/make_tasks.py            # writes data/tasks/ (deterministic)
    python scripts/make_tasks.py --check    # rebuild in memory, compare with data/tasks/

    data/tasks/sums/test.jsonl        300 equations of the arithmetic validation set, cut at "=":
                                      the right result among 3 near misses (off by 1 or 10; 2 or 11 near 0)
    data/tasks/sums/fewshot.jsonl     16 more, from the training set, for few-shot prompts
    data/tasks/stories/test.jsonl     300 prose passages of the validation set, cut after a
                                      sentence: the true next sentence among 3 from other passages
    data/tasks/stories/fewshot.jsonl  16 more, from the training set

Each row is {"query", "choices", "gold"} (gold: the index of the right choice); the tasks are
declared in `steps/evaluation/demo_tasks.py`. Chance is 1/4 for both. The rows depend only on the corpus and
the seed: rerunning writes byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "data" / "corpus"
OUT = REPO / "data" / "tasks"
SEED = 1234
TEST_ROWS = 300
FEWSHOT_ROWS = 16

_EQUATION = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"])")


def read_docs(domain: str, split: str) -> list[str]:
    docs = []
    for path in sorted((CORPUS / domain).glob(f"{split}-*.jsonl")):
        docs.extend(json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip())
    return docs


def sums(docs: list[str], rng: random.Random, rows: int) -> list[dict]:
    """The right result of an equation among three near misses."""
    seen: set[str] = set()
    equations = []
    for doc in docs:
        for line in doc.splitlines():
            match = _EQUATION.match(line.strip())
            if match and line not in seen:
                seen.add(line)
                equations.append(match.groups())
    rng.shuffle(equations)
    out = []
    for a, op, b, c in equations[:rows]:
        right = int(c)
        misses = sorted({right + d for d in (-10, -1, 1, 10, 2, 11) if right + d >= 0} - {right})[:4]
        wrong = rng.sample(misses, 3)
        choices = [str(right), *map(str, wrong)]
        rng.shuffle(choices)
        out.append({"query": f"{a} {op} {b} =", "choices": choices, "gold": choices.index(str(right))})
    return out


def stories(docs: list[str], rng: random.Random, rows: int) -> list[dict]:
    """A passage cut after a sentence: the true next sentence among three from other passages."""
    passages = []
    for doc in docs:
        sentences = _SENTENCE_END.split(doc.strip())
        if len(sentences) >= 3 and "\n" not in doc:
            passages.append(sentences)
    rng.shuffle(passages)
    # Two cuts per passage where there are too few passages for one each.
    per_passage = 1 if len(passages) >= rows else 2
    cuts = [
        (i, cut)
        for i, p in enumerate(passages)
        for cut in sorted(rng.sample(range(1, min(len(p), 6)), min(per_passage, len(p) - 1)))
    ][:rows]
    out = []
    for i, cut in cuts:
        sentences = passages[i]
        right = sentences[cut]
        others = [p for j, p in enumerate(passages) if j != i and len(p) > cut and p[cut] != right]
        wrong = [p[cut] for p in rng.sample(others, 3)]
        choices = [right, *wrong]
        rng.shuffle(choices)
        out.append({"query": " ".join(sentences[:cut]), "choices": choices, "gold": choices.index(right)})
    return out


def build() -> dict[str, bytes]:
    """Every file of data/tasks/, by path relative to it."""
    files = {}
    for name, domain, make in (("sums", "arithmetic", sums), ("stories", "prose", stories)):
        rng = random.Random(f"{SEED}/{name}")
        for split, source, rows in (("test", "validation", TEST_ROWS), ("fewshot", "train", FEWSHOT_ROWS)):
            made = make(read_docs(domain, source), rng, rows)
            if len(made) < rows:
                raise SystemExit(f"{name}/{split}: only {len(made)} rows in the corpus, need {rows}")
            files[f"{name}/{split}.jsonl"] = "".join(json.dumps(r) + "\n" for r in made).encode()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with data/tasks/ instead of writing")
    args = parser.parse_args(argv)
    files = build()
    if args.check:
        stale = [p for p, data in files.items() if not (OUT / p).exists() or (OUT / p).read_bytes() != data]
        if stale:
            print(f"data/tasks/ differs from what the script builds: {', '.join(stale)}", file=sys.stderr)
            return 1
        print(f"data/tasks/ is up to date ({len(files)} files)")
        return 0
    for path, data in files.items():
        (OUT / path).parent.mkdir(parents=True, exist_ok=True)
        (OUT / path).write_bytes(data)
    print(f"wrote {len(files)} files under {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
