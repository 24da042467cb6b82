"""vLLM v1's speculative decoding (``--num-speculative-tokens``, sim/core/sched/speculative.py, as of
vLLM 0.33.0), pinned by tiny runs worked out by hand.

Pools of 4-slot blocks (OPT-13B, roofline, no async scheduling, every step checked). L is a
request's computed tokens at a step's start (pagesim counts a decode's input token when it is
scheduled), F its final length, H its speculative mark (computed + scheduled + lookahead when
scheduled), A its blocks' slots. Speculative slack is H - L, of which min(H, F) - L would have
been reservation and the rest internal fragmentation.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.cluster import run_cluster
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.price.cost import roofline_step_time
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, run_simulation

from tests.sim.helpers import OPT13B_SLOT, assert_simulate_refuses, ConstExecutor, rand_trace

BS = 4


def v1(slots: int = 256, **settings) -> SimConfig:
    settings.setdefault("async_scheduling", False)
    settings.setdefault("cost_model", "roofline")
    settings.setdefault("max_seq_len", 64)
    settings.setdefault("max_num_seqs", 4)
    settings.setdefault("check", True)
    return SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-40gb", kv_gib=slots * OPT13B_SLOT / 2**30,
                                block_size=BS, **settings)


def trace(*rows) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens)."""
    arrival, prompt, output = zip(*rows)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(a) for a in arrival],
                         "prompt_tokens": list(prompt), "output_tokens": list(output)})


def column(result, name):
    return result.steps[name].tolist()


def test_rate_0_gives_one_token_a_step_and_leaves_the_drafts_slots_as_slack():
    """n-gram (no lookahead), K = 3, every draft rejected. A: prompt 4, output 4 (F = 8).

    step 0  prefill 4 into 1 block: L 4, A 4, no slack; its first token
    step 1  1 + 3 query tokens: blocks for 4 + 4 = 8 (2); L 5, H 8: slack 3 (all below F);
            reservation min(8, 8) - 5 - 3 = 0. All rejected: 1 token (its 2nd), L stays 5
    step 2  blocks for 5 + 4 = 9 (3, A 12); L 6, H 9: slack 3, of which min(9, 8) - 6 = 2 below
            F; internal fragmentation 12 - 8 - (3 - 2) = 3. Its 3rd token
    step 3  blocks for 6 + 4 = 10 (still 3); L 7, H 10: slack 3 (1 below F); internal
            12 - 8 - 2 = 2. Its 4th token: done. Four steps, as without speculation
    """
    result = run_simulation(v1(num_speculative_tokens=3, spec_acceptance_rate=0.0), trace((0, 4, 4)))
    assert column(result, "num_prefill_tokens") == [4, 0, 0, 0]
    assert column(result, "num_decode_tokens") == [0, 4, 4, 4]  # a token and 3 drafts
    assert column(result, "mem_token_states") == [4, 5, 6, 7]
    assert column(result, "mem_speculative_slack") == [0, 3, 3, 3]
    assert column(result, "mem_reservation") == [0, 0, 0, 0]
    assert column(result, "mem_internal_frag") == [0, 0, 3, 2]
    assert result.summary["spec_acceptance_rate"] == 0.0
    assert result.summary["spec_tokens_per_step"] == 1.0


def test_rate_1_gives_k_plus_1_tokens_a_step_up_to_the_output_length():
    """n-gram, K = 3, every draft accepted. A: prompt 4, output 10 (F = 14).

    step 0  prefill 4: L 4; its 1st token
    step 1  L 5, H 8 (blocks 2): slack 3. 3 accepted + 1: tokens 2-5; L 5 + 3 = 8, slack 0
    step 2  L 9, H 12 (blocks 3): slack 3. Tokens 6-9; L 12
    step 3  L 13, H 16 (blocks 4, A 16): slack 3, min(16, 14) - 13 = 1 below F: reservation
            14 - 13 - 1 = 0, internal 16 - 14 - 2 = 0. 3 accepted, but 1 token is left of its
            output: it emits 1 (the rest trimmed, scheduler.py:2752-2764) and is done
    Four steps for 10 tokens (ten without speculation); 9 drafts, all accepted, 3 verifications.
    """
    result = run_simulation(v1(num_speculative_tokens=3, spec_acceptance_rate=1.0), trace((0, 4, 10)))
    assert len(result.steps) == 4
    assert column(result, "mem_token_states") == [4, 5, 9, 13]
    assert column(result, "mem_speculative_slack") == [0, 3, 3, 3]
    assert column(result, "mem_internal_frag") == [0, 0, 0, 0]
    assert result.requests["status"].tolist() == ["finished"]
    s = result.summary
    assert (s["spec_draft_tokens"], s["spec_accepted_tokens"]) == (9, 9)
    assert (s["spec_acceptance_rate"], s["spec_accepted_per_step"], s["spec_tokens_per_step"]) == (1.0, 3.0, 4.0)
    assert s["total_output_tokens"] == 10
    # the trimmed drafts are not computed: its 13 computed tokens' 3 full blocks stay cached
    # after it (prefix caching, vllm-v1's default); with them, 16 tokens would leave 4
    assert s["mgr_cached_blocks"] == 3


def test_eagle_allocates_k_lookahead_slots_past_the_scheduled_tokens():
    """EAGLE, K = 2: num_lookahead_tokens 2 (config/vllm.py:646-651). A: prompt 4, output 3 (F 7).

    step 0  prefill 4, blocks for 4 + 2 = 6 (2, A 8): L 4, H 6: slack 2 (below F); reservation
            min(8, 7) - 4 - 2 = 1, internal 8 - 7 = 1
    step 1  1 + 2 query tokens, blocks for 4 + 3 + 2 = 9 (3, A 12): L 5, H 9: slack 4, of which
            min(9, 7) - 5 = 2 below F: reservation 7 - 5 - 2 = 0, internal 12 - 7 - 2 = 3
    step 2  blocks for 5 + 3 + 2 = 10 (3): L 6, H 10: slack 4 (1 below F): internal 12 - 7 - 3 = 2
    """
    result = run_simulation(v1(num_speculative_tokens=2, speculative_method="eagle", spec_acceptance_rate=0.0),
                            trace((0, 4, 3)))
    assert column(result, "mem_token_states") == [4, 5, 6]
    assert column(result, "mem_speculative_slack") == [2, 4, 4]
    assert column(result, "mem_reservation") == [1, 0, 0]
    assert column(result, "mem_internal_frag") == [1, 3, 2]


def test_a_draft_model_takes_a_slot_of_the_budget_per_request():
    """Draft model, K = 3: each scheduled request takes one input slot beyond its tokens
    (max_num_new_slots_for_drafting, config/speculative.py:2094-2096). Budget 8; A and B (prompt
    4, output 3) arrive together; every draft rejected.

    step 0  A: min(4, 8 - 1) = 4 (budget 8 - 5 = 3); B: min(4, 3 - 1) = 2, a chunk (budget 0)
    step 1  A decodes 1 + 3 (budget 3); B: its last 2 prompt tokens (min(2, 3 - 1))
    step 2  A: 1 + 3 (its 3rd token: done; budget 3); B: min(4, 3 - 1) = 2, one draft
    step 3  B: 1 + 3 (its 3rd token: done)
    """
    result = run_simulation(v1(max_num_batched_tokens=8, num_speculative_tokens=3, speculative_method="draft-model",
                               draft_model="opt-13b", spec_acceptance_rate=0.0), trace((0, 4, 3), (0, 4, 3)))
    assert column(result, "num_prefill_tokens") == [6, 2, 0, 0]
    assert column(result, "num_decode_tokens") == [0, 4, 6, 4]


def test_drafts_are_cut_to_max_model_len():
    """n-gram, K = 3, rate 0, max_seq_len 12. A: prompt 4, output 8 (F 12). A decode after L
    computed tokens schedules min(1 + 3, 12 - L - 1) (scheduler.py:852-857): L = 4..7 give 4,
    L = 8 gives 3 (2 drafts), 9 gives 2, 10 gives 1 (no draft)."""
    result = run_simulation(v1(48, max_seq_len=12, num_speculative_tokens=3, spec_acceptance_rate=0.0),
                            trace((0, 4, 8)))
    assert column(result, "num_decode_tokens") == [0, 4, 4, 4, 4, 3, 2, 1]
    assert result.summary["spec_draft_tokens"] == 4 * 3 + 2 + 1


def test_an_admission_needs_room_for_its_lookahead_slots():
    """EAGLE, K = 2, a pool of 3 blocks. A and B (prompt 4, output 1) arrive together.

    step 0  A: its whole sequence fits (1 block), and its prompt with 2 lookahead slots needs
            2 blocks (kv_cache_manager.py:548-585): admitted, 1 block left. B: its sequence
            would fit the 1 left, its 4 + 2 slots would not: it waits. A's token: done
    step 1  B admitted
    """
    result = run_simulation(v1(12, max_seq_len=12, num_speculative_tokens=2, speculative_method="eagle"),
                            trace((0, 4, 1), (0, 4, 1)))
    assert column(result, "num_prefill_tokens") == [4, 4]
    assert column(result, "num_waiting") == [1, 0]


def test_an_admissions_lookahead_count_takes_the_hits_of_its_own_tokens():
    """The run above with prefix caching, A and B the same one block (hash 1). As B is tested A's
    block is cached. B's hit is looked up with its 4 tokens (at most 3, no whole block: none),
    for the whole sequence and for its 4 + 2 slots alike (``new_computed_blocks``, found once:
    kv_cache_manager.py:530-579): 2 fresh blocks, 1 free, B waits. (Looked up with 6 tokens, A's
    block was a hit that cost nothing: B was admitted into 1 block and took 2, the pool overdrawn.)"""
    rows = trace((0, 4, 1), (0, 4, 1))
    rows["prefix_hashes"] = [(1,), (1,)]
    rows.attrs["hash_block_tokens"] = BS
    result = run_simulation(v1(12, max_seq_len=12, num_speculative_tokens=2, speculative_method="eagle",
                               prefix_caching=True), rows)
    assert column(result, "num_prefill_tokens") == [4, 4]
    assert column(result, "num_waiting") == [1, 0]


def test_a_cluster_sums_its_replicas_drafts():
    """Two replicas, round robin, each given one request of the rate-1 run above (3
    verifications of 3 drafts, all accepted): the cluster's summary counts 18 and 18."""
    cfg = v1(num_speculative_tokens=3, spec_acceptance_rate=1.0, check=False)
    s = run_cluster(cfg, trace((0, 4, 10), (0, 4, 10)), 2, "round-robin").summary
    assert (s["spec_draft_tokens"], s["spec_accepted_tokens"], s["spec_tokens_per_step"]) == (18, 18, 4.0)


def test_a_table_of_rates_accepts_position_by_position():
    """Rates 1, 0, 1: the first draft is always accepted, the second never, so the third is
    never reached (the sampler stops at the first rejection). A: prompt 4, output 5: its 1st
    token at the prefill, then 2 a step: 3 steps; 2 verifications of 3 drafts, 2 accepted."""
    result = run_simulation(v1(num_speculative_tokens=3, spec_acceptance_rates="1,0,1"), trace((0, 4, 5)))
    assert len(result.steps) == 3
    s = result.summary
    assert (s["spec_draft_tokens"], s["spec_accepted_tokens"], s["spec_tokens_per_step"]) == (6, 2, 2.0)


def test_a_verification_step_is_priced_with_k_plus_1_query_tokens_and_the_drafter():
    """EAGLE, K = 7: 40 requests (prompt 4, output 3) arrive together and are prefilled in step
    0. Step 1: 40 decodes of 1 + 7 query tokens (320 tokens: enough that the GEMMs, not the
    weights' reads, set the roofline's price), each after 4 computed, its contexts
    5 + 6 + ... + 12 = 68 (speculative.verify_context): 2720 in all. The drafter: K / layers =
    7 / 40 of a decode step of the 40 requests, one token each over their 5."""
    cfg = v1(1024, max_num_seqs=64, num_speculative_tokens=7, speculative_method="eagle", spec_acceptance_rate=0.0)
    rows = [(0, 4, 3)] * 40
    result = run_simulation(cfg, trace(*rows))
    assert column(result, "num_decode_tokens")[1] == 320
    c = initial_state(cfg, trace(*rows)).cost
    zero = np.int64(0)
    target = roofline_step_time(c, 40, 320, 2720, 0, 0.0, zero, 0, 0)
    drafter = roofline_step_time(c, 40, 40, 200, 0, 0.0, zero, 0, 0)
    assert target > roofline_step_time(c, 40, 40, 2720, 0, 0.0, zero, 0, 0)  # the query tokens count
    assert result.steps["dt_s"][1] == pytest.approx(target + 7 / 40 * drafter, rel=1e-12)


def test_same_seed_same_draws_and_the_rate_is_geometric():
    """Rate 0.5, K = 3 over many steps: a verification accepts 0.5 + 0.25 + 0.125 = 0.875
    drafts on average (acceptance rate 0.875 / 3); the same seed draws the same again."""
    cfg = v1(4096, max_seq_len=512, max_num_seqs=64, num_speculative_tokens=3, spec_acceptance_rate=0.5,
             check=False, seed=7)
    t = rand_trace(3, n=200)
    a, b = run_simulation(cfg, t), run_simulation(cfg, t)
    assert a.summary["spec_accepted_tokens"] == b.summary["spec_accepted_tokens"]
    assert a.steps["dt_s"].tolist() == b.steps["dt_s"].tolist()
    assert a.summary["spec_accepted_per_step"] == pytest.approx(0.875, abs=0.03)
    assert a.summary["spec_acceptance_rate"] == pytest.approx(0.875 / 3, abs=0.01)


@pytest.mark.parametrize("method", ["ngram", "eagle", "draft-model"])
def test_the_categories_sum_to_capacity_under_preemption(method):
    """A small pool (64 blocks) that preempts: every step is checked (--check: the slack
    counters against their sums, the seven categories against the capacity)."""
    extra = dict(draft_model="opt-13b") if method == "draft-model" else {}
    cfg = v1(256, max_seq_len=256, max_num_seqs=16, num_speculative_tokens=3, speculative_method=method,
             spec_acceptance_rate=0.6, **extra)
    result = run_simulation(cfg, rand_trace(5, n=40, max_len=120))
    assert result.summary["num_preemptions"] > 0
    mem = result.steps[[c for c in result.steps if c.startswith("mem_")]]
    assert (mem.sum(axis=1) == 256).all()
    assert result.steps["mem_speculative_slack"].max() > 0


@pytest.mark.parametrize("argv, words", [
    (["--system", "vllm", "--num-speculative-tokens", "3"], "applies to the vllm-v1 scheduler"),
    (["--system", "vllm-v1", "--num-speculative-tokens", "3", "--spec-acceptance-rate", "1.5"],
     "spec_acceptance_rate must be <= 1"),
    (["--system", "vllm-v1", "--speculative-method", "eagle"], "speculative-method does nothing"),
    (["--system", "vllm-v1", "--num-speculative-tokens", "3", "--speculative-method", "draft-model"],
     "needs --draft-model"),
    (["--system", "vllm-v1", "--num-speculative-tokens", "2", "--spec-acceptance-rates", "0.5"],
     "spec_acceptance_rates takes 2"),
])
def test_refused_in_one_line(argv, words, capsys):
    assert_simulate_refuses(argv, words, capsys)


def test_refused_with_parallel_sampling():
    t = trace((0, 4, 3))
    t["n"] = [2]
    with pytest.raises(ConfigError, match="n / beam_width > 1"):
        run_simulation(v1(num_speculative_tokens=3), t)


def test_an_executor_outside_the_core_runs_speculation_only_if_it_only_times_the_steps():
    """The rate-1 run above (A: prompt 4, output 10: 4 steps) under an executor of 1 s steps
    (tests/peers' recorder is one): refused unless it says it only times them
    (sim.executor.only_times; the GPU's verifies no drafts); with it, the core's draws decide
    as without one: 4 steps, at 0, 1, 2 and 3 s, 9 drafts accepted."""
    cfg = v1(num_speculative_tokens=3, spec_acceptance_rate=1.0)
    with pytest.raises(ConfigError, match="verifies no drafts"):
        run_simulation(cfg, trace((0, 4, 10)), executor=ConstExecutor())
    timer = ConstExecutor()
    timer.only_times = True
    result = run_simulation(cfg, trace((0, 4, 10)), executor=timer)
    assert column(result, "start_s") == [0.0, 1.0, 2.0, 3.0]
    assert result.summary["spec_accepted_tokens"] == 9


def hashed(*rows) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens, prefix hashes: one per 4 prompt tokens)."""
    df = trace(*(row[:3] for row in rows))
    df["prefix_hashes"] = [tuple(row[3]) for row in rows]
    df.attrs["hash_block_tokens"] = BS
    return df


def test_an_admission_with_one_token_left_is_padded_to_k_plus_1():
    """n-gram, K = 3, rate 0, prefix caching; vLLM pads such an admission's token with K
    placeholder drafts (scheduler.py:1308-1330). A (t 0): prompt 5 (hash 1), output 1; its first
    block stays cached. B (t 1): the same prompt, 4 tokens hit, 1 left, nothing running but B
    has computed tokens: 1 + 3 query tokens, blocks for 4 + 4 = 8 (L 5, H 8: slack 3); the
    placeholders are rejected: 3 drafted, none accepted, its one token.
    With C (t 1, prompt 20, ahead of B) and a budget of 16: step 1 admits C's first 16 tokens
    and nothing more; at step 2 C, running, is mid-prompt (4 tokens), so B is not padded: 1
    token (an admission before B would not have stopped it: prefill_scheduled is the running
    list's, :998)."""
    cfg = v1(64, num_speculative_tokens=3, spec_acceptance_rate=0.0, prefix_caching=True)
    padded = run_simulation(cfg, hashed((0, 5, 1, (1,)), (1, 5, 1, (1,))))
    assert column(padded, "num_prefill_tokens") == [5, 1]
    assert column(padded, "num_decode_tokens") == [0, 3]  # the placeholders, verified as drafts
    assert column(padded, "mem_speculative_slack") == [0, 3]
    assert (padded.summary["spec_draft_tokens"], padded.summary["spec_acceptance_rate"]) == (3, 0.0)
    beside = run_simulation(v1(64, num_speculative_tokens=3, spec_acceptance_rate=0.0, prefix_caching=True,
                               max_num_batched_tokens=16),
                            hashed((0, 5, 1, (1,)), (1, 20, 1, (2, 3, 4, 5, 6)), (1, 5, 1, (1,))))
    assert column(beside, "num_prefill_tokens") == [5, 16, 4 + 1]
    assert column(beside, "mem_speculative_slack") == [0, 0, 0]
    assert beside.summary["spec_draft_tokens"] == 0


def test_eagles_block_key_covers_the_token_after_the_block():
    """EAGLE, K = 1, rate 0, prefix caching: a block's hash covers the token after it too
    (``num_hash_lookahead_tokens`` 1, config/vllm.py:677-692; kv_cache_utils.py:1003-1027), so a
    hit stops a block before where two prompts part on a block boundary.
    A (t 0): prompt 9, hashes 1 2, output 1: prefilled, its blocks 0 (tokens 0-3) and 1 (4-7)
        hashed (each has the token after it) and cached; done.
    B (t 1): prompt 9, hashes 1 3: block 0's tokens are A's, but its key covers token 4, in hash
        block 3: no hit, 9 tokens (without the lookahead: block 0 a hit, 5 tokens).
    C (t 2): prompt 9, hashes 1 2, A's prompt but its own 9th token: block 0 a hit; block 1's key
        covers token 8, C's own: no hit, 5 tokens (without the lookahead: 2 hits, 1 token)."""
    cfg = v1(64, num_speculative_tokens=1, speculative_method="eagle", spec_acceptance_rate=0.0,
             prefix_caching=True)
    result = run_simulation(cfg, hashed((0, 9, 1, (1, 2)), (1, 9, 1, (1, 3)), (2, 9, 1, (1, 2))))
    assert column(result, "num_prefill_tokens") == [9, 9, 5]
    assert result.summary["mgr_prefix_hit_tokens"] == 4


def test_eagles_prompt_block_is_cached_once_its_first_token_is_sampled():
    """EAGLE, K = 1, rate 0, prefix caching, a pool of 5 blocks. B (t 0): prompt 7, output 2;
    A (t 0): prompt 8, hashes 1 2, output 2.
    step 0  B: 7 tokens and a lookahead slot, 2 blocks; A: 8 and 1, 3 blocks; pool full. A's
            block 0 is cached (token 4 exists), its block 1 (tokens 4-7) is not: token 8, which its
            hash covers, is not sampled yet (kv_cache_utils.py:973-979). After the step A samples
            it, and with drafts vLLM caches each running request's blocks at once
            (scheduler.py:2401-2415): block 1 is cached
    step 1  B (the running list's first) verifies 1 + 1 tokens into 7 + 2 + 1 slots: a third block,
            none free: A (the last) is preempted, its lookahead block to be reused first, its
            cached blocks 0 and 1 to the LRU; B takes the uncached one. B's 2nd token: done
    step 2  A again: 9 tokens (8 + its first), at most 8 hits: blocks 0 and 1, 1 token left (and a
            placeholder draft: speculative.pads). Were block 1 cached at A's next pass only, as
            vLLM's ``allocate_slots`` does without drafts, it would be lost: 5 tokens."""
    cfg = v1(20, max_seq_len=20, num_speculative_tokens=1, speculative_method="eagle", spec_acceptance_rate=0.0,
             prefix_caching=True)
    result = run_simulation(cfg, hashed((0, 7, 2, ()), (0, 8, 2, (1, 2))))
    assert column(result, "num_prefill_tokens") == [15, 0, 1]
    assert result.summary["num_preemptions"] == 1
    assert result.summary["mgr_prefix_hit_tokens"] == 8


@pytest.mark.parametrize("check", [True, False])
def test_a_pool_of_one_long_request_and_lookahead_slots_serves_every_request(check):
    """Issue 80: EAGLE, K = 4 (4 lookahead slots), prefix caching, 42 blocks (168 slots) with
    max_seq_len 128 (32 blocks) and at most 3 running; A (4 + 24 tokens), B (22 + 41), C
    (50 + 40: its first 32-token hash block a whole prompt block, key 1) and D (1 + 85), every draft
    rejected. Each sequence fits the pool whole (7, 16, 23 and 22 blocks), so every request ends,
    finished, checked or not. Before 9ec5094 a block a prompt ends inside took the trace's hash as
    its key (A's and D's first blocks key 1, C's whole prompt block's): EAGLE's admission counts,
    reaching past the prompt into the lookahead slots, took such blocks as hits, the pool was
    overdrawn, and unchecked the run ended with D waiting for memory in an empty pool
    (InvariantError); under ``--check`` a block table held -1. Without lookahead slots (n-gram,
    no drafts) the same requests ran to their ends."""
    rows = trace((0, 4, 24), (0, 22, 41), (0, 50, 40), (0, 1, 85))
    rows["prefix_hashes"] = [(1,), (0,), (1, 0), (1,)]
    rows.attrs["hash_block_tokens"] = 32
    result = run_simulation(v1(168, max_seq_len=128, max_num_seqs=3, max_num_batched_tokens=2048, prefix_caching=True,
                               speculative_method="eagle", num_speculative_tokens=4, spec_acceptance_rate=0.0,
                               check=check), rows)
    assert result.requests["status"].tolist() == ["finished"] * 4
