"""pagesim plan: search logic, SLO evaluation, cost, Little's law, a small real search, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from pagesim.experiments import plan as P
from pagesim.experiments.probe import (ProbeWatcher, Runner, SearchTask, build_workload, decode_workload,
                                       early_stop_options, encode_workload, run_searches)
from pagesim.experiments.search import search_max
from pagesim.experiments.slo import LITTLE_TOL, SLO, evaluate_point, littles_law, p99, request_ok
from pagesim.sim.errors import ConfigError
from pagesim.sim.cli import main


# ------------------------------------------------------------------------------ search


@pytest.mark.parametrize("threshold", [0.07, 0.9, 1.0, 3.7, 41.0, 999.0])
@pytest.mark.parametrize("k", [1, 3])
def test_search_finds_threshold_within_tolerance(threshold, k):
    calls = []

    def passes(xs):
        calls.append(list(xs))
        return [x <= threshold for x in xs]

    s = search_max(passes, 1.0, k=k, rtol=0.01, x_min=0.05, x_max=1000.0)
    a = s.answer
    assert a is not None and a <= threshold
    assert threshold - a <= 0.01 * a + 1e-12 or s.capped
    n = sum(len(c) for c in calls)
    bracket = abs(math.log2(threshold / 1.0)) + 2
    bisect = math.log2(1 / 0.01) + 2
    assert n <= k * (bracket + bisect), (n, calls)
    assert len(set(x for c in calls for x in c)) == n  # never probes a point twice


def test_search_infeasible_and_capped():
    s = search_max(lambda xs: [False] * len(xs), 1.0, x_min=0.05, x_max=100)
    assert s.answer is None and s.infeasible and min(s.tried) == 0.05
    assert len(s.tried) <= 7  # 1, .5, .25, .125, .0625, .05
    s = search_max(lambda xs: [True] * len(xs), 1.0, x_min=0.05, x_max=100)
    assert s.answer == 100 and s.capped and len(s.tried) <= 9


def test_search_bisection_answer_is_a_passing_probe():
    s = search_max(lambda xs: [x <= 2.5 for x in xs], 1.0, rtol=0.05)
    assert s.tried[s.answer] is True
    assert s.hi is not None and s.hi > 2.5 and (s.hi - s.answer) <= 0.05 * s.answer


# ------------------------------------------------------------------------------ SLO evaluation


def _requests(ttft, tpot, e2el, status=None, arrival=None, out=None):
    n = len(ttft)
    arrival = np.arange(n, dtype=float) if arrival is None else np.asarray(arrival, float)
    e2el = np.asarray(e2el, float)
    out = np.full(n, 10) if out is None else np.asarray(out)
    return pd.DataFrame({"arrival_s": arrival, "finish_s": arrival + e2el,
                         "status": status or ["finished"] * n, "output_tokens": out,
                         "ttft_s": np.asarray(ttft, float), "tpot_s": np.asarray(tpot, float), "e2el_s": e2el,
                         "normalized_latency_s": e2el / out})


def test_p99_matches_numpy_linear():
    v = np.arange(1, 101, dtype=float)  # 1..100: p99 = 99 + 0.01 * 1 = 99.01
    assert p99(v) == pytest.approx(99.01)
    assert p99([1.0, np.nan, 3.0]) == pytest.approx(2.98)
    assert math.isnan(p99([]))


def test_evaluate_point_p99_mode():
    ttft = np.linspace(0.1, 1.0, 100)
    ttft[-1] = 5.0  # one outlier: p99 = 0.99*... interpolation between 0.990909 and 5
    req = _requests(ttft, np.full(100, 0.05), np.full(100, 2.0))
    expect = np.percentile(ttft, 99)
    slo = SLO(ttft_p99_s=2.0, tpot_p99_s=0.1)
    p = evaluate_point(req, slo)
    assert p["p99_ttft_s"] == pytest.approx(expect)
    assert p["passed"] == (expect <= 2.0)
    assert p["slo_attainment"] == pytest.approx(0.99)
    p = evaluate_point(req, SLO(ttft_p99_s=10.0, tpot_p99_s=0.1))
    assert p["passed"] and p["fail_reason"] == ""
    p = evaluate_point(req, SLO(tpot_p99_s=0.04))
    assert not p["passed"] and "TPOT" in p["fail_reason"]


def test_slo_attainment_counts_rejected_and_nan_tpot():
    req = _requests([0.5, 0.5, 3.0, np.nan], [np.nan, 0.2, 0.05, np.nan], [1, 1, 4, np.nan],
                    status=["finished", "finished", "finished", "rejected"])
    slo = SLO(ttft_p99_s=1.0, tpot_p99_s=0.1, slo_attainment=0.25)
    ok = request_ok(req, slo)
    assert ok.tolist() == [True, False, False, False]  # NaN TPOT meets; rejected never does
    p = evaluate_point(req, slo)
    assert p["slo_attainment"] == pytest.approx(0.25)
    assert not p["passed"] and "rejected" in p["fail_reason"]  # rejections always fail the probe
    p = evaluate_point(req.iloc[:3], slo)
    assert p["passed"]  # SLO-attainment mode: 1/3 >= 0.25, p99 not checked


def test_keepup_rule():
    # 100 requests arriving over 99 s; the last one finishes 70 s after arriving: drain 70 > max(5 % * 99, 60)
    e2el = np.full(100, 1.0)
    e2el[-1] = 70.0
    p = evaluate_point(_requests(np.full(100, 0.1), np.full(100, 0.01), e2el), SLO())
    assert p["drain_s"] == pytest.approx(70.0) and not p["kept_up"] and not p["passed"]
    p = evaluate_point(_requests(np.full(100, 0.1), np.full(100, 0.01), e2el), SLO(), keepup_min_s=80)
    assert p["kept_up"] and p["passed"]


def test_slo_validation():
    with pytest.raises(ConfigError):
        SLO(ttft_p99_s=-1)
    with pytest.raises(ConfigError):
        SLO(slo_attainment=0.9)  # no per-request threshold
    with pytest.raises(ConfigError):
        SLO(ttft_p99_s=1, slo_attainment=1.5)


def test_slo_scaled_multiplies_every_threshold_and_keeps_the_target():
    slo = SLO(ttft_p99_s=0.2, tpot_p99_s=0.04, e2el_p99_s=8.0, slo_attainment=0.9)
    half = slo.scaled(0.5)
    assert (half.ttft_p99_s, half.tpot_p99_s, half.e2el_p99_s) == (0.1, 0.02, 4.0)
    assert half.normalized_latency_s is None and half.slo_attainment == 0.9
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="SLO's scale"):
            slo.scaled(bad)


# ------------------------------------------------------------------------------ Little's law and cost


def test_littles_law_exact_on_hand_made_table():
    # arrivals 0, 1, 2; finishes 2, 2, 5 -> window [0, 5]; L = (2 + 1 + 3) / 5 = 1.2; lambda = 3/5; W = 2
    req = _requests([0.1] * 3, [0.01] * 3, [2.0, 1.0, 3.0], arrival=[0.0, 1.0, 2.0])
    ll = littles_law(req)
    assert ll["L"] == pytest.approx(1.2, abs=1e-12)
    assert ll["lam"] == pytest.approx(0.6) and ll["W"] == pytest.approx(2.0)
    assert ll["littles_law_error"] == pytest.approx(0.0, abs=1e-12)


def test_littles_law_flags_unfinished():
    req = _requests([0.1] * 3, [0.01] * 3, [2.0, 1.0, np.nan], arrival=[0.0, 1.0, 2.0],
                    status=["finished", "finished", "unfinished"])
    ll = littles_law(req)
    # window [0, 2]: L = (2 + 1 + 0) / 2 = 1.5; lambda W = 3/2 * 1.5 = 2.25 -> error 0.5
    assert ll["L"] == pytest.approx(1.5)
    assert ll["littles_law_error"] == pytest.approx(0.5)


def test_cost_arithmetic():
    # 2 GPUs/replica x 3 replicas x $2/h = $12/h; 1000 tok/s -> 3.6M tok/h -> $3.333 per 1M
    assert P.cost_per_million_tokens(2.0, 2, 3, 1000.0) == pytest.approx(12 / 3.6)
    assert math.isnan(P.cost_per_million_tokens(2.0, 1, 1, 0.0))
    assert P.gpu_hourly("a100-40gb") == P.GPU_HOURLY_USD["a100-40gb"]
    assert P.gpu_hourly("h100", 7.5) == 7.5


def test_workload_encoding_round_trip():
    s = encode_workload({"workload": "alpaca", "duration": 60.0, "arrival": "gamma", "cv": 2.0,
                           "time_slice": (0.0, 30.0)})
    d = decode_workload(s)
    assert d == {"workload": "alpaca", "duration": 60.0, "arrival": "gamma", "cv": 2.0, "time_slice": (0.0, 30.0)}
    assert encode_workload({"workload": "sharegpt", "arrival": "poisson", "cv": 1.0}) == "sharegpt"
    df, _ = build_workload("sharegpt?duration=30.0", 2.0, 0, 2048)
    df2, _ = build_workload("sharegpt?duration=30.0", 4.0, 0, 2048)
    assert df["arrival_s"].max() < 30 and len(df2) > len(df)


# ------------------------------------------------------------------------------ real simulations


def _setup(**sim):
    return P.PlanSetup(sim={"model": "opt-13b", "gpu": "a100-40gb", "max_seq_len": 1024, **sim},
                       workload=encode_workload({"workload": "sharegpt", "duration": 40.0,
                                                   "max_len_policy": "truncate"}),
                       rtol=0.2, start_rate=1.0)


def test_monotone_in_kv_memory(tmp_path):
    runner = Runner(slo=SLO(ttft_p99_s=2.0, tpot_p99_s=0.1), workers=1, cache_dir=tmp_path)
    tasks = []
    for kv in (1, 2, 4):
        setup = _setup(kv_gib=kv)
        tasks.append(SearchTask(f"kv{kv}", setup.rate_search(), lambda x, s=setup: s.spec("vllm", x)))
    run_searches(tasks, runner)
    rates = [t.search.answer for t in tasks]
    assert all(r is not None for r in rates), rates
    assert rates[0] <= rates[1] <= rates[2], rates
    for t in tasks:  # Little's law holds on every probe where everything finished
        for p in t.points:
            if p.get("unfinished") == 0 and p.get("completed"):
                assert p["littles_law_error"] <= LITTLE_TOL


# ------------------------------------------------------------------------------ CLI


CLI = ["plan", "--workload", "sharegpt", "--model", "opt-13b", "--gpu", "a100-40gb", "--duration", "40",
       "--max-seq-len", "1024", "--max-len-policy", "truncate", "--rtol", "0.25", "--workers", "1"]


def test_cli_json_one_object(tmp_path, capsys):
    rc = main(CLI + ["--slo-ttft-p99", "2", "--slo-tpot-p99", "0.1", "--systems", "orca-oracle,vllm",
                     "--cache-dir", str(tmp_path / "c"), "--json", "--out", str(tmp_path / "o"), "--report"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)  # exactly one JSON object
    assert set(obj["max_rate_rps"]) == {"orca-oracle", "vllm"}
    assert obj["max_rate_rps"]["vllm"] > 0
    assert obj["points"] and {"rate", "p99_ttft_s", "p99_tpot_s", "slo_attainment", "passed",
                              "littles_law_error"} <= set(obj["points"][0])
    assert obj["slo"]["ttft_p99_s"] == 2
    for f in ("plan.json", "points.csv", "max_rate.csv", "report.html"):
        assert (tmp_path / "o" / f).exists()
    html = (tmp_path / "o" / "report.html").read_text()
    assert html.count("plotly.js v") <= 2 and "Probed curves" in html


def test_cli_impossible_slo(tmp_path, capsys):
    rc = main(CLI + ["--slo-ttft-p99", "0.001", "--min-rate", "0.5", "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert "no rate down to 0.5 req/s meets the SLO" in out
    assert "TTFT SLO must be >=" in out
    assert "Traceback" not in out + err


def test_cli_model_too_big(tmp_path, capsys):
    rc = main(["plan", "--model", "opt-66b", "--gpu", "a100-40gb", "--slo-ttft-p99", "2", "--duration", "40",
               "--cache-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "opt-66b needs" in err and "try --tp" in err and "Traceback" not in err


def test_cli_bad_system(capsys):
    assert main(["plan", "--systems", "vllm,nope", "--slo-ttft-p99", "2"]) == 2
    assert "unknown system" in capsys.readouterr().err


# ------------------------------------------------------------------------------ early stop


class _Table:
    def __init__(self, arrival, first, finish, output=None, status=None):
        self.arrival_s = np.asarray(arrival, float)
        self.first_token_s = np.asarray(first, float)
        self.finish_s = np.asarray(finish, float)
        self.size = len(self.arrival_s)
        self.output = np.full(self.size, 10) if output is None else np.asarray(output)
        self.status = np.zeros(self.size, np.int8) if status is None else np.asarray(status, np.int8)


def test_watcher_p99_rule_is_exact():
    # N = 100 -> m = 100 - floor(0.99 * 99) = 2 requests over the threshold make p99 > thr
    n = 100
    arrival = np.arange(n, dtype=float)
    first = arrival + 0.5
    finish = arrival + 1.0
    first[[10, 20]] = arrival[[10, 20]] + 3.0  # two TTFTs over 2 s
    w = ProbeWatcher(_Table(arrival, first, finish), {"ttft": 2.0})
    assert w.verdict() is not None and "TTFT" in w.verdict()
    ttft = first - arrival
    assert np.percentile(ttft, 99) > 2.0  # the certainty the watcher claims
    first[20] = arrival[20] + 0.5  # only one: p99 may still pass -> no verdict
    assert ProbeWatcher(_Table(arrival, first, finish), {"ttft": 2.0}).verdict() is None


def test_watcher_counts_waiting_requests_and_rejections():
    # 3 requests: one finished at t=10; two still waiting since t=0 and t=1 (no first token): at now=10
    # both have waited > 2 s, so with N = 3 (m = 3 - floor(1.98) = 2) the TTFT p99 is certainly above 2 s
    t = _Table([0.0, 0.0, 1.0], [1.0, np.nan, np.nan], [10.0, np.nan, np.nan])
    assert "TTFT" in ProbeWatcher(t, {"ttft": 2.0}).verdict()
    t = _Table([0.0, 1.0], [0.1, np.nan], [1.0, np.nan], status=[4, 5])
    assert "rejected" in ProbeWatcher(t, {}).verdict()
    # SLO attainment: 1 of 4 misses; target 0.8 allows 0.8 misses -> certain failure
    t = _Table([0, 1, 2, 3], [0.1, 1.1, 5.0, 3.1], [1, 2, 6, 4])
    assert "SLO attainment" in ProbeWatcher(t, {"ttft": 2.0, "slo_attainment": 0.8}).verdict()
    assert ProbeWatcher(t, {"ttft": 2.0, "slo_attainment": 0.7}).verdict() is None


def test_early_stop_gives_the_same_answer(tmp_path):
    slo = SLO(ttft_p99_s=2.0, tpot_p99_s=0.1)
    answers = []
    for stop in (None, early_stop_options(slo)):
        setup = _setup(kv_gib=2)
        setup.early_stop = stop
        runner = Runner(slo=slo, workers=1, cache_dir=tmp_path)
        t = SearchTask("vllm", setup.rate_search(), lambda x, s=setup: s.spec("vllm", x))
        run_searches([t], runner)
        answers.append(t.search.answer)
        stopped = [p for p in t.points if p.get("stopped_early")]
        assert bool(stopped) == (stop is not None)
    assert answers[0] == answers[1]


def test_a_what_if_is_tried_where_the_system_takes_it():
    """The registry decides (sim/systems.py): a setting that does nothing there, or that the
    scheduler refuses, is no variant of that system."""
    from pagesim.experiments.plan import what_if_variants

    labels = {system: [label for label, _ in what_if_variants(system, {})]
              for system in ("vllm", "orca-max", "static", "vllm-v1", "sglang")}
    assert labels["vllm"] == ["baseline", "block_size=8", "block_size=32", "max_num_seqs=64", "max_num_seqs=128",
                              "chunked_prefill", "preemption=swap"]
    # Orca: no blocks; its reservation is the base's (max) so only the two others
    assert labels["orca-max"] == ["baseline", "max_num_seqs=64", "max_num_seqs=128", "reservation=pow2",
                                  "reservation=oracle", "chunked_prefill", "preemption=swap"]
    assert labels["static"] == ["baseline", "max_num_seqs=64", "max_num_seqs=128"]  # never preempts
    # vLLM v1 and SGLang always chunk and preempt by recompute only; vLLM v1 alone speculates
    assert labels["sglang"] == ["baseline", "block_size=8", "block_size=32", "max_num_seqs=64", "max_num_seqs=128"]
    assert labels["vllm-v1"] == labels["sglang"] + ["num_speculative_tokens=3"]


def test_compare_gpus_brackets_each_gpu_by_its_own_band(tmp_path, capsys, monkeypatch):
    """compare-gpus on GPUs none of which is plan's base GPU (it once looked that GPU's band up and
    failed): each GPU's band comes from its own settings (vLLM v1's batch limit is 1,024 on an
    H100, 256 on an A100-40GB), and each GPU's answers are searched again on that GPU with that
    GPU's own scales, for the systems with an answer there only."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.cost.calibration import gpu_time_scales, run_error_band

    searched = []
    max_rate = P.max_rate
    monkeypatch.setattr(P, "max_rate", lambda setup, systems, *a, **k: searched.append(
        (setup.sim.get("gpu"), setup.sim.get("cost_scale"), tuple(systems))) or max_rate(setup, systems, *a, **k))
    rc = main(["plan", "compare-gpus", "--gpus", "h100,a100-80gb", "--systems", "vllm-v1", "--model",
               "llama-3.1-8b", "--workload", "sharegpt", "--duration", "20", "--rtol", "0.25", "--workers", "1",
               "--no-steady-check", "--cache-dir", str(tmp_path), "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for gpu in ("h100-80gb", "a100-80gb"):
        own = run_error_band(SimConfig.for_system("vllm-v1", model="llama-3.1-8b", gpu=gpu), gpu)
        assert out["cost_model"][gpu]["cost_error"] == P.jsonable(own["cost_error"])
        scales = gpu_time_scales(own["cost_error"])
        assert out["error_band"]["gpu_time_scales"][gpu] == pytest.approx(scales)
        assert [(s, systems) for g, s, systems in searched if g == gpu] == [(scales[0], ("vllm-v1",)),
                                                                           (scales[1], ("vllm-v1",))]
        [row] = [r for r in out["gpus"] if r["gpu"] == gpu]
        assert row["max_rate_low_rps"] <= row["max_rate_rps"] <= row["max_rate_high_rps"]
    scales = out["error_band"]["gpu_time_scales"]
    assert scales["a100-80gb"][0] > scales["h100-80gb"][0]  # the held-out GPUs widen the A100's slow side


def test_max_rate_names_an_alias_gpus_band_by_its_preset(tmp_path, capsys):
    """--gpu h100 is the h100-80gb preset: its band is the fitted GPU's, not an unfitted GPU's."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.cost.calibration import run_error_band

    rc = main(["plan", "max-rate", "--gpu", "h100", "--systems", "vllm-v1", "--model", "llama-3.1-8b", "--workload",
               "sharegpt", "--duration", "20", "--rtol", "0.25", "--workers", "1", "--no-steady-check",
               "--cache-dir", str(tmp_path), "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    own = run_error_band(SimConfig.for_system("vllm-v1", model="llama-3.1-8b", gpu="h100-80gb"), "h100-80gb")
    assert rc == 0 and list(out["cost_model"]) == ["h100-80gb"]
    assert out["cost_model"]["h100-80gb"]["cost_error"] == P.jsonable(own["cost_error"])


def test_a_band_side_on_the_wrong_side_of_the_answer_is_kept_at_it_and_said():
    """The slow side at or under the answer, the fast side at or over it; one that lands beyond is
    clamped to the answer: silently within the searches' tolerance (their grids differ), with a
    warning naming it beyond (a short workload's noisy saturation check)."""
    from pagesim.experiments.plan_cli import keep_band_around

    result, row = {}, {"max_rate_rps": 48.8}
    keep_band_around(result, row, "vllm-v1", (46.8, 25.5), rtol=0.05)
    assert (row["max_rate_low_rps"], row["max_rate_high_rps"]) == (46.8, 48.8)
    [warning] = result["warnings"]
    assert warning.startswith("vllm-v1: the band's fast side found 25.5 req/s") and "--duration" in warning
    result, row = {}, {"max_rate_rps": 12.8}
    keep_band_around(result, row, "a/b", (13.0, 14.0), rtol=0.05)  # 13.0: within 5 % of 12.8
    assert (row["max_rate_low_rps"], row["max_rate_high_rps"]) == (12.8, 14.0) and "warnings" not in result
    keep_band_around(result, row, "a/b", (13.5, 14.0), rtol=0.05)  # 13.5: 5.5 % above
    assert row["max_rate_low_rps"] == 12.8 and "slow side found 13.5" in result["warnings"][0]
    result, row = {}, {"max_rate_rps": 3.0}  # the slow side meets no rate: said as found
    keep_band_around(result, row, "x", (None, 3.0), rtol=0.05)
    assert (row["max_rate_low_rps"], row["max_rate_high_rps"]) == (None, 3.0) and "warnings" not in result


@pytest.mark.parametrize("mode", ["max-rate", "compare-gpus"])
def test_the_band_searches_keep_the_given_price(mode, tmp_path, capsys):
    """A GPU without a price preset (the H20) takes --dollars-per-gpu-hour in the band's searches too."""
    gpus = ["--gpu", "h20-96gb"] if mode == "max-rate" else ["--gpus", "h20-96gb"]
    rc = main(["plan", mode, *gpus, "--systems", "vllm-v1", "--model", "llama-3.1-8b", "--workload", "sharegpt",
               "--duration", "20", "--rtol", "0.25", "--workers", "1", "--no-steady-check", "--slo-ttft-p99", "2",
               "--dollars-per-gpu-hour", "5", "--cache-dir", str(tmp_path), "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    [row] = out["answers"] if mode == "max-rate" else out["gpus"]
    assert rc == 0 and row["max_rate_low_rps"] is not None and out["error_band"]


def test_resources_refuses_a_router_its_replicas_refuse_before_any_probe(tmp_path, capsys):
    """prefix-affinity routes by prefix caches: without --prefix-caching a cluster refuses it
    (sim.cluster.check_cluster), and so does plan resources, in one line, before probing (it once
    searched on and answered that no cluster of up to 256 replicas met the SLO)."""
    rc = main(["plan", "resources", "--rate", "60", "--systems", "vllm", "--model", "llama-3.1-8b", "--gpu",
               "a100-80gb", "--workload", "sharegpt", "--duration", "20", "--tp-options", "1", "--what-if", "none",
               "--router", "prefix-affinity", "--cache-dir", str(tmp_path), "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and "needs --prefix-caching" in err


def test_compare_gpus_searches_the_band_of_the_answered_systems_alone(tmp_path, capsys, monkeypatch):
    """Granite-4.0-H-Tiny on an RTX 4090: vLLM v1 answers; vLLM v0's probes fail (its memory does
    not hold the model). The band is searched for vLLM v1 alone: searching both, as once, failed
    the whole command on v0's memory check after the comparison had answered."""
    searched = []
    max_rate = P.max_rate
    monkeypatch.setattr(P, "max_rate", lambda setup, systems, *a, **k: searched.append(tuple(systems)) or max_rate(
        setup, systems, *a, **k))
    rc = main(["plan", "compare-gpus", "--gpus", "rtx-4090", "--systems", "vllm-v1,vllm", "--model",
               "granite-4.0-h-tiny", "--workload", "sharegpt", "--duration", "20", "--rtol", "0.25", "--workers", "1",
               "--no-steady-check", "--slo-ttft-p99", "2", "--dollars-per-gpu-hour", "1", "--cache-dir", str(tmp_path),
               "--json", "--no-progress"])
    rows = {r["system"]: r for r in json.loads(capsys.readouterr().out)["gpus"]}
    assert rc == 0 and searched == [("vllm-v1",), ("vllm-v1",)]
    assert rows["vllm-v1"]["max_rate_low_rps"] is not None and rows["vllm"]["max_rate_rps"] is None


def test_resources_with_a_profile_tries_the_degrees_it_was_measured_at(tmp_path):
    """A measured profile prices its own TP alone (sim.cost.roofline.TableCostModel): plan
    resources' default degrees become those of 1, 2, 4, 8 it was measured at (all it holds if
    none), and --tp-options naming another degree is refused in one line."""
    import pandas as pd

    from pagesim.experiments.plan import DEFAULT_TP_OPTIONS
    from pagesim.experiments.plan_cli import profile_degrees
    from tests.sim.core.test_cost_models import profile

    both = tmp_path / "both.csv"
    pd.concat([pd.read_csv(profile(tmp_path / f"tp{tp}.csv", tp=tp)) for tp in (1, 2)]).to_csv(both, index=False)
    assert profile_degrees(str(both), DEFAULT_TP_OPTIONS) == [1, 2]
    assert profile_degrees(profile(tmp_path / "tp3.csv", tp=3), DEFAULT_TP_OPTIONS) == [3]
    assert profile_degrees(str(both), [2]) == [2]
    with pytest.raises(ConfigError, match="--tp-options: the profile .* was measured at TP 1, 2, not 4"):
        profile_degrees(str(both), [1, 4])
