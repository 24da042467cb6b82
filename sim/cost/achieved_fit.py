"""The ratios of ``sim/cost/achieved.py`` computed from measured per-operation timings (the rule
and its terms are stated in that module's docstring): ``benchmarks/gpu_achieved.py`` writes them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pagesim.sim.cost.calibration_fit import gemm_timings

#: a GEMM of this many tokens or fewer reads its weights in the time it takes: memory-bound
#: (16 tokens of 2-byte weights is 16 FLOPs a byte, under a tenth of any measured GPU's ridge)
MEMORY_BOUND_TOKENS = 16
#: ... and of this many or more is bound by its FLOPs (2,048 FLOPs a byte, over 6x every ridge)
COMPUTE_BOUND_TOKENS = 2048
#: smaller weights fit in L2 (40-50 MiB) or launch-bound: not a measure of either peak
MIN_WEIGHT_BYTES = 32 * 2**20
#: all-reduce sizes whose time is the collective's latency, and those whose time is its bytes
LATENCY_BYTES = 64 * 2**10
LINK_BYTES = 16 * 2**20


def _gemm_rows(measured, gpu) -> pd.DataFrame:
    """One row per measured GEMM (model, tp, num_tokens, op): its fractions of ``gpu``'s peaks."""
    t = gemm_timings(measured)
    weights = t["k"] * t["n"] * t["dtype_bytes"]
    return t.assign(weight_bytes=weights, bandwidth=weights / t["seconds"] / gpu.mem_bw,
                    flops=2.0 * t["num_tokens"] * t["k"] * t["n"] / t["seconds"] / gpu.peak_flops)


def _allreduce_rows(measured, gpu) -> pd.DataFrame:
    """The measured all-reduce: per (tp, size) its seconds and its achieved fraction of the link."""
    t = measured.allreduce.copy()
    t["seconds"] = t["ms"] * 1e-3
    t["link"] = 2.0 * (t["tp"] - 1) / t["tp"] * t["size"] / t["seconds"] / gpu.interconnect_bw
    return t


def achieved_ratios(measured, reference, gpu, reference_gpu) -> dict:
    """``measured``'s GPU against ``reference``'s (two :class:`sim.cost.measured.MeasuredGPU`;
    ``gpu`` and ``reference_gpu`` their :class:`GPUSpec`): each ratio of :data:`RATIOS` with the
    number of measured pairs behind it (``<ratio>_pairs``; 0 pairs: the ratio is 1)."""
    keys = ["model", "tp", "num_tokens", "op"]
    pairs = _gemm_rows(measured, gpu).merge(_gemm_rows(reference, reference_gpu), on=keys, suffixes=("", "_ref"))
    pairs = pairs[pairs["weight_bytes"] >= MIN_WEIGHT_BYTES]
    memory = pairs[pairs["num_tokens"] <= MEMORY_BOUND_TOKENS]
    compute = pairs[pairs["num_tokens"] >= COMPUTE_BOUND_TOKENS]
    ar = _allreduce_rows(measured, gpu).merge(_allreduce_rows(reference, reference_gpu), on=["tp", "size"],
                                              suffixes=("", "_ref"))
    small, large = ar[ar["size"] <= LATENCY_BYTES], ar[ar["size"] >= LINK_BYTES]
    out = {}
    for name, rows, ratio in (
            ("bandwidth", memory, lambda r: r["bandwidth"] / r["bandwidth_ref"]),
            ("flops", compute, lambda r: r["flops"] / r["flops_ref"]),
            ("allreduce_latency", small, lambda r: r["seconds"] / r["seconds_ref"]),
            ("link", large, lambda r: r["link"] / r["link_ref"])):
        out[name] = float(np.median(ratio(rows))) if len(rows) else 1.0
        out[f"{name}_pairs"] = int(len(rows))
    return out


def highest_compute_fraction(measured, gpu) -> tuple[float, int]:
    """The highest fraction of ``gpu``'s datasheet FLOP/s any of ``measured``'s compute-bound GEMMs
    reached (at least :data:`COMPUTE_BOUND_TOKENS` tokens, weights of at least
    :data:`MIN_WEIGHT_BYTES`), and how many there were: no GEMM of the serving model's may run
    faster than the fastest one measured (``benchmarks/fit_serving_time.py``'s ceiling)."""
    rows = _gemm_rows(measured, gpu)
    rows = rows[(rows["num_tokens"] >= COMPUTE_BOUND_TOKENS) & (rows["weight_bytes"] >= MIN_WEIGHT_BYTES)]
    return (float(rows["flops"].max()) if len(rows) else 1.0), int(len(rows))
