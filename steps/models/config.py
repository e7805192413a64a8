"""Mixture-of-experts model configs in one vocabulary, and the registry of model families.

`MoeModelConfig` describes an MoE language model; its `family` names a `ModelFamily`, which says
what that family accepts (`check`), how many parameters it has (`parameter_counts`), how Levanter
builds it (`to_levanter`) and how it is exported. The families are modules of
`steps.models.families`, each registering one `ModelFamily` when imported (importing
`steps.models` imports them all):

    qwen3_moe    Levanter's Qwen3-MoE (`Qwen3MoeConfig`): QK norm, no shared experts, one
                 KV-head count, full attention everywhere
    mixtral      Levanter's Mixtral (`MixtralConfig`): load-balancing and router z losses,
                 optionally one dense shared expert
    drydock_moe  Drydock's own (`steps.models.drydock_moe`): routed plus shared experts, local layers
                 with a sliding window and their own KV-head count, a global layer every Nth,
                 QK norm, and loss-free balancing (a router bias) or an auxiliary loss

A new family is one module in `steps/models/families/` that calls `register(ModelFamily(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from pipeline import added_field

__all__ = [
    "FAMILY_FIELDS",
    "TINY_MOE",
    "ModelFamily",
    "MoeModelConfig",
    "family",
    "family_names",
    "parameter_counts",
    "register",
    "tiny_moe",
    "to_levanter",
]


@dataclass(frozen=True)
class MoeModelConfig:
    """An MoE transformer, as Levanter builds it."""

    family: str = "qwen3_moe"
    """A registered `ModelFamily` (`family_names()`): qwen3_moe, mixtral or drydock_moe built in."""
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
        kind = family(self.family)
        for name in sorted(FAMILY_FIELDS - kind.own_fields):
            if getattr(self, name) != _DEFAULTS[name]:
                owners = " and ".join(sorted(f.name for f in _FAMILIES.values() if name in f.own_fields))
                raise ValueError(f"model.{name}: only the {owners} family has it (this is {self.family})")
        kind.check(self)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}"
            )
        if not 0 < self.num_experts_per_token <= self.num_experts:
            raise ValueError(
                f"model.num_experts_per_token: {self.num_experts_per_token} must be in 1..{self.num_experts}"
            )

    @property
    def actual_head_dim(self) -> int:
        if family(self.family).free_head_dim and self.head_dim is not None:
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
    return family(model.family).parameter_counts(model, vocab_size)


def to_levanter(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> Any:
    """The Levanter config of `model` (`Qwen3MoeConfig`, `MixtralConfig`, `DrydockMoeConfig`, ...)."""
    model.check()
    return family(model.family).to_levanter(model, seq_len, tokenizer)


# -- the registry of families ----------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFamily:
    """What Drydock needs to know of a model family, registered under `name`."""

    name: str
    check: Callable[[MoeModelConfig], None]
    """Raise ValueError naming the field for what this family cannot build (after the checks every
    family shares: a known family, its own fields only; then KV heads dividing heads and top-k in
    range are checked for every family)."""
    parameter_counts: Callable[[MoeModelConfig, int], tuple[int, int]]
    """(total, active) for a vocabulary size: see `parameter_counts`."""
    to_levanter: Callable[[MoeModelConfig, int, str | None], Any]
    """The Levanter `LmConfig` for a sequence length and tokenizer."""
    own_fields: frozenset[str] = frozenset()
    """Fields of `FAMILY_FIELDS` this family reads; every other family must leave them unset."""
    free_head_dim: bool = False
    """`head_dim` may differ from hidden_dim // num_heads."""
    levanter_export: bool = True
    """Levanter's Hugging Face export writes this family (`hf/`). False: no Hugging Face
    architecture holds it, and train_moe writes the family's own export (`export/`)."""
    logs_in_loss: bool = False
    """Its loss logs through `levanter.tracker.jit_log` (Levanter's Mixtral): train_moe makes that
    differentiable first (`steps.training.levanter_fixes.fix_mixtral_jit_log`)."""


FAMILY_FIELDS = frozenset(
    {"sliding_window", "global_every", "num_global_kv_heads", "shared_expert_intermediate_dim", "balancing"}
)
"""Fields only some families read (added after identities were made, so unset by default)."""

_DEFAULTS = {f.name: f.default for f in fields(MoeModelConfig)}
_FAMILIES: dict[str, ModelFamily] = {}


def register(kind: ModelFamily) -> ModelFamily:
    """Make `kind` a family that `MoeModelConfig.family` may name (once per name)."""
    if _FAMILIES.get(kind.name, kind) is not kind:
        raise ValueError(f"a model family named {kind.name!r} is already registered")
    unknown = kind.own_fields - FAMILY_FIELDS
    if unknown:
        raise ValueError(f"family {kind.name}: own_fields {sorted(unknown)} are not in FAMILY_FIELDS")
    _FAMILIES[kind.name] = kind
    return kind


def family(name: str) -> ModelFamily:
    """The registered family `name`, or ValueError naming `model.family` and the known ones."""
    try:
        return _FAMILIES[name]
    except (KeyError, TypeError):
        known = ", ".join(repr(n) for n in family_names())
        raise ValueError(f"model.family: unknown {name!r}; use one of {known}") from None


def family_names() -> tuple[str, ...]:
    """The registered families' names, in registration order."""
    return tuple(_FAMILIES)
