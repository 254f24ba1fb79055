"""Hugging Face `config.json` documents as the hub publishes them (written out here: the tests never
reach the hub), for the config-file input's tests."""

from __future__ import annotations

from typing import Any

LLAMA_3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 8192,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}
"""meta-llama/Meta-Llama-3-8B config.json."""

LLAMA_3_1_8B: dict[str, Any] = {
    **LLAMA_3_8B,
    "eos_token_id": [128001, 128008, 128009],
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "transformers_version": "4.43.0.dev0",
}
"""meta-llama/Llama-3.1-8B config.json: Llama 3's shape, a longer context and scaled rotary positions."""

QWEN2_5_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "model_type": "qwen2",
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1",
    "use_cache": True,
    "use_mrope": False,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
"""Qwen/Qwen2.5-7B config.json."""

MISTRAL_7B_V0_3: dict[str, Any] = {
    "architectures": ["MistralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.42.0.dev0",
    "use_cache": True,
    "vocab_size": 32768,
}
"""mistralai/Mistral-7B-v0.3 config.json (no sliding window)."""

MISTRAL_7B_V0_1: dict[str, Any] = {**MISTRAL_7B_V0_3, "sliding_window": 4096, "rope_theta": 10000.0, "vocab_size": 32000}
"""mistralai/Mistral-7B-v0.1 config.json: a 4,096-token sliding window."""


def nested(depth: int) -> dict[str, Any]:
    """An object nested `depth` levels deep ({"a": {"a": ... {}}})."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


TINY_WIDTH: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
"""`tiny`'s width as config.json keys (hidden 64, MLP 256, 4 heads over 2 KV heads, 2 layers,
vocabulary 256): what each TINY_ config below puts over its published config."""


TINY_LLAMA: dict[str, Any] = {
    **LLAMA_3_8B,
    **TINY_WIDTH,
}
"""A config.json of Llama 3's kind at `tiny`'s width (hidden 64, 4 heads over 2 KV heads, 2 layers,
vocabulary 256): what a CPU runs."""


TINY_MISTRAL: dict[str, Any] = {
    **MISTRAL_7B_V0_1,
    **TINY_WIDTH,
    "sliding_window": 16,
}
"""Mistral at `tiny`'s width with a 16-token sliding window."""


TINY_QWEN2: dict[str, Any] = {
    **QWEN2_5_7B,
    **TINY_WIDTH,
}
"""Qwen2.5 at `tiny`'s width: Llama's shape with biases on q, k and v, hidden 64, 4 heads over 2 KV
heads, 2 layers, vocabulary 256."""


MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mixtral",
    "num_attention_heads": 32,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0",
    "use_cache": True,
    "vocab_size": 32000,
}
"""mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, top-2, no sliding window."""

TINY_MIXTRAL: dict[str, Any] = {
    **MIXTRAL_8X7B,
    **TINY_WIDTH,
    "num_local_experts": 4,
}
"""Mixtral at `tiny`'s width: 2 layers of 4 experts (top-2, inner width 256), hidden 64, 4 heads over
2 KV heads, vocabulary 256."""

DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV2Config",
        "AutoModel": "modeling_deepseek.DeepseekV2Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM",
    },
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "ep_size": 1,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}
"""deepseek-ai/DeepSeek-V2-Lite config.json: MLA without query compression (q_lora_rank null), 64
routed experts (top-6, 1408 wide) and 2 shared, the first block dense (10944 wide)."""

TINY_DEEPSEEK_V2: dict[str, Any] = {
    **DEEPSEEK_V2_LITE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "vocab_size": 256,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "max_position_embeddings": 128,
}
"""DeepSeek-V2-Lite's architecture at `tiny`'s width: 2 blocks (the first dense, 128 wide; the
second 4 routed experts top-2 and 1 shared, 32 wide), hidden 64, 4 heads over a 32-wide latent
(query/key 16 + 8 rotary, value 16), vocabulary 256."""


GEMMA_2_2B: dict[str, Any] = {
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2304,
    "initializer_range": 0.02,
    "intermediate_size": 9216,
    "max_position_embeddings": 8192,
    "model_type": "gemma2",
    "num_attention_heads": 8,
    "num_hidden_layers": 26,
    "num_key_value_heads": 4,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "torch_dtype": "float32",
    "transformers_version": "4.42.4",
    "use_cache": True,
    "vocab_size": 256000,
}
"""google/gemma-2-2b config.json: heads 256 wide over a 2,304-wide stream (not 2304 / 8), the head
tied (no key: the config class's default), soft-caps 50 and 30, a 4,096-token window."""

GEMMA_2_9B: dict[str, Any] = {
    **GEMMA_2_2B,
    "hidden_size": 3584,
    "intermediate_size": 14336,
    "num_attention_heads": 16,
    "num_hidden_layers": 42,
    "num_key_value_heads": 8,
}
"""google/gemma-2-9b config.json (its shape keys; the rest as 2B's)."""

GEMMA_2_27B: dict[str, Any] = {
    **GEMMA_2_2B,
    "head_dim": 128,
    "hidden_size": 4608,
    "intermediate_size": 36864,
    "num_attention_heads": 32,
    "num_hidden_layers": 46,
    "num_key_value_heads": 16,
    "query_pre_attn_scalar": 144,
}
"""google/gemma-2-27b config.json (its shape keys): attention scaled by 144⁻½, not head_dim⁻½."""

TINY_GEMMA_2: dict[str, Any] = {
    **GEMMA_2_2B,
    **TINY_WIDTH,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
}
"""Gemma 2 at `tiny`'s width with heads of their own width: 4 heads 32 wide over a 64-wide stream
(hidden_size / num_heads would be 16), 2 KV heads, 2 layers, the head tied, vocabulary 256."""

PHI_3_MINI_4K: dict[str, Any] = {
    "_name_or_path": "Phi-3-mini-4k-instruct",
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config", "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "hidden_size": 3072,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 4096,
    "model_type": "phi3",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.2",
    "use_cache": True,
    "vocab_size": 32064,
}
"""microsoft/Phi-3-mini-4k-instruct config.json: fused qkv_proj and gate_up_proj, a 2,047-token window."""

PHI_3_MEDIUM_4K: dict[str, Any] = {
    **PHI_3_MINI_4K,
    "_name_or_path": "Phi-3-medium-4k-instruct",
    "hidden_size": 5120,
    "intermediate_size": 17920,
    "num_attention_heads": 40,
    "num_hidden_layers": 40,
    "num_key_value_heads": 10,
}
"""microsoft/Phi-3-medium-4k-instruct config.json (its shape keys): grouped-query attention, 40 heads over 10."""

TINY_PHI_3: dict[str, Any] = {
    **PHI_3_MINI_4K,
    **TINY_WIDTH,
    "sliding_window": 64,
    "eos_token_id": None,
    "pad_token_id": None,
}
"""Phi-3 at `tiny`'s width: 4 heads over 2 KV heads in one fused qkv_proj, 2 layers, vocabulary
256, a 64-token window (tiny's whole sequence)."""
