"""Does curation find what was planted? Recall of dedupe and decontaminate at their thresholds.

dedupe: `--pairs` documents (400; word sequences drawn from the demo corpus's vocabulary, 120-200 words,
so that no two share a 5-gram by chance) each get a copy edited until the Jaccard similarity of
the two documents' word 5-gram sets (as dedupe normalizes them) is a target value: 0.95 down to
0.5. The step runs with its defaults (threshold 0.8, 128 one-permutation MinHash values, LSH);
a pair is found when the copy is removed as the original's duplicate. LSH's S-curve around the
threshold is expected: all found well above it, about half at it, none well below it.

decontaminate: each `stories` test item of the demo task suite (its question and the right
answer, the text a model would be scored on) is planted in its own web-like document of other
text, as it is, in upper case with its punctuation changed, with one word in 20 changed, and
only its first 13 words. The step runs with its defaults (13-grams, common n-grams in more than
10 documents ignored) against the task suite; an item is found when its document is removed.

    .venv/bin/python benchmarks/curation_recall.py [--pairs 400]

Prints the share found per band of similarity and per kind of plant, then the load average.
"""

from __future__ import annotations

import sys

# benchmarks/tokenize.py, beside this file, shadows the standard library's `tokenize`.
sys.path[:] = [p for p in sys.path if p not in ("", __file__.rsplit("/", 1)[0])]

import argparse
import json
import os
import random
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SIMILARITIES = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    from steps.data.normalized import normalize

    words = normalize(text).split(" ")
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


def edited(text: str, target: float, rng: random.Random, vocabulary: list[str]) -> tuple[str, float]:
    """`text` with words replaced, one at a time at random places, until its 5-gram Jaccard
    similarity with `text` is at most `target`; the copy and its similarity."""
    words = text.split(" ")
    copy = list(words)
    similarity = 1.0
    while similarity > target:
        copy[rng.randrange(len(copy))] = rng.choice(vocabulary) + "x"  # a word no original has
        similarity = jaccard(text, " ".join(copy))
    return " ".join(copy), similarity


def dedupe_recall(work: Path, pairs: int) -> list[tuple[float, float, int, int]]:
    """Per band of Jaccard similarity: (low, high, copies removed, copies planted)."""
    from steps.data.dedupe import DedupeConfig, dedupe
    from steps.data.filtering import read_evidence

    rng = random.Random(7)
    corpus = ROOT / "data" / "corpus" / "prose" / "train-0000.jsonl"
    vocabulary = sorted({w for line in corpus.open() for w in json.loads(line)["text"].lower().split()})
    originals = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(120, 200))) for _ in range(pairs)]
    rows, planted = [], {}
    for target in SIMILARITIES:
        for original in rng.sample(originals, pairs // len(SIMILARITIES)):
            copy, similarity = edited(original, target, rng, vocabulary)
            rows.append(original)
            rows.append(copy)
            planted[len(rows) - 1] = (target, similarity)
    (work / "in").mkdir()
    (work / "in" / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    config = DedupeConfig(inputs=["in"], output=str(work / "out"), input_root=str(work))
    dedupe(config)
    removed = {e["index"] for e in read_evidence(str(work / "out"))}
    bands = [(0.9, 1.01), (0.85, 0.9), (0.8, 0.85), (0.75, 0.8), (0.7, 0.75), (0.0, 0.7)]
    out = []
    for low, high in bands:
        mine = [i for i, (_t, s) in planted.items() if low <= s < high]
        out.append((low, high, sum(i in removed for i in mine), len(mine)))
    return out


def decontaminate_recall(work: Path, per_run: int = 10) -> dict[tuple[str, bool], tuple[int, int]]:
    """Each kind of plant in runs of `per_run` items: the demo's `stories` items are made from
    templates, so many of their 13-grams are shared among items, and with all 300 planted at once
    those would be in more than `max_matches` training documents and ignored as common phrases
    (as they should be: real evaluation items do not share 13-grams by the hundred)."""
    from steps.data.decontaminate import DecontaminateConfig, decontaminate
    from steps.data.filtering import read_evidence
    from steps.evaluation.demo_tasks import DEMO_TASKS

    rng = random.Random(3)
    stories = [json.loads(line) for line in (ROOT / "data" / "tasks" / "stories" / "test.jsonl").open()]
    filler = [json.loads(line)["text"] for line in (ROOT / "data" / "web" / "low_quality.jsonl").open()]
    kinds = {
        "verbatim": lambda t: t,
        "case and punctuation": lambda t: re.sub(r"[.,!?]", " ;", t.upper()),
        "one word in 20 changed": lambda t: " ".join(
            "zzz" if i % 20 == 10 else w for i, w in enumerate(t.split(" "))
        ),
        "first 13 words only": lambda t: " ".join(t.split(" ")[:13]),
    }
    task_files = [task.data[task.test_split] for task in DEMO_TASKS if task.data]
    found = {(kind, check): 0 for kind in kinds for check in (True, False)}
    run = 0
    for kind, plant in kinds.items():
        for start in range(0, len(stories), per_run):
            run += 1
            items = stories[start : start + per_run]
            texts = [f"{item['query']} {item['choices'][item['gold']]}" for item in items]
            rows = [f"{rng.choice(filler)} {plant(text)} {rng.choice(filler)}" for text in texts]
            rows += rng.sample(filler, 20)  # and documents with nothing planted
            (work / f"train-{run}").mkdir()
            (work / f"train-{run}" / "docs.jsonl").write_text(
                "".join(json.dumps({"text": t}) + "\n" for t in rows)
            )
            output = work / f"out-{run}"
            decontaminate(
                DecontaminateConfig(
                    inputs=[str(work / f"train-{run}")],
                    evaluation=task_files,
                    output=str(output),
                    input_root=str(ROOT),
                )
            )
            removed = {e["index"] for e in read_evidence(str(output))}
            assert removed <= set(range(len(items))), "a document with nothing planted was removed"
            for i, item in enumerate(items):
                found[(kind, checkable(item))] += i in removed
    return {
        (kind, check): (found[(kind, check)], sum(checkable(item) == check for item in stories))
        for kind in kinds
        for check in (True, False)
    }


def checkable(item: dict) -> bool:
    """Whether a text of the item (its question, a choice) gives a 13-gram: the step cannot find
    the others, and counts them as `too_short` (lower `ngram` to check them)."""
    from steps.data.decontaminate import words

    return any(len(words(t)) >= 13 for t in (item["query"], *item["choices"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=400, help="planted near-duplicate pairs in all")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("dedupe", "decon"):
            (Path(tmp) / name).mkdir()
        dedupe_rows = dedupe_recall(Path(tmp) / "dedupe", args.pairs)
        decon = decontaminate_recall(Path(tmp) / "decon")
    print("dedupe (threshold 0.8): planted near copies found, by their 5-gram Jaccard similarity")
    for low, high, found, total in dedupe_rows:
        band = f"{low:.2f} - {min(high, 1.0):.2f}"
        print(f"  {band:<14}{found:>6} / {total:<4} {found / max(1, total):>5.0%}")
    print("\ndecontaminate (13-grams): planted `stories` test items found")
    print(f"  {'':<26}{'items with a 13-gram':>22}{'items without':>18}")
    for kind in dict.fromkeys(k for k, _ in decon):
        (yes, yes_total), (no, no_total) = decon[(kind, True)], decon[(kind, False)]
        shares = (
            f"{yes:>6} / {yes_total:<4}{yes / yes_total:>6.0%}{no:>8} / {no_total:<4}{no / no_total:>5.0%}"
        )
        print(f"  {kind:<26}{shares}")
    before, after = (f"{x[0]:.2f} {x[1]:.2f}" for x in (load_before, os.getloadavg()))
    print(f"\nload average (1 and 5 minutes) before {before}, after {after}")


if __name__ == "__main__":
    main()
