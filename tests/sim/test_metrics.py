"""The per-request records and the summary of a tiny run whose every time is worked out by hand.

Two requests on OPT-13B / A100-40GB with memory to spare (the vllm system, prefill-first):
A arrives at 0 with 16 prompt and 4 output tokens, B at 10 ms with 8 and 2. With the
hand-worked roofline (``conftest.py``), the iterations are::

    step  starts  runs                                   its price (d_k)
    0     t0 = 0  A's prefill (16 tokens)                3.02 + 20.6436 ms + attention 16 x 8 pairs
    1     t1      B's prefill (8); B arrived during 0,   3.02 + 20.6436 ms + attention 8 x 4 pairs
                  and prefill-first holds A's decode
    2     t2      decode A (context 17) and B (9)        3.04 + 20.6436 ms + 3 blocks x 19.68 x 0.658521 us
    3     t3      decode A (18); B finished at t3        3.02 + 20.6436 ms + 2 blocks x 19.68 x 0.658521 us
    4     t4      decode A (19); A finishes at t5        3.02 + 20.6436 ms + 2 blocks x 19.68 x 0.658521 us

(a decode reads whole 16-token blocks, each also costing 3.68 tokens' reads of work: vLLM v0's
paged kernel, ``HandRoofline``)

A's tokens come at t1 (its prefill), t3, t4, t5; B's at t2 and t3. So, by definition:

    TTFT   A: t1 - 0                       B: t2 - 0.01
    E2E    A: t5 - 0                       B: t3 - 0.01
    TPOT   A: (t5 - t1) / (4 - 1)          B: (t3 - t2) / (2 - 1)     (e2e - ttft) / (output - 1)
    ITL    A: t3 - t1, t4 - t3, t5 - t4    B: t3 - t2                 the gaps between tokens
    normalized latency  A: t5 / 4          B: (t3 - 0.01) / 2         e2e / output tokens

The run lasts t5: 2 requests, 6 output tokens and 6 + 24 tokens in all over t5 seconds.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def two_requests(opt13b_config, tiny_trace):
    return opt13b_config(1024, max_seq_len=64), tiny_trace((0.0, 16, 4), (0.01, 8, 2))


@pytest.fixture
def hand_times(opt13b_a100):
    """(d, t): the five step prices and the step boundaries t0 .. t5 of the table above."""
    d = [opt13b_a100.step(prefills=[(16, 0)]), opt13b_a100.step(prefills=[(8, 0)]),
         opt13b_a100.step(decode_contexts=[17, 9], kernel_block=16),
         opt13b_a100.step(decode_contexts=[18], kernel_block=16), opt13b_a100.step(decode_contexts=[19], kernel_block=16)]
    return d, np.concatenate([[0.0], np.cumsum(d)])


def test_step_times(simulate, two_requests, hand_times):
    d, t = hand_times
    steps = simulate(*two_requests).steps
    assert steps["num_prefill_tokens"].tolist() == [16, 8, 0, 0, 0]
    assert steps["num_decode_tokens"].tolist() == [0, 0, 2, 1, 1]
    assert steps["dt_s"].to_numpy() == pytest.approx(d, rel=1e-12)
    assert steps["start_s"].to_numpy() == pytest.approx(t[:5], rel=1e-12)


def test_request_records(simulate, two_requests, hand_times):
    _, t = hand_times
    r = simulate(*two_requests).requests.set_index("request_id")
    a, b = r.loc["r0"], r.loc["r1"]
    assert (a["status"], b["status"]) == ("finished", "finished")
    assert a["first_token_s"] == pytest.approx(t[1], rel=1e-12)
    assert b["first_token_s"] == pytest.approx(t[2], rel=1e-12)
    assert a["finish_s"] == pytest.approx(t[5], rel=1e-12)
    assert b["finish_s"] == pytest.approx(t[3], rel=1e-12)
    assert a["ttft_s"] == pytest.approx(t[1], rel=1e-12)
    assert b["ttft_s"] == pytest.approx(t[2] - 0.01, rel=1e-12)
    assert a["e2el_s"] == pytest.approx(t[5], rel=1e-12)
    assert b["e2el_s"] == pytest.approx(t[3] - 0.01, rel=1e-12)
    assert a["tpot_s"] == pytest.approx((t[5] - t[1]) / 3, rel=1e-12)
    assert b["tpot_s"] == pytest.approx(t[3] - t[2], rel=1e-12)
    assert a["normalized_latency_s"] == pytest.approx(t[5] / 4, rel=1e-12)
    assert b["normalized_latency_s"] == pytest.approx((t[3] - 0.01) / 2, rel=1e-12)


def test_summary(simulate, two_requests, hand_times):
    _, t = hand_times
    s = simulate(*two_requests).summary
    ms = 1e3
    assert s["completed"] == 2 and s["rejected"] == 0 and s["unfinished"] == 0
    assert s["duration_s"] == pytest.approx(t[5], rel=1e-12)
    assert s["request_throughput"] == pytest.approx(2 / t[5], rel=1e-12)
    assert s["output_throughput"] == pytest.approx(6 / t[5], rel=1e-12)
    assert s["total_token_throughput"] == pytest.approx(30 / t[5], rel=1e-12)
    ttft = [t[1], t[2] - 0.01]
    assert s["mean_ttft_ms"] == pytest.approx(np.mean(ttft) * ms, rel=1e-12)
    assert s["median_ttft_ms"] == pytest.approx(np.mean(ttft) * ms, rel=1e-12)  # the median of two
    tpot = [(t[5] - t[1]) / 3, t[3] - t[2]]
    assert s["mean_tpot_ms"] == pytest.approx(np.mean(tpot) * ms, rel=1e-12)
    itl = [t[3] - t[1], t[4] - t[3], t[5] - t[4], t[3] - t[2]]
    assert s["mean_itl_ms"] == pytest.approx(np.mean(itl) * ms, rel=1e-12)
    # the median ITL comes from a log-spaced histogram: a bin's geometric centre, within
    # 0.58 % of the true value; the 2nd and 3rd smallest gaps (t5 - t4, t3 - t2) are within
    # 0.1 % of each other, so either definition of the median of four lands here
    assert s["median_itl_ms"] == pytest.approx((t[5] - t[4]) * ms, rel=6e-3)
    e2el = [t[5], t[3] - 0.01]
    assert s["mean_e2el_ms"] == pytest.approx(np.mean(e2el) * ms, rel=1e-12)
    assert s["normalized_latency_s_per_token"] == pytest.approx(np.mean([t[5] / 4, (t[3] - 0.01) / 2]), rel=1e-12)


def test_one_output_token_has_no_tpot(simulate, opt13b_config, tiny_trace, opt13b_a100):
    # a single token comes from the prefill: no time per output token after the first
    # (output - 1 = 0), and the summary's TPOT has nothing to average; its normalized latency
    # is its whole latency, the prefill: 3.02 + 20.6436 ms + 16 x 8 pairs of attention
    result = simulate(opt13b_config(1024, max_seq_len=64), tiny_trace((0.0, 16, 1)))
    request = result.requests.iloc[0]
    assert np.isnan(request["tpot_s"])
    assert np.isnan(result.summary["mean_tpot_ms"])
    assert request["normalized_latency_s"] == pytest.approx(opt13b_a100.step(prefills=[(16, 0)]), rel=1e-12)


@pytest.mark.parametrize("system", ["vllm", "orca-oracle", "static", "sglang"])
def test_summary_is_the_same_float_with_or_without_a_step_table(system):
    """The time-weighted averages (batch, memory categories, blocks) are summed once, in the
    loop, whether or not the run keeps its step table: a ``--no-steps`` run's summary is the
    same, bit for bit."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.run import run_simulation
    from pagesim.traces.synth import make_workload

    trace = make_workload("sharegpt", rate=8.0, num_requests=300, seed=3)
    with_rows, without = (run_simulation(SimConfig.for_system(system, kv_gib=6.0, record_steps=keep), trace).summary
                          for keep in (True, False))
    for s in (with_rows, without):
        s.pop("wall_time_s")
    assert with_rows == without
    assert with_rows["avg_batch_size"] > 1 and with_rows["mem_token_states"] > 0
