"""The `language` step: keep the documents written in the languages asked for.

    english = language_step("language/web", inputs=[extracted / "data"], languages=["en"])

Identification is py3langid's (a numpy port of langid.py; version 0.4's model has 142 labels,
inside the package, so nothing is downloaded at run time). It was chosen over lingua, whose models are
larger and slower per byte (the accuracy lingua gains is on short texts, single lines; documents
here are pages), and over fastText's lid.176, which is a download. A document is kept when its
most likely language is one of `languages` with a probability of at least `min_score`; else it
is removed with the reason `language` (another language; the evidence names it) or
`language_score` (one of `languages`, but not surely). Newlines count as spaces, and only the
first `max_chars` characters are read: a page's language is settled well before its end.

Output as every filter step's (`steps.data.filtering`): the kept shards, the evidence, stats.json.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline import OutputOf, Resources, Step, StepDeclarationError, step_function, this_output, versioned
from steps.data import filtering
from steps.data.filtering import Removal
from steps.data.sources import RawDataset

__all__ = ["LANGUAGES", "LanguageConfig", "identify", "language_filter", "language_step"]

LANGUAGES = frozenset(
    [
        "ace",
        "af",
        "am",
        "an",
        "ar",
        "ary",
        "arz",
        "as",
        "az",
        "ba",
        "bcl",
        "be",
        "bg",
        "bn",
        "br",
        "bs",
        "ca",
        "crh",
        "cs",
        "cy",
        "da",
        "de",
        "dz",
        "el",
        "en",
        "eo",
        "es",
        "et",
        "eu",
        "ext",
        "fa",
        "fi",
        "fo",
        "fr",
        "fuv",
        "fy",
        "ga",
        "gcf",
        "gcr",
        "gd",
        "gl",
        "gom",
        "grc",
        "gu",
        "gug",
        "guw",
        "ha",
        "hbo",
        "he",
        "hi",
        "hr",
        "ht",
        "hu",
        "hy",
        "id",
        "ig",
        "is",
        "it",
        "ja",
        "jv",
        "ka",
        "kab",
        "kik",
        "kk",
        "km",
        "kn",
        "ko",
        "ku",
        "ky",
        "la",
        "lb",
        "lg",
        "lij",
        "ln",
        "lo",
        "lt",
        "ltg",
        "lv",
        "mg",
        "mk",
        "ml",
        "mn",
        "mr",
        "ms",
        "mt",
        "my",
        "ne",
        "nl",
        "nn",
        "no",
        "nso",
        "oc",
        "om",
        "or",
        "pa",
        "pcm",
        "pl",
        "ps",
        "pt",
        "qu",
        "ro",
        "ru",
        "rw",
        "sa",
        "sdh",
        "se",
        "si",
        "sk",
        "sl",
        "sn",
        "so",
        "sq",
        "sr",
        "st",
        "sv",
        "sw",
        "ta",
        "te",
        "tg",
        "th",
        "tk",
        "tl",
        "tr",
        "tt",
        "ug",
        "uk",
        "ur",
        "uz",
        "uzs",
        "vec",
        "vi",
        "vo",
        "wa",
        "wuu",
        "xh",
        "yo",
        "yue",
        "zh",
        "zu",
        "zxx",
    ]
)
"""The codes py3langid's model knows (checked against it by the tests): a declaration is checked
without loading the model."""


@dataclass(frozen=True)
class LanguageConfig:
    """Configuration of the language step."""

    inputs: list[Any]
    """Document shards: paths, globs, directories, `RawDataset`s or `output_of` a step."""
    output: str
    """The step's output directory (`this_output()`)."""
    languages: list[str] = field(default_factory=lambda: ["en"])
    """ISO 639-1 codes of the languages kept."""
    min_score: float = 0.65
    """The least probability of the language found for a document to be kept."""
    max_chars: int = 4000
    """Characters read from each document's start."""
    text_field: str = "text"
    """The field holding a document's text."""
    input_root: str | None = None
    """Directory relative inputs are under; not versioned."""
    num_workers: int = 1
    """Shards processed at once."""
    input_identity: dict[str, Any] = field(default_factory=dict)
    """What identity takes from the inputs (`steps.data.sources`)."""


def language_step(
    name: str,
    *,
    inputs: Sequence[str | RawDataset | OutputOf],
    languages: Sequence[str] = ("en",),
    min_score: float = 0.65,
    max_chars: int = 4000,
    text_field: str = "text",
    input_root: str | None = None,
    num_workers: int = 1,
    resources: Resources | None = None,
) -> Step:
    """A ready language `Step` keeping `languages` (see the module docstring)."""
    if not inputs:
        raise StepDeclarationError(name, "no inputs given", field="inputs")
    if not languages or isinstance(languages, str):
        raise StepDeclarationError(
            name, "languages must be a non-empty list of codes, e.g. ['en']", field="languages"
        )
    for code in languages:
        if code not in LANGUAGES:
            raise StepDeclarationError(
                name,
                f"unknown language {code!r}; py3langid knows {', '.join(sorted(LANGUAGES))}",
                field="languages",
            )
    filtering.check_number(name, "min_score", min_score, 0.0, 1.0)
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise StepDeclarationError(
            name, f"max_chars must be a positive integer, got {max_chars!r}", field="max_chars"
        )
    return Step(
        name=name,
        fn=language_filter,
        config=LanguageConfig(
            inputs=list(inputs),
            output=this_output(),
            languages=versioned(sorted(languages)),
            min_score=versioned(min_score),
            max_chars=versioned(max_chars),
            text_field=versioned(text_field),
            input_root=input_root,
            num_workers=num_workers,
            input_identity=versioned(filtering.inputs_identity(inputs, input_root)),
        ),
        description=f"keep {', '.join(sorted(languages))}: {name}",
        resources=resources or Resources(cpus=max(1, num_workers)),
    )


@functools.cache
def _identifier() -> Any:
    # Loading the model takes a second or two: once per process.
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray]:
    """py3langid's model as arrays: the DFA (next state, row starts, the feature of each state),
    the number of features, and the feature weights as float32 (the model keeps float16, which
    numpy multiplies four times slower and converts to float32 anyway: the same sums)."""
    identifier = _identifier()
    output = np.asarray(identifier.tk_output, dtype=np.int64)
    nextmove = np.frombuffer(identifier.tk_nextmove, dtype=np.dtype(identifier.tk_nextmove.typecode))
    rowbase = np.asarray(identifier._rowbase, dtype=np.int64)
    return nextmove, rowbase, output, int(output.max()) + 1, identifier.nb_ptc.astype(np.float32)


def identify(text: str, max_chars: int = 4000) -> tuple[str, float]:
    """(language code, probability) of `text`'s first `max_chars` characters: py3langid's
    `classify` (with normalized probabilities), its byte-by-byte walk compiled
    (`steps.data.compiled_loops.dfa_visits`; with the weights in float32, about four times faster in
    all); the rest is py3langid's own arithmetic, and the tests check that the two give the same
    answer to the last bit."""
    from steps.data.compiled_loops import dfa_visits

    identifier = _identifier()
    data = identifier._encode(text[:max_chars].replace("\n", " "))
    nextmove, rowbase, output, features, weights = _tables()
    order, counts = dfa_visits(np.frombuffer(data, dtype=np.uint8), nextmove, rowbase, output, features)
    if len(order):
        scores = np.log1p(counts.astype(np.float32)) @ weights[order] + identifier.nb_pc
    else:
        scores = np.full(len(identifier.nb_classes), 0.0, dtype=np.float32)
    # As py3langid's _decide, with normalized probabilities.
    scores *= 1.0 / math.sqrt(len(data) or 1)
    np.exp(scores - scores.max(), out=scores)
    scores /= scores.sum()
    for i, j in identifier._alias_pairs:
        scores[i] += scores[j]
        scores[j] = 0.0
    best = int(scores.argmax())
    return str(identifier.nb_classes[best]), float(scores[best])


def _judge(config: LanguageConfig, records: Sequence[Any]) -> list[Removal | None]:
    verdicts: list[Removal | None] = []
    for record in records:
        language, score = identify(record[config.text_field], config.max_chars)
        if language not in config.languages:
            verdicts.append(Removal("language", score, {"language": language}))
        elif score < config.min_score:
            verdicts.append(Removal("language_score", score, {"language": language}))
        else:
            verdicts.append(None)
    return verdicts


def _report(config: LanguageConfig) -> str | None:
    return filtering.report(config.output)


@step_function(inputs=filtering.input_listing, report=_report, check=filtering.check_local_inputs)
def language_filter(config: LanguageConfig) -> None:
    """Keep the documents of `config.inputs` in `config.languages`, into `config.output`."""
    parameters = {
        "languages": list(config.languages),
        "min_score": config.min_score,
        "max_chars": config.max_chars,
        "text_field": config.text_field,
    }
    filtering.filter_shards(
        config.output,
        filtering.input_shards(config),
        functools.partial(_judge, config),
        config.text_field,
        config.num_workers,
        parameters,
    )
