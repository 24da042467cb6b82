"""The blocks of a KV transfer between a prefill and a decode replica (disaggregated serving,
``sim/core/events/disagg.py``), on both sides, as vLLM 0.33.0's NIXL connector holds them (pull mode,
the default; file:line of that wheel):

* **prefill side.** A request's prefill is a one-token request; when it finishes, the
  connector keeps its blocks until the decode side has read them (``request_finished``
  returns ``delay_free_blocks``: ``kv_connector/v1/nixl/pull_scheduler.py:191-250``): they
  leave the token states and become "in transfer" (:func:`hold_for_transfer`), and are freed
  when the transfer ends (:func:`release_transfer`);
* **decode side.** Admission allocates blocks for the whole prompt, which the connector loads
  asynchronously (``get_num_new_matched_tokens``, ``pull_scheduler.py:34-66``), and the
  request waits in ``WAITING_FOR_REMOTE_KVS`` computing nothing (``sched/scheduler.py:
  1514-1541``): its blocks are "in transfer" too (:func:`allocate_for_transfer`). When the
  transfer ends its blocks hold the prompt but the last token, which the decode side
  recomputes to sample the first token (``_update_waiting_for_remote_kv``,
  ``sched/scheduler.py:3467-3517``: ``num_computed_tokens = num_tokens - 1``): they become the
  request's token states (:func:`transfer_loaded`).

``count[TRANSFER_SLOTS]``: the slots of every block held by in-flight transfers alone, a
memory category of its own (``kv_cache.memory_categories``), so the categories still sum to
the capacity on both sides. With prefix caching a block may be shared: ``block_info``'s
``TRANSFERS`` counts the transfers among its holders (``REF``), and it is in transfer while
they are all of them; a decode replica's local prefix hits are in use from its admission.
"""

from __future__ import annotations

import math

from pagesim.sim.core.kv import host_tier, kv_cache, prefix_cache
from pagesim.sim.core.kv.block_pool import return_blocks, return_slot, take_blocks, take_slot
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import DECODE_SIDE, DISAGG_ROLE, LOADING, NOT_DISAGGREGATED, NOW, NUM_FREE_SLOTS
from pagesim.sim.core.state import (BLOCK_SIZE, COMPUTED_SLOTS, DEMAND_SLOTS, LOGICAL_BLOCKS,
                                    NUM_ALLOCATIONS, NUM_EXCHANGE, NUM_FREE_BLOCK_IDS, NUM_FREES,
                                    PREFIX_CACHING, REF, SHARED_BLOCKS, TRANSFER_SLOTS, TRANSFERS)



def disaggregated(config):
    """A disaggregated pool's replica: the runs that may call this file's larger functions
    (``njit``'s lazy: the others never compile them)."""
    return config[DISAGG_ROLE] != NOT_DISAGGREGATED

@njit(inline=True)
def push_exchange(s, i):
    """Request ``i`` is left for the cluster's loop (``Core.exchange``)."""
    s.exchange[s.count[NUM_EXCHANGE]] = i
    s.count[NUM_EXCHANGE] += 1


@njit(lazy=disaggregated)
def hold_for_transfer(s, i: int) -> None:
    """Prefill side: finished request ``i`` keeps its blocks for the decode side to read; those
    it held alone (all of them without prefix caching) leave the token states and their slots
    are in transfer. A block shared with a running request (a prefix hit) stays in use until
    the transfers are its last holders (``kv_cache.release_seq``); one a later prompt hits
    comes back into use (``kv_cache.allocate_cached_blocks``)."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    if s.config[SHARED_BLOCKS]:
        slot = s.seq_slot[i, 0]
        for k in range(s.num_blocks[i]):
            b = s.block_table[slot, k]
            s.block_info[b, TRANSFERS] += 1
            if s.block_info[b, REF] == s.block_info[b, TRANSFERS]:
                kv_cache.remote_kv_only(s, s.num_computed_tokens[i], s.final_len[i], k)
    else:
        c[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
        c[DEMAND_SLOTS] -= min(s.final_len[i], s.num_blocks[i] * bs)
        c[TRANSFER_SLOTS] += s.num_blocks[i] * bs
    s.num_computed_tokens[i] = 0  # no K/V of a request that runs here any more: only held blocks
    push_exchange(s, i)


@njit
def release_transfer(s, i):
    """Prefill side: the transfer of request ``i`` ended (or the decode side refused it): its
    blocks are let go, tail first; one nobody holds any more leaves the in-transfer slots and
    goes, full with prefix caching, to the cache's LRU (cached, as ``kv_cache.release_seq``
    lets a finished request's go), else to the free stack."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    slot = s.seq_slot[i, 0]
    if s.config[SHARED_BLOCKS]:
        for k in range(s.num_blocks[i] - 1, -1, -1):
            b = s.block_table[slot, k]
            s.block_info[b, TRANSFERS] -= 1
            s.block_info[b, REF] -= 1
            if s.block_info[b, REF]:
                continue
            c[TRANSFER_SLOTS] -= bs
            if s.config[PREFIX_CACHING] and (k + 1) * bs <= s.num_prompt_computed[i]:
                prefix_cache.lru_append(s, b)
            else:
                s.free_block_ids[c[NUM_FREE_BLOCK_IDS]] = b
                c[NUM_FREE_BLOCK_IDS] += 1
    else:
        c[TRANSFER_SLOTS] -= s.num_blocks[i] * bs
        return_blocks(s, slot, s.num_blocks[i])
    c[LOGICAL_BLOCKS] -= s.num_blocks[i]
    return_slot(s, slot)
    s.seq_slot[i, 0] = -1
    s.num_blocks[i] = 0
    c[NUM_FREES] += 1


@njit(lazy=disaggregated)
def allocate_for_transfer(s, i: int, num_tokens: int) -> None:
    """Decode side: blocks for request ``i``'s ``num_tokens`` prompt tokens (the caller has
    checked they fit): with prefix caching its local hits first (in use, computed), then fresh
    blocks for the rest, which the connector loads (``count = actual - num_computed_tokens``,
    pull_scheduler.py:62-65): those are in transfer until the load ends. ``num_computed_tokens``
    holds the hits' tokens meanwhile."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    need = (num_tokens + bs - 1) // bs
    if s.config[PREFIX_CACHING]:
        cached = kv_cache.allocate_hits(s, i, num_tokens, need)
        # the fresh blocks' demand: back at the load's end
        c[DEMAND_SLOTS] -= min(s.final_len[i], need * bs) - cached
        c[TRANSFER_SLOTS] += need * bs - cached
        return
    slot = take_slot(s)
    take_blocks(s, slot, 0, need)
    s.seq_slot[i, 0] = slot
    s.num_blocks[i] = need
    s.num_computed_tokens[i] = 0
    c[TRANSFER_SLOTS] += need * bs
    c[LOGICAL_BLOCKS] += need
    c[NUM_ALLOCATIONS] += 1


@njit
def transfer_loaded(s, i, num_tokens):
    """Decode side: request ``i``'s ``num_tokens`` prompt tokens are loaded; the loaded blocks
    are cached (``cache_blocks``, sched/scheduler.py:3498-3501) and all tokens but the last,
    which it recomputes, count as computed (module docstring); its fresh blocks' demand is
    any holder's."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    cached = s.num_computed_tokens[i]
    c[TRANSFER_SLOTS] -= s.num_blocks[i] * bs - cached
    if s.config[PREFIX_CACHING]:
        prefix_cache.register_computed_blocks(s, i, s.seq_slot[i, 0], cached, num_tokens)
    s.num_computed_tokens[i] = num_tokens - 1
    c[COMPUTED_SLOTS] += num_tokens - 1 - cached
    c[DEMAND_SLOTS] += min(s.final_len[i], s.num_blocks[i] * bs) - cached


# vLLM v1's scheduler meets the connector at these points of its waiting loop
# (``scheduler_v1.admit_waiting``)


@njit(inline=True)
def table_row_free(s):
    """Whether an admission finds a block-table row: a disaggregated replica's rows are its
    ``max_num_seqs`` (``sim/core/events/disagg.py``), the others always have one."""
    return not (s.config[DISAGG_ROLE] and s.count[NUM_FREE_SLOTS] == 0)


@njit(inline=True)
def prompt_is_remote(s, i):
    """Whether waiting request ``i``'s prompt KV is the prefill side's to transfer: a decode
    replica's request that was never preempted here (a preempted one is recomputed here:
    ``do_remote_prefill`` cleared, nixl/pull_scheduler.py:187-188)."""
    return s.config[DISAGG_ROLE] == DECODE_SIDE and s.num_preemptions[i] == 0


@njit(inline=True)
def note_admitted(s, i):
    """A disaggregated replica notes when request ``i`` was first admitted (its queueing, where
    the transfer's time is not)."""
    if s.config[DISAGG_ROLE] and math.isnan(s.admitted_s[i]):
        s.admitted_s[i] = s.clock[NOW]


@njit
def admit_remote(s, i, target):
    """A decode replica admits request ``i``, whose prompt the prefill side computed: blocks for
    the whole prompt now (the caller's fit test was any admission's), which the connector loads
    asynchronously while the request waits computing nothing and taking no budget
    (``WAITING_FOR_REMOTE_KVS``: sched/scheduler.py:1514-1541), a prefill in flight meanwhile
    (``host_tier.prefilling``); the cluster's loop prices the transfer
    (``sim/core/events/disagg.py``), at whose end it joins the queue's holding part
    (``lifecycle.hold_waiting``). A request preempted here later is recomputed here: one
    transfer per request (:func:`prompt_is_remote`)."""
    allocate_for_transfer(s, i, target)
    s.status[i] = LOADING
    push_exchange(s, i)
    host_tier.prefilling(s, i, True)
