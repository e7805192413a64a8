"""Drydock's own family (`steps.models.drydock_moe`): routed plus shared experts, local layers with
a sliding window and their own KV-head count, a global layer every Nth, QK norm, and loss-free
balancing (a router bias) or an auxiliary loss. Its parameters are counted by arithmetic
(`steps.models.levanter_fields.counted_drydock`: a plan imports no JAX), which the tests hold equal
to the count from the model's own shapes; no Hugging Face architecture holds it, so train_moe
writes its own export."""

from __future__ import annotations

from typing import Any

from steps.models.config import FAMILY_FIELDS, ModelFamily, MoeModelConfig, register
from steps.models.levanter_fields import counted_drydock


def _check(model: MoeModelConfig) -> None:
    """What Drydock's own model needs: whole positive sizes, windows that tile the layers."""
    positive = {
        "hidden_dim": model.hidden_dim,
        "expert_intermediate_dim": model.expert_intermediate_dim,
        "num_layers": model.num_layers,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "num_experts": model.num_experts,
    }
    for name, value in positive.items():
        if type(value) is not int or value <= 0:
            raise ValueError(f"model.{name}: must be a positive whole number, got {value!r}")
    shared_width = model.shared_expert_intermediate_dim
    if shared_width is not None and (type(shared_width) is not int or shared_width <= 0):
        raise ValueError(
            f"model.shared_expert_intermediate_dim: must be a positive width, got {shared_width!r}"
        )
    if type(model.num_shared_experts) is not int or model.num_shared_experts < 0:
        raise ValueError(f"model.num_shared_experts: must be 0 or more, got {model.num_shared_experts!r}")
    if model.sliding_window is not None and (
        type(model.sliding_window) is not int or model.sliding_window <= 0
    ):
        raise ValueError(
            f"model.sliding_window: must be a positive number of tokens, got {model.sliding_window!r}"
        )
    if type(model.global_every) is not int or model.global_every <= 0:
        raise ValueError(f"model.global_every: must be 1 or more, got {model.global_every!r}")
    if model.num_layers % model.global_every:
        raise ValueError(
            f"model.global_every: {model.num_layers} layers are not a whole number of blocks of "
            f"{model.global_every} (one global layer every {model.global_every})"
        )
    if model.global_every > 1 and model.sliding_window is None:
        raise ValueError("model.sliding_window: local layers (global_every > 1) need a window")
    global_kv = model.num_global_kv_heads
    if global_kv is not None and (
        type(global_kv) is not int or global_kv <= 0 or model.num_heads % global_kv
    ):
        raise ValueError(
            f"model.num_global_kv_heads: {global_kv!r} does not divide num_heads {model.num_heads}"
        )
    if model.head_dim is None and model.hidden_dim % model.num_heads:
        raise ValueError(f"model.num_heads: {model.num_heads} does not divide hidden_dim {model.hidden_dim}")
    if model.balancing not in ("bias", "aux_loss", "none"):
        raise ValueError(f"model.balancing: unknown {model.balancing!r}; use 'bias', 'aux_loss' or 'none'")
    if model.balancing == "aux_loss" and not model.load_balancing_loss_coef:
        raise ValueError("model.load_balancing_loss_coef: balancing 'aux_loss' needs a coefficient > 0")


def _to_levanter(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> Any:
    from steps.models.drydock_moe_export import levanter_config

    return levanter_config(model, seq_len, tokenizer)


DRYDOCK_MOE = register(
    ModelFamily(
        name="drydock_moe",
        check=_check,
        parameter_counts=counted_drydock,
        to_levanter=_to_levanter,
        own_fields=FAMILY_FIELDS,
        free_head_dim=True,
        levanter_export=False,
    )
)
