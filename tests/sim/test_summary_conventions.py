"""summary.json's conventions from ``vllm bench serve``: std_* (population), total_input/output_tokens,
max_concurrent_requests, --percentile-metrics / --metric-percentiles, --goodput -> request_goodput, and
the prefix-cache hit rate. Every expected number is worked by hand from a timeline where each
iteration takes 1 s (see tests/sim/test_engine.py's ConstExecutor)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from pagesim.sim.cli import main
from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import SummaryOptions
from pagesim.sim.run import run_simulation
from pagesim.sim.args import parse_goodput
from tests.sim.helpers import ConstExecutor, small_cfg, trace

# Two requests, every iteration 1 s, vLLM's prefill-first policy:
#   A arrives 0.0 (prompt 4, output 3); B arrives 0.5 (prompt 4, output 2)
#   [0,1) prefill A -> A's token 1 at 1;  [1,2) prefill B (admitted at 1) -> B's token 1 at 2
#   [2,3) decode A, B -> B's token 2 at 3, B done;  [3,4) decode A -> A's token 3 at 4, A done
# A: TTFT 1, E2EL 4, TPOT (4 - 1) / 2 = 1.5; ITLs 3 - 1 = 2 and 4 - 3 = 1
# B: TTFT 2 - 0.5 = 1.5, E2EL 3 - 0.5 = 2.5, TPOT (3 - 2) / 1 = 1; ITL 3 - 2 = 1
TWO = [(0.0, 4, 3), (0.5, 4, 2)]


def two_requests(**options):
    return run_simulation(small_cfg("vllm"), trace(TWO), executor=ConstExecutor(1.0),
                          summary_options=SummaryOptions(**options)).summary


def test_latency_stats_by_hand():
    s = two_requests()
    assert s["duration_s"] == 4.0 and s["completed"] == 2
    # population standard deviation (vLLM's np.std): TTFT {1000, 1500} ms -> 250 (the sample one is 353.6)
    assert (s["mean_ttft_ms"], s["median_ttft_ms"], s["std_ttft_ms"]) == pytest.approx((1250, 1250, 250))
    assert s["p99_ttft_ms"] == pytest.approx(1000 + 0.99 * 500)  # numpy's linear interpolation
    assert (s["mean_tpot_ms"], s["std_tpot_ms"], s["p99_tpot_ms"]) == pytest.approx((1250, 250, 1000 + 0.99 * 500))
    assert (s["mean_e2el_ms"], s["std_e2el_ms"], s["p99_e2el_ms"]) == pytest.approx((3250, 750, 2500 + 0.99 * 1500))
    # ITLs {2, 1, 1} s: mean 4/3 exactly; std sqrt(((2 - 4/3)^2 + 2 (1 - 4/3)^2) / 3) = sqrt(2/9) s, binned:
    # within 0.58 % of the RMS ITL sqrt((4 + 1 + 1) / 3) = sqrt(2) s (sim/metrics.py's docstring)
    assert s["mean_itl_ms"] == pytest.approx(4000 / 3)
    assert abs(s["std_itl_ms"] - 1000 * math.sqrt(2 / 9)) <= 0.0058 * 1000 * math.sqrt(2)
    assert abs(s["p99_itl_ms"] - 2000) <= 0.0058 * 2000  # ITL p99 of {1, 1, 2}: 2 (binned)
    # tokens of finished requests: in 4 + 4, out 3 + 2; throughputs are those over 4 s
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (8, 5)
    assert s["output_throughput"] == pytest.approx(5 / 4) and s["total_token_throughput"] == pytest.approx(13 / 4)
    # A in flight over [0, 4), B over [0.5, 3): two at once
    assert s["max_concurrent_requests"] == 2
    assert "request_goodput" not in s and "prefix_cache_hit_rate" not in s


def test_token_totals_count_finished_requests_and_every_sample():
    # r0: prompt 8 sampled n=3 ways, 4 tokens each -> in 8 (the prompt is read once), out 3 x 4 = 12;
    # r1: prompt 30 + output 30 > max_seq_len 32 -> rejected, so none of its tokens count
    res = run_simulation(small_cfg("vllm"), trace([(0.0, 8, 4), (0.0, 30, 30)], n=[3, 1]),
                         executor=ConstExecutor(1.0))
    s = res.summary
    assert (s["completed"], s["rejected"]) == (1, 1)
    assert (s["total_input_tokens"], s["total_output_tokens"]) == (8, 12)
    assert s["output_throughput"] == pytest.approx(s["total_output_tokens"] / s["duration_s"])


def test_peak_concurrency_counts_a_departure_before_an_arrival_at_the_same_instant():
    # A (0, 4, 3) alone finishes at 3 ([0,1) prefill, [1,2) and [2,3) decodes); B arrives at 3.0 and runs
    # [3,4) alone: in flight over [0, 3) and [3, 4), never together (vLLM's half-open intervals)
    res = run_simulation(small_cfg("vllm"), trace([(0.0, 4, 3), (3.0, 4, 1)]), executor=ConstExecutor(1.0))
    assert res.requests.finish_s.iloc[0] == 3.0
    assert res.summary["max_concurrent_requests"] == 1


def test_peak_concurrency_by_hand():
    """vLLM's sweep (serve.py lines 713-734), by hand: [0, 3), [1, 2), [2, 5), [2, 4), [5, 6):
    at 2 the second leaves before two arrive (3 in flight), at 5 the third leaves as the last
    arrives; requests given out of time order; zero-length [4, 4) counts with no one."""
    from pagesim.sim.metrics import peak_concurrency

    start = np.array([2.0, 0.0, 5.0, 1.0, 2.0])
    end = np.array([5.0, 3.0, 6.0, 2.0, 4.0])
    assert peak_concurrency(start, end) == 3
    assert peak_concurrency(np.array([4.0, 0.0]), np.array([4.0, 10.0])) == 1
    assert peak_concurrency(np.zeros(0), np.zeros(0)) == 0
    assert peak_concurrency(np.zeros(3), np.ones(3)) == 3


def test_metric_percentiles_choose_the_keys():
    s = two_requests(percentile_metrics=("ttft", "itl"), percentiles=(0.0, 50.0, 90.0, 99.9))
    # TTFT {1000, 1500}: p = 1000 + (p / 100) * 500; vLLM names 99.9 "p99.9"; p0 is the lowest value
    assert s["p0_ttft_ms"] == pytest.approx(1000)
    assert abs(s["p0_itl_ms"] - 1000) <= 0.0058 * 1000
    assert s["p50_ttft_ms"] == pytest.approx(1250)
    assert s["p90_ttft_ms"] == pytest.approx(1450)
    assert s["p99.9_ttft_ms"] == pytest.approx(1499.5)
    assert abs(s["p50_itl_ms"] - 1000) <= 0.0058 * 1000  # median ITL of {1, 1, 2}: 1 s
    assert abs(s["p90_itl_ms"] - 2000) <= 0.0058 * 2000  # the third of three values: 2 s
    # only the chosen: no p99 keys, nothing for TPOT / E2EL; mean, median and std stay for all four
    assert not [k for k in s if k.startswith("p99_") or k.startswith("p50_tpot") or k.startswith("p50_e2el")]
    for m in ("ttft", "tpot", "itl", "e2el"):
        assert {f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms"} <= set(s)
    assert s["mean_e2el_ms"] == pytest.approx(3250)


def test_default_options_keep_the_historical_keys():
    s = two_requests()
    assert {k for k in s if k.startswith("p") and k.endswith("_ms")} == {
        "p99_ttft_ms", "p99_tpot_ms", "p99_itl_ms", "p99_e2el_ms"}


def test_goodput_thresholds_are_milliseconds_and_inclusive():
    assert parse_goodput(["ttft:1500", "e2el:3000"]) == (("ttft", 1.5), ("e2el", 3.0))
    # request_goodput = requests meeting every threshold / duration (4 s)
    cases = [(["ttft:1500"], 2),  # B's TTFT is exactly 1.5 s: met (value <= threshold)
             (["ttft:1499"], 1),  # only A (TTFT 1 s)
             (["tpot:1200"], 1),  # only B (TPOT 1 s; A's is 1.5 s)
             (["e2el:3000"], 1),  # only B (E2EL 2.5 s)
             (["ttft:1200", "tpot:1200"], 0)]  # A meets TTFT, B meets TPOT: neither meets both
    for pairs, good in cases:
        s = two_requests(goodput_slo_s=parse_goodput(pairs))
        assert s["request_goodput"] == pytest.approx(good / 4), pairs
        assert s["request_throughput"] == pytest.approx(2 / 4)


def test_a_single_output_token_meets_any_tpot_threshold():
    # one request (0, 4, 1): [0,1) prefill samples its only token; no TPOT; duration 1 s
    res = run_simulation(small_cfg("vllm"), trace([(0.0, 4, 1)]), executor=ConstExecutor(1.0),
                         summary_options=SummaryOptions(goodput_slo_s=parse_goodput(["tpot:1"])))
    assert math.isnan(res.requests.tpot_s.iloc[0])
    assert res.summary["request_goodput"] == pytest.approx(1.0)


def prefix_trace(hashes_b=(1, 2, 4)):
    # block 4, hash blocks of 4 tokens: A (prompt 12, hashes 1 2 3) at 0 finishes at 2; B (prompt 12) at 10
    t = trace([(0.0, 12, 2), (10.0, 12, 2)], prefix_hashes=[(1, 2, 3), tuple(hashes_b)])
    t.attrs["hash_block_tokens"] = 4
    return t


def test_prefix_cache_hit_rate_by_hand():
    # A looks up 12 tokens, finds none; its three full blocks stay cached after it finishes.
    # B (hashes 1 2 4) shares the first two: 8 tokens hit of 12 looked up -> (0 + 8) / (12 + 12) = 1/3
    res = run_simulation(small_cfg("vllm", prefix_caching=True), prefix_trace(), executor=ConstExecutor(1.0))
    assert res.summary["prefix_cache_hit_rate"] == pytest.approx(1 / 3)
    # B with A's hashes: at most prompt - 1 = 11 tokens may hit, so 2 whole blocks: 8 again
    res = run_simulation(small_cfg("vllm", prefix_caching=True), prefix_trace((1, 2, 3)), executor=ConstExecutor(1.0))
    assert res.summary["prefix_cache_hit_rate"] == pytest.approx(8 / 24)
    # with other hashes nothing hits
    res = run_simulation(small_cfg("vllm", prefix_caching=True), prefix_trace((7, 8, 9)), executor=ConstExecutor(1.0))
    assert res.summary["prefix_cache_hit_rate"] == 0.0


def test_no_prefix_cache_hit_rate_without_prefix_caching():
    res = run_simulation(small_cfg("vllm"), prefix_trace(), executor=ConstExecutor(1.0))
    assert "prefix_cache_hit_rate" not in res.summary
    # an Orca (contiguous) manager ignores --prefix-caching: nothing to report
    res = run_simulation(small_cfg("orca-oracle", prefix_caching=True), prefix_trace(), executor=ConstExecutor(1.0))
    assert "prefix_cache_hit_rate" not in res.summary


# ------------------------------------------------------------------------------ the command line


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def mooncake_file(tmp_path):
    # Mooncake's 512-token hash blocks (ceil(1100 / 512) = 3 per prompt); prompts of 1100 tokens at 0 and 100 s. B shares the first hash only:
    # the 32 blocks of 16 tokens in [0, 512) hit, so 512 of 1100 + 1100 tokens looked up: 23.3 %
    p = tmp_path / "two.jsonl"
    rows = [{"timestamp": 0, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 4]},
            {"timestamp": 100000, "input_length": 1100, "output_length": 8, "hash_ids": [1, 3, 5]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_cli_prints_the_prefix_cache_hit_rate(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "simulate", "--trace", str(mooncake_file(tmp_path)), "--prefix-caching",
                           "--model", "opt-13b", "--kv-gib", "4", "--no-progress")
    assert rc == 0, err
    assert [line.split()[-2:] for line in out.splitlines() if line.startswith("prefix cache hit rate")] == [
        [f"{100 * 512 / 2200:.1f}", "%"]]
    rc, out, err = run_cli(capsys, "simulate", "--trace", str(mooncake_file(tmp_path)), "--model", "opt-13b",
                           "--kv-gib", "4", "--no-progress")
    assert rc == 0 and "prefix cache" not in out


def test_cli_options_reach_summary_json_and_the_table(tmp_path, capsys):
    rc, out, err = run_cli(capsys, "simulate", "--duration", "20", "--model", "opt-13b", "--kv-gib", "2", "--no-progress",
                           "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "50,90",
                           "--goodput", "ttft:2000", "tpot:100", "--out", str(tmp_path / "run"))
    assert rc == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"p50_ttft_ms", "p90_ttft_ms", "p50_e2el_ms", "p90_e2el_ms", "request_goodput",
            "total_input_tokens", "total_output_tokens", "max_concurrent_requests",
            "std_ttft_ms", "std_tpot_ms", "std_itl_ms", "std_e2el_ms"} <= set(s)
    assert not {"p99_ttft_ms", "p50_tpot_ms", "p50_itl_ms"} & set(s)
    assert 0 <= s["request_goodput"] <= s["request_throughput"]
    labels = {re.split(r"\s{2,}", line, maxsplit=1)[0] for line in out.splitlines()}
    assert {"TTFT mean / std / p50 / p90", "TPOT mean / std", "ITL mean / std", "E2EL mean / std / p50 / p90",
            "request goodput", "tokens in / out", "peak concurrent requests"} <= labels


@pytest.mark.parametrize("argv, needle", [
    (["--goodput", "0.9"], "KEY:MS"),
    (["--goodput", "ttft:fast"], "KEY:MS"),
    (["--goodput", "itl:30"], "unknown metric 'itl'"),
    (["--goodput", "ttft:0"], "positive"),
    (["--goodput", "ttft:nan"], "positive"),
    (["--goodput", "ttft:1", "ttft:2"], "twice"),
    (["--percentile-metrics", "ttft,latency"], "--percentile-metrics"),
    (["--percentile-metrics", ","], "--percentile-metrics"),
    (["--metric-percentiles", "101"], "--metric-percentiles"),
    (["--metric-percentiles", "-1"], "--metric-percentiles"),
    (["--metric-percentiles", "p99"], "--metric-percentiles"),
    (["--metric-percentiles", ""], "--metric-percentiles"),
])
def test_bad_summary_options_exit_2_with_one_line(capsys, argv, needle):
    rc, _, err = run_cli(capsys, "simulate", "--duration", "5", "--no-progress", *argv)
    assert rc == 2 and needle in err, err
    assert err.startswith("pagesim: error:") and err.count("\n") == 1 and "Traceback" not in err


def test_a_nan_percentile_is_refused():
    with pytest.raises(ConfigError, match="--metric-percentiles"):
        SummaryOptions(percentiles=(np.nan,))


def test_the_request_tables_latencies_are_computed_for_the_rows_asked():
    """The request table's latency columns (``sim.metrics.RowsOf``) give the rows a writer asks
    for, a block at a time, and whole in a frame: the same numbers as TWO's by hand (A: TTFT 1,
    TPOT 1.5, E2EL 4; B: 1.5, 1, 2.5)."""
    from pagesim.sim import metrics

    result = run_simulation(small_cfg(), trace(TWO), executor=ConstExecutor(1.0))
    columns = result.request_table()
    assert isinstance(columns["ttft_s"], metrics.RowsOf) and len(columns["ttft_s"]) == 2
    assert columns["ttft_s"][1:2].tolist() == [1.5] and columns["tpot_s"][0:1].tolist() == [1.5]
    assert columns["e2el_s"][:].tolist() == [4.0, 2.5]
    assert columns["normalized_latency_s"][:].tolist() == [4.0 / 3, 2.5 / 2]
    frame = result.requests
    assert frame["ttft_s"].tolist() == [1.0, 1.5] and frame["tpot_s"].tolist() == [1.5, 1.0]
