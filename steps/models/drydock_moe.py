"""Drydock's MoE model family (`MoeModelConfig(family="drydock_moe")`): the architecture of the
published 535B-total / 23B-active run, built as a Levanter `LmHeadModel` from Haliax modules like
Levanter's own models, so the trainer, checkpoints, the mesh, evaluation and lm-eval work unchanged.

    routed experts    top-k of `num_experts`, each a SwiGLU MLP, run as grouped matmuls (Levanter's
                      `Qwen3MoeExperts`, permuted and unpermuted as its Qwen3-MoE block does)
    shared experts    `num_shared_experts` SwiGLU MLPs of the same width that every token uses,
                      stored as one MLP of their summed width (the same function: the sum of k
                      SwiGLUs is one SwiGLU over their concatenated columns)
    attention         GQA with QK norm and RoPE; local layers see a sliding window of the last
                      `sliding_window` tokens with `num_kv_heads`; every `global_every`-th layer
                      is global: the whole sequence, `num_global_kv_heads`. Layers are scanned in
                      blocks of (global_every - 1) local layers and one global layer, so a 48-layer
                      model compiles one block, not 48 layers
    balancing         `bias`: auxiliary-loss-free (DeepSeek-V3, section 2.1.2): each layer keeps a
                      per-expert bias that is added to the router's probabilities when choosing the
                      top k, never to the weights that combine the chosen experts. Its gradient is
                      replaced by the layer's load imbalance (the share of assignments each expert
                      got minus 1/E, times `BIAS_SIGNAL`), so the optimizer moves the bias of an
                      overloaded expert down and of an idle one up, every step. With AdamW the step
                      is about the learning rate in size whatever the imbalance's size (DeepSeek-V3
                      uses a fixed rate, 0.001; here it follows the schedule). It is a `...bias`
                      path, so weight decay leaves it alone. `aux_loss`: the Switch Transformer's
                      E x sum(load x mean probability), times `load_balancing_loss_coef`. `none`.

Inside a training, the parameter counts come from the model's own shapes (`counted_parameters_of`:
`jax.eval_shape` of its init, no memory), with the routed experts' weights counted k/E toward the
active count; planning counts by arithmetic (`steps.models.levanter_fields.counted_drydock`), which
the tests hold equal to these.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import equinox as eqx
import haliax as hax
import haliax.nn as hnn
import jax
import jax.numpy as jnp
import jax.random as jrandom
from haliax import Axis, NamedArray
from haliax.jax_utils import maybe_rng_split, named_call, shaped_rng_split
from haliax.nn.scan import BlockSeq, Stacked
from haliax.state_dict import ModuleWithStateDictSerialization
from levanter.layers.attention import Attention, AttentionConfig, AttentionMask
from levanter.models.llama import LlamaEmbedding, LlamaMlp
from levanter.models.lm_model import LmConfig, LmHeadModel
from levanter.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeExperts, Qwen3MoeSparseMoeBlock

__all__ = [
    "BIAS_SIGNAL",
    "DrydockMoeBlock",
    "DrydockMoeConfig",
    "DrydockMoeLMHeadModel",
    "counted_parameters_of",
]

BIAS_SIGNAL = 1e-4
"""The balancing bias's gradient is the load imbalance times this: small, so that it adds nothing
noticeable to the gradient norm that clipping and the skip-step guard read (about 0.01 for the
hero's 48 x 384 biases), large against Adam's epsilon, which only its sign and steadiness matter to."""


class _NoHuggingFace:
    """The converter of a model no Hugging Face architecture matches: passed along, never used."""

    def replaced(self, **_changes: Any) -> _NoHuggingFace:
        return self

    def with_tokenizer_padded_to_match_model(self) -> _NoHuggingFace:
        return self

    def __getattr__(self, name: str) -> Any:
        raise NotImplementedError(
            "no Hugging Face architecture has shared experts, sliding-window local layers with their own "
            "KV heads and a balancing bias together: drydock_moe exports safetensors and a config.json "
            "(steps.models.drydock_moe_export.export_model)"
        )


@LmConfig.register_subclass("drydock_moe")
@dataclass(frozen=True)
class DrydockMoeConfig(Qwen3MoeConfig):
    """Levanter's config of the drydock_moe family: Qwen3-MoE's fields (their axes, attention,
    norms and RoPE) and what the published architecture adds."""

    num_shared_experts: int = 0
    shared_intermediate_dim: int | None = None
    """Width of each shared expert; None: `moe_intermediate_dim`."""
    sliding_window: int | None = None
    global_every: int = 1
    num_global_kv_heads: int | None = None
    balancing: str = "bias"
    load_balancing_loss_coef: float = 0.01
    router_z_loss_coef: float = 0.0
    """Router z-loss (ST-MoE): the mean squared log-sum-exp of the router logits, times this."""
    reference_checkpoint: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_layers % self.global_every:
            raise ValueError(
                f"num_layers={self.num_layers} is not a multiple of global_every={self.global_every}"
            )

    @property
    def model_type(self) -> type[DrydockMoeLMHeadModel]:  # type: ignore[override]
        return DrydockMoeLMHeadModel

    def hf_checkpoint_converter(self, ref_checkpoint: str | None = None) -> Any:  # type: ignore[override]
        # Levanter's train_lm asks every HF-compatible config for a converter up front and uses it
        # only to export or to load HF weights, which drydock_moe never asks it to do.
        return _NoHuggingFace()

    @property
    def Blocks(self) -> Axis:
        return Axis("block", self.num_layers // self.global_every)

    @property
    def LocalLayers(self) -> Axis:
        return Axis("local_layer", self.global_every - 1)

    @property
    def SharedMlp(self) -> Axis:
        return Axis(
            "mlp", (self.shared_intermediate_dim or self.moe_intermediate_dim) * self.num_shared_experts
        )

    def layer_attention(self, is_global: bool) -> AttentionConfig:
        """The attention of a local layer (the window, `num_kv_heads`) or a global one."""
        base = self.attention_config()
        if is_global:
            return dataclasses.replace(base, num_kv_heads=self.num_global_kv_heads or self.num_kv_heads)
        return dataclasses.replace(base, sliding_window=self.sliding_window)

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.global_every == 0

    def flops_per_token(self, vocab_size: int, context_length: int) -> float | None:
        """Forward FLOPs per token, as Levanter's `lm_flops_per_token` counts them (which knows
        neither shared experts nor windows): 2 per active weight a token multiplies (all but the
        embedding lookup), and attention over the whole sequence on global layers, over the
        window on local ones."""
        _total, active = counted_parameters_of(self, vocab_size)
        window = min(self.sliding_window or context_length, context_length)
        attended = sum(context_length if self.is_global(i) else window for i in range(self.num_layers))
        heads, head = self.num_heads, self.actual_head_size
        return 2.0 * (active - vocab_size * self.hidden_dim) + attended * (4 * heads * head + 3 * heads)

    def total_trainable_params(self, vocab_size: int) -> int:
        return counted_parameters_of(self, vocab_size)[0]


def _load_share(selected: jax.Array, num_experts: int) -> jax.Array:
    counts = jnp.bincount(selected.reshape(-1), length=num_experts)
    return counts / jnp.maximum(counts.sum(), 1)


class Routing(NamedTuple):
    """A router's decision on a batch of tokens, and its statistics."""

    weights: NamedArray
    """(token, top): the weights that combine each token's chosen experts (without the bias)."""
    chosen: NamedArray
    """(token, top): the experts chosen (with the bias)."""
    load: jax.Array
    """(experts,): each expert's share of the assignments."""
    mean_probs: jax.Array
    """(experts,): the mean router probability of each expert."""
    z_squared: jax.Array
    """The mean squared log-sum-exp of the router logits (what the z-loss penalizes)."""


@jax.custom_vjp
def _balancing_bias(bias: jax.Array, load: jax.Array) -> jax.Array:
    """`bias` itself; its gradient is the load imbalance (see the module docstring)."""
    return bias


def _balancing_bias_fwd(bias: jax.Array, load: jax.Array) -> tuple[jax.Array, jax.Array]:
    return bias, load


def _balancing_bias_bwd(load: jax.Array, _cotangent: jax.Array) -> tuple[jax.Array, jax.Array]:
    imbalance = load - 1.0 / load.shape[-1]
    return (BIAS_SIGNAL * imbalance).astype(_cotangent.dtype), jnp.zeros_like(load)


_balancing_bias.defvjp(_balancing_bias_fwd, _balancing_bias_bwd)


class DrydockMoeBlock(Qwen3MoeSparseMoeBlock):
    """Routed experts (grouped matmuls), shared experts and the router with its balancing bias."""

    shared: LlamaMlp | None
    router_bias: NamedArray | None
    """(Experts,): added to the router's probabilities to choose experts (balancing 'bias')."""

    @staticmethod
    def init(config: DrydockMoeConfig, *, key: Any) -> DrydockMoeBlock:  # type: ignore[override]
        k_gate, k_experts, k_shared = jrandom.split(key, 3)
        gate = hnn.Linear.init(config.Embed, config.Experts, key=k_gate, use_bias=False)
        experts = Qwen3MoeExperts.init(
            Experts=config.Experts,
            Embed=config.Embed,
            Mlp=config.MoeMlp,
            activation_fn=config.activation_function.to_fn(),
            key=k_experts,
            use_bias=False,
        )
        shared = None
        if config.num_shared_experts:
            shared = LlamaMlp.init(
                config.Embed, config.SharedMlp, config.activation_function, key=k_shared, use_bias=False
            )
        bias = hax.zeros(config.Experts) if config.balancing == "bias" else None
        return DrydockMoeBlock(config=config, gate=gate, experts=experts, shared=shared, router_bias=bias)

    def route(self, x_flat: NamedArray) -> Routing:
        """Which experts each token goes to, with what weights, and the router's statistics."""
        config = self.config
        token, experts, top = x_flat.resolve_axis("token"), config.Experts, config.TopExperts
        logits = self.gate(x_flat).astype(jnp.float32).rearrange((token, experts)).array
        probs = jax.nn.softmax(logits, axis=-1)
        scores = probs
        if self.router_bias is not None:
            # Chosen with the bias (no gradient through the choice)...
            _, chosen = jax.lax.top_k(jax.lax.stop_gradient(probs) + self.router_bias.array, top.size)
        else:
            _, chosen = jax.lax.top_k(scores, top.size)
        # ...combined without it.
        weights = jnp.take_along_axis(probs, chosen, axis=-1)
        if config.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdims=True)
        load = _load_share(chosen, config.num_experts)
        return Routing(
            hax.named(weights, (token, top)),
            hax.named(chosen, (token, top)),
            load,
            probs.mean(axis=0),
            jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2),
        )

    @named_call
    def __call__(self, x: NamedArray, *, key: Any = None) -> tuple[NamedArray, jax.Array]:  # type: ignore[override]
        """The block's output and its auxiliary loss: the router z-loss, plus the balancing loss
        where balancing is 'aux_loss'."""
        config = self.config
        squash = [x.resolve_axis(a) for a in ("batch", config.max_Pos.name) if x.has_axis(a)]
        k_experts, k_shared = maybe_rng_split(key, 2)
        x_flat = hax.flatten_axes(x, old_axes=squash, new_axis="token")
        token, top = x_flat.resolve_axis("token"), config.TopExperts
        weights, chosen, load, mean_probs, z_squared = self.route(x_flat)
        flat_idx = hax.flatten_axes(chosen, old_axes=[token, top], new_axis="token_repeat")
        repeat = flat_idx.resolve_axis("token_repeat")
        x_sorted, group_sizes, sort_idx = self._permute(x_flat, flat_idx, repeat)
        out_sorted = _grouped_experts(self.experts, x_sorted, group_sizes, key=k_experts)
        out = self._unpermute(out_sorted, sort_idx, token, top).dot(weights.astype(x.dtype), axis=top)
        out = hax.unflatten_axis(out, axis=token, new_axes=squash)
        if self.shared is not None:
            out = out + self.shared(x, key=k_shared)
        aux = config.router_z_loss_coef * z_squared
        if self.router_bias is not None:
            # The bias enters the loss graph as 0 x bias, so that it gets a cotangent, which
            # `_balancing_bias` replaces with the load imbalance of this batch.
            fed = _balancing_bias(self.router_bias.array, jax.lax.stop_gradient(load))
            aux = aux + 0.0 * fed.sum()
        elif config.balancing == "aux_loss":
            aux = aux + config.load_balancing_loss_coef * config.num_experts * jnp.sum(
                jax.lax.stop_gradient(load) * mean_probs
            )
        return out, aux


def _mesh_platform() -> str | None:
    """The platform of the mesh the model is computed on (inside `jit` too)."""
    from jax._src.mesh import get_concrete_mesh

    for mesh in (get_concrete_mesh(), hax.partitioning._get_mesh()):
        try:
            return next(iter(mesh.devices.flat)).platform
        except Exception:  # no mesh, an empty one, or an abstract one (no devices): look further
            continue
    return None


def _grouped_experts(
    experts: Qwen3MoeExperts, x: NamedArray, group_sizes: NamedArray, *, key: Any
) -> NamedArray:
    """The experts' grouped matmuls over the sorted tokens.

    On TPUs, with an expert count that is not a power of two, the groups are padded with empty
    ones (zero weights, no tokens) to the next power of two: libtpu 0.0.42 cannot compile the
    ragged matmul's group sizes otherwise ("Bitcast cannot have different shape sizes of output
    (1536) and operand (2048)" for the hero's 384 experts on v5p and v6e; 256 and 512 compile),
    found compiling the hero with `drydock plan --compile`. An empty group adds no FLOPs and no
    gradient (padding's transpose is a slice); the price is the padded copy of the experts'
    weights while a layer computes (a third more for 384)."""
    count = group_sizes.resolve_axis(experts.gate_proj.Experts.name).size
    padded = 1 << (count - 1).bit_length()
    if padded == count or _mesh_platform() != "tpu":
        return experts(x, group_sizes, key=key)
    more = padded - count

    def pad(linear: hnn.MoELinear) -> hnn.MoELinear:
        axis = linear.weight.axes.index(linear.Experts)
        widths = [(0, more if i == axis else 0) for i in range(linear.weight.ndim)]
        Experts = linear.Experts.resize(padded)
        axes = tuple(Experts if a == linear.Experts else a for a in linear.weight.axes)
        weight = hax.named(jnp.pad(linear.weight.array, widths), axes)
        return hnn.MoELinear(weight, None, Experts, linear.In, linear.Out, use_gmm=linear.use_gmm)

    wide = Qwen3MoeExperts(pad(experts.gate_proj), pad(experts.up_proj), pad(experts.down_proj), experts.act)
    sizes = hax.named(jnp.pad(group_sizes.array, (0, more)), (group_sizes.axes[0].resize(padded),))
    return wide(x, sizes, key=key)


class DrydockMoeLayer(eqx.Module):
    """A decoder layer: attention (local or global), then the MoE block, each pre-normed."""

    config: DrydockMoeConfig = eqx.field(static=True)
    is_global: bool = eqx.field(static=True)
    self_attn: Attention
    mlp: DrydockMoeBlock
    input_layernorm: hnn.RmsNorm
    post_attention_layernorm: hnn.RmsNorm

    @staticmethod
    def init(config: DrydockMoeConfig, is_global: bool, *, key: Any) -> DrydockMoeLayer:
        k_attn, k_mlp = jrandom.split(key, 2)
        return DrydockMoeLayer(
            config,
            is_global,
            Attention.init(config.layer_attention(is_global), key=k_attn),
            DrydockMoeBlock.init(config, key=k_mlp),
            config.mk_LayerNorm(config.Embed),
            config.mk_LayerNorm(config.Embed),
        )

    @named_call
    def __call__(
        self, x: NamedArray, mask: Any, *, key: Any = None, pos_ids: NamedArray | None = None
    ) -> tuple[NamedArray, jax.Array]:
        k_attn, k_mlp = maybe_rng_split(key, 2)
        if isinstance(mask, NamedArray):
            # Levanter applies a layer's window to a structured mask only: make this one structured.
            mask = AttentionMask.explicit(mask)
        x = x + self.self_attn(x=self.input_layernorm(x), mask=mask, key=k_attn, pos_ids=pos_ids)
        out, aux = self.mlp(self.post_attention_layernorm(x), key=k_mlp)
        return x + out, aux


class DrydockMoeGroup(eqx.Module):
    """`global_every - 1` local layers (scanned) and one global layer: what the transformer scans."""

    local: Stacked[DrydockMoeLayer] | None
    global_layer: DrydockMoeLayer

    @staticmethod
    def init(config: DrydockMoeConfig, *, key: Any) -> DrydockMoeGroup:
        k_local, k_global = jrandom.split(key, 2)
        local = None
        if config.global_every > 1:
            local = Stacked.init(
                config.LocalLayers, DrydockMoeLayer, gradient_checkpointing=config.gradient_checkpointing
            )(config, False, key=shaped_rng_split(k_local, config.LocalLayers.size))
        return DrydockMoeGroup(local, DrydockMoeLayer.init(config, True, key=k_global))

    def __call__(
        self, x: NamedArray, mask: Any, *, key: Any = None, pos_ids: NamedArray | None = None
    ) -> tuple[NamedArray, jax.Array]:
        k_local, k_global = maybe_rng_split(key, 2)
        aux = jnp.zeros((), jnp.float32)
        if self.local is not None:
            keys = maybe_rng_split(k_local, self.local.Block.size) if k_local is not None else None
            x, auxes = self.local.scan(x, mask, key=keys, pos_ids=pos_ids)
            aux = aux + auxes.sum()
        x, last = self.global_layer(x, mask, key=k_global, pos_ids=pos_ids)
        return x, aux + last

    def layers(self) -> list[DrydockMoeLayer]:
        local = list(self.local.unstacked()) if self.local is not None else []
        return [*local, self.global_layer]


class DrydockMoeTransformer(eqx.Module):
    config: DrydockMoeConfig = eqx.field(static=True)
    groups: Stacked[DrydockMoeGroup] | BlockSeq[DrydockMoeGroup]
    norm: hnn.RmsNorm

    @staticmethod
    def init(config: DrydockMoeConfig, *, key: Any) -> DrydockMoeTransformer:
        make = Stacked if config.scan_layers else BlockSeq
        groups = make.init(
            config.Blocks, DrydockMoeGroup, gradient_checkpointing=config.gradient_checkpointing
        )(config, key=shaped_rng_split(key, config.Blocks.size))
        return DrydockMoeTransformer(config, groups, config.mk_LayerNorm(config.Embed))

    def __call__(
        self, x: NamedArray, mask: Any, *, key: Any = None, pos_ids: NamedArray | None = None
    ) -> tuple[NamedArray, jax.Array]:
        keys = maybe_rng_split(key, self.config.Blocks.size) if key is not None else None
        x, auxes = self.groups.scan(x, mask, key=keys, pos_ids=pos_ids)
        return self.norm(x), jnp.sum(auxes)

    def layers(self) -> list[DrydockMoeLayer]:
        """Every decoder layer, in order (unstacked: for reading routers, not for training)."""
        return [layer for group in self.groups.unstacked() for layer in group.layers()]


class DrydockMoeLMHeadModel(ModuleWithStateDictSerialization, LmHeadModel[DrydockMoeConfig]):
    transformer: DrydockMoeTransformer
    embeddings: LlamaEmbedding
    lm_head: hnn.Linear | None

    @property
    def config(self) -> DrydockMoeConfig:
        return self.transformer.config

    @property
    def Vocab(self) -> Axis:
        return self.embeddings.Vocab

    @classmethod
    def init(cls, Vocab: Axis, config: DrydockMoeConfig, *, key: Any) -> DrydockMoeLMHeadModel:  # type: ignore[override]
        k_t, k_emb, k_head = jrandom.split(key, 3)
        head = None
        if not config.tie_word_embeddings:
            head = hnn.Linear.init(In=config.Embed, Out=Vocab, key=k_head, use_bias=False, out_first=True)
        return cls(
            DrydockMoeTransformer.init(config, key=k_t), LlamaEmbedding.init(Vocab, config, key=k_emb), head
        )

    def activations(  # type: ignore[override]
        self,
        input_ids: NamedArray,
        attn_mask: Any = None,
        *,
        key: Any = None,
        pos_ids: NamedArray | None = None,
    ) -> tuple[NamedArray, jax.Array]:
        x = self.embeddings.embed(input_ids)
        return self.transformer(x, attn_mask, key=key, pos_ids=pos_ids)

    def __call__(  # type: ignore[override]
        self,
        input_ids: NamedArray,
        attn_mask: Any = None,
        pos_ids: NamedArray | None = None,
        *,
        key: Any = None,
    ) -> NamedArray:
        x, _aux = self.activations(input_ids, attn_mask, key=key, pos_ids=pos_ids)
        return hax.dot(x, self.get_lm_head(), axis=self.Embed)

    def get_lm_head(self) -> NamedArray:
        return self.embeddings.token_embeddings.weight if self.lm_head is None else self.lm_head.weight

    def resize_vocab(self, new_size: int, key: Any = None) -> DrydockMoeLMHeadModel:
        raise NotImplementedError("drydock_moe models keep the vocabulary they were built with")

    def router_loads(self, tokens: NamedArray, attn_mask: Any) -> list[jax.Array]:
        """Each layer's share of assignments per expert on `tokens` (with the bias, as trained)."""
        x = self.embeddings.embed(tokens)
        loads = []
        for layer in self.transformer.layers():
            mask = AttentionMask.explicit(attn_mask) if isinstance(attn_mask, NamedArray) else attn_mask
            x = x + layer.self_attn(x=layer.input_layernorm(x), mask=mask, key=None)
            h = layer.post_attention_layernorm(x)
            squash = [h.resolve_axis(a) for a in ("batch", self.config.max_Pos.name) if h.has_axis(a)]
            routing = layer.mlp.route(hax.flatten_axes(h, old_axes=squash, new_axis="token"))
            loads.append(routing.load)
            x = x + layer.mlp(h)[0]
        return loads

    def _state_dict_key_map(self) -> dict[str, str | None]:
        return {"transformer": "model", "embeddings": None}


# -- parameters counted from the model's own shapes ----------------------------------------------


def _size(tree: Any) -> int:
    """Parameters in `tree` (of `jax.eval_shape`'s shapes, or of arrays)."""
    return sum(
        int(math.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(tree) if hasattr(leaf, "shape")
    )


_COUNTED: dict[tuple[str, int], tuple[int, int]] = {}


def counted_parameters_of(config: DrydockMoeConfig, vocab_size: int) -> tuple[int, int]:
    """(total, active) parameters of the model `config` builds, from its shapes: active leaves
    out the routed experts a token is not sent to (their weights count k/E)."""
    key = (repr(dataclasses.replace(config, max_seq_len=2, tokenizer=None)), vocab_size)
    if key not in _COUNTED:
        shapes = jax.eval_shape(
            lambda: DrydockMoeLMHeadModel.init(Axis("vocab", vocab_size), config, key=jrandom.PRNGKey(0))
        )
        total = _size(shapes)
        experts = [
            m
            for m in jax.tree_util.tree_leaves(shapes, is_leaf=lambda m: isinstance(m, Qwen3MoeExperts))
            if isinstance(m, Qwen3MoeExperts)
        ]
        routed = _size(experts)
        idle = routed * (config.num_experts - config.num_experts_per_tok) // config.num_experts
        _COUNTED[key] = (total, total - idle)
    return _COUNTED[key]
