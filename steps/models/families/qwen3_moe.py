"""Levanter's Qwen3-MoE (`Qwen3MoeConfig`): QK norm, no shared experts, one KV-head count, full
attention everywhere."""

from __future__ import annotations

from typing import Any

from steps.models.config import ModelFamily, MoeModelConfig, register
from steps.models.levanter_fields import check_heads, counted, qwen3_fields


def _check(model: MoeModelConfig) -> None:
    check_heads(model, free_head_dim=True)
    if model.num_shared_experts:
        raise ValueError("model.num_shared_experts: Levanter's Qwen3-MoE has no shared experts")


def _to_levanter(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> Any:
    from levanter.models.qwen3_moe import Qwen3MoeConfig

    return Qwen3MoeConfig(**qwen3_fields(model, seq_len, tokenizer))


QWEN3_MOE = register(
    ModelFamily(
        name="qwen3_moe",
        check=_check,
        parameter_counts=lambda model, vocab_size: counted(model, vocab_size, qk_norm=model.qk_norm),
        to_levanter=_to_levanter,
        free_head_dim=True,
    )
)
