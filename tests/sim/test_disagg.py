"""Disaggregated prefill and decode (sim/disagg.py, sim/core/events/disagg.py, sim/core/kv/remote_kv.py),
worked by hand on tiny traces. Step durations are the cost model's (read from the step table);
everything built on them (handoffs, transfers, waits, the TTFT's phases) is worked out here.

OPT-13B at fp16 holds 819,200 B of KV per token; blocks of 16 tokens; a prompt of 100 tokens is
7 blocks = 112 slots = 91,750,400 B on the wire. InfiniBand NDR: 50 GB/s per GPU, 2 us.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.disagg import PHASES, run_disaggregated
from pagesim.sim.errors import ConfigError
from tests.sim.helpers import cfg_for, rand_trace, trace_of

PROMPT_BYTES = 7 * 16 * 819_200  # 100 tokens in 7 whole blocks
NDR = 50e9


def cfg(slots=3000, check=True, prefix_caching=False, **kw):
    return cfg_for("vllm-v1", slots=slots, prefix_caching=prefix_caching, check=check, **kw)


def steps_of(result, replica):
    return result.steps[result.steps["replica"] == replica].reset_index(drop=True)


def test_one_request_worked_by_hand():
    """P=1, D=1, one request (100 prompt tokens, 3 out) at 0 s: prefilled in the prefill
    replica's first step [0, p]; handed over at p and admitted at once by the idle decode
    replica; its 91,750,400 B take 1.835008 ms + 2 us; the decode replica's first step starts
    as they land and recomputes one token (the prompt's last) to sample the first; two decode
    steps give the other two."""
    result = run_disaggregated(cfg(), cfg(), trace_of([(0.0, 100, 3)]), 1, 1, link="ib-ndr")
    prefill, decode = steps_of(result, 0), steps_of(result, 1)
    r = result.requests.iloc[0]
    p = prefill["dt_s"][0]
    assert len(prefill) == 1 and prefill["num_prefill_tokens"][0] == 100
    transfer_s = PROMPT_BYTES / NDR + 2e-6
    assert r["transfer_bytes"] == PROMPT_BYTES
    assert r["transfer_s"] == pytest.approx(transfer_s, rel=1e-12)
    assert (r["prefill_queue_s"], r["prefill_s"], r["decode_admit_wait_s"], r["transfer_wait_s"]) == (0, p, 0, 0)
    assert decode["start_s"][0] == pytest.approx(p + transfer_s, rel=1e-12)
    assert decode["num_prefill_tokens"].tolist() == [1, 0, 0]  # the recomputed last prompt token
    assert decode["num_decode_tokens"].tolist() == [0, 1, 1]
    # the decode side's memory as its first step starts: 100 tokens, 103 of demand, 112 held
    assert (decode["mem_token_states"][0], decode["mem_reservation"][0], decode["mem_internal_frag"][0],
            decode["mem_in_transfer"][0]) == (100, 3, 9, 0)
    first = decode["start_s"][0] + decode["dt_s"][0]
    assert r["first_token_s"] == first and r["decode_first_step_s"] == pytest.approx(decode["dt_s"][0])
    assert r["finish_s"] == pytest.approx(first + decode["dt_s"][1] + decode["dt_s"][2], rel=1e-12)
    engine_ttft = sum(r[name] for name in PHASES)
    assert engine_ttft == pytest.approx(first, rel=1e-12)  # arrival 0: the phases sum to the TTFT
    assert r["prefill_replica"] == 0 and r["decode_replica"] == 1
    s = result.summary
    assert s["transfers"] == 1 and s["transfer_bytes_total"] == PROMPT_BYTES and s["gpus"] == 2


def test_first_token_from_the_prefill_side_worked_by_hand():
    """DistServe's client takes its first token from the prefill side (sim/disagg.py,
    FIRST_TOKEN_SOURCES). One request (100 prompt tokens, 3 out) at 0 s, as above: the prefill
    step [0, p] samples it, so its first token is at p, not the decode side's; its TTFT is p plus
    the frontend's time (the cost model's, the same in both); its TPOT is the rest over the 2
    tokens after it: (finish - p) / 2, the transfer and the decode side's first step in it. The
    engine runs alike: the same steps, finish and phases."""
    trace = trace_of([(0.0, 100, 3)])
    vllm = run_disaggregated(cfg(), cfg(), trace, 1, 1, link="ib-ndr")
    distserve = run_disaggregated(cfg(), cfg(), trace, 1, 1, link="ib-ndr", first_token="prefill")
    p = steps_of(distserve, 0)["dt_s"][0]
    r, v = distserve.requests.iloc[0], vllm.requests.iloc[0]
    frontend = v["ttft_s"] - v["first_token_s"]
    assert r["first_token_s"] == p and v["first_token_s"] > p
    assert r["ttft_s"] == pytest.approx(p + frontend, rel=1e-12)
    assert r["finish_s"] == v["finish_s"]
    assert r["tpot_s"] == pytest.approx((r["finish_s"] - p) / 2, rel=1e-12)
    assert [r[name] for name in PHASES] == [v[name] for name in PHASES]
    s = distserve.summary
    assert s["mean_ttft_ms"] == pytest.approx(1e3 * (p + frontend), rel=1e-12)
    assert (s["first_token"], vllm.summary["first_token"]) == ("prefill", "decode")
    with pytest.raises(ConfigError, match="--first-token 'context' is unknown"):
        run_disaggregated(cfg(), cfg(), trace, 1, 1, first_token="context")


def test_transfer_holds_blocks_and_one_link_is_a_queue():
    """A slow link (10 MB/s: --kv-link-gbps 0.08) keeps A's 7 blocks in transfer on the prefill
    side while B (20 tokens: 2 blocks, 21 of demand) prefills: that step's row has 112 slots in
    transfer beside B's 20 tokens, 1 reserved, 11 of internal fragmentation. B's transfer waits
    on the decode replica's link for A's bytes: it starts as they are out, 9.17504 s after
    A's, and moves 2 x 16 x 819,200 B in 2.62144 s."""
    trace = trace_of([(0.0, 100, 2), (0.001, 20, 2)])
    result = run_disaggregated(cfg(), cfg(), trace, 1, 1, link="ib-ndr", link_gbps=0.08)
    prefill = steps_of(result, 0)
    a, b = result.requests.iloc[0], result.requests.iloc[1]
    p1 = prefill["dt_s"][0]
    assert prefill["num_prefill_tokens"].tolist() == [100, 20]
    row = prefill.iloc[1]
    assert (row["mem_token_states"], row["mem_reservation"], row["mem_internal_frag"],
            row["mem_in_transfer"]) == (20, 1, 11, 112)
    a_out = p1 + PROMPT_BYTES / 1e7
    assert a["transfer_s"] == pytest.approx(PROMPT_BYTES / 1e7 + 2e-6, rel=1e-12)
    b_asked = p1 + prefill["dt_s"][1]
    assert b["decode_admit_wait_s"] == 0
    assert b["transfer_wait_s"] == pytest.approx(a_out - b_asked, rel=1e-12)
    assert b["transfer_s"] == pytest.approx(2 * 16 * 819_200 / 1e7 + 2e-6, rel=1e-12)


def test_backpressure_decode_full_holds_prefill_blocks():
    """Both pools hold 8 blocks (128 slots); A, B, C each 100 prompt tokens (7 blocks), 20 out,
    at 0, 1 ms, 2 ms. A is prefilled, handed over and loaded; B waits on the prefill side for
    A's blocks to be freed (A's transfer's end), then is prefilled; the decode replica, running
    A (7 then 8 blocks), has no room for B: B waits there and its 7 blocks stay held in
    transfer on the prefill side, so C cannot be prefilled either. When A finishes, B is
    admitted on the decode side at that instant; C is admitted on the prefill side exactly when
    B's transfer ends."""
    trace = trace_of([(0.0, 100, 20), (0.001, 100, 20), (0.002, 100, 20)])
    small = cfg(slots=128, max_seq_len=128)
    result = run_disaggregated(small, small, trace, 1, 1)
    a, b, c = (result.requests.iloc[k] for k in range(3))
    tl = result.requests
    a_end = a["prefill_s"] + a["transfer_s"]  # A arrived at 0 and waited for nothing
    assert b["prefill_queue_s"] == pytest.approx(a_end - 0.001, rel=1e-12)
    b_handoff = 0.001 + b["prefill_queue_s"] + b["prefill_s"]
    b_asked = b_handoff + b["decode_admit_wait_s"]
    assert b["decode_admit_wait_s"] > 0 and b_asked == pytest.approx(a["finish_s"], rel=1e-12)
    b_end = b_asked + b["transfer_wait_s"] + b["transfer_s"]
    assert c["prefill_queue_s"] == pytest.approx(b_end - 0.002, rel=1e-12)
    assert (tl["status"] == "finished").all()
    assert result.summary["prefill_kv_in_transfer"] > 0


def test_a_loaded_request_goes_before_those_waiting_for_room():
    """The decode pool holds 8 blocks. A (60 prompt tokens: 4 blocks) is admitted and its KV
    crawls over a 10 MB/s link (4 x 16 x 819,200 B: 5.24288 s); B (70 tokens: 5 blocks) is
    handed over meanwhile and does not fit the 4 left, so it waits at the queue's head. When
    A's KV lands, A goes in front of B (vLLM drains the requests holding KV first) and runs at
    once; B is admitted when A finishes and frees its blocks."""
    trace = trace_of([(0.0, 60, 2), (0.001, 70, 2)])
    small = cfg(slots=128, max_seq_len=128)
    result = run_disaggregated(cfg(max_seq_len=128), small, trace, 1, 1, link_gbps=0.08)
    a, b = result.requests.iloc[0], result.requests.iloc[1]
    decode = steps_of(result, 1)
    assert a["transfer_s"] == pytest.approx(4 * 16 * 819_200 / 1e7 + 2e-6, rel=1e-12)
    a_end = a["prefill_s"] + a["transfer_s"]
    assert decode["start_s"][0] == pytest.approx(a_end, rel=1e-12) and decode["num_prefill_tokens"][0] == 1
    assert a["decode_first_step_s"] == pytest.approx(decode["dt_s"][0], rel=1e-12)
    b_asked = 0.001 + b["prefill_queue_s"] + b["prefill_s"] + b["decode_admit_wait_s"]
    assert b_asked == pytest.approx(a["finish_s"], rel=1e-12)


def test_prefix_hits_on_both_sides():
    """Prefix caching on both pools; A and B share a 64-token prompt (4 full blocks; a hit
    stops a token short: 3 blocks, 48 tokens). B is prefilled while A's blocks are in transfer:
    its 3 hits bring A's first 3 blocks back into use, so that step's row has only A's last
    block in transfer (16 slots) beside B's 64 tokens in 5 blocks. A's load caches its blocks on
    the decode side, where B then hits 3 too: B's transfer moves 1 block, 13,107,200 B."""
    hashes = [11, 12, 13, 14]
    trace = trace_of([(0.0, 64, 2, hashes), (0.001, 64, 2, hashes)], prefix=True)
    c = cfg(prefix_caching=True)
    result = run_disaggregated(c, c, trace, 1, 1)
    prefill = steps_of(result, 0)
    a, b = result.requests.iloc[0], result.requests.iloc[1]
    assert prefill["num_prefill_tokens"].tolist() == [64, 16]
    row = prefill.iloc[1]
    assert (row["mem_token_states"], row["mem_reservation"], row["mem_internal_frag"],
            row["mem_in_transfer"]) == (64, 0, 0, 16)
    assert a["transfer_bytes"] == 4 * 16 * 819_200 and b["transfer_bytes"] == 16 * 819_200
    assert [s["mgr_prefix_hit_tokens"] for s in result.replica_summaries] == [48, 48]


def test_refused_on_the_decode_side_frees_the_prefill_blocks():
    """A request the decode pool can never hold (its 100 + 40 tokens need 9 blocks of 8) is
    rejected there, and the prefill side lets its blocks go at once: the next request, which
    needs them, is prefilled right after."""
    trace = trace_of([(0.0, 100, 40), (0.001, 100, 2)])
    small = cfg(slots=128, max_seq_len=128)
    result = run_disaggregated(small, small, trace, 1, 1)
    a, b = result.requests.iloc[0], result.requests.iloc[1]
    assert a["status"] == "rejected" and a["reject_reason"] != "" and np.isnan(a["transfer_bytes"])
    assert b["status"] == "finished"
    assert b["prefill_queue_s"] == pytest.approx(a["prefill_s"] - 0.001, rel=1e-12)


def test_a_busy_cluster_checks_and_ends():
    """Two prefill and three decode replicas under a burst, --check after every step of each:
    every request finishes, each prefilled on one pool and decoded on the other, its phases
    summing to its TTFT."""
    trace = rand_trace(seed=3, n=80, rate=200.0)
    result = run_disaggregated(cfg(slots=1500), cfg(slots=1500), trace, 2, 3, router="least-outstanding-requests")
    r = result.requests
    assert (r["status"] == "finished").all()
    assert set(r["prefill_replica"]) <= {0, 1} and set(r["decode_replica"]) <= {2, 3, 4}
    total = sum(r[name] for name in PHASES)
    np.testing.assert_allclose(total, r["first_token_s"] - r["arrival_s"], rtol=1e-9)
    s = result.summary
    assert s["completed"] == 80 and s["prefill_replicas"] == 2 and s["decode_replicas"] == 3


@pytest.mark.parametrize("seed, prefill, decode, prefix", [(4, 1, 1, False), (5, 2, 2, False), (6, 3, 1, False),
                                                          (7, 2, 2, True), (8, 1, 3, True)])
def test_time_is_the_earliest_event_anywhere(seed, prefill, decode, prefix):
    """Under --check each replica takes one event per turn of the loop; without it, a replica
    runs on to the earliest event of the others (the horizon). Both make the same run, bit for
    bit: a replica that ran past another's handoff or a transfer's end would see it late.
    (With prefix caching, the checks cover the blocks transfers share with running requests.)"""
    trace = rand_trace(seed=seed, n=60, rate=150.0, prefix=prefix)
    runs = [run_disaggregated(cfg(slots=900, check=check, prefix_caching=prefix),
                              cfg(slots=700, check=check, prefix_caching=prefix), trace, prefill, decode)
            for check in (True, False)]
    assert (runs[0].requests["status"] == "finished").all()
    pd.testing.assert_frame_equal(runs[0].requests, runs[1].requests)
    pd.testing.assert_frame_equal(runs[0].steps, runs[1].steps)


def test_a_decode_pass_that_preempts_everyone_admits_the_loaded_next():
    """A decode pool of 25 blocks whose loaded requests (waiting to run) hold blocks: the last
    running request cannot grow and preempts itself, so the pass admits nobody (vLLM admits no
    waiting request in a step that preempted: scheduler.py:1050); the next pass, at once,
    admits the loaded ones, and every request ends (this trace has four loaded requests
    holding 15 blocks when it happens)."""
    trace = rand_trace(seed=22, n=50, rate=200.0, prefix=True)
    result = run_disaggregated(cfg(slots=2000, prefix_caching=True), cfg(slots=400, prefix_caching=True), trace, 1, 3)
    assert (result.requests["status"] == "finished").all()
    assert result.summary["num_preemptions"] > 0


@pytest.mark.parametrize("system, settings, message", [
    ("vllm", {}, "--system vllm-v1 only"),
    ("vllm-v1", {"scheduling_policy": "priority"}, "priority is not modelled with disaggregation yet"),
])
def test_other_systems_are_refused(system, settings, message):
    c = cfg_for(system, **settings)
    with pytest.raises(ConfigError, match=message):
        run_disaggregated(c, c, trace_of([(0.0, 10, 2)]), 1, 1)


def test_a_replica_with_no_row_left_admits_no_one_until_a_transfer_ends():
    """max_num_seqs 1: each replica has 2 block-table rows (sim/disagg.with_holding_rows). A
    slow link (10 MB/s) keeps A's 7 blocks in transfer on the prefill side for 9.17504 s; B is
    prefilled once A's step is over (the second row) and waits on the link behind A. C, at 2 ms, finds no row
    left: it waits on the prefill side until A's transfer ends and frees A's row, and only then
    is prefilled. (Without the rule two requests shared a row: --check stopped the run.)"""
    trace = trace_of([(0.0, 100, 2), (0.001, 20, 2), (0.002, 20, 2)])
    one = cfg(max_num_seqs=1)
    result = run_disaggregated(one, one, trace, 1, 1, link="ib-ndr", link_gbps=0.08)
    a, b, c = (result.requests.iloc[k] for k in range(3))
    a_end = a["prefill_s"] + a["transfer_s"]  # A arrived at 0 and waited for nothing
    assert b["prefill_queue_s"] == pytest.approx(a["prefill_s"] - 0.001, rel=1e-12)  # A's step over
    assert c["prefill_queue_s"] == pytest.approx(a_end - 0.002, rel=1e-12)
    assert (result.requests["status"] == "finished").all()



def test_a_request_whose_kv_landed_needs_a_free_seat_as_in_vllm():
    """vLLM admits a request whose remote KV arrived only while its running list has room
    (sched/scheduler.py:1071-1074); a transfer counts in no seat of pagesim's (a host load does,
    and takes its own: host_tier.loading_seat). Drawn by tests/sim/feature_space.py (seed 103, paged_case):
    Llama-3.1-8B, a 128-token pool of blocks of 4, max_num_seqs 1, async scheduling, 2 prefill and
    2 decode replicas behind least-kv-usage: a landed request once took a seat that was not free,
    and the decode replica's running list (max_num_seqs long) was written past its end."""
    from tests.sim.feature_space import paged_case

    system, kw, trace = paged_case(103)  # (before the Orca and stretched streams)
    assert (kw["model"], kw["block_size"], kw["max_num_seqs"], kw["async_scheduling"]) == ("llama-3.1-8b", 4, 1, True)
    from pagesim.sim.config import SimConfig
    result = run_disaggregated(SimConfig.for_system(system, **kw), SimConfig.for_system(system, **kw), trace, 2, 2,
                               "least-kv-usage")
    assert result.summary["completed"] == len(trace)
    assert result.steps["num_running"].max() == 1
