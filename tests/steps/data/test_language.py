"""The language step: documents in the languages asked for are kept, the others removed with the
language found; a rerun redoes only unfinished shards; a record without text is named."""

from __future__ import annotations

import json
import random

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from steps.data.filtering import FilterError, read_evidence
from steps.data.language import LANGUAGES, LanguageConfig, identify, language_filter, language_step
from tests.steps.data.test_dedupe import write_jsonl

ENGLISH = "The children walked to school across the old bridge, counting the birds on the river."
FRENCH = "Le matin, la petite ville se réveille lentement sous un ciel gris et Marie prend son vélo."
GERMAN = "Am frühen Morgen liegt noch Nebel über dem kleinen Dorf am See, und der Bäcker öffnet."
NOISE = "zxq 1234 ### ~~ 5678 qq"


def test_the_languages_asked_for_are_kept_and_the_others_removed_with_the_language_found(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [ENGLISH, FRENCH, ENGLISH.upper(), GERMAN, NOISE])
    step = language_step("language/web", inputs=["in"], languages=["en", "de"], input_root=str(tmp_path))
    assert run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local")).ok
    (out,) = (tmp_path / "prefix" / "language").glob("web-*")
    kept = [json.loads(line)["text"] for line in (out / "data" / "in" / "a.jsonl").read_text().splitlines()]
    assert kept == [ENGLISH, ENGLISH.upper(), GERMAN]
    evidence = list(read_evidence(str(out)))
    assert (evidence[0]["index"], evidence[0]["reason"], evidence[0]["detail"]["language"]) == (
        1,
        "language",
        "fr",
    )
    assert evidence[0]["score"] > 0.9
    # The noise is not surely anything: removed either as another language or as unsure.
    assert evidence[1]["index"] == 4 and evidence[1]["reason"] in ("language", "language_score")
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total"]["documents_kept"] == 3 and stats["parameters"]["languages"] == ["de", "en"]


def test_min_score_removes_the_unsure_with_their_own_reason(tmp_path):
    unsure = "the car is red"  # English, but a few words do not say so surely
    assert identify(unsure)[0] == "en" and identify(unsure)[1] < 0.65 < identify(ENGLISH)[1]
    write_jsonl(tmp_path / "in.jsonl", [ENGLISH, unsure])
    config = LanguageConfig(inputs=[str(tmp_path / "in.jsonl")], output=str(tmp_path / "out"))
    language_filter(config)
    (evidence,) = read_evidence(str(tmp_path / "out"))
    assert (evidence["index"], evidence["reason"], evidence["detail"]) == (
        1,
        "language_score",
        {"language": "en"},
    )
    assert evidence["score"] == pytest.approx(identify(unsure)[1], abs=1e-6)


def test_a_record_without_text_names_its_line_and_a_rerun_keeps_finished_shards(tmp_path):
    write_jsonl(tmp_path / "in" / "a.jsonl", [ENGLISH, FRENCH])
    (tmp_path / "in" / "b.jsonl").write_text(json.dumps({"text": ENGLISH}) + "\n" + '{"body": "x"}\n')
    config = LanguageConfig(inputs=["in"], output=str(tmp_path / "out"), input_root=str(tmp_path))
    with pytest.raises(FilterError, match=r"b\.jsonl line 2: no text field 'text' \(found: \['body'\]\)"):
        language_filter(config)
    (work,) = (tmp_path / "out" / ".work").rglob("a.jsonl.json")
    before = work.stat().st_mtime_ns
    write_jsonl(tmp_path / "in" / "b.jsonl", [GERMAN])
    language_filter(config)
    assert work.stat().st_mtime_ns == before  # a was not judged again
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["total"]["documents_kept"] == 1


def test_the_known_languages_are_the_models_and_bad_declarations_name_the_field():
    from steps.data.language import _identifier

    assert set(_identifier().nb_classes) == LANGUAGES
    with pytest.raises(StepDeclarationError, match="unknown language 'english'") as e:
        language_step("language/x", inputs=["a.jsonl"], languages=["english"])
    assert e.value.field == "languages"
    with pytest.raises(StepDeclarationError, match="min_score"):
        language_step("language/x", inputs=["a.jsonl"], min_score=1.5)
    with pytest.raises(StepDeclarationError, match="languages must be a non-empty list"):
        language_step("language/x", inputs=["a.jsonl"], languages="en")


def test_the_compiled_identification_is_py3langids_to_the_last_bit():
    from steps.data.language import _identifier

    rng = random.Random(4)
    words = (ENGLISH + " " + FRENCH + " " + GERMAN + " 日本語 Ünïcödé — “quoted” 42").split()
    texts = ["", "ok", NOISE, ENGLISH.upper(), "x" * 5000]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randint(1, 300))) for _ in range(200)]
    for text in texts:
        language, score = _identifier().classify(text[:4000].replace("\n", " "))
        assert identify(text) == (language, float(score)), text[:80]
