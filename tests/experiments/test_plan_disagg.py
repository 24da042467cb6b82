"""`plan disaggregation`: the designs at N GPUs, the choice, the fewest GPUs each way, the band.

The choice logic is pinned with a runner whose verdicts follow a rule written here (each
answer worked out by hand below); two tiny traces pin it on real simulations, one where only
the aggregated design meets the SLO (the decode pool's memory), one where only the
disaggregated one does (prefills in the decode steps).
"""

from __future__ import annotations

import dataclasses
import json

import pandas as pd
import pytest

from pagesim.experiments import plan_disagg as PD
from pagesim.experiments.plan import PlanSetup
from pagesim.experiments.run_spec import RunSpec
from pagesim.experiments.slo import SLO
from pagesim.sim.cli import main
from pagesim.sim.cluster import run_cluster
from pagesim.sim.config import SimConfig
from pagesim.sim.disagg import run_disaggregated
from pagesim.traces.loaders import load_trace


class RuleRunner:
    """A runner whose probes pass by ``rule(spec, scale)`` (scale: the spec's cost_scale, 1 by
    default); goodput: 0.5 per aggregated replica, 1 per decode replica. Like plan's Runner it
    runs each distinct probe once and counts it."""

    slots = 1
    slo = SLO(ttft_p99_s=0.2)

    def __init__(self, rule):
        self.rule, self.memo, self.num_simulated = rule, {}, 0

    def requests(self, spec):  # one request, within the SLO at every scale read
        return requests_table([0.01], [0.001])

    def evaluate(self, specs):
        out = []
        for s in specs:
            key = (s.replicas, s.disagg.get("prefill_replicas", 0), s.disagg.get("decode_replicas", 0),
                   s.sim.get("cost_scale", 1.0))
            if key not in self.memo:
                self.num_simulated += 1
                ok = self.rule(s, key[3])
                goodput = s.disagg["decode_replicas"] if s.disaggregated else 0.5 * s.replicas
                self.memo[key] = {"passed": ok, "request_goodput": float(goodput),
                                  "slo_attainment": 1.0 if ok else 0.5, "p99_ttft_s": 0.1,
                                  "p99_tpot_s": 0.01, "fail_reason": "" if ok else "x"}
            out.append(dict(self.memo[key]))
        return out


def requests_table(ttft, tpot, status=None):
    """A probe's request table (experiments.probe.REQUEST_COLS) with these TTFTs and TPOTs,
    every request finished (unless ``status`` says otherwise) 1 s after arriving at 0."""
    n = len(ttft)
    return pd.DataFrame({"arrival_s": [0.0] * n, "finish_s": [1.0] * n,
                         "status": status or ["finished"] * n, "output_tokens": [10] * n,
                         "ttft_s": ttft, "tpot_s": tpot, "e2el_s": [1.0] * n,
                         "normalized_latency_s": [0.1] * n})


def test_goodput_by_slo_scale_reads_each_designs_requests_under_scaled_thresholds():
    # SLO: TTFT <= 0.2 s and TPOT <= 0.02 s; runs of 10 s on 2 GPUs (2 replicas of TP 1).
    # aggregated: TTFTs 0.1 and 0.3 (TPOTs 0.01): at s = 0.5 (0.1 s, 0.01 s) the first meets,
    # exactly; up to s = 1.25 (0.25 s) still the first only; from s = 1.5 (0.3 s) both:
    # goodput per GPU 1 / 10 / 2 = 0.05, then 2 / 10 / 2 = 0.1. 1:1: TTFT 0.05, TPOT 0.03 (over
    # 0.02 up to s = 1.25, within from 1.5 = 0.03 s) and one request rejected (never meets)
    tables = {"aggregated": requests_table([0.1, 0.3], [0.01, 0.01]),
              "1:1": requests_table([0.05, 0.0], [0.03, 0.0], ["finished", "rejected"])}

    class TableRunner:
        slo = SLO(ttft_p99_s=0.2, tpot_p99_s=0.02)

        def evaluate(self, specs):
            return [{"duration_s": 10.0} for _ in specs]

        def requests(self, spec):
            return tables["1:1" if spec.disaggregated else "aggregated"]

    rows = PD.goodput_by_slo_scale(PD.Designs(SETUP, 4.0), 2, TableRunner(), quick=False)
    got = {(r["design"], r["slo_scale"]): (r["goodput_per_gpu"], r["slo_attainment"]) for r in rows}
    assert PD.SLO_SCALES == (0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
    for scale in PD.SLO_SCALES:
        both = scale >= 1.5
        assert got[("aggregated", scale)] == pytest.approx((0.1 if both else 0.05, 1.0 if both else 0.5))
        assert got[("1:1", scale)] == pytest.approx((0.05 if both else 0.0, 0.5 if both else 0.0))


def interference(spec, scale: float) -> bool:
    # decode steps that carry prefills miss the SLO unless the load is spread thin: aggregated
    # needs 5 replicas (6 when the GPU is slower, 4 when faster); a split needs 2 decode
    # replicas (3 slower, 1 faster) and any prefill pool
    need = {1.0: 0, 1.1: 1, 0.9: -1}[round(scale, 6)]
    if spec.disaggregated:
        return spec.disagg["decode_replicas"] >= 2 + need
    return spec.replicas >= 5 + need


SETUP = PlanSetup(sim={"model": "llama-2-7b", "gpu": "a100-80gb"}, workload="sharegpt")


def test_splits_every_and_quick():
    assert PD.splits(4) == [(1, 3), (2, 2), (3, 1)]
    # quick at 8: a quarter, a half and three quarters of 8 = 2, 4, 6
    assert PD.splits(8, quick=True) == [(2, 6), (4, 4), (6, 2)]
    # at 2: round(0.5) = 0 -> 1, round(1) = 1, round(1.5) = 2 -> 1: the one split
    assert PD.splits(2, quick=True) == [(1, 1)]


def test_choose_takes_the_most_goodput_and_the_aggregated_on_a_tie():
    rows = [{"design": "aggregated", "passed": True, "request_goodput": 2.0},
            {"design": "1:3", "passed": True, "request_goodput": 2.5},
            {"design": "2:2", "passed": False, "request_goodput": 3.0}]  # failing: never chosen
    assert PD.choose(rows)["design"] == "1:3"
    rows[1]["request_goodput"] = 2.0
    assert PD.choose(rows)["design"] == "aggregated"
    assert PD.choose([dict(r, passed=False) for r in rows]) is None


def test_only_disaggregation_meets_at_four_gpus_and_the_fewest_each_way():
    runner = RuleRunner(interference)
    r = PD.disaggregation(SETUP, 4.0, 4, runner)
    # at 4: aggregated (4 < 5) fails; 1:3 (D 3) and 2:2 (D 2) pass, 3:1 (D 1) fails;
    # goodput 3 > 2: the choice is 1:3 (prefill share 1/4)
    assert [(d["design"], d["passed"]) for d in r["designs"]] == [
        ("aggregated", False), ("1:3", True), ("2:2", True), ("3:1", False)]
    assert r["choice"] == "1:3"
    # fewest aggregated from 4: 4 fails, 5 passes -> 5 GPUs. Disaggregated from 4: 1:3 passes;
    # at 3 the split nearest a 1/4 prefill share, 1:2 (|1/3 - 1/4| < |2/3 - 1/4|), passes; at 2
    # 1:1 (D 1) fails -> 3 GPUs as 1:2
    fewest = {f["way"]: (f["gpus"], f["design"]) for f in r["fewest"]}
    assert fewest == {"aggregated": (5, "aggregated"), "disaggregated": (3, "1:2")}
    # runs: the 4 designs at 4, aggregated 5 (4 again is memoized), 1:2, 1:1 = 7; 2:1 is never
    # run (3's probing stopped at its first pass)
    assert r["num_simulated"] == 7


def test_the_band_probes_the_slower_and_faster_gpu():
    runner = RuleRunner(interference)
    r = PD.disaggregation(SETUP, 4.0, 4, runner, scales=[1.1, 0.9])
    # slow (x 1.1): aggregated needs 6, splits D >= 3: at 4 only 1:3 passes; fast (x 0.9):
    # aggregated needs 4 (passes at 4, goodput 2), every split D >= 1 passes; 1:3's goodput 3 wins
    meets = {d["design"]: (d["meets_slow"], d["meets_fast"]) for d in r["designs"]}
    assert meets == {"aggregated": (False, True), "1:3": (True, True), "2:2": (False, True),
                     "3:1": (False, True)}
    assert (r["error_band"]["choice_slow"], r["error_band"]["choice_fast"]) == ("1:3", "1:3")
    # fewest slow: aggregated 5 fails, 6 passes; disaggregated from 3: 1:2 and 2:1 fail (D < 3),
    # at 4 1:3 passes -> 4. Fast: aggregated 5, 4 pass, 3 fails -> 4; disaggregated 3 (1:2), 2
    # (1:1, D 1) pass, 2 is the least -> 2
    assert r["error_band"]["fewest_slow"] == {"aggregated": 6, "disaggregated": 4}
    assert r["error_band"]["fewest_fast"] == {"aggregated": 4, "disaggregated": 2}


def test_no_design_meets():
    r = PD.disaggregation(SETUP, 4.0, 2, RuleRunner(lambda spec, scale: False), max_gpus=3)
    assert r["choice"] is None
    assert [f["gpus"] for f in r["fewest"]] == [None, None]
    assert "no aggregated design of up to 3 GPUs" in r["fewest"][0]["note"]


def run_plan(tmp_path, capsys, trace: str, *args: str) -> dict:
    path = tmp_path / "trace.csv"
    path.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n" + trace)
    rc = main(["plan", "disaggregation", "--trace", str(path), "--model", "llama-2-7b",
               "--gpu", "a100-80gb", "--workers", "1", "--no-steady-check", "--no-error-band",
               "--cache-dir", str(tmp_path / "cache"), "--json", *args])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_decode_memory_forces_the_aggregated_design_at_two_gpus(tmp_path, capsys):
    # two requests of 600 + 400 tokens, 10 ms apart; a 0.5 GiB KV pool holds 1024 tokens of
    # Llama-2-7B (512 KiB a token), 64 blocks of 16: one request's 600-token prompt takes 38,
    # two take 76. Aggregated (round-robin): one request per replica, each TTFT one prefill
    # (600 tokens, ~0.05 s). 1:1: the decode replica admits b only when a has finished, its
    # 399 decode steps each >= 13.5 GB of weights / 2.04 TB/s = 6.6 ms: b's TTFT >= 2.6 s > 1 s.
    # 3 GPUs as 1:2 give b its own decode replica; one aggregated replica repeats the wait.
    r = run_plan(tmp_path, capsys, "a,0.0,600,400\nb,0.01,600,400\n", "--rate", "100",
                 "--gpus", "2", "--max-gpus", "3", "--kv-gib", "0.5", "--max-seq-len", "1024",
                 "--slo-ttft-p99", "1")
    designs = {d["design"]: d for d in r["designs"]}
    assert designs["aggregated"]["passed"] and designs["aggregated"]["p99_ttft_s"] < 1
    assert not designs["1:1"]["passed"] and designs["1:1"]["p99_ttft_s"] > 2.6
    assert r["choice"] == "aggregated"
    assert {f["way"]: (f["gpus"], f["design"]) for f in r["fewest"]} == {
        "aggregated": (2, "aggregated"), "disaggregated": (3, "1:2")}
    # the same runs read under the SLO x s: at s = 1 each design's goodput per GPU is its
    # row's; 1:1's b misses the TTFT at every scale read (> 2.6 s > 2 x 1 s), its a meets
    scaled = {(x["design"], x["slo_scale"]): x for x in r["slo_scales"]}
    for name, d in designs.items():
        assert scaled[(name, 1.0)]["goodput_per_gpu"] == pytest.approx(d["goodput_per_gpu"])
    assert {x["slo_attainment"] for x in r["slo_scales"] if x["design"] == "1:1"} == {0.5}


def test_out_and_report_write_the_designs(tmp_path, capsys):
    # the same two requests as above: at 2 GPUs the designs are aggregated and 1:1
    run_plan(tmp_path, capsys, "a,0.0,600,400\nb,0.01,600,400\n", "--rate", "100", "--gpus", "2",
             "--max-gpus", "3", "--kv-gib", "0.5", "--max-seq-len", "1024", "--slo-ttft-p99", "1",
             "--out", str(tmp_path / "out"), "--report")
    designs = (tmp_path / "out" / "designs.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in designs] == ["design", "aggregated", "1:1"]
    assert (tmp_path / "out" / "fewest_gpus.csv").is_file()
    scales = (tmp_path / "out" / "slo_scales.csv").read_text().splitlines()
    assert scales[0] == "design,slo_scale,slo_attainment,goodput_per_gpu" and len(scales) == 1 + 2 * 6
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Goodput per GPU" in report and "Goodput per GPU against the SLO&#x27;s scale" in report


def test_prefills_in_decode_steps_force_the_disaggregated_design(tmp_path, capsys):
    # a: 16 prompt tokens, 400 out, at 0; b1..b12: 4000-token prompts, 2 out, every 0.25 s.
    # Aggregated (round-robin): a shares replica 0 with b2, b4, ..., b12, whose prefills (each
    # >= 2 x 6.7e9 x 4000 / 312e12 = 0.17 s of an A100's peak FLOPs) fall in a's decode steps:
    # a's TPOT >= its TPOT without them + 6 x 0.17 / 399 = + 2.6 ms. 1:1: the decode replica's
    # steps carry no prefill (b's decodes join a's, a token each), so a's TPOT is that without.
    rows = "a,0.0,16,400\n" + "".join(f"b{i},{0.25 * i:.2f},4000,2\n" for i in range(1, 13))
    path = tmp_path / "a.csv"
    path.write_text("request_id,arrival_s,prompt_tokens,output_tokens\n" + rows)
    trace = load_trace(path)
    cfg = SimConfig.for_system("vllm-v1", model="llama-2-7b", gpu="a100-80gb", max_seq_len=8192)
    tpot = [res.requests.set_index("request_id").loc["a", "tpot_s"]
            for res in (run_cluster(cfg, trace, 2, "round-robin"),
                        run_disaggregated(cfg, cfg, trace, 1, 1))]
    assert tpot[0] >= tpot[1] + 6 * 0.17 / 399
    # the plan at a p99 TPOT of 11 ms: between the two runs' highest TPOTs (a's in the aggregated
    # run, 12.0 ms on the A100 as its measured operations price it; 10.1 ms in the 1:1 run)
    r = run_plan(tmp_path, capsys, rows, "--rate", "4", "--gpus", "2", "--max-gpus", "2",
                 "--max-seq-len", "8192", "--slo-tpot-p99", "0.011")
    designs = {d["design"]: d for d in r["designs"]}
    assert not designs["aggregated"]["passed"] and designs["1:1"]["passed"]
    assert r["choice"] == "1:1"
    assert [f["gpus"] for f in r["fewest"]] == [None, 2]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "4"], "needs the target rate: --rate R"),
    (["--rate", "2"], "needs the GPU count: --gpus N"),
    (["--rate", "2", "--gpus", "a100-80gb"], "needs the GPU count: --gpus N"),
    (["--rate", "2", "--gpus", "4", "--systems", "sglang"],
     "--systems: 'plan disaggregation' plans vllm-v1"),
    (["--rate", "2", "--gpus", "4", "--kv-link", "carrier-pigeon"], "--kv-link: unknown link"),
    (["--rate", "2", "--gpus", "4", "--router", "prefix-affinity"],
     "not offered with disaggregation"),
    (["--rate", "2", "--gpus", "4", "--max-gpus", "3"], "--max-gpus 3 is below --gpus 4"),
    (["--rate", "2", "--gpus", "4", "--start-rate", "3"], "--start-rate has no meaning"),
    (["--rate", "2", "--gpus", "4", "--rtol", "0.1"], "--rtol has no meaning"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    rc = main(["plan", "disaggregation", "--workload", "sharegpt", "--num-requests", "20",
               "--model", "llama-2-7b", "--gpu", "a100-80gb", "--slo-ttft-p99", "1",
               "--cache-dir", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_disaggregated_probe_has_its_own_key_and_others_keep_theirs():
    plain = RunSpec(system="vllm-v1")
    cluster = RunSpec(system="vllm-v1", replicas=4, router="round-robin")
    split = RunSpec(system="vllm-v1", replicas=1, router="round-robin",
                    disagg={"prefill_replicas": 1, "decode_replicas": 3, "kv_link": "ib-ndr"})
    # the pools' fields are in the key of a disaggregated probe only: a plain run's canonical
    # form (and so its cache key) is what it was before they existed
    assert "disagg" not in plain.canonical() and "disagg" not in cluster.canonical()
    assert split.canonical()["disagg"] == {"decode_replicas": 3, "kv_link": "ib-ndr", "prefill_replicas": 1}
    other_split = dataclasses.replace(split, disagg={**split.disagg, "prefill_replicas": 2, "decode_replicas": 2})
    other_link = dataclasses.replace(split, disagg={**split.disagg, "kv_link": "pcie"})
    keys = {s.key(salt="x") for s in (plain, cluster, split, other_split, other_link)}
    assert len(keys) == 5
