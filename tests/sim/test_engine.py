"""The engine and schedulers: exact small timelines, invariants, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.metrics import MEMORY_CATEGORIES
from pagesim.sim.run import run_simulation
from tests.sim.helpers import ConstExecutor, small_cfg, trace

MEM = [f"mem_{c}" for c in MEMORY_CATEGORIES]


@pytest.mark.parametrize("system", ["vllm", "orca-oracle", "orca-max", "static"])
def test_single_request_timeline_by_hand(system):
    # P=4, O=3, every step 1 s: prefill [0,1) samples token 1; decodes [1,2), [2,3) -> done at 3
    ex = ConstExecutor(1.0)
    res = run_simulation(small_cfg(system), trace([(0.0, 4, 3)]), executor=ex)
    r = res.requests.iloc[0]
    assert r.status == "finished"
    assert (r.first_token_s, r.finish_s, r.ttft_s, r.e2el_s) == (1.0, 3.0, 1.0, 3.0)
    assert r.tpot_s == pytest.approx(1.0) and r.normalized_latency_s == pytest.approx(1.0)
    assert ex.batches[0][:2] == ([0], [4])
    if system != "static":  # (static batching's decode steps are pinned in tests/sim/core/test_static.py)
        assert ex.batches[1][2:4] == ([0], [5]) and ex.batches[2][2:4] == ([0], [6])
    assert len(ex.batches) == 3
    s = res.summary
    assert s["completed"] == 1 and s["duration_s"] == 3.0 and s["num_steps"] == 3
    assert s["mean_itl_ms"] == pytest.approx(1000.0)


def test_vllm_memory_categories_by_hand():
    # block 4, one request P=5 O=4 (F=9). After prefill: L=5 in 2 blocks (8 slots):
    # token 5, reservation min(8,9)-5=3, internal 0; free 64-8=56.
    ex = ConstExecutor(1.0)
    res = run_simulation(small_cfg("vllm"), trace([(0.0, 5, 4)]), executor=ex)
    st = res.steps
    first = st.iloc[0]
    assert (first.mem_token_states, first.mem_reservation, first.mem_internal_frag) == (5, 3, 0)
    assert first.mem_free_idle == 56
    # decode 1 stores token 6 (L=6), decode 2 L=7, decode 3 L=8: still 2 blocks, F=9 > 8
    assert st.mem_token_states.tolist() == [5, 6, 7, 8]
    assert (st[MEM].sum(axis=1) == 64).all()


def test_orca_categories_by_hand():
    # oracle, buddy: P=5 O=4 -> R=9, buddy block 16 -> slack 7
    res = run_simulation(small_cfg("orca-oracle"), trace([(0.0, 5, 4)]), executor=ConstExecutor())
    first = res.steps.iloc[0]
    assert (first.mem_token_states, first.mem_reservation, first.mem_internal_frag,
            first.mem_allocator_slack) == (5, 4, 0, 7)
    # max: R=32 -> internal 32-9=23, no slack
    res = run_simulation(small_cfg("orca-max"), trace([(0.0, 5, 4)]), executor=ConstExecutor())
    first = res.steps.iloc[0]
    assert (first.mem_token_states, first.mem_reservation, first.mem_internal_frag,
            first.mem_allocator_slack) == (5, 4, 23, 0)


def test_orca_max_admits_two_of_three_in_64_slots_and_external_frag_counts():
    # max_seq_len 32 on 64 slots: 2 extents; the third waits for memory -> free is external
    rows = [(0.0, 4, 8), (0.0, 4, 8), (0.0, 4, 8)]
    res = run_simulation(small_cfg("orca-max"), trace(rows), executor=ConstExecutor())
    st = res.steps
    assert st.num_running.max() == 2
    first = st.iloc[0]
    assert first.num_waiting == 1 and first.mem_external_frag == 0 and first.mem_free_idle == 0
    # two extents of 32 fill the pool: token 8, reservation 2*(12-4)=16, internal 2*(32-12)=40
    assert (first.mem_token_states, first.mem_reservation, first.mem_internal_frag) == (8, 16, 40)
    assert res.summary["completed"] == 3


def test_static_batches_wait_for_longest_member():
    # B = 64 // 32 = 2 slots. r0 (O=2) and r1 (O=4) batch together; r2 waits for the batch.
    rows = [(0.0, 4, 2), (0.0, 4, 4), (0.0, 4, 1)]
    res = run_simulation(small_cfg("static"), trace(rows), executor=ConstExecutor())
    rq = res.requests.set_index("request_id")
    # batch 1: prefill [0,1), 3 decode steps -> ends at 4; both finish at 4 (static returns together)
    assert rq.loc["r0", "finish_s"] == 4.0 and rq.loc["r1", "finish_s"] == 4.0
    assert rq.loc["r2", "first_token_s"] == 5.0 and rq.loc["r2", "finish_s"] == 5.0


def test_vllm_preempts_and_recomputes_when_blocks_run_out():
    # 64 slots, block 4: four requests growing to 24 tokens each cannot all stay resident
    rows = [(0.0, 8, 16)] * 4
    res = run_simulation(small_cfg("vllm", max_seq_len=32), trace(rows), executor=ConstExecutor())
    s = res.summary
    assert s["completed"] == 4 and s["num_preemptions"] > 0
    assert res.requests.preemptions.sum() == s["num_preemptions"]
    assert (res.steps[MEM].sum(axis=1) == 64).all()


def test_swap_preemption_moves_tokens_and_completes():
    rows = [(0.0, 8, 16)] * 4
    res = run_simulation(small_cfg("vllm", preemption="swap"), trace(rows), executor=ConstExecutor())
    assert res.summary["completed"] == 4 and res.summary["num_preemptions"] > 0


def test_chunked_prefill_respects_token_budget():
    rows = [(0.0, 20, 4), (0.0, 20, 4), (0.5, 12, 6)]
    ex = ConstExecutor()
    res = run_simulation(small_cfg("vllm", chunked_prefill=True, chunk_budget=8, max_seq_len=32,
                                   kv_gib=128 * 819200 / 2**30), trace(rows), executor=ex)
    st = res.steps
    assert ((st.num_prefill_tokens + st.num_decode_tokens) <= 8).all()
    assert res.summary["completed"] == 3
    # the first prompt needs ceil(20/8) = 3 chunks before its first token
    assert res.requests.iloc[0].first_token_s == 3.0


def test_request_that_never_fits_is_rejected_with_reason():
    rows = [(0.0, 4, 4), (0.0, 30, 30)]  # 60 > max_seq_len 32
    res = run_simulation(small_cfg("orca-oracle"), trace(rows), executor=ConstExecutor())
    rq = res.requests
    assert rq.status.tolist() == ["finished", "rejected"]
    assert "32" in rq.reject_reason.iloc[1]
    assert res.summary["completed"] + res.summary["rejected"] == 2


def test_parallel_sampling_forks_and_shares_prompt_blocks():
    rows = [(0.0, 8, 4)]
    res = run_simulation(small_cfg("vllm"), trace(rows, n=[3]), executor=ConstExecutor())
    st = res.steps
    # prefill: 8 tokens in 2 blocks; after forking, 3 sequences share them and each decode
    # step writes a new token per sequence: 3 private blocks on the first decode
    assert st.mem_token_states.iloc[0] == 8
    assert st.mem_token_states.iloc[1] == 8 + 3
    assert res.summary["completed"] == 1
    assert res.summary["output_throughput"] == pytest.approx(12 / res.summary["duration_s"])


@pytest.mark.parametrize("system", ["static", "orca-max", "orca-pow2", "orca-oracle", "vllm", "token",
                                    "vattention"])
def test_invariants_on_random_trace(system):
    rng = np.random.default_rng(1)
    n = 60
    rows = list(zip(np.sort(rng.uniform(0, 20, n)), rng.integers(1, 200, n), rng.integers(1, 200, n)))
    cfg = SimConfig.for_system(system, kv_gib=4096 * 819200 / 2**30, max_seq_len=512, check=True)
    res = run_simulation(cfg, trace(rows))
    s = res.summary
    assert s["completed"] + s["rejected"] == n  # nobody lost
    st = res.steps
    assert (st[MEM].sum(axis=1) == s["kv_capacity_tokens"]).all()
    assert (np.diff(st.start_s) > 0).all()
    rq = res.requests
    fin = rq[rq.status == "finished"]
    assert (fin.first_token_s >= fin.arrival_s).all() and (fin.finish_s >= fin.first_token_s).all()
    assert abs(sum(s[m] for m in MEM) - 1.0) < 1e-9


def test_same_seed_same_bytes(tmp_path):
    from pagesim.traces.synth import make_workload

    tr = make_workload("sharegpt", rate=4, duration_s=60, seed=3)
    outs = []
    for k in range(2):
        res = run_simulation(SimConfig.for_system("vllm", kv_gib=2, seed=3), tr)
        res.summary["wall_time_s"] = 0.0
        out = res.save(tmp_path / f"run{k}")
        outs.append([(out / f).read_bytes() for f in ("summary.json", "requests.csv", "steps.csv")])
    assert outs[0] == outs[1]


def test_copy_on_write_copies_reach_the_executor_and_the_cost():
    # prompt 6 at block 4: blocks [4 full][2 of 4]; n=3 forks share the partial block, so the
    # first decode (three writers, three references) copies it twice: min(k, r - 1) = 2
    ex = ConstExecutor()
    res = run_simulation(small_cfg("vllm"), trace([(0.0, 6, 4)], n=[3]), executor=ex)
    copies = [batch[-1] for batch in ex.batches]
    assert copies[1] == 2 and all(c == 0 for c in copies[2:])
    assert res.summary["mgr_cow_copies"] == 2
    from pagesim.sim.batch import StepBatch
    from pagesim.sim.cost.roofline import RooflineCostModel
    from pagesim.sim.specs import get_gpu, get_model

    cm = RooflineCostModel(get_model("opt-13b"), get_gpu("a100-40gb"))
    b = StepBatch()
    base = cm.step_time(b)
    b.copy_tokens = 8
    assert cm.step_time(b) - base == pytest.approx(2 * 8 * 819200 / (1555e9 * 0.8))
