"""The decontaminate step: evaluation items planted in training files are removed, and only they."""

from __future__ import annotations

import json
import random

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from steps.data.decontaminate import (
    DecontaminateConfig,
    DecontaminateError,
    decontaminate,
    decontaminate_step,
    words,
)
from steps.data.filtering import read_evidence
from steps.data.shards import shard_texts
from steps.evaluation.eval_tasks import inline_task
from tests.steps.data.test_dedupe import unique_docs, write_jsonl


def sentence(rng: random.Random, vocabulary: list[str], n: int) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(n))


def test_planted_evaluation_items_and_only_they_are_removed(tmp_path):
    rng = random.Random(3)
    vocabulary = [w for doc in unique_docs(5, seed=99) for w in doc.split(" ")]
    train = unique_docs(60, seed=4)
    validation = unique_docs(20, seed=5)
    # A common phrase: in 20 training documents and in an evaluation item. Boilerplate, not a leak.
    boilerplate = "this page was generated automatically from the archive and may contain errors or omissions"
    for i in range(20):
        train[i] = f"{train[i]} {boilerplate}."
    validation[0] = f"{validation[0]} {boilerplate}"
    task_rows = [
        {"query": sentence(rng, vocabulary, 20), "choices": ["yes", "no"], "gold": 0} for _ in range(10)
    ]
    task_rows.append({"query": "2 + 2 =", "choices": ["4", "5"], "gold": 0})  # too short to check
    # Plant: a validation document inside a training document (respelled), and task rows.
    planted = {
        25: f"Some preface. {validation[7].upper()} And an epilogue.",
        30: "As the question went: " + task_rows[3]["query"] + "; the answer was yes.",
        41: task_rows[8]["query"].replace(" ", "  ") + ", " + " ".join(validation[12].split(" ")[40:60]),
    }
    for i, text in planted.items():
        train[i] = text
    write_jsonl(tmp_path / "train" / "a.jsonl", train[:35])
    write_jsonl(tmp_path / "train" / "b.jsonl", train[35:])
    write_jsonl(tmp_path / "eval" / "validation.jsonl", validation)
    write_jsonl(tmp_path / "tasks" / "qa" / "test.jsonl", [])
    (tmp_path / "tasks" / "qa" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in task_rows))
    task = inline_task(
        "qa", {"test": "tasks/qa/test.jsonl"}, doc_to_text="{{query}}", doc_to_target="{{gold}}"
    )
    step = decontaminate_step(
        "decontaminate/planted",
        inputs=["train"],
        evaluation=["eval/validation.jsonl"],
        tasks=[task],
        input_root=str(tmp_path),
    )
    report = run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local"))
    assert report.ok
    (out,) = (tmp_path / "prefix" / "decontaminate").glob("planted-*")

    kept = list(shard_texts(str(out / "data" / "train" / "a.jsonl"), "text"))
    kept += list(shard_texts(str(out / "data" / "train" / "b.jsonl"), "text"))
    assert kept == [text for i, text in enumerate(train) if i not in planted]
    removed = list(read_evidence(str(out)))
    assert {r["reason"] for r in removed} == {"contamination"}
    assert removed[1]["excerpt"] == planted[30]  # the document, as the data page shows it
    removed = [{**r, **r["detail"]} for r in removed]
    assert [(r["file"], r["index"]) for r in removed] == [
        ("train/a.jsonl", 25),
        ("train/a.jsonl", 30),
        ("train/b.jsonl", 41 - 35),
    ]
    # Which evaluation items matched: the validation document, the task rows.
    matched = [{(m["file"], m["index"]) for m in r["matched"]} for r in removed]
    assert matched == [
        {("eval/validation.jsonl", 7)},
        {("tasks/qa/test.jsonl", 3)},
        {("tasks/qa/test.jsonl", 8), ("eval/validation.jsonl", 12)},
    ]
    stats = json.loads((out / "stats.json").read_text())
    source = stats["sources"]["train"]
    assert source["documents_in"] == 60 and source["documents_removed"] == 3 and source["documents_out"] == 57
    assert source["words_removed"] == sum(len(words(t)) for t in planted.values())
    assert stats["total"]["evaluation_items_matched"] == 4
    assert stats["evaluation"]["too_short"] >= 1 + 2 * 11  # "2 + 2 =" and every one-word choice
    assert stats["evaluation"]["common_ngrams_ignored"] > 0


def test_a_rerun_reuses_checked_shards_and_bad_input_is_named(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", unique_docs(5, seed=1))
    (tmp_path / "in" / "b.jsonl").write_text('{"body": "no text field"}\n')
    write_jsonl(tmp_path / "eval.jsonl", unique_docs(3, seed=2))
    config = DecontaminateConfig(
        inputs=[str(tmp_path / "in")], evaluation=[str(tmp_path / "eval.jsonl")], output=str(tmp_path / "out")
    )
    with pytest.raises(
        DecontaminateError, match=r"b.jsonl line 1: no text field 'text' \(found: \['body'\]\)"
    ):
        decontaminate(config)
    (work,) = (tmp_path / "out" / ".work").rglob("a.jsonl.ngrams.json")
    before = work.stat().st_mtime_ns
    write_jsonl(tmp_path / "in" / "b.jsonl", unique_docs(2, seed=3))
    decontaminate(config)
    assert work.stat().st_mtime_ns == before
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["total"]["documents_out"] == 7


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"evaluation": []}, "evaluation", "no evaluation data given"),
        ({"inputs": []}, "inputs", "no inputs given"),
        ({"ngram": 0}, "ngram", "ngram must be a positive integer"),
        ({"max_matches": 0}, "max_matches", "max_matches must be a positive integer"),
    ],
)
def test_bad_parameters_are_one_clear_error(kwargs, field, message):
    with pytest.raises(StepDeclarationError, match=message) as info:
        decontaminate_step(
            "decontaminate/bad", **{"inputs": ["x.jsonl"], "evaluation": ["v.jsonl"], **kwargs}
        )
    assert info.value.field == field and "step 'decontaminate/bad'" in str(info.value)


def test_every_string_of_an_evaluation_record_is_checked(tmp_path):
    target = " ".join(f"w{i}" for i in range(15))
    write_jsonl(tmp_path / "train.jsonl", [f"x {target} y", "unrelated text"])
    (tmp_path / "eval.jsonl").write_text(json.dumps({"query": "short", "choices": ["no", target]}) + "\n")
    out = tmp_path / "out"
    decontaminate(
        DecontaminateConfig(
            inputs=[str(tmp_path / "train.jsonl")], evaluation=[str(tmp_path / "eval.jsonl")], output=str(out)
        )
    )
    assert json.loads((out / "stats.json").read_text())["total"]["documents_removed"] == 1
    (evidence,) = read_evidence(str(out))
    assert evidence["index"] == 0 and evidence["detail"]["matched"] == [
        {"file": str(tmp_path / "eval.jsonl"), "index": 0}
    ]


def test_a_line_text_mode_found_blank_is_a_record_named_in_an_error(tmp_path):
    """Regression: a line holding only a no-break space was no record to the reader and one to
    the writer: a bare IndexError (or, elsewhere in a shard, the wrong documents kept)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes('{"text": "one two three"}\n\u00a0\n'.encode())
    write_jsonl(tmp_path / "eval.jsonl", unique_docs(3, seed=2))
    config = DecontaminateConfig(
        inputs=[str(tmp_path / "in")], evaluation=[str(tmp_path / "eval.jsonl")], output=str(tmp_path / "out")
    )
    with pytest.raises(DecontaminateError, match=r"a.jsonl line 2: malformed JSON"):
        decontaminate(config)
    assert not (tmp_path / "out" / "data").exists()
