"""Mixture-of-experts model configs: Drydock's description, Levanter's config, parameter counts.

`MoeModelConfig` describes an MoE language model in one vocabulary for three families:

    qwen3_moe    Levanter's Qwen3-MoE (`Qwen3MoeConfig`): QK norm, no shared experts, one
                 KV-head count, full attention everywhere
    mixtral      Levanter's Mixtral (`MixtralConfig`): load-balancing and router z losses,
                 optionally one dense shared expert
    drydock_moe  Drydock's own (`steps.training.drydock_moe`): routed plus shared experts, local layers
                 with a sliding window and their own KV-head count, a global layer every Nth,
                 QK norm, and loss-free balancing (a router bias) or an auxiliary loss

For the Levanter families `parameter_counts` is plain arithmetic (the tests check it against
the models Levanter builds); for drydock_moe it is read from the model's own shapes
(`jax.eval_shape` of its init), so the count cannot drift from what trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pipeline import added_field

__all__ = ["TINY_MOE", "MoeModelConfig", "parameter_counts", "tiny_moe", "to_levanter"]


@dataclass(frozen=True)
class MoeModelConfig:
    """An MoE transformer, as Levanter builds it."""

    family: Literal["qwen3_moe", "mixtral", "drydock_moe"] = "qwen3_moe"
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
    """Experts every token uses, each of width `expert_intermediate_dim` (drydock_moe: any number;
    Mixtral: 0 or 1, one dense shared MLP; Qwen3-MoE: none)."""
    qk_norm: bool = True
    """Qwen3-MoE only: RMS-normalize queries and keys (what kept large runs from loss spikes)."""
    tie_embeddings: bool = False
    load_balancing_loss_coef: float | None = 0.01
    """Mixtral, and drydock_moe with balancing 'aux_loss' (Levanter's Qwen3-MoE has no auxiliary
    loss)."""
    router_z_loss_coef: float | None = 0.001
    """Mixtral and drydock_moe: the router z-loss (mean squared log-sum-exp of router logits)."""
    rope_theta: float = 10000.0
    # drydock_moe only. Added after identities were made: while unset they leave every model's
    # identity as it was (pipeline.added_field).
    sliding_window: int | None = added_field(None)
    """Local layers attend to this many tokens (themselves and the previous window - 1); None:
    every layer attends to the whole sequence."""
    global_every: int = added_field(1)
    """Every Nth layer (layers N-1, 2N-1, ...) is global: full attention, `num_global_kv_heads`.
    1: every layer is global. The number of layers must be a multiple of it."""
    shared_expert_intermediate_dim: int | None = added_field(None)
    """Width of each shared expert's MLP; None: `expert_intermediate_dim`."""
    num_global_kv_heads: int | None = added_field(None)
    """KV heads of the global layers; None: `num_kv_heads` (which the local layers use)."""
    balancing: Literal["bias", "aux_loss", "none"] = added_field("bias")
    """How routed experts are balanced: `bias`, auxiliary-loss-free (a per-expert bias added to
    the router's scores for choosing experts only, moved toward balance each step from the load
    it caused, after DeepSeek-V3); `aux_loss`, the Switch Transformer loss times
    `load_balancing_loss_coef`; `none`."""

    def check(self) -> None:
        """Raise ValueError naming the field if this model cannot be built."""
        if self.family not in ("qwen3_moe", "mixtral", "drydock_moe"):
            raise ValueError(
                f"model.family: unknown {self.family!r}; use 'qwen3_moe', 'mixtral' or 'drydock_moe'"
            )
        if self.family == "drydock_moe":
            self._check_drydock()
        else:
            for name, unset in (
                ("sliding_window", None),
                ("global_every", 1),
                ("num_global_kv_heads", None),
                ("shared_expert_intermediate_dim", None),
                ("balancing", "bias"),
            ):
                if getattr(self, name) != unset:
                    raise ValueError(
                        f"model.{name}: only the drydock_moe family has it (this is {self.family})"
                    )
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

    def _check_drydock(self) -> None:
        positive = {
            "hidden_dim": self.hidden_dim,
            "expert_intermediate_dim": self.expert_intermediate_dim,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "num_experts": self.num_experts,
        }
        for name, value in positive.items():
            if type(value) is not int or value <= 0:
                raise ValueError(f"model.{name}: must be a positive whole number, got {value!r}")
        shared_width = self.shared_expert_intermediate_dim
        if shared_width is not None and (type(shared_width) is not int or shared_width <= 0):
            raise ValueError(
                f"model.shared_expert_intermediate_dim: must be a positive width, got {shared_width!r}"
            )
        if type(self.num_shared_experts) is not int or self.num_shared_experts < 0:
            raise ValueError(f"model.num_shared_experts: must be 0 or more, got {self.num_shared_experts!r}")
        if self.sliding_window is not None and (
            type(self.sliding_window) is not int or self.sliding_window <= 0
        ):
            raise ValueError(
                f"model.sliding_window: must be a positive number of tokens, got {self.sliding_window!r}"
            )
        if type(self.global_every) is not int or self.global_every <= 0:
            raise ValueError(f"model.global_every: must be 1 or more, got {self.global_every!r}")
        if self.num_layers % self.global_every:
            raise ValueError(
                f"model.global_every: {self.num_layers} layers are not a whole number of blocks of "
                f"{self.global_every} (one global layer every {self.global_every})"
            )
        if self.global_every > 1 and self.sliding_window is None:
            raise ValueError("model.sliding_window: local layers (global_every > 1) need a window")
        global_kv = self.num_global_kv_heads
        if global_kv is not None and (
            type(global_kv) is not int or global_kv <= 0 or self.num_heads % global_kv
        ):
            raise ValueError(
                f"model.num_global_kv_heads: {global_kv!r} does not divide num_heads {self.num_heads}"
            )
        if self.head_dim is None and self.hidden_dim % self.num_heads:
            raise ValueError(
                f"model.num_heads: {self.num_heads} does not divide hidden_dim {self.hidden_dim}"
            )
        if self.balancing not in ("bias", "aux_loss", "none"):
            raise ValueError(f"model.balancing: unknown {self.balancing!r}; use 'bias', 'aux_loss' or 'none'")
        if self.balancing == "aux_loss" and not self.load_balancing_loss_coef:
            raise ValueError("model.load_balancing_loss_coef: balancing 'aux_loss' needs a coefficient > 0")

    @property
    def actual_head_dim(self) -> int:
        if self.family in ("qwen3_moe", "drydock_moe") and self.head_dim is not None:
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
    if model.family == "drydock_moe":
        from steps.imports import LEVANTER_MODELS, import_ml

        import_ml(*LEVANTER_MODELS)  # planning may count while steps run in threads
        from steps.training.drydock_moe_export import counted_parameters

        return counted_parameters(model, vocab_size)
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
    """Levanter's `Qwen3MoeConfig` or `MixtralConfig` for `model`, or `DrydockMoeConfig`."""
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
    from levanter.models.mixtral import MixtralConfig
    from levanter.models.qwen3_moe import Qwen3MoeConfig

    model.check()
    if model.family == "drydock_moe":
        from steps.training.drydock_moe_export import levanter_config

        return levanter_config(model, seq_len, tokenizer)
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
