"""What a GPU achieves, measured per operation, as a ratio to the GPU the serving model was fitted on.

The serving model's constants (``sim/cost/serving.py``) are fractions of one GPU's datasheet peaks,
fitted end to end on real serving runs of that GPU. Another GPU reaches other fractions of its own
peaks: its memory system, its cuBLAS kernels and its interconnect are its own. Where
per-operation timings were measured on both GPUs (Vidur's profiling, ``../shared/measured``:
A100-80GB, H100, A40), the fitted fractions carry over scaled by what each GPU achieved on the
same operations, each a ratio of the two GPUs' fractions of their own datasheet peaks:

- ``bandwidth``: the memory-bound GEMMs (at most :data:`MEMORY_BOUND_TOKENS` tokens, weights of
  at least :data:`MIN_WEIGHT_BYTES`): weight bytes / time, over the datasheet bandwidth;
- ``flops``: the compute-bound GEMMs (at least :data:`COMPUTE_BOUND_TOKENS` tokens): 2 x tokens x
  weights / time, over the datasheet FLOP/s;
- ``allreduce_latency``: the all-reduce's time at the sizes where its latency dominates (at most
  :data:`LATENCY_BYTES`), a ratio of times at the same TP and size;
- ``link``: its achieved bytes/s at the sizes its bytes dominate (at least
  :data:`LINK_BYTES`; ring traffic 2 (tp - 1) / tp of the size), over the datasheet interconnect.

Each ratio is the median over the operations measured on both GPUs (the same model, TP degree,
token count and operation; the same TP and size for the all-reduce), so a model measured on one
GPU only does not tilt it. A ratio with no pair (the A40 has no all-reduce table) is 1 and said so.
``benchmarks/gpu_achieved.py`` writes them to ``sim/data/serving/achieved.toml``; the serving
model reads that file, so a machine without the measurements prices the same.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pagesim.sim.config import read_toml

ACHIEVED_PATH = Path(__file__).resolve().parent.parent / "data" / "serving" / "achieved.toml"
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
#: the ratios, in the file's order
RATIOS = ("bandwidth", "flops", "allreduce_latency", "link")


def _gemm_rows(measured, gpu) -> "pd.DataFrame":
    """One row per measured GEMM (model, tp, num_tokens, op): its fractions of ``gpu``'s peaks."""
    import pandas as pd

    from pagesim.sim.cost.calibrated import layer_gemm_shapes
    from pagesim.sim.cost.calibration_fit import GEMM_OPS

    frames = []
    for name, model in measured.models.items():
        for tp, rows in model.ops.groupby("tp"):
            shapes = layer_gemm_shapes(model.spec, int(tp))
            for op, (k, n) in zip(GEMM_OPS, shapes):
                weights = k * n * model.spec.dtype_bytes
                seconds = rows[op].to_numpy(float) * 1e-3
                tokens = rows["num_tokens"].to_numpy()
                frames.append(pd.DataFrame({
                    "model": name, "tp": int(tp), "num_tokens": tokens, "op": op, "weight_bytes": weights,
                    "bandwidth": weights / seconds / gpu.mem_bw,
                    "flops": 2.0 * tokens * k * n / seconds / gpu.peak_flops}))
    return pd.concat(frames, ignore_index=True)


def _allreduce_rows(measured, gpu) -> "pd.DataFrame":
    """The measured all-reduce: per (tp, size) its seconds and its achieved fraction of the link."""
    t = measured.allreduce.copy()
    t["seconds"] = t["ms"] * 1e-3
    t["link"] = 2.0 * (t["tp"] - 1) / t["tp"] * t["size"] / t["seconds"] / gpu.interconnect_bw
    return t


def achieved_ratios(measured, reference, gpu, reference_gpu) -> dict:
    """``measured``'s GPU against ``reference``'s (two :class:`sim.cost.measured.MeasuredGPU`;
    ``gpu`` and ``reference_gpu`` their :class:`GPUSpec`): each ratio of :data:`RATIOS` with the
    number of measured pairs behind it (``<ratio>_pairs``; 0 pairs: the ratio is 1)."""
    import numpy as np

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


@lru_cache(maxsize=None)
def load_achieved(path: Path = ACHIEVED_PATH) -> dict:
    """``path``'s ``[gpus.<name>]`` tables (name -> ratios) and its ``reference`` GPU; empty where
    the file is missing."""
    return read_toml(path, "achieved ratios") if path.exists() else {}


def achieved_for(gpu: str, reference: str, path: Path = ACHIEVED_PATH) -> dict | None:
    """``gpu``'s measured ratios to ``reference`` (:data:`RATIOS`), or None where none were measured."""
    data = load_achieved(path)
    if data.get("reference") != reference:
        return None
    return data.get("gpus", {}).get(gpu)

