"""The roofline's price of one iteration, stated once; and the scale of any model's GPU time.

``sim.cost.roofline.RooflineCostModel`` derives the constants (formulas and their sources are in
its docstring) and calls :func:`roofline_step_time` for every batch; the core's loop calls it
too. The constants travel as one float64 array in the order of the indices below.
"""

from __future__ import annotations

import math

from pagesim.sim.core.compile.jit import njit

# indices into the constants array (RooflineCostModel.constants())
OVERHEAD_S = 0  # fixed CPU cost per iteration
PER_SEQ_OVERHEAD_S = 1  # CPU cost per scheduled sequence
LINEAR_FLOPS_PER_TOKEN = 2  # 2 * linear parameters but the routed experts / TP
FLOPS = 3  # achieved FLOP/s of the GEMMs
LINEAR_WEIGHT_TIME_S = 4  # reading the linear weights once (a mixture of experts': all but its routed experts)
ALLREDUCE_FIXED_S = 5  # TP all-reduce latency per iteration
ALLREDUCE_S_PER_TOKEN = 6
KV_BYTES_PER_TOKEN = 7  # per GPU
MEMORY_BANDWIDTH = 8  # achieved HBM bytes/s
ATTENTION_FLOPS_COEF = 9  # 4 * layers * heads * head_dim / TP
ATTENTION_FLOPS = 10  # achieved FLOP/s of prefill attention
PCIE_BANDWIDTH = 11
SWAP_COPY_S_PER_TOKEN = 12  # the per-copy latency of swapping, per token (swap_copy_seconds_per_token)
ROUTED_EXPERTS = 13  # E, routed experts per MoE layer (0: a dense model)
EXPERTS_PER_TOKEN = 14  # k, the routed experts each token visits
EXPERT_WEIGHT_TIME_S = 15  # reading one routed expert of every MoE layer once
PAGED_KERNEL_OVERHEAD = 16  # a paged kernel's work per block, as a fraction of the block's K/V reads (0: none)
STATE_BYTES_PER_SEQ = 17  # a sequence's recurrent state (Mamba, linear attention) on one GPU (0: none)
EXPERT_FLOPS_PER_ROW = 18  # one token's row through one routed expert of every MoE layer: 2 * 3*h*i / TP
EXPERT_FLOPS = 19  # achieved FLOP/s of the fused-MoE grouped GEMM
DATA_PARALLEL = 20  # engine ranks whose tokens meet at each MoE layer (1: one engine)
EXPERT_GROUPS = 21  # GPUs the routed experts are split among, whole (expert parallel; 1: each expert TP-sharded)
ALL_TO_ALL_FIXED_S = 22  # the ranks' dispatch and combine latency per iteration (0: one rank)
ALL_TO_ALL_S_PER_TOKEN = 23  # their bytes per token of this rank
GEMM_OVERLAP = 24  # the share of a GEMM's lesser bound added to its greater (bound_seconds; 0: the plain max)
NUM_CONSTANTS = 25

# Swapping copies one KV block per cudaMemcpyAsync: vLLM's swap_blocks (csrc/cache_kernels.cu,
# "NOTE(woosuk): This can be slow if the number of blocks is large") loops over the block
# mapping, and CacheEngine._swap (vllm/worker/cache_engine.py) calls it for each layer's key
# cache and value cache: 2 * layers copies per block. Each copy costs about 5-7 us before its
# bytes move (DualPath, Wu et al. 2026, arXiv 2602.21548, sec. 5.2: "submitting a single copy
# operation via cudaMemcpyAsync incurs a latency overhead of approximately 5-7 us"); we take
# the low end. This is what makes small blocks expensive to swap (the vLLM paper, sec. 7.3).
PCIE_COPY_LATENCY_S = 5e-6

# vLLM v0's PagedAttention kernel works block by block: each warp reads a block's number from the
# block table, then the block's keys (csrc/attention/attention_kernels.cu of vLLM 0.4.2, lines
# 202-206), and again for its values (335-337). The vLLM paper measures the kernel 20-26 % slower
# than FasterTransformer's contiguous one (Fig. 18a, sec. 7.1: "accessing the block table,
# executing extra branches, and handling variable sequence lengths") at its default block size,
# 16. We take that overhead whole as work per block, at its midpoint: each block costs as much
# again as reading 0.23 x 16 = 3.68 tokens of K/V. Per token that is 3.68 / block_size of the
# reads: 23 % at 16, 3.7x at block size 1, 1.4 % at 256, so small blocks are slow to attend,
# as the paper's Fig. 18b finds. Today's kernels (FlashAttention, FlashInfer) are not priced so.
PAGED_KERNEL_BLOCK_OVERHEAD_TOKENS = 0.23 * 16


@njit
def roofline_step_time(c, num_seqs, num_tokens, decode_context_sum, num_prefill_seqs,
                       prefill_flop_sum, prefill_cached_sum, swapped_tokens, copied_tokens):
    """Seconds for one iteration. ``decode_context_sum`` is the cached tokens the decode
    attention reads, over the decoding sequences (:func:`kernel_read_tokens` of each context).
    ``prefill_flop_sum`` is sum(n * (b + n / 2)) over the
    prefilling sequences (n new tokens after b cached ones: the causal QK^T and PV work),
    ``prefill_cached_sum`` is sum(b) (their cached K/V is read once). The order of the
    operations is fixed: every engine gets the same float."""
    t = c[OVERHEAD_S] + c[PER_SEQ_OVERHEAD_S] * num_seqs
    if num_tokens:
        t += linear_seconds(c, num_tokens)
        t += c[ALLREDUCE_FIXED_S] + c[ALLREDUCE_S_PER_TOKEN] * num_tokens
        if c[DATA_PARALLEL] > 1.0:  # data-parallel ranks of an expert-parallel group: dispatch and combine
            t += c[ALL_TO_ALL_FIXED_S] + c[ALL_TO_ALL_S_PER_TOKEN] * num_tokens
    if decode_context_sum:  # decode attention reads every cached K and V once
        t += paged_kernel_seconds(decode_context_sum * c[KV_BYTES_PER_TOKEN] / c[MEMORY_BANDWIDTH],
                                  c[PAGED_KERNEL_OVERHEAD])
    if c[STATE_BYTES_PER_SEQ]:  # each sequence's recurrent states read and written back once
        t += num_seqs * 2 * c[STATE_BYTES_PER_SEQ] / c[MEMORY_BANDWIDTH]
    if num_prefill_seqs:
        t += prefill_attention_seconds(c, prefill_flop_sum, prefill_cached_sum)
    return plus_transfers(c, t, swapped_tokens, copied_tokens)


@njit(inline=True)
def kernel_read_tokens(context, kernel_block):
    """The cached tokens a decode attention kernel reads for a sequence of ``context`` tokens
    when it reads K/V in whole blocks of ``kernel_block`` tokens (1: each token once). vLLM v0's
    PagedAttention kernel loads every key slot of a block and masks only the logits past the
    sequence (attention_kernels.cu of vLLM 0.4.2, lines 213-254), and every value slot, zeroing
    those past it (lines 367-375): a partly filled last block is read whole."""
    if (kernel_block & (kernel_block - 1)) == 0:  # a power of two, as vLLM's block sizes: no division
        return (context + kernel_block - 1) & -kernel_block
    return -(-context // kernel_block) * kernel_block


@njit(inline=True)
def paged_kernel_seconds(read_seconds, overhead):
    """A decode kernel's ``read_seconds`` of K/V reads, with a paged kernel's work per block on
    top: ``overhead`` (``PAGED_KERNEL_OVERHEAD``, :func:`paged_kernel_overhead`) of the reads;
    0 leaves the float as it is. Every cost model's decode attention goes through it."""
    if overhead:
        return read_seconds + read_seconds * overhead
    return read_seconds


def paged_kernel_overhead(kernel_block_tokens: int) -> float:
    """``c[PAGED_KERNEL_OVERHEAD]`` for a paged kernel of ``kernel_block_tokens``-token blocks
    (:data:`PAGED_KERNEL_BLOCK_OVERHEAD_TOKENS` per block); 0 for a kernel that is not paged (0)."""
    if kernel_block_tokens <= 0:
        return 0.0
    return PAGED_KERNEL_BLOCK_OVERHEAD_TOKENS / kernel_block_tokens


@njit(inline=True)
def linear_seconds(c, num_tokens):
    """The step's GEMMs over ``num_tokens`` tokens, each kernel bound by its weight reads or its
    FLOPs: the dense GEMMs (every weight but the routed experts: attention, dense MLPs, shared
    experts, routers, LM head), then a mixture of experts' fused-MoE grouped GEMMs
    (:func:`routed_expert_seconds`), which are kernels of their own. A dense model has no
    second term: its float is the dense GEMMs' alone."""
    t = bound_seconds(num_tokens * c[LINEAR_FLOPS_PER_TOKEN] / c[FLOPS], c[LINEAR_WEIGHT_TIME_S], c[GEMM_OVERLAP])
    if c[ROUTED_EXPERTS] == 0.0:
        return t
    return t + routed_expert_seconds(c, num_tokens)


@njit(inline=True)
def bound_seconds(compute_s, memory_s, overlap):
    """A GEMM bound by its FLOPs (``compute_s``) or its weight reads (``memory_s``): the greater,
    plus ``overlap`` of the lesser. Measured GEMMs are slower than either bound near the ridge
    where the two meet, both limits biting at once (Vidur's H100 timings: Llama-2-7B's four
    projections at 256 tokens take 260 us against bounds of about 160 and 140 us); the
    calibrated model's fit on them finds 0.45 of the lesser (``sim/cost/calibrated.py``,
    ``gemm_overlap``). 0 (the roofline's): the greater alone, the float as before."""
    if overlap:
        return max(compute_s, memory_s) + overlap * min(compute_s, memory_s)
    return max(compute_s, memory_s)


@njit(inline=True)
def distinct_experts(c, num_tokens):
    """The routed experts of one MoE layer that at least one of ``num_tokens`` tokens visits.
    With the ``k`` of ``E`` experts a token visits taken as uniform and independent, an expert
    is missed by all T tokens with probability (1 - k/E)^T: E * (1 - (1 - k/E)^T) distinct
    experts per layer (k at T = 1, towards E as T grows)."""
    experts = c[ROUTED_EXPERTS]
    return experts * (1.0 - (1.0 - c[EXPERTS_PER_TOKEN] / experts) ** float(num_tokens))


@njit(inline=True)
def fused_moe_block_m(num_tokens):
    """The token rows of one program of vLLM's fused-MoE kernel for a step of ``num_tokens``
    tokens: the default config's ``BLOCK_SIZE_M`` for 16-bit and per-tensor FP8 weights, chosen
    by M = the step's tokens (fused_moe.py of vLLM 0.33.0, ``get_default_config``, lines
    1376-1383; M = ``hidden_states.size(0)``, lines 1713-1745). The tuned file of Mixtral-8x7B
    at TP 2 on the H100 (configs/E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json) picks the
    same sizes but for M of 97-112, where it keeps 32."""
    if num_tokens <= 32:
        return 16.0
    if num_tokens <= 96:
        return 32.0
    if num_tokens <= 512:
        return 64.0
    return 128.0


@njit(inline=True)
def busiest_group_experts(experts, groups, visited):
    """The distinct routed experts on the busiest of ``groups`` GPUs that split ``experts`` routed
    experts whole (expert parallel), each expert visited with probability ``visited``: the
    expected maximum over the groups of Binomial(n, visited) with n = ceil(experts / groups)
    (vLLM gives the remainder's experts to the first ranks: ``determine_expert_map``,
    fused_moe/expert_map_manager.py of vLLM 0.33.0, lines 66-69; the busiest rank holds n).
    The step waits for it: every rank meets the others at each MoE layer's combine. E[max] =
    sum over x < n of 1 - F(x)^groups, F the binomial's distribution function, its terms in
    logarithms (a term of a 512-expert model underflows as a product) and every power of a float
    exponent (numba's and CPython's give the same floats so)."""
    n = int(math.ceil(experts / groups - 1e-9))
    if visited >= 1.0:
        return float(n)
    if visited <= 0.0:
        return 0.0
    log_odds = math.log(visited) - math.log1p(-visited)
    log_pmf = float(n) * math.log1p(-visited)
    cdf = 0.0
    expected = 0.0
    for x in range(n):
        cdf += math.exp(log_pmf)
        expected += 1.0 - min(cdf, 1.0) ** float(groups)
        log_pmf += math.log((n - x) / (x + 1.0)) + log_odds
    return expected


@njit(inline=True)
def routed_expert_seconds(c, num_tokens):
    """A mixture of experts' routed experts over a step of ``num_tokens`` tokens, every MoE layer:
    the larger of their weight reads and their FLOPs as the fused-MoE kernel runs them.

    Reads: vLLM's fused_moe sorts the step's (token, expert) pairs by expert and runs one block
    of tokens per program, each block reading its expert's weights (``fused_moe_kernel`` and
    ``moe_align_block_size`` in vllm/model_executor/layers/fused_moe/: an expert with no token
    gets no block), so an expert costs one read whether 1 or 100 tokens visit it: each of the
    :func:`distinct_experts` is read once. Each GPU of a TP group holds 1/tp of every expert
    (FusedMoE's ``intermediate_size_per_partition = intermediate_size // tp_size``, layer.py),
    which the constants carry.

    FLOPs: ``moe_align_block_size`` pads each expert's tokens to a multiple of the kernel's
    ``BLOCK_SIZE_M`` (:func:`fused_moe_block_m`; moe_align_block_size.py, lines 55-100), and
    every program multiplies its whole block, the padding rows loaded as zeros
    (``fused_moe_kernel``, fused_moe.py lines 404-420 and 527-538: ``token_mask`` masks the
    loads, not the ``tl.dot``). With the T * k pairs spread evenly over the distinct experts,
    each gets T * k / distinct tokens, computed as ceil(that / BLOCK_SIZE_M) blocks of
    ``BLOCK_SIZE_M`` rows; a row costs ``EXPERT_FLOPS_PER_ROW`` at the kernel's own achieved
    FLOP/s (``EXPERT_FLOPS``).

    Expert parallel (``EXPERT_GROUPS`` > 1): each GPU holds its share of the experts whole (the
    constants carry one whole expert's read and row) and runs them over the tokens of every
    data-parallel rank (``DATA_PARALLEL``: vLLM's all-gather dispatch, ``AgRsAll2AllManager`` in
    vllm/distributed/device_communicators/all2all.py, gathers each rank's tokens before the
    experts run), taken as as many as this rank's each. The step is the busiest GPU's
    (:func:`busiest_group_experts`), its experts' tokens as many as any visited expert's."""
    experts = c[ROUTED_EXPERTS]
    tokens = num_tokens * c[DATA_PARALLEL]
    distinct = distinct_experts(c, tokens)
    block = fused_moe_block_m(tokens)
    pairs = tokens * c[EXPERTS_PER_TOKEN]
    if c[EXPERT_GROUPS] > 1.0:
        busiest = busiest_group_experts(experts, c[EXPERT_GROUPS], distinct / experts)
        rows = busiest * block * math.ceil(pairs / distinct / block)
        return bound_seconds(rows * c[EXPERT_FLOPS_PER_ROW] / c[EXPERT_FLOPS], busiest * c[EXPERT_WEIGHT_TIME_S],
                             c[GEMM_OVERLAP])
    rows = distinct * block * math.ceil(pairs / distinct / block)
    return bound_seconds(rows * c[EXPERT_FLOPS_PER_ROW] / c[EXPERT_FLOPS], distinct * c[EXPERT_WEIGHT_TIME_S],
                         c[GEMM_OVERLAP])


# the table model (sim.core.cost_table) prices prefill without attn_prefill rows, and transfers,
# with these two terms of the roofline's
@njit(inline=True)
def prefill_attention_seconds(c, prefill_flop_sum, prefill_cached_sum):
    """The causal QK^T and PV of the prefilling sequences, and one read of their cached K/V."""
    flops = c[ATTENTION_FLOPS_COEF] * prefill_flop_sum
    return flops / c[ATTENTION_FLOPS] + prefill_cached_sum * c[KV_BYTES_PER_TOKEN] / c[MEMORY_BANDWIDTH]


def swap_copy_seconds_per_token(num_attention_layers: int, block_tokens: int) -> float:
    """The copies' latency of swapping, spread over the tokens they move: ``2 * layers`` copies
    of ``PCIE_COPY_LATENCY_S`` per block of ``block_tokens`` tokens. 0 for ``block_tokens=0``: a
    contiguous extent moves in ``2 * layers`` copies per sequence, whose latency we neglect.
    Spread per token it is exact for whole blocks; a sequence's partly filled last block is
    under-counted (at most one block's copies per swapped sequence)."""
    if block_tokens <= 0:
        return 0.0
    return 2 * num_attention_layers * PCIE_COPY_LATENCY_S / block_tokens


@njit(inline=True)
def swap_seconds(swapped_tokens, kv_bytes_per_token, pcie_bandwidth, copy_s_per_token):
    """The one price of swapping ``swapped_tokens`` host <-> device: their bytes over PCIe, then
    the copies' latency (added separately, so a zero latency leaves the bytes' float as it was)."""
    t = swapped_tokens * kv_bytes_per_token / pcie_bandwidth
    return t + swapped_tokens * copy_s_per_token


@njit(inline=True)
def plus_transfers(c, t, swapped_tokens, copied_tokens):
    """``t`` plus the step's KV transfers: swaps host <-> device over PCIe, and copy-on-write
    device to device (a read and a write of each slot). Added in that order, so every model's
    float is the same whichever calls it."""
    if swapped_tokens:
        t += swap_seconds(swapped_tokens, c[KV_BYTES_PER_TOKEN], c[PCIE_BANDWIDTH], c[SWAP_COPY_S_PER_TOKEN])
    if copied_tokens:
        t += 2 * copied_tokens * c[KV_BYTES_PER_TOKEN] / c[MEMORY_BANDWIDTH]
    return t


@njit(inline=True)
def scaled_step_time(t, scale, overhead_s, per_seq_overhead_s, num_seqs):
    """``t`` with its GPU time (everything but the CPU overheads) times ``scale``: what
    :class:`sim.cost.models.ScaledCostModel` does to any model (the core reads the overheads at
    indices 0 and 1 of every model's constants). Scalars, or interpreted numpy arrays."""
    cpu = overhead_s + per_seq_overhead_s * num_seqs
    return cpu + scale * (t - cpu)
