"""A GEMM near its ridge, where neither its FLOPs nor its reads bound it alone
(``sim.core.cost.ridge_seconds``), and the measured curve it reads (``sim.cost.achieved.ridge_excess``),
worked by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.core.price import cost as C
from pagesim.sim.cost import achieved
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.cost.serving import ServingConstants, ServingCostModel
from pagesim.sim.specs import GPUSpec, get_gpu, get_model

#: the excess at compute / memory = 1/16, 1/8, 1/4, 1/2, 1, 2, 4, 8, 16
CURVE = (1.0, 1.05, 1.1, 1.3, 1.5, 1.3, 1.2, 1.1, 1.0)


def constants(curve=CURVE) -> np.ndarray:
    c = np.zeros(C.NUM_CONSTANTS)
    c[C.RIDGE_EXCESS:C.RIDGE_EXCESS + C.RIDGE_KNOTS] = curve
    return c


@pytest.mark.parametrize("compute,memory,expected", [
    (2e-3, 2e-3, 1.5 * 2e-3),  # at the ridge: the knot at 1
    (1e-3, 2e-3, 1.3 * 2e-3),  # compute half the reads: the knot at 1/2
    (4e-3, 1e-3, 1.2 * 4e-3),  # compute 4x: the knot at 4
    (2 ** 0.5 * 1e-3, 1e-3, (1.5 + 1.3) / 2 * 2 ** 0.5 * 1e-3),  # halfway (in log2) between 1 and 2
    (1e-6, 1.0, 1.0),  # far below the first knot: held at it
    (64e-3, 1e-3, 64e-3),  # far past the last knot: held at it
])
def test_the_larger_bound_times_the_measured_excess(compute, memory, expected):
    assert C.ridge_seconds(constants(), compute, memory) == pytest.approx(expected, rel=1e-12)


def test_without_a_curve_the_larger_bound_alone():
    """The roofline's price: a first knot of 0 leaves max(compute, memory), the same float."""
    c = constants((0.0,) * C.RIDGE_KNOTS)
    assert C.ridge_seconds(c, 2e-3, 3e-3) == 3e-3 and C.ridge_seconds(c, 5e-3, 3e-3) == 5e-3
    roofline = RooflineCostModel(get_model("llama-2-7b"), get_gpu("h100-80gb"))
    assert roofline.constants()[C.RIDGE_EXCESS:] == (0.0,) * C.RIDGE_KNOTS


def test_the_dense_gemms_and_the_experts_are_priced_at_their_ridge():
    """Llama-2-7B's dense GEMMs at 100 tokens, compute / memory by hand, and a mixture of
    experts' fused GEMM: each the larger bound times the curve at its own ratio."""
    model, gpu = get_model("llama-2-7b"), get_gpu("h100-80gb")
    plain = RooflineCostModel(model, gpu)
    ridged = RooflineCostModel(model, gpu, ridge_excess=CURVE)
    k = np.array(ridged.constants())
    compute = 100 * k[C.LINEAR_FLOPS_PER_TOKEN] / k[C.FLOPS]
    memory = k[C.LINEAR_WEIGHT_TIME_S]
    assert ridged.linear_time(100) == pytest.approx(C.ridge_seconds(k, compute, memory), rel=1e-12)
    assert ridged.linear_time(100) > plain.linear_time(100) == pytest.approx(max(compute, memory), rel=1e-12)
    mixtral = RooflineCostModel(get_model("mixtral-8x7b"), gpu, 2, ridge_excess=CURVE)
    k = np.array(mixtral.constants())
    experts = C.routed_expert_seconds(k, 128)
    distinct = C.distinct_experts(k, 128)
    rows = distinct * 64 * np.ceil(128 * 2 / distinct / 64)  # BLOCK_SIZE_M 64 at 128 tokens
    reads, flops = distinct * k[C.EXPERT_WEIGHT_TIME_S], rows * k[C.EXPERT_FLOPS_PER_ROW] / k[C.EXPERT_FLOPS]
    assert experts == pytest.approx(C.ridge_seconds(k, flops, reads), rel=1e-12)
    assert experts > max(flops, reads)


def test_the_serving_model_reads_its_gpus_measured_curve():
    """The H100's own; the A100's own; a GPU not measured takes the H100's."""
    shipped = achieved.load_achieved()["gpus"]
    constants_ = ServingConstants(0.9, 0.8, 20e-6, 10e-6, 10e-6, 0.007)
    for gpu, curve_of in (("h100-80gb", "h100-80gb"), ("a100-80gb", "a100-80gb"), ("rtx-4090", "h100-80gb")):
        cm = ServingCostModel(get_model("llama-3.1-8b"), get_gpu(gpu), 1, constants_)
        assert cm.ridge_excess == pytest.approx(tuple(shipped[curve_of]["ridge_excess"]))


def test_the_curve_from_measured_gemms(monkeypatch):
    """A GPU of 1 TB/s and 100 TFLOP/s whose memory-bound GEMMs (8 tokens) read at half of it and
    compute-bound ones (4,096 tokens) compute at half of it: compute / memory = tokens / 100.
    At 100 tokens (ratio 1) a GEMM takes 1.5x its bound; at 200 (ratio 2) 1.2x; at 8 (ratio
    0.08, nearest the knot at 1/16) its bound; 4,096 (ratio 41) is past the last knot. Knots
    with no GEMM take 1."""
    gpu = GPUSpec("g", 1, 100e12, 1e12, 1e9, 1e9)
    weights = 64 * 2 ** 20
    memory = weights / 0.5e12

    def row(tokens, seconds):
        return {"model": "m", "tp": 1, "num_tokens": tokens, "op": "x", "weight_bytes": weights,
                "bandwidth": weights / seconds / gpu.mem_bw, "flops": tokens * weights / seconds / gpu.peak_flops}

    rows = pd.DataFrame([row(8, memory), row(4096, 4096 / 100 * memory), row(100, 1.5 * memory),
                         row(200, 1.2 * 2 * memory), row(100, 1.5 * memory)])
    rows.loc[rows["num_tokens"] == 4096, "flops"] = 0.5  # its own fraction, exactly
    monkeypatch.setattr(achieved, "_gemm_rows", lambda measured, g: rows)
    values, counts = achieved.ridge_excess(None, gpu)
    assert values == pytest.approx([1.0, 1, 1, 1, 1.5, 1.2, 1, 1, 1])
    assert counts == [1, 0, 0, 0, 2, 1, 0, 0, 0]
