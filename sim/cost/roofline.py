"""Iteration cost models: how long one engine step takes for a given batch.

Roofline model (default)
------------------------
For a step with T = prefill + decode tokens on one GPU of a TP group of size ``tp``::

    linear   = bound(2 * T * P_dense / tp / (peak_flops * eff_flops),  # compute-bound (prefill)
                     W_unrouted / tp / (mem_bw * eff_bw))                # weight reads (decode)
             + bound(D(T) * W_expert / tp / (mem_bw * eff_bw),           # mixture of experts only:
                     R(T) * 2 * P_expert / tp / (peak_flops * eff_flops * eff_moe))  # fused-MoE kernel
    bound(a, b) = max(a, b) + o * min(a, b)                              # o = 0 here (the serving model's: measured)
    D(T)     = E * (1 - (1 - k/E)^T)                                     # distinct experts per layer
    R(T)     = D(T) * M * ceil(T * k / D(T) / M)                         # rows, padded to blocks of M
    attn     = KV_read / (mem_bw * eff_bw) * (1 + o / B)                 # decode: memory-bound
             + F_prefill / (peak_flops * eff_attn)                       # prefill: causal QK^T, PV
    state    = num_seqs * 2 * S / (mem_bw * eff_bw)                     # recurrent states (hybrids)
    allreduce= 2 * L * [ 2 (tp-1)/tp * T * hidden * dtype / link_bw + ar_latency ]   (tp > 1)
    swap     = swapped_tokens * kv_bytes_per_token / pcie_bw
             + swapped_tokens * 2 * L * copy_latency / block_size   # one copy per block, layer, K/V
    step     = overhead + per_seq_overhead * num_seqs + linear + attn + state + allreduce + swap

with ``P_dense`` the parameters one token multiplies outside the routed experts
(``ModelSpec.active_params`` less the ``k`` routed experts a token visits: every layer's
projections and dense MLP, a mixture of experts' router and shared experts, plus the LM head),
``W_unrouted`` the bytes of those weights at the checkpoint's width
(``ModelSpec.unrouted_weight_bytes``: ``2 P_dense`` in fp16, about ``P_dense`` in FP8, a
quarter of it in 4-bit AWQ/GPTQ), ``P_expert`` one routed expert of every MoE layer, ``M`` the
fused-MoE kernel's ``BLOCK_SIZE_M`` for a step of T tokens (16 to 128) and ``eff_moe`` that
kernel's FLOP/s relative to the dense GEMMs' (1 in the roofline; ``sim.core.cost`` states the
term and its sources), ``KV_read = sum(ctx) * kv_bytes_per_token`` (the decode attention reads
every cached K and V once: the vLLM paper's point that decoding is memory-bound; for
multi-head latent attention one latent per token and layer; one byte per element under
``--kv-cache-dtype fp8``, which halves these reads and the swaps' bytes of a 16-bit model),
vLLM v0's PagedAttention kernel (``--system vllm``, ``SimConfig.kernel_block_tokens``) reads
each sequence's K/V in whole blocks of ``B`` tokens, its last block too (``KV_read`` counts
``ceil(ctx / B) * B`` tokens), and works per block as much as reading ``o = 3.68`` more tokens:
the paper's Fig. 18a overhead, 23 % at its default ``B = 16``, taken as work per block
(``sim.core.cost``: the source lines; ``o / B = 0`` for the other kernels),
``S`` a sequence's recurrent state over its Mamba and linear-attention layers on one GPU
(``ModelSpec.state_bytes_per_seq``: 0 for a transformer), which each step that schedules the
sequence reads and writes back once (a decode token's ``selective_state_update``, vLLM's
model_executor/layers/mamba/ops/mamba_ssm.py; a prefill chunk's scan from its initial state to
its final one, ops/ssd_combined.py; the conv state beside it),
and ``F_prefill = A * sum_i c_i (p_i + c_i / 2) / tp`` for a chunk of ``c_i`` new tokens after ``p_i`` cached ones,
with ``A = ModelSpec.attention_flops_per_pair`` (``4 * L * heads * head_dim``: QK^T and PV,
causal half, over the attention layers only). GEMMs of W8A8 FP8 checkpoints run at the GPU's
FP8 peak where it has one (``GPUSpec.peak_fp8_flops``). For a dense 16-bit model these are the
same numbers, bit for bit, as before MoE and quantization were modelled.

A mixture of experts' step reads each routed expert that at least one of its T tokens visits,
once (vLLM's fused_moe runs one block of tokens per expert): with ``E`` routed experts per MoE
layer, ``k`` visited per token, routing taken as uniform and independent, that is ``E * (1 -
(1 - k/E)^T)`` distinct experts per layer, ``k`` for one token and towards all ``E`` for a
large batch; their FLOPs are each expert's tokens padded to whole blocks of the kernel's rows,
a separate kernel from the dense GEMMs. ``W_unrouted`` is every weight but the routed experts (attention, dense MLPs,
shared experts, routers, LM head: ``ModelSpec.unrouted_weight_bytes``), ``W_expert`` one
routed expert's bytes summed over the MoE layers (``ModelSpec.routed_expert_weight_bytes``);
each GPU holds 1/tp of every expert, as vLLM shards them under TP. Memory holds every expert
(``ModelSpec.weight_bytes``, ``sim/specs/capacity.py``). The rule is stated in
``sim/core/price/cost.py`` (``routed_expert_seconds``). Under expert parallelism
(``expert_group`` = G GPUs holding the experts whole, ``data_parallel`` = K engine ranks among
them) each GPU reads whole experts, the step's tokens are K x T (every rank's, as many as this
one's), ``D(T)`` becomes the busiest GPU's share of the visited experts
(``busiest_group_experts``), and each MoE layer adds the ranks' all-gather and reduce-scatter
(:func:`all_to_all_constants`).

Where the constants come from: peak FLOP/s and HBM bandwidth are datasheet figures
(``sim/specs/gpus.py``). Dense GEMMs on A100/H100 reach 60-75 % of peak and streaming kernels
75-85 % of HBM bandwidth in public measurements, hence ``eff_flops=0.65`` and ``eff_bw=0.8``;
attention's prefill kernels (FlashAttention-2) reach ~50 % of peak (``eff_attn=0.5``). The
fixed overhead (3 ms + 20 us/sequence) is vLLM v0's Python scheduling, sampling and
block-table preparation as reported in its profiling discussions. All are knobs; a measured
profile (``--profile``) replaces the guesswork.

Table model
-----------
``TableCostModel`` reads the profile CSV written by ``pagesim gpu calibrate`` (format in
``sim/cost/profile_format.py``: rows ``component,num_tokens,batch,context,time_us``) and
interpolates linearly: ``linear(T)``, ``attn_decode(batch, mean context)`` (bilinear),
``attn_prefill(n)`` per prefilling sequence, plus the constant ``overhead``; beyond a table the
last segment's slope extends it (``sim/core/price/cost_table.py`` states the interpolation, which the
core's loop calls too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.core.price import cost_table
from pagesim.sim.core.price.cost import (kernel_read_tokens, linear_seconds, paged_kernel_overhead, roofline_step_time,
                                   swap_copy_seconds_per_token)
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import GPUSpec, ModelSpec


# Python's engine prices one batch at a time: the interpreted function avoids numba's call
# overhead (the same source, so the same float)
_step_time = interpreted(roofline_step_time)
_linear_seconds = interpreted(linear_seconds)
_kernel_read_tokens = interpreted(kernel_read_tokens)


def prefill_sums(batch: StepBatch) -> tuple[float, int]:
    """sum(n * (b + n / 2)) and sum(b) over the prefilling sequences (n new tokens after b
    cached ones), as :func:`sim.core.cost.roofline_step_time` takes them. The first is half of
    the integer sum(n * (2b + n)), exact in any order (int64: ``SimConfig.check_token_pairs``
    keeps it in range), converted to a float once: the same float the core's loop makes
    however large the prompts (a float sum would round at each term, differently by order)."""
    if not len(batch.prefill_tokens):
        return 0.0, 0
    new = batch.prefill_tokens
    before = batch.prefill_context - new
    return float(np.dot(new, 2 * before + new)) * 0.5, int(before.sum())


def decode_read_sum(batch: StepBatch, kernel_block_tokens: int) -> int:
    """The cached tokens ``batch``'s decode attention reads, as the core's scheduler sums them:
    each context in whole blocks under a paged kernel (``sim.core.cost.kernel_read_tokens``),
    else ``decode_context_sum`` (which may come without the per-sequence array)."""
    if kernel_block_tokens and len(batch.decode_context):
        return int(_kernel_read_tokens(batch.decode_context, kernel_block_tokens).sum())
    return batch.decode_context_sum


class CpuOverhead:
    """A cost model's CPU time per iteration (``overhead_s``) and per scheduled sequence
    (``per_seq_overhead_s``), with where they come from; ``--step-overhead-ms`` and
    ``--per-seq-overhead-ms`` set them (:meth:`set_cpu_overhead`, the model's own verb)."""

    def set_cpu_overhead(self, overhead_s: float | None = None, per_seq_overhead_s: float | None = None) -> None:
        if overhead_s is not None:
            self.overhead_s = overhead_s
        if per_seq_overhead_s is not None:
            self.per_seq_overhead_s = per_seq_overhead_s
        self.cpu_overhead_source = "set by --step-overhead-ms / --per-seq-overhead-ms"


@dataclass
class RooflineCostModel(CpuOverhead):
    model: ModelSpec
    gpu: GPUSpec
    tensor_parallel: int = 1
    eff_flops: float = 0.65
    eff_bw: float = 0.8
    eff_attn: float = 0.5
    overhead_s: float = 3e-3
    per_seq_overhead_s: float = 20e-6
    cpu_overhead_source = "the roofline's default (not measured)"
    allreduce_latency_s: float = 10e-6
    swap_block_tokens: int = 0  # tokens one swap copy moves (the KV block size; 0: contiguous, no copy latency)
    kernel_block_tokens: int = 0  # the paged kernel's block (vLLM v0's; SimConfig.kernel_block_tokens), 0: none
    eff_moe: float = 1.0  # the fused-MoE grouped GEMM's FLOP/s as a fraction of the dense GEMMs' (eff_flops)
    expert_group: int = 1  # GPUs the routed experts are split among whole (1: each expert TP-sharded)
    data_parallel: int = 1  # engine ranks of that expert-parallel group (SimConfig.data_parallel)
    gemm_overlap: float = 0.0  # a GEMM's lesser bound's share added to its greater (sim.core.cost.bound_seconds)

    def __post_init__(self) -> None:
        m, tp = self.model, self.tensor_parallel
        h = m.hidden_size
        # the dense GEMMs compute every weight but the routed experts, whose FLOPs the fused-MoE
        # kernel computes (sim.core.cost.routed_expert_seconds)
        self._lin_flops_per_token = 2.0 * m.unrouted_params / tp
        # expert parallel: each GPU holds whole experts (a read and a row of one whole expert)
        shards = 1 if self.expert_group > 1 else tp
        self._expert_flops_per_row = 2.0 * m.routed_expert_params / shards
        self._lin_weight_time = m.unrouted_weight_bytes / tp / (self.gpu.mem_bw * self.eff_bw)
        # a mixture of experts' routed experts, read as the step's tokens visit them (sim.core.cost)
        self._routed_experts = float(m.moe.num_experts) if m.moe is not None else 0.0
        self._experts_per_token = float(m.moe.experts_per_token) if m.moe is not None else 0.0
        self._expert_weight_time = m.routed_expert_weight_bytes / shards / (self.gpu.mem_bw * self.eff_bw)
        fp8 = m.quantization is not None and m.quantization.fp8_compute and self.gpu.peak_fp8_flops
        self._flops = (self.gpu.peak_fp8_flops if fp8 else self.gpu.peak_flops) * self.eff_flops
        self._expert_flops = self._flops * self.eff_moe
        self._kv_bytes_per_token = m.kv_bytes_per_token(tp)
        self._bw = self.gpu.mem_bw * self.eff_bw
        self._attn_flops_coef = m.attention_flops_per_pair / tp
        self._attn_flops = self.gpu.peak_flops * self.eff_attn
        self._swap_copy_s_per_token = swap_copy_seconds_per_token(m.num_attention_layers, self.swap_block_tokens)
        self._paged_kernel_overhead = paged_kernel_overhead(self.kernel_block_tokens)
        self._state_bytes_per_seq = float(m.state_bytes_per_seq(tp))
        if tp > 1:
            self._ar_time_per_token = (2 * m.num_layers * 2 * (tp - 1) / tp * h * m.dtype_bytes
                                       / self.gpu.interconnect_bw)
            self._ar_fixed = 2 * m.num_layers * self.allreduce_latency_s
        else:
            self._ar_time_per_token = 0.0
            self._ar_fixed = 0.0
        self._a2a_fixed, self._a2a_time_per_token = all_to_all_constants(
            m, self.data_parallel, self.gpu.interconnect_bw, self.allreduce_latency_s)

    def linear_time(self, num_tokens: int) -> float:
        """The step's GEMMs over ``num_tokens`` tokens (``sim.core.cost.linear_seconds``)."""
        return _linear_seconds(self.constants(), num_tokens)

    def decode_attention_time(self, total_context: int) -> float:
        return total_context * self._kv_bytes_per_token / self._bw

    def prefill_attention_time(self, new_tokens: np.ndarray, context_after: np.ndarray) -> float:
        if len(new_tokens) == 0:
            return 0.0
        if len(new_tokens) == 1:  # one prompt (the usual prefill step): the same floats in scalars
            n = int(new_tokens[0])
            b = int(context_after[0]) - n
            flops = self._attn_flops_coef * float(n * (b + n * 0.5))
            return flops / self._attn_flops + float(b) * self._kv_bytes_per_token / self._bw
        before = context_after - new_tokens
        flops = self._attn_flops_coef * float(np.dot(new_tokens, before + new_tokens * 0.5))
        # prefill also reads the cached prefix's KV once (chunked prefill, prefix caching)
        return flops / self._attn_flops + float(before.sum()) * self._kv_bytes_per_token / self._bw

    def step_time(self, batch: StepBatch) -> float:
        """The price of ``batch``: :func:`sim.core.cost.roofline_step_time`, the one statement
        of the formula above, which the core's loop calls too."""
        num_prefill = len(batch.prefill_tokens)
        flop_sum, cached_sum = prefill_sums(batch)
        return _step_time(self.constants(), batch.num_seqs, batch.num_prefill_tokens + batch.num_decode_tokens,
                          decode_read_sum(batch, self.kernel_block_tokens), num_prefill, flop_sum, cached_sum,
                          batch.swap_in_tokens + batch.swap_out_tokens, batch.copy_tokens)

    def constants(self) -> tuple[float, ...]:
        """The model's constants in the order :mod:`sim.core.cost` indexes them."""
        return (self.overhead_s, self.per_seq_overhead_s, self._lin_flops_per_token, self._flops,
                self._lin_weight_time, self._ar_fixed, self._ar_time_per_token, self._kv_bytes_per_token,
                self._bw, self._attn_flops_coef, self._attn_flops, self.gpu.pcie_bw, self._swap_copy_s_per_token,
                self._routed_experts, self._experts_per_token, self._expert_weight_time, self._paged_kernel_overhead,
                self._state_bytes_per_seq, self._expert_flops_per_row, self._expert_flops, float(self.data_parallel),
                float(self.expert_group), self._a2a_fixed, self._a2a_time_per_token, self.gemm_overlap)


def all_to_all_constants(model: ModelSpec, data_parallel: int, link_bw: float, latency_s: float) -> tuple[float, float]:
    """The dispatch and combine of ``data_parallel`` ranks of an expert-parallel group, per
    iteration: (latency, seconds per token of this rank). vLLM's default all-to-all
    (``all2all_backend = "allgather_reducescatter"``, vllm/config/parallel.py of 0.33.0 line 220)
    all-gathers every rank's hidden states, top-k weights (fp32) and ids (int32) before each MoE
    layer's experts and reduce-scatters their outputs after (``AgRsAll2AllManager``,
    vllm/distributed/device_communicators/all2all.py): two collectives per MoE layer, each a
    ``latency_s`` (the all-reduce's) and, ring-wise, the other ranks' bytes over the link, as
    many tokens as this rank's each. (0, 0) for one rank."""
    if data_parallel <= 1 or model.moe is None:
        return 0.0, 0.0
    dispatch = model.hidden_size * model.dtype_bytes + model.moe.experts_per_token * (4 + 4)
    combine = model.hidden_size * model.dtype_bytes
    per_token = model.num_moe_layers * (data_parallel - 1) * (dispatch + combine) / link_bw
    return 2 * model.num_moe_layers * latency_s, per_token

def _same_model(name: str, model: ModelSpec) -> bool:
    """Whether a profile's ``model`` column names ``model`` (by its preset's name or alias, else as written)."""
    from pagesim.sim.specs import get_model

    try:
        return get_model(name).name == model.name
    except ConfigError:
        return name.strip().lower() == model.name.lower()


def _same_gpu(name: str, gpu: GPUSpec) -> bool:
    """Whether a profile's ``gpu`` column may be ``gpu``: a preset's name or alias must be its; a
    name no preset knows (``pagesim gpu calibrate`` writes the device's own, e.g. h100-80gb-hbm3,
    unless given --gpu-name) cannot be told apart, and is taken."""
    from pagesim.sim.specs import get_gpu

    try:
        return get_gpu(name).name == gpu.name
    except ConfigError:
        return True


class TableCostModel(CpuOverhead):
    """Interpolates a measured profile (see ``sim/cost/profile_format.py``): packs it for
    :func:`sim.core.cost_table.table_step_time` (the constants and the tables arrays) and
    calls it for every batch."""

    def __init__(self, path: str | Path, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1,
                 swap_block_tokens: int = 0):
        # only --profile runs load it (7 ms of every run's start)
        from pagesim.sim.cost.profile_format import read_profile

        if model.kv_cache_dtype != "auto":  # profile_format's dtype: float16 or bfloat16, K and V included
            raise ConfigError(f"{path}: a profile's attention is measured on a 16-bit KV cache; --kv-cache-dtype "
                              f"{model.kv_cache_dtype} needs the roofline (drop --profile)")
        df = read_profile(path)
        measured = sorted(set(df["model"]))
        if not any(_same_model(name, model) for name in measured):  # another model's times
            raise ConfigError(f"{path}: the profile measured {', '.join(measured)}, not {model.name}: it prices its own "
                              "model alone (measure this one, or drop --profile)")
        on = sorted(set(df["gpu"]))
        if not any(_same_gpu(name, gpu) for name in on):  # another GPU's times
            raise ConfigError(f"{path}: the profile was measured on {', '.join(on)}, not {gpu.name}: it prices its own "
                              "GPU alone (measure this one, or drop --profile)")
        degrees = sorted(set(int(x) for x in df["tp"]))
        if tensor_parallel not in degrees:  # another tensor-parallel degree's shards and all-reduces
            raise ConfigError(f"{path}: the profile was measured at TP {', '.join(map(str, degrees))}, not "
                              f"--tp {tensor_parallel} (measure at this degree, or drop --profile)")
        # a profile of several models, GPUs or degrees prices this run by its own rows alone
        df = df[df["model"].map(lambda name: _same_model(name, model))
                & df["gpu"].map(lambda name: _same_gpu(name, gpu)) & (df["tp"] == tensor_parallel)]
        self.path = str(path)
        self._roof = RooflineCostModel(model, gpu, tensor_parallel, swap_block_tokens=swap_block_tokens)

        def part(name):
            return df[df["component"] == name]

        lin = part("linear").sort_values("num_tokens")
        if lin.empty:
            raise ConfigError(f"{path}: profile has no 'linear' rows")
        dec = part("attn_decode")
        if dec.empty:
            raise ConfigError(f"{path}: profile has no 'attn_decode' rows")
        batches = np.unique(dec["batch"].to_numpy(float))
        contexts = np.unique(dec["context"].to_numpy(float))
        grid = dec.pivot_table(index="batch", columns="context", values="time_us", aggfunc="median")
        grid = grid.reindex(index=batches, columns=contexts)
        if grid.isna().any().any():
            raise ConfigError(f"{path}: 'attn_decode' rows must form a full batch x context grid")
        pre = part("attn_prefill").sort_values("num_tokens")
        self._sizes = (len(lin), len(batches), len(contexts), len(pre))
        self._tables = np.concatenate([
            lin["num_tokens"].to_numpy(float), lin["time_us"].to_numpy(float) * 1e-6,
            batches, contexts, grid.to_numpy(float).ravel() * 1e-6,
            pre["num_tokens"].to_numpy(float), pre["time_us"].to_numpy(float) * 1e-6])
        ov = part("overhead")
        self.overhead_s = float(ov["time_us"].median()) * 1e-6 if not ov.empty else 0.0
        self.cpu_overhead_source = "the profile's overhead rows" if not ov.empty else "none: the profile has no overhead row"
        self.per_seq_overhead_s = 0.0  # measured profiles include it; --per-seq-overhead-ms adds more
        self._c = np.zeros(0)

    def constants(self) -> np.ndarray:
        """The float64 array :mod:`sim.core.cost_table` indexes: the roofline's constants with
        this model's overheads, then the tables' sizes (rebuilt when an overhead was reassigned:
        ``make_cost_model`` sets them after construction)."""
        if not len(self._c) or (self._c[0], self._c[1]) != (self.overhead_s, self.per_seq_overhead_s):
            c = [*self._roof.constants(), *self._sizes]
            c[cost_table.OVERHEAD_S], c[cost_table.PER_SEQ_OVERHEAD_S] = self.overhead_s, self.per_seq_overhead_s
            self._c = np.array(c, dtype=np.float64)
        return self._c

    def tables(self) -> np.ndarray:
        """The profile's tables, one float64 array (layout in :mod:`sim.core.cost_table`)."""
        return self._tables

    def step_time(self, batch: StepBatch) -> float:
        flop_sum, cached_sum = prefill_sums(batch)
        return float(cost_table.table_step_time(
            self.constants(), self._tables, batch.num_seqs, batch.num_prefill_tokens + batch.num_decode_tokens,
            batch.num_decode_tokens, batch.decode_context_sum, len(batch.prefill_tokens), batch.prefill_context,
            flop_sum, cached_sum, batch.swap_in_tokens + batch.swap_out_tokens, batch.copy_tokens))
