"""Model presets: the Hugging Face ``config.json`` values of public checkpoints.

Sources (``config.json`` of): facebook/opt-13b, -66b; OPT-175B's paper shapes;
huggyllama/llama-13b (LLaMA-1 13B, the vLLM paper's
Fig. 16 model: Llama-2-13B's shapes with a 2,048-token context, LM head untied);
meta-llama/Llama-2-{7,13,70}b-hf; meta-llama/Meta-Llama-3-{8,70}B;
mistralai/Mistral-7B-v0.1; meta-llama/Llama-3.1-{8,70,405}B-Instruct;
Qwen/Qwen2.5-{7,72}B-Instruct (32,768 tokens without YaRN); mistralai/Mistral-7B-Instruct-v0.3;
mistralai/Mixtral-8x7B-Instruct-v0.1; deepseek-ai/DeepSeek-V3 (its FP8 checkpoint, 128x128
block scales); google/gemma-2-27b; ai21labs/AI21-Jamba-1.5-Mini (Jamba-v0.1's shapes: 4 attention
layers, at 4, 12, 20 and 28, among 28 Mamba layers; 16 experts on the odd layers);
nvidia/NVIDIA-Nemotron-Nano-9B-v2 (27 Mamba-2, 4 attention and 25 MLP layers, a letter each);
ibm-granite/granite-4.0-h-tiny (36 Mamba-2 and 4 attention layers, at 5, 15, 25 and 35; 64
experts of which 6 a token, and a shared MLP); Qwen/Qwen3-Next-80B-A3B-Instruct (36 gated-delta-net
layers, every 4th layer gated attention; 512 experts, 10 a token, one shared). Where those three
were read, and which of their keys are uncertain: ``tests/sim/hybrid_configs.py``. Qwen/Qwen3-32B
and Qwen/Qwen3-30B-A3B-Instruct-2507 (128 experts, 8 a token, in every layer; its base model
Qwen/Qwen3-30B-A3B has the same shapes and a 40,960-token context), as LLMServingSim
(casys-kaist/LLMServingSim, MIT) keeps them at configs/model/Qwen/ (commit 5daddb2).

The Llama-2, Llama-3 and Mistral-7B (v0.1) presets count the LM head as tied to the embedding,
as pagesim always has; their released checkpoints untie it (``tie_word_embeddings: false``:
an extra vocab x hidden x 2 bytes, 0.26 GB on Llama-2-7B, 1.05 GB on Llama-3-8B, 2.1 GB on
Llama-3-70B). Kept so earlier results reproduce bit for bit; their config.json files read
through ``--model`` count it.
"""

from __future__ import annotations

from pathlib import Path

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.hf_config import model_from_hf_config
from pagesim.sim.specs.hf_config import NEMOTRON_LAYERS
from pagesim.sim.specs.model import (FULL_ATTENTION, GATED_DELTA_NET, MAMBA, MAMBA2, SLIDING_ATTENTION, GatedDeltaNet,
                                     LatentAttention, Mamba2Mixer, MambaMixer, MixtureOfExperts, ModelSpec,
                                     Quantization, interleaved_sliding)

#: NVIDIA-Nemotron-Nano-9B-v2's layers, a letter each (M Mamba-2, * attention, - MLP)
NEMOTRON_NANO_PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 2048, gated_mlp=False),
        ModelSpec("opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 2048, gated_mlp=False),
        ModelSpec("opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 2048, gated_mlp=False),
        ModelSpec("llama-13b", 40, 5120, 40, 40, 128, 13824, 32000, 2048, tie_word_embeddings=False),
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192),
        ModelSpec("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192),
        ModelSpec("codellama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 16384, tie_word_embeddings=False),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
                  layer_kinds=(SLIDING_ATTENTION,) * 32, sliding_window=4096),
        ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, tie_word_embeddings=False),
        ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072, tie_word_embeddings=False),
        ModelSpec("llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 131072, tie_word_embeddings=False),
        ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 32768, tie_word_embeddings=False),
        ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 32768, tie_word_embeddings=False),
        ModelSpec("mistral-7b-v0.3", 32, 4096, 32, 8, 128, 14336, 32768, 32768, tie_word_embeddings=False),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, tie_word_embeddings=False,
                  moe=MixtureOfExperts(8, 2, 14336, tuple(range(32)))),
        ModelSpec("deepseek-v3", 61, 7168, 128, 1, 192, 18432, 129280, 163840, tie_word_embeddings=False,
                  latent_attention=LatentAttention(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                                   v_head_dim=128, q_lora_rank=1536),
                  moe=MixtureOfExperts(256, 8, 2048, tuple(range(3, 61)), shared_intermediate_size=2048),
                  quantization=Quantization("fp8", 8, fp8_compute=True), mtp_layers=1),
        ModelSpec("gemma-2-27b", 46, 4608, 32, 16, 128, 36864, 256000, 8192,
                  layer_kinds=interleaved_sliding(46, 2), sliding_window=4096),
        ModelSpec("jamba-1.5-mini", 32, 4096, 32, 8, 128, 14336, 65536, 262144, tie_word_embeddings=False,
                  layer_kinds=tuple(FULL_ATTENTION if i % 8 == 4 else MAMBA for i in range(32)),
                  mamba=MambaMixer(d_inner=8192, d_state=16, d_conv=4, dt_rank=256),
                  moe=MixtureOfExperts(16, 2, 14336, tuple(range(1, 32, 2)))),
        ModelSpec("nemotron-nano-9b-v2", 56, 4480, 40, 8, 128, 15680, 131072, 131072, gated_mlp=False,
                  tie_word_embeddings=False, layer_kinds=tuple(NEMOTRON_LAYERS[c] for c in NEMOTRON_NANO_PATTERN),
                  mamba2=Mamba2Mixer(10240, 128, 80, 8, 128, 4, ssm_dtype_bytes=4), mixers_have_mlp=False),
        ModelSpec("granite-4.0-h-tiny", 40, 1536, 12, 4, 128, 512, 100352, 131072,
                  layer_kinds=tuple(FULL_ATTENTION if i % 10 == 5 else MAMBA2 for i in range(40)),
                  mamba2=Mamba2Mixer(3072, 48, 64, 1, 128, 4),
                  moe=MixtureOfExperts(64, 6, 512, tuple(range(40)), shared_intermediate_size=1024)),
        ModelSpec("qwen3-next-80b-a3b", 48, 2048, 16, 2, 256, 5120, 151936, 262144, tie_word_embeddings=False,
                  layer_kinds=tuple(FULL_ATTENTION if (i + 1) % 4 == 0 else GATED_DELTA_NET for i in range(48)),
                  delta_net=GatedDeltaNet(16, 32, 128, 128, 4), attention_output_gate=True,
                  moe=MixtureOfExperts(512, 10, 512, tuple(range(48)), shared_intermediate_size=512), mtp_layers=1),
        ModelSpec("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, 40960, tie_word_embeddings=False),
        ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960, tie_word_embeddings=False,
                  moe=MixtureOfExperts(128, 8, 768, tuple(range(48)))),
        ModelSpec("qwen3-30b-a3b-2507", 48, 2048, 32, 4, 128, 6144, 151936, 262144, tie_word_embeddings=False,
                  moe=MixtureOfExperts(128, 8, 768, tuple(range(48)))),
    ]
}

MODEL_ALIASES = {"llama2-7b": "llama-2-7b", "llama2-13b": "llama-2-13b", "llama2-70b": "llama-2-70b",
                 "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b", "llama3.1-8b": "llama-3.1-8b",
                 "llama3.1-70b": "llama-3.1-70b", "llama3.1-405b": "llama-3.1-405b",
                 "qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b-2507"}


#: what a Hugging Face model id's name carries beyond the architecture (its weights' variant)
HF_NAME_SUFFIXES = ("-hf", "-instruct", "-chat", "-base", "-v0.1")


def preset_of_hf_id(model_id: str) -> str | None:
    """The preset a Hugging Face model id (``meta-llama/Llama-2-7b-hf``,
    ``codellama/CodeLlama-34b-Instruct-hf``, ``mistralai/Mixtral-8x7B-v0.1``) names, or None: its
    name lower-cased, less the variant suffixes of :data:`HF_NAME_SUFFIXES` (an instruct or chat
    model has its base model's architecture)."""
    key = model_id.rsplit("/", 1)[-1].lower()
    changed = True
    while changed:
        changed = False
        for suffix in HF_NAME_SUFFIXES:
            if key.endswith(suffix):
                key, changed = key[:-len(suffix)], True
    key = MODEL_ALIASES.get(key, key)
    return key if key in MODELS else None


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A preset by name or by Hugging Face model id (:func:`preset_of_hf_id`), or a Hugging Face
    ``config.json`` (or the folder holding it) by path."""
    name_or_path = str(name_or_path)
    key = name_or_path.lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    p = Path(name_or_path)
    if "/" in name_or_path and not p.exists() and preset_of_hf_id(name_or_path):
        return MODELS[preset_of_hf_id(name_or_path)]
    if p.is_dir():  # a checkpoint folder: its config.json
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        return model_from_hf_config(p)
    raise ConfigError(f"unknown model '{name_or_path}' (presets: pagesim simulate --help; or a config.json path)")
