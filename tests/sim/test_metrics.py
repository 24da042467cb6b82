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



def overload_case(arrivals, first_tokens, finishes, statuses=None):
    from pagesim.sim.metrics import overload_summary
    from pagesim.sim.requests import Status

    status = np.full(len(arrivals), Status.FINISHED) if statuses is None else np.asarray(statuses)
    return overload_summary(np.array(arrivals, float), np.array(first_tokens, float), np.array(finishes, float),
                            status)


def test_overload_rule_by_hand():
    """20 requests arrive one per second, t = 0 .. 19: a window of 19 s, 20/19 = 1.053 req/s.
    The engine serves the first 5 at once (first token 0.5 s after arrival, finished 1 s after):
    5 finished by t = 19, 5/19 = 0.263 req/s; the other 15 get their first token at t = 30, so 15
    wait at the last arrival, >= max(10, 10 % of 20): overloaded."""
    arrivals = np.arange(20.0)
    served = arrivals < 5
    s = overload_case(arrivals, np.where(served, arrivals + 0.5, 30.0), np.where(served, arrivals + 1.0, 40.0))
    assert s["arrival_window_s"] == 19.0
    assert s["arrival_rate"] == pytest.approx(20 / 19)
    assert s["completion_rate_while_arriving"] == pytest.approx(5 / 19)
    assert s["queue_at_last_arrival"] == 15
    assert s["overloaded"] is True


def test_overload_queue_bounds_by_hand():
    """40 requests, one per second (t = 0 .. 39), a window of 39 s:
    (a) 30 get a first token 0.1 s after arrival, the first 20 of them finish 1 s after it: 20
        finished, 10 wait at the last arrival, >= max(10, 4): overloaded;
    (b) the same with 31 served: 9 wait, below 10: not overloaded, the rates as in (a);
    (c) every first token 0.1 s after arrival, every finish at t = 100: none finished while
        arriving, but only the last arrival waits: a lag of finishes alone is not overload.
    200 requests (t = 0 .. 199), those served finishing 1 s after arrival:
    (d) 180 served, 20 wait: 10 % of 200 exactly, overloaded; (e) 181 served, 19 wait: not."""
    a = np.arange(40.0)
    s = overload_case(a, np.where(a < 30, a + 0.1, 50.0), np.where(a < 20, a + 1.0, 60.0))
    assert (s["completion_rate_while_arriving"] * 39, s["queue_at_last_arrival"], s["overloaded"]) == \
        (pytest.approx(20), 10, True)
    s = overload_case(a, np.where(a < 31, a + 0.1, 50.0), np.where(a < 20, a + 1.0, 60.0))
    assert (s["completion_rate_while_arriving"] * 39, s["queue_at_last_arrival"], s["overloaded"]) == \
        (pytest.approx(20), 9, False)
    s = overload_case(a, a + 0.1, np.full(40, 100.0))
    assert (s["completion_rate_while_arriving"], s["queue_at_last_arrival"], s["overloaded"]) == (0.0, 1, False)
    a = np.arange(200.0)
    for served, waiting, overloaded in ((180, 20, True), (181, 19, False)):
        s = overload_case(a, np.where(a < served, a + 0.1, 300.0), np.where(a < served, a + 1.0, 400.0))
        assert (s["queue_at_last_arrival"], s["overloaded"]) == (waiting, overloaded)


def test_overload_counts_a_first_token_at_the_last_arrival_and_skips_rejected():
    """A first token at the last arrival's instant is not waiting; a rejected request never
    waits; a request with no first token (NaN: unfinished) does. 12 arrivals at t = 0 .. 11:
    request 0 finished (first token at t = 11, the last arrival), request 1 rejected, the other
    10 with no first token: 10 waiting, >= max(10, 1.2), and 12 > 1.1 x 0: overloaded."""
    from pagesim.sim.requests import Status

    a = np.arange(12.0)
    first = np.r_[11.0, np.full(11, np.nan)]
    finish = np.r_[20.0, np.full(11, np.nan)]
    status = np.r_[Status.FINISHED, Status.REJECTED, np.full(10, Status.WAITING)]
    s = overload_case(a, first, finish, status)
    assert (s["queue_at_last_arrival"], s["overloaded"]) == (10, True)


def test_requests_their_clients_gave_up_on_after_the_last_arrival_were_in_its_queue():
    """20 arrivals at t = 0 .. 19, the client's timeout 10 s: requests 0-4 served (first token
    0.5 s after arrival); the other 15 never get one and their clients give up. Those that
    arrived after t = 19 - 10 = 9 (10-19: ten) gave up after the last arrival, so they waited at
    it: a queue of 10, >= max(10, 2), overloaded; requests 5-9 had given up by then (each at its
    arrival + 10 <= 19). Without the timeout's reading (codes not given) every rejected request
    is out of the queue: 0 waiting, not overloaded. A request rejected for another reason
    (a prompt that never fits) never waits, whenever it arrived."""
    from pagesim.sim.core import state
    from pagesim.sim.metrics import overload_summary
    from pagesim.sim.requests import Status

    a = np.arange(20.0)
    served = a < 5
    first = np.where(served, a + 0.5, np.nan)
    finish = np.where(served, a + 1.0, np.nan)
    status = np.where(served, Status.FINISHED, Status.REJECTED)
    codes = np.where(served, 0, state.REJECT_CLIENT_TIMEOUT).astype(np.int8)
    s = overload_summary(a, first, finish, status, codes, 10.0)
    assert (s["queue_at_last_arrival"], s["overloaded"]) == (10, True)
    assert overload_summary(a, first, finish, status)["queue_at_last_arrival"] == 0
    codes[10:] = state.REJECT_NEVER_FITS
    assert overload_summary(a, first, finish, status, codes, 10.0)["queue_at_last_arrival"] == 0


def test_a_run_whose_every_request_timed_out_is_overloaded():
    """End to end: OPT-13B on an A100-40GB under vLLM v1, 200 prompts of 1,800 tokens and 200 of
    output sent 50 a second with clients that wait 1 s: no request finishes within its client's
    second, every one is given up on; the summary says overloaded, its queue at the last arrival
    the 50 requests sent in the second before it (the others had given up by then)."""
    import pandas as pd

    from pagesim.sim.config import SimConfig
    from pagesim.sim.run import run_simulation

    n = 200
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": np.arange(n) / 50.0,
                          "prompt_tokens": np.full(n, 1800), "output_tokens": np.full(n, 200)})
    cfg = SimConfig.for_system("vllm-v1", client_timeout_s=1.0)
    s = run_simulation(cfg, trace).summary
    assert s["rejected"] == n
    assert (s["overloaded"], s["queue_at_last_arrival"]) == (True, 50)


def test_an_offline_burst_is_not_overloaded():
    """Every request at t = 0 (an offline throughput run): no arrival window, no rates, and
    never overloaded, however many wait."""
    s = overload_case(np.zeros(100), np.linspace(1, 50, 100), np.linspace(2, 60, 100))
    assert s["arrival_window_s"] == 0.0 and np.isnan(s["arrival_rate"])
    assert np.isnan(s["completion_rate_while_arriving"])
    assert (s["queue_at_last_arrival"], s["overloaded"]) == (100, False)


def test_the_saturated_throughput_is_the_second_halfs_finishes_while_requests_wait():
    """60 requests at 0: the last first token at 10 s (someone waited until then); finishes at
    1, 2, ..., 40 s and 20 at 12 s. The second half of the full phase, (5, 10], holds the finishes
    at 6..10 s: 5, under 20, so too few (NaN); with 4 finishing a second from 6 s (20 more in
    (5, 10]), 25 in 5 s: 5 req/s (the whole run's 60 / 40 s = 1.5 counts its drain)."""
    from pagesim.sim.metrics import saturated_throughput
    from pagesim.sim.requests import Status

    arrival, first = np.zeros(60), np.linspace(0.0, 10.0, 60)
    finish = np.concatenate([np.arange(1.0, 41.0), np.full(20, 12.0)])
    status = np.full(60, Status.FINISHED)
    assert np.isnan(saturated_throughput(arrival, first, finish, status))
    finish[40:] = 6.0 + np.arange(20) // 4
    assert saturated_throughput(arrival, first, finish, status) == pytest.approx(25 / 5)
    status[40] = Status.REJECTED  # a rejected request finished nothing
    assert saturated_throughput(arrival, first, finish, status) == pytest.approx(24 / 5)
