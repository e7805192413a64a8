"""The fields of Levanter's MoE configs that mean the same thing in every family (Drydock's own is
built on Qwen3-MoE's), written once; and the parameter counts of every family, by arithmetic (the
tests check each against the models Levanter and `steps.models.drydock_moe` build): planning
counts parameters, and must not import JAX to do it."""

from __future__ import annotations

from typing import Any

from steps.models.config import MoeModelConfig


def counted(model: MoeModelConfig, vocab_size: int, *, qk_norm: bool) -> tuple[int, int]:
    """(total, active) of a Levanter MoE: every layer with the model's KV heads (and QK norm's two
    weights when `qk_norm`), no router bias, one dense shared expert if any (`_counted`)."""
    shared_width = model.expert_intermediate_dim if model.num_shared_experts else 0
    kv_heads = [model.num_kv_heads] * model.num_layers
    return _counted(
        model, vocab_size, qk_norm=qk_norm, kv_heads=kv_heads, shared_width=shared_width, router_bias=False
    )


def counted_drydock(model: MoeModelConfig, vocab_size: int) -> tuple[int, int]:
    """(total, active) of a drydock_moe model (`steps.models.drydock_moe`): Qwen3-MoE's layer with
    the global layers' own KV heads, `num_shared_experts` shared experts of their own width (one
    dense MLP), and a per-expert router bias under `bias` balancing. Arithmetic: building the
    model's shapes to count them imported JAX and Levanter into every plan of such a model (the
    hero's `drydock plan` took 9.6 s with them, 1.0 s without)."""
    global_kv = model.num_global_kv_heads or model.num_kv_heads
    kv_heads = [
        global_kv if (layer + 1) % model.global_every == 0 else model.num_kv_heads
        for layer in range(model.num_layers)
    ]
    shared_width = (
        model.shared_expert_intermediate_dim or model.expert_intermediate_dim
    ) * model.num_shared_experts
    return _counted(
        model,
        vocab_size,
        qk_norm=model.qk_norm,
        kv_heads=kv_heads,
        shared_width=shared_width,
        router_bias=model.balancing == "bias",
    )


def _counted(
    model: MoeModelConfig,
    vocab_size: int,
    *,
    qk_norm: bool,
    kv_heads: list[int],
    shared_width: int,
    router_bias: bool,
) -> tuple[int, int]:
    """(total, active): per layer, attention with that layer's KV heads (q, k, v, o, and QK norm's
    two weights when `qk_norm`), the router (and its per-expert bias), routed experts of three
    matrices, the shared experts as one dense MLP `shared_width` wide, two norms; then the final
    norm, the embeddings and the head unless tied. Active leaves out the routed experts a token is
    not sent to."""
    d = model.hidden_dim
    h, hd = model.num_heads, model.actual_head_dim
    experts, k, m = model.num_experts, model.num_experts_per_token, model.expert_intermediate_dim
    expert = 3 * d * m  # gate, up, down
    attention = sum(d * hd * (h + 2 * kv) + h * hd * d + (2 * hd if qk_norm else 0) for kv in kv_heads)
    moe = d * experts + (experts if router_bias else 0) + experts * expert + 3 * d * shared_width
    layers = len(kv_heads)
    embed = vocab_size * d
    head = 0 if model.tie_embeddings else vocab_size * d
    total = attention + layers * (moe + 2 * d) + d + embed + head  # 2 RMSNorm weights a layer, 1 final
    return total, total - layers * (experts - k) * expert


def common_fields(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> dict[str, Any]:
    """The Levanter config fields every MoE family (Levanter's and Drydock's) takes alike."""
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig

    return dict(
        max_seq_len=seq_len,
        hidden_dim=model.hidden_dim,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        tie_word_embeddings=model.tie_embeddings,
        rope=DefaultRotaryEmbeddingsConfig(theta=model.rope_theta),
        tokenizer=tokenizer,
    )


def qwen3_fields(model: MoeModelConfig, seq_len: int, tokenizer: str | None) -> dict[str, Any]:
    """`common_fields` and the fields of Levanter's `Qwen3MoeConfig` (and of Drydock's, which
    extends it): head width, expert widths and counts, QK norm."""
    return dict(
        **common_fields(model, seq_len, tokenizer),
        head_dim=model.head_dim,
        intermediate_dim=model.expert_intermediate_dim,
        moe_intermediate_dim=model.expert_intermediate_dim,
        num_experts=model.num_experts,
        num_experts_per_tok=model.num_experts_per_token,
        use_qk_norm=model.qk_norm,
    )


def check_heads(model: MoeModelConfig, *, free_head_dim: bool) -> None:
    """hidden_dim must split into the heads unless the family takes its own head_dim and one is set."""
    if model.hidden_dim % model.num_heads and not (free_head_dim and model.head_dim is not None):
        raise ValueError(f"model.num_heads: {model.num_heads} does not divide hidden_dim {model.hidden_dim}")
