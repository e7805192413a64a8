"""parameter_counts is exact: checked against the models Levanter really builds."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from steps.models import MoeModelConfig, parameter_counts, to_levanter


def levanter_count(model: MoeModelConfig, vocab: int) -> int:
    import equinox as eqx
    import jax
    from haliax import Axis
    from levanter.utils.jax_utils import parameter_count

    built = eqx.filter_eval_shape(
        to_levanter(model, 64, "unused").build, Axis("vocab", vocab), key=jax.random.PRNGKey(0)
    )
    return parameter_count(built)


QWEN = MoeModelConfig(
    family="qwen3_moe", hidden_dim=32, expert_intermediate_dim=48, num_heads=4, num_kv_heads=2
)
MIXTRAL = dataclasses.replace(QWEN, family="mixtral", qk_norm=False)


@pytest.mark.parametrize(
    ("tie", "qk", "head_dim", "experts", "k", "layers"),
    list(itertools.product([False, True], [True, False], [None, 12], [4, 6], [1, 2], [1, 3])),
)
def test_qwen3_moe_counts_match_levanter(tie, qk, head_dim, experts, k, layers):
    model = dataclasses.replace(
        QWEN,
        tie_embeddings=tie,
        qk_norm=qk,
        head_dim=head_dim,
        num_experts=experts,
        num_experts_per_token=k,
        num_layers=layers,
    )
    total, active = parameter_counts(model, 101)
    assert total == levanter_count(model, 101)
    expert = 3 * model.hidden_dim * model.expert_intermediate_dim
    assert total - active == layers * (experts - k) * expert


@pytest.mark.parametrize(
    ("tie", "shared", "experts", "k", "layers"),
    list(itertools.product([False, True], [0, 1], [4, 6], [1, 2], [1, 3])),
)
def test_mixtral_counts_match_levanter(tie, shared, experts, k, layers):
    model = dataclasses.replace(
        MIXTRAL,
        tie_embeddings=tie,
        num_shared_experts=shared,
        num_experts=experts,
        num_experts_per_token=k,
        num_layers=layers,
    )
    assert parameter_counts(model, 101)[0] == levanter_count(model, 101)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(family="gpt"), "model.family: unknown 'gpt'"),
        (dict(num_experts_per_token=9), "model.num_experts_per_token: 9 must be in 1..4"),
        (dict(num_shared_experts=1), "Qwen3-MoE has no shared experts"),
        (dict(family="mixtral"), "model.qk_norm: Levanter's Mixtral has no QK norm"),
        (dict(num_kv_heads=3), "model.num_kv_heads: 3 does not divide num_heads 4"),
    ],
)
def test_impossible_models_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        parameter_counts(dataclasses.replace(QWEN, **change), 100)
