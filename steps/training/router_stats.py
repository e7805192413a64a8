"""Router statistics for every MoE family: expert loads and the max-load ratio (logged by
`steps.training.watch` every `router_stats_interval` steps)."""

from __future__ import annotations

import logging
from typing import Any

import haliax as hax
import jax
import jax.numpy as jnp

logger = logging.getLogger(__name__)

__all__ = ["router_stats"]


def _loads(router_logits: Any, token: Any, experts: Any, k: int) -> jax.Array:
    probs = jax.nn.softmax(router_logits.rearrange((token, experts)).array.astype(jnp.float32), axis=-1)
    _, chosen = jax.lax.top_k(probs, k)
    counts = jnp.bincount(chosen.reshape(-1), length=experts.size)
    return counts / counts.sum()


@hax.named_jit
def router_stats(model: Any, tokens: Any, attn_mask: Any) -> dict[str, jax.Array]:
    """Per-layer expert load (share of top-k assignments), max-load ratio and load entropy.

    A forward replay of the decoder layers that reads each router, outside any gradient: it
    works the same for Qwen3-MoE (which logs no router statistics itself) and Mixtral.
    `max_load_ratio` is max_e(load_e) x experts: 1.0 is perfectly balanced.
    """
    from levanter.models.qwen3_moe import Qwen3MoeLMHeadModel

    config = model.config
    out: dict[str, jax.Array] = {}
    ratios = []
    if hasattr(model, "router_loads"):  # drydock_moe reads its own routers (with their bias)
        for i, load in enumerate(model.router_loads(tokens, attn_mask)):
            ratios.append(load.max() * config.num_experts)
            out[f"router/layer{i}/max_load_ratio"] = ratios[-1]
            out[f"router/layer{i}/load_entropy"] = -(load * jnp.log(load + 1e-9)).sum()
        out["router/max_load_ratio"] = jnp.max(jnp.stack(ratios))
        out["router/mean_max_load_ratio"] = jnp.mean(jnp.stack(ratios))
        return out
    qwen = isinstance(model, Qwen3MoeLMHeadModel)
    experts, k = config.Experts, config.num_experts_per_tok
    x = model.embeddings.embed(tokens)
    for i, layer in enumerate(model.transformer.layers.unstacked()):
        h = layer.input_layernorm(x)
        x = x + layer.self_attn(x=h, mask=attn_mask, key=None)
        h = layer.post_attention_layernorm(x)
        moe = layer.mlp if qwen else layer.block_sparse_moe
        flat = hax.flatten_axes(
            h, old_axes=[h.resolve_axis("batch"), h.resolve_axis(config.max_Pos.name)], new_axis="token"
        )
        load = _loads(moe.gate(flat), flat.resolve_axis("token"), experts, k)
        if qwen:
            x = x + moe(h)
        else:
            moe_out, _ = moe(h)
            shared = layer.shared_mlp(h) if layer.shared_mlp is not None else 0
            x = x + shared + moe_out
        ratio = load.max() * experts.size
        ratios.append(ratio)
        out[f"router/layer{i}/max_load_ratio"] = ratio
        out[f"router/layer{i}/load_entropy"] = -(load * jnp.log(load + 1e-9)).sum()
    out["router/max_load_ratio"] = jnp.max(jnp.stack(ratios))
    out["router/mean_max_load_ratio"] = jnp.mean(jnp.stack(ratios))
    return out
