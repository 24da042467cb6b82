"""What a GPU achieves, measured per operation, as a ratio to the GPU the serving model was fitted on.

The serving model's constants (``sim/cost/serving.py``) are fractions of one GPU's datasheet peaks,
fitted end to end on real serving runs of that GPU. Another GPU reaches other fractions of its own
peaks: its memory system, its cuBLAS kernels and its interconnect are its own. Where
per-operation timings were measured on both GPUs (Vidur's profiling, ``../shared/measured``:
A100-80GB, H100, A40), the fitted fractions carry over scaled by what each GPU achieved on the
same operations, each a ratio of the two GPUs' fractions of their own datasheet peaks:

- ``bandwidth``: the memory-bound GEMMs (at most ``achieved_fit.MEMORY_BOUND_TOKENS`` tokens):
  weight bytes / time, over the datasheet bandwidth;
- ``flops``: the compute-bound GEMMs (at least ``achieved_fit.COMPUTE_BOUND_TOKENS`` tokens):
  2 x tokens x weights / time, over the datasheet FLOP/s; both of weights of at least
  ``achieved_fit.MIN_WEIGHT_BYTES``;
- ``allreduce_latency``: the all-reduce's time at the sizes where its latency dominates (at most
  ``achieved_fit.LATENCY_BYTES``), a ratio of times at the same TP and size;
- ``link``: its achieved bytes/s at the sizes its bytes dominate (at least
  ``achieved_fit.LINK_BYTES``; ring traffic 2 (tp - 1) / tp of the size), over the datasheet interconnect.

Each ratio is the median over the operations measured on both GPUs (the same model, TP degree,
token count and operation; the same TP and size for the all-reduce), so a model measured on one
GPU only does not tilt it. A ratio with no pair (the A40 has no all-reduce table) is 1 and said so.
``sim/cost/achieved_fit.py`` computes them and ``benchmarks/gpu_achieved.py`` writes them to
``sim/data/serving/achieved.toml``; the serving model reads that file (this module), so a machine
without the measurements prices the same.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pagesim.sim.config import read_toml

ACHIEVED_PATH = Path(__file__).resolve().parent.parent / "data" / "serving" / "achieved.toml"
#: the ratios, in the file's order
RATIOS = ("bandwidth", "flops", "allreduce_latency", "link")


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


def highest_compute_fraction(reference: str, path: Path = ACHIEVED_PATH) -> float | None:
    """The fastest compute-bound GEMM measured on ``reference`` (the fitted GPU), as a fraction of
    its datasheet FLOP/s (``achieved_fit.highest_compute_fraction``); None where not measured."""
    data = load_achieved(path)
    if data.get("reference") != reference:
        return None
    return data.get("fitted", {}).get("highest_compute_fraction")
