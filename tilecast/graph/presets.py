"""Every named model shape, in one table: what ``--model NAME`` means to every command.

Each entry holds :class:`~tilecast.graph.model_config.ModelConfig` fields; the
source of each shape is named beside it. The tile graphs (graph, verify, run,
simulate, tune, train) build the ``gpt2`` and ``llama`` families without
experts; the cluster what-if (``tilecast whatif``, ``tilecast validate``) takes
every entry.
"""

_LLAMA2 = dict(family="llama", vocab_size=32000, n_positions=4096, tie_word_embeddings=False)
_LLAMA3 = dict(family="llama", vocab_size=128256, n_positions=8192, rope_theta=500000.0, tie_word_embeddings=False)
# MPT: LayerNorm without biases, GELU, ALiBi, tied head (llm-foundry's mpt-*.yaml: no_bias, alibi, vocab 50368)
_MPT = dict(family="decoder", norm="layernorm", activation="gelu", position_embedding="alibi", bias=False,
            vocab_size=50368, n_positions=2048)

PRESETS = {
    # GPT-2 shapes from Radford et al. 2019 (Table 2) and the Hugging Face model cards.
    "gpt2-tiny": dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128),
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16, vocab_size=50257, n_positions=1024),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20, vocab_size=50257, n_positions=1024),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25, vocab_size=50257, n_positions=1024),
    # A Llama for tests: grouped-query attention (2 query heads per KV head), an inner size
    # that is not 4x, an untied head.
    "llama-tiny": dict(family="llama", n_layer=2, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=176,
                       vocab_size=256, n_positions=128),
    # Shapes from the models' config.json on the Hugging Face Hub:
    # HuggingFaceTB/SmolLM2-135M/config.json (hidden_size 576, 30 layers, 9 heads, 3 KV heads,
    # intermediate_size 1536, vocab 49152, 8192 positions, rms_norm_eps 1e-5, rope_theta 100000, tied).
    "smollm2-135m": dict(family="llama", n_layer=30, n_embd=576, n_head=9, n_kv_head=3, intermediate_size=1536,
                         vocab_size=49152, n_positions=8192, layer_norm_epsilon=1e-5, rope_theta=100000.0,
                         tie_word_embeddings=True),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T/config.json (hidden_size 2048, 22 layers,
    # 32 heads, 4 KV heads, intermediate_size 5632, vocab 32000, 2048 positions, rms_norm_eps 1e-5,
    # rope_theta 10000, untied).
    "tinyllama-1.1b": dict(family="llama", n_layer=22, n_embd=2048, n_head=32, n_kv_head=4, intermediate_size=5632,
                           vocab_size=32000, n_positions=2048, layer_norm_epsilon=1e-5, rope_theta=10000.0,
                           tie_word_embeddings=False),
    # meta-llama/Llama-3.2-1B/config.json (hidden_size 2048, 16 layers, 32 heads, 8 KV heads,
    # intermediate_size 8192, vocab 128256, 131072 positions, rms_norm_eps 1e-5, rope_theta 500000,
    # rope_scaling "llama3" with factor 32, low_freq_factor 1, high_freq_factor 4,
    # original_max_position_embeddings 8192; tied).
    "llama-3.2-1b": dict(family="llama", n_layer=16, n_embd=2048, n_head=32, n_kv_head=8, intermediate_size=8192,
                         vocab_size=128256, n_positions=131072, layer_norm_epsilon=1e-5, rope_theta=500000.0,
                         rope_scaling="llama3", rope_factor=32.0, rope_low_freq_factor=1.0,
                         rope_high_freq_factor=4.0, rope_original_positions=8192, tie_word_embeddings=True),
    # --- larger shapes, for the cluster what-if ---
    # Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1 (GPT-2's architecture; vocabulary:
    # GPT-2 BPE; 2048 positions).
    "gpt3-6.7b": dict(n_layer=32, n_embd=4096, n_head=32, vocab_size=50257, n_positions=2048),
    "gpt3-175b": dict(n_layer=96, n_embd=12288, n_head=96, vocab_size=50257, n_positions=2048),
    # NVIDIA NeMo-Megatron-Launcher conf/training/gpt3/{5b,20b}.yaml (GPT-2 BPE padded to a multiple of 128).
    "gpt3-5b": dict(n_layer=24, n_embd=4096, n_head=32, vocab_size=50304, n_positions=2048),
    "gpt3-20b": dict(n_layer=44, n_embd=6144, n_head=48, vocab_size=50304, n_positions=2048),
    # Smith et al. 2022, "Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B", Sec. 2.
    "mt-nlg-530b": dict(n_layer=105, n_embd=20480, n_head=128, vocab_size=50257, n_positions=2048),
    # BigScience, Le Scao et al. 2022, "BLOOM", Table 3: LayerNorm with biases, GELU, ALiBi (no position
    # table), tied head; 2048 training positions.
    "bloom-176b": dict(family="decoder", norm="layernorm", activation="gelu", position_embedding="alibi", bias=True,
                       n_layer=70, n_embd=14336, n_head=112, vocab_size=250880, n_positions=2048),
    # MosaicML llm-foundry MPT shapes (scripts/train/yamls/pretrain/mpt-*.yaml).
    "mpt-1b": dict(_MPT, n_layer=24, n_embd=2048, n_head=16),
    "mpt-3b": dict(_MPT, n_layer=32, n_embd=2560, n_head=20),
    "mpt-7b": dict(_MPT, n_layer=32, n_embd=4096, n_head=32),
    "mpt-13b": dict(_MPT, n_layer=40, n_embd=5120, n_head=40),
    # 30B: 56 heads of 128, as mpt-30b.yaml states (llm-foundry commit b2a43a147, whose benchmark tables the
    # cluster validation uses); the released MPT-30B checkpoint has 64 heads of 112.
    "mpt-30b": dict(_MPT, n_layer=48, n_embd=7168, n_head=56),
    "mpt-70b": dict(_MPT, n_layer=80, n_embd=8192, n_head=64),
    # Touvron et al. 2023, "Llama 2", Table 1 and the released configs (SwiGLU, untied head, 4096 positions;
    # GQA for 70B).
    "llama2-7b": dict(_LLAMA2, n_layer=32, n_embd=4096, n_head=32, intermediate_size=11008),
    "llama2-13b": dict(_LLAMA2, n_layer=40, n_embd=5120, n_head=40, intermediate_size=13824),
    "llama2-70b": dict(_LLAMA2, n_layer=80, n_embd=8192, n_head=64, n_kv_head=8, intermediate_size=28672),
    # Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3 (GQA, SwiGLU, untied head; 8192 positions as
    # pre-trained).
    "llama3-8b": dict(_LLAMA3, n_layer=32, n_embd=4096, n_head=32, n_kv_head=8, intermediate_size=14336),
    "llama3-70b": dict(_LLAMA3, n_layer=80, n_embd=8192, n_head=64, n_kv_head=8, intermediate_size=28672),
    "llama3-405b": dict(_LLAMA3, n_layer=126, n_embd=16384, n_head=128, n_kv_head=8, intermediate_size=53248),
    # --- mixtures of experts ---
    # mistralai/Mixtral-8x7B-v0.1/config.json (Jiang et al. 2024, "Mixtral of Experts"): hidden 4096, 32 layers,
    # 32 heads, 8 KV heads, 8 experts of inner size 14336, 2 per token, vocab 32000, 32768 positions,
    # rope_theta 1e6, untied; 46.7 B parameters, 12.9 B active.
    "mixtral-8x7b": dict(family="llama", n_layer=32, n_embd=4096, n_head=32, n_kv_head=8, intermediate_size=14336,
                         vocab_size=32000, n_positions=32768, rope_theta=1e6, tie_word_embeddings=False,
                         n_experts=8, n_experts_per_token=2),
    # deepseek-ai/deepseek-moe-16b-base/config.json (Dai et al. 2024, "DeepSeekMoE"): hidden 2048, 28 layers,
    # 16 heads (MHA), 64 routed experts of inner size 1408, 6 per token, 2 shared experts, the first layer dense
    # (first_k_dense_replace 1, inner size 10944), vocab 102400, 4096 positions, untied; 16.4 B parameters,
    # 2.8 B active.
    "deepseek-moe-16b": dict(family="llama", n_layer=28, n_embd=2048, n_head=16, intermediate_size=10944,
                             vocab_size=102400, n_positions=4096, layer_norm_epsilon=1e-6,
                             tie_word_embeddings=False, n_experts=64, n_experts_per_token=6,
                             expert_intermediate_size=1408, n_shared_experts=2, n_dense_layers=1),
    # Qwen/Qwen3-30B-A3B/config.json (model_type qwen3_moe): hidden 2048, 48 layers, 32 heads of head_dim 128
    # (4096 wide, twice the hidden size), 4 KV heads, 128 experts of inner size 768 (moe_intermediate_size), 8 per
    # token, every layer an expert layer, vocab 151936, 40960 positions, rope_theta 1e6, untied; the per-head
    # query/key RMSNorms (2 x 128 parameters a layer) are not counted. 30.5 B parameters, 3.3 B active.
    "qwen3-30b-a3b": dict(family="llama", n_layer=48, n_embd=2048, n_head=32, n_kv_head=4, head_dim=128,
                          intermediate_size=6144, vocab_size=151936, n_positions=40960, rope_theta=1e6,
                          layer_norm_epsilon=1e-6, tie_word_embeddings=False, n_experts=128, n_experts_per_token=8,
                          expert_intermediate_size=768),
    # openai/gpt-oss-120b/config.json (model_type gpt_oss; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card",
    # arXiv:2508.10925): hidden 2880, 36 layers, 64 heads of head_dim 64 (4096 wide), 8 KV heads, attention and
    # expert biases, 128 experts of inner size 2880, 4 per token (SwiGLU), vocab 201088, 131072 positions
    # (YaRN), rope_theta 150000, rms_norm_eps 1e-5, untied. Half its layers attend over a 128-token sliding
    # window and each head has a learned softmax sink: neither is modelled (every layer attends causally over
    # the whole sequence). 116.8 B parameters, 5.1 B active (the model card).
    "gpt-oss-120b": dict(family="decoder", norm="rmsnorm", activation="swiglu", position_embedding="rope", bias=True,
                         n_layer=36, n_embd=2880, n_head=64, n_kv_head=8, head_dim=64, intermediate_size=2880,
                         vocab_size=201088, n_positions=131072, rope_theta=150000.0, rope_scaling="yarn",
                         tie_word_embeddings=False, n_experts=128, n_experts_per_token=4),
}
