"""The quality classifier is a step: it learns to tell its two sets apart (measured on documents
it did not see), its identity covers both sets and every setting, and the filter removes what it
scores low with the score in the evidence."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from pipeline.core.dag import build_dag
from steps.data.filtering import read_evidence
from steps.data.quality import QualityClassifier, features, fit, quality_classifier_step, quality_filter_step
from tests.steps.data.test_dedupe import write_jsonl

NOUNS = [
    "river",
    "bridge",
    "garden",
    "school",
    "market",
    "forest",
    "harbour",
    "kitchen",
    "library",
    "village",
]
PEOPLE = ["Ivy", "Max", "Rosa", "Finn", "Nora", "Ella"]
PRODUCTS = ["running shoes", "phone cases", "vitamins", "headphones", "garden tools"]


def story(rng: random.Random) -> str:
    return " ".join(
        f"{rng.choice(PEOPLE)} walked to the {rng.choice(NOUNS)}, then at the {rng.choice(NOUNS)}."
        for _ in range(rng.randint(4, 8))
    )


def bait(rng: random.Random) -> str:
    return " ".join(
        f"Buy {rng.choice(['cheap', 'premium', 'discount'])} {rng.choice(PRODUCTS)} online and save "
        f"{rng.randint(5, 50)} percent today, click here for the best deals."
        for _ in range(rng.randint(4, 8))
    )


def sets(tmp_path, n: int = 120) -> None:
    rng = random.Random(1)
    write_jsonl(tmp_path / "good" / "a.jsonl", [story(rng) for _ in range(n)])
    write_jsonl(tmp_path / "bad" / "a.jsonl", [bait(rng) for _ in range(n)])


def test_the_classifier_learns_its_sets_and_the_filter_removes_what_it_scores_low(tmp_path):
    sets(tmp_path)
    rng = random.Random(9)
    crawl = [story(rng), bait(rng), story(rng), bait(rng) + " " + story(rng)[:40]]
    write_jsonl(tmp_path / "crawl" / "a.jsonl", crawl)
    classifier = quality_classifier_step(
        "quality/classifier", positive=["good"], negative=["bad"], input_root=str(tmp_path)
    )
    good = quality_filter_step(
        "quality/web", inputs=["crawl"], classifier=classifier, input_root=str(tmp_path)
    )
    assert run_experiment([good], ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local")).ok
    (model_dir,) = (tmp_path / "prefix" / "quality").glob("classifier-*")
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["documents"] == {"positive": 120, "negative": 120}
    held_out = metrics["validation"]
    assert held_out["documents"] == 24 and held_out["accuracy"] == 1.0  # 12 of each set, unseen
    assert held_out["mean_score_positive"] > 0.7 > 0.3 > held_out["mean_score_negative"]
    (out,) = (tmp_path / "prefix" / "quality").glob("web-*")
    kept = [
        json.loads(line)["text"] for line in (out / "data" / "crawl" / "a.jsonl").read_text().splitlines()
    ]
    assert kept == [crawl[0], crawl[2]]
    evidence = list(read_evidence(str(out)))
    assert [(e["index"], e["reason"]) for e in evidence] == [(1, "quality"), (3, "quality")]
    scores = QualityClassifier.load(str(model_dir)).score([crawl[1], crawl[3]])
    assert [e["score"] for e in evidence] == pytest.approx(scores.tolist(), abs=1e-6)
    assert all(e["score"] < 0.5 and e["detail"] == {"threshold": 0.5} for e in evidence)


def test_the_classifiers_identity_covers_its_sets_and_settings_and_the_filters_follow(tmp_path):
    sets(tmp_path, n=4)
    write_jsonl(tmp_path / "crawl" / "a.jsonl", ["x"])

    def labels(**settings) -> tuple[str, str]:
        classifier = quality_classifier_step(
            "quality/c", positive=["good"], negative=["bad"], input_root=str(tmp_path), **settings
        )
        good = quality_filter_step(
            "quality/f", inputs=["crawl"], classifier=classifier, input_root=str(tmp_path)
        )
        labels = list(build_dag([good], str(tmp_path / "prefix")).nodes)  # in topological order
        assert labels[0].startswith("quality/c-") and labels[1].startswith("quality/f-")
        return labels[0], labels[1]

    base = labels()
    for change in ({"ngrams": 1}, {"buckets": 1 << 12}, {"l2": 1e-3}, {"max_documents": 100}):
        changed = labels(**change)
        assert changed[0] != base[0] and changed[1] != base[1], change
    # Another set is another classifier (a raw file edited in place is drift the plan notes, as
    # for every step reading raw files: steps.data.sources).
    write_jsonl(tmp_path / "worse" / "a.jsonl", ["another negative document"])
    classifier = quality_classifier_step(
        "quality/c", positive=["good"], negative=["worse"], input_root=str(tmp_path)
    )
    assert next(iter(build_dag([classifier], str(tmp_path / "prefix")).nodes)) != base[0]


def test_features_are_unit_rows_of_hashed_ngrams_and_fit_separates_a_toy_problem():
    x = features(["a b a", "c d", ""], ngrams=2, buckets=64)
    assert x.shape == (3, 64)
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    assert norms[:2] == pytest.approx([1.0, 1.0]) and norms[2] == 0.0
    # "a" twice; "b", "a b" and "b a" once (in buckets of their own here): counts, then scaled
    assert sorted((x[0].data / x[0].data.min()).round(6).tolist()) == [1, 1, 1, 2]
    texts = ["good words here"] * 5 + ["bad spam there"] * 5
    y = np.array([1.0] * 5 + [0.0] * 5)
    weights, bias = fit(features(texts, 1, 64), y, l2=1e-4)
    scores = QualityClassifier(weights, bias, 1).score(texts)
    assert (scores[:5] > 0.9).all() and (scores[5:] < 0.1).all()
    # Scoring without the matrix is the model's definition: sigmoid(features @ weights + bias).
    mixed = ["good spam words", "", "there there bad", "good words here " * 30]
    expected = 1 / (1 + np.exp(-(features(mixed, 2, 64) @ np.resize(weights, 64) + bias)))
    assert QualityClassifier(np.resize(weights, 64), bias, 2).score(mixed) == pytest.approx(
        expected, abs=1e-12
    )


def test_bad_declarations_name_the_field(tmp_path):
    with pytest.raises(StepDeclarationError, match="no negative documents") as e:
        quality_classifier_step("quality/c", positive=["a.jsonl"], negative=[])
    assert e.value.field == "negative"
    with pytest.raises(StepDeclarationError, match="validation_fraction"):
        quality_classifier_step("quality/c", positive=["a"], negative=["b"], validation_fraction=0.9)
    with pytest.raises(StepDeclarationError, match="buckets must be an integer"):
        quality_classifier_step("quality/c", positive=["a"], negative=["b"], buckets=1.5)
    from steps.data.language import language_step

    with pytest.raises(StepDeclarationError, match="classifier must be a quality_classifier_step"):
        quality_filter_step("quality/f", inputs=["a"], classifier=language_step("language/x", inputs=["a"]))
    classifier = quality_classifier_step("quality/c", positive=["a"], negative=["b"])
    with pytest.raises(StepDeclarationError, match="min_score"):
        quality_filter_step("quality/f", inputs=["a"], classifier=classifier, min_score=2)
