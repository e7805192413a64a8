"""The drydock_moe family from outside the model (`steps.models.drydock_moe`): Drydock's
`MoeModelConfig` as the family's Levanter config, the parameters counted from the model's own
shapes, and the export of a model as safetensors + config.json (and loading it back;
`steps.training.checkpoints.export_checkpoint` exports a training's checkpoint)."""

from __future__ import annotations

import dataclasses
import json
import os

import jax.random as jrandom
from haliax import Axis

from steps.models.config import MoeModelConfig
from steps.models.drydock_moe import DrydockMoeConfig, DrydockMoeLMHeadModel, counted_parameters_of
from steps.models.levanter_fields import qwen3_fields

__all__ = [
    "EXPORT_FORMAT",
    "counted_parameters",
    "export_model",
    "levanter_config",
    "load_export",
]


def levanter_config(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> DrydockMoeConfig:
    """The Levanter config of a `MoeModelConfig(family="drydock_moe")`."""
    model.check()
    return DrydockMoeConfig(
        **qwen3_fields(model, seq_len, tokenizer),
        num_shared_experts=model.num_shared_experts,
        shared_intermediate_dim=model.shared_expert_intermediate_dim,
        sliding_window=model.sliding_window,
        global_every=model.global_every,
        num_global_kv_heads=model.num_global_kv_heads,
        balancing=model.balancing,
        load_balancing_loss_coef=model.load_balancing_loss_coef or 0.0,
        router_z_loss_coef=model.router_z_loss_coef or 0.0,
    )


def counted_parameters(model: MoeModelConfig, vocab_size: int) -> tuple[int, int]:
    """`parameter_counts` of a drydock_moe model: read from the shapes it is built with."""
    return counted_parameters_of(levanter_config(model, 2, None), vocab_size)


EXPORT_FORMAT = "drydock_moe/1"


def export_model(
    model: DrydockMoeLMHeadModel, spec: MoeModelConfig, directory: str, *, leader: bool = True
) -> None:
    """Write `model.safetensors` (one tensor per named weight, Hugging Face-style names, layers
    flattened: `model.groups.3.local.1.self_attn.q_proj.weight`) and `config.json` (the
    architecture, the format and how to load it) into `directory`."""
    from haliax.state_dict import save_state_dict, to_torch_compatible_state_dict

    from steps.files import write_file

    vocab_size = model.Vocab.size
    if leader:
        os.makedirs(directory, exist_ok=True)
    # Both collectives across a gang's processes: the gather, and save_state_dict's barrier after
    # process 0 writes.
    save_state_dict(to_torch_compatible_state_dict(model), os.path.join(directory, "model.safetensors"))
    if not leader:
        return
    total, active = counted_parameters(spec, vocab_size)
    config = {
        "format": EXPORT_FORMAT,
        "architecture": "DrydockMoeLMHeadModel",
        "model": dataclasses.asdict(spec),
        "vocab_size": vocab_size,
        "parameters": {"total": total, "active": active},
        "layers": [
            {"index": i, "attention": "global" if (i + 1) % spec.global_every == 0 else "local"}
            for i in range(spec.num_layers)
        ],
        "load": "steps.models.drydock_moe_export.load_export(directory) rebuilds the model; no "
        "Hugging Face architecture holds shared experts, windowed local layers with their own KV "
        "heads and a balancing bias together",
    }
    write_file(os.path.join(directory, "config.json"), json.dumps(config, indent=1).encode())


def load_export(directory: str) -> tuple[DrydockMoeLMHeadModel, MoeModelConfig]:
    """The model `export_model` wrote in `directory`, and its description."""
    from haliax.state_dict import from_torch_compatible_state_dict, load_state_dict

    from steps.files import read_json

    config = read_json(os.path.join(directory, "config.json"))
    if config.get("format") != EXPORT_FORMAT:
        raise ValueError(f"{directory}/config.json is not a {EXPORT_FORMAT} export")
    spec = MoeModelConfig(**config["model"])
    template = DrydockMoeLMHeadModel.init(
        Axis("vocab", config["vocab_size"]), levanter_config(spec, 2, None), key=jrandom.PRNGKey(0)
    )
    state = load_state_dict(os.path.join(directory, "model.safetensors"))
    return from_torch_compatible_state_dict(template, state), spec
