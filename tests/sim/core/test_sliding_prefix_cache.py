"""vLLM 0.33.0's prefix caching over sliding-window KV cache groups (sim/core/kv/prefix_cache.py
``group_hits``, ``register_group_blocks``; sim/core/kv/kv_cache.py ``allocate_group_hits``,
``group_blocks_to_allocate``, ``free_groups``), worked by hand: the rules and their citations are
docs/notes/swa-prefix-caching.md's. The runs are pagesim's side of the peer harness
(``tests.peers.pagesim_steps``: each step's tokens, each admission's hit, the blocks each request
holds per group, the blocks cached per group; full groups first), every step checked (``--check``:
``check.check_group_cache``)."""

from __future__ import annotations

import numpy as np
import pytest
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache, prefix_cache
from pagesim.sim.core.sched import lifecycle, scheduler_v1
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state

from tests.peers import pagesim_steps
from tests.peers.workloads import (EXAMPLE_LIKE, EXAMPLE_ROWS, GROUP_PREFIX_WORKLOADS, SLIDING, Layers, Row,
                                   grouped)
from pagesim.sim.core.kv.kv_cache import WINDOW_CAP_BLOCKS, WINDOW_SKIPPED


def run(workload):
    return pagesim_steps.run(workload, "vllm-v1", check=True)


def admissions(steps) -> dict:
    """Each admission's step: (its hit tokens, its blocks held per group once scheduled)."""
    return {i: (k, hit, step.group_blocks[i]) for k, step in enumerate(steps) for i, hit in step.hits.items()}


def test_the_notes_example():
    """The note's section 6: window 8, blocks of 4 (a sliding hit needs cdiv(7, 4) = 2 cached
    blocks in a row), layer 0 slides (vLLM's group 0), 64 blocks; five requests over one prefix of
    5 blocks (20 tokens).

    r0 (26 tokens): no hit; 7 blocks per group; the full group caches its 6 full blocks, the sliding
    one blocks 4-5 (before the replay boundary 25: floor(25 / 4) = 6). Its 2 outputs fill block 6:
    the full group caches it (7), the sliding one not (a generated block).
    r1 (30 tokens): the full group finds 5 blocks; the sliding group, searching blocks 4..0, finds
    block 4 (r0's) but not 3: no run of 2, no leading run: hit 0, junction 20. It computes all 30
    (8 blocks a group), caching 7 full blocks (copies beside r0's 0-4 too: 14) and in the sliding
    group blocks 3-4 (before the junction) and 5-6 (before floor(29 / 4) = 7): 2 + 4 = 6; its
    outputs fill block 7 (full: 15).
    r2 (23 tokens): blocks 3 (r1's) and 4 (r0's) in a row: hit 20; it holds the full group's 5
    blocks and one new, the sliding group's 3-4 (nulls before: the window skips 0-2) and one new:
    (6, 3); it computes 3 tokens. r3 and r4 (24 tokens, the prefix and block 5 of their own chain:
    identical prompts): at most 23 tokens, 5 blocks: hit 20 both, 4 tokens computed; each caches
    block 5 in the full group (r4's a copy beside r3's), nothing in the sliding group (its
    boundaries' blocks are hits)."""
    steps = run(GROUP_PREFIX_WORKLOADS["example"])
    assert [(i, k, hit, held) for i, (k, hit, held) in admissions(steps).items()] == [
        (0, 0, 0, (7, 7)), (1, 3, 0, (8, 8)), (2, 6, 20, (6, 3)), (3, 9, 20, (6, 3)), (4, 11, 20, (6, 3))]
    assert [steps[k].scheduled[i] for i, (k, _, _) in admissions(steps).items()] == [26, 30, 3, 4, 4]
    cached = [step.group_cached for step in steps]
    assert cached[0] == (6, 2) and cached[2] == (7, 2)  # r0: its 6 full blocks, then its output block
    assert cached[3] == (14, 6) and cached[5] == (15, 6)  # r1: 7 full; sliding 3-4 and 5-6
    # r2 fills its block 5 (tokens 20-23) with its first output, at step 7; r3 and r4 as admitted
    assert cached[6:] == [(15, 6), (16, 6), (16, 6), (17, 6), (17, 6), (18, 6), (18, 6)]


def test_a_model_whose_layers_all_slide_has_no_junction():
    """The example's requests over one sliding layer (one group: vLLM's unitary coordinator, no
    shared-prefix junction). Each request caches only the 2 blocks before floor((P - 1) / 4): r0
    blocks 4-5, r1 5-6 (its own past the prefix), r2 (23 tokens) 3-4. r1 finds block 4 (r0's), not 3:
    hit 0; so does r2 (block 3 is nobody's yet); r3, after r2, finds 3-4: hit 20, the first. Without
    a junction r1 never caches blocks 3-4 (with the full layer it did: hit 20 for r2)."""
    steps = run(grouped("example-sliding", Layers("example-sliding", (SLIDING,), window=8), EXAMPLE_ROWS,
                        num_blocks=64, block_size=4, max_model_len=64, prefix_caching=True))
    assert {i: hit for i, (_, hit, _) in admissions(steps).items()} == {0: 0, 1: 0, 2: 0, 3: 20, 4: 20}
    assert [steps[k].group_cached for k in (0, 3, 6, 9, 11)] == [(2,), (4,), (6,), (6,), (6,)]


def hybrid_state(prompt: int, hashes: tuple):
    """One request of ``prompt`` tokens over the example's layers (window 8, blocks of 4), not yet
    admitted: its keys per group, for the cache to be filled by hand."""
    workload = grouped("by-hand", EXAMPLE_LIKE, [Row(0.0, prompt, 40, hashes=hashes)], num_blocks=64,
                       block_size=4, max_model_len=64, prefix_caching=True)
    with pagesim_steps.registered(workload):
        return initial_state(pagesim_steps.config(workload, "vllm-v1"), pagesim_steps.trace(workload))


def cache(s, i, blocks, group):
    """Key request ``i``'s ``blocks`` in ``group`` (fresh blocks, left cached: in the LRU)."""
    for k in blocks:
        top = s.count[state.NUM_FREE_BLOCK_IDS] - 1
        b = int(s.free_block_ids[top])
        s.count[state.NUM_FREE_BLOCK_IDS] = top
        end, chain = (k + 1) * int(s.config[state.BLOCK_SIZE]), interpreted(prefix_cache.key_chain)(s, i, k)
        interpreted(prefix_cache.register_in_group)(s, b, end, chain, group)
        interpreted(prefix_cache.lru_append)(s, b)


def test_a_preempted_request_can_lose_its_whole_hit():
    """A request preempted at 30 tokens (a prompt of 20, 10 generated: 8 blocks of 4 known): the full
    group (pagesim's group 0) cached its 7 full blocks as it computed them; the sliding group (1)
    cached only blocks 2-3, before its replay boundary floor(19 / 4) = 4 (the note's section 4),
    and the window has since let them go, to be evicted: here only block 3 is left. Looked up again
    with 30 tokens (at most 29: 7 blocks), the full group hits 7; the sliding search over blocks
    6..0 finds block 3 alone, no run of 2, and no leading run: hit 0, junction 28 (the full
    group's). With block 2 still there: hit 16 (blocks 2-3), junction 28; its admission holds the
    full group's 4 hits and the sliding group's 2, nulls before them."""
    s = hybrid_state(20, ())
    s.prompt_target[0] = 30
    cache(s, 0, range(7), 0)
    cache(s, 0, [3], 1)
    assert interpreted(prefix_cache.group_hits)(s, 0, 30) == (0, 7)
    cache(s, 0, [2], 1)
    assert interpreted(prefix_cache.group_hits)(s, 0, 30) == (4, 7)
    # admitting it: full 8 blocks less 4 hits, sliding min(8, cap) less 4 (the hit list's length,
    # its nulls too), and its 6 hits all in the LRU
    cap = int(s.config[WINDOW_CAP_BLOCKS])
    assert interpreted(kv_cache.group_blocks_to_allocate)(s, 0, 30, True) == 4 + (min(8, cap) - 4) + 6
    assert interpreted(kv_cache.allocate_group_hits)(s, 0, 30) == 16
    row = s.block_table[s.seq_slot[0, 0]]
    width = s.block_table.shape[1] // 2
    assert (row[:4] >= 0).all() and list(row[width:width + 4] >= 0) == [False, False, True, True]
    assert s.window[0, WINDOW_SKIPPED] == 2 and s.window[0, state.WINDOW_JUNCTION] == 28
    assert s.count[state.NUM_LRU] == 9 - 6


@pytest.mark.parametrize("free, admitted", [(15, False), (16, True)])
def test_admission_caps_a_sliding_group_before_the_hit_and_tests_the_first_chunk_too(free, admitted):
    """A budget of 8 tokens: the sliding cap is cdiv(min(7 + 8, 64), 4) + 1 = 5 blocks. A request
    preempted at 50 tokens (a prompt of 40): the full group cached blocks 0-11, the sliding group
    8-9: hit 40 (10 blocks), junction 48. Its whole sequence (kv_cache_manager.py:531-548): the full
    group 13 - 10 = 3 blocks, the sliding one max(min(13, 5) - 10, 0) = 0 (the cap before the hit
    comes off: single_type_kv_cache_manager.py:214-249), and its 12 hits, all in the LRU: 15. Its
    first chunk (:570-588, uncapped): 40 + 8 = 48 tokens, 12 blocks, 2 new a group and the 12 hits:
    16. So 15 free blocks admit nothing, 16 admit it, computing 8 tokens past its hit."""
    workload = grouped("by-hand", EXAMPLE_LIKE, [Row(0.0, 40, 20)], num_blocks=64, block_size=4, max_model_len=64,
                       max_num_batched_tokens=8, max_num_seqs=4, prefix_caching=True)
    with pagesim_steps.registered(workload):
        s = initial_state(pagesim_steps.config(workload, "vllm-v1"), pagesim_steps.trace(workload))
    assert s.config[WINDOW_CAP_BLOCKS] == 5
    s.prompt_target[0] = 50
    cache(s, 0, range(12), 0)
    cache(s, 0, [8, 9], 1)
    assert interpreted(prefix_cache.group_hits)(s, 0, 50) == (10, 12)
    count = interpreted(kv_cache.group_blocks_to_allocate)
    assert (count(s, 0, 50, True), count(s, 0, 48, False)) == (15, 16)
    interpreted(lifecycle.add_arrival)(s, 0)
    s.count[state.NUM_FREE_BLOCK_IDS] = free - s.count[state.NUM_LRU]
    interpreted(scheduler_v1.admit_waiting)(s, 8)
    assert (s.count[state.NUM_RUNNING] == 1) == admitted
    if admitted:
        assert (s.num_computed_tokens[0], s.window[0, WINDOW_SKIPPED]) == (48, 8)


def test_a_block_of_several_groups_of_one_spec_is_a_hit_only_where_each_has_it():
    """Gemma-3-like: 5 sliding groups of one spec search as one (``get_cached_block`` over their
    ids): a block cached in 4 of them is a miss."""
    workload = GROUP_PREFIX_WORKLOADS["gemma3-repeats"]
    with pagesim_steps.registered(workload):
        s = initial_state(pagesim_steps.config(workload, "vllm-v1"), pagesim_steps.trace(workload))
    assert (s.config[state.FULL_GROUPS], s.config[state.SLIDING_GROUPS]) == (1, 5)
    need = interpreted(prefix_cache.window_blocks)(s)  # cdiv(63, 16) = 4
    assert need == 4
    i = int(np.argmax(s.prompt_tokens))
    prompt = int(s.prompt_tokens[i])
    assert prompt > 6 * 16
    cache(s, i, range(5), 0)
    for g in range(1, 5):
        cache(s, i, range(1, 5), g)
    assert interpreted(prefix_cache.group_hits)(s, i, prompt)[0] == 0
    cache(s, i, range(1, 5), 5)
    assert interpreted(prefix_cache.group_hits)(s, i, prompt) == (5, 0)


@pytest.mark.parametrize("name", list(GROUP_PREFIX_WORKLOADS))
def test_the_group_prefix_workloads_run_checked(name):
    """Every peer workload runs with every step checked (the categories sum to the pool in each
    group, each block counted once: check.check_groups, check_group_cache)."""
    steps = run(GROUP_PREFIX_WORKLOADS[name])
    assert steps and any(hit for step in steps for hit in step.hits.values())
    assert np.all([sum(step.group_cached) >= 0 for step in steps])
