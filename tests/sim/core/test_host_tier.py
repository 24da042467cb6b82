"""vLLM v1's CPU offload tier (``--kv-offload-gib``, sim/core/kv/host_tier.py, as of vLLM 0.33.0),
pinned by tiny runs worked out by hand.

OPT-13B (819,200 KV bytes a token), blocks of 4 tokens: a block is 3,276,800 bytes, and over an
A100's host link (``pcie_bw`` 25e9 B/s) it takes 3,276,800 / 25e9 = 131.072 us either way. Prefix
hashes name every 4 tokens (``hash_block_tokens`` 4), so a block's key is its prefix's hashes.
No async scheduling, the roofline, every step checked (``--check``: the host tier's own
bookkeeping too).
"""

from __future__ import annotations

import pandas as pd
import pytest
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.events import replay
from pagesim.sim.core.kv import host_tier, prefix_cache
from pagesim.sim.core.sched import lifecycle, scheduler_v1
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, prepare, run_simulation

from tests.sim.core.test_vllm_v1 import admit_waiting_v1, v1 as plain_v1
from tests.sim.helpers import OPT13B_SLOT, assert_simulate_refuses, rand_trace
from pagesim.sim.core.kv.host_tier import (CHOSEN_BLOCK, GROUP_HEAP, HOST_GROUPS, HOST_KEY_CHAIN,
                                           HOST_KEY_END, HOST_NEXT, HOST_PENDING, HOST_RANK,
                                           HOST_TOUCHED_HEAD, OFFLOAD_FRONT, OFFLOAD_HEAP_AT)
from pagesim.sim.core.kv.prefix_cache import ENTRY_BLOCK

BS = 4
BLOCK_BYTES = BS * OPT13B_SLOT  # 3,276,800
BLOCK_S = BLOCK_BYTES / 25e9  # 131.072 us


def v1(slots: int, host_blocks: int, **settings) -> SimConfig:
    """test_vllm_v1's configuration (its step-by-step defaults) with a host tier of ``host_blocks``."""
    return plain_v1(slots, kv_offload_gib=host_blocks * BLOCK_BYTES / 2**30, **settings)


def trace(*rows) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens, prefix hashes: one per 4 prompt tokens)."""
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(r[0]) for r in rows],
                       "prompt_tokens": [r[1] for r in rows], "output_tokens": [r[2] for r in rows],
                       "prefix_hashes": [tuple(r[3]) for r in rows]})
    df.attrs["hash_block_tokens"] = BS
    return df


def key(hashes, owner: int | None = None) -> tuple[int, int]:
    """The key (end token, chain) of the block ending a prefix of these hashes; ``owner``: the
    request whose alone that prefix is (no other request's hashes share it), whose own chain the
    key then has (``build.shared_chains``, ``prefix_cache.key_chain``)."""
    if owner is not None:
        return len(hashes) * BS, prefix_cache.own_chain(owner)
    return len(hashes) * BS, prefix_cache.prefix_chain(hashes, BS)[-1]


def host_lru(s) -> list[tuple[int, int]]:
    """The host tier's keys by their LRU rank, the lowest (the next evicted, pins aside) first."""
    used = s.host_blocks[:int(s.count[state.HOST_USED])]
    return [(int(row[HOST_KEY_END]), int(row[HOST_KEY_CHAIN]))
            for row in sorted(used, key=lambda row: int(row[HOST_RANK]))]


def run_core(cfg, t):
    s, _ = replay.run(prepare(cfg, t).state, None, None)
    return s


#: the first test's requests (A, B, C, D): prompt tokens, output, hashes
SHARED_ROWS = ((0, 12, 1, (1, 2, 3)), (1, 28, 1, range(11, 18)), (2, 11, 1, (1, 2)), (3, 11, 1, (1, 2)))


def test_a_block_the_gpu_evicted_is_loaded_from_the_host_tier():
    """A pool of 8 blocks (32 slots), a host tier of 16.

    A (t 0): prompt 12, hashes 1 2 3, output 1: one step prefills its 3 blocks, each offered to
        the host as the step fills it (3 stored); done, its blocks cached on the GPU, let go tail
        first (A2 the GPU's least recent, then A1, A0).
    B (t 1): prompt 28, hashes 11..17, output 1: 7 blocks, the 5 free and 2 cached: A2 and A1 are
        evicted on the GPU; 7 stored.
    C (t 2): prompt 11, hashes 1 2: 2 full blocks, both within the GPU's limit of (11 - 1) // 4 = 2
        blocks and the tier's of 11 // 4 = 2: the GPU holds A0 (4 tokens), the host A1: 1 loaded
        (3,276,800 bytes, 131.072 us). C waits in the queue holding 2 blocks (A0, and the one loaded
        into, computed), the engine idle, until 2 + 131.072 us, then computes its last 3 tokens
        (its third block partial: not stored). Its TTFT is the load and that step.
    D (t 3): prompt 11, hashes 1 2: the loaded block was cached on the GPU as C was admitted: 2
        GPU hits (8 tokens), nothing from the host.
    Lookups 12 + 28 + 11 + 11 = 62 tokens: GPU hits 4 + 8 = 12, host hits 4; stored 3 + 7 = 10."""
    t = trace(*SHARED_ROWS)
    result = run_simulation(v1(32, 16), t)
    s = result.summary
    assert s["host_prefix_hit_rate"] == 4 / 62
    assert s["gpu_prefix_hit_rate"] == 12 / 62
    assert s["host_loaded_gib"] == BLOCK_BYTES / 2**30
    assert s["host_stored_gib"] == 10 * BLOCK_BYTES / 2**30
    assert (s["host_blocks_used"], s["host_evicted_blocks"]) == (10, 0)
    steps, requests = result.steps, result.requests.set_index("request_id")
    load_end = 2 + BLOCK_S
    c_step = steps[steps["start_s"] == load_end]
    assert len(c_step) == 1 and c_step["num_prefill_tokens"].iloc[0] == 3  # 11 - 4 from the GPU - 4 loaded
    assert requests.loc["r2", "ttft_s"] == pytest.approx(BLOCK_S + c_step["dt_s"].iloc[0], abs=1e-12)
    d_step = steps[steps["start_s"] == 3]
    assert d_step["num_prefill_tokens"].iloc[0] == 3  # D: 8 GPU hits
    assert requests.loc["r3", "ttft_s"] == pytest.approx(d_step["dt_s"].iloc[0], abs=1e-12)


def test_a_host_hit_of_a_whole_prompt_loads_its_last_block_and_recomputes_its_last_token():
    """The first test's run with C and D of A's prompt, 12 tokens, hashes 1 2 3: a GPU hit stops at
    (12 - 1) // 4 = 2 blocks, a host hit at the request's last full block, 12 // 4 = 3
    (``_lookup_complete_chunks``' bound is ``num_tokens``, offloading/scheduler.py:862); a hit of
    all its tokens leaves the last to compute (v1 sched/scheduler.py:3515-3516).
    C (t 2): the GPU holds A0, the host A1 and A2: 2 loaded (262.144 us); then its last token alone.
    D (t 3): C's blocks, cached on the GPU as it was admitted, give 2 GPU hits; the tier holds its
        third: 1 loaded (131.072 us), though the GPU holds it too; then its last token.
    Lookups 12 + 28 + 12 + 12 = 64 tokens: GPU hits 4 + 8 = 12, host hits 8 + 4 = 12."""
    t = trace((0, 12, 1, (1, 2, 3)), (1, 28, 1, range(11, 18)), (2, 12, 1, (1, 2, 3)), (3, 12, 1, (1, 2, 3)))
    result = run_simulation(v1(32, 16), t)
    s = result.summary
    assert (s["gpu_prefix_hit_rate"], s["host_prefix_hit_rate"]) == (12 / 64, 12 / 64)
    assert s["host_loaded_gib"] == 3 * BLOCK_BYTES / 2**30
    steps, requests = result.steps, result.requests.set_index("request_id")
    c_step = steps[steps["start_s"] == 2 + 2 * BLOCK_S]
    assert len(c_step) == 1 and c_step["num_prefill_tokens"].iloc[0] == 1
    d_step = steps[steps["start_s"] == 3 + BLOCK_S]
    assert len(d_step) == 1 and d_step["num_prefill_tokens"].iloc[0] == 1
    assert requests.loc["r3", "ttft_s"] == pytest.approx(BLOCK_S + d_step["dt_s"].iloc[0], abs=1e-12)


def test_the_host_tier_evicts_its_least_recently_used_block():
    """A host tier of 3 blocks, a pool large enough that the GPU evicts nothing. A block ranks by
    the request that stored or read it, its deeper blocks first: (the request's number, -end
    token); a finished request's blocks are touched deepest first, each a new number (lru.py).

    A (t 0): prompt 8, hashes 1 2: number 1, stores A0 (1, -4) and A1 (1, -8) -> [A1 A0]; done:
        A1 (2, 0), A0 (3, 0) -> [A1 A0].
    B (t 1): prompt 8, hashes 3 4: number 4; its offer of both needs one block more than the free
        one: A1 evicted; B0 (4, -4), B1 (4, -8) -> [A0 B1 B0]; done: B1 (5, 0), B0 (6, 0).
    C (t 2): prompt 8, hashes 1 2: number 7; A0 held, read: (7, -4); A1 stored, evicting B1,
        (7, -8) -> [B0 A1 A0]; done: A1 (8, 0), A0 (9, 0). Two evictions, 5 blocks stored."""
    t = trace((0, 8, 1, (1, 2)), (1, 8, 1, (3, 4)), (2, 8, 1, (1, 2)))
    s = run_core(v1(64, 3), t)
    assert host_lru(s) == [key((3,), 1), key((1, 2)), key((1,))]
    assert (s.count[state.HOST_EVICTIONS], s.count[state.HOST_STORED_BLOCKS]) == (2, 5)


def test_only_prompt_blocks_are_stored():
    """vLLM offloads prompt blocks only (``offload_prompt_only``, True by default). A: prompt 8,
    output 6: its prefill fills blocks 0 and 1 (2 stored); its decodes compute tokens 8..12 (13
    tokens at its end), filling block 2 with generated tokens: not stored."""
    s = run_core(v1(64, 8), trace((0, 8, 6, (1, 2))))
    assert s.count[state.HOST_STORED_BLOCKS] == 2
    assert host_lru(s) == [key((1, 2), 0), key((1,), 0)]


def test_a_recompute_stores_its_prompt_blocks_only():
    """The cap is the prompt the request came with (``_calc_num_offloadable_tokens``,
    offloading/scheduler.py:762-771: ``num_prompt_tokens``). Decodes offer nothing here (only
    prefill chunks do), so the cap shows in a recompute. Worked on the core's state: A (prompt 8,
    hashes 1 2, output 6) was preempted with 4 tokens generated (``lifecycle.restart``: they
    become prompt, 12 tokens to compute); admitted with a budget of 16 it computes the 12 in one
    chunk, filling 3 blocks: its 2 prompt blocks are stored, the third (generated tokens) is not."""
    s = initial_state(v1(64, 8), trace((0, 8, 6, (1, 2))))
    A = 0
    s.num_generated[A] = 4
    lifecycle.restart(s, A)
    admit_waiting_v1(s, 16)
    interpreted(host_tier.offer_scheduled)(s, 0, 0)  # the step's stores, after the pass
    assert (s.num_computed_tokens[A], s.num_blocks[A]) == (12, 3)
    assert s.count[state.HOST_STORED_BLOCKS] == 2
    assert host_lru(s) == [key((1, 2), 0), key((1,), 0)]  # by the request, its deeper block first


def test_the_queue_passes_a_request_loading_until_its_load_ends():
    """The rule every connector's loads share (``lifecycle.hold_waiting``): a request loading waits
    ahead of the queue, skipped until its KV is there, then admitted first. A, B, C as in the
    first test (C loads 1 block from 2 s to 2 s + 131.072 us); max_num_seqs 2 (C's load takes one:
    here a request loading holds a block-table row). D (t 2 s + 10 us, prompt 4, hash 9, output 1)
    passes C and runs its one step at once; C's load ends during it, and at its end D leaves and
    C is admitted: its 3 tokens (11 - 4 from the GPU - 4 loaded), its TTFT from 2 s to there."""
    t = trace(*SHARED_ROWS[:3], (2.00001, 4, 1, (9,)))
    result = run_simulation(v1(32, 16, max_num_seqs=2), t)
    assert result.summary["host_prefix_hit_rate"] == 4 / 55
    steps, requests = result.steps, result.requests.set_index("request_id")
    d_step = steps[steps["start_s"] == 2.00001]
    assert len(d_step) == 1 and d_step["num_prefill_tokens"].iloc[0] == 4
    d_end = 2.00001 + d_step["dt_s"].iloc[0]
    assert d_end > 2 + BLOCK_S
    c_step = steps[steps["start_s"] == d_end]
    assert len(c_step) == 1 and c_step["num_prefill_tokens"].iloc[0] == 3
    assert requests.loc["r3", "ttft_s"] == pytest.approx(d_step["dt_s"].iloc[0], abs=1e-12)
    assert requests.loc["r2", "ttft_s"] == pytest.approx(d_end - 2 + c_step["dt_s"].iloc[0], abs=1e-12)


def test_a_tier_that_finds_nothing_changes_nothing():
    """Requests that share no prefix (no hashes): the tier stores their prompt blocks but never
    finds one for another request, so the request and step tables are the tier-off run's, bit
    for bit (stores overlap the steps; a request's own blocks found again after a preemption
    would load: none is preempted in a pool this large)."""
    t = rand_trace(5, n=60, max_len=128)
    off = run_simulation(v1(4096, 0, max_seq_len=128, check=False), t)
    on = run_simulation(v1(4096, 64, max_seq_len=128, check=False), t)
    assert on.summary["host_stored_gib"] > 0 and on.summary["host_prefix_hit_rate"] == 0
    pd.testing.assert_frame_equal(off.steps, on.steps)
    pd.testing.assert_frame_equal(off.requests, on.requests)


def test_invariants_hold_under_pressure():
    """A small pool with shared prefixes and preemptions, a tier that evicts: --check after
    every step (the categories sum to the capacity with loading requests holding blocks; the
    host tier's ranks, heap, ring of stores, map and capacity)."""
    t = rand_trace(11, n=120, rate=60, max_len=128, prefix=True)
    t.attrs["hash_block_tokens"] = 16
    result = run_simulation(v1(300, 12, max_seq_len=128, max_num_seqs=16), t)
    s = result.summary
    assert s["host_prefix_hit_rate"] > 0 and s["host_evicted_blocks"] > 0 and s["num_preemptions"] > 0
    assert s["completed"] == 120


@pytest.mark.parametrize("argv, words", [
    # (sglang's own host tier, HiCache: tests/sim/core/test_sglang_hicache.py)
    (["--system", "sglang", "--kv-offload-gib", "8", "--replicas", "2"], "not modelled with --replicas > 1"),
    (["--system", "vllm", "--kv-offload-gib", "8"], "applies to the vllm-v1 or sglang scheduler"),
    (["--system", "vllm-v1", "--no-prefix-caching", "--kv-offload-gib", "8"], "needs prefix caching"),
    (["--system", "vllm-v1", "--kv-offload-gib", "8", "--num-speculative-tokens", "2", "--speculative-method",
      "eagle"], "with EAGLE or MTP drafts is not modelled"),
    (["--system", "vllm-v1", "--kv-offload-gib", "-1"], "kv_offload_gib must be >= 0"),
    (["--system", "vllm-v1", "--kv-offload-gib", "0.00001"], "holds no block"),
])
def test_refused_in_one_line(argv, words, capsys):
    assert_simulate_refuses(argv, words, capsys)


def test_refused_with_a_client_timeout():
    with pytest.raises(ConfigError, match="is not modelled"):
        v1(64, 4, client_timeout_s=10)


@pytest.mark.parametrize("drafts, step, remaining", [
    ({}, 0, 2),  # 8 tokens: 2 blocks of 4
    (dict(num_speculative_tokens=3), 1, 3),  # n-gram, no lookahead: 1 + 3 tokens; 8 + 4: 3 blocks
    (dict(num_speculative_tokens=5), 2, 4),  # 1 + 5: two blocks; 8 + 6: 4
    (dict(num_speculative_tokens=2, speculative_method="draft-model", draft_model="opt-13b"), 2, 4),  # 1 + 2 + 2
])
def test_a_load_leaves_a_verification_steps_blocks_free(drafts, step, remaining):
    """With speculative decoding an admission that loads leaves free, beside the blocks the
    prefills in flight lack, one verification step's: ``cdiv(1 + K + lookahead, block size)``
    (``_spec_decode_step_blocks``, v1 scheduler.py:371-381, :1420-1430); and a prefill in flight
    lacks the blocks for its sequence and such a step past it (``_request_remaining_blocks``,
    :3404-3420). Before the first step nothing is in flight and the 8-token request holds none."""
    s = prepare(v1(64, 4, **drafts), trace((0, 8, 1, (1, 2)))).state
    assert host_tier.reserved_blocks(s) == step
    assert host_tier.remaining_blocks(s, 0) == remaining


def test_with_drafts_a_second_load_waits_for_the_verification_steps_blocks():
    """A pool of 6 blocks (24 slots), a host tier of 16; with and without n-gram drafts (K = 3).

    A (t 0): prompt 14, hashes 1 2 3, output 1: 4 blocks, its 3 full ones stored. B (t 1.5):
        prompt 10, hashes 4 5, output 1: 2 stored. C (t 3.5): prompt 23 takes all 6 blocks: the
        GPU forgets A and B.
    D (t 5.5): prompt 14, hashes 1 2 3: 3 host hits (at most (14 - 1) // 4), 12 tokens loaded
        into 3 of the 6 free blocks (its whole sequence, 4 blocks, fits); 3 free, and D, a
        prefill in flight, still lacks 1.
    E (t 5.5): prompt 10, hashes 4 5: 2 host hits, 3 blocks for its sequence (3 free). Without
        drafts it loads: 2 <= 3 - 1. With them a verification step's 1 + 3 tokens count twice:
        past D's sequence (14 + 4 tokens: D lacks 2 blocks) and for E's own step (1 block), so
        2 > 3 - 2 - 1 and E waits. The step at 5.5 holds D's 14 tokens and, without drafts, E's 8
        loaded ones."""
    t = trace((0, 14, 1, (1, 2, 3)), (1.5, 10, 1, (4, 5)), (3.5, 23, 1, range(21, 26)), (5.5, 14, 6, (1, 2, 3)),
              (5.5, 10, 2, (4, 5)))
    for drafts, held in (({}, 14 + 8), (dict(num_speculative_tokens=3), 14)):
        steps = run_simulation(v1(24, 16, **drafts), t).steps
        step = steps[steps["start_s"] > 5.5].iloc[0]  # 5.5 + the first load's 3 blocks
        assert step["num_prefill_tokens"] == 2 and step["mem_token_states"] == held, drafts


def test_the_prefills_in_flight_are_vllms_set():
    """vLLM's prefills in flight (``_inflight_prefills``), whose missing blocks an admission that
    loads leaves free: a request joins when it loads (v1 scheduler.py:1542) or when its
    admission's chunk leaves part of its prompt (:1590-1593), and leaves once a pass has
    scheduled the rest, as that pass ends (:1862-1871), not while it admits others. Prompt 14,
    blocks of 4, n-gram K = 3: a verification step takes 4 slots, so a prefill in flight lacks
    the blocks of 14 + 4 tokens (5) less those it holds, and a load leaves 1 block more free."""
    s = prepare(v1(64, 4, num_speculative_tokens=3), trace((0, 14, 8, (1, 2, 3)))).state
    prefilling, prefilled, reserved = (interpreted(getattr(host_tier, name))
                                       for name in ("prefilling", "prefilled", "reserved_blocks"))
    s.running[0], s.count[state.NUM_RUNNING] = 0, 1
    s.prompt_target[0], s.num_prompt_computed[0], s.num_blocks[0] = 14, 8, 2  # admitted, 8 of 14
    prefilling(s, 0, False)
    assert reserved(s) == 1 + (5 - 2)
    s.num_prompt_computed[0], s.num_blocks[0] = 14, 4  # a later pass schedules the other 6
    s.step_prefill_ids[0], s.count[state.STEP_PREFILL_SEQS] = 0, 1
    assert reserved(s) == 1 + (5 - 4)  # in flight until that pass ends
    prefilled(s)
    assert reserved(s) == 1
    prefilling(s, 0, False)  # an admission scheduling its whole prompt never joins
    assert reserved(s) == 1
    prefilling(s, 0, True)  # one that loads does
    assert reserved(s) == 2


def test_a_loaded_requests_first_step_takes_its_padding_and_lookahead_slots():
    """A request whose load is over is admitted as any request (v1 scheduler.py:1262-1330,
    kv_cache_manager.py:518-551): with a draft model (K = 2: 2 lookahead slots, 1 draft slot of
    the budget) its first step is padded to 1 + K when one token is left, and its blocks must
    hold its chunk and the lookahead slots. Prompt 14, blocks of 4, nothing running.

    12 tokens loaded (3 blocks): 2 left, no padding: 12 + 2 + 2 = 16 slots, 4 blocks.
    13 computed: 1 left, padded: 13 + 1 + 2 + 2 = 18 slots, 5 blocks; with 4 held it fits one
        free block, not none.
    A budget of 3 leaves 2 past the draft slot: 1 + 2 does not fit, and nobody is admitted (-1)."""
    cfg = v1(64, 4, num_speculative_tokens=2, speculative_method="draft-model", draft_model="opt-13b")
    s = prepare(cfg, trace((0, 14, 8, (1, 2, 3)))).state
    step, fits = interpreted(scheduler_v1.holding_step), interpreted(scheduler_v1.holding_fits)
    s.prompt_target[0], s.num_computed_tokens[0] = 14, 12
    assert step(s, 0, 64, False, False) == (0, 16)
    s.num_computed_tokens[0] = 13
    assert step(s, 0, 64, False, False) == (2, 18)
    assert step(s, 0, 3, False, False) == (-1, 0)
    s.num_blocks[0] = 4
    assert fits(s, 0, 18)  # (16 blocks free)
    s.count[state.NUM_FREE_BLOCK_IDS] = 0  # none free, none cached
    assert not fits(s, 0, 18) and fits(s, 0, 16)


def test_a_loaded_request_is_admitted_before_the_queue_ahead_of_it():
    """vLLM admits the requests holding blocks (their loads over) before the others
    (``kv_holding_waiting``). ShareGPT at 8 req/s on a 2 GiB pool that preempts again and again:
    the preempted requests' recomputes load their prompts from the host tier; were the queue's
    head admitted first, a head that does not fit would leave a loaded request behind it holding
    blocks in a pool nobody runs in (the run ends: 'waits for memory in an empty pool')."""
    from pagesim.traces.synth import make_workload

    t = make_workload("sharegpt", rate=8, duration_s=60, seed=0)
    cfg = SimConfig.for_system("vllm-v1", model="llama-2-13b", gpu="a100-40gb", kv_gib=2, max_seq_len=2048,
                               kv_offload_gib=16, check=False)
    s = run_simulation(cfg, t).summary
    assert s["completed"] == len(t) and s["host_prefix_hit_rate"] > 0


def test_a_finished_request_touches_its_blocks_after_the_next_passs_stores():
    """vLLM signals a finished request to the offloading manager in the next scheduling pass's
    connector metadata, after that pass's stores (offloading/scheduler.py:2167-2184). Two
    requests run at a time (max_num_seqs 2), a host tier of 3 blocks.

    Step 0 schedules A (prompt 8, hashes 1 2, 2 tokens out) and D (prompt 5, hash 5, 3 out): A
        offers first and takes the number 1, A0 ranking (1, -4) and A1 (1, -8); D takes 2, D0
        (2, -4). The tier is full. A finishes at step 1.
    C (prompt 5, hash 3), waiting, is admitted in the pass after: C takes 3 and stores C0,
        evicting the lowest rank, A1 (1, -8); then A is touched, A0 (4, 0).
    Touched as A finishes instead, A1 (3, 0) and A0 (4, 0), C (5) would evict D0 (2, -4)."""
    t = trace((0, 8, 2, (1, 2)), (0, 5, 3, (5,)), (0, 5, 1, (3,)))
    s = run_core(v1(64, 3, max_num_seqs=2), t)
    assert sorted(host_lru(s)) == sorted([key((1,), 0), key((5,), 1), key((3,), 2)])
    assert s.count[state.HOST_EVICTIONS] == 1


def test_a_store_the_tier_cannot_take_whole_stores_nothing():
    """A's prefill fills 3 prompt blocks (prompt 12, hashes 1 2 3) at once: a tier of 2 cannot
    take them, and vLLM stores none rather than 2 (``prepare_store`` returns None:
    cpu/manager.py:321-327). The offer is made again at each of its steps and as it finishes
    (offloading/scheduler.py:1988-1999, :1821-1836), refused each time. A tier of 3 stores all 3."""
    t = trace((0, 12, 3, (1, 2, 3)))
    assert run_core(v1(64, 2), t).count[state.HOST_STORED_BLOCKS] == 0
    assert run_core(v1(64, 3), t).count[state.HOST_STORED_BLOCKS] == 3


def test_a_block_being_stored_is_not_evicted():
    """A tier of 3. Step 0 prefills A (prompt 8, hashes 1 2) and B (prompt 8, hashes 3 4), each 2
    blocks. A's 2 are stored first; B's 2 need one block more than the free one, and A's, their
    stores not landed (131.072 us each, the step's start on), are pinned (``ref_cnt`` -1 until
    ``complete_store``, cpu/manager.py:362-380): B's store is refused whole. At step 1 A's have
    landed: B's store evicts A1, the lowest rank (1, -8), and its bytes go from step 1's start:
    its two blocks land 131.072 and 262.144 us after it, not within step 0."""
    s = run_core(v1(64, 3, max_num_seqs=2), trace((0, 8, 3, (1, 2)), (0, 8, 3, (3, 4))))
    assert sorted(host_lru(s)) == sorted([key((1,), 0), key((3,), 1), key((3, 4), 1)])
    assert (s.count[state.HOST_EVICTIONS], s.count[state.HOST_STORED_BLOCKS]) == (1, 4)
    step_1 = s.row_floats[1, state.ROW_START]
    ready = sorted(s.host_ready_s[b] for b in range(3)
                   if (s.host_blocks[b, HOST_KEY_END], s.host_blocks[b, HOST_KEY_CHAIN]) != key((1,), 0))
    assert ready == pytest.approx([step_1 + BLOCK_S, step_1 + 2 * BLOCK_S], abs=1e-12)


def test_a_block_whose_rank_rose_is_evicted_by_its_new_rank():
    """A tier of 3, one request at a time. A rise moves the block in the LRU's order.

    A (t 0): prompt 8, hashes 1 2: number 1, A0 (1, -4), A1 (1, -8); done: touched, A1 (2, 0),
        A0 (3, 0) (still being stored: a touch orders them all the same).
    B (t 1): prompt 8, hashes 1 3: number 4. It reads A0: (4, -4); B1 stored into the free block
        (4, -8). Done: B1 (5, 0), A0 (6, 0).
    D (t 2): prompt 8, hashes 7 8: number 7; it needs 2 blocks: the lowest ranks A1 (2, 0) and
        B1 (5, 0) are evicted. A0 stays.
    Evicting A0 by its rank before it rose, (3, 0), would keep B1."""
    t = trace((0, 8, 1, (1, 2)), (1, 8, 1, (1, 3)), (2, 8, 1, (7, 8)))
    s = run_core(v1(64, 3, max_num_seqs=1), t)
    assert sorted(host_lru(s)) == sorted([key((1,)), key((7,), 2), key((7, 8), 2)])
    assert s.count[state.HOST_EVICTIONS] == 2


def lists(s) -> tuple[list[int], dict[int, list[int]]]:
    """The host LRU's touched list and each request's group, first (lowest rank) to last."""
    def walk(b):
        out = []
        while b >= 0:
            out.append(b)
            b = int(s.host_blocks[b, HOST_NEXT])
        return out
    groups = s.host_work[GROUP_HEAP, :int(s.count[HOST_GROUPS])]
    return walk(int(s.count[HOST_TOUCHED_HEAD])), {int(i): walk(int(s.offload[i, OFFLOAD_FRONT]))
                                                            for i in groups}


def test_the_lru_lists_keep_the_rank_order():
    """The order by hand, on the functions (interpreted) over a tier of 4 host blocks, nothing
    being stored or loaded. Request 0 (number 1) ranks host block 0 as its block 3 (1, -16),
    block 1 as its block 0 (1, -4), block 2 as its block 2 (1, -12): its group, lowest first,
    is [0, 2, 1], wherever each was put. Request 1 (number 2) ranks block 3 as its block 0
    (2, -4). Block 2 touched: (3, 0), the touched list's. Evicting 3 for request 1's offer of its
    block 0 passes block 3 over and takes 0, 1 (request 0's) and 2 (the touched one), leaving
    request 1's group alone in the heap. Block 3 cannot be evicted while its store has not landed;
    2 blocks cannot be found: none is taken."""
    s = initial_state(v1(64, 4), trace((0, 16, 1, (1, 2, 3, 4)), (0, 8, 1, (5, 6))))
    rank_by, touch, evict = (interpreted(getattr(host_tier, name)) for name in ("rank_by", "touch", "evict"))
    for b, k in ((0, 3), (1, 0), (2, 2)):
        rank_by(s, 0, b, k)
    rank_by(s, 1, 3, 0)
    s.host_blocks[:4, HOST_KEY_END] = [16, 4, 12, 4]
    s.host_blocks[3, HOST_KEY_CHAIN] = prefix_cache.key_chain(s, 1, 0)
    assert lists(s) == ([], {0: [0, 2, 1], 1: [3]})
    assert [int(s.host_blocks[b, HOST_RANK]) for b in range(4)] == \
        [host_tier.RANK_SPAN - 16, host_tier.RANK_SPAN - 4, host_tier.RANK_SPAN - 12, 2 * host_tier.RANK_SPAN - 4]
    touch(s, 2)
    assert lists(s) == ([2], {0: [0, 1], 1: [3]}) and s.host_blocks[2, HOST_RANK] == 3 * host_tier.RANK_SPAN
    assert evict(s, 3, 1, 0, 1)
    assert s.host_work[CHOSEN_BLOCK, :3].tolist() == [0, 1, 2]
    assert lists(s) == ([], {1: [3]}) and s.offload[0, OFFLOAD_HEAP_AT] == -1
    s.host_blocks[3, HOST_PENDING] = 1  # its store not landed: it cannot be evicted
    assert not evict(s, 1, 0, 0, 0)
    s.host_blocks[3, HOST_PENDING] = 0
    assert not evict(s, 2, 0, 0, 0) and lists(s) == ([], {1: [3]})


def test_a_store_refused_is_made_again_as_its_request_finishes():
    """A tier of 3, two requests at a time. Step 0 prefills A (prompt 8, hashes 1 2, 3 tokens out)
    and B (prompt 8, hashes 3 4, 1 token out): A's 2 blocks are stored, B's store is refused (A's
    are pinned while being stored) and B finishes with the step. vLLM builds the stores of the
    requests a step finished in the next pass (``_build_store_jobs`` over ``finished_req_ids``,
    offloading/scheduler.py:1821-1836): B's evicts A1, (1, -8), and both its blocks are stored."""
    s = run_core(v1(64, 3, max_num_seqs=2), trace((0, 8, 3, (1, 2)), (0, 8, 1, (3, 4))))
    assert sorted(host_lru(s)) == sorted([key((1,), 0), key((3,), 1), key((3, 4), 1)])
    assert (s.count[state.HOST_EVICTIONS], s.count[state.HOST_STORED_BLOCKS]) == (1, 4)


def test_a_pass_stores_after_its_lookups():
    """vLLM prepares a step's stores in ``build_connector_meta``, once ``schedule`` has made every
    lookup (offloading/scheduler.py:687-693, :2168; v1 scheduler.py:1139), so a store cannot evict
    what a request admitted later in the same pass finds (host_tier.offer_scheduled). A pool of
    8 blocks, a host tier of 2.

    B (t 0): prompt 8, hashes 3 4: B0, B1 stored. D (t 1): prompt 29, 8 blocks: the GPU evicts
        B's; its 7 prompt blocks do not fit the tier: refused.
    A (prompt 8, hashes 1 2) and C (prompt 12, hashes 3 4 5) at t 2, A first: A is admitted;
        C's lookup finds B0 and B1 in the tier (the GPU has neither): it loads them (8 tokens).
        Then A's store: 2 blocks to evict, both being loaded: refused (and again as A
        finishes). Stored at A's admission, A's blocks would have evicted B's: no hit for C."""
    t = trace((0, 8, 1, (3, 4)), (1, 29, 1, range(11, 19)), (2, 8, 1, (1, 2)), (2, 12, 1, (3, 4, 5)))
    s = run_core(v1(32, 2), t)
    assert s.count[state.HOST_HIT_TOKENS] == 8
    assert key((1,), 2) not in host_lru(s) and key((1, 2), 2) not in host_lru(s)


def test_a_request_raises_a_key_at_its_first_use_only():
    """vLLM records the keys each request uses (``seen_keys``, cpu/manager.py:163-183): a key it
    holds rises to the request's rank at the request's first use of it only. The functions by
    hand (interpreted), a tier of 2, prompts of 8; each offer a second after the last (the stores
    before it landed). R0: hashes 1 2; R1: 1 5; R2: 7 8. A is the key of hash 1's block.
    R1 offers its block 1 alone: number 1, (1, -8). R0 offers block 0: A at number 2, (2, -4).
    R2 offers 0-1: both evicted; R2's at number 3. R1 offers block 0: A again, at R1's (1, -4),
        evicting R2's block 1 (3, -8).
    R0 offers 0-1: A is held, but R0 used it before: no rise, A stays (1, -4) (raised, it would
        rank (2, -4)); R0's block 1 is stored, evicting R2's block 0 (A is the offer's own)."""
    t = trace((0, 8, 1, (1, 2)), (0, 8, 1, (1, 5)), (0, 8, 1, (7, 8)))
    s = initial_state(v1(64, 2), t)
    store = interpreted(host_tier.store)
    for i, first, end in ((1, 1, 2), (0, 0, 1), (2, 0, 2), (1, 0, 1), (0, 0, 2)):
        s.clock[state.NOW] += 1.0
        store(s, i, first, end)
    held = {(int(row[HOST_KEY_END]), int(row[HOST_KEY_CHAIN])): int(row[HOST_RANK])
            for row in s.host_blocks[:2]}
    assert held == {key((1,)): host_tier.RANK_SPAN - 4, key((1, 2), 0): 2 * host_tier.RANK_SPAN - 8}


def test_a_finish_touches_the_keys_its_request_used():
    """The finish touches the keys the request used in its life, deepest first (cpu/manager.py:
    422-452), not those it holds in its prompt. Interpreted, a tier of 8, R0 and R1 both prompt
    16, hashes 1 2 3 4 (the same keys), each offer a second after the last.
    R0 offers blocks 0-1: (1, -4), (1, -8). R1 offers 0-3: it reads 0-1, its first use: (2, -4),
        (2, -8); stores 2-3: (2, -12), (2, -16). R0 finishes: its keys 1, 0 touched: (3, 0),
        (4, 0); blocks 2 and 3, in its prompt but never used by it, keep R1's ranks."""
    s = initial_state(v1(64, 8), trace((0, 16, 1, (1, 2, 3, 4)), (0, 16, 1, (1, 2, 3, 4))))
    store, finished = (interpreted(getattr(host_tier, name)) for name in ("store", "finished"))
    span = host_tier.RANK_SPAN

    def ranks():
        return {int(s.host_blocks[b, HOST_KEY_END]) // BS - 1: int(s.host_blocks[b, HOST_RANK])
                for b in range(int(s.count[state.HOST_USED]))}
    for i, end in ((0, 2), (1, 4)):
        s.clock[state.NOW] += 1.0
        store(s, i, 0, end)
    assert ranks() == {0: 2 * span - 4, 1: 2 * span - 8, 2: 2 * span - 12, 3: 2 * span - 16}
    finished(s, 0)
    assert ranks() == {0: 4 * span, 1: 3 * span, 2: 2 * span - 12, 3: 2 * span - 16}


def test_a_requests_entry_finds_its_keys_and_a_stale_one_falls_back_to_the_map():
    """``find`` reads the host block a request's entry names before the map (host_tier.find).
    Interpreted, a tier of 2, each store a second after the last. R0: prompt 8, no hashes (both
    its keys are its own); R1 and R2: prompt 4, hash 9 (one shared key, S).
    R0 stores its blocks 0-1 into host blocks 0, 1: its own keys, found from its entries, not put
    in the map. R1 stores S, evicting the lowest rank, R0's deeper block 1 ((1, -8) below
    (1, -4)), into host block 1, S alone in the map: R0's block 1 is not found, though its entry
    still names host block 1 (its own key: the map is not asked). R2 first finds S from the map,
    then from its entry."""
    t = trace((0, 8, 1, ()), (0, 4, 1, (9,)), (0, 4, 1, (9,)))
    s = initial_state(v1(64, 2), t)
    store, find = (interpreted(getattr(host_tier, name)) for name in ("store", "find"))

    def in_map():
        return s.host_entries[s.host_entries[:, ENTRY_BLOCK] >= 0, ENTRY_BLOCK].tolist()
    s.clock[state.NOW] += 1.0
    store(s, 0, 0, 2)
    assert (find(s, 0, 0), find(s, 0, 1)) == (0, 1) and in_map() == []
    s.clock[state.NOW] += 1.0
    store(s, 1, 0, 1)
    assert find(s, 0, 1) == -1 and find(s, 0, 0) == 0 and in_map() == [1]
    assert find(s, 2, 0) == 1  # from the map: R2 never used S
    s.host_entries[:, ENTRY_BLOCK] = -1
    assert find(s, 2, 0) == 1  # now from its entry


def test_a_request_whose_load_ended_takes_the_seat_it_holds():
    """The first test's run with ``max_num_seqs`` 1: C, loading, holds the one seat (a request
    loading counts against it here, vLLM's running list alone: sched/scheduler.py:1071-1074), the
    engine idle; as its load ends it is admitted to its seat as before (its TTFT the load and its
    step), where the pass once waited for a seat to free, and the run spun forever."""
    t = trace(*SHARED_ROWS)
    one, four = (run_simulation(v1(32, 16, max_num_seqs=seats), t) for seats in (1, 4))
    assert one.summary["unfinished"] == 0
    assert one.summary["host_loaded_gib"] == BLOCK_BYTES / 2**30
    ttft = one.requests.set_index("request_id")["ttft_s"]
    assert ttft["r2"] == four.requests.set_index("request_id")["ttft_s"]["r2"]
    assert ttft["r2"] > BLOCK_S
