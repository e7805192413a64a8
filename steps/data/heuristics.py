"""The `heuristics` step: the published rule sets for web text, each threshold a versioned field.

    clean = heuristics_step("heuristics/web", inputs=[english / "data"])             # all four
    clean = heuristics_step("heuristics/web", inputs=[...], c4=None,                   # three, and
                            gopher_quality=GopherQuality(min_words=20))                # one changed

The rule sets and their defaults are the ones datatrove ships (v0.10), which follow the papers:

    GopherQuality      Rae et al. 2021 (MassiveText), app. A: words per document, mean word
                       length, symbols per word, bullet and ellipsis lines, words with a letter,
                       stop words
    GopherRepetition   the same appendix: duplicate lines and paragraphs (by count and by
                       characters), the most frequent 2-4-gram's share of the characters, the
                       share of characters in duplicated 5-10-grams
    C4Rules            Raffel et al. 2020, sec. 2.2: "lorem ipsum", a curly bracket, and too few
                       sentences in the lines C4 keeps (ending in terminal punctuation, 3 words
                       or more, no "javascript", no cookie or policy notice)
    FineWebRules       Penedo et al. 2024 (FineWeb): lines ending in punctuation, short lines,
                       characters in duplicated lines, newlines per word

A rule whose threshold is None is not applied; a rule set given as None is skipped. The rule sets
run in the order above and a document is removed by the first rule it fails: the evidence names
that rule (`gopher_quality.min_words`, ...), what it measured, and the threshold.

Words are the whitespace-separated tokens with a letter or a digit (datatrove splits with a
language's word tokenizer, so its counts differ a little); beyond ASCII, a character's block says
whether it is punctuation (`steps.data.compiled_loops.word_stats`). Lines are split at newlines. The
word and n-gram counts are compiled passes over a batch's bytes, the line rules plain Python: the
step judges 19.5 to 23 MB of text a second a core (`benchmarks/curation_web.py`, four runs;
datatrove's four filters 0.11).

One departure from C4 as datatrove runs it: there, C4's line rules *rewrite* the document (its
failing lines dropped). Here every filter only removes documents, so that a kept document is the
input's record byte for byte and every change to the data has one reason on record; C4's line
rules decide only whether enough sentences remain.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from pipeline import OutputOf, Resources, Step, StepDeclarationError, step_function, this_output, versioned
from steps.data import filtering
from steps.data.filtering import Removal
from steps.data.sources import RawDataset

__all__ = [
    "C4Rules",
    "FineWebRules",
    "GopherQuality",
    "GopherRepetition",
    "HeuristicsConfig",
    "heuristics",
    "heuristics_step",
    "judge_text",
    "judge_texts",
]


@dataclass(frozen=True)
class GopherQuality:
    """Gopher's quality rules (thresholds; None: not applied)."""

    min_words: int | None = 50
    max_words: int | None = 100_000
    min_mean_word_length: float | None = 3.0
    max_mean_word_length: float | None = 10.0
    max_symbol_word_ratio: float | None = 0.1
    """("#", "...", "…") per word."""
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    min_alpha_words_ratio: float | None = 0.8
    """Words with at least one letter, of all words."""
    min_stop_words: int | None = 2
    """Of "the", "be", "to", "of", "and", "that", "have", "with"."""


@dataclass(frozen=True)
class GopherRepetition:
    """Gopher's repetition rules (fractions; None: not applied)."""

    max_duplicate_line_fraction: float | None = 0.3
    max_duplicate_paragraph_fraction: float | None = 0.3
    max_duplicate_line_char_fraction: float | None = 0.2
    max_duplicate_paragraph_char_fraction: float | None = 0.2
    max_top_ngram_char_fraction: tuple[tuple[int, float], ...] | None = ((2, 0.2), (3, 0.18), (4, 0.16))
    """(n, most): the most frequent n-gram's characters (times its count) of all characters."""
    max_duplicate_ngram_char_fraction: tuple[tuple[int, float], ...] | None = (
        (5, 0.15),
        (6, 0.14),
        (7, 0.13),
        (8, 0.12),
        (9, 0.11),
        (10, 0.10),
    )
    """(n, most): characters inside n-grams seen before in the document, of all characters."""


@dataclass(frozen=True)
class C4Rules:
    """C4's rules, as document rules (see the module docstring)."""

    lorem_ipsum: bool = True
    curly_bracket: bool = True
    min_sentences: int | None = 5
    """Sentences in the lines C4 keeps."""
    min_words_per_line: int = 3
    max_word_length: int = 1000
    """A line with a longer word is not kept."""


@dataclass(frozen=True)
class FineWebRules:
    """FineWeb's rules (thresholds; None: not applied)."""

    min_line_punctuation_ratio: float | None = 0.12
    max_short_line_ratio: float | None = 0.67
    short_line_length: int = 30
    max_duplicate_line_char_ratio: float | None = 0.01
    max_newline_word_ratio: float | None = 0.3


STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


def token_hash(token: str) -> int:
    """The hash `steps.data.compiled_loops.word_stats` gives a token once lower-cased (FNV-1a of its
    UTF-8 bytes), for the stop words it counts."""
    h = 0xCBF29CE484222325
    for byte in token.lower().encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) % (1 << 64)
    return h


_STOP_HASHES = np.array(sorted(token_hash(w) for w in STOP_WORDS), dtype=np.uint64)
_BULLETS = ("\u2022", "\u2023", "\u2043", "\u25e6", "-", "*", "\u00b7")  # bullets, hyphen bullet
_ELLIPSIS = ("...", "…")
_TERMINAL = (".", "!", "?", '"', "'", "\u201d", "\u2019")  # and closing curly quotes
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")


@dataclass(frozen=True)
class HeuristicsConfig:
    """Configuration of the heuristics step."""

    inputs: list[Any]
    """Document shards: paths, globs, directories, `RawDataset`s or `output_of` a step."""
    output: str
    """The step's output directory (`this_output()`)."""
    gopher_quality: GopherQuality | None = field(default_factory=GopherQuality)
    gopher_repetition: GopherRepetition | None = field(default_factory=GopherRepetition)
    c4: C4Rules | None = field(default_factory=C4Rules)
    fineweb: FineWebRules | None = field(default_factory=FineWebRules)
    text_field: str = "text"
    """The field holding a document's text."""
    input_root: str | None = None
    """Directory relative inputs are under; not versioned."""
    num_workers: int = 1
    """Shards processed at once."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs (`steps.data.sources`)."""


def heuristics_step(
    name: str,
    *,
    inputs: Sequence[str | RawDataset | OutputOf],
    gopher_quality: GopherQuality | None = GopherQuality(),
    gopher_repetition: GopherRepetition | None = GopherRepetition(),
    c4: C4Rules | None = C4Rules(),
    fineweb: FineWebRules | None = FineWebRules(),
    text_field: str = "text",
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready heuristics `Step` applying the rule sets given (see the module docstring)."""
    if not inputs:
        raise StepDeclarationError(name, "no inputs given", field="inputs")
    sets = {
        "gopher_quality": gopher_quality,
        "gopher_repetition": gopher_repetition,
        "c4": c4,
        "fineweb": fineweb,
    }
    kinds = {
        "gopher_quality": GopherQuality,
        "gopher_repetition": GopherRepetition,
        "c4": C4Rules,
        "fineweb": FineWebRules,
    }
    for key, rules in sets.items():
        if rules is not None:
            _check_rules(name, key, rules, kinds[key])
    if all(rules is None for rules in sets.values()):
        raise StepDeclarationError(name, "every rule set is None: nothing to apply", field="gopher_quality")
    return Step(
        name=name,
        fn=heuristics,
        config=HeuristicsConfig(
            inputs=list(inputs),
            output=this_output(),
            gopher_quality=versioned(gopher_quality),
            gopher_repetition=versioned(gopher_repetition),
            c4=versioned(c4),
            fineweb=versioned(fineweb),
            text_field=versioned(text_field),
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned(filtering.inputs_identity(inputs, input_root)),
        ),
        description=f"heuristic filters {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


def _check_rules(step: str, key: str, rules: Any, kind: type) -> None:
    if not isinstance(rules, kind):
        raise StepDeclarationError(step, f"{key} must be a {kind.__name__} or None, got {rules!r}", field=key)
    for f in fields(rules):
        value = getattr(rules, f.name)
        where = f"{key}.{f.name}"
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, tuple):
            for pair in value:
                ok = isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int) and pair[0] >= 1
                if not ok:
                    raise StepDeclarationError(
                        step, f"{where} must be (n, fraction) pairs, got {value!r}", field=where
                    )
                filtering.check_number(step, where, pair[1], 0.0, 1.0)
            continue
        high = 1.0 if ("ratio" in f.name or "fraction" in f.name) and "word_ratio" not in f.name else None
        filtering.check_number(step, where, value, 0.0, high)


# -- the rules ------------------------------------------------------------------------------------


def judge_texts(config: HeuristicsConfig, texts: Sequence[str]) -> list[Removal | None]:
    """The first rule each text fails (None: it passes them all). A batch at once: its words are
    counted, and their n-grams, in compiled passes (`steps.data.compiled_loops.word_stats` and
    `repetition_counts`); what remains in Python works on lines."""
    stats = WordStats.of(texts, config.gopher_repetition)
    return [_judge(config, text, stats, i) for i, text in enumerate(texts)]


@dataclass(frozen=True)
class WordStats:
    """Per text of a batch: (words, their characters, words with a letter, stop words), and the
    top and duplicate n-gram characters of the repetition rules (None without them)."""

    counts: np.ndarray
    top: np.ndarray | None
    dup: np.ndarray | None

    @classmethod
    def of(cls, texts: Sequence[str], repetition: GopherRepetition | None) -> WordStats:
        """The batch's counts (see the class docstring)."""
        from steps.data.compiled_loops import repetition_counts, word_stats

        encoded = [t.encode("utf-8") for t in texts]
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        counts, hashes, lengths, first = word_stats(data, offsets, _STOP_HASHES)
        if repetition is None or not (
            repetition.max_top_ngram_char_fraction or repetition.max_duplicate_ngram_char_fraction
        ):
            return cls(counts, None, None)
        top_ns = np.array([n for n, _ in repetition.max_top_ngram_char_fraction or ()], dtype=np.int64)
        dup_ns = np.array([n for n, _ in repetition.max_duplicate_ngram_char_fraction or ()], dtype=np.int64)
        top, dup = repetition_counts(hashes, lengths, first, top_ns, dup_ns)
        return cls(counts, top, dup)


def judge_text(config: HeuristicsConfig, text: str) -> Removal | None:
    """The first rule `text` fails (None: it passes them all)."""
    return judge_texts(config, [text])[0]


def _judge(config: HeuristicsConfig, text: str, stats: WordStats, i: int) -> Removal | None:
    # A document's lines, once for every rule: split at "\n", stripped, the empty ones dropped.
    lines = [line for line in map(str.strip, text.split("\n")) if line]
    if config.gopher_quality is not None and (
        removal := _gopher_quality(config.gopher_quality, text, lines, stats.counts[i])
    ):
        return removal
    if config.gopher_repetition is not None and (
        removal := _gopher_repetition(
            config.gopher_repetition,
            text,
            lines,
            None if stats.top is None else stats.top[i],
            None if stats.dup is None else stats.dup[i],
        )
    ):
        return removal
    if config.c4 is not None and (removal := _c4(config.c4, text, lines)):
        return removal
    if config.fineweb is not None and (
        removal := _fineweb(config.fineweb, text, lines, int(stats.counts[i, 0]))
    ):
        return removal
    return None


def _fail(rule: str, measured: float, threshold: Any) -> Removal:
    return Removal(rule, measured, {"threshold": threshold})


def _gopher_quality(rules: GopherQuality, text: str, lines: list[str], counts: np.ndarray) -> Removal | None:
    n, chars, alpha, stop = (int(x) for x in counts)
    if rules.min_words is not None and n < rules.min_words:
        return _fail("gopher_quality.min_words", n, rules.min_words)
    if rules.max_words is not None and n > rules.max_words:
        return _fail("gopher_quality.max_words", n, rules.max_words)
    mean = chars / n if n else 0.0
    if rules.min_mean_word_length is not None and mean < rules.min_mean_word_length:
        return _fail("gopher_quality.min_mean_word_length", mean, rules.min_mean_word_length)
    if rules.max_mean_word_length is not None and mean > rules.max_mean_word_length:
        return _fail("gopher_quality.max_mean_word_length", mean, rules.max_mean_word_length)
    if rules.max_symbol_word_ratio is not None and n:
        symbols = text.count("#") + sum(text.count(e) for e in _ELLIPSIS)
        if symbols / n > rules.max_symbol_word_ratio:
            return _fail("gopher_quality.max_symbol_word_ratio", symbols / n, rules.max_symbol_word_ratio)
    if lines and rules.max_bullet_lines_ratio is not None:
        ratio = sum(map(str.startswith, lines, itertools.repeat(_BULLETS))) / len(lines)
        if ratio > rules.max_bullet_lines_ratio:
            return _fail("gopher_quality.max_bullet_lines_ratio", ratio, rules.max_bullet_lines_ratio)
    if lines and rules.max_ellipsis_lines_ratio is not None:
        ratio = sum(map(str.endswith, lines, itertools.repeat(_ELLIPSIS))) / len(lines)
        if ratio > rules.max_ellipsis_lines_ratio:
            return _fail("gopher_quality.max_ellipsis_lines_ratio", ratio, rules.max_ellipsis_lines_ratio)
    if rules.min_alpha_words_ratio is not None and n and alpha / n < rules.min_alpha_words_ratio:
        return _fail("gopher_quality.min_alpha_words_ratio", alpha / n, rules.min_alpha_words_ratio)
    if rules.min_stop_words is not None and stop < rules.min_stop_words:
        return _fail("gopher_quality.min_stop_words", stop, rules.min_stop_words)
    return None


def _duplicates(items: list[str]) -> tuple[int, int]:
    """(items equal to an earlier one, their characters): all of them less one of each."""
    distinct = set(items)
    return len(items) - len(distinct), sum(map(len, items)) - sum(map(len, distinct))


def _gopher_repetition(
    rules: GopherRepetition, text: str, lines: list[str], top: np.ndarray | None, dup: np.ndarray | None
) -> Removal | None:
    size = len(text)
    if not size:
        return None
    # (str.split, not re.split: C speed; the same pieces once stripped and the empty ones dropped)
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    count, chars = _duplicates(paragraphs)
    most = rules.max_duplicate_paragraph_fraction
    if paragraphs and most is not None and count / len(paragraphs) > most:
        return _fail("gopher_repetition.max_duplicate_paragraph_fraction", count / len(paragraphs), most)
    most = rules.max_duplicate_paragraph_char_fraction
    if most is not None and chars / size > most:
        return _fail("gopher_repetition.max_duplicate_paragraph_char_fraction", chars / size, most)
    count, chars = _duplicates(lines)
    most = rules.max_duplicate_line_fraction
    if lines and most is not None and count / len(lines) > most:
        return _fail("gopher_repetition.max_duplicate_line_fraction", count / len(lines), most)
    most = rules.max_duplicate_line_char_fraction
    if most is not None and chars / size > most:
        return _fail("gopher_repetition.max_duplicate_line_char_fraction", chars / size, most)
    if top is None or dup is None:
        return None
    for k, (n, most) in enumerate(rules.max_top_ngram_char_fraction or ()):
        if top[k] / size > most:
            return _fail(f"gopher_repetition.top_{n}gram_char_fraction", top[k] / size, most)
    for k, (n, most) in enumerate(rules.max_duplicate_ngram_char_fraction or ()):
        if dup[k] / size > most:
            return _fail(f"gopher_repetition.duplicate_{n}gram_char_fraction", dup[k] / size, most)
    return None


def _c4(rules: C4Rules, text: str, lines: list[str]) -> Removal | None:
    lowered = text.lower()
    if rules.lorem_ipsum and "lorem ipsum" in lowered:
        return _fail("c4.lorem_ipsum", 1.0, True)
    if rules.curly_bracket and "{" in text:
        return _fail("c4.curly_bracket", 1.0, True)
    if rules.min_sentences is None:
        return None
    # Lines with javascript or a policy notice are rare: look for them in the whole text first.
    notices = "javascript" in lowered or any(p in lowered for p in _POLICY)
    kept = []
    for line in lines:
        if (
            not line.endswith(_TERMINAL)
            or len(line.split(None, rules.min_words_per_line)) < rules.min_words_per_line
            or (len(line) > rules.max_word_length and max(map(len, line.split())) > rules.max_word_length)
        ):
            continue
        if notices and ("javascript" in (low := line.lower()) or any(p in low for p in _POLICY)):
            continue
        kept.append(line)
    sentences = sum(1 for _ in itertools.islice(_SENTENCE_END.finditer("\n".join(kept)), rules.min_sentences))
    if sentences < rules.min_sentences:
        return _fail("c4.min_sentences", sentences, rules.min_sentences)
    return None


def _fineweb(rules: FineWebRules, text: str, lines: list[str], words: int) -> Removal | None:
    if not lines:
        return None
    if rules.min_line_punctuation_ratio is not None:
        ratio = sum(map(str.endswith, lines, itertools.repeat(_TERMINAL))) / len(lines)
        if ratio < rules.min_line_punctuation_ratio:
            return _fail("fineweb.min_line_punctuation_ratio", ratio, rules.min_line_punctuation_ratio)
    if rules.max_short_line_ratio is not None:
        ratio = sum(map(rules.short_line_length.__ge__, map(len, lines))) / len(lines)
        if ratio > rules.max_short_line_ratio:
            return _fail("fineweb.max_short_line_ratio", ratio, rules.max_short_line_ratio)
    if rules.max_duplicate_line_char_ratio is not None:
        _count, chars = _duplicates(lines)
        ratio = chars / max(1, len(text.replace("\n", "")))
        if ratio > rules.max_duplicate_line_char_ratio:
            return _fail("fineweb.max_duplicate_line_char_ratio", ratio, rules.max_duplicate_line_char_ratio)
    if rules.max_newline_word_ratio is not None and words:
        ratio = text.count("\n") / words
        if ratio > rules.max_newline_word_ratio:
            return _fail("fineweb.max_newline_word_ratio", ratio, rules.max_newline_word_ratio)
    return None


# -- the step function ------------------------------------------------------------------------------


def _judge_records(config: HeuristicsConfig, records: Sequence[Any]) -> list[Removal | None]:
    return judge_texts(config, [record[config.text_field] for record in records])


def _report(config: HeuristicsConfig) -> str | None:
    return filtering.report(config.output)


@step_function(inputs=filtering.input_listing, report=_report, check=filtering.check_local_inputs)
def heuristics(config: HeuristicsConfig) -> None:
    """Apply the rule sets of `config` to `config.inputs`, into `config.output`."""
    parameters: dict[str, Any] = {
        key: None if getattr(config, key) is None else dataclasses.asdict(getattr(config, key))
        for key in ("gopher_quality", "gopher_repetition", "c4", "fineweb")
    }
    parameters["text_field"] = config.text_field
    filtering.filter_shards(
        config.output,
        filtering.input_shards(config),
        functools.partial(_judge_records, config),
        config.text_field,
        config.num_workers,
        parameters,
    )
