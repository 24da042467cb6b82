"""Model and GPU specifications, presets, and KV capacity.

- ``model.py``: :class:`ModelSpec` and the rules from an architecture to KV bytes per token,
  recurrent state, parameters and weight bytes (total and active);
- ``hf_config.py``: reading a Hugging Face ``config.json`` (``--model path/to/config.json``);
- ``presets.py``: the model presets and ``get_model``;
- ``gpus.py``: :class:`GPUSpec`, the GPU presets with their datasheet sources, ``get_gpu``;
- ``capacity.py``: ``kv_capacity``, the KV pool's token slots on one GPU;
- ``links.py``: the links that carry KV between a prefill and a decode GPU (RDMA NICs, NVLink,
  PCIe), their rates and latencies with sources.

Example, OPT-13B fp16: 2 * 40 layers * 40 heads * 128 * 2 B = 819,200 B per token (800 KiB, the
vLLM paper's number); 12 GiB of KV hold 15,728 tokens.
"""

from pagesim.sim.specs.capacity import KVBudget, kv_capacity
from pagesim.sim.specs.gpus import GPU_ALIASES, GPUS, GiB, GPUSpec, get_gpu
from pagesim.sim.specs.hf_config import model_from_hf_config
from pagesim.sim.specs.model import (LatentAttention, MambaMixer, MixtureOfExperts, ModelSpec, Quantization,
                             with_kv_cache_dtype, with_max_seq_len)
from pagesim.sim.specs.presets import MODEL_ALIASES, MODELS, get_model

__all__ = ["GPU_ALIASES", "GPUS", "GPUSpec", "GiB", "KVBudget", "LatentAttention", "MODELS", "MODEL_ALIASES",
           "MambaMixer", "MixtureOfExperts", "ModelSpec", "Quantization", "get_gpu",
           "get_model", "kv_capacity", "model_from_hf_config", "with_kv_cache_dtype",
           "with_max_seq_len"]
