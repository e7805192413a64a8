"""Write a few rows of each registry task the hero recipe evaluates, in that task's own schema.

    python scripts/make_registry_task_rows.py OUT            # OUT/<lm-eval task>/<split>.jsonl

The hero recipe (`experiments/moe_535b_a23b.py`) evaluates lm-eval's HellaSwag, ARC easy and
challenge, PIQA, WinoGrande, BoolQ, OpenBookQA, CommonsenseQA and the MMLU group (57 subjects,
each its own task and dataset). On a real run their rows are exported once from the Hub. Nothing
can be downloaded here, so this script writes rows by hand, field for field as each task's Hub
dataset has them (the schema lm-eval's task templates read: HellaSwag's `ctx_a`/`endings`/`label`
through its `process_docs`, WinoGrande's `sentence` with a blank, MMLU's `choices`/`answer` ...),
with enough training rows for each task's few-shot count. The questions are simple sums, so the
rows say nothing of what a model knows: they prove that the hero's evaluation path reads every
task, builds its prompts and few-shot examples and aggregates the MMLU group.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TRAIN_ROWS = 30  # more than the largest few-shot count the recipe uses (ARC at 25)
EVAL_ROWS = 4
MMLU_EVAL_ROWS = 2  # 57 subjects


def _sum(i: int) -> tuple[str, list[str], int]:
    """Question i: a sum, four numeric choices, and the index of the right one."""
    a, b = 2 + i % 9, 3 + (i * 5) % 11
    right = a + b
    choices = [str(right + d) for d in (-2, -1, 0, 1)]
    gold = (i * 7) % 4
    choices[gold], choices[2] = choices[2], choices[gold]
    return f"What is {a} plus {b}?", choices, gold


def hellaswag(i: int) -> dict:
    question, choices, gold = _sum(i)
    return {
        "ind": i,
        "activity_label": "Adding numbers",
        "ctx_a": f"A student reads the question: {question.lower()}",
        "ctx_b": "she writes the answer",
        "ctx": f"A student reads the question: {question.lower()} She writes the answer",
        "endings": [f"{c}." for c in choices],
        "source_id": f"drydock~{i}",
        "split": "val",
        "split_type": "indomain",
        "label": str(gold),
    }


def arc(i: int) -> dict:
    question, choices, gold = _sum(i)
    labels = ["A", "B", "C", "D"]
    return {
        "id": f"Drydock_{i}",
        "question": question,
        "choices": {"text": choices, "label": labels},
        "answerKey": labels[gold],
    }


def piqa(i: int) -> dict:
    question, choices, gold = _sum(i)
    right = choices[gold]
    wrong = choices[(gold + 1) % 4]
    label = i % 2
    sols = (right, wrong) if label == 0 else (wrong, right)
    return {
        "goal": f"To answer {question.lower()}",
        "sol1": f"write {sols[0]}.",
        "sol2": f"write {sols[1]}.",
        "label": label,
    }


def winogrande(i: int) -> dict:
    a, b = 2 + i % 9, 3 + (i * 5) % 11
    answer = "1" if i % 2 == 0 else "2"
    options = (str(a + b), str(a + b + 1)) if answer == "1" else (str(a + b + 1), str(a + b))
    return {
        "sentence": f"{a} plus {b} is _ exactly.",
        "option1": options[0],
        "option2": options[1],
        "answer": answer,
    }


def boolq(i: int) -> dict:
    a, b = 2 + i % 9, 3 + (i * 5) % 11
    label = i % 2
    shown = a + b if label else a + b + 1
    return {
        "question": f"is {a} plus {b} equal to {shown}",
        "passage": f"{a} plus {b} is {a + b}.",
        "idx": i,
        "label": label,
    }


def openbookqa(i: int) -> dict:
    question, choices, gold = _sum(i)
    labels = ["A", "B", "C", "D"]
    return {
        "id": f"{i}-drydock",
        "question_stem": question,
        "choices": {"text": choices, "label": labels},
        "answerKey": labels[gold],
    }


def commonsense_qa(i: int) -> dict:
    question, choices, gold = _sum(i)
    choices = [*choices, str(int(choices[0]) + 7)]
    labels = ["A", "B", "C", "D", "E"]
    return {
        "id": f"drydock{i:04d}",
        "question": question,
        "question_concept": "sum",
        "choices": {"label": labels, "text": choices},
        "answerKey": labels[gold],
    }


def mmlu(subject: str, i: int) -> dict:
    question, choices, gold = _sum(i)
    return {"question": question, "subject": subject, "choices": choices, "answer": gold}


TASKS = {
    "hellaswag": (hellaswag, ("train", "validation")),
    "arc_easy": (arc, ("train", "validation", "test")),
    "arc_challenge": (arc, ("train", "validation", "test")),
    "piqa": (piqa, ("train", "validation")),
    "winogrande": (winogrande, ("train", "validation")),
    "boolq": (boolq, ("train", "validation")),
    "openbookqa": (openbookqa, ("train", "validation", "test")),
    "commonsense_qa": (commonsense_qa, ("train", "validation")),
}
"""Each task's row writer and the splits its Hub dataset has (lm-eval picks the ones it uses)."""


def write_rows(out: Path) -> list[Path]:
    """Write every task's rows under `out`; return the files written."""
    from steps.evaluation.eval_tasks import registry_leaves

    written = []

    def write(task: str, split: str, rows: list[dict]) -> None:
        path = out / task / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        written.append(path)

    for task, (row, splits) in TASKS.items():
        for n, split in enumerate(splits):
            count = TRAIN_ROWS if split == "train" else EVAL_ROWS
            write(task, split, [row(1000 * n + i) for i in range(count)])
    for task in registry_leaves("mmlu"):
        subject = task.removeprefix("mmlu_")
        write(task, "dev", [mmlu(subject, i) for i in range(5)])  # MMLU's few-shot split: 5 rows
        for n, split in enumerate(("validation", "test"), 1):
            write(task, split, [mmlu(subject, 1000 * n + i) for i in range(MMLU_EVAL_ROWS)])
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the task-data directory (the step's task_data)")
    args = parser.parse_args(argv)
    files = write_rows(args.out)
    tasks = {f.parent.name for f in files}
    print(f"wrote {len(files)} files for {len(tasks)} tasks under {args.out}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
