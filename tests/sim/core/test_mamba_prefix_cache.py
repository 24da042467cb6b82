"""vLLM 0.33.0's prefix caching over Mamba state groups, its "align" mode (sim/core/kv/kv_cache.py
``take_state_blocks``, ``remove_skipped_states``, ``free_states``, ``state_blocks_to_allocate``;
sim/core/kv/prefix_cache.py ``group_hits``, ``register_state``; sim/core/sched/scheduler_v1.py
``mamba_aligned_split``), worked by hand: the rules and their citations are
docs/notes/mamba-align.md's. The runs are pagesim's side of the peer harness
(``tests.peers.pagesim_steps``: each step's tokens, each admission's hit, the blocks each request
holds per group, the blocks cached per group; the full group first, then the 3 Mamba groups),
every step checked (``--check``: ``check.check_groups``, ``check_group_cache``)."""

from __future__ import annotations

import pandas as pd
import pytest
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache, prefix_cache
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.config import SimConfig
from pagesim.sim.run import hybrid_groups, initial_state, run_simulation
from pagesim.sim.specs import get_model

from tests.peers import pagesim_steps
from tests.peers.workloads import MAMBA_PREFIX_WORKLOADS
from tests.sim.core.test_sliding_prefix_cache import cache
from pagesim.sim.core.kv.kv_cache import STATE_BLOCKS, STATE_SOURCE
from pagesim.sim.core.kv.prefix_cache import STATE_CACHED_STEP


def run(workload):
    return pagesim_steps.run(workload, "vllm-v1", check=True)


def records(steps) -> list:
    """Per step: (tokens scheduled, free blocks, the blocks each running request holds per group,
    the blocks cached per group)."""
    return [(dict(sorted(step.scheduled.items())), step.free_blocks, dict(sorted(step.group_blocks.items())),
             step.group_cached) for step in steps]


def test_the_notes_worked_example():
    """The note's section 7 (``jamba-prefix-repeat``, blocks of 16, 40 blocks). A (52 tokens, its
    first 48 those of hash chain 1-2-3) is cut at its last block boundary below it, floor(51 / 16)
    * 16 = 48, though the budget holds all 52: 3 full-attention blocks and one state block per Mamba
    group, at column 2, cached at once under the hash of 48 tokens (the replay boundary 51 floored);
    the states after 16 and 32 are never made. Step 1: the last 4 tokens take a 4th full block and a
    fresh state block per group (its state copied from column 2, which stays held this step: 2 each).
    Step 2: column 2 is let go (hashed: to the LRU's tail), 1 each; its decode states are never
    cached. B (60 tokens, the same 48) finds 48 in the full group and a state at 48 in all three
    Mamba groups: hit 48, 12 tokens computed, holding the hit state and a fresh one per group."""
    steps = run(MAMBA_PREFIX_WORKLOADS["jamba-prefix-repeat"])
    assert records(steps) == [
        ({0: 48}, 34, {0: (3, 1, 1, 1)}, (3, 1, 1, 1)),
        ({0: 4}, 30, {0: (4, 2, 2, 2)}, (3, 1, 1, 1)),
        ({0: 1}, 33, {0: (4, 1, 1, 1)}, (3, 1, 1, 1)),
        ({0: 1}, 33, {0: (4, 1, 1, 1)}, (3, 1, 1, 1)),
        ({1: 12}, 30, {1: (4, 2, 2, 2)}, (3, 1, 1, 1)),
        ({1: 1}, 33, {1: (4, 1, 1, 1)}, (3, 1, 1, 1))]
    assert [step.hits for step in steps if step.hits] == [{0: 0}, {1: 48}]


def test_the_sibling_misses_caches_its_junction_and_the_next_one_hits():
    """``jamba-prefix-sibling``: A (chain 1-2-3, 52 tokens) caches a state at 48 only. B (1-2-9, 60
    tokens) finds 32 tokens in the full group but no state at 32 or 16: hit 0, junction 32. It
    recomputes the 32 shared tokens (2 full blocks cached beside A's under the same keys: 5) and
    stops at the junction, caching its state there (2 a group); then 16 to its own boundary 48
    (cached: 3 a group), then 12. C (1-2-8) hits B's state at 32: 16 tokens (to 48), then 12."""
    steps = run(MAMBA_PREFIX_WORKLOADS["jamba-prefix-sibling"])
    assert [step.hits for step in steps if step.hits] == [{0: 0}, {1: 0}, {2: 32}]
    assert [(step.scheduled.get(1), step.group_cached) for step in steps[3:6]] == [
        (32, (5, 2, 2, 2)), (16, (6, 3, 3, 3)), (12, (6, 3, 3, 3))]
    assert steps[6].scheduled == {1: 1, 2: 16} and steps[6].group_blocks[2] == (3, 2, 2, 2)
    assert steps[7].scheduled == {2: 12}


def test_chunks_are_floored_to_blocks_and_a_budget_under_one_admits_nobody():
    """``jamba-prefix-same-step`` (a budget of 20): A (40 tokens) takes 16 (20 floored), then 16 (to
    its boundary 32), then 8; B (the same 40) is not admitted while the 4 tokens left are under a
    block (the chunk floors to 0: the waiting loop stops), and hits A's state at 32 in step 2 (8
    tokens); C (70 tokens, chain 1-2-3-4) hits 32 in step 3 and computes 16, 16, then 6."""
    steps = run(MAMBA_PREFIX_WORKLOADS["jamba-prefix-same-step"])
    assert [dict(sorted(step.scheduled.items())) for step in steps[:6]] == [
        {0: 16}, {0: 16}, {0: 8, 1: 8}, {0: 1, 1: 1, 2: 16}, {2: 16}, {2: 6}]
    assert [step.hits for step in steps if step.hits] == [{0: 0}, {1: 32}, {2: 32}]
    # the states cached: A's at 32 (its boundary: floor(39 / 16) * 16), not at 16 (a chunk end); C's at 64
    # (floor(69 / 16) * 16); decode states never, though C's 80th token fills a block (the full group's 5th)
    assert [step.group_cached for step in steps[:2]] == [(1, 0, 0, 0), (2, 1, 1, 1)]
    assert steps[15].group_blocks[2] == (5, 1, 1, 1) and steps[16].group_blocks[2] == (6, 2, 2, 2)
    assert steps[-1].group_cached == (5, 2, 2, 2)


def test_a_hit_on_a_state_cached_in_the_same_step_waits_a_step():
    """``jamba-prefix-same-step-hit``: two identical prompts of 40 tokens arriving together, a budget
    of 100. Step 0: A is cut at 32
    (its boundary) and caches its state there as it is scheduled; B finds 32 tokens in the full
    group and A's state at 32, but that state is hashed, not yet computed: its admission fails
    (single_type_kv_cache_manager.py:1704-1712) and the waiting loop ends. Step 1: A 8, B hits 32
    and computes 8."""
    steps = run(MAMBA_PREFIX_WORKLOADS["jamba-prefix-same-step-hit"])
    assert [dict(sorted(step.scheduled.items())) for step in steps[:2]] == [{0: 32}, {0: 8, 1: 8}]
    assert [step.hits for step in steps if step.hits] == [{0: 0}, {1: 32}]


def jamba_state():
    """``jamba-prefix-repeat``'s requests, not yet admitted: their keys, for the cache to be filled
    by hand."""
    workload = MAMBA_PREFIX_WORKLOADS["jamba-prefix-repeat"]
    with pagesim_steps.registered(workload):
        return initial_state(pagesim_steps.config(workload, "vllm-v1"), pagesim_steps.trace(workload))


def test_the_admission_count():
    """The note's section 6: B (60 tokens, hit 48, everything free): the full group cdiv(60, 16) - 3
    = 1 new block and its 3 hits out of the LRU; each Mamba group min(4 - 3, 1) = 1 new block and
    its hit state out of the LRU: 4 + 3 x 2 = 10. A hit state cached in this step: more than the
    pool. The hit needs the state in every Mamba group: in two of three it is a miss (hit 0,
    junction 3 blocks: the full group's run)."""
    s = jamba_state()
    assert (s.config[state.FULL_GROUPS], s.config[state.STATE_GROUPS], s.config[state.MAMBA_ALIGN]) == (1, 3, 1)
    cache(s, 1, range(3), 0)
    cache(s, 1, [2], 1)
    cache(s, 1, [2], 2)
    count = interpreted(kv_cache.group_blocks_to_allocate)
    assert count(s, 1, 60, True) == 4 + 3  # nothing cached: 4 full blocks, one state block a group
    hits = interpreted(prefix_cache.group_hits)
    assert hits(s, 1, 60) == (0, 3)
    cache(s, 1, [2], 3)
    assert hits(s, 1, 60) == (3, 0)
    assert count(s, 1, 60, True) == 10
    # a prompt of 49 tokens needs no block past its hit's but the state's fresh one (cdiv(49, 16) = 4)
    assert count(s, 1, 48, True) == 3 + 3
    b = interpreted(prefix_cache.group_lookup)(s, 1, 2, 2)
    s.count[state.SCHEDULED_STEPS] += 1
    s.block_info[b, STATE_CACHED_STEP] = s.count[state.SCHEDULED_STEPS]
    assert count(s, 1, 60, True) > s.config[state.NUM_BLOCKS]  # (the groups summed: kv_cache_coordinator.py:199-262)


def test_the_admission_takes_the_hit_state_alone_at_its_column():
    """After B's admission with hit 48: each Mamba group's table is null, null, the hit state
    (touched out of the LRU), and its first chunk's allocation (60 tokens: 4 columns) adds one fresh
    state at column 3, the hit's column its copy source."""
    s = jamba_state()
    cache(s, 1, range(3), 0)
    for g in (1, 2, 3):
        cache(s, 1, [2], g)
    assert interpreted(kv_cache.allocate_group_hits)(s, 1, 60) == 48
    interpreted(kv_cache.grow)(s, 1, 60)
    row, width = s.block_table[s.seq_slot[1, 0]], s.block_table.shape[1] // 4
    for g in (1, 2, 3):
        assert list(row[g * width:g * width + 4] >= 0) == [False, False, True, True]
    assert s.window[1, STATE_SOURCE] == 3 and s.count[STATE_BLOCKS] == 6
    assert s.count[state.NUM_LRU] == 0
    # processed 60 tokens: the copy source (column 2 < cdiv(60, 16) - 1) goes back to the LRU, keyed
    interpreted(kv_cache.remove_skipped_states)(s, 1, 60)
    for g in (1, 2, 3):
        assert list(row[g * width:g * width + 4] >= 0) == [False, False, False, True]
    assert s.count[STATE_BLOCKS] == 3 and s.count[state.NUM_LRU] == 3


@pytest.mark.parametrize("name", [name for name in MAMBA_PREFIX_WORKLOADS if not name.startswith("gdn")])
def test_the_mamba_prefix_workloads_run_checked(name):
    """Every Jamba-like peer workload runs with every step checked."""
    steps = run(MAMBA_PREFIX_WORKLOADS[name])
    assert steps and any(hit for step in steps for hit in step.hits.values())


def test_refused_with_speculative_decoding_or_the_cpu_tier_or_gated_delta_net():
    """One line each: not modelled (sim/run.py ``hybrid_groups``)."""
    workload = MAMBA_PREFIX_WORKLOADS["jamba-prefix-repeat"]
    with pagesim_steps.registered(workload):
        for overrides, words in (({"num_speculative_tokens": 2, "speculative_method": "ngram"}, "speculative"),
                                 ({"kv_offload_gib": 1.0}, "--kv-offload-gib")):
            with pytest.raises(ConfigError, match=words):
                initial_state(pagesim_steps.config(workload, "vllm-v1", **overrides), pagesim_steps.trace(workload))
    cfg = SimConfig.for_system("vllm-v1", model="qwen3-next-80b-a3b", gpu="h100-80gb")
    with pytest.raises(ConfigError, match="gated-delta-net"):
        hybrid_groups(cfg, get_model(cfg.model))


def test_a_request_that_preempts_itself_is_admitted_again_at_once():
    """Issue 80 (a Jamba hybrid at block 256): Jamba-1.5-mini (1 full + 7 state groups of 4
    layers), blocks of 256, prefix caching ("align" mode), async scheduling, a budget of 512, and
    a pool of 18 blocks: what vLLM requires for one 1024-token request (4 full blocks and 2 per
    state group). One request, prompt 856 + 168 output::

        step 0  prefills 512 (block-aligned): 2 full blocks and a state per group, 9 used
        step 1  prefills 256 to 768, the last checkpoint below its 856 tokens: 17 used
        step 2  its last 88 tokens need a 4th full block and a state per group (8) with 1 free:
                it preempts itself, the last running request, so the pass admits nobody
                (scheduler.py:1050); the next pass, at the same instant, admits it into the
                emptied pool on its cached 768 tokens and prefills 88: 18 used

    Before, the run ended there: "request 0 waits for memory in an empty pool"."""
    trace = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "prompt_tokens": [856], "output_tokens": [168]})
    cfg = SimConfig.for_system("vllm-v1", model="jamba-1.5-mini", gpu="a100-80gb", tensor_parallel=2,
                               max_seq_len=1024, block_size=256, kv_gib=18 * 256 * 8192 / 2**30, max_num_seqs=1,
                               prefix_caching=True, async_scheduling=True, max_num_batched_tokens=512, check=True)
    result = run_simulation(cfg, trace)
    assert result.requests["status"].tolist() == ["finished"]
    assert result.requests["preemptions"].tolist() == [1]
    steps = result.steps
    assert steps["num_prefill_tokens"].tolist()[:3] == [512, 256, 88]
    assert steps["used_blocks"].tolist()[:3] == [9, 17, 18]
    assert steps["start_s"][2] == steps["start_s"][1] + steps["dt_s"][1]  # no time between the two passes
