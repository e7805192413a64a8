"""What train_moe watches while it trains, as Levanter's `WatchConfig` (the one hook a training's
config can add): Levanter's gradient and parameter norms, router statistics every
`router_stats_interval` steps (`steps.training.router_stats`), and, once, the layout the training
actually runs with (`steps.training.layout`, written to `layout.json`)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import haliax as hax
import jax
import levanter.tracker
from levanter.callbacks.watch import WatchCallback, WatchConfig

from steps.training.layout import describe_layout
from steps.training.router_stats import router_stats

logger = logging.getLogger(__name__)

__all__ = ["DrydockWatchCallback", "DrydockWatchConfig"]


class DrydockWatchCallback(WatchCallback):
    """Levanter's watch callback plus router statistics on a fixed batch and the layout record."""

    def __init__(
        self,
        data_config: Any,
        seq_len: int,
        batch_size: int,
        compute_mapping: Any,
        router_stats: bool,
        layout_path: str | None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._data_config = data_config
        self._seq_len = seq_len
        self._batch_size = batch_size
        self._compute_mapping = compute_mapping
        self._router_stats = router_stats
        self._layout_path = layout_path
        self._batch: Any = None

    def _probe_batch(self, model: Any) -> Any:
        if self._batch is None:
            from levanter.data import DataLoader

            pos = model.config.max_Pos.resize(self._seq_len)
            sets = self._data_config.validation_sets(pos)
            dataset = next(iter(sets.values())) if sets else None
            if dataset is None:
                from levanter.schedule import BatchSchedule

                dataset = self._data_config.train_set(
                    pos, BatchSchedule(self._batch_size), key=jax.random.PRNGKey(0)
                )
            # The training's global batch, laid out as its own batches are: every process of a
            # gang loads its share, and the batch axis is sharded as the declared mesh says.
            loader = DataLoader(
                dataset,
                batch_size=self._batch_size,
                mesh=hax.partitioning._get_mesh(),
                axis_resources=self._compute_mapping,
            )
            self._batch = next(iter(loader))
        return self._batch

    def on_step(self, step_info: Any, cb_info: Any) -> None:
        super().on_step(step_info, cb_info)
        model = step_info.eval_model
        if self._layout_path is not None:
            from steps.files import write_file

            layout = describe_layout(step_info.state.model, hax.partitioning._get_mesh())
            write_file(self._layout_path, json.dumps(layout, indent=1).encode())
            self._layout_path = None  # once: the layout does not change within an attempt
        if not self._router_stats:
            return
        batch = self._probe_batch(model)
        # Hooks run under the parameter mapping, but the MoE layers' shard_maps take their specs
        # from the mapping in force: under the parameter mapping they split each device's tokens
        # along the embedding axis and reassemble a batch of the wrong size.
        with hax.axis_mapping(self._compute_mapping):
            stats = router_stats(model, batch.tokens, batch.attn_mask)
        levanter.tracker.log(jax.device_get(stats), step=int(step_info.step))


@dataclasses.dataclass(frozen=True)
class DrydockWatchConfig(WatchConfig):
    """`TrainerConfig.watch` for train_moe: every `interval` steps Levanter's norms and (with
    `router_stats`) the routers' loads; at the first of those steps, the layout to `layout_path`
    (None: not recorded, as on every process but a gang's leader)."""

    data_config: Any = None
    seq_len: int = 128
    batch_size: int = 8
    compute_mapping: Any = None
    """The training's compute axis mapping (its `MeshConfig.resolved_compute_mapping`)."""
    router_stats: bool = True
    layout_path: str | None = None

    def build(self) -> DrydockWatchCallback:
        if self.router_stats and self.compute_mapping is None:
            raise ValueError("DrydockWatchConfig.compute_mapping: router statistics need the compute mapping")
        return DrydockWatchCallback(
            self.data_config,
            self.seq_len,
            self.batch_size,
            self.compute_mapping,
            self.router_stats,
            self.layout_path,
            watch_targets=self.watch_targets,
            include_norms=self.include_norms,
            include_per_parameter_norms=self.include_per_parameter_norms,
            include_histogram=self.include_histograms,
            split_scan_layers=self.split_scan_layers,
        )
