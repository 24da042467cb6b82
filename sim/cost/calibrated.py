"""Calibrated roofline: the roofline's physics plus the terms real GPU timings show it lacks.

The roofline (``sim/cost/roofline.py``) prices a step from FLOPs, bytes and two datasheet ceilings
with guessed efficiencies. Measured per-operation timings (``sim/cost/measured.py``) show what it
misses: every kernel has a fixed launch-and-tail cost (a per-layer fixed cost that dominates small
batches and tensor-parallel shards), GEMMs near the weight-bound/compute-bound ridge are slower
than either bound (both limits bite at once) and jump where the token count spills into one
more tile of rows, decode attention streams KV at close to peak bandwidth once enough sequences
run in parallel but far below it for a few, FlashAttention prefill runs at a small fraction of
tensor peak, and tensor-parallel all-reduces cost tens of microseconds each. Per layer, for
``T`` tokens on one GPU of a tensor-parallel group of ``tp``::

    gemm(T, K, N) = (gemm_fixed + max(C, M) + overlap * min(C, M)) * ratio(K, N, T)  (x4: qkv, o, up, down)
        C = 2 * ceil(T / tile) * tile * K * N / (peak_flops * compute_eff)          tensor cores work in tiles
        M = dtype * (K N + T (K + N)) / (mem_bw * memory_eff)                        weights, activations in and out
        ratio = measured / formula of the nearest measured shapes at T              cuBLAS's kernel per shape
    elementwise(T) = sum over norm (x2), rope, act, add of  fixed_k + T * bytes_per_token_k / (mem_bw * eff_k)
    allreduce(T) = 2 * table[tp](T * hidden * dtype)                                the measured collectives
                   2 * (table[tp](S) + (T * hidden * dtype - S) / bytes_per_s[tp])  beyond their largest size S
                   2 * (latency[tp] + T * hidden * dtype / bytes_per_s[tp])         no table: a fitted line
    decode attention = dec_fixed + dec_per_seq * B + KV_bytes / (mem_bw * min(1, bw_coef * (B * heads/tp) ** bw_exp))
    prefill attention = pre_fixed + 4 * heads/tp * head_dim * sum_i c_i (p_i + causal * c_i) / (peak_flops * pre_eff)

with the GEMM shapes sharded as vLLM shards them (qkv and up by output columns, o and down by
input rows: ``K x N`` = ``h x (q' + 2 kv')``, ``q' x h``, ``h x (2|1) I/tp``, ``I/tp x h``, where
``q' = heads/tp * head_dim`` and ``kv' = max(1, kv_heads // tp) * head_dim``: KV heads replicate
past the TP degree) and the elementwise bytes per token read plus written (norm ``2 h``, rope
``2 (q' + kv')``, act gated ``3 I/tp`` else ``2 I/tp``, residual add ``3 h``; times ``dtype``).
cuBLAS picks a GEMM kernel (its tiles, split-K) per shape, so a GEMM's time steps at token counts
that differ from shape to shape (at 65 tokens for some, at 129 or 193 for others) and no smooth
formula follows them; the fit keeps each measured shape's ratio of measured to formula time at
every measured token count, and a GEMM takes the median of its ``gemm_neighbours`` nearest
measured shapes' within ``gemm_radius`` (:func:`nearest_ratios`; itself where it was measured;
the formula alone where none is near), interpolated in the tokens and held at the grid's ends
beyond it. Sizes inside the measured collective table are priced from it (its running median,
``sim.cost.measured.read_allreduce``), larger ones from its last size at the fitted line's
bandwidth (continuous where the table ends). The table is priced as measured, not smoothed into
a non-decreasing curve: it drops where NCCL changes algorithm or protocol (on the H100 at TP 2,
37 us at 114 KiB and 11 us at 130 KiB), so a step can cost less with one more sequence, as the
measurement does.
Dense models only (no mixture of experts, latent attention, Mamba or quantized weights: the
measurements have none). A step adds the layers times
``L``, the LM head as one more GEMM over one row per sequence (vLLM computes logits only for each
sequence's last token), the CPU time per iteration (``overhead_s + per_seq_overhead_s`` x
sequences: vLLM's, measured by Vidur and fitted per TP degree where the calibration file has
it, ``sim/cost/cpu_overheads.py``; else the roofline's default), and swap (PCIe) and
copy-on-write (HBM, at the residual add's rate) traffic. A tensor-parallel degree without a
measured collective table takes the roofline's ring all-reduce.

The constants are fitted per GPU by ``pagesim cost fit`` (``sim/cost/calibration_fit.py``) and read
from ``sim/data/calibration/<gpu>.toml`` (``sim/cost/calibration.py``). Each formula is one function
of plain numbers, stated once in ``sim/core/price/cost_calibrated.py``: compiled by numba (the core's
loop, and this module's model for every batch) or interpreted (the fit calls them on numpy
arrays of measured rows); the step function reads only a float64 constants array and a tables
array (:meth:`CalibratedCostModel.constants`, :meth:`CalibratedCostModel.tables`).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.core.price import cost_calibrated as core
from pagesim.sim.core.price.cost import paged_kernel_overhead, swap_copy_seconds_per_token
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.cost.calibration import ELEMENTWISE, Calibration, load_calibration
from pagesim.sim.cost.roofline import CpuOverhead, RooflineCostModel, decode_read_sum
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import GPUSpec, ModelSpec

#: how many kernels of each elementwise kind (sim.cost.calibration.ELEMENTWISE) one layer runs
ELEMENTWISE_PER_LAYER = (2, 1, 1, 1)

# a batch priced outside a run (step_time: the GPU executor's plans, the cost-error tables):
# the interpreted functions (the same source, so the same float) over tuples of Python floats
# avoid numba's call overhead
_step_time = interpreted(core.calibrated_step_time)
_elementwise_seconds = interpreted(core.elementwise_seconds)
_allreduce_seconds = interpreted(core.allreduce_seconds)


def _heads_per_gpu(model: ModelSpec, tp: int) -> tuple[float, float]:
    """Query and KV width (heads x head_dim) on one GPU; KV heads replicate past the TP degree."""
    return model.num_heads * model.head_dim / tp, model.kv_heads_per_gpu(tp) * model.head_dim


def layer_gemm_shapes(model: ModelSpec, tp: int) -> tuple[tuple[float, float], ...]:
    """``(K, N)`` of the layer's four GEMMs on one GPU of the TP group: qkv, o, up(+gate), down."""
    h, (q, kv) = model.hidden_size, _heads_per_gpu(model, tp)
    up = (2 if model.gated_mlp else 1) * model.intermediate_size
    return ((h, q + 2 * kv), (q, h), (h, up / tp), (model.intermediate_size / tp, h))


def nearest_ratios(shapes, measured_shapes: np.ndarray, ratios: np.ndarray, neighbours: int,
                   radius: float) -> list[np.ndarray]:
    """For each ``(K, N)`` of ``shapes``, the median of the ratio rows (``ratios``: one per row of
    ``measured_shapes``, K and N) of the ``neighbours`` measured shapes nearest to it by
    ``|ln(K / K')| + |ln(N / N')|`` (the earlier one on a tie) among those within ``radius``; a row
    of ones (the formula alone) where none is. cuBLAS picks a kernel per shape, and so where its
    time steps as the tokens grow; the nearest measured shapes are the best measured guess of that
    choice (a measured shape is its own nearest), and a far one is no guess at all."""
    rows = []
    for k, n in shapes:
        distance = np.abs(np.log(measured_shapes[:, 0] / k)) + np.abs(np.log(measured_shapes[:, 1] / n))
        nearest = np.argsort(distance, kind="stable")[:neighbours]
        nearest = nearest[distance[nearest] <= radius]
        rows.append(np.median(ratios[nearest], axis=0) if len(nearest) else np.ones(ratios.shape[1]))
    return rows


def gemm_ratio_rows(calibration: Calibration, shapes) -> list[np.ndarray]:
    """:func:`nearest_ratios` of ``shapes`` among the calibration's measured GEMM shapes: each
    GEMM's measured / formula ratio at the grid's token counts."""
    measured_shapes, _grid, ratios = calibration.gemm_table()
    return nearest_ratios(shapes, measured_shapes, ratios, calibration.gemm_neighbours, calibration.gemm_radius)


def elementwise_bytes_per_token(model: ModelSpec, tp: int) -> tuple[float, ...]:
    """Bytes each elementwise kernel reads and writes per token, in :data:`ELEMENTWISE` order."""
    h, (q, kv) = model.hidden_size, _heads_per_gpu(model, tp)
    act = (3 if model.gated_mlp else 2) * model.intermediate_size / tp
    d = model.dtype_bytes
    return (2 * h * d, 2 * (q + kv) * d, act * d, 3 * h * d)


def check_dense(model: ModelSpec) -> None:
    """The calibrated model prices dense fp16/bf16 decoders with full (or sliding) attention and
    a 16-bit KV cache, the kind of model measured; ConfigError for the rest."""
    other = [what for what, present in (
        ("mixture of experts", model.moe), ("latent attention", model.latent_attention),
        ("Mamba layers", model.mamba or model.mamba2), ("quantized weights", model.quantization),
        ("linear-attention layers", model.delta_net or "linear_attention" in model.kinds),
        (f"an {model.kv_cache_dtype} KV cache", model.kv_cache_dtype != "auto")) if present]
    if other:
        raise ConfigError(f"the calibrated cost model was measured on dense fp16 models only; {model.name} has "
                          f"{', '.join(other)}: use --cost-model roofline")


class CalibratedCostModel(CpuOverhead):
    """Prices a step with a :class:`~sim.cost.calibration.Calibration` (the shipped one of ``gpu``
    unless given). ``step_time`` hands the interpreted step function the constants and the
    tables as tuples of Python floats (indexing those costs microseconds per step where numpy
    scalars cost a hundred); :meth:`constants` and :meth:`tables` are the same numbers as
    the float64 arrays a compiled loop takes."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tensor_parallel: int = 1,
                 calibration: Calibration | None = None, swap_block_tokens: int = 0, kernel_block_tokens: int = 0):
        check_dense(model)
        c = calibration if calibration is not None else load_calibration(gpu.name)
        self.model, self.gpu, self.tensor_parallel, self.calibration = model, gpu, tensor_parallel, c
        self.kernel_block_tokens = kernel_block_tokens
        tp = tensor_parallel
        measured_cpu = c.cpu_overhead(tp)
        if measured_cpu is None:  # no CPU time measured on this GPU: the roofline's default
            self.overhead_s, self.per_seq_overhead_s = RooflineCostModel.overhead_s, RooflineCostModel.per_seq_overhead_s
            self.cpu_overhead_source = f"the roofline's default: no CPU time measured on {c.gpu}"
        else:  # vLLM's, measured by Vidur (sim/cost/cpu_overheads.py)
            self.overhead_s, self.per_seq_overhead_s, measured_tp = measured_cpu
            self.cpu_overhead_source = (f"vLLM's, measured on {c.gpu} at TP {measured_tp} "
                                        "(Vidur; sim/cost/cpu_overheads.py)")
        shapes = layer_gemm_shapes(model, tp)
        ew = elementwise_bytes_per_token(model, tp)
        per_token = [n * _elementwise_seconds(1, b, gpu.mem_bw, 0.0, e)
                     for n, b, e in zip(ELEMENTWISE_PER_LAYER, ew, c.elementwise_memory_eff)]
        layers, hidden_bytes = model.num_layers, model.hidden_size * model.dtype_bytes
        if tp > 1 and tp in c.allreduce_tp:
            i = c.allreduce_tp.index(tp)
            ar_fixed = 2 * layers * _allreduce_seconds(0, 0.0, c.allreduce_latency_s[i], c.allreduce_bytes_per_s[i])
            ar_per_token = 2 * layers * _allreduce_seconds(1, hidden_bytes, 0.0, c.allreduce_bytes_per_s[i])
            sizes, seconds = c.allreduce_table(tp)  # priced from the table within it, by the line beyond
        else:  # tp 1, or a degree without measured collectives: the roofline's ring all-reduce
            roof = RooflineCostModel(model, gpu, tp)
            ar_fixed, ar_per_token = roof._ar_fixed, roof._ar_time_per_token
            sizes, seconds = (), ()
        rows = gemm_ratio_rows(c, shapes) if c.gemm_neighbours else []
        if all((row == 1.0).all() for row in rows):  # no measured shape near: the formula alone, no grid to read
            rows = []
        grid, ratios = (c.gemm_grid_tokens if rows else ()), [x for row in rows for x in row]
        self._tables = tuple(float(x) for x in (
            len(shapes), len(grid), len(sizes), *(x for shape in shapes for x in shape), *grid, *ratios,
            *(b / hidden_bytes for b in sizes), *(2 * layers * t for t in seconds)))
        kv = model.kv_bytes_per_token(tp)
        values = {
            core.LAYERS: layers, core.DTYPE_BYTES: model.dtype_bytes, core.PEAK_FLOPS: gpu.peak_flops,
            core.MEMORY_BANDWIDTH: gpu.mem_bw, core.GEMM_FIXED_S: c.gemm_fixed_s,
            core.GEMM_COMPUTE_EFF: c.gemm_compute_eff, core.GEMM_MEMORY_EFF: c.gemm_memory_eff,
            core.GEMM_OVERLAP: c.gemm_overlap, core.GEMM_TILE_TOKENS: c.gemm_tile_tokens,
            core.ELEMENTWISE_FIXED_S: sum(n * f for n, f in zip(ELEMENTWISE_PER_LAYER, c.elementwise_fixed_s)),
            core.ELEMENTWISE_S_PER_TOKEN: sum(per_token), core.ALLREDUCE_FIXED_S: ar_fixed,
            core.ALLREDUCE_S_PER_TOKEN: ar_per_token, core.LM_HEAD_K: model.hidden_size if model.vocab_size else 0,
            core.LM_HEAD_N: model.vocab_size / tp, core.KV_BYTES_PER_TOKEN: kv,
            core.KV_LAYER_BYTES_PER_TOKEN: model.kv_bytes_per_layer_token(tp), core.HEADS_PER_GPU: model.num_heads / tp,
            core.HEAD_DIM: model.head_dim, core.DECODE_FIXED_S: c.decode_fixed_s,
            core.DECODE_PER_SEQ_S: c.decode_per_seq_s, core.DECODE_BW_COEF: c.decode_bw_coef,
            core.DECODE_BW_EXPONENT: c.decode_bw_exponent, core.PREFILL_FIXED_S: c.prefill_fixed_s,
            core.PREFILL_COMPUTE_EFF: c.prefill_compute_eff, core.PREFILL_CAUSAL_FRACTION: c.prefill_causal_fraction,
            core.PCIE_BANDWIDTH: gpu.pcie_bw,
            core.SWAP_COPY_S_PER_TOKEN: swap_copy_seconds_per_token(model.num_attention_layers, swap_block_tokens),
            core.COPY_BANDWIDTH: gpu.mem_bw * c.elementwise_memory_eff[ELEMENTWISE.index("add")],
            core.PAGED_KERNEL_OVERHEAD: paged_kernel_overhead(kernel_block_tokens)}
        self._fixed = [0.0] * core.NUM_CONSTANTS
        for i, v in values.items():
            self._fixed[i] = float(v)
        self._c: tuple[float, ...] = ()

    def _py_constants(self) -> tuple[float, ...]:
        """:meth:`constants` as a tuple of Python floats, rebuilt when an overhead was reassigned
        (``make_cost_model`` sets them after construction)."""
        if self._c[:2] != (self.overhead_s, self.per_seq_overhead_s):
            self._fixed[core.OVERHEAD_S] = self.overhead_s
            self._fixed[core.PER_SEQ_OVERHEAD_S] = self.per_seq_overhead_s
            self._c = tuple(self._fixed)
        return self._c

    def constants(self) -> np.ndarray:
        """The float64 array the step function reads (indices above)."""
        return np.array(self._py_constants(), dtype=np.float64)

    def tables(self) -> np.ndarray:
        """The float64 tables array the step function reads (``sim.core.cost_calibrated``'s
        layout): the layer's GEMMs on one GPU of the TP group (K, N of qkv, o, up, down), their
        ratio rows (:func:`gemm_ratio_rows`) and the all-reduce table at this TP degree, in
        tokens and the iteration's seconds."""
        return np.array(self._tables, dtype=np.float64)

    def step_time(self, batch: StepBatch) -> float:
        num_prefill = len(batch.prefill_tokens)
        cross, square = 0, 0
        if num_prefill:
            new = batch.prefill_tokens
            cross, square = int(np.dot(new, batch.prefill_context - new)), int(np.dot(new, new))
        return _step_time(self._py_constants(), self._tables, batch.num_seqs,
                          batch.num_prefill_tokens + batch.num_decode_tokens, batch.num_decode_tokens,
                          decode_read_sum(batch, self.kernel_block_tokens), num_prefill, cross, square,
                          batch.swap_in_tokens + batch.swap_out_tokens, batch.copy_tokens)
