"""The calibrated roofline's price of one iteration, each formula stated once.

The formulas, their terms and where the constants come from are in ``sim/cost/calibrated.py``'s
docstring; :class:`sim.cost.calibrated.CalibratedCostModel` derives the constants (one float64
array, the indices below) and the tables (a second float64 array, the layout below) and calls
:func:`calibrated_step_time`, which the core's loop calls too. The fit
(``sim/cost/calibration_fit.py``) evaluates the per-kernel functions over numpy arrays of
measured rows through their interpreted form (``sim.core.jit.interpreted``): ``max``/``min``
are written with ``abs`` and ``ceil`` with integer division, so one statement serves scalars
and arrays.

The tables array: its three sizes (:data:`NUM_GEMMS` G, :data:`GRID_POINTS` T,
:data:`ALLREDUCE_POINTS` A), then K, N of the layer's G GEMMs; the T token counts of the GEMMs'
correction grid and G rows of T ratios (measured / formula of the nearest measured shapes,
``sim.cost.calibrated.gemm_ratio_rows``; T = 0: none); the A token counts of the all-reduce
table and the iteration's all-reduce seconds at each (the GPU's measured collectives, read as
np.interp reads them; beyond the last size, the line's slope from the last point; A = 0: the
fitted line prices every size).
"""

from __future__ import annotations

from pagesim.sim.core.price.cost import paged_kernel_seconds, swap_seconds
from pagesim.sim.core.price.cost_table import interp_extrap, on_segment, segment
from pagesim.sim.core.compile.jit import njit

# indices into the constants array (CalibratedCostModel.constants()); the CPU overheads come
# first, at the roofline's indices (sim.core.cost.scaled_step_time reads them for every model)
OVERHEAD_S = 0  # fixed CPU cost per iteration (the roofline's)
PER_SEQ_OVERHEAD_S = 1
LAYERS = 2
DTYPE_BYTES = 3
PEAK_FLOPS = 4
MEMORY_BANDWIDTH = 5
GEMM_FIXED_S = 6
GEMM_COMPUTE_EFF = 7
GEMM_MEMORY_EFF = 8
GEMM_OVERLAP = 9
GEMM_TILE_TOKENS = 10
ELEMENTWISE_FIXED_S = 11  # one layer's elementwise kernels' fixed costs, summed
ELEMENTWISE_S_PER_TOKEN = 12  # and their streaming time per token, summed
ALLREDUCE_FIXED_S = 13  # all layers' all-reduces per iteration
ALLREDUCE_S_PER_TOKEN = 14
LM_HEAD_K = 15  # hidden size (0: no LM head)
LM_HEAD_N = 16  # vocabulary / TP
KV_BYTES_PER_TOKEN = 17  # all layers, one GPU
KV_LAYER_BYTES_PER_TOKEN = 18
HEADS_PER_GPU = 19
HEAD_DIM = 20
DECODE_FIXED_S = 21
DECODE_PER_SEQ_S = 22
DECODE_BW_COEF = 23
DECODE_BW_EXPONENT = 24
PREFILL_FIXED_S = 25
PREFILL_COMPUTE_EFF = 26
PREFILL_CAUSAL_FRACTION = 27
PCIE_BANDWIDTH = 28
COPY_BANDWIDTH = 29
SWAP_COPY_S_PER_TOKEN = 30  # sim.core.cost.swap_copy_seconds_per_token
PAGED_KERNEL_OVERHEAD = 31  # sim.core.cost.paged_kernel_overhead: vLLM v0's kernel's work per block
NUM_CONSTANTS = 32

# the tables array's sizes (CalibratedCostModel.tables()), then the tables from HEADER on
NUM_GEMMS = 0
GRID_POINTS = 1
ALLREDUCE_POINTS = 2
HEADER = 3


@njit
def max_plus_overlap_min(a, b, overlap):
    """``max(a, b) + overlap * min(a, b)``."""
    return (1.0 + overlap) * 0.5 * (a + b) + (1.0 - overlap) * 0.5 * abs(a - b)


@njit
def gemm_seconds(tokens, k, n, dtype_bytes, peak_flops, mem_bw, fixed_s, compute_eff, memory_eff, overlap,
                 tile_tokens):
    """One ``tokens x k`` by ``k x n`` GEMM."""
    padded = -(-tokens // tile_tokens) * tile_tokens
    compute = 2.0 * padded * k * n / (peak_flops * compute_eff)
    memory = dtype_bytes * (k * n + tokens * (k + n)) / (mem_bw * memory_eff)
    return fixed_s + max_plus_overlap_min(compute, memory, overlap)


@njit
def elementwise_seconds(tokens, bytes_per_token, mem_bw, fixed_s, memory_eff):
    """One elementwise kernel streaming ``bytes_per_token`` per token."""
    return fixed_s + tokens * bytes_per_token / (mem_bw * memory_eff)


@njit
def allreduce_seconds(tokens, bytes_per_token, latency_s, bytes_per_s):
    """One all-reduce of ``tokens`` activations of ``bytes_per_token`` each."""
    return latency_s + tokens * bytes_per_token / bytes_per_s


@njit
def decode_bandwidth(streams, mem_bw, bw_coef, bw_exponent):
    """HBM bandwidth the decode attention reaches with ``streams`` (sequence, head) pairs."""
    frac = bw_coef * streams ** bw_exponent
    return mem_bw * 0.5 * (1.0 + frac - abs(1.0 - frac))  # min(1, frac)


@njit
def decode_attention_seconds(seqs, kv_bytes, bandwidth, fixed_s, per_seq_s):
    """One layer's decode attention over ``kv_bytes`` of cached K and V for ``seqs`` sequences."""
    return fixed_s + per_seq_s * seqs + kv_bytes / bandwidth


@njit
def prefill_attention_flops(heads, head_dim, cross_sum, square_sum, causal_fraction):
    """QK^T and PV of prefill chunks: ``cross_sum`` = sum of new x cached tokens (queries against
    the keys before their chunk), ``square_sum`` = sum of new^2 (each chunk against itself, of
    which ``causal_fraction`` is computed: 0.5 for a kernel that skips masked tiles, 1 for one
    that does not)."""
    return 4.0 * heads * head_dim * (cross_sum + causal_fraction * square_sum)


@njit
def prefill_attention_seconds(flops, peak_flops, fixed_s, compute_eff):
    """One layer's prefill attention of ``flops``."""
    return fixed_s + flops / (peak_flops * compute_eff)


@njit
def grid_value(x, xs, j, ys):
    """np.interp's value of the table ``(xs, ys)`` at ``x`` from its segment ``j``
    (``sim.core.cost_table.segment``): the first or last value beyond its ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[len(xs) - 1]:
        return ys[len(ys) - 1]
    return on_segment(x, xs, j, ys[j], ys[j + 1])


@njit
def tokens_seconds(c, tables, num_tokens, num_seqs):
    """Every layer's GEMMs (each the formula times its measured correction at ``num_tokens``),
    elementwise kernels and all-reduces for ``num_tokens`` tokens, and the LM head over
    ``num_seqs`` rows (no shape of it measured: the formula alone)."""
    gemms, points, ar_points = int(tables[NUM_GEMMS]), int(tables[GRID_POINTS]), int(tables[ALLREDUCE_POINTS])
    grid = HEADER + 2 * gemms
    ratios = grid + points
    layer = c[ELEMENTWISE_FIXED_S] + num_tokens * c[ELEMENTWISE_S_PER_TOKEN]
    xs = tables[grid:grid + points]
    j = segment(num_tokens, xs) if points else 0  # one grid: one search for all the GEMMs
    for i in range(gemms):
        g = gemm_seconds(num_tokens, tables[HEADER + 2 * i], tables[HEADER + 2 * i + 1], c[DTYPE_BYTES],
                         c[PEAK_FLOPS], c[MEMORY_BANDWIDTH], c[GEMM_FIXED_S], c[GEMM_COMPUTE_EFF],
                         c[GEMM_MEMORY_EFF], c[GEMM_OVERLAP], c[GEMM_TILE_TOKENS])
        if points:
            g *= grid_value(num_tokens, xs, j, tables[ratios + i * points:ratios + (i + 1) * points])
        layer += g
    t = c[LAYERS] * layer
    ar = ratios + gemms * points
    last = ar + ar_points - 1  # the table's largest size, in tokens
    if ar_points and num_tokens > tables[last]:  # beyond it: its last point, then the line's slope
        t += tables[last + ar_points] + c[ALLREDUCE_S_PER_TOKEN] * (num_tokens - tables[last])
    elif ar_points:  # within the measured sizes (below them: the first)
        t += interp_extrap(num_tokens, tables[ar:ar + ar_points], tables[ar + ar_points:ar + 2 * ar_points])
    else:
        t += c[ALLREDUCE_FIXED_S] + c[ALLREDUCE_S_PER_TOKEN] * num_tokens
    if c[LM_HEAD_K] > 0.0:
        t += gemm_seconds(num_seqs, c[LM_HEAD_K], c[LM_HEAD_N], c[DTYPE_BYTES], c[PEAK_FLOPS],
                          c[MEMORY_BANDWIDTH], c[GEMM_FIXED_S], c[GEMM_COMPUTE_EFF], c[GEMM_MEMORY_EFF],
                          c[GEMM_OVERLAP], c[GEMM_TILE_TOKENS])
    return t


@njit
def decode_seconds(c, num_decode, decode_context_sum):
    """Every layer's decode attention for ``num_decode`` sequences whose kernel reads
    ``decode_context_sum`` tokens (``sim.core.cost.kernel_read_tokens``)."""
    bw = decode_bandwidth(num_decode * c[HEADS_PER_GPU], c[MEMORY_BANDWIDTH], c[DECODE_BW_COEF],
                          c[DECODE_BW_EXPONENT])
    base = decode_attention_seconds(num_decode, 0.0, bw, c[DECODE_FIXED_S], c[DECODE_PER_SEQ_S])
    reads = paged_kernel_seconds(decode_context_sum * c[KV_LAYER_BYTES_PER_TOKEN] / bw, c[PAGED_KERNEL_OVERHEAD])
    return c[LAYERS] * (base + reads)


@njit
def calibrated_step_time(c, tables, num_seqs, num_tokens, num_decode, decode_context_sum, num_prefill_seqs,
                         prefill_cross_sum, prefill_square_sum, swapped_tokens, copied_tokens):
    """Seconds for one iteration, the terms in this fixed order (the same float in every engine).
    ``prefill_cross_sum`` = sum(n * b), ``prefill_square_sum`` = sum(n * n) over the prefilling
    sequences (n new tokens after b cached ones), integers."""
    t = c[OVERHEAD_S] + c[PER_SEQ_OVERHEAD_S] * num_seqs
    if num_tokens:
        t += tokens_seconds(c, tables, num_tokens, num_seqs)
    if decode_context_sum:
        t += decode_seconds(c, num_decode, decode_context_sum)
    if num_prefill_seqs:
        flops = prefill_attention_flops(c[HEADS_PER_GPU], c[HEAD_DIM], prefill_cross_sum, prefill_square_sum,
                                        c[PREFILL_CAUSAL_FRACTION])
        t += c[LAYERS] * prefill_attention_seconds(flops, c[PEAK_FLOPS], c[PREFILL_FIXED_S], c[PREFILL_COMPUTE_EFF])
    if swapped_tokens:  # host <-> device over PCIe, as the roofline prices it
        t += swap_seconds(swapped_tokens, c[KV_BYTES_PER_TOKEN], c[PCIE_BANDWIDTH], c[SWAP_COPY_S_PER_TOKEN])
    if copied_tokens:  # copy-on-write: a read and a write of each slot
        t += 2 * copied_tokens * c[KV_BYTES_PER_TOKEN] / c[COPY_BANDWIDTH]
    return t
