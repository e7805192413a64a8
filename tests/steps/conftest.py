"""Fixtures for the step library: a small tokenizer trained on the fly, small corpora, and the tiny
MoE trained once per session (`trained_tiny`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "while",
    "dogs",
    "ran",
    "far",
    "away",
    "under",
    "green",
    "trees",
    "and",
    "blue",
    "skies",
]


def make_docs(n: int, seed: int = 0, prefix: str = "") -> list[str]:
    """Deterministic small documents."""
    docs = []
    for i in range(n):
        k = (i * 7 + seed) % len(WORDS)
        words = [WORDS[(k + j * 3) % len(WORDS)] for j in range(5 + i % 11)]
        docs.append(prefix + " ".join(words) + f" {i}.")
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for d in docs:
            f.write(json.dumps({field: d, "id": len(d)}) + "\n")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer directory, trained in a second on generated text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    out = tmp_path_factory.mktemp("tokenizer")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(make_docs(500) + make_docs(200, seed=3, prefix="x = 1 + 2\n"), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "pad_token": "<|pad|>",
                "model_max_length": 1000000,
            }
        )
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"})
    )
    return str(out)


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory) -> tuple[Path, Path, str]:
    """(experiment file, prefix, the run's stderr) of the tiny Qwen3-MoE trained 40 steps (AdamW,
    3e-3, 10% warmup) and evaluated (`tests.steps.tiny.EXPERIMENT`): trained once per session for
    the tests that read a trained model. A test that changes it works on a copy of the prefix."""
    from tests.steps.tiny import QWEN, experiment, train_and_evaluate

    root = tmp_path_factory.mktemp("trained_tiny")
    exp = experiment(root, dict(QWEN), dict(name="adamw", learning_rate=3e-3, warmup=0.1), steps=40)
    result = train_and_evaluate(exp, root / "prefix")
    return exp, root / "prefix", result.stderr
