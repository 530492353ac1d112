"""Parameter counts of a :class:`~tilecast.graph.model_config.ModelConfig` as the cluster model uses them.

The cluster counts, per layer, the attention matrices with their biases, two
normalisations of 2 h parameters each and the MLP's matrices with their
biases, whatever the model's ``bias`` and ``norm`` fields say (GPT-3's count;
for a bias-free RMSNorm model such as Llama 2 7B it is 0.02% above the exact
:meth:`ModelConfig.n_params`). A mixture-of-experts layer holds a router
(h x experts), ``n_experts`` routed and ``n_shared_experts`` shared MLPs of the
experts' inner size. Per-layer figures of a model whose first layers are
dense are means over the layers (the cluster costs one representative layer).
"""

from __future__ import annotations


def _mlp(cfg, inner: int) -> int:
    return (3 if cfg.gated_mlp else 2) * cfg.n_embd * inner + inner + cfg.n_embd


def _attention_and_norms(cfg) -> int:
    # queries and the attention output are n_head x head_dim wide (q), which differs from h in e.g. Qwen3
    h, k, q = cfg.n_embd, cfg.kv_dim, cfg.q_dim
    return h * (q + 2 * k) + (q + 2 * k) + q * h + h + 4 * h


def expert_params(cfg) -> int:
    """One routed (or shared) expert's MLP."""
    return _mlp(cfg, cfg.expert_intermediate_size) if cfg.is_moe else 0


def layer_params(cfg):
    """Parameters of one layer (the mean over the layers of a model with dense and expert layers)."""
    dense = _attention_and_norms(cfg) + _mlp(cfg, cfg.intermediate_size)
    if not cfg.is_moe:
        return dense
    moe = (_attention_and_norms(cfg) + cfg.n_embd * cfg.n_experts
           + (cfg.n_experts + cfg.n_shared_experts) * expert_params(cfg))
    return (cfg.n_dense_layers * dense + cfg.n_moe_layers * moe) / cfg.n_layer


def moe_layer_share(cfg) -> float:
    """The fraction of layers whose MLP is a mixture of experts."""
    return cfg.n_moe_layers / cfg.n_layer


def routed_layer_params(cfg) -> float:
    """Routed experts' parameters per layer (mean over the layers): what expert parallelism spreads."""
    return moe_layer_share(cfg) * cfg.n_experts * expert_params(cfg) if cfg.is_moe else 0


def active_layer_params(cfg):
    """Parameters one token goes through in one layer (mean): the routed experts replaced by top-k of them."""
    if not cfg.is_moe:
        return layer_params(cfg)
    return layer_params(cfg) - moe_layer_share(cfg) * (cfg.n_experts - cfg.n_experts_per_token) * expert_params(cfg)


def rank_layer_params(cfg, ep: int = 1):
    """One layer's parameters on one rank of an expert-parallel group of ``ep`` (before tensor parallelism):
    the routed experts divided by ``ep``, the rest whole."""
    if not cfg.is_moe or ep == 1:
        return layer_params(cfg)
    return layer_params(cfg) - routed_layer_params(cfg) * (1.0 - 1.0 / ep)


def embedding_params(cfg) -> int:
    """The token embedding and, with learned positions, the position table."""
    return (cfg.vocab_size + cfg.learned_positions) * cfg.n_embd


def n_params(cfg):
    """The whole model as the cluster counts it: layers, embeddings, final norm, an untied head."""
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.n_embd
    return cfg.n_layer * layer_params(cfg) + embedding_params(cfg) + head + 2 * cfg.n_embd


def n_active_params(cfg):
    """:func:`n_params` with only the experts one token goes through (top-k routed and shared)."""
    return n_params(cfg) - cfg.n_layer * (layer_params(cfg) - active_layer_params(cfg))
