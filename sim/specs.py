"""Model and GPU specifications, presets from public configurations, and KV capacity.

KV bytes per token (one token's K and V in every layer)::

    kv_bytes_per_token = 2 * num_layers * num_kv_heads * head_dim * dtype_bytes / tensor_parallel

    OPT-13B fp16: 2 * 40 * 40 * 128 * 2 = 819,200 B (800 KiB, the vLLM paper's number)

KV capacity in token slots is ``floor(kv_bytes / kv_bytes_per_token)`` where ``kv_bytes`` is
either given (``--kv-gib 12`` gives the paper's 15,728 slots for OPT-13B) or derived as::

    kv_bytes = gpu_mem * gpu_memory_utilization - weight_bytes / tp - activation_reserve

(the way vLLM sizes its pool: profile peak activations, give the rest to the KV cache).

Presets: model shapes are the Hugging Face ``config.json`` values of the public checkpoints
(facebook/opt-*, meta-llama/Llama-2-*-hf, meta-llama/Meta-Llama-3-*, mistralai/Mistral-7B-v0.1).
GPU figures are the vendors' datasheet numbers (dense fp16/bf16 tensor-core peak, HBM
bandwidth, NVLink and PCIe bandwidth per direction); memory is what ``nvidia-smi`` reports.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from sim.errors import ConfigError

GiB = 1 << 30


@dataclass(frozen=True)
class ModelSpec:
    """Transformer shapes that set KV size and per-iteration FLOPs and bytes."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_seq_len: int
    gated_mlp: bool = True  # LLaMA-style SwiGLU (3 matrices) vs OPT-style (2 matrices)
    dtype_bytes: int = 2

    @property
    def num_params(self) -> int:
        """Parameter count from the shapes (embeddings counted once; norms/biases ignored)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * (self.num_heads * self.head_dim) + 2 * h * kv + (self.num_heads * self.head_dim) * h
        mlp = (3 if self.gated_mlp else 2) * h * self.intermediate_size
        return self.num_layers * (attn + mlp) + self.vocab_size * h

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def kv_bytes_per_token(self, tensor_parallel: int = 1) -> float:
        """Bytes of K and V for one token across all layers on one GPU of a TP group."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes / tensor_parallel

    @property
    def is_gqa(self) -> bool:
        return self.num_kv_heads < self.num_heads


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's datasheet ceilings."""

    name: str
    mem_bytes: int
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    mem_bw: float  # HBM bytes/s
    interconnect_bw: float  # NVLink (or PCIe if none) bytes/s per direction, for all-reduce
    pcie_bw: float  # host <-> device bytes/s per direction, for swapping


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        ModelSpec("opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 2048, gated_mlp=False),
        ModelSpec("opt-66b", 64, 9216, 72, 72, 128, 36864, 50272, 2048, gated_mlp=False),
        ModelSpec("opt-175b", 96, 12288, 96, 96, 128, 49152, 50272, 2048, gated_mlp=False),
        ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
        ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
        ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192),
        ModelSpec("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192),
        ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
    ]
}

GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        GPUSpec("a100-40gb", 40 * GiB, 312e12, 1555e9, 300e9, 25e9),
        GPUSpec("a100-80gb", 80 * GiB, 312e12, 2039e9, 300e9, 25e9),
        GPUSpec("h100-80gb", 80 * GiB, 989e12, 3350e9, 450e9, 50e9),
        GPUSpec("h200-141gb", int(140.4 * GiB), 989e12, 4800e9, 450e9, 50e9),
        GPUSpec("l40s", 45 * GiB, 362e12, 864e9, 25e9, 25e9),
    ]
}

GPU_ALIASES = {"a100": "a100-40gb", "h100": "h100-80gb", "h200": "h200-141gb", "l40s-48gb": "l40s"}
MODEL_ALIASES = {"llama2-7b": "llama-2-7b", "llama2-13b": "llama-2-13b", "llama2-70b": "llama-2-70b",
                 "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b"}


def get_model(name_or_path: str) -> ModelSpec:
    """A preset by name, or a Hugging Face ``config.json`` by path."""
    key = name_or_path.lower()
    key = MODEL_ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    p = Path(name_or_path)
    if p.suffix == ".json" or p.exists():
        return model_from_hf_config(p)
    raise ConfigError(f"unknown model '{name_or_path}'; valid models: {', '.join(MODELS)} "
                      "(or a path to a Hugging Face config.json)")


def get_gpu(name: str) -> GPUSpec:
    key = name.lower()
    key = GPU_ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    raise ConfigError(f"unknown GPU '{name}'; valid GPUs: {', '.join(GPUS)}")


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read the shapes from a Hugging Face ``config.json`` (LLaMA/Mistral/OPT/GPT-NeoX keys)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: model config file not found") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object")

    def pick(*keys, default=None):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        if default is None:
            raise ConfigError(f"{path}: field '{keys[0]}' missing (also looked for {', '.join(keys[1:]) or 'nothing else'})")
        return default

    try:
        hidden = int(pick("hidden_size", "n_embd", "d_model"))
        heads = int(pick("num_attention_heads", "n_head"))
        layers = int(pick("num_hidden_layers", "n_layer", "num_layers"))
        kv_heads = int(pick("num_key_value_heads", "multi_query_group_num", default=heads))
        head_dim = int(pick("head_dim", default=hidden // heads))
        inter = int(pick("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden))
        vocab = int(pick("vocab_size", default=32000))
        max_len = int(pick("max_position_embeddings", "n_positions", "seq_length", default=2048))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: a shape field is not an integer ({e})") from None
    mtype = str(cfg.get("model_type", "")).lower()
    gated = mtype not in ("opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon")
    dtype = str(cfg.get("torch_dtype", "float16"))
    dbytes = 4 if dtype == "float32" else 2
    if heads % kv_heads:
        raise ConfigError(f"{path}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    name = cfg.get("_name_or_path") or path.parent.name or path.stem
    return ModelSpec(str(name), layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_len,
                     gated_mlp=gated, dtype_bytes=dbytes)


@dataclass(frozen=True)
class KVBudget:
    """How many token slots the KV pool has, and where that number came from."""

    capacity_tokens: int
    kv_bytes: int
    kv_bytes_per_token: float
    how: str


def kv_capacity(model: ModelSpec, gpu: GPUSpec | None = None, *, kv_bytes: float | None = None,
                tensor_parallel: int = 1, gpu_memory_utilization: float = 0.9,
                activation_reserve_bytes: float = 2 * GiB) -> KVBudget:
    """Token slots of the KV pool on one GPU of the TP group.

    Either ``kv_bytes`` is given, or it is derived from the GPU's memory as vLLM does.
    Raises ConfigError when the weights do not fit or no slot is left.
    """
    per_tok = model.kv_bytes_per_token(tensor_parallel)
    if tensor_parallel < 1:
        raise ConfigError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    if model.num_kv_heads % tensor_parallel and tensor_parallel % model.num_kv_heads:
        raise ConfigError(f"tensor_parallel={tensor_parallel} does not divide num_kv_heads={model.num_kv_heads}")
    if kv_bytes is not None:
        if kv_bytes <= 0:
            raise ConfigError(f"kv memory must be positive, got {kv_bytes} bytes")
        how = f"given: {kv_bytes / GiB:.2f} GiB of KV"
    else:
        if gpu is None:
            raise ConfigError("give either a GPU or the KV memory size (--kv-gib)")
        if not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        weights = model.weight_bytes / tensor_parallel
        usable = gpu.mem_bytes * gpu_memory_utilization
        kv_bytes = usable - weights - activation_reserve_bytes
        if kv_bytes <= 0:
            need_tp = math.ceil(model.weight_bytes / max(usable - activation_reserve_bytes, 1))
            raise ConfigError(
                f"{model.name} weights ({weights / GiB:.1f} GiB per GPU at TP={tensor_parallel}) plus the "
                f"{activation_reserve_bytes / GiB:.1f} GiB activation reserve do not fit in "
                f"{gpu.name} x {gpu_memory_utilization:.2f} = {usable / GiB:.1f} GiB; "
                f"try --tp {max(need_tp, tensor_parallel * 2)} or a larger GPU")
        how = (f"derived: {gpu.name} {gpu.mem_bytes / GiB:.1f} GiB x {gpu_memory_utilization:.2f} - weights "
               f"{weights / GiB:.1f} GiB - activations {activation_reserve_bytes / GiB:.1f} GiB")
    cap = int(kv_bytes // per_tok)
    if cap < 1:
        raise ConfigError(f"KV pool of {kv_bytes:.0f} bytes holds no token ({per_tok:.0f} B/token)")
    return KVBudget(cap, int(kv_bytes), per_tok, how)


def with_max_seq_len(model: ModelSpec, max_seq_len: int | None) -> ModelSpec:
    return model if max_seq_len is None else replace(model, max_seq_len=int(max_seq_len))
