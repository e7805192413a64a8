"""The drydock_moe family against plain references, on tiny sizes on the CPU: windowed attention
against an explicit band mask, the MoE block against a per-token loop, the balancing bias (it
moves the choice, never the weights, and evens out a skewed router), counts (arithmetic, against the
built model's shapes), export."""

from __future__ import annotations

import dataclasses
import itertools
import json

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from haliax import Axis
from levanter.layers.attention import Attention, AttentionMask

from pipeline import StepDeclarationError
from steps.models import MoeModelConfig, parameter_counts
from steps.models.drydock_moe import DrydockMoeBlock, DrydockMoeLMHeadModel
from steps.models.drydock_moe_export import counted_parameters, export_model, levanter_config, load_export

SPEC = MoeModelConfig(
    family="drydock_moe",
    hidden_dim=32,
    expert_intermediate_dim=16,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    num_global_kv_heads=1,
    num_experts=8,
    num_experts_per_token=2,
    num_shared_experts=2,
    sliding_window=4,
    global_every=2,
)
SEQ = 16


@pytest.fixture(autouse=True)
def mesh():
    with hax.partitioning.set_mesh(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))):
        yield


def config(**changes):
    return levanter_config(dataclasses.replace(SPEC, **changes), SEQ, None)


def hidden(key: int, batch: int = 2) -> hax.NamedArray:
    cfg = config()
    axes = (Axis("batch", batch), cfg.max_Pos.resize(SEQ), cfg.Embed)
    return hax.random.normal(jax.random.PRNGKey(key), axes)


# -- attention ---------------------------------------------------------------------------------------


def band(pos: Axis, window: int) -> hax.NamedArray:
    i = hax.arange(pos).broadcast_axis(pos.alias("key_position"))
    j = hax.arange(pos.alias("key_position")).broadcast_axis(pos)
    return (i - j >= 0) & (i - j < window)


@pytest.mark.parametrize("window", [1, 3, 4, 7])
def test_a_local_layers_window_is_full_attention_with_an_explicit_band_mask(window):
    cfg = config(sliding_window=window)
    local = Attention.init(cfg.layer_attention(is_global=False), key=jax.random.PRNGKey(1))
    assert local.config.sliding_window == window
    full = dataclasses.replace(local, config=dataclasses.replace(local.config, sliding_window=None))
    x = hidden(2)
    pos = x.resolve_axis("position")
    windowed = local(x, AttentionMask.causal())
    reference = full(x, AttentionMask.explicit(band(pos, window)))
    np.testing.assert_allclose(windowed.array, reference.array, rtol=1e-5, atol=1e-6)
    # Not the same as attending to everything (the window matters).
    assert not np.allclose(windowed.array, full(x, AttentionMask.causal()).array, atol=1e-4)


def test_a_window_as_long_as_the_sequence_is_full_attention():
    cfg = config(sliding_window=SEQ)
    local = Attention.init(cfg.layer_attention(is_global=False), key=jax.random.PRNGKey(1))
    full = dataclasses.replace(local, config=dataclasses.replace(local.config, sliding_window=None))
    x = hidden(3)
    np.testing.assert_allclose(
        local(x, AttentionMask.causal()).array, full(x, AttentionMask.causal()).array, rtol=1e-6, atol=1e-6
    )


def test_global_layers_have_their_own_kv_heads_and_no_window():
    model = DrydockMoeLMHeadModel.init(Axis("vocab", 50), config(), key=jax.random.PRNGKey(0))
    layers = model.transformer.layers()
    assert [layer.is_global for layer in layers] == [False, True, False, True]
    assert [layer.self_attn.config.num_kv_heads for layer in layers] == [2, 1, 2, 1]
    assert [layer.self_attn.config.sliding_window for layer in layers] == [4, None, 4, None]


# -- the MoE block -----------------------------------------------------------------------------------


def naive(block: DrydockMoeBlock, x: hax.NamedArray) -> np.ndarray:
    """The block, token by token: softmax over the router, the top k of probability + bias, their
    (renormalized) probabilities as weights, each chosen expert's SwiGLU, plus the shared ones."""
    cfg = block.config
    embed = cfg.Embed
    flat = x.rearrange((..., embed)).array.reshape(-1, embed.size)
    gate = block.gate.weight.rearrange((cfg.Experts, embed)).array
    bias = np.zeros(cfg.num_experts) if block.router_bias is None else np.asarray(block.router_bias.array)
    experts = block.experts

    def matrix(linear, expert: int, out: Axis) -> np.ndarray:
        return np.asarray(linear.weight["experts", expert].rearrange((linear.In, out)).array)

    rows = []
    for token in np.asarray(flat):
        logits = gate @ token
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        chosen = np.argsort(-(probs + bias), kind="stable")[: cfg.num_experts_per_tok]
        weights = probs[chosen] / probs[chosen].sum()
        out = np.zeros(embed.size)
        for w, e in zip(weights, chosen, strict=True):
            g = token @ matrix(experts.gate_proj, e, cfg.MoeMlp)
            u = token @ matrix(experts.up_proj, e, cfg.MoeMlp)
            h = g / (1 + np.exp(-g)) * u
            out += w * (h @ matrix(experts.down_proj, e, embed))
        if block.shared is not None:
            s = block.shared
            g = token @ np.asarray(s.gate_proj.weight.rearrange((embed, cfg.SharedMlp)).array)
            u = token @ np.asarray(s.up_proj.weight.rearrange((embed, cfg.SharedMlp)).array)
            out += (g / (1 + np.exp(-g)) * u) @ np.asarray(
                s.down_proj.weight.rearrange((cfg.SharedMlp, embed)).array
            )
        rows.append(out)
    return np.stack(rows)


@pytest.mark.parametrize("shared", [0, 2])
def test_the_moe_block_equals_a_per_token_loop_over_its_chosen_and_shared_experts(shared):
    block = DrydockMoeBlock.init(config(num_shared_experts=shared), key=jax.random.PRNGKey(4))
    # A bias that moves some choices: the reference chooses with it too.
    bias = hax.named(jnp.linspace(-0.05, 0.05, 8), (block.config.Experts,))
    block = eqx.tree_at(lambda b: b.router_bias, block, bias)
    x = hidden(5)
    out, aux = block(x)
    got = np.asarray(out.rearrange((..., block.config.Embed)).array).reshape(-1, 32)
    np.testing.assert_allclose(got, naive(block, x), rtol=2e-4, atol=2e-5)
    # The bias's hook adds nothing to the loss: only the router z-loss is there.
    flat = hax.flatten_axes(x, old_axes=["batch", "position"], new_axis="token")
    z = float(block.route(flat).z_squared)
    assert float(aux) == pytest.approx(SPEC.router_z_loss_coef * z, rel=1e-6) and z > 0


def test_padding_the_expert_groups_for_tpus_changes_neither_outputs_nor_gradients(monkeypatch):
    # 6 experts (not a power of two): on a TPU the groups are padded to 8 with empty ones, which
    # libtpu needs for the hero's 384; here the TPU path is taken on the CPU and compared.
    import steps.models.drydock_moe as family

    block = DrydockMoeBlock.init(config(num_experts=6), key=jax.random.PRNGKey(7))
    x = hidden(8)
    groups: list[int] = []
    original = family.Qwen3MoeExperts.__call__

    def recording(self, inputs, group_sizes, *, key=None):
        groups.append(group_sizes.axes[0].size)
        return original(self, inputs, group_sizes, key=key)

    monkeypatch.setattr(family.Qwen3MoeExperts, "__call__", recording)

    def loss_and_grads(platform):
        monkeypatch.setattr(family, "_mesh_platform", lambda: platform)

        def loss(b):
            out, aux = b(x)
            return (out.array**2).mean() + aux

        return eqx.filter_value_and_grad(loss)(block)

    plain_loss, plain = loss_and_grads("cpu")
    padded_loss, padded = loss_and_grads("tpu")
    assert sorted(set(groups)) == [6, 8]  # both paths ran: 6 groups, then 8
    assert float(padded_loss) == pytest.approx(float(plain_loss), rel=1e-6)
    for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(padded), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    assert jax.tree.leaves(padded)[0].shape == jax.tree.leaves(plain)[0].shape  # 6 experts' grads


def test_the_bias_changes_which_experts_are_chosen_but_not_the_weights_that_combine_them():
    block = DrydockMoeBlock.init(config(), key=jax.random.PRNGKey(6))
    flat = hax.flatten_axes(hidden(7), old_axes=["batch", "position"], new_axis="token")
    chosen = block.route(flat).chosen
    favoured = eqx.tree_at(lambda b: b.router_bias, block, block.router_bias.at["experts", 3].set(10.0))
    weights_b, chosen_b, load_b, *_ = favoured.route(flat)
    assert (np.asarray(chosen_b.array) == 3).any(axis=-1).all()  # every token now sends to expert 3
    assert not np.array_equal(chosen.array, chosen_b.array)
    # The weights are the router's own probabilities of the chosen experts, renormalized.
    logits = block.gate(flat).rearrange(("token", "experts")).array
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(probs, chosen_b.array, axis=-1)
    np.testing.assert_allclose(weights_b.array, picked / picked.sum(-1, keepdims=True), rtol=1e-6)
    assert float(load_b[3]) == pytest.approx(0.5)  # one of each token's two slots


def test_the_bias_evens_out_a_skewed_router_over_a_few_hundred_steps():
    """Only the bias learns, with AdamW at the tiny runs' rate, from the gradient the block gives it."""
    block = DrydockMoeBlock.init(config(), key=jax.random.PRNGKey(8))
    # Every token has a common component, which the router's weights favour expert 7 along.
    skew = hax.named(jnp.linspace(0.0, 3.0, 8), (block.config.Experts,))
    block = eqx.tree_at(lambda b: b.gate.weight, block, block.gate.weight + skew * 0.1)
    optimizer = optax.adamw(3e-3, weight_decay=0.0)
    state = optimizer.init(block.router_bias)

    def ratio(b: DrydockMoeBlock, key: int) -> float:
        flat = hax.flatten_axes(hidden(key, batch=8) + 0.5, old_axes=["batch", "position"], new_axis="token")
        return float(b.route(flat).load.max() * 8)

    @jax.jit
    def update(b, state, key):
        x = hax.random.normal(key, (Axis("batch", 8), b.config.max_Pos.resize(SEQ), b.config.Embed)) + 0.5
        grads = jax.grad(lambda bias: b_with(b, bias)(x)[1])(b.router_bias)
        updates, state = optimizer.update(grads, state, b.router_bias)
        return eqx.tree_at(lambda m: m.router_bias, b, optax.apply_updates(b.router_bias, updates)), state

    before = ratio(block, 100)
    for step in range(300):
        block, state = update(block, state, jax.random.PRNGKey(1000 + step))
    after = ratio(block, 100)
    assert before > 3.0, before  # most tokens on the favoured experts
    assert after < 1.35, after  # close to even (1.0)
    # The bias moved against the skew: the favoured expert's is the lowest.
    assert int(jnp.argmin(block.router_bias.array)) == 7


def b_with(block: DrydockMoeBlock, bias: hax.NamedArray) -> DrydockMoeBlock:
    return eqx.tree_at(lambda b: b.router_bias, block, bias)


def test_the_auxiliary_loss_instead_of_the_bias():
    block = DrydockMoeBlock.init(
        config(balancing="aux_loss", router_z_loss_coef=0.0), key=jax.random.PRNGKey(9)
    )
    assert block.router_bias is None
    x = hidden(10)
    _out, aux = block(x)
    flat = hax.flatten_axes(x, old_axes=["batch", "position"], new_axis="token")
    routing = block.route(flat)
    assert float(aux) == pytest.approx(0.01 * 8 * float(jnp.sum(routing.load * routing.mean_probs)), rel=1e-6)
    assert float(aux) > 0


def test_the_router_z_loss_is_the_mean_squared_log_sum_exp_of_the_router_logits():
    block = DrydockMoeBlock.init(config(router_z_loss_coef=0.5, balancing="none"), key=jax.random.PRNGKey(9))
    x = hidden(11)
    _out, aux = block(x)
    flat = hax.flatten_axes(x, old_axes=["batch", "position"], new_axis="token")
    logits = np.asarray(block.gate(flat).rearrange(("token", "experts")).array, np.float64)
    by_hand = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    assert float(aux) == pytest.approx(0.5 * by_hand, rel=1e-5)
    # Its gradient reaches the router's weights (it keeps the logits small), not the experts'.
    grads = jax.grad(lambda b: b(x)[1])(block)
    assert float(jnp.abs(grads.gate.weight.array).sum()) > 0
    assert float(jnp.abs(grads.experts.gate_proj.weight.array).sum()) == 0


# -- counts and export -------------------------------------------------------------------------------


def test_counts_come_from_the_model_it_builds():
    model = DrydockMoeLMHeadModel.init(Axis("vocab", 100), config(), key=jax.random.PRNGKey(0))
    built = sum(leaf.size for leaf in jax.tree_util.tree_leaves(eqx.filter(model, eqx.is_array)))
    total, active = parameter_counts(SPEC, 100)
    assert total == built == 80_512
    # By hand: attention 3,088 (local) / 2,576 (global); router 256; experts 12,288; shared 3,072;
    # bias 8; norms 64 per layer; final norm 32; embedding and head 3,200 each. Active leaves out
    # 6 of 8 experts in each of 4 layers.
    assert (
        total
        == 2 * (3088 + 256 + 12288 + 3072 + 8 + 64) + 2 * (2576 + 256 + 12288 + 3072 + 8 + 64) + 32 + 6400
    )
    assert active == total - 4 * 12288 * 6 // 8


@pytest.mark.parametrize(
    ("tie", "qk", "head_dim", "shared", "shared_width", "global_every", "global_kv", "balancing"),
    [
        (tie, qk, head_dim, shared, width, every, global_kv, balancing)
        for tie, qk, head_dim, (shared, width), every, global_kv, balancing in itertools.product(
            [False, True],
            [True, False],
            [None, 12],
            [(0, None), (1, None), (2, 24)],
            [1, 2],
            [None, 1],
            ["bias", "none"],
        )
        if every > 1 or global_kv is None  # with every layer global, global_kv is num_kv_heads' twin
    ],
)
def test_the_arithmetic_count_is_the_built_models(
    tie, qk, head_dim, shared, shared_width, global_every, global_kv, balancing
):
    # Planning counts by arithmetic (no JAX); the count read from the shapes the model is built
    # with (jax.eval_shape of its init) is the truth it must equal, field by field.
    model = dataclasses.replace(
        SPEC,
        tie_embeddings=tie,
        qk_norm=qk,
        head_dim=head_dim,
        num_shared_experts=shared,
        shared_expert_intermediate_dim=shared_width,
        global_every=global_every,
        num_global_kv_heads=global_kv,
        balancing=balancing,
    )
    assert parameter_counts(model, 101) == counted_parameters(model, 101)


def test_an_export_loads_back_with_the_same_logits(tmp_path):
    model = DrydockMoeLMHeadModel.init(Axis("vocab", 100), config(), key=jax.random.PRNGKey(11))
    export_model(model, SPEC, str(tmp_path))
    described = json.loads((tmp_path / "config.json").read_text())
    assert described["format"] == "drydock_moe/1" and described["parameters"]["total"] == 80_512
    assert [layer["attention"] for layer in described["layers"]] == ["local", "global", "local", "global"]
    loaded, spec = load_export(str(tmp_path))
    assert spec == SPEC
    ids = hax.named(jnp.arange(SEQ) % 100, (config().max_Pos.resize(SEQ),))
    np.testing.assert_array_equal(
        model(ids, AttentionMask.causal()).array, loaded(ids, AttentionMask.causal()).array
    )


# -- declaration -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"sliding_window": 0}, "model.sliding_window", "positive number of tokens"),
        ({"global_every": 0}, "model.global_every", "1 or more"),
        ({"global_every": 3}, "model.global_every", "not a whole number of blocks"),
        ({"num_shared_experts": -1}, "model.num_shared_experts", "0 or more"),
        ({"num_experts_per_token": 9}, "model.num_experts_per_token", "must be in 1..8"),
        ({"num_global_kv_heads": 3}, "model.num_global_kv_heads", "does not divide num_heads 4"),
        ({"num_kv_heads": 3}, "model.num_kv_heads", "does not divide num_heads 4"),
        ({"balancing": "magic"}, "model.balancing", "unknown 'magic'"),
    ],
)
def test_bad_architectures_are_refused_naming_the_field(changes, field, words):
    from tests.steps.tiny import train

    with pytest.raises(StepDeclarationError) as e:
        train(model=dataclasses.replace(SPEC, **changes))
    assert f"field `{field}`" in str(e.value) and words in str(e.value), str(e.value)


def test_the_other_families_refuse_the_new_fields():
    with pytest.raises(ValueError, match=r"model\.sliding_window: only the drydock_moe family"):
        MoeModelConfig(sliding_window=128).check()
