"""vLLM 0.33.0's own recurrent state per layer for Mamba-2 and gated-delta-net hybrids, on CPU.

Executed from vLLM's source (fetched by ``python -m tests.peers.fetch``): the three model modules
(``model_executor/models/nemotron_h.py``, ``granitemoehybrid.py``, ``qwen3_next.py``), whose
classmethods ``get_mamba_state_shape_from_config`` / ``get_mamba_state_dtype_from_config`` give
a layer's state shapes and dtypes from the engine's config; the calculators they call
(``layers/mamba/mamba_utils.py``, the same ones each Mamba layer's ``get_state_shape`` calls
for its ``MambaSpec``, ``layers/mamba/abstract.py:72-91``); and the per-architecture config
rules (``models/config.py``: Nemotron-H keeps its SSM state in float32). Importing a model
module runs only its class statements: every module it imports for its layers (linear layers,
attention, MoE, distributed state, transformers' config classes) is a stub (``STUBS``), the
names it must provide as placeholders that raise if called. The vLLM functions these modules
need from modules a CPU run cannot import (``torch_utils``' custom ops, ``distributed``) are
compiled from their source (``compile_stubs``).

The engine config is ``vllm_v1``'s ``Settings``: only the settings given, any other read
raises. The model's dtype is vLLM's ``dtype="auto"`` rule (``config/model.py:2423-2464``) on a
CUDA GPU of compute capability 8.0 or more (``platforms/cuda.py:257-260``).
"""

from __future__ import annotations

import logging
import types
from math import prod

from tests.peers.importing import Peer, constants, functions, placeholders
from tests.peers.vllm_v1 import EngineSettings, OnceLogger, Settings

MODULES = {  # architecture -> the vLLM module that defines it (model_executor/models/registry.py)
    "NemotronHForCausalLM": "vllm.model_executor.models.nemotron_h",
    "GraniteMoeHybridForCausalLM": "vllm.model_executor.models.granitemoehybrid",
    "Qwen3NextForCausalLM": "vllm.model_executor.models.qwen3_next",
}
MAMBA_UTILS = "vllm.model_executor.layers.mamba.mamba_utils"
REAL = (*MODULES.values(), MAMBA_UTILS, "vllm.model_executor.models.config", "vllm.utils.math_utils")


def leaves_the_class(*args, **kwargs):
    """``support_torch_compile``, with or without its arguments: the class as it is (it only
    compiles ``forward``, which is never run here)."""
    if len(args) == 1 and isinstance(args[0], type) and not kwargs:
        return args[0]
    return lambda cls: cls


class Unread:
    """A value a class statement builds and the peer never reads (``WeightsMapper``: weight
    names for loading a checkpoint)."""

    def __init__(self, *args, **kwargs):
        pass


# module -> {name: value, or None for a Placeholder}: what the real modules import
STUBS = {
    "transformers": placeholders("NemotronHConfig", "GraniteMoeHybridConfig", "Qwen3NextConfig"),
    "vllm.logger": {"init_logger": lambda name: OnceLogger(logging.getLogger(name))},
    # mamba_utils.py:36: None is vLLM's default (envs.py:258), the "SD" conv layout
    "vllm.envs": {"VLLM_SSM_CONV_STATE_LAYOUT": None},
    "vllm.compilation.decorators": {"support_torch_compile": leaves_the_class},
    "vllm.config": placeholders("CacheConfig", "ModelConfig", "VllmConfig"),
    "vllm.config.cache": placeholders("MambaDType"),
    "vllm.config.mamba": placeholders("MambaBackendEnum"),
    "vllm.config.model": placeholders("ModelDType"),
    "vllm.config.parallel": placeholders("ParallelConfig"),
    # divide: compiled from distributed/utils.py below
    "vllm.distributed": placeholders("get_ep_group", "get_pp_group", "get_tensor_model_parallel_world_size",
                                     "tensor_model_parallel_all_gather", "tensor_model_parallel_reduce_scatter"),
    "vllm.distributed.communication_op": placeholders("tensor_model_parallel_all_gather"),
    "vllm.distributed.parallel_state": placeholders("get_pp_group"),
    "vllm.model_executor.layers.activation": placeholders("get_act_fn"),
    "vllm.model_executor.layers.attention": placeholders("Attention"),
    "vllm.model_executor.layers.fused_moe": placeholders(
        "FusedMoEFactory", "GateLinear", "activation_without_mul", "fused_moe_make_expert_params_mapping"),
    "vllm.model_executor.layers.fused_moe.utils": placeholders(
        "is_model_fused_shared_expert_compatible", "resolve_layer_fused_shared_expert"),
    "vllm.model_executor.layers.fused_qk_norm_rope": placeholders("fused_qk_rmsnorm_rope_gate"),
    "vllm.model_executor.layers.fusion.fused_act_quant": placeholders("maybe_fused_act_quant"),
    "vllm.model_executor.layers.layernorm": placeholders("RMSNorm", "GemmaRMSNorm"),
    "vllm.model_executor.layers.linear": placeholders(
        "ColumnParallelLinear", "QKVParallelLinear", "ReplicatedLinear", "RowParallelLinear",
        "UnquantizedLinearMethod"),
    "vllm.model_executor.layers.logits_processor": placeholders("LogitsProcessor"),
    "vllm.model_executor.layers.mamba.mamba_mixer2": placeholders("MambaMixer2"),
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn": placeholders("QwenGatedDeltaNetAttention"),
    "vllm.model_executor.layers.quantization": placeholders("QuantizationConfig"),
    "vllm.model_executor.layers.quantization.utils.config_utils": placeholders("get_quark_ocp_mx_group_size"),
    "vllm.model_executor.layers.rotary_embedding": placeholders("MRotaryEmbedding", "get_rope"),
    "vllm.model_executor.layers.vocab_parallel_embedding": placeholders("ParallelLMHead", "VocabParallelEmbedding"),
    "vllm.model_executor.model_loader.weight_utils": placeholders(
        "default_weight_loader", "maybe_remap_moe_expert_param_name"),
    "vllm.model_executor.models.interfaces": placeholders(
        "EagleModelMixin", "HasInnerState", "IsHybrid", "MambaStateShapes", "MixtureOfExperts", "SupportsEagle",
        "SupportsEagle3", "SupportsLoRA", "SupportsPP", "SupportsQuant", "SupportsReplaySSM"),
    "vllm.model_executor.models.utils": {"WeightsMapper": Unread, **placeholders(
        "AutoWeightsLoader", "PPMissingLayer", "extract_layer_index", "is_pp_missing_parameter",
        "make_empty_intermediate_tensors_factory", "make_layers", "maybe_fuse_shared_experts", "maybe_prefix",
        "sequence_parallel_chunk")},
    "vllm.model_executor.models.granitemoe": placeholders("GraniteMoeMoE"),
    "vllm.model_executor.models.granitemoeshared": placeholders("GraniteMoeSharedMLP"),
    "vllm.model_executor.models.qwen2_moe": placeholders("Qwen2MoeMLP"),
    "vllm.platforms": placeholders("current_platform"),
    "vllm.sequence": placeholders("IntermediateTensors"),
    # STR_DTYPE_TO_TORCH_DTYPE, get_kv_cache_torch_dtype: compiled from torch_utils.py below
    "vllm.utils.torch_utils": {},
    "vllm.v1.attention.backend": placeholders("AttentionType"),
    "vllm.v1.attention.backends.registry": placeholders("MambaAttentionBackendEnum"),
}
PEER = Peer("0.33.0", REAL, STUBS, "tests/peers/vllm_state_shapes.py")
CUDA_DTYPES = ("bfloat16", "float16", "float32")  # platforms/cuda.py:257-260, compute capability >= 8.0
AUTO_DTYPE: dict = {}  # config/model.py's _resolve_auto_dtype, compiled by compile_stubs


def compile_stubs() -> None:
    """vLLM's functions the real modules need from modules a CPU run cannot import, compiled
    from their source: a KV cache dtype by name (torch_utils.py:40-66, :420-440), the checked
    division of a TP shard (distributed/utils.py:51-55, :130-134), and the model dtype of
    ``dtype="auto"`` (config/model.py:2398-2410, :2423-2464)."""
    import torch

    torch_utils = constants(PEER, "vllm.utils.torch_utils", ("STR_DTYPE_TO_TORCH_DTYPE",), {"torch": torch})
    torch_utils.update(functions(PEER, "vllm.utils.torch_utils", ("get_kv_cache_torch_dtype",),
                                 {"torch": torch, **torch_utils}))
    STUBS["vllm.utils.torch_utils"].update(torch_utils)
    checked = functions(PEER, "vllm.distributed.utils", ("ensure_divisibility",), {})
    STUBS["vllm.distributed"].update(functions(PEER, "vllm.distributed.utils", ("divide",), checked))
    platform = types.SimpleNamespace(supported_dtypes=[getattr(torch, name) for name in CUDA_DTYPES])
    namespace = {"torch": torch, "current_platform": platform, "logger": logging.getLogger("vllm.config.model"),
                 **constants(PEER, "vllm.config.model", ("_FLOAT16_NOT_SUPPORTED_MODELS",), {})}
    namespace.update(functions(PEER, "vllm.config.model", ("_is_valid_dtype",), namespace))
    AUTO_DTYPE.update(functions(PEER, "vllm.config.model", ("_resolve_auto_dtype",), namespace))


def load() -> types.SimpleNamespace:
    """The three model classes, their modules, vLLM's config rules, imported from the cache folder."""
    if PEER.fetched() and not AUTO_DTYPE:
        compile_stubs()
    with PEER.active():
        import importlib

        from vllm.model_executor.models.config import MODELS_CONFIG_MAP
        modules = {arch: importlib.import_module(module) for arch, module in MODULES.items()}
    return types.SimpleNamespace(modules=modules, classes={arch: getattr(m, arch) for arch, m in modules.items()},
                                 config_map=MODELS_CONFIG_MAP)


def engine_config(config: dict, tensor_parallel: int):
    """vLLM's ``VllmConfig`` for a ``config.json`` at ``tensor_parallel``, as far as the state
    rules read it: the config as ``hf_config`` (and ``hf_text_config``: none of these has a
    ``text_config``), the model dtype of ``dtype="auto"``, the cache settings at their defaults
    (config/cache.py:296, :300, :322), no speculative decoding (``num_speculative_tokens`` is
    vLLM's own property, config/vllm.py:612-623)."""
    import torch

    hf_config = Settings(**config)
    config_dtype = getattr(torch, config.get("dtype") or config["torch_dtype"])  # transformers: str -> dtype
    dtype = AUTO_DTYPE["_resolve_auto_dtype"](config["model_type"], config_dtype, is_pooling_model=False)
    model = Settings(hf_config=hf_config, hf_text_config=hf_config, dtype=dtype,
                     architecture=config["architectures"][0])
    cache = Settings(mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto", use_replayssm=False)
    return EngineSettings(model_config=model, cache_config=cache,
                          parallel_config=Settings(tensor_parallel_size=tensor_parallel),
                          speculative_config=None, diffusion_config=None)


def verify_and_update(vllm, vllm_config) -> None:
    """The architecture's config rules, as ``VllmConfig.try_verify_and_update_config`` runs
    them (config/vllm.py:2754, :2763-2764): ``MODELS_CONFIG_MAP``'s class for the architecture,
    if it has one (Nemotron-H: the SSM state's dtype, models/config.py:812-839). The hybrid
    rule that follows (:2766-2767, ``HybridAttentionMambaModelConfig``) sets the Mamba block
    size and cache mode, not the state."""
    rules = vllm.config_map.get(vllm_config.model_config.architecture)
    if rules is not None:
        with PEER.active():
            rules.verify_and_update_config(vllm_config)


def state(vllm, config: dict, tensor_parallel: int) -> tuple[tuple, tuple]:
    """One layer's recurrent state in vLLM 0.33.0: its shapes and dtypes, from the model
    class's own classmethods on the engine config (after the architecture's config rules)."""
    vllm_config = engine_config(config, tensor_parallel)
    verify_and_update(vllm, vllm_config)
    model = vllm.classes[vllm_config.model_config.architecture]
    with PEER.active():
        shapes = model.get_mamba_state_shape_from_config(vllm_config)
        dtypes = model.get_mamba_state_dtype_from_config(vllm_config)
    return tuple(tuple(shape) for shape in shapes), tuple(dtypes)


def state_bytes(shapes: tuple, dtypes: tuple) -> int:
    """A layer's state bytes: each state's elements times its dtype's size, summed
    (``MambaSpec.page_size_bytes`` without padding, v1/kv_cache_interface.py:1121-1129)."""
    return sum(prod(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes, strict=True))
