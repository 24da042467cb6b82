"""``validate`` and ``pagesim validate`` on CPU with the fake backend (dry run)."""

from __future__ import annotations

import json
import re
import types

import numpy as np
import pandas as pd
import pytest

from pagesim.gpu.device import cuda_available
from pagesim.gpu.executor import StepPlan
from pagesim.gpu.fake_backend import FakeBackend
from pagesim.gpu.validate import REQUIRED_KEYS, STEP_COLUMNS, _StepLog, compare, rel_errors, validate
from pagesim.sim.batch import StepBatch
from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.cost.models import swap_block_tokens
from pagesim.sim.cost.profile_format import write_profile
from pagesim.sim.cost.roofline import RooflineCostModel, TableCostModel
from pagesim.sim.errors import InvariantError
from pagesim.sim.metrics import MEMORY_CATEGORIES
from pagesim.sim.specs import get_gpu, get_model

MODEL, GPU = get_model("llama-2-7b"), get_gpu("h200")


def cfg(**kw):
    base = dict(model="llama-2-7b", gpu="h200", kv_gib=0.25, max_seq_len=512)
    base.update(kw)
    return SimConfig.for_system("vllm", **base)


def trace(n=30, seed=2, rate=10.0, width=False):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                       "prompt_tokens": rng.integers(5, 150, n), "output_tokens": rng.integers(2, 80, n)})
    if width:
        df["n"] = rng.choice([1, 2], n)
    return df


def profile_csv(path):
    rows = [dict(component="linear", num_tokens=n, time_us=3000 + 2 * n) for n in (1, 64, 512, 4096)]
    rows += [dict(component="attn_decode", batch=b, context=c, time_us=10 + b * c * 0.01)
             for b in (1, 16, 256) for c in (16, 512, 4096)]
    rows += [dict(component="attn_prefill", num_tokens=n, time_us=5 + n * 0.5) for n in (16, 512, 4096)]
    rows += [dict(component="overhead", time_us=500.0)]
    for r in rows:
        for k in ("num_tokens", "batch", "context"):
            r.setdefault(k, None)
        r.update(model="llama-2-7b", gpu="h200", dtype="float16", tp=1)
    write_profile(rows, path)
    return str(path)


def test_fake_at_roofline_cost_matches_simulation_exactly(tmp_path):
    # the simulation's price, swaps included (its groups of 2 are swapped when preempted)
    roof = RooflineCostModel(MODEL, GPU, kernel_block_tokens=cfg().kernel_block_tokens,
                             swap_block_tokens=swap_block_tokens(cfg()))
    # a swap-only plan run first has no batch: the step's plan prices all its swaps (test_executor.py)
    res = validate(cfg(), trace(width=True), FakeBackend(lambda p: roof.step_time(p.batch) if p.batch is not None
                                                         else 0.0))
    m = res.metrics
    assert m["roofline_median_step_error"] == 0 and m["roofline_p90_step_error"] == 0
    assert m["step_error_model"] == "roofline" and m["median_step_error"] == 0
    assert m["throughput_error"] == 0 and m["ttft_error"] == 0 and m["tpot_error"] == 0
    pd.testing.assert_frame_equal(res.real.requests, res.sim_roofline.requests)
    pd.testing.assert_frame_equal(res.real.steps, res.sim_roofline.steps)
    assert m["executor_copies"] == m["cow_copies"] > 0


def test_twice_the_roofline_gives_half_error_and_files(tmp_path):
    roof = RooflineCostModel(MODEL, GPU, kernel_block_tokens=cfg().kernel_block_tokens)  # the simulation's price
    res = validate(cfg(), trace(), FakeBackend(lambda p: 2 * roof.step_time(p.batch)), workload={"name": "unit"})
    out = res.save(tmp_path / "v")
    m = json.loads((out / "validation.json").read_text())
    for k in REQUIRED_KEYS:
        assert k in m, k
    assert m["roofline_median_step_error"] == pytest.approx(0.5) and m["roofline_p90_step_error"] == pytest.approx(0.5)
    assert m["workload"] == {"name": "unit"} and m["gpu_name"] == "fake" and m["model"] == "llama-2-7b"
    steps = pd.read_csv(out / "steps.csv")
    assert list(steps.columns) == STEP_COLUMNS
    assert len(steps) == m["num_steps"] == m["real_num_steps"]
    assert steps["measured_s"].to_numpy() == pytest.approx(2 * steps["predicted_roofline_s"].to_numpy())
    assert steps["predicted_table_s"].isna().all()
    # memory: the pool's bytes from the block tables equal the simulator's occupancy at every step
    assert (steps["pool_occupied_bytes"] == steps["sim_occupied_bytes"]).all()
    cap = res.real.summary["kv_capacity_tokens"]
    assert (steps[[f"mem_{c}" for c in MEMORY_CATEGORIES]].sum(axis=1) == cap).all()
    assert steps["start_s"].is_monotonic_increasing
    html = (out / "report.html").read_text()
    assert html.count("<script") >= 4 and html.count("plotly.js v") <= 2  # the library embedded once
    for title in ("Predicted vs measured", "Step error", "Finished requests", "KV memory"):
        assert title in html
    for sub in ("real", "sim_roofline"):
        assert (out / sub / "summary.json").exists()
    # the slower real run: lower throughput, both computed from the runs' summaries
    assert m["real_output_throughput"] < m["sim_output_throughput"]
    assert m["throughput_error"] == pytest.approx(abs(m["sim_output_throughput"] - m["real_output_throughput"])
                                                  / m["real_output_throughput"])


def test_hand_computed_single_request_with_profile(tmp_path):
    prof = profile_csv(tmp_path / "p.csv")
    table = TableCostModel(prof, MODEL, GPU)
    factors = [1.0, 1.1, 1.2]  # measured = table price x factor, cycling by step

    def t(plan):
        return table.step_time(plan.batch) * factors[plan.step % 3]

    tr = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.5], "prompt_tokens": [10], "output_tokens": [4]})
    res = validate(cfg(), tr, FakeBackend(t), profile=prof)
    m, s = res.metrics, res.steps
    assert len(s) == 4  # one prefill, three decodes
    errs = [0.0, 0.1 / 1.1, 0.2 / 1.2, 0.0]
    assert s["rel_error_table"].tolist() == pytest.approx(errs)
    assert m["step_error_model"] == "table" and m["sim_model"] == "table"
    assert m["median_step_error"] == pytest.approx(np.median(errs))
    assert m["p90_step_error"] == pytest.approx(np.percentile(errs, 90))
    meas = s["measured_s"].to_numpy()
    assert m["real_output_throughput"] == pytest.approx(4 / meas.sum())  # from the first arrival (at 0.5 s)
    assert m["real_mean_ttft_ms"] == pytest.approx(meas[0] * 1e3)
    assert m["real_mean_tpot_ms"] == pytest.approx(meas[1:].sum() / 3 * 1e3)
    # the table-model simulation prices the same 4 steps at factor 1
    sim_t = table.step_time(StepBatch(np.array([0]), np.array([10]), np.array([10])))
    assert m["sim_mean_ttft_ms"] == pytest.approx(sim_t * 1e3)
    assert m["ttft_error"] == pytest.approx(abs(sim_t - meas[0]) / meas[0])
    assert m["ttft_error"] == 0  # step 0 has factor 1
    assert res.sim_table is not None and "roofline_ttft_error" in m
    assert res.save(tmp_path / "out").joinpath("sim_table", "summary.json").exists()


def test_rel_errors_and_compare_nan_safe():
    assert rel_errors([1.0, 3.0], [2.0, 2.0]).tolist() == [0.5, 0.5]
    steps = pd.DataFrame({"measured_s": [1.0, 2.0], "predicted_roofline_s": [1.5, 2.0],
                          "rel_error_roofline": [0.5, 0.0], "rel_error_table": [np.nan, np.nan]})
    summ = dict(output_throughput=10.0, mean_ttft_ms=float("nan"), mean_tpot_ms=2.0, completed=1,
                duration_s=1.0, num_preemptions=0, num_steps=2)
    r = types.SimpleNamespace(summary=summ)
    s = types.SimpleNamespace(summary=dict(summ, output_throughput=12.0))
    m = compare(r, s, None, steps)
    assert m["roofline_median_step_error"] == 0.25 and m["throughput_error"] == pytest.approx(0.2)
    assert np.isnan(m["ttft_error"]) and m["tpot_error"] == 0


def test_memory_mismatch_raises():
    """One running request, its 5 tokens in blocks 3 and 2 (block size 4; the row's third entry,
    7, is left over from an earlier holder and not held): the tables hold 2 blocks. An allocator
    that counts 3 in use (13 of 16 free) is caught; with 14 free the step passes."""
    from pagesim.sim.core import state
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.NUM_BLOCKS] = 16
    count = np.zeros(state.NUM_COUNTS, np.int64)
    count[state.NUM_RUNNING], count[state.NUM_FREE_BLOCK_IDS] = 1, 13
    core = types.SimpleNamespace(config=config, count=count, running=np.array([0]), num_seqs=np.array([1]),
                                 seq_slot=np.array([[0]]), block_table=np.array([[3, 2, 7]], np.int32),
                                 num_blocks=np.array([2]))
    log = _StepLog(RooflineCostModel(MODEL, GPU), None, 1.0, True, core=lambda: core)
    b = StepBatch(np.array([0]), np.array([5]), np.array([5]))
    with pytest.raises(InvariantError, match="the block tables hold 2 blocks, the allocator counts 3 in use"):
        log(b, StepPlan(0, 4, 16), 0.01)
    count[state.NUM_FREE_BLOCK_IDS] = 14
    log(b, StepPlan(0, 4, 16), 0.01)
    assert log.rows[-1][12:14] == (2, 8.0)  # pool_occupied_blocks, _bytes (2 x 4 slots x 1 byte)


ARGS = ["validate", "--workload", "sharegpt", "--rate", "4", "--num-requests", "12", "--model", "llama-2-7b",
        "--gpu", "h200", "--system", "vllm", "--kv-gib", "1", "--max-seq-len", "2048", "--no-progress"]


def test_cli_fake_backend_end_to_end(tmp_path, capsys):
    out = tmp_path / "dry"
    assert main(ARGS + ["--backend", "fake", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step error" in text and "validation.json" in text
    # the CPU's stand-in is called fake, never real; a run without copies or swaps compares no K/V
    assert "output throughput fake / sim" in text and "mean TTFT fake / sim" in text
    assert not re.search(r"\breal\b", text) and "not a measurement" in " ".join(text.split())
    assert re.search(r"K/V after copies and swaps\s+nothing to compare: no copy-on-write or swap", text)
    assert "fake pool occupied" in (out / "report.html").read_text()
    # the dry run's host share is the roofline's host term (3 ms + 20 us per sequence, +-10 %): the fit finds it
    fit = re.search(r"host term fitted on this run\s+([\d.]+) ms \+ ([\d.]+) ms/seq", text)
    assert fit and abs(float(fit[1]) - 3.0) < 0.3 and abs(float(fit[2]) - 0.02) < 0.005, text
    m = json.loads((out / "validation.json").read_text())
    for k in REQUIRED_KEYS:
        assert k in m
    assert m["workload"]["source"] == "builtin:sharegpt" and m["num_requests"] == 12
    assert m["gpu_name"] == "cpu (fake backend, dry run)"  # the backend's own name, given when it is made
    assert (out / "steps.csv").exists() and (out / "report.html").exists()
    assert main(ARGS + ["--backend", "fake", "--out", str(tmp_path / "j"), "--json"]) == 0
    assert "median_step_error" in json.loads(capsys.readouterr().out)
    # decode steps replay the fake's padded graphs (gpu/graphs.py), none without --cuda-graphs
    steps = pd.read_csv(out / "steps.csv")
    replayed = steps["graph_size"].notna()
    assert m["steps_replayed_from_graphs"] == replayed.sum() > 0 and m["cuda_graphs"]
    assert (steps.loc[replayed, "graph_size"] >= steps.loc[replayed, "num_decode_seqs"]).all()
    assert (steps.loc[replayed, "num_prefill_seqs"] == 0).all()
    assert re.search(rf"host / device \(median\)\s+[\d.]+ / [\d.]+ ms; {replayed.sum()} of {len(steps)} steps", text)
    assert main(ARGS + ["--backend", "fake", "--out", str(tmp_path / "n"), "--no-cuda-graphs"]) == 0
    assert json.loads((tmp_path / "n" / "validation.json").read_text())["steps_replayed_from_graphs"] == 0


def test_cli_refuses_an_fp8_kv_cache_in_one_line(tmp_path, capsys):
    assert main(ARGS + ["--backend", "fake", "--kv-cache-dtype", "fp8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-cache-dtype fp8 is simulated only" in err
    assert not (tmp_path / "o").exists()


def test_cli_fake_backend_with_profile(tmp_path, capsys):
    prof = profile_csv(tmp_path / "p.csv")
    assert main(ARGS + ["--backend", "fake", "--profile", prof, "--out", str(tmp_path / "o")]) == 0
    m = json.loads((tmp_path / "o" / "validation.json").read_text())
    assert m["step_error_model"] == "table" and m["profile"] == prof
    assert (tmp_path / "o" / "sim_table" / "summary.json").exists()


@pytest.mark.skipif(cuda_available(), reason="a GPU is present")
def test_cli_without_gpu_exits_2_with_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import pagesim.traces.args
    def boom(*a, **k):
        raise AssertionError("built the workload before checking for a GPU")

    monkeypatch.setattr(pagesim.traces.args, "workload_from_args", boom)
    rc = main(ARGS + ["--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("pagesim: error: ") and "GPU" in err
    assert "Traceback" not in err and not (tmp_path / "x").exists()


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    h = capsys.readouterr().out
    for opt in ("--layers", "--dtype", "--backend", "--profile", "--workload", "--system", "--out"):
        assert opt in h


def tiny_config(tmp_path):
    p = tmp_path / "tiny" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps({"model_type": "llama", "hidden_size": 128, "num_attention_heads": 4,
                             "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2,
                             "intermediate_size": 256, "vocab_size": 500, "max_position_embeddings": 256}))
    return str(p)


def _tiny_validate(tmp_path, backend):
    kvb = 2 * 2 * 2 * 64 * 2  # bytes per token of the tiny model
    c = SimConfig.for_system("vllm", model=tiny_config(tmp_path), gpu="h200", kv_gib=300 * kvb / 2**30,
                             max_seq_len=256, block_size=16, check=True)
    tr = trace(12, seed=4, rate=40.0, width=True)
    tr["prompt_tokens"] = tr["prompt_tokens"] % 60 + 2
    tr["output_tokens"] = tr["output_tokens"] % 30 + 2
    res = validate(c, tr, backend, workload={"name": "tiny"})
    out = res.save(tmp_path / "out")
    m = json.loads((out / "validation.json").read_text())
    assert m["real_completed"] == 12 and m["num_steps"] > 20
    assert (res.steps["measured_s"] > 0).all()
    assert (res.steps["pool_occupied_bytes"] == res.steps["sim_occupied_bytes"]).all()
    return res


def test_validate_with_the_torch_backend_on_cpu(tmp_path):
    pytest.importorskip("torch")
    from pagesim.gpu.model_runner import TorchCupyBackend
    res = _tiny_validate(tmp_path, TorchCupyBackend(dtype="float32", device="cpu"))
    assert res.metrics["backend"] == "torch-cupy" and res.metrics["executor_copies"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device")
def test_validate_tiny_model_on_gpu(tmp_path):
    from pagesim.gpu.device import torch_cuda_available
    if not torch_cuda_available():
        pytest.skip("needs torch with CUDA")
    from pagesim.gpu.model_runner import TorchCupyBackend
    res = _tiny_validate(tmp_path, TorchCupyBackend(dtype="float16"))
    assert res.metrics["dtype"] == "float16"


def test_cli_rejects_non_paged_systems(tmp_path, capsys):
    args = [a if a != "vllm" else "orca-max" for a in ARGS]
    assert main(args + ["--backend", "fake", "--out", str(tmp_path / "o")]) == 2
    assert "paged systems only" in capsys.readouterr().err


def test_gpu_only_and_whole_step_errors_by_step_type_and_batch_size(tmp_path):
    """Device share = the roofline's price less its host term (overhead 3 ms + 20 us per sequence);
    host share = 1 ms + 0.1 ms per sequence. By hand: the GPU-only error is 0 on every step, the
    host fit recovers 1 ms and 0.1 ms, and each whole-step error is
    |(gpu + 3 + 0.02 n) - (gpu + 1 + 0.1 n)| / (gpu + 1 + 0.1 n) (ms)."""
    from pagesim.gpu.validate import cpu_term, error_breakdown
    roof = RooflineCostModel(MODEL, GPU, kernel_block_tokens=cfg().kernel_block_tokens)  # the simulation's price

    def gpu(p):
        return roof.step_time(p.batch) - cpu_term(roof, p.batch.num_seqs)

    def host(p):
        return 1e-3 + 1e-4 * p.batch.num_seqs

    res = validate(cfg(), trace(), FakeBackend(gpu, host_fn=host))
    s, m = res.steps, res.metrics
    assert (s["rel_error_roofline_gpu"] < 1e-12).all() and m["median_gpu_step_error"] < 1e-12
    n = s["batch_size"].to_numpy(float)
    assert s["measured_host_s"].to_numpy() == pytest.approx(1e-3 + 1e-4 * n)
    meas = s["measured_gpu_s"].to_numpy() + 1e-3 + 1e-4 * n
    want = np.abs((s["measured_gpu_s"].to_numpy() + 3e-3 + 2e-5 * n) - meas) / meas
    assert s["rel_error_roofline"].to_numpy() == pytest.approx(want)
    assert m["host_fit"]["intercept_ms"] == pytest.approx(1.0) and m["host_fit"]["per_seq_ms"] == pytest.approx(0.1)
    assert m["median_step_error_host_fitted_in_sample"] < 1e-9  # the fitted host term prices it exactly
    # each step's host time reported apart from its device time
    assert m["median_host_ms"] == pytest.approx(1e3 * np.median(1e-3 + 1e-4 * n))
    assert m["median_gpu_ms"] == pytest.approx(1e3 * s["measured_gpu_s"].median())
    assert set(s["step_type"]) >= {"prefill", "decode"}
    br = error_breakdown(s, "roofline")
    assert br["steps"].sum() == len(s) and list(br.columns)[:3] == ["step_type", "batch_size", "steps"]
    dec1 = s[(s.step_type == "decode") & (s.batch_size == 1)]
    row = br[(br.step_type == "decode") & (br.batch_size == "1")].iloc[0]
    assert row["steps"] == len(dec1) and row["median_step_error"] == pytest.approx(dec1["rel_error_roofline"].median())
    assert row["median_measured_host_ms"] == pytest.approx(1.1)
    out = res.save(tmp_path / "v")
    assert len(pd.read_csv(out / "step_errors.csv")) == len(br)
    html = (out / "report.html").read_text()
    assert "Errors by step type and batch size" in html and "End to end" in html


def test_the_host_fit_keeps_both_terms_at_or_above_zero():
    """By hand, three steps of 1, 2, 3 sequences. Host 3, 2, 1 ms: the free line is 4 - 1 n, so
    the fit is the mean with no per-sequence term, 2 ms + 0. Host 0.5, 1.5, 2.5 ms: the free line
    is -0.5 + 1 n, so the fit is the line through 0, n.h / n.n = 11 / 14 ms a sequence. Host
    1.5, 2, 2.5 ms: the free line, 1 + 0.5 n."""
    from pagesim.gpu.validate import host_fit

    def fit(host_ms):
        return host_fit(pd.DataFrame({"batch_size": [1, 2, 3], "measured_host_s": 1e-3 * np.array(host_ms)}))

    assert fit([3, 2, 1]) == pytest.approx({"intercept_ms": 2.0, "per_seq_ms": 0.0})
    assert fit([0.5, 1.5, 2.5]) == pytest.approx({"intercept_ms": 0.0, "per_seq_ms": 11 / 14})
    assert fit([1.5, 2, 2.5]) == pytest.approx({"intercept_ms": 1.0, "per_seq_ms": 0.5})


def test_batch_buckets():
    from pagesim.gpu.validate import batch_bucket
    assert [batch_bucket(n) for n in (1, 2, 4, 5, 16, 17, 64, 65, 256, 257, 5000)] == \
        ["1", "2-4", "2-4", "5-16", "5-16", "17-64", "17-64", "65-256", "65-256", ">=257", ">=257"]


class HeldBackend(FakeBackend):
    """Reports device timing as TorchCupyBackend does: every 3rd step lost its hold, and launching
    took 2 ms a step."""
    timing = "device"

    def execute(self, plan):
        t = super().execute(plan)
        self.last_timing = dict(self.last_timing, launch_s=2e-3, gaps_hidden=plan.step % 3 != 0)
        return t


def test_device_timing_counts_the_steps_with_gaps(tmp_path):
    """By hand: steps 0, 3, 6 ... lost their hold, so ceil(steps / 3) steps with gaps; 2 ms launches."""
    res = validate(cfg(), trace(), HeldBackend())
    s, m = res.steps, res.metrics
    assert m["steps_with_launch_gaps"] == -(-len(s) // 3) and m["median_launch_ms"] == pytest.approx(2.0)
    assert m["timing"] == "device" and list(s["gaps_hidden"][:4]) == [False, True, True, False]


def test_steps_name_the_longest_decode_context(tmp_path):
    """Worked by hand: prompts of 10 and 30 tokens, 3 output tokens each, both at 0 s. Step 0
    prefills both; steps 1 and 2 decode both at contexts (the new token included) 11 and 31, then
    12 and 32: sums 42 and 44, the longest 31 and 32 (it sizes the attention kernel's grid)."""
    tr = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 0.0], "prompt_tokens": [10, 30],
                       "output_tokens": [3, 3]})
    res = validate(cfg(), tr, FakeBackend(lambda p: 1e-3))
    s = res.steps
    assert s["num_decode_seqs"].tolist() == [0, 2, 2]
    assert s["sum_decode_context"].tolist() == [0, 42, 44]
    assert s["max_decode_context"].tolist() == [0, 31, 32]


def test_the_gpu_backend_is_warmed_densely_whatever_the_longest_sequence(monkeypatch):
    """``pagesim validate``'s backend (validate_cli.make_backend) warms up at every step size to
    DENSE_WARM_TOKENS (model_runner.warm_up_token_counts), also with no --max-seq-len (the
    configuration's max_seq_len None: the model's own)."""
    import sys
    import pagesim.gpu.validate_cli as vc
    made = {}
    monkeypatch.setattr(vc, "TorchCupyBackend", lambda **kw: made.update(kw) or "backend")
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_device_name=lambda: "a GPU")))
    args = types.SimpleNamespace(backend="gpu", dtype="float16", layers=4, timing="device", ops="fused",
                                 cuda_graphs=True)
    for cfg in (SimConfig.for_system("vllm", model="llama-2-7b"), None):
        made.clear()
        assert vc.make_backend(args, cfg) == "backend"
        assert made["dense_warm_tokens"] == vc.DENSE_WARM_TOKENS == 1024


def test_a_run_priced_with_another_runs_host_term(tmp_path, capsys):
    """``--host-from DIR``: run A (the fake runner's host time 1 ms + 0.1 ms a sequence) fits that
    term; run B, priced with it (--backend fake), records it and prices every step and its
    simulations with 1 ms + 0.1 ms a sequence on top of each model's device time: its roofline
    price of a step of n sequences is the roofline's device time + 1 + 0.1 n ms, not + 3 + 0.02 n.
    A folder without validation.json, or with another host term flag, is one line and exit 2."""
    from pagesim.sim.cli import main

    res = validate(cfg(), trace(), FakeBackend(host_fn=lambda p: 1e-3 + 1e-4 * p.batch.num_seqs))
    assert res.metrics["host_fit"]["intercept_ms"] == pytest.approx(1.0)
    res.save(tmp_path / "a")
    args = ["validate", "--workload", "sharegpt", "--rate", "4", "--num-requests", "6", "--model", "llama-2-7b",
            "--gpu", "h100", "--kv-gib", "2", "--backend", "fake", "--no-progress"]
    assert main([*args, "--host-from", str(tmp_path / "a"), "--out", str(tmp_path / "b")]) == 0
    assert "fitted on" in capsys.readouterr().out
    b = json.loads((tmp_path / "b" / "validation.json").read_text())
    assert b["host_from"]["intercept_ms"] == pytest.approx(1.0) and b["host_from"]["per_seq_ms"] == pytest.approx(0.1)
    sim = json.loads((tmp_path / "b" / "sim_roofline" / "config.json").read_text())
    assert sim["step_overhead_ms"] == pytest.approx(1.0) and sim["per_seq_overhead_ms"] == pytest.approx(0.1)
    s = pd.read_csv(tmp_path / "b" / "steps.csv")
    n = s["batch_size"].to_numpy(float)
    device = s["predicted_roofline_gpu_s"].to_numpy()
    assert s["predicted_roofline_s"].to_numpy() == pytest.approx(device + 1e-3 + 1e-4 * n)
    assert main([*args, "--host-from", str(tmp_path / "none"), "--out", str(tmp_path / "c")]) == 2
    assert "validation.json not found" in capsys.readouterr().err
    both = ["--host-from", str(tmp_path / "a"), "--step-overhead-ms", "2"]
    assert main([*args, *both, "--out", str(tmp_path / "d")]) == 2
    assert "--host-from sets the host term" in capsys.readouterr().err
