"""A GPU's measured operations against the fitted GPU's (sim/cost/achieved.py, achieved_fit.py), and the serving
model's constants carried over by them (sim/cost/serving.py, on_gpu): worked by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from pagesim.sim.cost import serving
from pagesim.sim.cost.achieved import ACHIEVED_PATH, achieved_for
from pagesim.sim.cost.achieved_fit import achieved_ratios
from pagesim.sim.cost.calibration import describe_band, error_band
from pagesim.sim.cost.measured import MeasuredGPU, MeasuredModel
from pagesim.sim.cost.serving import ServingConstants, ServingCostModel, on_gpu
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model

MEASURED = Path(__file__).resolve().parents[3] / "shared" / "measured"
CONSTANTS = ServingConstants(bandwidth_eff=0.9, compute_eff=0.8, layer_s=20e-6, per_seq_s=10e-6,
                             allreduce_s=10e-6, frontend_s=0.007)
RATIOS = {"bandwidth": 0.5, "flops": 2.0, "allreduce_latency": 1.5, "link": 0.25}


def test_the_fitted_fractions_scaled_by_the_measured_ratios(monkeypatch):
    """Bandwidth 0.9 x 0.5 = 0.45; FLOP/s 0.8 x 2 = 1.6, at most the datasheet's: 1; the
    all-reduce's latency 10 us x 1.5 = 15 us and its link 1 x 0.25; the engine's own terms (per
    layer, per sequence, front end) stay. The fitted GPU and a GPU not measured keep them all."""
    monkeypatch.setattr(serving, "achieved_for", lambda gpu, ref: RATIOS if gpu == "other" else None)
    moved = on_gpu(CONSTANTS, "other", "fitted")
    assert (moved.bandwidth_eff, moved.compute_eff) == (pytest.approx(0.45), 1.0)
    assert (moved.allreduce_s, moved.link_eff) == (pytest.approx(15e-6), 0.25)
    assert (moved.layer_s, moved.per_seq_s, moved.frontend_s) == (20e-6, 10e-6, 0.007)
    assert on_gpu(CONSTANTS, "fitted", "fitted") == CONSTANTS
    assert on_gpu(CONSTANTS, "unmeasured", "fitted") == CONSTANTS
    monkeypatch.setattr(serving, "achieved_for", lambda gpu, ref: {**RATIOS, "link": 3.0})
    assert on_gpu(CONSTANTS, "other", "fitted").link_eff == 1.0  # at most the datasheet's link too


def test_the_link_share_prices_the_all_reduce_bytes():
    """Llama-2-70B at TP 4 on an H100 (450 GB/s a direction): 2 x 80 all-reduces a step, each
    moving 2 x 3/4 x 8,192 x 2 bytes a token over the link; at a quarter of the link, 4x the time."""
    model, gpu = get_model("llama-2-70b"), get_gpu("h100-80gb")
    full = ServingCostModel(model, gpu, 4, CONSTANTS)
    quarter = ServingCostModel(model, gpu, 4, replace(CONSTANTS, link_eff=0.25))
    per_token = 2 * 80 * 2 * 3 / 4 * 8192 * 2 / 450e9
    assert full._ar_time_per_token == pytest.approx(per_token)
    assert quarter._ar_time_per_token == pytest.approx(4 * per_token)
    assert quarter.gpu.interconnect_bw == 450e9 * 0.25 and gpu.interconnect_bw == 450e9


def _measured(gpu: str, times: dict, allreduce: list) -> MeasuredGPU:
    """One Llama-2-7B layer (K x N: qkv 4,096 x 12,288, o 4,096 x 4,096, up 4,096 x 22,016, down
    11,008 x 4,096; 96, 32, 172 and 86 MiB) measured at ``times[(tokens, tp)]`` ms for every GEMM."""
    spec = ModelSpec("layer", 1, 4096, 32, 32, 128, 11008, 0, 1 << 20, gated_mlp=True)
    ops = pd.DataFrame([{"num_tokens": t, "tp": tp, "attn_pre_proj": ms, "attn_post_proj": ms,
                         "mlp_up_proj": ms, "mlp_down_proj": ms} for (t, tp), ms in times.items()])
    ar = pd.DataFrame(allreduce, columns=["tp", "size", "ms"])
    return MeasuredGPU(gpu, gpu, {"llama-2-7b": MeasuredModel("llama-2-7b", Path("x"), spec, ops)}, ar)


def test_the_fastest_compute_bound_gemm_measured_is_the_ceiling():
    """One Llama-2-7B layer measured on a GPU of 1,000 TFLOP/s, each GEMM of a row taking the same
    time: 1 ms at 512 tokens, 2 ms at 2,048, 10 ms at 4,096. The up projection (4,096 x 22,016,
    the largest) at 2,048 tokens, 2 x 2,048 x 4,096 x 22,016 FLOPs in 2 ms, is 0.185 of the peak,
    the fastest; 512 tokens is not compute-bound and counts not: 8 GEMMs (4 at each count)."""

    from pagesim.sim.cost.achieved_fit import highest_compute_fraction

    gpu = GPUSpec("ref", 1, 1000e12, 1e12, 100e9, 1e9)
    measured = _measured("ref", {(512, 1): 1.0, (2048, 1): 2.0, (4096, 1): 10.0}, [])
    highest, rows = highest_compute_fraction(measured, gpu)
    assert rows == 8
    assert highest == pytest.approx(0.1847, abs=1e-4)


def test_ratios_of_what_each_gpu_achieved_on_the_same_operations():
    """Both GPUs have the same datasheet but for half the FLOP/s and half the link on the measured
    one. At 8 tokens it takes 2x the reference's time: half the bandwidth (0.5). At 4,096 tokens
    it takes the same time on half the peak: twice the fraction (2.0). The all-reduce: 3x the
    time at 2 KiB (latency 3.0), the same time at 32 MiB over half the link (2.0). 512 tokens
    (neither bound) count in neither ratio; at TP 2 the output projection's 16 MiB are left out
    (L2-sized): 3 of its 4 GEMMs pair."""
    reference_gpu = GPUSpec("ref", 1, 100e12, 1e12, 100e9, 1e9)
    gpu = replace(reference_gpu, name="other", peak_flops=50e12, interconnect_bw=50e9)
    reference = _measured("ref", {(8, 1): 1.0, (512, 1): 1.0, (4096, 1): 10.0, (8, 2): 1.0},
                          [(2, 2048, 0.01), (2, 32 << 20, 1.0)])
    other = _measured("other", {(8, 1): 2.0, (512, 1): 7.0, (4096, 1): 10.0, (8, 2): 2.0},
                      [(2, 2048, 0.03), (2, 32 << 20, 1.0)])
    ratios = achieved_ratios(other, reference, gpu, reference_gpu)
    assert ratios == pytest.approx({"bandwidth": 0.5, "bandwidth_pairs": 4 + 3, "flops": 2.0, "flops_pairs": 4,
                                    "allreduce_latency": 3.0, "allreduce_latency_pairs": 1,
                                    "link": 2.0, "link_pairs": 1})


def test_a_gpu_without_an_all_reduce_table_keeps_the_reference_link():
    reference = _measured("ref", {(8, 1): 1.0}, [(2, 2048, 0.01)])
    other = _measured("other", {(8, 1): 1.0}, [])
    ratios = achieved_ratios(other, reference, get_gpu("a40"), get_gpu("h100-80gb"))
    assert (ratios["allreduce_latency"], ratios["allreduce_latency_pairs"]) == (1.0, 0)
    assert (ratios["link"], ratios["link_pairs"]) == (1.0, 0)


def test_the_band_says_how_the_gpu_takes_the_constants():
    """The A100 and A40 were measured (the A40's all-reduce not: said so), an RTX 4090 was not;
    the H200 is the H100's chip. Constants handed in are priced as given, with no such note."""
    line = describe_band(error_band("serving", "a100-80gb", moe=False), "a100-80gb")
    assert "scaled by its operations measured against h100-80gb's" in line and "not measured" not in line
    line = describe_band(error_band("serving", "a40", moe=False), "a40")
    assert "its allreduce latency and link not measured: h100-80gb's" in line.replace("\n", " ")
    model = get_model("llama-3.1-8b")
    assert "measured" not in ServingCostModel(model, get_gpu("a100-80gb"), 1, CONSTANTS).cpu_overhead_source
    assert "scaled by" in ServingCostModel(model, get_gpu("a100-80gb"), 1).cpu_overhead_source
    line = describe_band(error_band("serving", "rtx-4090", moe=False), "rtx-4090")
    assert "rtx-4090: no measured operations; h100-80gb's fractions of its own datasheet" in line
    line = describe_band(error_band("serving", "h200-141gb", moe=False), "h200-141gb")
    assert "measured operations" not in line and "measured against" not in line


def test_the_shipped_ratios_are_the_measured_ones():
    """sim/data/serving/achieved.toml is what benchmarks/gpu_achieved.py computes from the
    measured timings (skipped without ../shared/measured)."""
    if not MEASURED.is_dir():
        pytest.skip("no ../shared/measured")
    from pagesim.sim.cost.measured import read_measured

    reference = read_measured(MEASURED, "h100-80gb")
    for gpu in ("a100-80gb", "a40"):
        shipped = achieved_for(gpu, "h100-80gb", ACHIEVED_PATH)
        ratios = achieved_ratios(read_measured(MEASURED, gpu), reference, get_gpu(gpu), get_gpu("h100-80gb"))
        assert shipped == pytest.approx(ratios, rel=1e-5)
