"""The core's prefix cache (sim/core/kv/prefix_cache.py, kv_cache.py's cached paths), worked by
hand on a pool of 6 blocks of 4 tokens, hashes over 4-token blocks (so block k's key is the
chain of hashes 0..k).

    A: 10 prompt tokens, hashes (1, 2, 3)   full blocks 0, 1 (block 2 holds 2 tokens: no key)
    B: 10 prompt tokens, hashes (1, 2, 9)   the same keys for blocks 0, 1 (4 output tokens)
    C:  8 prompt tokens, hashes (1, 2)      keys for 0, 1; block 1 would be its last token: not a hit
    D: 20 prompt tokens, no hashes          its own keys, nobody else's (it forces evictions)

Each test calls the core's functions directly (the scheduler is not involved) and checks
the counters by hand. ``core`` is vLLM 0.4.2's (``--system vllm``), ``core_v1`` vLLM v1's: they
differ in what a block let go becomes (v1: a partial one is reused first; 0.4.2: every one is
evictable) and in which evictable block is evicted (v1: the least recently freed; 0.4.2: the
deepest of the least recently accessed).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.core import build, state
from pagesim.sim.core.kv import block_pool, kv_cache, prefix_cache
from pagesim.sim.core.kv import memory as managers
from pagesim.sim.core.sched import scheduler_vllm
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state, run_simulation

from tests.sim.helpers import ConstExecutor, cfg_for
from pagesim.sim.core.kv.prefix_cache import ENTRY_BLOCK, LRU_HEAD, NEXT, TABLE_MASK

# the scheduler's steps run by CPython: the same source, and no compile of each on its own for
# these few calls (a standalone schedule() is ~20 s of numba; the loop's compiled copy runs elsewhere)
resume_swapped = interpreted(scheduler_vllm.resume_swapped)
evict_oldest = interpreted(prefix_cache.evict_oldest)
mark_scheduled_computed = interpreted(scheduler_vllm.mark_scheduled_computed)
v0_victim = interpreted(prefix_cache.v0_victim)
take_blocks_evicting = interpreted(block_pool.take_blocks_evicting)

BS = 4
A, B, C, D = 0, 1, 2, 3


def make_core(system, **more):
    trace = pd.DataFrame({"request_id": ["A", "B", "C", "D"], "arrival_s": [0.0, 0.0, 0.0, 0.0],
                          "prompt_tokens": [10, 10, 8, 20], "output_tokens": [2, 4, 2, 2],
                          "prefix_hashes": [(1, 2, 3), (1, 2, 9), (1, 2), ()]})
    trace.attrs["hash_block_tokens"] = 4
    settings = {**(dict(watermark=0.0) if system == "vllm" else {}), **more}
    cfg = cfg_for(system, slots=24, block_size=BS, max_seq_len=24, prefix_caching=True, **settings)
    s = initial_state(cfg, trace)
    assert s.config[state.NUM_BLOCKS] == 6 and s.config[state.LEFTOVER_SLOTS] == 0
    return s


@pytest.fixture
def core():
    return make_core("vllm")


@pytest.fixture
def core_v1():
    return make_core("vllm-v1")


def admit(s, i, tokens):
    """As the scheduler admits: allocate, then compute what the cache does not hold."""
    assert kv_cache.can_allocate(s, i, tokens) == kv_cache.CAN_ALLOCATE
    cached = kv_cache.allocate(s, i, tokens, 0)
    kv_cache.compute_tokens(s, i, tokens - cached, s.config[state.FAMILY_TRAITS])
    return cached


def blocks(s, i):
    return s.block_table[s.seq_slot[i, 0], :s.num_blocks[i]].tolist()


def lru(s):
    out, b = [], s.count[LRU_HEAD]
    while b >= 0:
        out.append(int(b))
        b = s.block_info[b, NEXT]
    return out


def cached(s, i, k):
    """The block holding request ``i``'s block ``k``'s key, or -1."""
    return prefix_cache.lookup(s, (k + 1) * BS, prefix_cache.key_chain(s, i, k))


def memory(s):
    out = np.zeros(state.MEMORY_CATEGORIES, np.int64)  # the six, speculative slack, in transfer
    used = kv_cache.memory_categories(s, 0, out)
    return used, out[:6].tolist()


def test_a_full_prompt_block_is_cached_and_shared(core):
    s = core
    assert admit(s, A, 10) == 0
    a = blocks(s, A)
    assert cached(s, A, 0) == a[0] and cached(s, A, 1) == a[1]
    assert s.block_info[a[2], state.KEY_END] == 0  # block 2 (tokens 8..11) is not full
    # A: 10 tokens computed, demand min(F = 12, 3 blocks) = 12, 3 blocks used of 6
    assert memory(s) == (3, [10, 2, 0, 0, 0, 12])
    # B hits A's two blocks (8 tokens), both held: only its third block is new
    assert kv_cache.can_allocate(s, B, 10) == kv_cache.CAN_ALLOCATE
    assert prefix_cache.count_hits(s, B, 10) == (2, 0)
    assert admit(s, B, 10) == 8
    b = blocks(s, B)
    assert b[:2] == a[:2] and b[2] not in a
    assert s.block_info[a[0], state.REF] == s.block_info[a[1], state.REF] == 2
    assert s.num_computed_tokens[B] == 10
    # shared blocks count once: 12 tokens (8 shared + 2 + 2), demand 16, 4 blocks used, 6 logical
    assert memory(s) == (4, [12, 4, 0, 0, 0, 8])
    assert s.count[state.LOGICAL_BLOCKS] == 6
    assert s.count[state.PREFIX_HIT_TOKENS] == 8 and s.count[state.PREFIX_LOOKUP_TOKENS] == 20


def test_released_blocks_wait_in_lru_tail_first_and_count_as_free(core_v1):
    s = core_v1
    admit(s, A, 10)
    a = blocks(s, A)
    admit(s, B, 10)
    b2 = blocks(s, B)[2]
    kv_cache.free(s, A)  # A's third block goes free; blocks 0, 1 are still B's
    assert lru(s) == [] and s.count[state.NUM_FREE_BLOCK_IDS] == 3
    assert memory(s) == (3, [10, 2, 0, 0, 0, 12])
    kv_cache.free(s, B)  # tail first: B's block 2 (not full) to the free stack, then a1, then a0
    assert lru(s) == [a[1], a[0]]
    assert b2 in s.free_block_ids[:s.count[state.NUM_FREE_BLOCK_IDS]].tolist()
    # nothing is held: the two cached blocks count as free (6 blocks x 4 slots)
    assert memory(s) == (0, [0, 0, 0, 0, 0, 24])
    assert kv_cache.num_free_blocks(s) == 6


def test_last_prompt_token_is_computed_and_revived_hits_take_free_blocks(core_v1):
    s = core_v1
    admit(s, A, 10)
    a = blocks(s, A)
    kv_cache.free(s, A)
    assert lru(s) == [a[1], a[0]]
    # C (8 tokens): both its blocks are cached, but block 1 holds its last prompt token
    assert prefix_cache.count_hits(s, C, 8) == (1, 1)  # one hit, revived from the LRU
    assert admit(s, C, 8) == 4
    c = blocks(s, C)
    assert c[0] == a[0] and c[1] != a[1]
    assert lru(s) == [a[1]]
    # C's block 1 is full with a key already cached (a1): vLLM v1 caches it beside a1 (its
    # BlockHashToBlockMap holds both, block_pool.py:86-110); a lookup takes the earlier, a1
    assert s.block_info[c[1], state.KEY_END] == 8 and cached(s, C, 1) == a[1]
    assert s.count[state.NUM_CACHED_KEYS] == 3
    # 8 tokens held (4 revived + 4 computed), demand min(10, 8) = 8, 2 used; a1 counts free
    assert memory(s) == (2, [8, 0, 0, 0, 0, 16])
    # freed, C's block 1, full and keyed, goes to the LRU's tail as the cached ones do: D's 5
    # blocks are the 3 of the stack, a1 and C's copy, both evicted with their keys
    kv_cache.free(s, C)
    assert lru(s) == [a[1], c[1], a[0]]
    assert admit(s, D, 20) == 0
    assert blocks(s, D)[3:] == [a[1], c[1]]
    assert s.count[state.NUM_EVICTIONS] == 2
    assert s.count[state.NUM_CACHED_KEYS] == 1 + 5 and cached(s, A, 0) == a[0]  # a0's key and D's own


def test_vllm_v1_a_copy_of_a_cached_block_keeps_its_key_after_the_first_is_evicted(core_v1):
    """vLLM v1 caches a full block whose hash is cached already beside the first (NOTE #1,
    block_pool.py:49-53: block tables stay append-only, so nothing is de-duplicated); evicting
    the first leaves the key to the copy (``get_one_block``, :63-72). vLLM 0.4.2 keeps one block
    a key. A: blocks a0, a1 cached, freed (LRU a1, a0). C (8 tokens) revives a0 and recomputes its
    last block into c1, a copy of a1's key. With C running, one eviction takes the LRU's head,
    a1: its key still finds c1, and B (hashes 1 2 9) hits a0 and c1."""
    s = core_v1
    admit(s, A, 10)
    a = blocks(s, A)
    kv_cache.free(s, A)
    admit(s, C, 8)
    c = blocks(s, C)
    assert lru(s) == [a[1]] and cached(s, C, 1) == a[1]
    assert evict_oldest(s, -1)[0] == a[1]
    assert cached(s, C, 1) == c[1] and s.count[state.NUM_CACHED_KEYS] == 2
    assert prefix_cache.count_hits(s, B, 10) == (2, 0)


def test_vllm_v0_lets_every_block_go_to_its_evictor_partial_ones_too(core):
    """vLLM 0.4.2 (``CachedBlockAllocator.free``, block_manager_v1.py:123-133): A (blocks a0, a1
    full, a2 holding 2 tokens) and B (a0, a1 shared, b2) let go: A's a2 first (a0, a1 are still
    B's), then B's, tail first: b2, a1, a0, each with its depth (HASHED_TOKENS) and the latest
    step a holder of it was scheduled in (ACCESS_STEP: A's 7, B's 4, so a0 and a1 keep 7). The
    free stack keeps the 2 blocks never used, taken before any is evicted."""
    s = core
    admit(s, A, 10)
    admit(s, B, 10)
    a, b2 = blocks(s, A), blocks(s, B)[2]
    s.last_scheduled_step[A], s.last_scheduled_step[B] = 7, 4
    kv_cache.free(s, A)
    assert lru(s) == [a[2]] and s.count[state.NUM_FREE_BLOCK_IDS] == 2
    kv_cache.free(s, B)
    assert lru(s) == [a[2], b2, a[1], a[0]] and s.count[state.NUM_FREE_BLOCK_IDS] == 2
    info = s.block_info
    assert [int(info[x, state.HASHED_TOKENS]) for x in lru(s)] == [12, 12, 8, 4]
    assert [int(info[x, state.ACCESS_STEP]) for x in lru(s)] == [7, 4, 7, 7]
    assert memory(s) == (0, [0, 0, 0, 0, 0, 24])
    assert admit(s, D, 8) == 0 and s.count[state.NUM_EVICTIONS] == 0  # the 2 never used


def test_vllm_v0_a_step_stamps_the_requests_it_schedules(core):
    """Each scheduled step counts (SCHEDULED_STEPS) and its requests take its number as their
    last (``access_all_blocks_in_seq``, scheduler.py:942): a step prefilling A stamps A alone (B
    runs but is not scheduled in a prefill step); a decode step, both."""
    s = core
    admit(s, A, 10)
    admit(s, B, 10)
    c = s.count
    s.running[:2] = A, B
    c[state.NUM_RUNNING] = 2
    s.step_prefill_ids[0] = A
    c[state.STEP_PREFILL_SEQS], c[state.STEP_DECODE_SEQS] = 1, 0
    mark_scheduled_computed(s)
    assert c[state.SCHEDULED_STEPS] == 1 and s.last_scheduled_step[[A, B]].tolist() == [1, 0]
    s.in_decode[[A, B]] = 1
    c[state.STEP_PREFILL_SEQS], c[state.STEP_DECODE_SEQS] = 0, 2
    mark_scheduled_computed(s)
    assert c[state.SCHEDULED_STEPS] == 2 and s.last_scheduled_step[[A, B]].tolist() == [2, 2]


@pytest.mark.parametrize("system, order", [("vllm", [2, 1, 0, 4, 5, 3]), ("vllm-v1", [0, 1, 2, 3, 4, 5])])
def test_which_evictable_block_is_evicted(system, order):
    """Blocks 0-5 let go in that order, last accessed in steps 5, 5, 3, 6, 2, 2, of depths 16, 48,
    64, 80, 96, 96 tokens. vLLM v1 evicts the least recently freed: 0 to 5. vLLM 0.4.2
    (``LRUEvictor.evict``, evictor_v1.py:66-84) goes from the head, in the order let go, while no
    block was accessed later than its choice, and chooses the deepest, the first of equals: 0
    (5, 16), then 1 (5, 48), 2 (3, 64), then 3 was accessed later (6): 2. Then 1; then 0; of 3
    (6, 80), 4 and 5 (2, 96), 4, then 5, then 3."""
    s = make_core(system)
    for x, (step, depth) in enumerate([(5, 16), (5, 48), (3, 64), (6, 80), (2, 96), (2, 96)]):
        prefix_cache.lru_append(s, x)
        s.block_info[x, state.ACCESS_STEP], s.block_info[x, state.HASHED_TOKENS] = step, depth
        s.block_info[x, state.RUN], s.block_info[x, state.RUN_LAST] = x + 1, x  # each let go alone
    assert [int(evict_oldest(s, -1)[0]) for _ in range(6)] == order
    assert lru(s) == []


@pytest.mark.parametrize("runs, order", [
    # A: 0 (access 5, 48 tokens deep), 1 (5, 16); B: 2 (5, 32). The first scan passes both runs and
    # takes 0 (B's 2 is not deeper); the next, from 1, takes B's 2 (deeper), not A's next block
    ([[(5, 48), (5, 16)], [(5, 32)]], [0, 2, 1]),
    # A: 0 (5, 32), 1 (5, 16); B: 2 (7, 80), 3 (7, 64); C: 4 (6, 96). The first scan passes A alone
    # (B was accessed later): 0, then A's next, 1; A ended, the scan from B's 2 passes C, deeper: 4;
    # then B alone: 2, then B's next, 3
    ([[(5, 32), (5, 16)], [(7, 80), (7, 64)], [(6, 96)]], [0, 1, 4, 2, 3]),
])
def test_vllm_v0_evictions_in_a_row_take_a_run_in_order_only_when_the_scan_passed_it_alone(runs, order):
    """The blocks an allocation evicts one after another (block_pool.take_blocks_evicting): after
    a scan that passed the head's run alone, the next eviction takes that run's next block without
    a scan (prefix_cache.evict_oldest), as vLLM's scan would; after one that passed several runs,
    or once the run is spent, it scans again. Runs are given as (last access, depth) per block,
    deepest first, let go in that order."""
    s = make_core("vllm")
    x = 0
    for run, blocks_of_run in enumerate(runs, start=1):
        first = x
        for step, depth in blocks_of_run:
            prefix_cache.lru_append(s, x)
            s.block_info[x, state.ACCESS_STEP], s.block_info[x, state.HASHED_TOKENS] = step, depth
            s.block_info[x, state.RUN] = run
            x += 1
        s.block_info[first:x, state.RUN_LAST] = x - 1
    s.count[state.NUM_FREE_BLOCK_IDS] = 0
    take_blocks_evicting(s, 0, 0, len(order))
    assert s.block_table[0, :len(order)].tolist() == order
    assert lru(s) == []


def vllm_scan(s):
    """``LRUEvictor.evict`` (evictor_v1.py:66-84) over the LRU list as written there: from the
    head, while no block was accessed later than the one chosen, the deepest (the first of equals)."""
    info = s.block_info
    chosen = x = int(s.count[LRU_HEAD])
    while x >= 0 and info[x, state.ACCESS_STEP] <= info[chosen, state.ACCESS_STEP]:
        if info[x, state.HASHED_TOKENS] > info[chosen, state.HASHED_TOKENS]:
            chosen = x
        x = int(info[x, NEXT])
    return chosen


def test_the_evictors_scan_by_runs_chooses_as_vllms_scan_does():
    """The scan passes a run of blocks let go together at its first (prefix_cache.v0_victim):
    over 600 random admissions (shared prefixes: hits revive blocks from the middle of runs;
    a full pool: evictions) and frees, each at a step of its own, the block it would evict is
    vLLM's scan's every time."""
    import random

    rng = random.Random(5)
    n = 600
    systems = [(1,), (1, 2, 3), (7, 8), (7, 9, 10, 11)]
    rows = [(rng.randint(5, 30), 1) for _ in range(n)]
    hashes = [systems[rng.randrange(4)] + tuple(1000 + 10 * i + k for k in range(rng.randint(0, 3))) for i in range(n)]
    s = hashed_core(rows, hashes, slots=40 * BS, max_seq_len=32)
    live, checked = [], 0
    for step, i in enumerate(range(n), start=1):
        while kv_cache.can_allocate(s, i, rows[i][0]) != kv_cache.CAN_ALLOCATE:
            j = live.pop(rng.randrange(len(live)))
            s.last_scheduled_step[j] = step - rng.randint(0, 12)
            kv_cache.free(s, j)
        if s.count[state.NUM_LRU]:
            assert int(v0_victim(s, s.count[LRU_HEAD])[0]) == vllm_scan(s)
            checked += 1
        admit(s, i, rows[i][0])
        s.last_scheduled_step[i] = step
        live.append(i)
    assert checked > n // 2 and s.count[state.NUM_EVICTIONS] > 100


def test_the_oldest_cached_block_is_evicted_when_the_free_stack_is_empty(core_v1):
    """vLLM v1: the least recently freed cached block is evicted."""
    s = core_v1
    admit(s, A, 10)
    a = blocks(s, A)
    kv_cache.free(s, A)  # free stack: 4 blocks (A's tail, not full, among them); LRU: a1, a0
    # D needs 5 blocks: 4 from the free stack, then a1 evicted (the LRU's head, A's tail)
    assert admit(s, D, 20) == 0
    assert s.count[state.NUM_EVICTIONS] == 1
    d = blocks(s, D)
    assert a[1] in d and a[0] not in d
    assert cached(s, A, 1) == -1 and cached(s, A, 0) == a[0]
    # D's 5 full blocks are cached under its own keys: 1 of A's + 5
    assert lru(s) == [a[0]] and s.count[state.NUM_CACHED_KEYS] == 1 + 5
    kv_cache.free(s, D)  # all full and keyed: all five to the LRU's tail, D's tail first
    assert lru(s) == [a[0]] + d[::-1] and s.count[state.NUM_FREE_BLOCK_IDS] == 0
    # B finds block 0 only (block 1's key was evicted) and revives it; its 2 fresh blocks are
    # the LRU's head now, D's tail blocks: 2 more evictions
    assert prefix_cache.count_hits(s, B, 10) == (1, 1)
    assert admit(s, B, 10) == 4
    assert blocks(s, B) == [a[0], d[4], d[3]]
    assert s.count[state.NUM_EVICTIONS] == 3
    assert cached(s, B, 1) == blocks(s, B)[1]  # recomputed, and cached again under its key


def test_admission_counts_every_prompt_block_hits_included(core):
    """can_allocate: every block of the prompt, hits or not, against free + LRU (vLLM 0.4.2's
    ``can_allocate`` counts ``len(seq.logical_token_blocks)``); the allocation then takes only
    what the hits do not hold."""
    s = core
    admit(s, A, 10)
    admit(s, D, 8)  # 2 blocks: 1 free block left
    assert kv_cache.num_free_blocks(s) == 1
    # B: 3 blocks, 2 of them hits A holds: 3 > 1 free
    assert kv_cache.can_allocate(s, B, 10) == kv_cache.ALLOCATE_LATER
    kv_cache.free(s, D)  # 3 free
    assert kv_cache.can_allocate(s, B, 10) == kv_cache.CAN_ALLOCATE
    assert admit(s, B, 10) == 8 and kv_cache.num_free_blocks(s) == 2  # the hits took no block


def test_the_key_map_survives_deletions_in_probe_runs(core):
    """Backward-shift deletion: entries colliding on one home slot stay findable after any
    of them is removed (the map has 64 rows for 6 blocks: eight times the pool, rounded up to
    a power of two)."""
    s = core
    mask = s.config[TABLE_MASK]
    assert mask == 63
    # five keys with the same home slot: block 3's (end 16) under five chains whose segment
    # draws row 3 (block 3 is its segment's fourth: 3 mod 16)
    chains = [c for c in range(1, 10_000) if prefix_cache.home(s, 16, c) == 3][:5]
    keys = [(16, chain) for chain in chains]
    for b, (end, chain) in enumerate(keys):
        prefix_cache.register(s, b, end, chain)
    assert [int(s.block_info[b, prefix_cache.KEY_SLOT]) for b in range(5)] == [3, 4, 5, 6, 7]
    removed = []
    for gone in (1, 0, 4):  # the middle of the run, its first entry, its last
        prefix_cache.unregister(s, gone)
        removed.append(gone)
        for b, (end, chain) in enumerate(keys):
            assert prefix_cache.lookup(s, end, chain) == (-1 if b in removed else b)
    assert s.count[state.NUM_CACHED_KEYS] == 2
    assert (s.key_entries[:, ENTRY_BLOCK] >= 0).sum() == 2


def test_a_chains_blocks_have_consecutive_homes_sixteen_at_a_time(core):
    """prefix_cache.home_in: the keys of one chain's blocks 0-15 lie in 16 consecutive rows
    (block k at the segment's row + k), block 16 starts a segment drawn apart; another chain's
    segment is drawn apart too. Worked with the formula: the segment's row is its hash times
    16, within 64 rows (block size 4: block k ends at token 4k + 4)."""
    s = core
    mask = int(s.config[TABLE_MASK])
    mix = prefix_cache.END_MIX

    def segment_row(chain, m):
        h = chain ^ (chain >> 31) ^ (m * mix)
        return ((((h ^ (h >> 29)) & mask) * mix) << 4) & mask

    for chain in (5, -123456789, 2**62 + 7):
        first = segment_row(chain, 0)
        assert [prefix_cache.home(s, 4 * k + 4, chain) for k in range(16)] == \
            [(first + k) & mask for k in range(16)]
        assert prefix_cache.home(s, 4 * 16 + 4, chain) == segment_row(chain, 1)
    assert segment_row(5, 0) == 16 and segment_row(5, 1) == 0 and segment_row(6, 0) == 32
    # the host tier's map (no shift): each key's home drawn alone, as before
    assert prefix_cache.home_in(mask, 8, 5) == (5 ^ (8 * mix)) & mask


def test_swap_in_computes_only_what_the_cache_does_not_hold():
    """B comes back from the CPU with 12 tokens (10 prompt + 2 generated) while A holds the
    prompt's first two blocks (8 of A's tokens), with 4 blocks free: B's 3 blocks and one for
    its next token (vLLM's can_swap_in). A's blocks are hits, only B's third block's 4 tokens
    come in (and, full, it is cached); the swap is priced for all 12. B then
    decodes its 13th token in a 4th block."""
    s = make_core("vllm", preemption="swap")  # (a run that swaps: its swapped queue and columns)
    admit(s, A, 8)
    a = blocks(s, A)
    c = s.count
    s.status[B] = state.SWAPPED
    s.num_preemptions[B] = 1  # (swapped out by a preemption: its own keys go into the map as cached)
    s.num_generated[B] = 2
    s.num_prompt_computed[B] = 10  # it left mid-decode
    s.swapped_tokens[B] = 12
    s.swapped[(c[state.SWAPPED_HEAD] + c[state.SWAPPED_LEN]) % len(s.swapped)] = B
    c[state.SWAPPED_LEN] += 1
    c[state.SWAP_USED_TOKENS] = 12
    assert resume_swapped(s, 100, s.config[state.FAMILY_TRAITS])[0] == 16  # the context its decode reads: 13 tokens, in whole blocks of 4
    b = blocks(s, B)
    assert b[:2] == a and len(b) == 4 and s.num_computed_tokens[B] == 13
    assert c[state.STEP_SWAP_IN] == 12 and c[state.SWAP_USED_TOKENS] == 0 and c[state.STEP_DECODE_SEQS] == 1
    assert cached(s, B, 2) == b[2]
    assert c[state.PREFIX_HIT_TOKENS] == 8 and c[state.PREFIX_LOOKUP_TOKENS] == 8 + 12
    # 13 tokens (8 shared); B's 4th block: its 14th slot to come, 2 never filled; 2 blocks free
    assert memory(s) == (4, [13, 1, 2, 0, 0, 8])


def hashed_core(rows, hashes, slots, max_seq_len=24, hash_block_tokens=BS, system="vllm"):
    """The core's state for ``rows`` (prompt, output) with prefix hashes, blocks of 4."""
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [0.0] * len(rows),
                          "prompt_tokens": [p for p, _ in rows], "output_tokens": [o for _, o in rows],
                          "prefix_hashes": hashes})
    trace.attrs["hash_block_tokens"] = hash_block_tokens
    settings = dict(watermark=0.0) if system == "vllm" else {}
    cfg = cfg_for(system, slots=slots, block_size=BS, max_seq_len=max_seq_len, prefix_caching=True, **settings)
    return initial_state(cfg, trace)


def test_a_hit_refreshes_its_block_in_the_lru():
    """vLLM v1. 4 blocks of 4. r0 (hashes p, t) and r1 (q, t), 5-token prompts: one full block each
    (its tail holds 1 token). Each runs and leaves: its tail (not full) to the free stack, its
    keyed block to the LRU's tail: LRU p, q. r2 (p, t) hits p (revived) and leaves: p is the
    most recently freed: LRU q, p. r3 (11 tokens, 3 blocks, no hashes) finds 2 blocks free
    and evicts 1: the least recently freed, q; p stays cached."""
    P, Q, T = 1, 2, 3
    s = hashed_core([(5, 1), (5, 1), (5, 1), (11, 1)], [(P, T), (Q, T), (P, T), ()], slots=16,
                    max_seq_len=16, system="vllm-v1")
    assert admit(s, 0, 5) == 0
    p = blocks(s, 0)[0]
    kv_cache.free(s, 0)
    assert admit(s, 1, 5) == 0
    q = blocks(s, 1)[0]
    kv_cache.free(s, 1)
    assert lru(s) == [p, q]
    assert admit(s, 2, 5) == 4 and blocks(s, 2)[0] == p
    kv_cache.free(s, 2)
    assert lru(s) == [q, p]
    assert kv_cache.num_free_blocks(s) == 4 and s.count[state.NUM_FREE_BLOCK_IDS] == 2
    assert admit(s, 3, 11) == 0
    assert s.count[state.NUM_EVICTIONS] == 1 and lru(s) == [p]
    assert cached(s, 0, 0) == p and cached(s, 1, 0) == -1


def test_hashes_coarser_than_blocks():
    """Hashes over 16 tokens, blocks of 4: block k's key is the chain hash of the 16-token
    block holding its last token. r0 (20 tokens, hashes a, b): min(20, 2 x 16) // 4 = 5
    keyable blocks, all cached once computed. r1 (40 tokens, hashes a, c, d): blocks 0-3
    (tokens 1-16) are keyed by a's chain, as r0's: hits; block 4 (tokens 17-20) by the chain
    (a, c), not r0's (a, b): 4 hits, 16 tokens."""
    A_, B_, C_, D_ = 11, 12, 13, 14
    s = hashed_core([(20, 1), (40, 1)], [(A_, B_), (A_, C_, D_)], slots=256, max_seq_len=64, hash_block_tokens=16)
    assert admit(s, 0, 20) == 0
    assert s.count[state.NUM_CACHED_KEYS] == 5
    assert admit(s, 1, 40) == 16
    assert blocks(s, 1)[:4] == blocks(s, 0)[:4] and blocks(s, 1)[4] != blocks(s, 0)[4]


def test_no_hashes_no_sharing():
    """Prompts without hashes are each its own: their full blocks are cached under their own
    keys (2 each), and nothing is shared."""
    s = hashed_core([(8, 1), (8, 1)], [(), ()], slots=64)
    assert admit(s, 0, 8) == 0
    assert admit(s, 1, 8) == 0
    assert s.count[state.NUM_CACHED_KEYS] == 4 and not set(blocks(s, 0)) & set(blocks(s, 1))


def test_a_recomputed_request_finds_its_own_blocks_generated_ones_too():
    """vLLM hashes every full block, a request's own and generated tokens' too: r0 (6 prompt
    tokens, no hashes) decodes 2 tokens, filling its 2nd block (cached as the decode fills it,
    its key held out of the map while r0 runs: prefix_cache.apart), is preempted (its keys go
    into the map before its blocks are freed) and comes back with 8 tokens: both blocks are
    hits (7 // 4 = 2 at most, the last token computed). r1, the same lengths, finds none."""
    s = hashed_core([(6, 4), (6, 4)], [(), ()], slots=64)
    assert admit(s, 0, 6) == 0
    first = blocks(s, 0)
    for _ in range(2):  # as the scheduler decodes (scheduler_vllm.decode_token)
        kv_cache.take_decode_slot(s, 0)
        s.num_computed_tokens[0] += 1
        s.count[state.COMPUTED_SLOTS] += 1
    assert s.count[state.NUM_CACHED_KEYS] == 2 and map_rows(s) == 0
    managers.preempted(s, 0, s.config[state.FAMILY_TRAITS])  # as lifecycle.preempt does, before the blocks go
    kv_cache.free(s, 0)
    s.num_preemptions[0] += 1
    assert [cached(s, 0, k) for k in range(2)] == first
    assert prefix_cache.count_hits(s, 1, 8) == (0, 0)
    assert prefix_cache.count_hits(s, 0, 8) == (1, 1)  # 8 tokens: block 1 holds the last
    assert admit(s, 0, 9) == 8 and blocks(s, 0)[:2] == first


def test_vllm_v0_skips_only_the_hits_marked_computed_and_its_budget_counts_the_whole_prompt():
    """vLLM 0.4.2 (``--system vllm``), prefill-first steps, a budget of 20 tokens. A (prompt 8,
    hashes 1, 2; output 3) at 0; B and C (prompt 12, hashes 1, 2, 3; output 1) at 1.5 s.

    step 0  A prefills 8 (2 full blocks, both cached); once scheduled, its blocks are marked
            computed up to its last full block, not it: block 0 only
    step 1  A decodes its 9th token (marks nothing more: 9 // 4 - 1 = 1 block, marked)
    step 2  B hits blocks 0 and 1 (8 tokens; its last token's block is computed anyway) but
            skips only block 0, the one marked: it computes 8 tokens. The budget counts B's
            whole prompt, 12: C's 12 do not fit the 8 left
    step 3  C hits blocks 0 and 1, both marked now (B marked block 1): it computes 4
    """
    trace = pd.DataFrame({"request_id": ["A", "B", "C"], "arrival_s": [0.0, 1.5, 1.5],
                          "prompt_tokens": [8, 12, 12], "output_tokens": [3, 1, 1],
                          "prefix_hashes": [(1, 2), (1, 2, 3), (1, 2, 3)]})
    trace.attrs["hash_block_tokens"] = 4
    cfg = cfg_for("vllm", slots=400, block_size=BS, max_seq_len=20, max_num_batched_tokens=20,
                  prefix_caching=True, check=True)
    executor = ConstExecutor(1.0)
    run_simulation(cfg, trace, executor=executor)
    A, B, C = range(3)
    assert [batch[0] for batch in executor.batches][:4] == [[A], [], [B], [C]]
    assert [batch[1] for batch in executor.batches][:4] == [[8], [], [8], [4]]


def test_own_chains_are_apart_and_fit_int64_uninterpreted_too():
    """A request's own chain is stored in the int64 key map: it must fit without wrapping (run
    interpreted, Python's ints do not wrap) for any request count a trace may have."""
    own = interpreted(prefix_cache.own_chain)
    chains = [own(i) for i in (0, 1, 2, 10**6, 3 * 10**9 - 1)]
    assert len(set(chains)) == len(chains) and all(-2**63 <= c < 0 for c in chains)


def map_rows(s):
    return int((s.key_entries[:, ENTRY_BLOCK] >= 0).sum())


def test_vllm_v1_keeps_a_requests_own_keys_out_of_the_map_until_it_is_preempted():
    """vLLM v1 looks a request's own blocks up only when it comes back from a preemption
    (prefix_cache.apart). r0 and r1, 8-token prompts without hashes: two full blocks each, cached
    (keyed, counted) as computed but held out of the map. r0 is preempted: its two keys go into
    the map (publish, as lifecycle.preempt calls it), and back with 9 tokens it finds both blocks
    ((9 - 1) // 4 = 2, revived). r1 finishes: its keys never take a row. Evicting the LRU's
    head (r0's tail first, then r1's) drops each key, from the map where it is there: after
    three evictions one key is left and no row."""
    s = hashed_core([(8, 4), (8, 4)], [(), ()], slots=64, system="vllm-v1")
    traits = s.config[state.FAMILY_TRAITS]
    assert admit(s, 0, 8) == 0
    first = blocks(s, 0)
    assert s.count[state.NUM_CACHED_KEYS] == 2 and map_rows(s) == 0
    assert cached(s, 0, 0) == -1 and prefix_cache.count_hits(s, 0, 9) == (0, 0)
    managers.preempted(s, 0, traits)  # as lifecycle.preempt does, before the blocks go
    kv_cache.free(s, 0)
    s.num_preemptions[0] += 1
    assert map_rows(s) == 2 and [cached(s, 0, k) for k in range(2)] == first
    assert prefix_cache.count_hits(s, 0, 9) == (2, 2)
    assert admit(s, 1, 8) == 0
    second = blocks(s, 1)
    kv_cache.free(s, 1)
    assert s.count[state.NUM_CACHED_KEYS] == 4 and map_rows(s) == 2
    assert lru(s) == [first[1], first[0], second[1], second[0]]
    for _ in range(3):
        evict_oldest(s, -1)
    assert s.count[state.NUM_EVICTIONS] == 3 and s.count[state.NUM_CACHED_KEYS] == 1 and map_rows(s) == 0
    assert admit(s, 0, 9) == 0  # its blocks evicted: nothing found


def test_vllm_v0_holds_own_keys_out_of_the_map_until_a_preemption_then_maps_them_as_computed():
    """vLLM 0.4.2 looks a block's hash up as it allocates it, where a request's own hash can only
    be from an earlier run of its own (prefix_cache.apart). r0 (hashes 1, 2) and r1 (hashes 1, 3),
    8-token prompts, two full blocks each: hash 1 is shared, so block 0's key is in the map; hash
    2 is r0's alone, so its block 1's key is its own (build.shared_chains), held out while r0
    runs. r0 is preempted: its own key goes into the map. Back with 12 tokens (8 and 4 generated
    into a third block) it finds both blocks, and its third block, cached as computed, goes into
    the map at once (a later run of r0's would have found it there)."""
    s = hashed_core([(8, 4), (8, 4)], [(1, 2), (1, 3)], slots=64)
    assert admit(s, 0, 8) == 0
    first = blocks(s, 0)
    assert s.count[state.NUM_CACHED_KEYS] == 2 and map_rows(s) == 1 and cached(s, 0, 0) == first[0]
    assert cached(s, 0, 1) == -1 and prefix_cache.is_own(0, prefix_cache.key_chain(s, 0, 1))
    assert prefix_cache.count_hits(s, 1, 8) == (1, 0)  # r1 shares block 0 alone
    managers.preempted(s, 0, s.config[state.FAMILY_TRAITS])  # as lifecycle.preempt does, before the blocks go
    kv_cache.free(s, 0)
    s.num_preemptions[0] += 1
    assert map_rows(s) == 2 and [cached(s, 0, k) for k in range(2)] == first
    assert admit(s, 0, 12) == 8 and blocks(s, 0)[:2] == first
    assert map_rows(s) == 3 and cached(s, 0, 2) == blocks(s, 0)[2]


def test_a_requests_chains_are_cut_where_no_other_request_shares_them():
    """build.shared_chains: chains (1), (1, 2), (1, 2, 3) of r0; (1), (1, 2), (1, 2, 4) of r1;
    (5) of r2; none of r3; (1), (1, 6) of r4. Chains (1) and (1, 2) are shared: r0 and r1 keep two,
    r4 one; r2's chain is its own, so are r0's, r1's and r4's last ones. Runs in a trace order
    (an unshared chain of an earlier request does not cut a later one's)."""
    c1, c12, c123, c124, c5, c16 = 11, 12, 13, 14, 15, 16
    chains = np.array([c1, c12, c123, c1, c12, c124, c5, c1, c16], np.int64)
    kept, start = build.shared_chains(chains, np.array([0, 3, 6, 7, 7, 9]))
    assert kept.tolist() == [c1, c12, c1, c12, c1] and start.tolist() == [0, 2, 4, 4, 4, 5]
    kept, start = build.shared_chains(np.array([c5], np.int64), np.array([0, 1]))
    assert start.tolist() == [0, 0] and len(kept) == 1  # (none kept: the one-element array)


def test_an_admission_counts_the_held_hits_alone():
    """vLLM v1's count of the blocks an admission takes (kv_cache.blocks_to_allocate): its blocks
    less its held hits (a hit nobody holds is taken from the free queue as a fresh block is).
    A (10 tokens, hashes 1 2 3) runs: its blocks 0 and 1 are cached and held. B (10 tokens,
    hashes 1 2 9) hits both (at most (10 - 1) // 4 = 2): held, 3 - 2 = 1 block. A leaves: both
    hits are in the LRU, B needs its 3 blocks. D (20 tokens, no hashes) runs and is preempted:
    its 4 full blocks are found when it comes back, none held: 5 blocks."""
    s = make_core("vllm-v1")
    admit(s, A, 10)
    assert prefix_cache.held_hits(s, B, 10) == 2 and prefix_cache.count_hits(s, B, 10) == (2, 0)
    assert kv_cache.blocks_to_allocate(s, B, 10) == 1
    kv_cache.free(s, A)
    assert prefix_cache.held_hits(s, B, 10) == 0 and prefix_cache.count_hits(s, B, 10) == (2, 2)
    assert kv_cache.blocks_to_allocate(s, B, 10) == 3
    s = make_core("vllm-v1")
    admit(s, D, 20)
    managers.preempted(s, D, s.config[state.FAMILY_TRAITS])
    kv_cache.free(s, D)
    s.num_preemptions[D] += 1
    assert prefix_cache.count_hits(s, D, 20) == (4, 4) and prefix_cache.held_hits(s, D, 20) == 0
    assert kv_cache.blocks_to_allocate(s, D, 20) == 5
