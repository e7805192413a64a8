"""Router statistics for every MoE family: expert loads and the max-load ratio, as a Levanter
`WatchConfig` that train_moe adds to its trainer."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import haliax as hax
import jax
import jax.numpy as jnp
import levanter.tracker
from levanter.callbacks.watch import WatchCallback, WatchConfig

logger = logging.getLogger(__name__)

__all__ = ["RouterStatsCallback", "RouterStatsWatchConfig", "router_stats"]


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


class RouterStatsCallback(WatchCallback):
    """Levanter's watch callback (gradient and parameter norms) plus `router_stats` on a fixed batch."""

    def __init__(self, data_config: Any, seq_len: int, batch_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._data_config = data_config
        self._seq_len = seq_len
        self._batch_size = batch_size
        self._batch: Any = None

    def _probe_batch(self, model: Any) -> Any:
        if self._batch is None:
            from levanter.data import DataLoader
            from levanter.utils.mesh import MeshConfig

            pos = model.config.max_Pos.resize(self._seq_len)
            sets = self._data_config.validation_sets(pos)
            dataset = next(iter(sets.values())) if sets else None
            if dataset is None:
                from levanter.schedule import BatchSchedule

                dataset = self._data_config.train_set(
                    pos, BatchSchedule(self._batch_size), key=jax.random.PRNGKey(0)
                )
            # Hooks run under the parameter mapping; the loader needs the compute mapping.
            loader = DataLoader(
                dataset,
                batch_size=self._batch_size,
                mesh=hax.partitioning._get_mesh(),
                axis_resources=MeshConfig().resolved_compute_mapping,
            )
            self._batch = next(iter(loader))
        return self._batch

    def on_step(self, step_info: Any, cb_info: Any) -> None:
        super().on_step(step_info, cb_info)
        model = step_info.eval_model
        batch = self._probe_batch(model)
        stats = router_stats(model, batch.tokens, batch.attn_mask)
        levanter.tracker.log(jax.device_get(stats), step=int(step_info.step))


@dataclasses.dataclass(frozen=True)
class RouterStatsWatchConfig(WatchConfig):
    """`TrainerConfig.watch` that also logs router statistics every `interval` steps."""

    data_config: Any = None
    seq_len: int = 128
    batch_size: int = 8

    def build(self) -> RouterStatsCallback:
        return RouterStatsCallback(
            self.data_config,
            self.seq_len,
            self.batch_size,
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histograms,
            split_scan_layers=self.split_scan_layers,
        )


# -- rewinds: skipped data batches and a lowered learning rate --------------------------------------
