"""The heuristics step: each published rule removes what it is meant to, names itself and what it
measured, and each threshold is a versioned field."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter

import pytest

from pipeline import ExecutorMainConfig, StepDeclarationError, run_experiment
from pipeline.core.dag import build_dag
from steps.data.filtering import read_evidence
from steps.data.heuristics import (
    STOP_WORDS,
    C4Rules,
    FineWebRules,
    GopherQuality,
    GopherRepetition,
    HeuristicsConfig,
    WordStats,
    heuristics_step,
    judge_text,
)
from tests.steps.data.test_dedupe import write_jsonl

GOOD = (
    "The harbour town wakes slowly on winter mornings, when fog still hides the fishing boats.\n"
    "Bakers open their shops before dawn and the smell of fresh bread drifts along the quay.\n"
    "Children walk to school across the old stone bridge, counting the gulls that circle overhead.\n"
    "By noon the market square is crowded with farmers selling apples, cheese and honey from the hills.\n"
    "In the evening, families gather in small kitchens to talk about the weather and the day's catch.\n"
    "Visitors who arrive in summer find a different place, full of music, boats and bright umbrellas."
)
RULES = HeuristicsConfig(inputs=[], output="")


def reason(text: str, config: HeuristicsConfig = RULES) -> str | None:
    removal = judge_text(config, text)
    return None if removal is None else removal.reason


def test_a_plain_article_passes_every_rule():
    assert reason(GOOD) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Too short to be a page.", "gopher_quality.min_words"),
        (" ".join(["a b c d"] * 30), "gopher_quality.min_mean_word_length"),
        (GOOD + " " + "#tag " * 20, "gopher_quality.max_symbol_word_ratio"),
        (
            "\n".join(f"- item number {i} in a long list of things" for i in range(12)),
            "gopher_quality.max_bullet_lines_ratio",
        ),
        (
            "\n".join(
                f"Invoice {100000 + i} {200000 + i} {300000 + i} {400000 + i} {500000 + i}" for i in range(20)
            ),
            "gopher_quality.min_alpha_words_ratio",
        ),
        (" ".join(f"cheap shoes sale number{i}" for i in range(20)), "gopher_quality.min_stop_words"),
        (
            "\n\n".join([GOOD] * 2 + ["A closing paragraph of its own, with the usual words in it."]),
            "gopher_repetition.max_duplicate_paragraph_fraction",
        ),
        (GOOD + "\n" + " ".join(GOOD.split()[:40]), "gopher_repetition.duplicate_5gram_char_fraction"),
        (GOOD + "\nLorem ipsum dolor sit amet, consectetur adipiscing elit.", "c4.lorem_ipsum"),
        (GOOD + "\nfunction track() { return 1; }", "c4.curly_bracket"),
        (
            "\n".join(line.rstrip(".") for line in GOOD.splitlines()) + "\nThe end of the story is near.",
            "c4.min_sentences",
        ),
    ],
)
def test_each_rule_removes_what_it_is_for_and_names_itself(text, expected):
    assert reason(text) == expected


def test_fineweb_rules_each_remove_their_case():
    only = HeuristicsConfig(inputs=[], output="", gopher_quality=None, gopher_repetition=None, c4=None)
    no_punctuation = "\n".join(line.rstrip(".") for line in GOOD.splitlines())
    assert reason(no_punctuation, only) == "fineweb.min_line_punctuation_ratio"
    short = GOOD + "\n" + "\n".join(f"Short line {i}." for i in range(20))
    assert reason(short, only) == "fineweb.max_short_line_ratio"
    repeated = GOOD + "\n" + GOOD.splitlines()[0]
    assert reason(repeated, only) == "fineweb.max_duplicate_line_char_ratio"
    listy = "\n".join(dict.fromkeys(GOOD.split()))  # one word a line, none twice
    assert reason(
        listy,
        dataclasses.replace(
            only, fineweb=FineWebRules(min_line_punctuation_ratio=None, max_short_line_ratio=None)
        ),
    ) == ("fineweb.max_newline_word_ratio")


def test_a_threshold_of_none_or_a_rule_set_of_none_is_not_applied():
    short = "Too short to be a page."
    assert reason(short, dataclasses.replace(RULES, gopher_quality=GopherQuality(min_words=None))) != (
        "gopher_quality.min_words"
    )
    everything_off = HeuristicsConfig(
        inputs=[], output="", gopher_quality=None, gopher_repetition=None, c4=None, fineweb=None
    )
    assert reason(short, everything_off) is None
    removal = judge_text(RULES, short)
    assert removal.score == 6 and removal.detail == {"threshold": 50}  # "page." is a word


def test_the_step_keeps_records_byte_for_byte_and_writes_the_evidence(tmp_path):
    texts = [
        GOOD,
        "Too short to be a page.",
        GOOD.replace("harbour", "mountain"),
        GOOD + "\nLorem ipsum dolor.",
    ]
    write_jsonl(tmp_path / "in" / "a.jsonl", texts)
    step = heuristics_step("heuristics/web", inputs=["in"], input_root=str(tmp_path))
    assert run_experiment([step], ExecutorMainConfig(prefix=str(tmp_path / "prefix"), backend="local")).ok
    (out,) = (tmp_path / "prefix" / "heuristics").glob("web-*")
    source = (tmp_path / "in" / "a.jsonl").read_bytes().splitlines(keepends=True)
    assert (out / "data" / "in" / "a.jsonl").read_bytes() == source[0] + source[2]
    evidence = list(read_evidence(str(out)))
    assert [(e["file"], e["index"], e["reason"]) for e in evidence] == [
        ("in/a.jsonl", 1, "gopher_quality.min_words"),
        ("in/a.jsonl", 3, "c4.lorem_ipsum"),
    ]
    assert evidence[0]["excerpt"] == texts[1] and evidence[0]["bytes"] == len(texts[1])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total"]["documents_removed"] == 2 and stats["total"]["documents_kept"] == 2
    assert stats["total"]["reasons"]["c4.lorem_ipsum"] == {"documents": 1, "bytes": len(texts[3].encode())}
    assert stats["parameters"]["gopher_quality"]["min_words"] == 50


def test_each_threshold_is_part_of_the_identity_and_a_bad_one_names_its_field(tmp_path):
    def identity(**rules) -> str:
        step = heuristics_step("heuristics/web", inputs=["in"], input_root=str(tmp_path), **rules)
        (node,) = build_dag([step], str(tmp_path / "prefix")).nodes.values()
        return node.label

    write_jsonl(tmp_path / "in" / "a.jsonl", [GOOD])
    base = identity()
    assert identity(gopher_quality=GopherQuality(min_words=40)) != base
    assert identity(gopher_repetition=GopherRepetition(max_duplicate_ngram_char_fraction=((5, 0.2),))) != base
    assert identity(c4=None) != base
    assert identity(c4=C4Rules()) == base
    with pytest.raises(StepDeclarationError, match=r"gopher_quality\.max_bullet_lines_ratio") as e:
        heuristics_step(
            "heuristics/web", inputs=["in"], gopher_quality=GopherQuality(max_bullet_lines_ratio=1.5)
        )
    assert e.value.field == "gopher_quality.max_bullet_lines_ratio"
    with pytest.raises(StepDeclarationError, match=r"gopher_repetition\.max_top_ngram_char_fraction"):
        heuristics_step(
            "heuristics/web",
            inputs=["in"],
            gopher_repetition=GopherRepetition(max_top_ngram_char_fraction=((0, 0.2),)),
        )
    with pytest.raises(StepDeclarationError, match="c4 must be a C4Rules"):
        heuristics_step("heuristics/web", inputs=["in"], c4={"lorem_ipsum": True})


# -- the compiled counts against their definitions in plain Python ---------------------------------


def _is_word(token: str) -> bool:
    """A token with a letter or digit; beyond ASCII, Unicode's categories (letters, marks and
    numbers count; punctuation, symbols do not) for the characters used below."""
    return any(c.isalnum() for c in token)


def _top_ngram_chars(words: list[str], n: int) -> int:
    """datatrove's find_top_duplicate over its n-grams joined by spaces."""
    if len(words) < n:
        return 0
    counts = Counter(" ".join(g) for g in zip(*(words[i:] for i in range(n)), strict=False))
    ngram, count = counts.most_common(1)[0]
    return len(ngram) * count


def _duplicate_ngram_chars(words: list[str], n: int) -> int:
    """datatrove's find_all_duplicate."""
    seen, chars, i = set(), 0, 0
    while i + n <= len(words):
        ngram = "".join(words[i : i + n])
        if ngram in seen:
            chars += len(ngram)
            i += n
        else:
            seen.add(ngram)
            i += 1
    return chars


def test_the_compiled_word_and_ngram_counts_are_their_definitions():
    rng = random.Random(5)
    vocabulary = [
        "the",
        "The",
        "cat",
        "café",
        "naïve",
        "42",
        "x1",
        "—",
        "…",
        "•",
        "€",
        "...",
        "-",
        "“quoted”",
        "and",
        "🙂",
        "_",
        "日本",
    ]
    texts = []
    for _ in range(300):
        words = [rng.choice(vocabulary[: rng.randint(3, len(vocabulary))]) for _ in range(rng.randint(0, 60))]
        separators = [rng.choice([" ", " ", "\n", "\t", "\u00a0", "  "]) for _ in words]
        texts.append("".join(w + s for w, s in zip(words, separators, strict=True)))
    texts += ["", "   ", "one", "a b a b a b a b"]
    repetition = GopherRepetition()
    stats = WordStats.of(texts, repetition)
    for i, text in enumerate(texts):
        words = [t for t in text.split() if _is_word(t)]
        letters = sum(any(c.isalpha() for c in w) for w in words)
        stop = sum(t.lower() in STOP_WORDS for t in text.split())
        assert stats.counts[i].tolist() == [len(words), sum(map(len, words)), letters, stop], text
        top = [_top_ngram_chars(words, n) for n, _ in repetition.max_top_ngram_char_fraction]
        dup = [_duplicate_ngram_chars(words, n) for n, _ in repetition.max_duplicate_ngram_char_fraction]
        assert (stats.top[i].tolist(), stats.dup[i].tolist()) == (top, dup), text
