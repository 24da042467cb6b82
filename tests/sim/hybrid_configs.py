"""The ``config.json`` of four Mamba-2 and gated-delta-net hybrids, with where each was read.

Only the keys a config reader needs (shapes, layer layout, experts, dtype) and the model's
identity (``model_type``, ``architectures``); ``_name_or_path`` is ours: the Hugging Face id,
which pagesim takes as the run's name. Hugging Face itself cannot be reached from here, so
each dict was read from public copies (GitHub repositories, model cards); where the copies
name a key differently or leave one out, the comment says so, and a key no copy gives is
left out rather than guessed. ``write(tmp_path, config)`` puts one in a ``config.json``.

vLLM 0.33.0's state bytes per layer for each, by its own model classes, are pinned in
``tests/peers/test_state_shapes_peer.py`` (``BY_HAND``).
"""

from __future__ import annotations

import json
from pathlib import Path

# nvidia/NVIDIA-Nemotron-Nano-9B-v2. No verbatim copy of the whole file was found; every value
# below agrees in at least two sources:
# - NVIDIA-NeMo/Megatron-Bridge @067f987d, docs/models/nemotron/nemotronh.md:85-96 ("Nemotron
#   Nano 9B v2": the pattern, 56 layers, hidden 4480, FFN 15680, 40 query heads, 8 KV groups,
#   KV channels 128, Mamba heads 128, head dim 80, state dim 128, 128K tokens, vocab 131,072)
#   and src/megatron/bridge/recipes/nemotronh/h100/nemotron_nano_v2.py:46-57 (the same, and
#   mamba_num_groups=8), in Megatron's names;
# - copies under the Hugging Face key names in two public repositories the code index does
#   not name: a builder's `_THINKER_CONFIG` for nvidia/NVIDIA-Nemotron-Nano-9B-v2 at revision
#   6533e8de (every key below from hidden_size to max_position_embeddings, n_groups and
#   conv_kernel included), and a llama.cpp design note "fetched live from
#   hf://models/nvidia/NVIDIA-Nemotron-Nano-9B-v2/config.json" (mamba_num_heads 128,
#   mamba_head_dim 80, mamba_num_groups 8, ssm_state_size 128, conv_kernel 4, the pattern);
# - NVIDIA-AI-IOT/jetson-generative-ai-playground src/content/models/nemotron-nano-9b-v2.md:
#   "56 layers total: 27 Mamba layers, 25 MLP layers, 4 attention layers" (the pattern's
#   M, - and * counts).
# Uncertain: torch_dtype (the model card and paper say the model runs in "bfloat16 precision";
# no copy shows the key itself). Left out, found in no copy: expand (vLLM does not read it for
# Nemotron-H: the Mamba width is mamba_num_heads * mamba_head_dim, nemotron_h.py:799, here
# 10,240, not 2 * 4480), mamba_ssm_cache_dtype (absent, vLLM keeps the SSM state in float32:
# NemotronHForCausalLMConfig, model_executor/models/config.py:812-832), tie_word_embeddings.
NEMOTRON_H = {
    "_name_or_path": "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "torch_dtype": "bfloat16",
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
    "num_hidden_layers": 56,
    "hidden_size": 4480,
    "intermediate_size": 15680,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 131072,
    "max_position_embeddings": 131072,
    "mamba_num_heads": 128,
    "mamba_head_dim": 80,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
}

# nvidia/Nemotron-H-8B-Base-8K, copied from its config.json as NVIDIA's Megatron-Bridge test
# fixture `nemotronh_8b_config_dict` holds it (NVIDIA-NeMo/Megatron-Bridge @9112eeb9,
# tests/unit_tests/models/nemotronh/test_nemotron_h_bridge.py:40-92; it also carries
# "transformers_version": "4.48.0.dev0" and the auto_map of the published file). Two keys of
# the fixture are the test's own and are left out: "hidden_act" ("Required for base class
# activation mapping") and "n_routed_experts": None. Agrees with the same repository's
# docs/models/nemotron/nemotronh.md:49-59 ("Nemotron H 8B": the pattern, hidden 4096, FFN 21504,
# 32 query heads, 8 KV groups, Mamba heads 128, head dim 64, state dim 128, 8K tokens; the same
# repository, not independent). Independent: NVIDIA's NemotronHConfig, whose defaults are "a
# similar configuration to that of the NemotronH-v0.1 model", as vLLM once vendored it
# (vllm/transformers_utils/configs/nemotron_h.py, e.g. in jiayingsong2023/litevLLM @09ede943:
# ssm_state_size 128, mamba_num_heads 128, n_groups 8, mamba_head_dim 64, conv 4, expand 2).
# Note its head size key is "attention_head_dim", not "head_dim".
NEMOTRON_H_8B = {
    "_name_or_path": "nvidia/Nemotron-H-8B-Base-8K",
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "torch_dtype": "bfloat16",
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "num_hidden_layers": 52,
    "hidden_size": 4096,
    "intermediate_size": 21504,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attention_head_dim": 128,
    "vocab_size": 131072,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "expand": 2,
    "chunk_size": 128,
    "mlp_hidden_act": "relu2",
}

# ibm-granite/granite-4.0-h-tiny (the brief preferred -small or -tiny; no copy of -small gives
# its Mamba heads or layer order). Keys and values as a public test fixture `GRANITE_H_TINY_HF`
# quotes them (a repository the code index does not name; it calls its sibling for -1b
# "Verbatim from the published config.json"). An independent check: the GGUF of the same
# model dumped in danbev/learning-ai @33b65916, notes/granite-model.md (embedding 1536,
# feed_forward 512, 12 heads, 4 KV heads first at layer 5, vocab 100352, shared expert 1024,
# ssm conv_kernel 4, state_size 128, group_count 1, inner_size 3072, 48 SSM heads of 64,
# 64 experts ("64x994M"), 40 layers, recurrent except 5 and 15 in the first 16). Also agrees:
# another repository's "granite-4.0-h-tiny's real field values" (the mamba_* keys), and
# EduardoNicacio/LLMBenchmark granite-4-h-tiny/readme.md ("Number of experts: 6" active).
# Uncertain: torch_dtype (IBM: "Public checkpoints on Hugging Face are available in BF16
# format"; no copy shows the key). The layer_types are the published names ("mamba",
# "attention"); transformers 5 renames them to "linear_attention" / "full_attention" before
# vLLM reads them.
GRANITE_4_H = {
    "_name_or_path": "ibm-granite/granite-4.0-h-tiny",
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 40,
    "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"]
                    + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4),
    "hidden_size": 1536,
    "intermediate_size": 512,
    "shared_intermediate_size": 1024,
    "num_local_experts": 64,
    "num_experts_per_tok": 6,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 100352,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "mamba_n_heads": 48,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
}

# Qwen/Qwen3-Next-80B-A3B-Instruct. Copied from NVIDIA-NeMo/Megatron-Bridge @067f987d,
# tests/unit_tests/models/qwen/test_qwen3_next_bridge.py:34-75 (`qwen3_next_80b_a3b_config_dict`,
# the published config.json's keys; it does not say Instruct or Thinking). Identical, key for
# key, to ai-dynamo/aiconfigurator @1b7cfb10,
# src/aiconfigurator/model_configs/Qwen--Qwen3-Next-80B-A3B-Thinking_config.json (the Thinking
# model's config.json), and to the first 25 keys of a copy titled "Qwen/Qwen3-Next-80B-A3B-
# Instruct ... model config" in the code index. The Instruct model card (as
# https://lmstudio.ai/models/qwen3-next quotes it) agrees: 48 layers, hidden 2048,
# 12 * (3 * (Gated DeltaNet -> MoE) -> 1 * (Gated Attention -> MoE)), 16 Q and 2 KV heads of
# 256, linear heads 32 for V and 16 for QK of 128, 512 experts, 10 active, 1 shared of 512.
# The file has no layer_types: transformers derives them from full_attention_interval
# (huggingface/transformers @249ef816, src/transformers/models/qwen3_next/
# configuration_qwen3_next.py, Qwen3NextConfig.__init__: every 4th layer full attention).
QWEN3_NEXT = {
    "_name_or_path": "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "partial_rotary_factor": 0.25,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "max_position_embeddings": 262144,
    "rope_theta": 10000000,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}

HYBRID_CONFIGS = {"nemotron-h": NEMOTRON_H, "nemotron-h-8b": NEMOTRON_H_8B, "granite-4-h": GRANITE_4_H,
                  "qwen3-next": QWEN3_NEXT}


def write(folder: Path, config: dict) -> Path:
    """``config`` as ``folder/config.json`` (the path pagesim's ``--model`` takes)."""
    path = Path(folder) / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path
