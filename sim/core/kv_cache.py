"""The paged manager (vLLM's block manager) over the core's arrays: admission checks,
allocation, one decode slot, free, and where every slot goes.

Blocks are private to one request here (no fork, no prefix hit), so a request's blocks hold
exactly its ``num_computed_tokens`` tokens and, of the slots they offer, ``min(final_len,
num_blocks * block_size)`` will be used: the accounting is four counters (see
``memory_categories``). vLLM v0's watermark: an admission must leave ``watermark_blocks``
free (``block_manager_v1.py``, ``can_allocate``).
"""

from __future__ import annotations

from sim.core.block_pool import num_free_blocks, return_blocks, return_slot, take_blocks, take_slot
from sim.core.jit import njit
from sim.core.state import (BLOCK_SIZE, COMPUTED_SLOTS, DEMAND_SLOTS, LEFTOVER_SLOTS, MAX_SEQ_LEN,
                            NUM_ALLOCATIONS, NUM_BLOCKS, NUM_FREES, WATERMARK_BLOCKS)

CAN_ALLOCATE, ALLOCATE_LATER, NEVER_FITS = 0, 1, 2


@njit(inline=True)
def blocks_for(s, num_tokens):
    block_size = s.config[BLOCK_SIZE]
    return (num_tokens + block_size - 1) // block_size


@njit(inline=True)
def can_allocate(s, i, num_tokens):
    """Whether ``num_tokens`` of request ``i`` fit now, later, or never (the request is
    longer than ``max_seq_len`` or than the pool less its watermark)."""
    need = blocks_for(s, num_tokens)
    watermark = s.config[WATERMARK_BLOCKS]
    if s.num_generated[i] > 0:  # back after a preemption: delayed, never turned away (sim/memory/paged.py)
        watermark = max(min(watermark, s.config[NUM_BLOCKS] - need), 0)
    if (s.final_len[i] > s.config[MAX_SEQ_LEN] or num_tokens > s.config[MAX_SEQ_LEN]
            or need > s.config[NUM_BLOCKS] - watermark):
        return NEVER_FITS
    return CAN_ALLOCATE if num_free_blocks(s) - need >= watermark else ALLOCATE_LATER


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed):
    """A slot and the blocks for ``num_tokens`` tokens of request ``i``, of which
    ``num_computed`` already hold K/V (a swap-in) and the rest are reserved for its prefill."""
    need = blocks_for(s, num_tokens)
    slot = take_slot(s)
    take_blocks(s, slot, 0, need)
    s.slot[i] = slot
    s.num_blocks[i] = need
    s.num_computed_tokens[i] = num_computed
    s.count[COMPUTED_SLOTS] += num_computed
    s.count[DEMAND_SLOTS] += min(s.final_len[i], need * s.config[BLOCK_SIZE])
    s.count[NUM_ALLOCATIONS] += 1


@njit(inline=True)
def compute_tokens(s, i, n):
    """``n`` more tokens of request ``i`` get their K/V (into blocks it holds)."""
    s.num_computed_tokens[i] += n
    s.count[COMPUTED_SLOTS] += n


@njit(inline=True)
def crosses_block(s, i):
    """Whether request ``i``'s next token needs a fresh block."""
    return s.num_computed_tokens[i] == s.num_blocks[i] * s.config[BLOCK_SIZE]


@njit(inline=True)
def take_decode_slot(s, i):
    """Room for request ``i``'s next decode token: a fresh block at a block boundary (the
    caller counts the token in ``COMPUTED_SLOTS``)."""
    if crosses_block(s, i):
        take_blocks(s, s.slot[i], s.num_blocks[i], 1)
        s.count[DEMAND_SLOTS] += min(s.final_len[i] - s.num_computed_tokens[i], s.config[BLOCK_SIZE])
        s.num_blocks[i] += 1


@njit(inline=True)
def free(s, i):
    return_blocks(s, s.slot[i], s.num_blocks[i])
    return_slot(s, s.slot[i])
    s.count[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
    s.count[DEMAND_SLOTS] -= min(s.final_len[i], s.num_blocks[i] * s.config[BLOCK_SIZE])
    s.num_computed_tokens[i] = 0
    s.num_blocks[i] = 0
    s.slot[i] = -1
    s.count[NUM_FREES] += 1


@njit(inline=True)
def memory_categories(s, demand_waiting, out):
    """Where every slot goes (sim/memory/base.py's six categories, in order): token states,
    reservation, internal fragmentation, allocator slack, external fragmentation (free while
    a request waits for memory), free and idle. They sum to the capacity."""
    block_size = s.config[BLOCK_SIZE]
    used = s.config[NUM_BLOCKS] - num_free_blocks(s)
    free_slots = num_free_blocks(s) * block_size + s.config[LEFTOVER_SLOTS]
    out[0] = s.count[COMPUTED_SLOTS]
    out[1] = s.count[DEMAND_SLOTS] - s.count[COMPUTED_SLOTS]
    out[2] = used * block_size - s.count[DEMAND_SLOTS]
    out[3] = 0
    out[4] = free_slots if demand_waiting else 0
    out[5] = 0 if demand_waiting else free_slots
    return used
