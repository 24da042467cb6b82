"""The DistServe figure: SLO attainment and goodput by hand, and its quick run's layout with a
stand-in engine (each design's summary worked out below)."""

import math

import pandas as pd
import pytest

from pagesim.experiments import figures as X
from pagesim.experiments import paper
from pagesim.experiments.figures import distserve
from pagesim.experiments.run_cache import RunOutput
from pagesim.experiments.run_spec import RunSpec, expand_grid, load_experiment, simulate_spec


def test_slo_attainment_counts_every_request():
    # 8 good requests over a 4 s run: request_goodput 2.0/s; 10 finished, 1 rejected, 1 unfinished
    # -> 8 / 12 (a rejected or unfinished request misses, as the artifact's get_attainment)
    s = {"request_goodput": 2.0, "duration_s": 4.0, "completed": 10, "rejected": 1, "unfinished": 1}
    assert distserve.slo_attainment(s) == pytest.approx(8 / 12)
    # 3 good requests over 0.7 s: (3 / 0.7) * 0.7 is 2.9999999999999996 in floating point,
    # rounded back to the 3 it counts: 3 / 4 exactly
    assert distserve.slo_attainment({"request_goodput": 3 / 0.7, "duration_s": 0.7, "completed": 4,
                                     "rejected": 0, "unfinished": 0}) == 0.75
    assert math.isnan(distserve.slo_attainment({"duration_s": 4.0, "completed": 10}))  # no SLO


def test_goodput_interpolates_the_crossing_of_the_target():
    # attainment 1.0, 0.95, 0.80 at 1, 2, 3 req/s/GPU: misses 0, 0.05, 0.20 against 0.1;
    # crossing between 2 and 3 at 2 + (0.1 - 0.05) / (0.20 - 0.05) = 2 + 1/3
    rate, how = distserve.goodput_per_gpu([1, 2, 3], [1.0, 0.95, 0.80], 0.9)
    assert rate == pytest.approx(2 + 1 / 3) and how == "interpolated"
    # exactly 90 % at 2 counts as meeting it; then 0.5 at 3: 2 + (0.1 - 0.1) / 0.4 = 2
    assert distserve.goodput_per_gpu([1, 2, 3], [1.0, 0.9, 0.5], 0.9)[0] == pytest.approx(2.0)
    rate, how = distserve.goodput_per_gpu([1, 2], [0.99, 0.95], 0.9)
    assert rate == 2 and "censored" in how
    rate, how = distserve.goodput_per_gpu([1, 2], [0.5, 0.2], 0.9)
    assert math.isnan(rate) and "lowest" in how


def test_design_and_gpus():
    colocated = RunSpec(system="vllm-v1", replicas=3)
    disagg = RunSpec(system="vllm-v1", disagg={"prefill_replicas": 1, "decode_replicas": 1,
                                               "prefill_tp": 2, "decode_tp": 1})
    assert distserve.design_and_gpus(colocated) == ("colocated", 3)
    assert distserve.design_and_gpus(disagg) == ("disaggregated", 3)  # 1 x TP 2 + 1 x TP 1


def test_config_runs_the_artifact_placement_and_slos():
    specs = expand_grid(load_experiment("distserve"))
    assert len(specs) == 16
    colocated = [s for s in specs if not s.disagg]
    disagg = [s for s in specs if s.disagg]
    assert {s.replicas for s in colocated} == {3}
    assert {tuple(sorted(s.disagg.items())) for s in disagg} == {
        (("decode_replicas", 1), ("decode_tp", 1), ("first_token", "prefill"), ("kv_link", "nvlink"),
         ("prefill_replicas", 1), ("prefill_tp", 2))}
    assert {s.rate / 3 for s in specs} == {0.25, 0.5, 1.0, 1.5, 2.0, 2.25, 2.5, 3.0}  # per GPU
    # the requests: ShareGPT pairs kept as the artifact keeps them (traces/chatbot.py)
    assert {s.workload for s in specs} == {"chatbot-distserve"}
    assert {s.num_requests for s in specs} == {300}  # the artifact's 100 per GPU
    # the artifact's baseline is vLLM 0.1.7 (prefill first, no chunking): pagesim's vLLM v0;
    # DistServe streams the prefill's token; one cost model for both designs
    assert {s.system for s in colocated} == {"vllm"} and {s.system for s in disagg} == {"vllm-v1"}
    assert {s.disagg["first_token"] for s in disagg} == {"prefill"}
    assert {s.sim["cost_model"] for s in specs} == {"roofline"}
    assert all(s.goodput == {"ttft": 250.0, "tpot": 100.0} for s in specs)
    assert specs[0].summary_options().goodput_slo_s == (("ttft", 0.25), ("tpot", 0.1))
    # the same SLOs as the paper numbers' (the artifact's _plot.py)
    assert paper.paper_value("distserve", "slo_ttft_s", workload="sharegpt") == 0.25
    assert paper.paper_value("distserve", "slo_tpot_s", workload="sharegpt") == 0.1


def stand_in(spec: RunSpec) -> RunOutput:
    """Attainment falling linearly past a knee: disaggregated holds 100 % up to 1.5 req/s per
    GPU, colocated up to 0.5, each losing 0.5 (50 points) per req/s/GPU beyond; 40 requests
    over a 10 s run, so request_goodput = 40 * attainment / 10 (whole requests at the rates
    probed)."""
    design, gpus = distserve.design_and_gpus(spec)
    knee = 1.5 if design == "disaggregated" else 0.5
    attainment = max(0.0, 1.0 - 0.5 * max(0.0, spec.rate / gpus - knee))
    return RunOutput(summary={"completed": 40, "rejected": 0, "unfinished": 0, "duration_s": 10.0,
                              "request_goodput": 40 * attainment / 10, "mean_ttft_ms": 100.0})


def test_quick_run_layout_and_goodputs(tmp_path):
    opts = X.SweepOptions(workers=1, cache_dir=tmp_path / "cache", progress=False, run_fn=stand_in)
    tables = X.reproduce("distserve", tmp_path, opts, quick=True)
    curves = pd.read_csv(tmp_path / "distserve.csv")
    assert list(curves.columns) == list(distserve.COLUMNS)
    assert list(curves["design"]) == ["disaggregated"] * 2 + ["colocated"] * 2
    assert list(curves["per_gpu_rate"]) == [0.5, 3.0, 0.5, 3.0]
    # disaggregated: 1.0 at 0.5, 1 - 0.5 * 1.5 = 0.25 at 3; colocated: 1.0, 1 - 0.5 * 2.5 = -> 0
    assert list(curves["slo_attainment"]) == pytest.approx([1.0, 0.25, 1.0, 0.0])
    g = pd.read_csv(tmp_path / "distserve_goodput.csv")
    assert list(g.columns) == list(tables["distserve_goodput"].columns)
    g = g.set_index("design")
    # disaggregated: misses 0 at 0.5, 0.75 at 3 -> 0.5 + 2.5 * 0.1 / 0.75 = 5/6;
    # colocated: misses 0, 1 -> 0.5 + 2.5 * 0.1 = 0.75; ratio (5/6) / 0.75 = 10/9
    assert g.loc["disaggregated", "goodput_per_gpu"] == pytest.approx(5 / 6)
    assert g.loc["colocated", "goodput_per_gpu"] == pytest.approx(0.75)
    assert g.loc["disaggregated", "ratio_vs_colocated"] == pytest.approx(10 / 9)
    assert g.loc["disaggregated", "paper_ratio_low"] == 2.0
    assert g.loc["disaggregated", "paper_ratio_high"] == 4.6
    assert "outside the paper's 2-4.6x" in g.loc["disaggregated", "note"]
    # the artifact's measured goodputs beside ours (paper_numbers.csv: its drop lines)
    assert g.loc["disaggregated", "paper_goodput_per_gpu"] == 2.30
    assert g.loc["colocated", "paper_goodput_per_gpu"] == 0.50
    text = distserve.explain(curves, tables["distserve_goodput"])
    assert "a ratio of 1.11x" in text and "Disaggregated leads" not in text
    assert "measured (the artifact's saved Fig. 8): 2.30 and 0.50, 4.6x" in text
    assert "colocated 0.75 req/s" in text  # interpolated: no "at least"
    assert "0.5: 100 % vs 100 %; 3: 25 % vs 0 %" in text  # a tie, then disaggregated ahead
    assert "The lead changes at per-GPU rate 3 (disaggregated ahead)." in text


def probe(design, rate, attainment, **pools):
    """One row of distserve.csv: the columns the reading reads, the rest NaN."""
    row = dict.fromkeys(distserve.COLUMNS, math.nan)
    row.update(design=design, per_gpu_rate=rate, slo_attainment=attainment, **pools)
    return row


def test_bottleneck_names_the_decode_pool_from_the_pools_columns():
    # disaggregated 95 % at 0.5, 60 % at 1 (the first probe under 90 %): there the prefill pool
    # is busy 12 %, the decode pool holds 77 % of 65,644 slots and requests wait 6,878 ms for it,
    # over the 250 ms TTFT SLO: the decode pool is named. The artifact's capacity: 66,144.
    pools = dict(prefill_utilization=0.12, decode_kv_used=0.77, decode_kv_capacity_tokens=65644,
                 mean_decode_admit_wait_ms=6878.0, mean_ttft_ms=65.0, mean_tpot_ms=207.0)
    curves = pd.DataFrame([probe("disaggregated", 0.5, 0.95, **pools),
                           probe("disaggregated", 1.0, 0.60, **pools),
                           probe("disaggregated", 2.0, 0.30, **{**pools, "decode_kv_used": 0.9})])
    text = distserve.bottleneck(curves, 0.9)
    assert text.startswith("At 1 req/s per GPU, the first probe where the disaggregated design "
                           "falls below 90 %, its prefill pool is busy 12 % of the run and its "
                           "decode pool holds 77 % of its 65,644 KV slots on average (DistServe's "
                           "own engine: 66,144")
    assert "wait 6878 ms" in text and "(mean TTFT 65 ms, mean TPOT 207 ms)" in text
    assert text.endswith("The decode pool sets the rate: its KV cache has no room for more "
                         "requests while the prefill pool idles.")
    # a wait within the TTFT SLO (200 <= 250 ms) names nothing; a busy prefill pool neither
    for change in ({"mean_decode_admit_wait_ms": 200.0}, {"prefill_utilization": 0.6}):
        rows = [probe("disaggregated", 1.0, 0.6, **{**pools, **change})]
        assert "sets the rate" not in distserve.bottleneck(pd.DataFrame(rows), 0.9)
    assert distserve.bottleneck(curves.iloc[:1], 0.9) == ""  # never below 90 %
    assert distserve.bottleneck(pd.DataFrame([probe("disaggregated", 1.0, 0.5)]), 0.9) == ""


def test_colocated_misses_weighs_its_worst_p99_tpot_against_the_slo():
    rows = [probe("colocated", 1.0, 1.0, p99_tpot_ms=42.0), probe("colocated", 3.0, 0.9,
                                                                   p99_tpot_ms=88.0)]
    text = distserve.colocated_misses(pd.DataFrame(rows))
    assert "stays within the 100 ms SLO at every probe (at most 88 ms)" in text
    rows[1]["p99_tpot_ms"] = 140.0
    assert distserve.colocated_misses(pd.DataFrame(rows)).startswith(
        "The colocated design's p99 TPOT reaches 140 ms, over the 100 ms SLO")
    assert distserve.colocated_misses(pd.DataFrame([probe("disaggregated", 1.0, 1.0)])) == ""


def test_spec_runs_each_pool_at_its_tensor_parallelism():
    # a disaggregated spec reaches sim/disagg.py with each pool's TP, its link and the SLOs
    spec = RunSpec(system="vllm-v1", sim={"model": "opt-13b", "gpu": "a100-80gb",
                                          "record_steps": False},
                   workload="sharegpt", rate=1.0, num_requests=4, goodput={"ttft": 250, "tpot": 100},
                   disagg={"prefill_replicas": 1, "decode_replicas": 1, "prefill_tp": 2,
                           "decode_tp": 1, "kv_link": "nvlink"})
    s = simulate_spec(spec).summary
    assert (s["prefill_tensor_parallel"], s["decode_tensor_parallel"], s["gpus"]) == (2, 1, 3)
    assert s["kv_link"] == "nvlink" and s["completed"] == 4
    assert "request_goodput" in s and distserve.slo_attainment(s) >= 0
    assert "disagg" not in RunSpec().canonical()  # a single engine's cache key is unchanged


def test_measured_curves_agree_with_their_drop_lines():
    # the artifact's curves (read off its figure's markers) and its goodputs (its drop lines)
    # are two readings of one figure: the curves' own 90 % crossings must land on the lines
    measured = paper.distserve_paper_curve()
    assert set(measured["design"]) == {"disaggregated", "colocated"}
    assert list(measured["per_gpu_rate"].drop_duplicates()) == [0.25, 0.5, 1, 1.5, 2, 2.25, 2.5, 3]
    assert measured["slo_attainment"].between(0, 1).all()  # fractions, not percents
    for design, system in (("disaggregated", "distserve"), ("colocated", "vllm")):
        m = measured[measured["design"] == design]
        crossing, how = distserve.goodput_per_gpu(m["per_gpu_rate"], m["slo_attainment"], 0.9)
        line = paper.paper_value("distserve", "goodput_per_gpu", workload="sharegpt", system=system)
        assert how == "interpolated" and crossing == pytest.approx(line, abs=0.03)
    ratio = (paper.paper_value("distserve", "goodput_per_gpu", workload="sharegpt", system="distserve")
             / paper.paper_value("distserve", "goodput_per_gpu", workload="sharegpt", system="vllm"))
    assert ratio == pytest.approx(4.6)  # the ratio the artifact's notebook prints


def test_against_measured_gives_ours_minus_theirs_per_design(monkeypatch):
    # measured: disaggregated 100 % and 80 % at 1 and 2; colocated 90 % at 1 only (2 unprobed)
    measured = pd.DataFrame({"design": ["disaggregated", "disaggregated", "colocated"],
                             "per_gpu_rate": [1.0, 2.0, 1.0], "slo_attainment": [1.0, 0.8, 0.9]})
    monkeypatch.setattr(paper, "distserve_paper_curve", lambda: measured)
    ours = pd.DataFrame([probe("disaggregated", 1.0, 0.96), probe("disaggregated", 2.0, 0.62),
                         probe("disaggregated", 3.0, 0.5), probe("colocated", 1.0, 0.99),
                         probe("colocated", 2.0, 0.98)])
    text = distserve.against_measured(ours)
    # disaggregated: -4 and -18 points -> mean -11, the largest 18 at 2; colocated: +9 at 1,
    # its only shared rate; 3 (and colocated 2) unmeasured
    assert ("disaggregated -11 points on average over 2 rates (the largest 18 points at 2 req/s "
            "per GPU: ours 62 %, measured 80 %)") in text
    assert "colocated +9 points on average over 1 rate (the largest 9 points at 1 req/s" in text
    assert distserve.against_measured(ours[ours["per_gpu_rate"] == 3.0]) == ""


def test_the_era_reading_quotes_the_fit_of_the_cost_model_the_curves_ran():
    """The colocated gap's measured reason: the factor fitted for the curves' own cost model
    (experiments/engine_era.py), the roofline's where the table does not say."""
    from pagesim.experiments import engine_era

    row = dict.fromkeys(distserve.COLUMNS, math.nan)
    for cost_model in ("roofline", "calibrated"):
        text = distserve.era_reading(pd.DataFrame([{**row, "cost_model": cost_model}]))
        assert f"x{engine_era.gpu_time_scale(cost_model):g} ({cost_model})" in text
    assert f"x{engine_era.gpu_time_scale('roofline'):g} (roofline)" in distserve.era_reading(pd.DataFrame([row]))


def test_the_chart_draws_the_colocated_curve_at_the_fitted_factor():
    """The report's chart: beside ours and the artifact's, the colocated curve at the 2023 engines'
    factor (the file's fitted curve), in percent, named with its factor; none without a fit."""
    from pagesim.experiments import engine_era
    from pagesim.experiments import paper_plots as P

    found = engine_era.fit("roofline")
    curves = pd.DataFrame([{**dict.fromkeys(distserve.COLUMNS, math.nan), "design": "colocated",
                            "per_gpu_rate": 1.0, "slo_attainment": 0.9}])
    goodputs = pd.DataFrame(columns=["design", "goodput_per_gpu", "target", "paper_ratio_low"])
    fig = P.attainment_vs_rate(curves, goodputs, None, era=found)
    (trace,) = [t for t in fig.data if "vLLM 0.1.7" in t.name]
    assert trace.name == f"colocated at vLLM 0.1.7's speed (x{found['scale']:g}, fitted on it)"
    assert list(trace.y) == pytest.approx([100 * a for a in found["slo_attainment"]])
    assert not [t for t in P.attainment_vs_rate(curves, goodputs, None).data if "vLLM 0.1.7" in (t.name or "")]
