"""The demo's data steps for the bad-input cases of step configs: declared, never run."""

from __future__ import annotations

import os
from typing import Any

from steps.data.mixture import mixture_step
from steps.data.tokenize import tokenize_step
from steps.training.models import TINY_MOE
from steps.training.train_moe import OptimizerSpec, train_moe_step

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tok(domain: str, **overrides: Any):
    args: dict[str, Any] = dict(
        train=[f"data/corpus/{domain}/train-*.jsonl"],
        validation=[f"data/corpus/{domain}/validation-*.jsonl"],
        tokenizer="data/tokenizer",
        input_root=ROOT,
    )
    return tokenize_step(f"tokenized/{domain}", **{**args, **overrides})


def mix(**overrides: Any):
    args: dict[str, Any] = dict(
        components={"prose": tok("prose"), "arithmetic": tok("arithmetic")},
        weights={"prose": 0.5, "arithmetic": 0.5},
        target_tokens=100 * 8 * 64,
        batch_size=8,
        seq_len=64,
        validation=["prose"],
    )
    return mixture_step("mixture/tiny", **{**args, **overrides})


def train(optimizer: OptimizerSpec | None = None, **overrides: Any):
    args: dict[str, Any] = dict(data=mix(), model=TINY_MOE, batch_size=8, seq_len=64, num_steps=100)
    return train_moe_step("train/tiny", optimizer=optimizer or OptimizerSpec(), **{**args, **overrides})
