"""The serving cost model (sim/cost/serving.py): its constants in the roofline's formula, the
front end's latency in what a client sees, its error band, and the default per engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.batch import StepBatch
from pagesim.sim.config import SimConfig, default_cost_model
from pagesim.sim.core.price import cost as c
from pagesim.sim.cost.calibration import band_line, describe_band, error_band
from pagesim.sim.cost.serving import ServingConstants, ServingCostModel, load_serving, serving_band
from pagesim.sim.run import run_simulation
from pagesim.sim.specs import get_gpu, get_model

CONSTANTS = ServingConstants(bandwidth_eff=0.8, compute_eff=0.6, layer_s=20e-6, per_seq_s=10e-6,
                             allreduce_s=30e-6, frontend_s=0.007)


def test_constants_are_fractions_of_the_datasheet_in_the_roofline_formula():
    """Llama-2-70B at TP 4 on an H100 (3.35 TB/s, 989 TFLOP/s): weights and K/V read at 0.8 of
    the bandwidth, GEMMs at 0.6 of the FLOP/s; the step's fixed cost is 80 layers x 20 us; two
    all-reduces per layer of 30 us each."""
    model, gpu = get_model("llama-2-70b"), get_gpu("h100-80gb")
    k = ServingCostModel(model, gpu, 4, CONSTANTS).constants()
    assert k[c.OVERHEAD_S] == pytest.approx(80 * 20e-6)
    assert k[c.PER_SEQ_OVERHEAD_S] == 10e-6
    assert k[c.MEMORY_BANDWIDTH] == pytest.approx(3350e9 * 0.8)
    assert k[c.LINEAR_WEIGHT_TIME_S] == pytest.approx(model.unrouted_weight_bytes / 4 / (3350e9 * 0.8))
    assert k[c.FLOPS] == pytest.approx(989e12 * 0.6)
    assert k[c.ALLREDUCE_FIXED_S] == pytest.approx(2 * 80 * 30e-6)


def test_one_decode_step_by_hand():
    """Llama-2-7B, TP 1, one sequence decoding at 100 tokens of context: 32 x 20 us + 10 us +
    the weights at 0.8 x 3.35 TB/s (memory-bound: 2 x 6.7e9 FLOPs take 23 us at 0.6 x 989
    TFLOP/s) + 100 tokens x 512 KiB of K/V at 0.8 x 3.35 TB/s."""
    model, gpu = get_model("llama-2-7b"), get_gpu("h100-80gb")
    cm = ServingCostModel(model, gpu, 1, CONSTANTS)
    batch = StepBatch(decode_seq_ids=np.array([0]), decode_context=np.array([100]))
    weights = model.unrouted_weight_bytes / (3350e9 * 0.8)
    kv = 100 * 2 * 32 * 4096 * 2 / (3350e9 * 0.8)
    assert cm.step_time(batch) == pytest.approx(32 * 20e-6 + 10e-6 + weights + kv, rel=1e-12)


def test_a_gemm_near_the_ridge_pays_its_lesser_bound_in_part():
    """Llama-2-7B, TP 1, 512 tokens: the GEMMs' FLOPs (2 x 512 x 6.7e9 at 0.6 x 989 TFLOP/s,
    11.6 ms) bound them, beside the weights' read (13.5 GB at 0.8 x 3.35 TB/s, 5.0 ms); with the
    overlap 0.45 the linear part is 11.6 + 0.45 x 5.0 ms, with 0 (the roofline's) 11.6 ms."""
    model, gpu = get_model("llama-2-7b"), get_gpu("h100-80gb")
    plain = ServingCostModel(model, gpu, 1, CONSTANTS)
    ridge = ServingCostModel(model, gpu, 1, ServingConstants(**{**CONSTANTS.__dict__, "gemm_overlap": 0.45}))
    compute = 512 * 2 * model.unrouted_params / (989e12 * 0.6)
    weights = model.unrouted_weight_bytes / (3350e9 * 0.8)
    assert plain.linear_time(512) == pytest.approx(max(compute, weights), rel=1e-12)
    assert ridge.linear_time(512) == pytest.approx(max(compute, weights) + 0.45 * min(compute, weights), rel=1e-12)
    assert ridge.constants()[c.GEMM_OVERLAP] == 0.45


def test_a_mixture_of_experts_fused_gemm_pays_the_same_overlap():
    """Mixtral-8x7B, TP 2, one decode token: its two routed experts' reads (a 2-of-8 share of the
    experts' bytes over 0.8 x 3.35 TB/s) bound the fused-MoE kernel, plus 0.45 of its FLOPs: one
    block of 16 rows through each of the two experts."""
    model, gpu = get_model("mixtral-8x7b"), get_gpu("h100-80gb")
    constants = ServingConstants(**{**CONSTANTS.__dict__, "gemm_overlap": 0.45})
    k = ServingCostModel(model, gpu, 2, constants).constants()
    reads = 2 * model.routed_expert_weight_bytes / 2 / (3350e9 * 0.8)
    flops = 2 * 16 * 2 * model.routed_expert_params / 2 / (989e12 * 0.6)
    assert c.routed_expert_seconds(k, 1) == pytest.approx(max(reads, flops) + 0.45 * min(reads, flops), rel=1e-12)


def test_the_front_end_adds_to_ttft_and_e2e_not_to_tpot():
    """A request's time outside the engine (HTTP, tokenizing, streaming) is in the latencies its
    client sees, TTFT and E2E, and in no step: the same run with frontend_s = 0 has the same
    steps, and TTFT and E2E 7 ms shorter; TPOT (between its tokens) is the same."""
    trace = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 0.5], "prompt_tokens": [100, 50],
                          "output_tokens": [10, 5]})
    cfg = SimConfig.for_system("vllm-v1", model="llama-2-7b", gpu="h100-80gb")
    model, gpu = get_model("llama-2-7b"), get_gpu("h100-80gb")
    none = ServingConstants(**{**CONSTANTS.__dict__, "frontend_s": 0.0})
    with_front = run_simulation(cfg, trace, cost_model=ServingCostModel(model, gpu, 1, CONSTANTS))
    without = run_simulation(cfg, trace, cost_model=ServingCostModel(model, gpu, 1, none))
    pd.testing.assert_frame_equal(with_front.steps, without.steps)
    for col in ("ttft_s", "e2el_s"):
        assert (with_front.requests[col] - without.requests[col]).tolist() == pytest.approx([0.007, 0.007])
    assert with_front.requests["tpot_s"].tolist() == without.requests["tpot_s"].tolist()
    assert with_front.summary["mean_ttft_ms"] == pytest.approx(without.summary["mean_ttft_ms"] + 7.0)


def test_the_band_is_the_regimes_held_out_error():
    """simulate, plan and reproduce print the serving model's error against real runs from its
    regime's runs (sim/cost/regime.py; its rules: tests/sim/test_cost_regime.py), say where it
    was measured, and fall back on the constants file's one band without a regimes file."""
    _, fitted_on, err = load_serving("h100-80gb")
    assert fitted_on == "h100-80gb"
    dense = error_band("serving", "h100-80gb", moe=False, scheduler="vllm-v1", max_num_seqs=128)["cost_error"]
    assert dense["regime_sets"] == ["dense"] and dense["measured_on"] == "h100-80gb"
    line = describe_band(error_band("serving", "h100-80gb", moe=False), "h100-80gb")
    assert "real vLLM runs" in line and "leave-one-model-out" in line and "no fitted run" not in line
    other = describe_band(error_band("serving", "a100-80gb", moe=False), "a100-80gb")
    assert "a100-80gb: no fitted run" in other and "same chip" not in other
    assert "h200-141gb: no run of its own" in describe_band(error_band("serving", "h200-141gb"), "h200-141gb")


def test_without_regimes_the_files_one_band(monkeypatch, tmp_path):
    from pagesim.sim.cost import serving

    monkeypatch.setattr(serving, "regime_band", lambda *a, **k: None)
    _, _, err = load_serving("h100-80gb")
    band = serving_band("h100-80gb")
    assert (band["median"], band["p90"]) == (err["median_e2e_mean"], err["p90_e2e_mean"])
    assert "low" not in band


def test_default_cost_model_per_engine():
    """vLLM v1 and SGLang (today's engines: CUDA graphs, paged kernels reading each token once)
    run on the model fitted on real v1 runs; the paper's engines on the roofline; a profile means
    the table model; a named model is kept."""
    for scheduler in ("vllm-v1", "sglang"):
        assert default_cost_model(scheduler) == "serving"
        assert default_cost_model(scheduler, profile="p.csv") == "roofline"
    for scheduler in ("vllm", "orca", "static"):
        assert default_cost_model(scheduler) == "roofline"
    assert SimConfig.for_system("vllm-v1").cost_model == "serving"
    assert SimConfig.for_system("vllm").cost_model == "roofline"
    assert SimConfig.for_system("vllm-v1", cost_model="roofline").cost_model == "roofline"


def test_the_printed_band_line_wraps_to_100_columns():
    # plan, reproduce and validate print the band as "cost model: ..." wrapped under itself
    line = band_line(error_band("serving", "h200-141gb"), "h200-141gb")
    assert line.startswith("cost model: serving (") and "\n  " in line
    assert max(len(part) for part in line.splitlines()) <= 100
    assert " ".join(part.strip() for part in line.splitlines()) == \
        "cost model: " + describe_band(error_band("serving", "h200-141gb"), "h200-141gb")
