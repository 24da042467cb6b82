"""The paged KV pool: a stack of free block ids and the running slots' block tables.

As vLLM v1 keeps its ``BlockPool`` apart from the per-request tables, this file only moves
block ids between the free stack and a slot's row of ``block_table`` (the int32
``[slot, block]`` table the GPU kernel reads); the accounting lives in ``kv_cache.py``.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.kv.prefix_cache import evict_oldest
from pagesim.sim.core.state import NUM_FREE_BLOCK_IDS, NUM_FREE_SLOTS, NUM_LRU, REF, SHARED_BLOCKS


@njit(inline=True)
def num_free_blocks(s):
    """Blocks available to new use: the free stack and, with prefix caching, the cached blocks
    no request holds (evicted when the stack is empty)."""
    return s.count[NUM_FREE_BLOCK_IDS] + s.count[NUM_LRU]


@njit(inline=True)
def take_blocks(s, slot, first, n):
    """Put ``n`` free blocks at ``block_table[slot, first:first + n]``: the free stack's first,
    then (prefix caching) the oldest cached blocks, evicted."""
    top = s.count[NUM_FREE_BLOCK_IDS]
    if top < n:
        # np.int64: these callers pass constants 0 and 1 (jit.njit: one compile, not one per value)
        take_blocks_evicting(s, np.int64(slot), np.int64(first), np.int64(n))
        return
    for k in range(n):
        top -= 1
        s.block_table[slot, first + k] = s.free_block_ids[top]
    s.count[NUM_FREE_BLOCK_IDS] = top
    if s.config[SHARED_BLOCKS]:  # reference counts kept
        for k in range(n):
            s.block_info[s.block_table[slot, first + k], REF] = 1


@njit
def take_blocks_evicting(s, slot, first, n):
    # vLLM 0.4.2: the head run's end while it is evicted in order (prefix_cache.evict_oldest)
    run_end = np.int64(-1)
    for k in range(n):
        top = s.count[NUM_FREE_BLOCK_IDS]
        if top:
            b = s.free_block_ids[top - 1]
            s.count[NUM_FREE_BLOCK_IDS] = top - 1
        else:
            b, run_end = evict_oldest(s, run_end)
        s.block_table[slot, first + k] = b
        s.block_info[b, REF] = 1


@njit(inline=True)
def return_blocks(s, slot, n):
    """Give the first ``n`` blocks of ``slot`` back to the free stack."""
    top = s.count[NUM_FREE_BLOCK_IDS]
    for k in range(n):
        s.free_block_ids[top] = s.block_table[slot, k]
        top += 1
    s.count[NUM_FREE_BLOCK_IDS] = top


@njit(inline=True)
def take_slot(s):
    s.count[NUM_FREE_SLOTS] -= 1
    return s.free_slots[s.count[NUM_FREE_SLOTS]]


@njit(inline=True)
def return_slot(s, slot):
    s.free_slots[s.count[NUM_FREE_SLOTS]] = slot
    s.count[NUM_FREE_SLOTS] += 1
