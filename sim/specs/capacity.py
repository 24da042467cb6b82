"""KV capacity: how many token slots the KV pool of one GPU holds.

Capacity in token slots is ``floor(kv_bytes / kv_bytes_per_token)`` where ``kv_bytes`` is
either given (``--kv-gib 12`` gives the paper's 15,728 slots for OPT-13B) or derived as::

    kv_bytes = gpu_mem * gpu_memory_utilization - weight_bytes / tp - activation_reserve
               - max_num_seqs * state_bytes_per_seq        (Mamba / linear-attention models only)

(the way vLLM sizes its pool: load the weights, reserve the recurrent-state slots, profile
peak activations, give the rest to the KV cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pagesim.sim.errors import ConfigError
from pagesim.sim.specs.gpus import GiB, GPUSpec
from pagesim.sim.specs.model import ModelSpec


@dataclass(frozen=True)
class KVBudget:
    """How many token slots the KV pool has, and where that number came from."""

    capacity_tokens: int
    kv_bytes: int
    kv_bytes_per_token: float
    how: str
    #: recurrent-state slots (Mamba, linear attention) reserved outside the pool, taken from the
    #: memory before ``kv_bytes`` (0: none, or ``kv_bytes`` given)
    state_bytes: int = 0


def check_tensor_parallel(model: ModelSpec, tensor_parallel: int) -> None:
    """vLLM's rule: TP divides the attention heads, and the KV heads divide TP or TP divides
    them (``ModelConfig.verify_with_parallel_config`` and ``QKVParallelLinear``)."""
    if tensor_parallel < 1:
        raise ConfigError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    if model.num_heads % tensor_parallel:
        raise ConfigError(f"tensor_parallel={tensor_parallel} does not divide num_attention_heads={model.num_heads}")
    if model.num_kv_heads % tensor_parallel and tensor_parallel % model.num_kv_heads:
        raise ConfigError(f"tensor_parallel={tensor_parallel} does not divide num_kv_heads={model.num_kv_heads}")


def runnable_tensor_parallel(model: ModelSpec, at_least: int) -> int:
    """The smallest tensor parallelism from ``at_least`` up that ``model`` runs at (its heads and
    its recurrent states split evenly), for a suggestion; ``at_least`` when none does."""
    for t in range(at_least, model.num_heads + 1):
        try:
            check_tensor_parallel(model, t)
            model.state_bytes_per_seq(t)
        except ConfigError:
            continue
        return t
    return at_least


def kv_capacity(model: ModelSpec, gpu: GPUSpec | None = None, *, kv_bytes: float | None = None,
                tensor_parallel: int = 1, gpu_memory_utilization: float = 0.9,
                activation_reserve_bytes: float = 2 * GiB, max_num_seqs: int | None = None,
                states_in_pool: bool = False, expert_group: int = 1) -> KVBudget:
    """Token slots of the KV pool on one GPU of the TP group.

    Either ``kv_bytes`` is given, or it is derived from the GPU's memory as vLLM does
    (``max_num_seqs`` is needed then for models with a recurrent state, unless
    ``states_in_pool``: vLLM v1 keeps the states in the pool's blocks, ``sim/specs/kv_groups.py``).
    ``expert_group``: the GPUs a mixture of experts' routed experts are split among whole
    (``ModelSpec.weight_bytes_per_gpu``). Raises ConfigError when the weights do not fit or no
    slot is left.
    """
    check_tensor_parallel(model, tensor_parallel)
    per_tok = model.kv_bytes_per_token(tensor_parallel)
    state_bytes = 0
    if per_tok == 0:
        raise ConfigError(f"{model.name} has no attention layer: no KV cache to simulate")
    if kv_bytes is not None:
        if kv_bytes <= 0:
            raise ConfigError(f"kv memory must be positive, got {kv_bytes} bytes")
        weights = model.weight_bytes_per_gpu(tensor_parallel, expert_group)
        if gpu is not None and kv_bytes + weights > gpu.mem_bytes:
            room = (gpu.mem_bytes - weights) / GiB
            raise ConfigError(f"--kv-gib {kv_bytes / GiB:g} does not fit on {gpu.name}: its {gpu.mem_bytes / GiB:.1f} "
                              f"GiB hold {model.name}'s weights ({weights / GiB:.1f} GiB "
                              f"per GPU at TP={tensor_parallel}) and at most {max(room, 0):.1f} GiB of KV; give less, "
                              "a larger --gpu or a higher --tp")
        how = f"given: {kv_bytes / GiB:.2f} GiB of KV"
    else:
        if gpu is None:
            raise ConfigError("give either a GPU or the KV memory size (--kv-gib)")
        if not 0 < gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        weights = model.weight_bytes_per_gpu(tensor_parallel, expert_group)
        usable = gpu.mem_bytes * gpu_memory_utilization
        kv_bytes = usable - weights - activation_reserve_bytes
        how = (f"derived: {gpu.name} {gpu.mem_bytes / GiB:.1f} GiB x {gpu_memory_utilization:.2f} - weights "
               f"{weights / GiB:.1f} GiB - activations {activation_reserve_bytes / GiB:.1f} GiB")
        state = 0 if states_in_pool else model.state_bytes_per_seq(tensor_parallel)
        if state:
            if max_num_seqs is None:
                raise ConfigError(f"{model.name} keeps a recurrent state per sequence: give max_num_seqs "
                                  "to size its slots")
            state_bytes = int(state * max_num_seqs)
            kv_bytes -= state_bytes
            how += f" - state {max_num_seqs} x {state / (1 << 20):.1f} MiB"
        if kv_bytes <= 0:  # one line within 100 columns: what it needs, of what, and a TP it runs at
            need_tp = math.ceil(model.weight_bytes / max(usable - activation_reserve_bytes, 1))
            needed = (weights + activation_reserve_bytes + state_bytes) / GiB
            states = f" ({state_bytes / GiB:.1f} states)" if state_bytes else ""
            tp = runnable_tensor_parallel(model, max(need_tp, tensor_parallel * 2))
            at = f" at TP={tensor_parallel}" if tensor_parallel > 1 else ""
            more = " or more --replicas" if expert_group > 1 else ""  # its experts over more GPUs
            raise ConfigError(f"{model.name}{at} needs {needed:.1f} GiB{states} of {gpu.name}'s "
                              f"{usable / GiB:.1f}: try --tp {tp}{more}")
    cap = int(kv_bytes // per_tok)
    if cap < 1:
        raise ConfigError(f"KV pool of {kv_bytes:.0f} bytes holds no token ({per_tok:.0f} B/token)")
    return KVBudget(cap, int(kv_bytes), per_tok, how, state_bytes)


def vattention_page_tokens(model, page_bytes: int, tensor_parallel: int = 1) -> int:
    """Tokens per physical page of ``page_bytes`` per layer for ``model`` at ``tensor_parallel``."""
    if page_bytes <= 0:
        raise ConfigError(f"vattention_page_kib must be > 0, got {page_bytes / 1024:g} (e.g. 64)")
    return max(1, int(page_bytes // model.kv_bytes_per_layer_token(tensor_parallel)))
