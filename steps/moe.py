"""Mixture-of-experts model configs: Drydock's description, Levanter's config, parameter counts.

`MoeModelConfig` describes an MoE language model in one vocabulary for both families Levanter
trains: Qwen3-MoE (`Qwen3MoeConfig`; QK norm, no shared experts) and Mixtral (`MixtralConfig`;
load-balancing and router z losses, optionally one dense shared expert). `parameter_counts` is
plain arithmetic, so plans of a 535B model need no ML library; the tests check it against the
parameter count of the models Levanter really builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["TINY_MOE", "MoeModelConfig", "parameter_counts", "tiny_moe", "to_levanter"]


@dataclass(frozen=True)
class MoeModelConfig:
    """An MoE transformer, as Levanter builds it."""

    family: Literal["qwen3_moe", "mixtral"] = "qwen3_moe"
    hidden_dim: int = 64
    expert_intermediate_dim: int = 128
    """Hidden size of each expert's MLP (and of Mixtral's shared expert)."""
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int | None = None
    """Qwen3-MoE only; None means hidden_dim // num_heads (Mixtral always uses that)."""
    num_experts: int = 4
    num_experts_per_token: int = 2
    num_shared_experts: int = 0
    """Mixtral only: 0 or 1 (Levanter builds one dense shared MLP)."""
    qk_norm: bool = True
    """Qwen3-MoE only: RMS-normalize queries and keys (what kept large runs from loss spikes)."""
    tie_embeddings: bool = False
    load_balancing_loss_coef: float | None = 0.01
    """Mixtral only (Levanter's Qwen3-MoE has no auxiliary loss)."""
    router_z_loss_coef: float | None = 0.001
    """Mixtral only."""
    rope_theta: float = 10000.0

    def check(self) -> None:
        """Raise ValueError naming the field if Levanter cannot build this model."""
        if self.family not in ("qwen3_moe", "mixtral"):
            raise ValueError(f"model.family: unknown {self.family!r}; use 'qwen3_moe' or 'mixtral'")
        if self.hidden_dim % self.num_heads and (self.family == "mixtral" or self.head_dim is None):
            raise ValueError(
                f"model.num_heads: {self.num_heads} does not divide hidden_dim {self.hidden_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}"
            )
        if not 0 < self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"model.num_experts_per_token: {self.num_experts_per_token} must be in 1..{self.num_experts}"
            )
        if self.family == "qwen3_moe" and self.num_shared_experts:
            raise ValueError("model.num_shared_experts: Levanter's Qwen3-MoE has no shared experts")
        if self.family == "mixtral":
            if self.qk_norm:
                raise ValueError("model.qk_norm: Levanter's Mixtral has no QK norm; set qk_norm=False")
            if self.head_dim not in (None, self.hidden_dim // self.num_heads):
                raise ValueError("model.head_dim: Levanter's Mixtral uses hidden_dim // num_heads")
            if self.num_shared_experts > 1:
                raise ValueError("model.num_shared_experts: Levanter's Mixtral supports 0 or 1")

    @property
    def actual_head_dim(self) -> int:
        if self.family == "qwen3_moe" and self.head_dim is not None:
            return self.head_dim
        return self.hidden_dim // self.num_heads


def tiny_moe(hidden_dim: int = 64) -> MoeModelConfig:
    """The tiny Qwen3-MoE the demo, the scaling sweep and the tests train on CPU: 2 layers, 4 heads
    (2 KV heads), 4 experts of width `2 * hidden_dim`, top-2, QK norm."""
    return MoeModelConfig(
        family="qwen3_moe",
        hidden_dim=hidden_dim,
        expert_intermediate_dim=2 * hidden_dim,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        num_experts=4,
        num_experts_per_token=2,
        qk_norm=True,
    )


TINY_MOE = tiny_moe()
"""`tiny_moe()` at width 64: about 0.05 s a step on two CPU cores (batch 8, sequence 128)."""


def parameter_counts(model: MoeModelConfig, vocab_size: int) -> tuple[int, int]:
    """(total, active) parameters; active counts what one token touches.

    Active is everything except the weights of the experts a token is not routed to: attention,
    router, the chosen experts, the shared expert, norms, embeddings and the LM head.
    `vocab_size` is the model's vocabulary axis (the tokenizer's size on one device).
    """
    model.check()
    d, layers = model.hidden_dim, model.num_layers
    h, kv, hd = model.num_heads, model.num_kv_heads, model.actual_head_dim
    experts, k, m = model.num_experts, model.num_experts_per_token, model.expert_intermediate_dim
    norm = d  # RMSNorm weight
    attention = d * hd * (h + 2 * kv) + h * hd * d  # q, k, v, o
    if model.family == "qwen3_moe" and model.qk_norm:
        attention += 2 * hd
    router = d * experts
    expert = 3 * d * m  # gate, up, down
    shared = 3 * d * m if model.num_shared_experts else 0
    layer = attention + router + experts * expert + shared + 2 * norm
    embed = vocab_size * d
    head = 0 if model.tie_embeddings else vocab_size * d
    total = layers * layer + norm + embed + head
    active = total - layers * (experts - k) * expert
    return total, active


def to_levanter(model: MoeModelConfig, seq_len: int, tokenizer: str) -> Any:
    """Levanter's `Qwen3MoeConfig` or `MixtralConfig` for `model`."""
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
    from levanter.models.mixtral import MixtralConfig
    from levanter.models.qwen3_moe import Qwen3MoeConfig

    model.check()
    common: dict[str, Any] = dict(
        max_seq_len=seq_len,
        hidden_dim=model.hidden_dim,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        tie_word_embeddings=model.tie_embeddings,
        rope=DefaultRotaryEmbeddingsConfig(theta=model.rope_theta),
        tokenizer=tokenizer,
    )
    if model.family == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            head_dim=model.head_dim,
            intermediate_dim=model.expert_intermediate_dim,
            moe_intermediate_dim=model.expert_intermediate_dim,
            num_experts=model.num_experts,
            num_experts_per_tok=model.num_experts_per_token,
            use_qk_norm=model.qk_norm,
        )
    return MixtralConfig(
        **common,
        intermediate_dim=model.expert_intermediate_dim,
        n_routed_experts=model.num_experts,
        num_experts_per_tok=model.num_experts_per_token,
        n_shared_experts=model.num_shared_experts,
        lbl_coef=model.load_balancing_loss_coef,
        rzl_coef=model.router_z_loss_coef,
    )
