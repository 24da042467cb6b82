"""Reading a Hugging Face ``config.json`` (``--model path/to/config.json``) as vLLM reads it.

The reader maps keys onto :class:`ModelSpec` fields (the rules that turn them into bytes and
FLOPs live in ``model.py``). What it reads, family by family (``model_type``):

- dense: ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``, ``gemma3_text``,
  ``phi3``, ``opt``, ``gpt2``, ``gptj``, ``gpt_neox``, ``falcon`` (and ``RefinedWeb``),
  ``gpt_bigcode``;
- mixture of experts: ``mixtral``, ``qwen2_moe``, ``qwen3_moe``, ``deepseek_v2``,
  ``deepseek_v3`` (multi-head latent attention when ``kv_lora_rank`` is set);
- hybrid: ``jamba`` (Mamba layers, ``attn_layer_period/offset`` or ``layers_block_type``),
  ``minimax_text_01`` / ``minimax_m1`` / ``minimax`` (lightning-attention layers,
  ``attn_type_list``: 0 linear, 1 softmax), ``nemotron_h`` (Mamba-2, attention and MLP layers,
  ``hybrid_override_pattern``: ``M``, ``*``, ``-``), ``granitemoehybrid`` (Granite-4.0-H: Mamba-2
  and attention layers, ``layer_types``), ``qwen3_next`` (gated-delta-net and gated attention
  layers, ``layer_types`` or every ``full_attention_interval``-th layer full);
- multimodal: any config with a ``text_config`` is read from it (vLLM's
  ``get_hf_text_config``), its ``vision_config`` counted as a ViT in memory.

KV heads follow vLLM's ``ModelConfig.get_total_num_kv_heads`` (``vllm/config.py``): latent
attention caches one head; ``multi_query: true`` means one KV head (Falcon-7B, StarCoder),
except for Falcon's new decoder architecture; otherwise the first of ``n_head_kv``,
``num_kv_heads``, ``num_key_value_heads``, ``multi_query_group_num``, else every attention
head. The head size is ``head_dim``, else ``hidden_size // num_attention_heads``
(``get_head_size``). The KV dtype is the model dtype, 2 bytes for ``float16``, ``bfloat16``
and ``float32`` alike (vLLM's ``dtype="auto"`` serves float32 checkpoints in float16,
``_get_and_verify_dtype``). The maximum length is the smallest of the length keys vLLM reads,
2,048 when there is none, times a RoPE scaling factor (``_get_and_verify_max_len``).
Quantized weights come from ``quantization_config`` (fp8, fbgemm_fp8, awq, gptq,
compressed-tensors).

Anything else is refused with one line naming the key: an unknown ``model_type``, a layer
kind, quantization method or per-module exclusion it does not model, a missing or
non-positive shape. A run's model name is ``_name_or_path``, else ``model_type``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.model import (FULL_ATTENTION, GATED_DELTA_NET, LINEAR_ATTENTION, MAMBA, MAMBA2, MLP_ONLY,
                                    SLIDING_ATTENTION, GatedDeltaNet, LatentAttention, Mamba2Mixer, MambaMixer,
                                    MixtureOfExperts, ModelSpec, Quantization, interleaved_sliding)


@dataclass(frozen=True)
class Family:
    """What a ``model_type`` implies beyond its keys: transformers' config-class defaults."""

    gated_mlp: bool
    tie_word_embeddings: bool  # the config class's default when config.json omits the key
    ffn_multiple: int = 0  # > 0: the MLP is ffn_multiple x hidden_size when no width is given
    defaults: dict[str, Any] = field(default_factory=dict)  # keys multimodal text_configs often omit


# transformers' LlamaConfig / MistralConfig / Gemma3TextConfig / JambaConfig defaults
_LLAMA = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
          "vocab_size": 32000, "max_position_embeddings": 2048}
_MISTRAL = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 4096 * 32}
_GEMMA3 = {"vocab_size": 262_208, "max_position_embeddings": 131_072, "sliding_window": 4096,
           "sliding_window_pattern": 6}
_JAMBA = {"mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": "auto"}
_FALCON = Family(gated_mlp=False, tie_word_embeddings=True, ffn_multiple=4)
_MINIMAX = Family(gated_mlp=True, tie_word_embeddings=False)

FAMILIES: dict[str, Family] = {
    "llama": Family(True, False, defaults=_LLAMA),
    "mistral": Family(True, False, defaults=_MISTRAL),
    "qwen2": Family(True, False),
    "qwen3": Family(True, False),
    "gemma": Family(True, True),
    "gemma2": Family(True, True),
    "gemma3_text": Family(True, True, defaults=_GEMMA3),
    "phi3": Family(True, False),
    "opt": Family(False, True),
    "gpt2": Family(False, True, ffn_multiple=4),
    "gptj": Family(False, False, ffn_multiple=4),
    "gpt_neox": Family(False, False),
    "falcon": _FALCON,
    "refinedweb": _FALCON,
    "refinedwebmodel": _FALCON,
    "gpt_bigcode": Family(False, True, ffn_multiple=4),
    "mixtral": Family(True, False),
    "qwen2_moe": Family(True, False),
    "qwen3_moe": Family(True, False),
    "deepseek_v2": Family(True, False),
    "deepseek_v3": Family(True, False),
    "jamba": Family(True, False, defaults=_JAMBA),
    "minimax_text_01": _MINIMAX,
    "minimax_m1": _MINIMAX,
    "minimax": _MINIMAX,
    "nemotron_h": Family(gated_mlp=False, tie_word_embeddings=False),  # up and down projections, relu2
    "granitemoehybrid": Family(True, False),
    "qwen3_next": Family(True, False),
}
FALCONS = ("falcon", "refinedweb", "refinedwebmodel")  # the Hugging Face format, then the first two
QWEN_MOES = ("qwen2_moe", "qwen3_moe", "qwen3_next")
QWENS = ("qwen2", "qwen3") + QWEN_MOES
DEEPSEEKS = ("deepseek_v2", "deepseek_v3")
MINIMAXES = ("minimax_text_01", "minimax_m1", "minimax")
#: Nemotron-H's layer letters (``ALL_DECODER_LAYER_TYPES``, model_executor/models/nemotron_h.py:548-553)
NEMOTRON_LAYERS = {"M": MAMBA2, "*": FULL_ATTENTION, "-": MLP_ONLY}
#: the bytes of a recurrent state's dtype as vLLM names it (``STR_DTYPE_TO_TORCH_DTYPE``)
STATE_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
UNIFORM_SLIDING = ("mistral", "mixtral", "phi3")  # sliding_window applies to every layer

# vLLM's _get_and_verify_max_len: the smallest of these is the model's length
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
                "max_sequence_length", "max_seq_length", "seq_len")
DEFAULT_MAX_LEN = 2048  # vLLM's assumption when the config names no length
TWO_BYTE_DTYPES = ("float16", "bfloat16", "float32", "half", "float")
QUANT_METHODS = ("fp8", "fbgemm_fp8", "awq", "gptq", "compressed-tensors")
# modules a quantized checkpoint may leave in 16 bits without changing the weight bytes here:
# embedding and LM head (counted at the model dtype anyway), vision tower, MoE routers
NEGLIGIBLE_UNQUANTIZED = re.compile(r"lm_head|embed|vision|visual|multi_modal_projector|mm_projector|(^|\.)gate\$?$")

_REQUIRED = object()
#: the keys that size a model (and their other names): never taken from a family's defaults in a
#: top-level config
SIZE_KEYS = (("hidden_size", "n_embd"), ("num_attention_heads", "n_head"), ("num_hidden_layers", "n_layer"),
             ("intermediate_size",), ("vocab_size",))


class _Fields:
    """Typed access to one JSON object of a config, errors naming the file and the key."""

    def __init__(self, path: Path, data: dict, prefix: str = "", defaults: dict | None = None):
        self.path, self.data, self.prefix, self.defaults = path, data, prefix, defaults or {}

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.path}: field '{self.prefix}{key}' {message}")

    def raw(self, *keys: str) -> tuple[str | None, Any]:
        """The first of ``keys`` set (not null) in the config, else in the family's defaults."""
        for source in (self.data, self.defaults):
            for k in keys:
                if source.get(k) is not None:
                    return k, source[k]
        return None, None

    def int(self, *keys: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        key, v = self.raw(*keys)
        if key is None:
            if default is _REQUIRED:
                others = f" (also looked for {', '.join(keys[1:])})" if len(keys) > 1 else ""
                raise self.fail(keys[0], f"missing{others}")
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(key, f"must be an integer, got {v!r}")
        if v < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {v}")
        return v

    def flag(self, key: str, default: bool) -> bool:
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {v!r}")
        return v

    def list(self, *keys: str) -> tuple[str | None, list | None]:
        key, v = self.raw(*keys)
        if key is not None and not isinstance(v, list):
            raise self.fail(key, f"must be a list, got {v!r}")
        return key, v


def _load(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: model config file not found") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a config.json is UTF-8 JSON)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the model config ({e.strerror})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return cfg


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json``, or one line saying what is not modelled."""
    path = Path(path)
    cfg = _load(path)
    top = _Fields(path, cfg)
    text = top
    if cfg.get("text_config") is not None:
        if not isinstance(cfg["text_config"], dict):
            raise top.fail("text_config", "must be a JSON object")
        text = _Fields(path, cfg["text_config"], prefix="text_config.")
    _, model_type = text.raw("model_type")
    if not isinstance(model_type, str):
        raise text.fail("model_type", "missing" if model_type is None else f"must be a string, got {model_type!r}")
    mt = model_type.lower()
    if mt not in FAMILIES:
        raise text.fail("model_type", f"'{model_type}' is not modelled (modelled: {', '.join(FAMILIES)})")
    family = FAMILIES[mt]
    if text is top:  # a checkpoint's own config.json names its size; a class default is not its size
        for keys in SIZE_KEYS:
            if all(cfg.get(k) is None for k in keys) and keys[0] in family.defaults:
                raise top.fail(keys[0], f"missing (transformers would take its class default, "
                                        f"{family.defaults[keys[0]]}, which no checkpoint's config relies on)")
    text.defaults = family.defaults  # a multimodal text_config omits what equals the defaults

    hidden = text.int("hidden_size", "n_embd")
    heads = text.int("num_attention_heads", "n_head")
    num_layers = text.int("num_hidden_layers", "n_layer")
    vocab = text.int("vocab_size")
    intermediate = text.int("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size",
                            default=family.ffn_multiple * hidden if family.ffn_multiple else _REQUIRED)
    latent = _latent_attention(text) if mt in DEEPSEEKS else None
    if latent is not None:
        head_dim = latent.qk_nope_head_dim + latent.qk_rope_head_dim
    else:
        head_dim = text.int("head_dim", default=hidden // heads)
        if head_dim < 1:
            raise text.fail("hidden_size", f"= {hidden} is smaller than num_attention_heads = {heads}")
    kv_heads = _kv_heads(text, mt, hidden, heads, latent)
    if heads % kv_heads:
        raise ConfigError(f"{path}: num_attention_heads={heads} is not a multiple of the {kv_heads} KV heads")
    kinds, window = _layer_kinds(text, mt, num_layers)
    mamba = _mamba(text, hidden) if MAMBA in kinds else None
    moe = _moe(text, mt, num_layers)
    if mt == "granitemoehybrid" and moe is None:  # no experts: the shared MLP is the layer's MLP
        intermediate = text.int("shared_intermediate_size")
    name = cfg.get("_name_or_path") or cfg.get("model_type") or model_type
    return ModelSpec(
        str(name), num_layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, _max_len(text, mt),
        gated_mlp=family.gated_mlp, dtype_bytes=_dtype_bytes(text, top),
        tie_word_embeddings=text.flag("tie_word_embeddings", family.tie_word_embeddings),
        layer_kinds=kinds, sliding_window=window, latent_attention=latent, moe=moe,
        mamba=mamba, mamba2=_mamba2(text, mt, hidden) if MAMBA2 in kinds else None,
        delta_net=_delta_net(text) if GATED_DELTA_NET in kinds else None,
        mixers_have_mlp=mt != "nemotron_h",
        attention_output_gate=mt == "qwen3_next" and text.flag("attn_output_gate", True),
        quantization=_quantization(top, text), vision_params=_vision_params(top), mtp_layers=_mtp_layers(text, mt))


#: the model types vLLM 0.33.0 drafts MTP for, and whether it needs num_nextn_predict_layers > 0
#: (config/speculative.py:750-754 deepseek_v3, :895-901 nemotron_h; qwen3_next always, :908-909)
MTP_TYPES = {"deepseek_v3": True, "nemotron_h": True, "qwen3_next": False}


def _mtp_layers(f: _Fields, mt: str) -> int:
    """The MTP modules a checkpoint ships (``num_nextn_predict_layers``) where vLLM drafts with them."""
    if mt not in MTP_TYPES:
        return 0
    n = f.int("num_nextn_predict_layers", default=0, minimum=0)
    return n if MTP_TYPES[mt] else max(n, 1)


def _latent_attention(f: _Fields) -> LatentAttention:
    if f.raw("kv_lora_rank")[0] is None:
        raise f.fail("kv_lora_rank", "missing: DeepSeek attention without a latent KV is not modelled")
    return LatentAttention(kv_lora_rank=f.int("kv_lora_rank"), qk_rope_head_dim=f.int("qk_rope_head_dim"),
                           qk_nope_head_dim=f.int("qk_nope_head_dim"), v_head_dim=f.int("v_head_dim"),
                           q_lora_rank=f.int("q_lora_rank", default=0))


def _kv_heads(f: _Fields, mt: str, hidden: int, heads: int, latent: LatentAttention | None) -> int:
    """vLLM's ``get_total_num_kv_heads``, with its ``RWConfig`` hack for Falcon's first
    (RefinedWeb) format: 8,192 wide is Falcon-40B, the new decoder architecture
    (``vllm/transformers_utils/configs/falcon.py``)."""
    if latent is not None:
        return 1
    rw_40b = mt in FALCONS[1:] and hidden == 8192
    new_falcon = mt in FALCONS and f.flag("new_decoder_architecture", rw_40b)
    if not new_falcon and f.flag("multi_query", False):
        return 1
    return f.int("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", default=heads)


def _layer_kinds(f: _Fields, mt: str, num_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Each layer's kind and the sliding window; () when every layer is full attention."""
    window = f.int("sliding_window", default=None)
    names = {"full_attention": FULL_ATTENTION, "sliding_attention": SLIDING_ATTENTION}
    key, listed = f.list("layer_types")
    kinds: tuple[str, ...] = ()
    if mt == "jamba":
        key, listed = f.list("layers_block_type")
        names = {"attention": FULL_ATTENTION, "mamba": MAMBA}
        if listed is None:
            period, offset = f.int("attn_layer_period"), f.int("attn_layer_offset", minimum=0)
            kinds = tuple(FULL_ATTENTION if i % period == offset else MAMBA for i in range(num_layers))
    elif mt in MINIMAXES:
        names[1] = FULL_ATTENTION
        names[0] = names["linear_attention"] = LINEAR_ATTENTION
        if listed is None:
            key, listed = f.list("attn_type_list", "decoder_attention_types")
    elif mt == "nemotron_h":  # a letter a layer
        key, pattern = f.raw("hybrid_override_pattern")
        if not isinstance(pattern, str):
            raise f.fail("hybrid_override_pattern", "missing" if key is None else f"must be a string, got {pattern!r}")
        listed, names = list(pattern), dict(NEMOTRON_LAYERS)
    elif mt == "granitemoehybrid":
        names = {"attention": FULL_ATTENTION, "mamba": MAMBA2}
    elif mt == "qwen3_next":  # without a list, transformers' Qwen3NextConfig makes one from the interval
        names = {"full_attention": FULL_ATTENTION, "linear_attention": GATED_DELTA_NET}
        if listed is None:
            every = f.int("full_attention_interval")
            kinds = tuple(FULL_ATTENTION if (i + 1) % every == 0 else GATED_DELTA_NET for i in range(num_layers))
    elif listed is None and mt == "gemma2":
        kinds = interleaved_sliding(num_layers, 2)
    elif listed is None and mt == "gemma3_text":
        kinds = interleaved_sliding(num_layers, f.int("sliding_window_pattern"))
    elif mt in QWENS:  # Qwen's window applies only with use_sliding_window, above max_window_layers
        if f.flag("use_sliding_window", False):
            first = f.int("max_window_layers", minimum=0)
            kinds = tuple(FULL_ATTENTION if i < first else SLIDING_ATTENTION for i in range(num_layers))
        else:
            listed, window = None, None
    elif mt in UNIFORM_SLIDING and window is not None:
        kinds = (SLIDING_ATTENTION,) * num_layers
    if listed is not None:
        if len(listed) != num_layers:
            raise f.fail(key, f"lists {len(listed)} layers, the model has {num_layers}")
        unknown = [v for v in listed if isinstance(v, (list, dict)) or v not in names]
        if unknown:
            raise f.fail(key, f"layer kind {unknown[0]!r} is not modelled (modelled: "
                              f"{', '.join(str(n) for n in names)})")
        kinds = tuple(names[v] for v in listed)
    if SLIDING_ATTENTION in kinds and window is None:
        raise f.fail("sliding_window", "missing, but the model has sliding-window layers")
    if window is not None and SLIDING_ATTENTION not in kinds:
        raise f.fail("sliding_window", f"is not modelled for model_type '{mt}'")
    if kinds and all(k == FULL_ATTENTION for k in kinds):
        kinds = ()
    return kinds, window


def _moe(f: _Fields, mt: str, num_layers: int) -> MixtureOfExperts | None:
    every = tuple(range(num_layers))
    if mt == "mixtral":
        experts, inner, shared, layers = f.int("num_local_experts"), f.int("intermediate_size"), 0, every
    elif mt == "granitemoehybrid":  # every layer: experts of intermediate_size, a shared gated MLP
        if f.int("num_local_experts", default=0, minimum=0) == 0:
            return None
        experts, inner, layers = f.int("num_local_experts"), f.int("intermediate_size"), every
        shared = f.int("shared_intermediate_size", default=0, minimum=0)
    elif mt in QWEN_MOES:  # Hugging Face Qwen2MoeDecoderLayer's rule for which layers are sparse
        experts, inner = f.int("num_experts"), f.int("moe_intermediate_size")
        shared = f.int("shared_expert_intermediate_size", default=0, minimum=0)
        step = f.int("decoder_sparse_step", default=1)
        _, dense = f.list("mlp_only_layers")
        layers = tuple(i for i in every if i not in (dense or []) and (i + 1) % step == 0)
    elif mt in DEEPSEEKS:  # DeepseekV2Model: MoE from first_k_dense_replace on, every moe_layer_freq
        if f.raw("n_routed_experts")[0] is None:
            return None
        experts, inner = f.int("n_routed_experts"), f.int("moe_intermediate_size")
        shared = f.int("n_shared_experts", default=0, minimum=0) * inner
        first, freq = f.int("first_k_dense_replace", default=0, minimum=0), f.int("moe_layer_freq", default=1)
        layers = tuple(i for i in every if i >= first and i % freq == 0)
    elif mt == "jamba":  # JambaConfig.layers_num_experts
        experts, inner, shared = f.int("num_experts"), f.int("intermediate_size"), 0
        period, offset = f.int("expert_layer_period"), f.int("expert_layer_offset", minimum=0)
        layers = tuple(i for i in every if i % period == offset)
    elif mt in MINIMAXES:
        experts, inner = f.int("num_local_experts", default=1), f.int("intermediate_size")
        shared, layers = f.int("shared_intermediate_size", default=0, minimum=0), every
    else:
        return None
    if experts == 1:
        return None
    per_token = f.int("num_experts_per_tok")
    if per_token > experts:
        raise f.fail("num_experts_per_tok", f"= {per_token} exceeds the {experts} experts")
    return MixtureOfExperts(experts, per_token, inner, layers, shared)


def _mamba(f: _Fields, hidden: int) -> MambaMixer:
    _, dt = f.raw("mamba_dt_rank")
    dt_rank = math.ceil(hidden / 16) if dt == "auto" else f.int("mamba_dt_rank")
    return MambaMixer(d_inner=f.int("mamba_expand") * hidden, d_state=f.int("mamba_d_state"),
                      d_conv=f.int("mamba_d_conv"), dt_rank=dt_rank)


def _mamba2(f: _Fields, mt: str, hidden: int) -> Mamba2Mixer:
    """Nemotron-H's and Granite-4.0-H's Mamba-2 keys, as vLLM passes them to
    ``mamba2_state_shape`` (nemotron_h.py:796-819: inner width heads x head size, the SSM state
    in float32 unless the config names a dtype, config.py:812-832; granitemoehybrid.py:619-640:
    ``mamba_expand x hidden_size``, the model's dtype)."""
    if mt == "nemotron_h":
        heads, head_dim = f.int("mamba_num_heads"), f.int("mamba_head_dim")
        key, ssm = f.raw("mamba_ssm_cache_dtype")
        ssm = "float32" if key is None else ssm
        if ssm not in STATE_DTYPE_BYTES:
            raise f.fail("mamba_ssm_cache_dtype", f"'{ssm}' is not modelled (modelled: {', '.join(STATE_DTYPE_BYTES)})")
        return Mamba2Mixer(heads * head_dim, heads, head_dim, f.int("n_groups"), f.int("ssm_state_size"),
                           f.int("conv_kernel"), STATE_DTYPE_BYTES[ssm])
    return Mamba2Mixer(f.int("mamba_expand") * hidden, f.int("mamba_n_heads"), f.int("mamba_d_head"),
                       f.int("mamba_n_groups"), f.int("mamba_d_state"), f.int("mamba_d_conv"))


def _delta_net(f: _Fields) -> GatedDeltaNet:
    """Qwen3-Next's gated-delta-net keys (``gated_delta_net_state_shape``, qwen3_next.py:882-912;
    the state at the model's dtype)."""
    return GatedDeltaNet(f.int("linear_num_key_heads"), f.int("linear_num_value_heads"),
                         f.int("linear_key_head_dim"), f.int("linear_value_head_dim"),
                         f.int("linear_conv_kernel_dim"))


def _max_len(f: _Fields, mt: str) -> int:
    """vLLM's ``_get_and_verify_max_len`` (``vllm/config.py``; ``vllm/config/model.py`` in newer
    versions): the smallest length key, times the RoPE scaling factor except for the types whose
    length already includes it, and Gemma-3's ("already scaled by RoPE scaling")."""
    lengths = [f.int(k) for k in MAX_LEN_KEYS if f.raw(k)[0] is not None]
    length = min(lengths) if lengths else DEFAULT_MAX_LEN
    _, rope = f.raw("rope_scaling")
    if rope is None or mt == "gemma3_text":
        return length
    if not isinstance(rope, dict):
        raise f.fail("rope_scaling", f"must be a JSON object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type"))
    if rope_type in ("su", "longrope", "llama3"):
        return length
    factor = rope.get("factor", 1)  # "default" and M-RoPE define none
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise f.fail("rope_scaling.factor", f"must be a positive number, got {factor!r}")
    if rope_type == "yarn":
        base = rope.get("original_max_position_embeddings")
        if isinstance(base, bool) or not isinstance(base, int) or base < 1:
            raise f.fail("rope_scaling.original_max_position_embeddings", f"must be a positive integer, got {base!r}")
        length = base
    return int(length * factor)


def _dtype_bytes(text: _Fields, top: _Fields) -> int:
    for f in (text, top):
        key, value = f.raw("torch_dtype", "dtype")
        if key is not None:
            if value not in TWO_BYTE_DTYPES:
                raise f.fail(key, f"'{value}' is not modelled (modelled: {', '.join(TWO_BYTE_DTYPES)})")
            return 2
    return 2  # vLLM reads a missing dtype as float32 and serves it in float16


def _quantization(top: _Fields, text: _Fields) -> Quantization | None:
    f = top if top.data.get("quantization_config") is not None else text
    qc = f.data.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise f.fail("quantization_config", "must be a JSON object")
    q = _Fields(f.path, qc, prefix=f"{f.prefix}quantization_config.")
    method = str(qc.get("quant_method", "")).lower()
    if method not in QUANT_METHODS:
        raise q.fail("quant_method", f"'{method}' is not modelled (modelled: {', '.join(QUANT_METHODS)})")
    for key in ("modules_to_not_convert", "ignored_layers", "ignore"):
        _, excluded = q.list(key)
        kept = [m for m in excluded or [] if not NEGLIGIBLE_UNQUANTIZED.search(str(m))]
        if kept:
            raise q.fail(key, f"leaves {kept[0]!r} unquantized: per-module exclusions are not modelled")
    if method in ("fp8", "fbgemm_fp8"):  # dynamic activation scaling: W8A8 on GPUs with FP8
        return Quantization(method, 8, fp8_compute=True)
    if method in ("awq", "gptq"):  # both checkpoints store a zero point per group (qzeros)
        group = q.int("group_size", "q_group_size", default=0, minimum=-1)
        zero_point = q.flag("zero_point", True) if method == "awq" else True
        return Quantization(method, q.int("bits", "w_bit"), max(group, 0), zero_point)
    return _compressed_tensors(q)


def _compressed_tensors(q: _Fields) -> Quantization:
    """One weight scheme for every group; FP8 activations (W8A8) or none (weight-only)."""
    if q.data.get("sparsity_config"):
        raise q.fail("sparsity_config", "sparse checkpoints are not modelled")
    groups = q.data.get("config_groups")
    if not isinstance(groups, dict) or not groups or not all(isinstance(g, dict) for g in groups.values()):
        raise q.fail("config_groups", "must be a JSON object of quantization groups")
    schemes = {json.dumps([g.get("weights"), g.get("input_activations")], sort_keys=True) for g in groups.values()}
    if len(schemes) > 1:
        raise q.fail("config_groups", "mixes weight schemes: not modelled")
    group = next(iter(groups.values()))
    weights, acts = group.get("weights"), group.get("input_activations")
    if not isinstance(weights, dict):
        raise q.fail("config_groups.weights", "missing")
    w = _Fields(q.path, weights, prefix=f"{q.prefix}config_groups.weights.")
    bits, kind = w.int("num_bits"), weights.get("type")
    fp8_compute = False
    if acts is not None:
        if not (isinstance(acts, dict) and acts.get("type") == "float" and acts.get("num_bits") == 8
                and kind == "float" and bits == 8):
            raise q.fail("config_groups.input_activations", f"{acts!r} is not modelled (only FP8 W8A8 or weight-only)")
        fp8_compute = True
    group_size = w.int("group_size", default=0) if weights.get("strategy") == "group" else 0
    return Quantization("compressed-tensors", bits, group_size, zero_point=not w.flag("symmetric", True),
                        fp8_compute=fp8_compute)


def _vision_params(top: _Fields) -> int:
    """A multimodal model's vision encoder as a ViT: per layer 4 h^2 (attention) plus the MLP
    (gated in Pixtral); patch embedding and projector (under 1 % of it) are not counted."""
    vision = top.data.get("vision_config")
    if vision is None:
        return 0
    if not isinstance(vision, dict):
        raise top.fail("vision_config", "must be a JSON object")
    v = _Fields(top.path, vision, prefix="vision_config.")
    h, inner = v.int("hidden_size"), v.int("intermediate_size")
    mlp_matrices = 3 if vision.get("model_type") == "pixtral" else 2
    return v.int("num_hidden_layers") * (4 * h * h + mlp_matrices * h * inner)
