"""The paged manager (vLLM's block manager) over the core's arrays: admission checks,
allocation, one decode slot, free, and where every slot goes.

Without prefix caching, blocks are private to one request, so a request's blocks hold
exactly its ``num_computed_tokens`` tokens and, of the slots they offer, ``min(final_len,
num_blocks * block_size)`` will be used: the accounting is four counters (see
``memory_categories``). With prefix caching (``prefix_cache.py``) a request's leading
blocks may be cache hits, full and shared with other requests: each block is counted once,
when its first holder takes it and when its last holder lets it go (a shared block is full
for every holder, at the same table index, so its tokens and demand are ``block_size``).
With parallel sampling a request's sequences share its blocks after the fork (``fork``),
and a beam forks from another (``fork_seq``, ``beam.py``); a sequence writing into a tail
it shares copies it first (``take_decode_slots``).
vLLM v0's watermark: an admission must leave ``watermark_blocks`` free
(``block_manager_v1.py``, ``can_allocate``).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import prefix_cache, radix_cache
from pagesim.sim.core.kv.block_pool import num_free_blocks, return_blocks, return_slot, take_blocks, take_slot
from pagesim.sim.core.compile.families import BLOCK_TABLE, CACHES_COMPUTED
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import (ACCESS_STEP, BLOCK_SIZE, COMPUTED, COMPUTED_SLOTS, DEMAND_SLOTS,
                                    HASHED_TOKENS, LEFTOVER_SLOTS, LOGICAL_BLOCKS, MAX_SEQ_LEN,
                                    NUM_ALLOCATIONS, NUM_BLOCKS, NUM_COW_COPIES, NUM_FORKS,
                                    NUM_FREE_BLOCK_IDS, NUM_FREES, PREFIX_CACHING, PREFIX_HIT_TOKENS,
                                    PREFIX_LOOKUP_TOKENS, REF, RUN, RUN_LAST, SHARED_BLOCKS,
                                    STEP_COPIED_BLOCKS, TRANSFERS, WATERMARK_BLOCKS)
from pagesim.sim.core.state import EXTERNAL_STEPS, STEP_SWAP_IN_BLOCKS, STEP_SWAP_OUT_BLOCKS, TRANSFER_SLOTS
from pagesim.sim.core.state import ASYNC_SCHEDULING, MANAGER_KIND, PAGED
from pagesim.sim.core.state import IN_TRANSFER, SPECULATIVE_SLACK
from pagesim.sim.core.state import FULL_GROUPS, NUM_FREE_BLOCK_IDS as FREE_TOP, SLIDING_GROUPS, SLIDING_WINDOW
from pagesim.sim.core.state import SPEC_TOKENS, STATE_GROUPS, STATE_SLOTS
from pagesim.sim.core.state import KEY_END, WINDOW_JUNCTION
from pagesim.sim.core.state import MAMBA_ALIGN
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    WINDOW_CAP_BLOCKS   the blocks a sliding-window group may hold for one request (its admission)
    SLIDING_FIRST       1: with prefix caching over sliding-window groups, vLLM's group order puts
        the sliding ones first (its groups follow the layers: the first attention layer slides,
        kv_cache_planning.py:484-507; kv_groups.KVCacheGroups.sliding_first): the order a
        request's groups let blocks go, and so the LRU's order (kv_cache.free_groups)
    STATE_FIRST         1: under MAMBA_ALIGN, vLLM's group order puts the state groups first (the
        first layer keeps a state: kv_groups.KVCacheGroups.state_first): the order a request's
        groups let blocks go (kv_cache.free_groups)
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    EVICTOR_RUNS        vLLM 0.4.2 with prefix caching: the runs of blocks let go so far (block_info RUN)
    SKIPPED_SLOTS       SLIDING_GROUPS: the slots each sliding-window group freed out of its window,
        over the running requests (COMPUTED_SLOTS, DEMAND_SLOTS, LOGICAL_BLOCKS count one group as if
        it kept every block; kv_cache.memory_categories)
    STATE_BLOCKS        STATE_GROUPS: the state blocks the running requests hold
    FULL_SHARED_SLOTS   prefix caching over SLIDING_GROUPS: the full groups' slots held by a second
        holder or more (a block held by r requests counts (r - 1) x block_size; COMPUTED_SLOTS and
        DEMAND_SLOTS count each holder's: kv_cache.memory_categories takes these off)
    SLIDING_SHARED_SLOTS  the same over the sliding-window groups
""")

# Core.window: this file's entries, in its room of the shared table (sim/core/state.py)
section("window", globals(), """
    WINDOW_SKIPPED      the leading blocks each sliding-window group freed (null in its table)
    WINDOW_IN_FLIGHT    the tokens it was scheduled in the last step: under async scheduling they
        are not processed yet when the next step is scheduled, and blocks are freed on the
        processed tokens (kv_cache_manager.py:557-567)
    STATE_SOURCE        MAMBA_ALIGN: 1 + the state column its last new state block was copied from
        (vLLM's last_state_block_idx; 0: none), freed once its tokens are processed
    STATE_RETIRED       MAMBA_ALIGN: the state columns below which every block is freed
        (_num_retired_blocks, single_type_kv_cache_manager.py:1608-1627)
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    SKIPPED_SUM         count[SKIPPED_SLOTS] x seconds
    STATE_BLOCKS_SUM    count[STATE_BLOCKS] x seconds
    FULL_SHARED_SUM     count[FULL_SHARED_SLOTS] x seconds
    SLIDING_SHARED_SUM  count[SLIDING_SHARED_SLOTS] x seconds
""")


CAN_ALLOCATE, ALLOCATE_LATER, NEVER_FITS = 0, 1, 2


@njit(inline=True)
def blocks_for(s, num_tokens):
    return prefix_cache.block_of(s, num_tokens + s.config[BLOCK_SIZE] - 1)


@njit(inline=True)
def can_allocate(s, i, num_tokens):
    """Whether ``num_tokens`` of request ``i`` fit now, later, or never (the request is
    longer than ``max_seq_len`` or than the pool less its watermark)."""
    need = blocks_for(s, num_tokens)
    watermark = s.config[WATERMARK_BLOCKS]
    if s.num_generated[i] > 0:  # back after a preemption: delayed, never turned away (vLLM's resumed requests)
        watermark = max(min(watermark, s.config[NUM_BLOCKS] - need), 0)
    if (s.final_len[i] > s.config[MAX_SEQ_LEN] or num_tokens > s.config[MAX_SEQ_LEN]
            or need > s.config[NUM_BLOCKS] - watermark):
        return NEVER_FITS
    # every block of the prompt, cache hits too, against the free ones (cached unheld ones
    # included): vLLM 0.4.2 (block_manager_v1.py:259-276, CachedBlockAllocator.get_num_free_blocks :134-136)
    return CAN_ALLOCATE if num_free_blocks(s) - need >= watermark else ALLOCATE_LATER


@njit(inline=True)
def blocks_to_allocate(s, i, num_tokens):
    """The available blocks allocating ``num_tokens`` of waiting request ``i`` consumes: new
    blocks, and prefix-cache hits revived from the LRU (held hits cost nothing: all it counts of
    the hits are those held, ``prefix_cache.held_hits``). The hits are
    looked up with the request's own tokens (``prompt_target``), whatever ``num_tokens`` (a
    lookahead past them): vLLM finds them once (``get_computed_blocks``) and passes them to each
    count (``new_computed_blocks``, kv_cache_manager.py:530-579), as :func:`group_blocks_to_allocate`."""
    need = blocks_for(s, num_tokens)
    if s.config[PREFIX_CACHING]:
        if prefix_cache.keyed_by_group(s):
            return group_blocks_to_allocate(s, i, num_tokens, True)
        need -= prefix_cache.held_hits(s, i, s.prompt_target[i])
    return need


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed):
    """A slot and the blocks for ``num_tokens`` tokens of request ``i``, of which
    ``num_computed`` already hold K/V (a swap-in) and the rest are reserved for its prefill.
    With prefix caching see :func:`allocate_cached` (it returns the tokens found cached)."""
    return allocate_seq(s, i, 0, num_tokens, num_computed)


@njit(inline=True)
def allocate_seq(s, i, j, num_tokens, num_computed):
    """:func:`allocate` for sequence ``j`` of request ``i`` (the request's counts are the same
    for each of its sequences)."""
    if s.config[PREFIX_CACHING]:
        return allocate_cached(s, i, j, num_tokens)
    need = blocks_for(s, num_tokens)
    slot = take_slot(s)
    take_blocks(s, slot, 0, need)
    s.seq_slot[i, j] = slot
    s.num_blocks[i] = need
    s.num_computed_tokens[i] = num_computed
    s.count[COMPUTED_SLOTS] += num_computed
    s.count[DEMAND_SLOTS] += min(s.final_len[i], need * s.config[BLOCK_SIZE])
    s.count[NUM_ALLOCATIONS] += 1
    s.count[LOGICAL_BLOCKS] += need
    return num_computed


@njit(inline=True)
def allocate_cached(s, i, j, num_tokens):
    """Prefix caching: a slot and the blocks for ``num_tokens`` tokens of request ``i``'s
    sequence ``j``, the leading cache hits first (revived from the LRU when nobody holds
    them), then fresh blocks for the rest. Returns the tokens the hits hold, which are
    computed; the caller computes the rest (:func:`compute_tokens`), registering keys as
    blocks fill."""
    # np.int64: callers pass constants (jit.njit: one compile of the callee, not one per value)
    return allocate_cached_blocks(s, np.int64(i), np.int64(j), np.int64(num_tokens), blocks_for(s, num_tokens))


@njit(inline=True)
def allocate_hits(s, i, num_tokens, num_blocks):
    """vLLM v1's :func:`allocate_cached_blocks` (sequence 0): over the groups where they key their
    own blocks (:func:`allocate_group_hits`). Apart, as ``prefix_cache.register_computed_blocks``
    is: the other families' loops never compile the groups' code."""
    if prefix_cache.keyed_by_group(s):
        return allocate_group_hits(s, i, num_tokens)
    return allocate_cached_blocks(s, i, np.int64(0), num_tokens, num_blocks)


def with_prefix_caching(config):
    """The runs that may call :func:`allocate_cached_blocks`: a paged manager's with prefix
    caching (SGLang's radix cache is ``radix_cache.py``'s)."""
    return config[PREFIX_CACHING] != 0 and not radix_cache.with_radix_tree(config)


@njit(lazy=with_prefix_caching)  # compiled apart, the state by reference: vLLM v1's scheduler calls it
def allocate_cached_blocks(s, i: int, j: int, num_tokens: int, num_blocks: int) -> int:
    """:func:`allocate_cached` for a prompt of ``num_tokens`` tokens, holding ``num_blocks``
    blocks or its hits, whichever is more: vLLM v1 (``scheduler_v1.py``) takes the hits at
    admission and the blocks of each chunk as it is scheduled (:func:`grow`)."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    need = num_blocks
    slot = take_slot(s)
    s.seq_slot[i, j] = slot
    hits = 0
    for k in range(prefix_cache.hit_limit(s, i, num_tokens)):  # before the fresh blocks: they must not evict a hit
        b = prefix_cache.find(s, i, k)
        if b < 0:
            break
        hits += 1
        if s.block_info[b, REF] == 0:
            prefix_cache.lru_remove(s, b)
            c[COMPUTED_SLOTS] += bs
            c[DEMAND_SLOTS] += bs
        elif s.block_info[b, REF] == s.block_info[b, TRANSFERS]:  # held by KV transfers alone until now
            c[TRANSFER_SLOTS] -= bs
            c[COMPUTED_SLOTS] += bs
            c[DEMAND_SLOTS] += bs
        s.block_info[b, REF] += 1
        s.block_table[slot, k] = b
    need = max(need, hits)
    take_blocks(s, slot, hits, need - hits)
    cached = hits * bs
    s.num_blocks[i] = need
    s.num_computed_tokens[i] = cached
    c[DEMAND_SLOTS] += min(s.final_len[i], need * bs) - cached  # the fresh blocks' demand
    c[NUM_ALLOCATIONS] += 1
    c[LOGICAL_BLOCKS] += need
    c[PREFIX_HIT_TOKENS] += cached
    c[PREFIX_LOOKUP_TOKENS] += num_tokens
    return cached


# vLLM 0.4.2's computed blocks (block_manager_v1.py:585-620): what a prompt that hits the
# cache skips is not its hits but the leading blocks marked computed, short of its table's last
@njit  # once per scheduled request of a prefix-caching v0 step: a call
def mark_computed(s, i):
    """Request ``i`` was scheduled: each of its sequences' full blocks but the last full one are
    computed, marked from there back to the first marked already (``compute_full_blocks_in_seq``,
    after each step is scheduled: ``scheduler.py:986-991``)."""
    for j in range(s.num_seqs[i]):
        slot = s.seq_slot[i, j]
        for k in range(s.num_computed_tokens[i] // s.config[BLOCK_SIZE] - 2, -1, -1):
            b = s.block_table[slot, k]
            if s.block_info[b, COMPUTED]:
                break
            s.block_info[b, COMPUTED] = 1


@njit(inline=True)
def computed_prefix_tokens(s, i):
    """The tokens of request ``i``'s leading blocks marked computed, its table's last block
    aside (``get_all_computed_blocks``): those its prompt skips."""
    slot = s.seq_slot[i, 0]
    k = 0
    while k < s.num_blocks[i] - 1 and s.block_info[s.block_table[slot, k], COMPUTED]:
        k += 1
    return k * s.config[BLOCK_SIZE]


@njit(inline=True)
def compute_tokens(s, i, n, traits):
    """``n`` more tokens of request ``i`` get their K/V (into blocks it holds). ``traits``: what the
    caller's scheduler family does, a constant there (``memory.py``): a family whose prefix cache
    keys a block once computed (vLLM v1's groups key their own) compiles that alone."""
    compute_tokens_seq(s, i, 0, n, traits)


@njit(inline=True)
def compute_tokens_seq(s, i, j, n, traits):
    """:func:`compute_tokens` into sequence ``j``'s blocks (a swap-in's; the request's count
    of computed tokens is the same for each). Prefix caching is the paged manager's alone."""
    if traits & BLOCK_TABLE and s.config[PREFIX_CACHING]:
        old, slot = s.num_computed_tokens[i], s.seq_slot[i, j]
        if traits & CACHES_COMPUTED:
            prefix_cache.register_computed_blocks(s, i, slot, old, old + n)
        else:
            prefix_cache.register_full_blocks(s, i, slot, old, old + n)
    s.num_computed_tokens[i] += n
    s.count[COMPUTED_SLOTS] += n


@njit(inline=True)
def crosses_block(s, i):
    """Whether request ``i``'s next token needs a fresh block."""
    return s.num_computed_tokens[i] == s.num_blocks[i] * s.config[BLOCK_SIZE]


@njit(inline=True)
def decode_blocks_needed(s, i):
    """Blocks request ``i``'s next decode token takes: a fresh one per sequence at a block
    boundary, else a copy per sequence writing into a shared tail but the last."""
    w = s.num_seqs[i]
    if crosses_block(s, i):
        return w
    if w == 1:
        return 0
    # a partly filled tail is shared only within the group (one tail by all right after the
    # fork; any sequences after beams fork from survivors): a sequence copies its tail when a
    # later one in the group holds it too (take_decode_slots: the last holder finds it private)
    tail = s.num_blocks[i] - 1
    copies = 0
    for j in range(w - 1):
        b = s.block_table[s.seq_slot[i, j], tail]
        if s.block_info[b, REF] > 1:
            for later in range(j + 1, w):
                if s.block_table[s.seq_slot[i, later], tail] == b:
                    copies += 1
                    break
    return copies


@njit(inline=True)
def take_decode_slot(s, i):
    """Room for request ``i``'s next decode token: a fresh block at a block boundary (the
    caller counts the token in ``COMPUTED_SLOTS``)."""
    if s.num_seqs[i] > 1:
        take_decode_slots(s, i)
        return
    if crosses_block(s, i):
        grow_table(s, i, s.num_computed_tokens[i] + 1)
    if s.config[PREFIX_CACHING]:  # a block its token fills is cached
        prefix_cache.register_full_blocks(s, i, s.seq_slot[i, 0], s.num_computed_tokens[i],
                                          s.num_computed_tokens[i] + 1)


@njit(inline=True)
def can_grow(s, i, num_tokens):
    """Whether request ``i`` (one sequence) can hold ``num_tokens`` tokens: the blocks it lacks
    are available (vLLM v1's ``allocate_slots`` for a running request: no new prefix hits), in
    every KV cache group (``get_num_blocks_to_allocate`` summed over the groups,
    kv_cache_coordinator.py:199-262: a group's table keeps its freed blocks' places, so each
    lacks as many, single_type_kv_cache_manager.py:229-234)."""
    need = blocks_for(s, num_tokens) - s.num_blocks[i]
    if s.config[MAMBA_ALIGN]:  # one fresh state block per state group whenever its table grows
        return need * attention_groups(s) + (s.config[STATE_GROUPS] if need > 0 else 0) <= num_free_blocks(s)
    if grouped(s):  # and a first allocation's state blocks
        need = need * attention_groups(s) + (s.config[STATE_GROUPS] * state_blocks(s) if s.num_blocks[i] == 0 < need
                                             else 0)
    return need <= num_free_blocks(s)


@njit(inline=True)
def grow(s, i, num_tokens):
    """Request ``i``'s blocks (one sequence) grow to hold ``num_tokens`` tokens, in every KV cache
    group (vLLM v1's callers: :func:`grow_table` is the others')."""
    old, need = grow_table(s, i, num_tokens)
    if need > 0:
        if grouped(s):
            take_group_blocks(s, s.seq_slot[i, 0], old, need)
        if s.config[MAMBA_ALIGN]:
            take_state_blocks(s, i, old, need)


@njit(inline=True)
def grow_table(s, i, num_tokens):
    """:func:`grow` in the one table (group 0's): fresh blocks at its end, and the demand of their
    slots it will use (the caller counts the tokens computed). Returns the blocks it held and the
    blocks it took."""
    old = s.num_blocks[i]
    need = blocks_for(s, num_tokens) - old
    if need > 0:
        bs = s.config[BLOCK_SIZE]
        take_blocks(s, s.seq_slot[i, 0], old, need)
        s.count[DEMAND_SLOTS] += min(s.final_len[i], (old + need) * bs) - min(s.final_len[i], old * bs)
        s.num_blocks[i] = old + need
        s.count[LOGICAL_BLOCKS] += need
    return old, need


# vLLM v1's KV cache groups (sim/specs/kv_groups.py): with config[SLIDING_GROUPS] or
# config[STATE_GROUPS], each group has a block table (group g: columns [g * M, (g + 1) * M) of
# the slot's row: the full groups, the sliding ones, then the state ones) and takes its blocks
# from the one pool. Group 0's table is the one the plain manager keeps; COMPUTED_SLOTS and
# DEMAND_SLOTS count one attention group as if it kept every block, a sliding-window group holds
# count[SKIPPED_SLOTS] fewer, and a state group one block per holder, count[STATE_BLOCKS] in
# all (memory_categories). With prefix caching (sliding-window groups: prefix_cache.group_hits,
# allocate_group_hits) a hit block is held by several requests, each counting it as its own:
# count[FULL_SHARED_SLOTS] and count[SLIDING_SHARED_SLOTS] are its holders' slots past the first.


@njit(inline=True)
def grouped(s):
    """Whether the pool serves several KV cache groups (else: one table, the plain manager)."""
    return prefix_cache.several_groups(s.config)


@njit(inline=True)
def attention_groups(s):
    """The groups whose blocks hold tokens (full and sliding-window attention)."""
    return s.config[FULL_GROUPS] + s.config[SLIDING_GROUPS]


@njit(inline=True)
def table_width(s):
    """The columns of one group's block table (M)."""
    return s.block_table.shape[1] // (attention_groups(s) + s.config[STATE_GROUPS])


@njit(inline=True)
def take_free_block(s, slot, column):
    """The free stack's top block into ``slot``'s row at ``column``; with prefix caching, once the
    stack is empty, the LRU's head, its key dropped (``get_new_blocks``, block_pool.py:706-740)."""
    top = s.count[FREE_TOP] - 1
    if top < 0 and s.config[PREFIX_CACHING]:
        b, _ = prefix_cache.evict_oldest(s, np.int64(-1))
    else:
        b = s.free_block_ids[top]
        s.count[FREE_TOP] = top
    s.block_table[slot, column] = b
    if s.config[SHARED_BLOCKS]:
        s.block_info[b, REF] = 1


@njit(inline=True)
def state_blocks(s):
    """The blocks a request holds in each state group: its state's, and with speculative decoding
    one more per draft (``num_speculative_blocks`` = K, mamba/abstract.py:86-90, added to the
    tokens a Mamba group allocates for, single_type_kv_cache_manager.py:1713-1719, 1801-1806)."""
    return 1 + s.config[SPEC_TOKENS]


@njit(lazy=prefix_cache.several_groups)
def take_group_blocks(s, slot: int, first: int, n: int) -> None:
    """Attention groups 1.. take ``n`` blocks each at table index ``first`` (group 0 took its
    own); at a request's first allocation each state group takes its :func:`state_blocks` (a Mamba
    state covers ``max_model_len`` tokens: ``cdiv(num_tokens, block_size)`` is 1 in the base
    ``get_num_blocks_to_allocate``, single_type_kv_cache_manager.py:214, kv_groups.py)."""
    groups, width = attention_groups(s), table_width(s)
    for g in range(1, groups):
        for k in range(n):
            take_free_block(s, slot, g * width + first + k)
    s.count[LOGICAL_BLOCKS] += (groups - 1) * n
    if first == 0 < n and not s.config[MAMBA_ALIGN]:  # (align mode: take_state_blocks)
        for g in range(groups, groups + s.config[STATE_GROUPS]):
            for k in range(state_blocks(s)):
                take_free_block(s, slot, g * width + k)
        s.count[STATE_BLOCKS] += s.config[STATE_GROUPS]
        s.count[LOGICAL_BLOCKS] += s.config[STATE_GROUPS] * state_blocks(s)


@njit(lazy=prefix_cache.several_groups)
def take_state_blocks(s, i: int, old: int, n: int) -> None:
    """MAMBA_ALIGN: request ``i``'s tables grew from ``old`` to ``old + n`` columns: each state group
    takes ONE fresh block, at the last column (the state after the tokens it will hold), the
    columns between null; the last column before (its own state, or a hit's) becomes the copy
    source, kept for the step (``MambaManager.allocate_new_blocks``, single_type_kv_cache_manager.py:
    1797-1923: ``last_state_block_idx``, :1837-1848; the null padding, :1849-1860; one block,
    :1873-1879; the worker copies the state forward)."""
    slot, width, states = s.seq_slot[i, 0], table_width(s), s.config[STATE_GROUPS]
    if old > 0:
        s.window[i, STATE_SOURCE] = old  # column old - 1, plus one (0: none)
    last = old + n - 1
    for g in range(attention_groups(s), attention_groups(s) + states):
        for k in range(old, last):
            s.block_table[slot, g * width + k] = -1  # vLLM's null block
        take_free_block(s, slot, g * width + last)
    s.count[STATE_BLOCKS] += states
    s.count[LOGICAL_BLOCKS] += states


@njit(lazy=prefix_cache.several_groups)
def remove_skipped_states(s, i: int, processed: int) -> None:
    """MAMBA_ALIGN: request ``i``'s state groups free the states it no longer needs once ``processed``
    tokens are processed, before the step's count (``allocate_slots``, kv_cache_manager.py:564-568):
    every block below column ``(processed - 1) // block_size`` not freed yet, last first
    (``get_num_skipped_tokens`` = ``processed - 1``, single_type_kv_cache_manager.py:1971-1976;
    ``_remove_blocks_in_range`` from the columns retired, :1608-1627), then its copy source once past
    it (``remove_skipped_blocks``, :1629-1657; without speculative blocks the copy source lies below
    the first rule's column too, so the second frees nothing the first has not), group by group;
    hashed ones to the LRU's tail (:func:`let_go`)."""
    if processed <= 1:
        return
    bs, slot, width = s.config[BLOCK_SIZE], s.seq_slot[i, 0], table_width(s)
    first, last = s.window[i, STATE_RETIRED], min((processed - 1) // bs, s.num_blocks[i])
    source = s.window[i, STATE_SOURCE] - 1
    past_source = 0 <= source < (processed + bs - 1) // bs - 1
    if first >= last and not past_source:
        return
    for g in range(attention_groups(s), attention_groups(s) + s.config[STATE_GROUPS]):
        for k in range(last - 1, first - 1, -1):
            let_go_state(s, slot, g * width + k)
        if past_source:
            let_go_state(s, slot, g * width + source)
    if first < last:
        s.window[i, STATE_RETIRED] = last


@njit(inline=True)
def let_go_state(s, slot, column):
    """MAMBA_ALIGN: the state block at ``column`` of ``slot``'s row, if any, let go and nulled
    (:func:`let_go`; held by nobody now, it leaves ``STATE_BLOCKS``)."""
    b = s.block_table[slot, column]
    if b < 0:
        return
    s.block_table[slot, column] = -1
    s.count[LOGICAL_BLOCKS] -= 1
    let_go(s, b, STATE_KIND)


@njit(lazy=prefix_cache.several_groups)
def free_states(s, i: int) -> None:
    """MAMBA_ALIGN: request ``i``'s state groups let their blocks go at its end or preemption, group
    by group, each's last column first, null ones skipped (``pop_blocks_for_free``, ``trim_null_head``,
    single_type_kv_cache_manager.py:571-601, block_pool.py:830)."""
    slot, width = s.seq_slot[i, 0], table_width(s)
    for g in range(attention_groups(s), attention_groups(s) + s.config[STATE_GROUPS]):
        for k in range(s.num_blocks[i] - 1, -1, -1):
            let_go_state(s, slot, g * width + k)
    s.window[i, STATE_SOURCE] = 0
    s.window[i, STATE_RETIRED] = 0


@njit(inline=True)
def give_back(s, slot, column):
    """The block at ``column`` of ``slot``'s row back to the free stack (with prefix caching:
    :func:`let_go`)."""
    b = s.block_table[slot, column]
    if s.config[PREFIX_CACHING]:
        let_go(s, b, FULL_KIND if column < s.config[FULL_GROUPS] * table_width(s) else SLIDING_KIND)
        return
    s.free_block_ids[s.count[FREE_TOP]] = b
    s.count[FREE_TOP] += 1
    if s.config[SHARED_BLOCKS]:
        s.block_info[b, REF] = 0


# the kinds of group a block let go is of (:func:`let_go`)
FULL_KIND, SLIDING_KIND, STATE_KIND = 0, 1, 2


@njit(inline=True)
def let_go(s, b, kind):
    """Prefix caching over the groups: a holder lets block ``b`` (of a full group, a sliding one or
    a state one: ``kind``) go. Still held, it is shared no more by one (a state block counts once in
    ``STATE_BLOCKS`` whoever holds it); let go by all, it goes to the LRU's tail if it is cached
    (under a key, a copy too), else to the free stack, reused first (``BlockPool.free_blocks``,
    block_pool.py:816-847)."""
    s.block_info[b, REF] -= 1
    if s.block_info[b, REF]:
        if kind != STATE_KIND:
            s.count[FULL_SHARED_SLOTS if kind == FULL_KIND else SLIDING_SHARED_SLOTS] -= s.config[BLOCK_SIZE]
        return
    if kind == STATE_KIND:
        s.count[STATE_BLOCKS] -= 1
    if s.block_info[b, KEY_END]:
        prefix_cache.lru_append(s, b)
    else:
        s.free_block_ids[s.count[FREE_TOP]] = b
        s.count[FREE_TOP] += 1


@njit(inline=True)
def skipped_blocks(s, processed):
    """The leading blocks a sliding-window group no longer needs once ``processed`` tokens are
    processed: ``max(0, processed - window + 1)`` tokens are skipped, their whole blocks
    (``SlidingWindowManager.get_num_skipped_tokens``, single_type_kv_cache_manager.py:1148-1183)."""
    return max(0, processed - s.config[SLIDING_WINDOW] + 1) // s.config[BLOCK_SIZE]


@njit(lazy=prefix_cache.several_groups)
def group_blocks_to_allocate(s, i: int, num_tokens: int, capped: bool) -> int:
    """Prefix caching over the groups: the available blocks allocating ``num_tokens`` tokens of
    waiting request ``i`` consumes, its hit (:func:`prefix_cache.group_hits`, looked up with its
    tokens) taken (``get_num_blocks_to_allocate``, single_type_kv_cache_manager.py:214-266): each
    group the blocks past the hit's (its null ones too: a sliding group's ``required`` less the
    hit's length), a sliding group's ``required`` capped first at its admission cap when
    ``capped`` (the whole sequence's test, kv_cache_manager.py:531-548; the step's own is not,
    :570-588), and every hit block nobody holds, taken out of the LRU: the full groups' all, the
    sliding ones' past those the window skips (:251-261)."""
    hit, _ = prefix_cache.group_hits(s, i, s.prompt_target[i])
    full, groups = s.config[FULL_GROUPS], attention_groups(s)
    required = blocks_for(s, num_tokens)
    sliding_required = min(required, s.config[WINDOW_CAP_BLOCKS]) if capped else required
    need = full * max(required - hit, 0) + (groups - full) * max(sliding_required - hit, 0)
    skipped = skipped_blocks(s, hit * s.config[BLOCK_SIZE])
    for g in range(groups):
        for k in range(skipped if g >= full else 0, hit):
            if s.block_info[prefix_cache.group_lookup(s, i, k, g), REF] == 0:
                need += 1
    if s.config[MAMBA_ALIGN]:
        need += state_blocks_to_allocate(s, i, hit, required)
    return need


@njit(lazy=prefix_cache.several_groups)
def state_blocks_to_allocate(s, i: int, hit: int, required: int) -> int:
    """MAMBA_ALIGN: the state groups' part of :func:`group_blocks_to_allocate` for waiting request
    ``i`` with a hit of ``hit`` blocks and ``required`` blocks in all (``MambaManager.
    get_num_blocks_to_allocate``, single_type_kv_cache_manager.py:1692-1795): per group one fresh
    block if its table must grow (the hit list, null padding included, is ``hit`` long; capped at 1,
    :1785-1790), and the hit state if nobody holds it (:1792-1795); more than the pool when the hit
    state was cached in this step (it is hashed when scheduled, not yet computed: :1704-1712), which
    fails the admission and ends the waiting loop (scheduler.py:1454-1460)."""
    need = s.config[STATE_GROUPS] * (1 if required > hit else 0)
    if hit == 0:
        return need
    for g in range(attention_groups(s), attention_groups(s) + s.config[STATE_GROUPS]):
        b = prefix_cache.group_lookup(s, i, hit - 1, g)
        if prefix_cache.state_cached_now(s, b):
            return s.config[NUM_BLOCKS] + 1
        if s.block_info[b, REF] == 0:
            need += 1
    return need


@njit(lazy=prefix_cache.several_groups)
def allocate_group_hits(s, i: int, num_tokens: int) -> int:
    """Prefix caching over the groups: waiting request ``i``, looked up with ``num_tokens``
    tokens, takes a block-table row and its hit in every group (``add_local_computed_blocks``,
    single_type_kv_cache_manager.py:268-325): a full group its hit blocks, a sliding one those
    past the ones the window skips, null before them (``WINDOW_SKIPPED``: the run it found, as a
    run of ``window_blocks`` ends where the hit does), each touched (out of the LRU if nobody
    held it: ``touch``, block_pool.py:792-810), every group's before any group takes a new block
    (:func:`grow`; kv_cache_coordinator.py:295-348: a new block must not evict a hit). Its
    junction is kept for its registrations (``WINDOW_JUNCTION``; scheduler.py:1122-1127).
    Returns the hit's tokens, computed."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    full, groups, width = s.config[FULL_GROUPS], attention_groups(s), table_width(s)
    slot = take_slot(s)
    s.seq_slot[i, 0] = slot
    hit, junction = prefix_cache.group_hits(s, i, num_tokens)
    skipped = skipped_blocks(s, hit * bs)
    if s.config[MAMBA_ALIGN] and hit:  # each state group: the hit state alone, at its column (stkcm:268-325)
        for g in range(groups, groups + s.config[STATE_GROUPS]):
            for k in range(hit - 1):
                s.block_table[slot, g * width + k] = -1  # vLLM's null block
            b = prefix_cache.group_lookup(s, i, hit - 1, g)
            if s.block_info[b, REF] == 0:
                prefix_cache.lru_remove(s, b)
                c[STATE_BLOCKS] += 1
            s.block_info[b, REF] += 1
            s.block_table[slot, g * width + hit - 1] = b
        c[LOGICAL_BLOCKS] += s.config[STATE_GROUPS]
    for g in range(groups):
        first = skipped if g >= full else 0
        for k in range(first):
            s.block_table[slot, g * width + k] = -1  # vLLM's null block
        for k in range(first, hit):
            b = prefix_cache.group_lookup(s, i, k, g)
            if s.block_info[b, REF] == 0:
                prefix_cache.lru_remove(s, b)
            else:  # a second holder or more: its slots counted once (memory_categories)
                c[FULL_SHARED_SLOTS if g < full else SLIDING_SHARED_SLOTS] += bs
            s.block_info[b, REF] += 1
            s.block_table[slot, g * width + k] = b
    cached = hit * bs
    s.num_blocks[i] = hit
    s.num_computed_tokens[i] = cached
    s.window[i, WINDOW_SKIPPED] = skipped
    s.window[i, WINDOW_JUNCTION] = junction * bs
    c[SKIPPED_SLOTS] += skipped * bs
    c[COMPUTED_SLOTS] += cached
    c[DEMAND_SLOTS] += min(s.final_len[i], cached)
    c[LOGICAL_BLOCKS] += groups * hit - (groups - full) * skipped
    c[NUM_ALLOCATIONS] += 1
    c[PREFIX_HIT_TOKENS] += cached
    c[PREFIX_LOOKUP_TOKENS] += num_tokens
    return cached


@njit(inline=True)
def frees_on_processed(s):
    """Whether groups free a request's blocks as its tokens are processed (a sliding window's
    blocks left behind; in "align" mode, the states passed), so its tokens in flight are kept
    (``WINDOW_IN_FLIGHT``, :func:`processed_tokens`)."""
    return s.config[SLIDING_GROUPS] > 0 or s.config[MAMBA_ALIGN] > 0


@njit(inline=True)
def processed_tokens(s, i, async_scheduling):
    """Request ``i``'s tokens whose step has ended: under async scheduling the step scheduled
    last is still in flight when the next is scheduled (kv_cache_manager.py:557-567)."""
    if async_scheduling:
        return s.num_computed_tokens[i] - s.window[i, WINDOW_IN_FLIGHT]
    return s.num_computed_tokens[i]


@njit(inline=True)
def free_processed(s, i, n):
    """Running request ``i`` is scheduled ``n`` tokens: where groups free blocks as tokens are
    processed (:func:`frees_on_processed`), those its processed tokens left behind go first, as
    ``allocate_slots`` frees them before counting new ones (kv_cache_manager.py:557-568), and its
    ``n`` tokens are in flight."""
    if not frees_on_processed(s):
        return
    processed = processed_tokens(s, i, s.config[ASYNC_SCHEDULING])
    if s.config[SLIDING_GROUPS]:
        remove_skipped(s, i, processed)
    else:
        remove_skipped_states(s, i, processed)
    s.window[i, WINDOW_IN_FLIGHT] = n


@njit(inline=True)
def in_flight(s, i, n):
    """Request ``i`` has ``n`` tokens in this step (0: none), where groups free blocks as tokens
    are processed (:func:`processed_tokens` leaves them out)."""
    if frees_on_processed(s):
        s.window[i, WINDOW_IN_FLIGHT] = n


@njit(inline=True)
def allocate_admitted(s, i, target):
    """Blocks for admitted request ``i`` (``target`` tokens): with prefix caching its hits first
    (:func:`allocate_hits`), whose tokens it returns as computed; else none yet, the caller
    growing them for its first chunk (:func:`grow`)."""
    if s.config[PREFIX_CACHING]:
        return allocate_hits(s, i, target, np.int64(0))  # np.int64: jit.njit's note on constants
    return allocate(s, i, 0, 0)


@njit(lazy=prefix_cache.several_groups)
def remove_skipped(s, i: int, processed: int) -> None:
    """The sliding-window groups free request ``i``'s blocks that every later token's window
    has left: ``max(0, processed - window + 1)`` tokens are skipped (``SlidingWindowManager.
    get_num_skipped_tokens``, single_type_kv_cache_manager.py:1148-1183), their whole blocks
    freed, last first, and nulled in the table (``remove_skipped_blocks``, :682-720,
    ``_remove_blocks_in_range``, :655-680). vLLM calls it from ``allocate_slots`` each time a
    request is scheduled, before its new blocks are counted (kv_cache_manager.py:557-567)."""
    bs = s.config[BLOCK_SIZE]
    skipped = min(skipped_blocks(s, processed), s.num_blocks[i])
    old = s.window[i, WINDOW_SKIPPED]
    if skipped <= old:
        return
    full, groups, width = s.config[FULL_GROUPS], attention_groups(s), table_width(s)
    slot = s.seq_slot[i, 0]
    for g in range(full, groups):
        for k in range(skipped - 1, old - 1, -1):
            give_back(s, slot, g * width + k)
            s.block_table[slot, g * width + k] = -1  # vLLM's null block
    s.window[i, WINDOW_SKIPPED] = skipped
    s.count[SKIPPED_SLOTS] += (skipped - old) * bs
    s.count[LOGICAL_BLOCKS] -= (skipped - old) * (groups - full)


@njit(lazy=prefix_cache.several_groups)
def free_groups(s, i: int) -> None:
    """:func:`free` over the groups: each group's blocks (a sliding one's past those it freed, a
    state one's block). With prefix caching in vLLM's order, which decides the LRU's: group by
    group in its order (:func:`vllm_group`; kv_cache_coordinator.py:404-412), each group's last
    block first (single_type_kv_cache_manager.py:591-599); without, every block goes to the free
    stack and the order only names them."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    full, groups, width = s.config[FULL_GROUPS], attention_groups(s), table_width(s)
    slot, nb, skipped = s.seq_slot[i, 0], s.num_blocks[i], s.window[i, WINDOW_SKIPPED]
    last_first = s.config[PREFIX_CACHING]
    if s.config[MAMBA_ALIGN] and s.config[STATE_FIRST]:  # vLLM's order: the state groups first
        free_states(s, i)
    for n in range(groups):
        g = vllm_group(s, n)
        first = skipped if g >= full else 0
        for m in range(nb - first):
            give_back(s, slot, g * width + (nb - 1 - m if last_first else first + m))
    c[LOGICAL_BLOCKS] -= groups * nb - (groups - full) * skipped
    if s.config[MAMBA_ALIGN]:
        if not s.config[STATE_FIRST]:
            free_states(s, i)
    elif nb:  # a holder: its states too
        for g in range(groups, groups + s.config[STATE_GROUPS]):
            for k in range(state_blocks(s)):
                give_back(s, slot, g * width + k)
        c[STATE_BLOCKS] -= s.config[STATE_GROUPS]
        c[LOGICAL_BLOCKS] -= s.config[STATE_GROUPS] * state_blocks(s)
    c[SKIPPED_SLOTS] -= skipped * bs
    c[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
    c[DEMAND_SLOTS] -= min(s.final_len[i], nb * bs)
    return_slot(s, slot)
    s.window[i, WINDOW_SKIPPED] = 0
    s.window[i, WINDOW_IN_FLIGHT] = 0
    s.window[i, WINDOW_JUNCTION] = 0
    s.num_computed_tokens[i] = 0
    s.num_blocks[i] = 0
    s.seq_slot[i, 0] = -1
    c[NUM_FREES] += 1


@njit(inline=True)
def vllm_group(s, n):
    """The ``n``-th attention group in vLLM's order (pagesim's index): the sliding groups first
    under ``SLIDING_FIRST`` (kv_groups.KVCacheGroups.sliding_first), else pagesim's own order."""
    if s.config[SLIDING_FIRST]:
        sliding = s.config[SLIDING_GROUPS]
        return s.config[FULL_GROUPS] + n if n < sliding else n - sliding
    return n


@njit(inline=True)
def blocks_for_sequence(s, num_tokens):
    """The blocks ``num_tokens`` tokens of one request take in all the groups at their most: a
    sliding-window group at most its admission cap (``get_num_blocks_to_allocate`` with
    ``apply_admission_cap``, single_type_kv_cache_manager.py:214-227), a state group its
    :func:`state_blocks`."""
    need = blocks_for(s, num_tokens)
    if grouped(s):
        return (s.config[FULL_GROUPS] * need + s.config[SLIDING_GROUPS] * min(need, s.config[WINDOW_CAP_BLOCKS])
                + s.config[STATE_GROUPS] * state_blocks(s))
    return need


@njit(inline=True)
def take_decode_slots(s, i):
    """:func:`take_decode_slot` for a group of sequences: each takes a fresh block at a
    block boundary; otherwise each writing into a tail it shares copies it first
    (copy-on-write: the copy holds the tail's tokens; the last writer finds it private)."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    w, L, k = s.num_seqs[i], s.num_computed_tokens[i], s.num_blocks[i]
    if L == k * bs:
        for j in range(w):
            take_blocks(s, s.seq_slot[i, j], k, 1)
        c[DEMAND_SLOTS] += w * min(s.final_len[i] - L, bs)
        c[LOGICAL_BLOCKS] += w
        s.num_blocks[i] = k + 1
        return
    tail = k - 1
    for j in range(w):
        slot = s.seq_slot[i, j]
        b = s.block_table[slot, tail]
        if s.block_info[b, REF] > 1:
            s.block_info[b, REF] -= 1
            take_blocks(s, slot, tail, 1)
            c[COMPUTED_SLOTS] += L - tail * bs
            c[DEMAND_SLOTS] += min(s.final_len[i] - tail * bs, bs)
            c[NUM_COW_COPIES] += 1
            if s.config[EXTERNAL_STEPS]:  # the executor copies the shared tail into the fresh block
                s.step_copies[c[STEP_COPIED_BLOCKS], 0] = b
                s.step_copies[c[STEP_COPIED_BLOCKS], 1] = s.block_table[slot, tail]
            c[STEP_COPIED_BLOCKS] += 1


@njit
def fork(s, i):
    """After request ``i``'s prefill: its ``width - 1`` other sequences, each a block-table
    row holding the first one's blocks (referenced once more each). Tokens and demand do not
    change: the blocks are shared, and every sequence of a request has the same final length."""
    w = s.width[i]
    for j in range(1, w):
        fork_seq(s, i, 0, j)
    s.num_seqs[i] = w  # (max_num_seqs counted them from its admission: lifecycle.start_running)


@njit(inline=True)
def fork_seq(s, i, parent, j):
    """Sequence ``j`` of request ``i`` starts as a copy of its sequence ``parent``: a
    block-table row holding its blocks, referenced once more each."""
    nb = s.num_blocks[i]
    source = s.seq_slot[i, parent]
    slot = take_slot(s)
    s.seq_slot[i, j] = slot
    for k in range(nb):
        b = s.block_table[source, k]
        s.block_table[slot, k] = b
        s.block_info[b, REF] += 1
    s.count[LOGICAL_BLOCKS] += nb
    s.count[NUM_FORKS] += 1


# A group's sequences share leading blocks: a fork shares its parent's every block, and a block
# written after it is its own (copy-on-write), so two sequences share a prefix of their tables, and
# the shares nest (a lineage's): the earlier sequence ``p`` that sequence ``j`` shares most with
# holds every block ``j`` shares with any earlier one. vLLM 0.4.2 swaps a block its sequences share
# once, and back in once, shared again (``block_manager_v1.py:474-533``, its ``mapping``): so while
# a group is swapped out, each of its sequences ``j >= 1`` keeps (p, d), its d leading blocks those
# of sequence p, in its ``seq_slot`` as -(2 + slot + slots * (1 + p + width * d)) (``slot``: its
# slot as it left, read while the group lets its sequences go, :func:`swap_out`).
@njit(inline=True)
def slot_of(s, i, j):
    """Sequence ``j``'s slot: held, or as it left in a swap-out (:func:`swap_out`)."""
    code = s.seq_slot[i, j]
    return code if code >= 0 else (-code - 2) % s.block_table.shape[0]


@njit
def sharing(s, i, j):
    """(p, d): sequence ``j`` (>= 1) of request ``i`` shares its ``d`` leading blocks with its
    earlier sequence ``p``, the one it shares most with (the first of equals; ``d`` 0: none),
    from the tables it holds, or as it kept them while swapped out."""
    code = s.seq_slot[i, j]
    if code < -1:
        kept = (-code - 2) // s.block_table.shape[0] - 1
        return kept % s.seq_slot.shape[1], kept // s.seq_slot.shape[1]
    best, most = 0, 0
    for p in range(j):
        a, b, d = slot_of(s, i, p), slot_of(s, i, j), 0
        while d < s.num_blocks[i] and s.block_table[a, d] == s.block_table[b, d]:
            d += 1
        if d > most:
            best, most = p, d
    return best, most


@njit
def swapped_size(s, i, n):
    """The tokens request ``i``'s sequences, ``n`` each, move to or from the host: a block they
    share once (:func:`sharing`)."""
    moved = n
    for j in range(1, s.num_seqs[i]):
        moved += n - min(sharing(s, i, j)[1] * s.config[BLOCK_SIZE], n)
    return moved


@njit
def swap_out(s, i):
    """Request ``i``'s sequences let their blocks go to the host, in order (as :func:`free`), each
    after the first keeping how it shared them (:func:`sharing`)."""
    slots, width = s.block_table.shape[0], s.seq_slot.shape[1]
    for j in range(s.num_seqs[i]):
        p, d = sharing(s, i, j) if j else (0, 0)
        slot = s.seq_slot[i, j]
        release_seq(s, i, j)
        s.seq_slot[i, j] = -(2 + slot + slots * (1 + p + width * d))
    s.num_computed_tokens[i] = 0
    s.num_blocks[i] = 0


@njit  # per swap-in: a call (sim/core/events/loop.py's docstring, "Compiled per family")
def swap_in(s, i, n):
    """Whether request ``i``'s sequences came back with ``n`` computed tokens each (and a
    prompt's blocks all, like its admission, when it left mid-prompt). vLLM's can_swap_in
    (block_manager_v1.py:455-472): its blocks, a block its sequences share once, and one more
    per sequence (its next token's) must leave the watermark free. They come back sharing what
    they shared (:func:`sharing`), as vLLM swaps each block out and in once (swap_out/swap_in):
    the first in blocks of its own (prefix caching: past its hits, and only what the cache does
    not hold is computed again), each other holding the blocks it shared with an earlier one and
    blocks of its own past them."""
    bs, w = s.config[BLOCK_SIZE], s.num_seqs[i]
    held = max(n, s.prompt_target[i])  # swapped out mid-prompt: the blocks its whole prompt took
    own = blocks_for(s, held)
    need = own + w
    for j in range(1, w):
        need += own - sharing(s, i, j)[1]
    if num_free_blocks(s) - need < s.config[WATERMARK_BLOCKS]:
        return False
    cached = allocate_seq(s, i, 0, held, n)
    if cached < n:
        compute_tokens_seq(s, i, 0, n - cached, BLOCK_TABLE)  # (vLLM v0's swap: blocks keyed once full)
    for j in range(1, s.num_seqs[i]):
        p, shared = sharing(s, i, j)
        fork_seq(s, i, p, j)
        slot = s.seq_slot[i, j]
        for k in range(shared, s.num_blocks[i]):
            s.block_info[s.block_table[slot, k], REF] -= 1
            take_blocks(s, slot, k, 1)
            s.count[COMPUTED_SLOTS] += min(max(n - k * bs, 0), bs)
            s.count[DEMAND_SLOTS] += min(max(s.final_len[i] - k * bs, 0), bs)
    return True


@njit(inline=True)
def free(s, i):
    """Request ``i`` lets its memory go (every sequence of it; vLLM v1's KV cache groups:
    :func:`free_groups`)."""
    if s.config[SHARED_BLOCKS]:
        for j in range(s.num_seqs[i]):
            release_seq(s, i, j)
        s.num_computed_tokens[i] = 0
        s.num_blocks[i] = 0
        return
    s.count[LOGICAL_BLOCKS] -= s.num_blocks[i]
    return_blocks(s, s.seq_slot[i, 0], s.num_blocks[i])
    return_slot(s, s.seq_slot[i, 0])
    s.count[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
    s.count[DEMAND_SLOTS] -= min(s.final_len[i], s.num_blocks[i] * s.config[BLOCK_SIZE])
    s.num_computed_tokens[i] = 0
    s.num_blocks[i] = 0
    s.seq_slot[i, 0] = -1
    s.count[NUM_FREES] += 1


@njit
def release_seq(s, i, j):
    """Blocks may be shared (prefix caching, forks): sequence ``j`` of request ``i`` lets its
    blocks go, tail first; a block nobody holds any more leaves the accounting (a shared block
    is at the same index in every table that holds it, full or a group's tail, so the
    request's counts give its tokens and demand) and goes, with prefix caching and full, to the
    LRU's tail (tails are then evicted first), keyed (a copy of a block cached already too: vLLM
    hashes both, ``block_pool.py:36-56``; prefix_cache.register), else to the free stack, reused
    first (vLLM 0.33.0 ``BlockPool.free_blocks``, ``vllm/v1/core/block_pool.py:816-847``). vLLM
    0.4.2's evictor takes every block let go, full or not (``CachedBlockAllocator.free``,
    ``block_manager_v1.py:123-133``: each has a hash, a partial one a counter's), with its last
    access and its depth (``prefix_cache.evict_oldest``)."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    slot = s.seq_slot[i, j]
    num_tokens, final_len = s.num_computed_tokens[i], s.final_len[i]
    v0 = s.config[PREFIX_CACHING] and prefix_cache.v0_evictor(s)
    run_access = -1
    for k in range(s.num_blocks[i] - 1, -1, -1):
        b = s.block_table[slot, k]
        s.block_info[b, REF] -= 1
        if v0:  # accessed whenever a holder is scheduled (``access_all_blocks_in_seq``, :573-583)
            s.block_info[b, ACCESS_STEP] = max(s.block_info[b, ACCESS_STEP], s.last_scheduled_step[i])
        if s.block_info[b, REF]:
            if s.block_info[b, REF] == s.block_info[b, TRANSFERS]:  # held by KV transfers alone now
                remote_kv_only(s, num_tokens, final_len, k)
            continue
        c[COMPUTED_SLOTS] -= min(max(num_tokens - k * bs, 0), bs)
        c[DEMAND_SLOTS] -= min(max(final_len - k * bs, 0), bs)
        if v0:
            s.block_info[b, HASHED_TOKENS] = (k + 1) * bs  # ``num_hashed_tokens_of_block``, sequence.py:257-258
            if s.block_info[b, ACCESS_STEP] != run_access:  # a run: one last access, deeper first
                run_access = s.block_info[b, ACCESS_STEP]
                c[EVICTOR_RUNS] += 1
            s.block_info[b, RUN] = c[EVICTOR_RUNS]
            prefix_cache.lru_append(s, b)
        elif s.config[PREFIX_CACHING] and (k + 1) * bs <= num_tokens:  # full: hashed in vLLM, a copy too
            prefix_cache.lru_append(s, b)
        else:
            s.free_block_ids[c[NUM_FREE_BLOCK_IDS]] = b
            c[NUM_FREE_BLOCK_IDS] += 1
    if v0:  # each run's blocks learn its last (the shallowest: the first met from the table's start)
        run, last = -1, -1
        for k in range(s.num_blocks[i]):
            b = s.block_table[slot, k]
            if s.block_info[b, REF] == 0:
                if s.block_info[b, RUN] != run:
                    run, last = s.block_info[b, RUN], b
                s.block_info[b, RUN_LAST] = last
    c[LOGICAL_BLOCKS] -= s.num_blocks[i]
    return_slot(s, slot)
    s.seq_slot[i, j] = -1
    c[NUM_FREES] += 1


@njit(inline=True)
def remote_kv_only(s, num_tokens, final_len, k):
    """Block ``k`` of a request with ``num_tokens`` tokens and final length ``final_len`` is
    now held by in-flight KV transfers alone (disaggregated, ``remote_kv.py``): its tokens and
    demand leave their categories, its slots are in transfer."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    c[COMPUTED_SLOTS] -= min(max(num_tokens - k * bs, 0), bs)
    c[DEMAND_SLOTS] -= min(max(final_len - k * bs, 0), bs)
    c[TRANSFER_SLOTS] += bs


@njit(inline=True)
def groups_elapsed(s, dt):
    """``dt`` seconds of the step just priced on the groups' counts: the slots each
    sliding-window group freed out of its window, the state blocks held, the shared slots of the
    full and the sliding groups, summed over time (0 without groups) for :func:`group_sums`."""
    c, clock = s.count, s.clock
    clock[SKIPPED_SUM] += c[SKIPPED_SLOTS] * dt
    clock[STATE_BLOCKS_SUM] += c[STATE_BLOCKS] * dt
    clock[FULL_SHARED_SUM] += c[FULL_SHARED_SLOTS] * dt
    clock[SLIDING_SHARED_SUM] += c[SLIDING_SHARED_SLOTS] * dt


def group_sums(s) -> tuple[float, float, float, float]:
    """A finished run's slot-seconds a sliding-window group freed, state-block-seconds held, and
    shared slot-seconds of the full and of the sliding groups (:func:`groups_elapsed`; the
    report's split by kind of group, sim/run.py's ``group_split``)."""
    clock = s.clock
    return (float(clock[SKIPPED_SUM]), float(clock[STATE_BLOCKS_SUM]), float(clock[FULL_SHARED_SUM]),
            float(clock[SLIDING_SHARED_SUM]))


@njit(inline=True)
def state_blocks_held(s):
    """The state blocks the running requests hold (one per request and state group)."""
    return s.count[STATE_BLOCKS]


@njit(inline=True)
def memory_categories(s, demand_waiting, out):
    """Where every slot goes (sim.metrics.MEMORY_CATEGORIES, in order): token states,
    reservation, internal fragmentation, allocator slack, external fragmentation (free while
    a request waits for memory), free and idle, speculative slack (``speculative.py`` moves it out
    of 1 and 2), then the slots of blocks in transfer (disaggregated, ``remote_kv.py``). They sum
    to the capacity. Cached blocks that no request
    holds count as free (they are reclaimable)."""
    block_size = s.config[BLOCK_SIZE]
    used = s.config[NUM_BLOCKS] - num_free_blocks(s)
    free_slots = num_free_blocks(s) * block_size + s.config[LEFTOVER_SLOTS]
    in_transfer = s.count[TRANSFER_SLOTS]  # disaggregated: held by in-flight transfers (remote_kv.py)
    tokens, demand = s.count[COMPUTED_SLOTS], s.count[DEMAND_SLOTS]
    if grouped(s):  # every attention group's, less what the sliding ones freed, and the states
        groups = attention_groups(s)
        # the slots no block holds: the sliding groups' freed ones, and (prefix caching) a block's
        # holders past its first (it is full for each)
        not_held = (s.config[SLIDING_GROUPS] * s.count[SKIPPED_SLOTS] + s.count[FULL_SHARED_SLOTS]
                    + s.count[SLIDING_SHARED_SLOTS])
        states = s.config[STATE_SLOTS] * s.count[STATE_BLOCKS]  # (their padding: internal fragmentation)
        tokens, demand = groups * tokens - not_held + states, groups * demand - not_held + states
    out[0] = tokens
    out[1] = demand - tokens
    out[2] = used * block_size - demand - in_transfer
    out[3] = 0
    out[4] = free_slots if demand_waiting else 0
    out[5] = 0 if demand_waiting else free_slots
    out[SPECULATIVE_SLACK] = 0  # speculative.split_categories takes its slots from 1 and 2
    out[IN_TRANSFER] = in_transfer
    return used


@njit(inline=True)
def swaps_recorded(config):
    """The runs whose swaps an executor outside the core moves (``config[EXTERNAL_STEPS]``, the
    paged manager): the only ones that list the blocks (:func:`record_swap`, ``njit``'s lazy)."""
    return config[EXTERNAL_STEPS] > 0 and config[MANAGER_KIND] == PAGED


@njit(lazy=swaps_recorded)
def record_swap(s, i: int, out: bool) -> None:
    """The device blocks of request ``i``'s sequences, in table order, as swapped out (``out``:
    before they are freed) or in (after they are allocated), the blocks they share listed once,
    with the first: the executor moves exactly these (config[EXTERNAL_STEPS]; the host blocks are
    its own)."""
    c = s.count
    rows, at = (s.step_swap_out, STEP_SWAP_OUT_BLOCKS) if out else (s.step_swap_in, STEP_SWAP_IN_BLOCKS)
    n = c[at]
    nb = blocks_for(s, s.num_computed_tokens[i])
    for j in range(s.num_seqs[i]):
        slot = s.seq_slot[i, j]
        for k in range(sharing(s, i, j)[1] if j else 0, nb):  # a shared block once, with the first holding it
            rows[n, 0] = i
            rows[n, 1] = j
            rows[n, 2] = s.block_table[slot, k]
            n += 1
    c[at] = n
