"""Levanter's Mixtral (`MixtralConfig`): load-balancing and router z losses, optionally one dense
shared expert, no QK norm."""

from __future__ import annotations

from typing import Any

from steps.models.config import ModelFamily, MoeModelConfig, register
from steps.models.levanter_fields import check_heads, common_fields, counted


def _check(model: MoeModelConfig) -> None:
    check_heads(model, free_head_dim=False)
    if model.qk_norm:
        raise ValueError("model.qk_norm: Levanter's Mixtral has no QK norm; set qk_norm=False")
    if model.head_dim not in (None, model.hidden_dim // model.num_heads):
        raise ValueError("model.head_dim: Levanter's Mixtral uses hidden_dim // num_heads")
    if model.num_shared_experts > 1:
        raise ValueError("model.num_shared_experts: Levanter's Mixtral supports 0 or 1")


def _to_levanter(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> Any:
    from levanter.models.mixtral import MixtralConfig

    return MixtralConfig(
        **common_fields(model, seq_len, tokenizer),
        intermediate_dim=model.expert_intermediate_dim,
        n_routed_experts=model.num_experts,
        num_experts_per_tok=model.num_experts_per_token,
        n_shared_experts=model.num_shared_experts,
        lbl_coef=model.load_balancing_loss_coef,
        rzl_coef=model.router_z_loss_coef,
    )


MIXTRAL = register(
    ModelFamily(
        name="mixtral",
        check=_check,
        parameter_counts=lambda model, vocab_size: counted(model, vocab_size, qk_norm=False),
        to_levanter=_to_levanter,
        logs_in_loss=True,
    )
)
