"""The calibrated roofline, its fit, the measured tables and ``pagesim cost``.

Measured folders are written by the tests in Vidur's layout (``sim/cost/measured.py``) from known
constants through the cost model's own formulas, so the fit must find those constants again,
and the error of a cell is whatever factor the test put into it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.batch import StepBatch
from pagesim.sim.cli import main
from pagesim.sim.cost.calibrated import (CalibratedCostModel, elementwise_bytes_per_token,
                                         layer_gemm_shapes)
from pagesim.sim.cost.calibration import Calibration
# the formulas, over numpy arrays
from pagesim.sim.cost.calibration_fit import elementwise_seconds, gemm_seconds
from pagesim.sim.cost.measured import read_measured
from tests.sim.helpers import vidur_table
from pagesim.sim.specs import GPUS, GPUSpec, ModelSpec

A100 = GPUS["a100-80gb"]
# constants a fit must find again (A100-like magnitudes)
TRUE = Calibration(
    gpu="a100-80gb", gemm_fixed_s=6e-6, gemm_compute_eff=0.75, gemm_memory_eff=0.85, gemm_overlap=0.3,
    gemm_tile_tokens=64, elementwise_fixed_s=(3e-6, 2.5e-6, 2e-6, 1.5e-6),
    elementwise_memory_eff=(0.4, 0.5, 0.55, 0.9), decode_fixed_s=5e-6, decode_per_seq_s=1e-6,
    decode_bw_coef=0.4, decode_bw_exponent=0.12, prefill_fixed_s=2e-5, prefill_compute_eff=0.3,
    prefill_causal_fraction=0.9, allreduce_tp=(2,), allreduce_latency_s=(4e-5,), allreduce_bytes_per_s=(1.5e11,))
# (org, folder, heads, kv heads, hidden, intermediate, gated)
MODELS = [("meta-llama", "Llama-2-7b-hf", 32, 32, 4096, 11008, True),
          ("acme", "Tiny-2b", 16, 4, 2048, 5632, True),
          ("acme", "Plain-1b", 16, 16, 1536, 6144, False)]
TOKENS = [1, 2, 4, 8, 16, 24, 32, 64, 96, 128, 136, 192, 256, 384, 512, 1024, 2048, 4096]
OP_COLUMNS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
              "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def one_layer(heads, kv_heads, hidden, inter, gated) -> ModelSpec:
    return ModelSpec("m", 1, hidden, heads, kv_heads, hidden // heads, inter, 0, 1 << 20, gated_mlp=gated)


def op_ms(spec: ModelSpec, tp: int, tokens: np.ndarray, cal: Calibration, gpu: GPUSpec) -> dict[str, np.ndarray]:
    """Each operation's time (ms) by the cost model's formulas."""
    g = [gemm_seconds(tokens, k, n, 2, gpu.peak_flops, gpu.mem_bw, cal.gemm_fixed_s, cal.gemm_compute_eff,
                      cal.gemm_memory_eff, cal.gemm_overlap, cal.gemm_tile_tokens)
         for k, n in layer_gemm_shapes(spec, tp)]
    e = [elementwise_seconds(tokens, b, gpu.mem_bw, f, eff) for b, f, eff in
         zip(elementwise_bytes_per_token(spec, tp), cal.elementwise_fixed_s, cal.elementwise_memory_eff)]
    sec = {"attn_pre_proj": g[0], "attn_post_proj": g[1], "mlp_up_proj": g[2], "mlp_down_proj": g[3],
           "input_layernorm": e[0], "post_attention_layernorm": e[0], "attn_rope": e[1], "mlp_act": e[2], "add": e[3]}
    return {k: v * 1e3 for k, v in sec.items()}


def write_measured(root: Path, cal: Calibration = TRUE, gpu: GPUSpec = A100, tps=(1, 2), tokens=TOKENS,
                   factors: dict | None = None, attention: bool = True) -> Path:
    """A measured folder generated from ``cal``; ``factors[folder]`` divides each token count's
    operations (so that cell's error is exactly that factor - 1)."""
    for org, folder, heads, kvh, hidden, inter, gated in MODELS:
        spec = one_layer(heads, kvh, hidden, inter, gated)
        rows = []
        for tp in tps:
            t = np.array(tokens)
            ops = op_ms(spec, tp, t, cal, gpu)
            f = np.asarray((factors or {}).get(folder, np.ones(len(t))), float)
            rows.append(pd.DataFrame({**{f"time_stats.{k}.median": ops[k] / f for k in OP_COLUMNS},
                                      "n_head": heads, "n_kv_head": kvh, "n_embd": hidden, "n_expanded_embd": inter,
                                      "vocab_size": 32000, "use_gated_mlp": gated, "num_tokens": t,
                                      "num_tensor_parallel_workers": tp}))
        d = root / "vidur-profiling" / "compute" / "a100" / org / folder
        d.mkdir(parents=True)
        pd.concat(rows).to_csv(d / "mlp.csv", index=False)
    size = np.arange(2048, 64 << 20, 1 << 20)
    ar_ms = (cal.allreduce_latency_s[0] + size / cal.allreduce_bytes_per_s[0]) * 1e3
    ar = pd.DataFrame({"time_stats.all_reduce.median": ar_ms, "rank": 0, "num_workers": 2, "size": size,
                       "collective": "all_reduce", "devices_per_node": 2, "max_devices_per_node": 8})
    (root / "vidur-profiling" / "network" / "a100_dgx").mkdir(parents=True)
    ar.to_csv(root / "vidur-profiling" / "network" / "a100_dgx" / "all_reduce.csv")
    if attention:
        spec = one_layer(32, 32, 4096, 11008, True)
        kv_layer = spec.kv_bytes_per_token(1)
        rows = []
        for kv in (32, 512, 1024, 4032):
            for n in (1, 2, 4, 8, 16, 32, 64, 128):
                bw = gpu.mem_bw * min(1.0, cal.decode_bw_coef * (n * 32) ** cal.decode_bw_exponent)
                ms = (cal.decode_fixed_s + cal.decode_per_seq_s * n + n * (kv + 1) * kv_layer / bw) * 1e3
                rows.append(("decode", kv, n, ms))
        for n in (64, 128, 512, 2048):
            for kv in (0, 256, 1024):
                flops = 4 * 32 * 128 * (n * kv + cal.prefill_causal_fraction * n * n)
                seconds = cal.prefill_fixed_s + flops / (gpu.peak_flops * cal.prefill_compute_eff)
                rows.append(("prefill", kv, n, seconds * 1e3))
        (root / "vidur-attention-subset").mkdir()
        pd.DataFrame(rows, columns=["kind", "kv", "n", "median_ms"]).to_csv(
            root / "vidur-attention-subset" / "a100_llama-2-7b_attention_rows.csv", index=False)
    return root


# -- the cost model, worked by hand -----------------------------------------------------------------

TOY_GPU = GPUSpec("toy", 1 << 40, peak_flops=1000.0, mem_bw=100.0, interconnect_bw=10.0, pcie_bw=10.0)
TOY = ModelSpec("toy", 2, 4, 2, 1, 2, 8, 0, 64, gated_mlp=True)  # 2 layers, h=4, q=4, kv=2, I=8
TOY_CAL = Calibration(
    gpu="toy", gemm_fixed_s=1.0, gemm_compute_eff=0.5, gemm_memory_eff=0.5, gemm_overlap=0.5, gemm_tile_tokens=4,
    elementwise_fixed_s=(0.1, 0.2, 0.3, 0.4), elementwise_memory_eff=(0.5, 0.5, 0.5, 0.5), decode_fixed_s=0.5,
    decode_per_seq_s=0.25, decode_bw_coef=0.01, decode_bw_exponent=2.0, prefill_fixed_s=2.0, prefill_compute_eff=0.5,
    prefill_causal_fraction=0.75, allreduce_tp=(2,), allreduce_latency_s=(0.5,), allreduce_bytes_per_s=(8.0,))


def toy_model(tp: int = 1) -> CalibratedCostModel:
    cm = CalibratedCostModel(TOY, TOY_GPU, tp, TOY_CAL)
    cm.overhead_s, cm.per_seq_overhead_s = 0.1, 0.01
    return cm


def decode_batch(n: int, context_sum: int) -> StepBatch:
    return StepBatch(decode_seq_ids=np.arange(n), decode_context_sum=context_sum)


# GEMMs at T=3 tokens (tile 4: compute as for 4 rows): C = 2*4*K*N/(1000*0.5) = 0.016 KN,
# M = 2*(KN + 3(K+N))/(100*0.5); each costs 1 + max(C, M) + 0.5 min(C, M). TP 1 shapes (K, N):
#   qkv (4, 8): C 0.512, M 2.72 -> 3.976;  o (4, 4): C 0.256, M 1.6 -> 2.728
#   up (4, 16): C 1.024, M 4.96 -> 6.472;  down (8, 4): as qkv -> 3.976;  sum 17.152
# elementwise bytes/token (fp16): norm 2h*2 = 16, rope 2(q+kv)*2 = 24, act 3I*2 = 48, add 3h*2 = 24;
#   each bytes/(100*0.5) per token: 0.32 (x2 norms), 0.48, 0.96, 0.48 = 2.56/token -> 7.68, + fixed
#   2*0.1 + 0.2 + 0.3 + 0.4 = 1.1 -> 8.78; layer 25.932, two layers 51.864 (TP 1: no all-reduce)
# decode of 3 sequences, 30 cached tokens: streams 3*2 heads = 6, bandwidth 100*min(1, 0.01*6^2) = 36,
#   K/V bytes per token per layer 2*1*2*2 = 8 -> 240/36 = 6.6667; + 0.5 + 0.25*3 -> 7.91667 x2 = 15.8333
# CPU: 0.1 + 0.01 per sequence
def test_decode_step_by_hand():
    assert toy_model().step_time(decode_batch(3, 30)) == pytest.approx(0.13 + 51.864 + 2 * (1.25 + 240 / 36), rel=1e-12)


# prefill of 3 new tokens after 5 cached: the same 51.864 of layers; attention flops
# 4 * 2 heads * 2 head_dim * (3*5 + 0.75 * 3^2) = 348 -> 2 + 348/(1000*0.5) = 2.696 per layer x2
def prefill_batch() -> StepBatch:
    return StepBatch(prefill_seq_ids=np.zeros(1, np.int64), prefill_tokens=np.array([3]), prefill_context=np.array([8]))


def test_prefill_step_by_hand():
    assert toy_model().step_time(prefill_batch()) == pytest.approx(0.11 + 51.864 + 2 * 2.696, rel=1e-12)


# 20 sequences: 40 streams, 0.01 * 40^2 = 16 > 1: the attention streams at the full 100 B/s;
# GEMMs at T=20 (5 tiles of 4: no padding): C = 2*20*KN/500, M = 2(KN + 20(K+N))/50, 1 + max + min/2:
#   qkv C 2.56, M 10.88 -> 13.16; o C 1.28, M 7.04 -> 8.68; up C 5.12, M 18.56 -> 22.12; down as qkv
#   sum 57.12; elementwise 1.1 + 20 * 2.56 = 52.3; x2 layers = 218.84
#   attention: 400 tokens * 8 B / 100 + 0.5 + 0.25 * 20 = 37.5 per layer x2 = 75
def test_decode_attention_reaches_peak_bandwidth_by_hand():
    assert toy_model().step_time(decode_batch(20, 400)) == pytest.approx(0.1 + 0.2 + 218.84 + 75, rel=1e-12)


# TP 2 (fitted all-reduce: latency 0.5, 8 B/s): 1 query head and the one KV head (replicated) per
#   GPU: qkv (4, 2 + 2*2 = 6): C 0.384, M (24 + 30)/25 = 2.16 -> 3.352; o (2, 4): C 0.128,
#   M (8 + 18)/25 = 1.04 -> 2.104; up (4, 8) -> 3.976; down (4, 4) -> 2.728: 12.16
# elementwise/token: norms 2*0.32, rope 2*(2+2)*2/50 = 0.32, act 3*4*2/50 = 0.48, add 0.48 = 1.92 -> 5.76 + 1.1
#   layer 19.02 x2 = 38.04; all-reduces 2 per layer: 2*2*(0.5 + 3 tokens * 4*2 B / 8) = 14
# decode: streams 3*2/2 = 3, bandwidth 100*0.09 = 9; the replicated KV head keeps 8 B/token/layer
#   -> 240/9; + 1.25, x2
def test_tensor_parallel_step_by_hand():
    want = 0.13 + 38.04 + 14 + 2 * (1.25 + 240 / 9)
    assert toy_model(2).step_time(decode_batch(3, 30)) == pytest.approx(want, rel=1e-12)


# swap: 10 tokens * 16 B (all layers' K/V) / 10 B/s PCIe = 16; copy-on-write: 2 * 5 * 16 / (100*0.5)
def test_swap_and_copy_by_hand():
    b = StepBatch(swap_in_tokens=10, copy_tokens=5)
    assert toy_model().step_time(b) == pytest.approx(0.1 + 16 + 3.2, rel=1e-12)


def test_lm_head_is_one_gemm_row_per_sequence():
    # vocab 8 (K, N = 4, 8 at TP 1): the prefill of one 3-token prompt adds gemm(1 row, 4, 8):
    # C = 2*4*32/500 = 0.512 (one tile of 4 rows), M = 2*(32 + 1*12)/50 = 1.76 -> 1 + 1.76 + 0.256
    cm = CalibratedCostModel(replace(TOY, vocab_size=8), TOY_GPU, 1, TOY_CAL)
    cm.overhead_s, cm.per_seq_overhead_s = 0.1, 0.01
    assert cm.step_time(prefill_batch()) - toy_model().step_time(prefill_batch()) == pytest.approx(3.016)


# -- the fit ---------------------------------------------------------------------------------------

def test_robust_fit_is_not_dragged_by_an_outlier():
    from pagesim.sim.cost.calibration_fit import robust_fit

    # y = 2 + 3x measured at 20 points, one of them 4x too slow (a slow kernel choice)
    x = np.arange(1.0, 21.0)
    y = 2 + 3 * x
    y[7] *= 4
    p, _ = robust_fit(lambda p: p[0] + p[1] * x, y, [1.0, 1.0])
    assert p == pytest.approx([2, 3], rel=0.02)


def test_fit_recovers_known_constants(tmp_path):
    from pagesim.sim.cost.calibration_fit import fit_calibration

    m = read_measured(write_measured(tmp_path), "a100-80gb")
    got = fit_calibration(m, A100)
    assert got.gemm_tile_tokens == TRUE.gemm_tile_tokens
    for name in ("gemm_fixed_s", "gemm_compute_eff", "gemm_memory_eff", "gemm_overlap", "elementwise_fixed_s",
                 "elementwise_memory_eff", "decode_fixed_s", "decode_per_seq_s", "decode_bw_coef",
                 "decode_bw_exponent", "prefill_fixed_s", "prefill_compute_eff", "prefill_causal_fraction",
                 "allreduce_latency_s", "allreduce_bytes_per_s"):
        assert np.asarray(getattr(got, name)) == pytest.approx(np.asarray(getattr(TRUE, name)), rel=1e-5), name
    assert got.allreduce_tp == (2,)


def test_fit_command_writes_provenance_and_leave_one_model_out_error(tmp_path, capsys):
    root = write_measured(tmp_path / "measured")
    (root / "README.md").write_text("files of commit `" + "ab" * 20 + "` (test)\n")
    out = tmp_path / "a100.toml"
    assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(out)]) == 0
    cal = Calibration.from_toml(out)
    assert cal.gemm_overlap == pytest.approx(TRUE.gemm_overlap, rel=1e-5)
    p = cal.provenance
    assert p["source_commit"] == "ab" * 20
    assert p["models"] == ["llama-2-7b", "plain-1b", "tiny-2b"]
    assert p["attention"] == "fitted on a100 llama-2-7b"
    assert any(f.startswith("vidur-profiling/compute/a100/acme/Tiny-2b/mlp.csv sha256:") for f in p["files"])
    assert p["command"].startswith("pagesim cost fit --measured")
    # held out, each model is priced by constants fitted on the other two: the same constants
    assert cal.error["calibrated"]["method"] == "leave-one-model-out"
    assert cal.error["calibrated"]["all"]["max"] < 1e-6
    assert set(cal.error["calibrated"]["models"]) == {"llama-2-7b", "plain-1b", "tiny-2b"}


def test_fit_records_paths_beside_the_repository_relative_to_it(tmp_path, monkeypatch, capsys):
    """No machine's folders in a calibration file: a measured folder beside the repository is
    ../shared/measured from its root, in ``source`` and in the command; --out inside it is
    relative too; a path elsewhere (the CPU table here) is kept as given."""
    import pagesim.sim.cost.cli as cost_cli
    monkeypatch.setattr(cost_cli, "REPOSITORY", tmp_path / "repo")
    root = write_measured(tmp_path / "shared" / "measured")
    out = tmp_path / "repo" / "sim" / "a100.toml"
    assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(out)]) == 0
    p = Calibration.from_toml(out).provenance
    assert p["source"] == "../shared/measured"
    assert p["command"] == "pagesim cost fit --measured ../shared/measured --gpu a100-80gb --out sim/a100.toml"
    assert str(tmp_path) not in out.read_text()


def test_fit_says_each_phase_and_checks_the_cpu_table_before_fitting(tmp_path, caplog, monkeypatch):
    root = write_measured(tmp_path / "measured")
    with caplog.at_level("INFO", logger="pagesim"):
        assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(tmp_path / "a.toml")]) == 0
    assert [r.getMessage() for r in caplog.records] == [
        "fitting a100-80gb's constants on llama-2-7b, plain-1b, tiny-2b",
        *(f"leave-one-model-out: fitting without {m} ({i} of 3)" for i, m in
          enumerate(["llama-2-7b", "plain-1b", "tiny-2b"], 1))]
    import pagesim.sim.cost.cli as cost_cli  # a missing CPU table: one line before any fit starts
    monkeypatch.setattr(cost_cli, "fit_calibration", lambda *a, **k: pytest.fail("fitted before reading the table"))
    assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(tmp_path / "b.toml"),
                 "--cpu-overheads", str(tmp_path / "missing.csv")]) == 2


def test_fit_excluding_a_model(tmp_path, capsys):
    root = write_measured(tmp_path / "measured")
    out = tmp_path / "a100.toml"
    assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(out),
                 "--exclude-model", "plain-1b"]) == 0
    p = Calibration.from_toml(out).provenance
    assert p["models"] == ["llama-2-7b", "tiny-2b"] and p["excluded_models"] == ["plain-1b"]


# -- the error command -------------------------------------------------------------------------------

def test_stats_by_hand():
    from pagesim.sim.cost.error import bucket_labels, stats

    # |e| sorted: 0 .01 .02 .04 .05 .08 .10 .15 .20 .30 .50 (11 values): the median is the 6th,
    # the 90th percentile sits at rank 0.9 * 10 = 9 (0-based), exactly 0.30; max 0.50
    e = [0.10, -0.20, 0.05, 0.0, 0.30, -0.01, 0.02, 0.15, -0.08, 0.04, -0.50]
    assert stats(e) == dict(median=0.08, p90=pytest.approx(0.30), max=0.50, cells=11)
    # edges (1, 8, 32): 1 | 2-8 | 9-32 | 33+
    assert bucket_labels([1, 2, 8, 9, 32, 33], (1, 8, 32)) == ["1", "2-8", "2-8", "9-32", "9-32", "33+"]


ERRORS = [0.10, -0.20, 0.05, 0.0, 0.30, -0.01, 0.02, 0.15, -0.08, 0.04, -0.50]


def test_error_command_on_a_hand_made_table(tmp_path, capsys):
    # the Plain-1b table is the calibration's own prediction divided by (1 + e) at 11 token
    # counts: the command must report exactly the statistics of ERRORS, worst cell first
    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    root = write_measured(tmp_path / "m", tps=(1,), tokens=tokens, attention=False,
                          factors={"Plain-1b": 1 + np.array(ERRORS)})
    cal = tmp_path / "cal.toml"
    cal.write_text(TRUE.to_toml())
    argv = ["cost", "error", "--measured", str(root), "--model", "plain-1b", "--gpu", "a100-80gb",
            "--cost-model", "calibrated", "--calibration", str(cal), "--json", "--worst", "2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["all"]["median"] == pytest.approx(0.08, rel=1e-9)
    assert out["all"]["p90"] == pytest.approx(0.30, rel=1e-9)
    assert out["all"]["max"] == pytest.approx(0.50, rel=1e-9) and out["all"]["cells"] == 11
    assert [(w["tokens"], round(w["error"], 9)) for w in out["worst"]] == [(1024, -0.5), (16, 0.3)]
    assert main(argv[:-3]) == 0  # the tables
    text = capsys.readouterr().out
    assert "layers   8.0 %  30.0 %  50.0 %     11" in text


def test_error_command_roofline_says_where_it_misses(tmp_path, capsys):
    root = write_measured(tmp_path / "m", tps=(1,), attention=True)
    assert main(["cost", "error", "--measured", str(root), "--model", "llama-2-7b", "--gpu", "a100-80gb"]) == 0
    text = capsys.readouterr().out
    for part in ("roofline cost model vs measured llama-2-7b", "decode", "prefill", "by context", "worst 10 cells"):
        assert part in text


# -- measured tables and the importer ------------------------------------------------------------------

def test_importer_round_trip(tmp_path, capsys):
    from pagesim.sim.cost.roofline import TableCostModel
    from pagesim.sim.cost.profile_format import read_profile

    root = write_measured(tmp_path / "m")
    out = tmp_path / "p.csv"
    assert main(["cost", "import", "--measured", str(root), "--model", "llama-2-7b", "--gpu", "a100-80gb",
                 "--out", str(out)]) == 0
    prof = read_profile(out)
    ops = pd.read_csv(root / "vidur-profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
    ops = ops[ops["num_tensor_parallel_workers"] == 1]
    lin = prof[prof["component"] == "linear"]
    # linear = 32 layers x the layer's measured operations, in microseconds
    want = 32 * ops[[f"time_stats.{c}.median" for c in OP_COLUMNS]].sum(axis=1).to_numpy() * 1e3
    assert lin["time_us"].to_numpy() == pytest.approx(want, abs=1e-3)  # the CSV keeps 3 decimals
    att = pd.read_csv(root / "vidur-attention-subset/a100_llama-2-7b_attention_rows.csv")
    d = att[(att["kind"] == "decode") & (att["kv"] == 1024) & (att["n"] == 16)]["median_ms"].iloc[0]
    row = prof[(prof["component"] == "attn_decode") & (prof["batch"] == 16) & (prof["context"] == 1025)]
    assert row["time_us"].iloc[0] == pytest.approx(32 * d * 1e3, abs=1e-3)
    pre = att[(att["kind"] == "prefill") & (att["kv"] == 0)].sort_values("n")
    got = prof[prof["component"] == "attn_prefill"].sort_values("num_tokens")
    assert got["num_tokens"].tolist() == pre["n"].tolist()
    # the table model reads it back: a decode step of 16 at 1025 tokens each = linear(16) + that row
    tm = TableCostModel(out, ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096), A100)
    b = decode_batch(16, 16 * 1025)
    expect = lin[lin["num_tokens"] == 16]["time_us"].iloc[0] + row["time_us"].iloc[0]
    assert tm.step_time(b) == pytest.approx(expect * 1e-6, rel=1e-12)


def test_import_without_attention_is_one_line(tmp_path, capsys):
    root = write_measured(tmp_path / "m", attention=False)
    rc = main(["cost", "import", "--measured", str(root), "--model", "llama-2-7b", "--gpu", "a100-80gb",
               "--out", str(tmp_path / "p.csv")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no attention timings for llama-2-7b" in err


def test_measured_cells(tmp_path):
    from pagesim.sim.cost.measured import cells

    m = read_measured(write_measured(tmp_path), "a100-80gb")
    c = cells(m, "llama-2-7b")
    # layers at every token count and both TP degrees (all-reduce sizes within the measured table)
    assert set(c[c["phase"] == "layers"]["tp"]) == {1, 2}
    # decode cells only where the operation table has the batch: 8 batches x 4 contexts
    assert len(c[c["phase"] == "decode"]) == 32
    one = c[(c["phase"] == "layers") & (c["tp"] == 2) & (c["tokens"] == 64)]["measured_s"].iloc[0]
    ops = op_ms(one_layer(32, 32, 4096, 11008, True), 2, np.array([64]), TRUE, A100)
    ar = TRUE.allreduce_latency_s[0] + 64 * 4096 * 2 / TRUE.allreduce_bytes_per_s[0]
    assert one == pytest.approx(sum(v[0] for v in ops.values()) * 1e-3 + 2 * ar, rel=1e-9)


def test_attention_rows_keep_the_first_measurement(tmp_path):
    from pagesim.sim.cost.measured import read_attention

    path = tmp_path / "a100_x_attention_rows.csv"
    path.write_text("kind,kv,n,median_ms\ndecode,32,1,0.009\ndecode_dup,32,1,0.5\nprefill,0,64,0.015\n"
                    "prefill,0,64,0.4\n")
    assert read_attention(path).values.tolist() == [["decode", 32, 1, 0.009], ["prefill", 0, 64, 0.015]]


def test_running_median_keeps_a_line_and_drops_a_spike():
    from pagesim.sim.cost.measured import running_median

    line = np.arange(10.0)
    assert running_median(line, 5).tolist() == line.tolist()
    spiky = line.copy()
    spiky[4] = 100.0
    assert running_median(spiky, 5)[4] == 5.0  # median of 2, 3, 100, 5, 6


@pytest.mark.parametrize("field,value,msg", [
    ("time_stats.mlp_up_proj.median", "fast", "row 3, field 'time_stats.mlp_up_proj.median': must be a number > 0"),
    ("time_stats.add.median", "-1", "row 3, field 'time_stats.add.median': must be a number > 0"),
    ("num_tokens", "0", "row 3, field 'num_tokens': must be a number > 0"),
])
def test_bad_measured_value_is_one_line(tmp_path, capsys, field, value, msg):
    root = write_measured(tmp_path / "m", attention=False)
    path = root / "vidur-profiling/compute/a100/acme/Tiny-2b/mlp.csv"
    df = pd.read_csv(path, dtype=str)
    df.loc[2, field] = value
    df.to_csv(path, index=False)
    rc = main(["cost", "error", "--measured", str(root), "--model", "tiny-2b", "--gpu", "a100-80gb"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and f"{path}: {msg}" in err


def test_unmeasured_gpu_and_model_are_one_line(tmp_path, capsys):
    root = write_measured(tmp_path / "m", attention=False)
    for argv, msg in ((["--model", "tiny-2b", "--gpu", "h100-80gb"], "no measurements for GPU 'h100-80gb'"),
                      (["--model", "qwen-72b", "--gpu", "a100-80gb"], "no measurements of model 'qwen-72b'")):
        rc = main(["cost", "error", "--measured", str(root), *argv])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and msg in err


# -- the calibration file and the error that travels -------------------------------------------------------

def test_calibration_toml_round_trip(tmp_path):
    cal = replace(TRUE, provenance={"models": ["a", "b"], "date": "2026-01-01"},
                  error={"calibrated": {"method": "x", "all": {"median": 0.01, "p90": 0.05, "max": 0.2, "cells": 3}}})
    path = tmp_path / "c.toml"
    path.write_text(cal.to_toml())
    back = Calibration.from_toml(path)
    assert back == cal and back.provenance == cal.provenance and back.error == cal.error


@pytest.mark.parametrize("edit,msg", [
    (("gemm_compute_eff = 0.75", "gemm_compute_eff = -0.75"), "field 'gemm_compute_eff' must hold finite numbers > 0"),
    (("decode_fixed_s = 5e-06\n", ""), "[constants] has no 'decode_fixed_s'"),
    (("elementwise_fixed_s = [3e-06, ", "elementwise_fixed_s = ["), "field 'elementwise_fixed_s' needs 4 values"),
])
def test_bad_calibration_file_is_one_line(tmp_path, capsys, edit, msg):
    assert_bad_file_is_one_line(tmp_path, capsys, TRUE, edit, msg)


def assert_bad_file_is_one_line(tmp_path, capsys, cal: Calibration, edit, msg) -> None:
    """``cal``'s file with ``edit`` (old, new) made: ``cost error`` says ``msg`` in one line, exit 2."""
    path = tmp_path / "c.toml"
    text = cal.to_toml()
    assert edit[0] in text
    path.write_text(text.replace(*edit))
    root = write_measured(tmp_path / "m", attention=False)
    rc = main(["cost", "error", "--measured", str(root), "--model", "tiny-2b", "--gpu", "a100-80gb",
               "--cost-model", "calibrated", "--calibration", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and msg in err


def test_simulate_says_which_cost_model_ran(tmp_path, capsys):
    from pagesim.sim.cost.calibration import load_calibration

    band = load_calibration("a100-80gb").error["calibrated"]["all"]
    out = tmp_path / "run"
    assert main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--model", "llama-2-7b",
                 "--gpu", "a100-80gb", "--cost-model", "calibrated", "--out", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert f"calibrated (GPU time per iteration vs measured on a100-80gb: median {100 * band['median']:.1f} %" in text
    s = json.loads((out / "summary.json").read_text())
    assert s["cost_model"] == "calibrated" and s["cost_error"]["p90"] == band["p90"]
    assert s["cost_error"]["method"] == "leave-one-model-out"
    assert main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--out", str(out),
                 "--gpu", "l40s", "--no-progress"]) == 0
    assert "roofline (uncalibrated: no measured timings for l40s)" in capsys.readouterr().out
    s = json.loads((out / "summary.json").read_text())
    assert s["cost_model"] == "roofline" and s["cost_error"].startswith("uncalibrated")


def test_a_same_chip_gpu_borrows_the_measured_ones_constants_and_says_so(tmp_path, capsys):
    """The A100-40GB (the default, unmeasured) is the A100-80GB's chip with slower HBM: priced with
    the 80 GB's fitted constants at its own datasheet bandwidth, its band labelled as measured on
    the 80 GB, the CPU time the 80 GB's measured one."""
    from pagesim.sim.cost.calibration import load_calibration
    from pagesim.sim.core.price import cost_calibrated as core
    from pagesim.sim.cost.calibrated import CalibratedCostModel
    from pagesim.sim.specs import get_gpu, get_model

    measured = load_calibration("a100-80gb")
    assert load_calibration("a100-40gb") == measured and load_calibration("h200-141gb") == load_calibration("h100-80gb")
    model = get_model("opt-13b")
    small, large = CalibratedCostModel(model, get_gpu("a100-40gb")), CalibratedCostModel(model, get_gpu("a100-80gb"))
    assert small.calibration == measured
    assert small.constants()[core.MEMORY_BANDWIDTH] == 1555e9 and large.constants()[core.MEMORY_BANDWIDTH] == 2039e9
    assert (small.overhead_s, small.per_seq_overhead_s) == (large.overhead_s, large.per_seq_overhead_s)
    # a decode step of 8 sequences at 1,000 tokens each moves the same bytes at 1,555 instead of 2,039 GB/s
    assert small.step_time(decode_batch(8, 8000)) > large.step_time(decode_batch(8, 8000))
    band = measured.error["calibrated"]["all"]
    out = tmp_path / "run"
    assert main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--cost-model", "calibrated",
                 "--gpu", "a100-40gb", "--out", str(out), "--no-progress"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the band wraps over lines within 100 columns
    assert (f"calibrated (GPU time per iteration vs measured on a100-80gb: median {100 * band['median']:.1f} %, "
            f"p90 {100 * band['p90']:.1f} %, leave-one-model-out; a100-40gb itself unmeasured: the same chip as "
            "a100-80gb; no real serving run of vLLM 0.4.2 (v0) measured it end to end)") in text
    s = json.loads((out / "summary.json").read_text())
    assert s["gpu"] == "a100-40gb" and s["cost_error"]["measured_on"] == "a100-80gb"
    assert s["cost_error"]["p90"] == band["p90"]


def test_calibrated_refuses_what_was_not_measured(capsys):
    rc = main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--cost-model", "calibrated",
               "--model", "mixtral-8x7b", "--gpu", "h100-80gb", "--tp", "2", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "has mixture of experts: use --cost-model roofline" in err


def test_calibrated_on_an_uncalibrated_gpu_is_one_line(capsys):
    rc = main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "20", "--cost-model", "calibrated",
               "--gpu", "l40s", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "no calibration for GPU 'l40s'" in err


def test_calibrated_cuts_the_error_on_the_shared_measurements():
    """The shipped A100 file's own claims, checked against the public measurements (skipped without them)."""
    shared = os.environ.get("PAGESIM_SHARED") or Path(__file__).resolve().parents[3] / "shared"
    root = Path(shared) / "measured"
    if not root.is_dir():
        pytest.skip("../shared/measured is absent (set PAGESIM_SHARED)")
    from pagesim.sim.cost.calibration import load_calibration
    from pagesim.sim.cost.calibration_fit import score

    m = read_measured(root, "a100-80gb")
    cal = load_calibration("a100-80gb")
    roof = score(m, "llama-2-7b", A100, "roofline")
    ours = score(m, "llama-2-7b", A100, "calibrated", cal)
    assert np.median(np.abs(ours["error"])) < 0.05 < np.median(np.abs(roof["error"]))
    stored = cal.error["roofline"]["models"]["llama-2-7b"]["all"]["median"]
    assert math.isclose(float(np.median(np.abs(roof["error"]))), stored)


# -- plan's error band ---------------------------------------------------------------------------------

def test_scaled_cost_model_scales_the_gpu_time_only():
    from pagesim.sim.cost.models import make_cost_model

    # the toy decode step: CPU 0.13, GPU 51.864 + 15.8333; x1.5 -> 0.13 + 1.5 * 67.69733
    cm = make_cost_model(TOY, TOY_GPU, 1, None, 100.0, 10.0, "calibrated", TOY_CAL, cost_scale=1.5)
    assert cm.step_time(decode_batch(3, 30)) == pytest.approx(0.13 + 1.5 * (51.864 + 2 * (1.25 + 240 / 36)), rel=1e-12)


def test_bad_cost_scale_is_one_line(tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text("cost_scale = 0\n")
    rc = main(["simulate", "--workload", "sharegpt", "--rate", "2", "--duration", "10", "--no-progress",
               "--config", str(cfg)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cost_scale must be > 0, got 0" in err


def test_plan_reports_the_band_of_the_cost_error(tmp_path, capsys):
    from pagesim.sim.cost.calibration import load_calibration

    p90 = load_calibration("a100-80gb").error["calibrated"]["all"]["p90"]
    argv = ["plan", "--workload", "sharegpt", "--duration", "30", "--model", "llama-2-7b", "--gpu", "a100-80gb",
            "--cost-model", "calibrated", "--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--no-progress",
            "--cache-dir", str(tmp_path / "cache"), "--json", "--rtol", "0.05",
            # a CPU time the band's +-p90 of GPU time moves by more than the search's steps
            "--step-overhead-ms", "3", "--per-seq-overhead-ms", "0.02"]
    assert main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    row = r["answers"][0]
    # a slower GPU (time x 1 + p90) sustains less, a faster one more
    assert row["max_rate_low_rps"] <= row["max_rate_rps"] <= row["max_rate_high_rps"]
    assert row["max_rate_low_rps"] < row["max_rate_high_rps"]
    assert r["error_band"]["gpu_time_scales"] == [1 + p90, 1 - p90]
    assert r["cost_model"]["a100-80gb"]["cost_error"]["p90"] == p90
    assert main(argv + ["--no-error-band"]) == 0
    assert "max_rate_low_rps" not in json.loads(capsys.readouterr().out)["answers"][0]


def test_fit_command_writes_the_cpu_lines_and_their_provenance(tmp_path, capsys):
    root = write_measured(tmp_path / "measured")
    cpu = vidur_table(tmp_path / "cpu_overheads.csv")
    out = tmp_path / "a100.toml"
    assert main(["cost", "fit", "--measured", str(root), "--gpu", "a100-80gb", "--out", str(out),
                 "--cpu-overheads", str(cpu)]) == 0
    cal = Calibration.from_toml(out)
    assert cal.cpu_tp == (1, 2)
    assert cal.cpu_fixed_s == pytest.approx((1e-3, 6e-3), rel=1e-9)
    assert cal.cpu_per_seq_s == pytest.approx((50e-6, 40e-6), rel=1e-9)
    p = cal.provenance["cpu_overheads"]
    assert p["file"].startswith("cpu_overheads.csv sha256:")
    assert "ray_comm_time mean" in p["rule"] and math.isclose(max(p["max_error"]), 0.0, abs_tol=1e-9)
    from pagesim.sim.cost.cli import portable  # (relative where the test's folder is beside the repository's)

    assert cal.provenance["command"].endswith(f"--cpu-overheads {portable(cpu)}")


def test_the_error_table_is_read_alone_as_the_whole_file_reads_it(tmp_path, monkeypatch):
    """``measured_error`` parses the ``[error]`` table alone where it is the file's last and whole
    (the shipped files), and the whole file otherwise: here a sub-table of it stands before it,
    which the tail alone would miss (worked by hand: ``extra``'s one key)."""
    from pagesim.sim.cost import calibration

    for gpu in calibration.calibrated_gpus():
        assert calibration.measured_error(gpu) == Calibration.from_toml(calibration.calibration_path(gpu)).error
    head, tail = calibration.calibration_path("a100-80gb").read_text().split("\n[error]\n")
    (tmp_path / "split-gpu.toml").write_text(head + "\n[error.roofline.extra]\nmedian = 1.5\n\n[error]\n" + tail)
    (tmp_path / "last-gpu.toml").write_text(head + "\n[error]\n" + tail)
    monkeypatch.setattr(calibration, "DATA_DIR", tmp_path)
    split = calibration.measured_error("split-gpu")
    assert split["roofline"]["extra"] == {"median": 1.5}
    rest = {k: v for k, v in split["roofline"].items() if k != "extra"}
    assert rest == calibration.measured_error("last-gpu")["roofline"]


def test_a_degree_measured_without_its_all_reduce_names_the_degrees_scored(tmp_path, capsys):
    """Operations measured at TP 1, 2 and 4 with all-reduce timings for 2 GPUs only: TP 4 cannot
    be scored, and the line says which degrees can (not that TP 4 was never measured)."""
    root = write_measured(tmp_path / "m", tps=(1, 2, 4))
    rc = main(["cost", "error", "--measured", str(root), "--model", "llama-2-7b", "--gpu", "a100-80gb", "--tp", "4"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "--tp 4: llama-2-7b on a100-80gb is scored at TP 1, 2 (its operations are measured at 1, 2, 4;" in err
