"""The blocks of a KV transfer between a prefill and a decode replica (disaggregated serving,
``sim/core/disagg.py``), on both sides, as vLLM 0.33.0's NIXL connector holds them (pull mode,
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

``count[TRANSFER_SLOTS]``: the slots of every block held by an in-flight transfer, a memory
category of its own (``kv_cache.memory_categories``), so the categories still sum to the
capacity on both sides. Blocks are private here (prefix caching is not offered with
disaggregation yet), so each block is counted once by its one holder.
"""

from __future__ import annotations

from pagesim.sim.core.block_pool import return_blocks, return_slot, take_blocks, take_slot
from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, COMPUTED_SLOTS, DEMAND_SLOTS, LOGICAL_BLOCKS, NUM_ALLOCATIONS,
                                    NUM_EXCHANGE, NUM_FREES, TRANSFER_SLOTS)


@njit(inline=True)
def push_exchange(s, i):
    """Request ``i`` is left for the cluster's loop (``Core.exchange``)."""
    s.exchange[s.count[NUM_EXCHANGE]] = i
    s.count[NUM_EXCHANGE] += 1


@njit(inline=True)
def hold_for_transfer(s, i):
    """Prefill side: finished request ``i`` keeps its blocks for the decode side to read; its
    tokens and demand leave their categories and its blocks' slots are in transfer."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    c[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
    c[DEMAND_SLOTS] -= min(s.final_len[i], s.num_blocks[i] * bs)
    c[TRANSFER_SLOTS] += s.num_blocks[i] * bs
    s.num_computed_tokens[i] = 0  # no K/V of a request that runs here any more: only held blocks
    push_exchange(s, i)


@njit
def release_transfer(s, i):
    """Prefill side: the transfer of request ``i`` ended (or the decode side refused it): its
    blocks go back to the free stack."""
    c = s.count
    c[TRANSFER_SLOTS] -= s.num_blocks[i] * s.config[BLOCK_SIZE]
    c[LOGICAL_BLOCKS] -= s.num_blocks[i]
    return_blocks(s, s.seq_slot[i, 0], s.num_blocks[i])
    return_slot(s, s.seq_slot[i, 0])
    s.seq_slot[i, 0] = -1
    s.num_blocks[i] = 0
    c[NUM_FREES] += 1


@njit(inline=True)
def allocate_for_transfer(s, i, num_tokens):
    """Decode side: blocks for request ``i``'s ``num_tokens`` prompt tokens, to be loaded (the
    caller has checked they fit): all in transfer until the load ends."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    need = (num_tokens + bs - 1) // bs
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
    """Decode side: request ``i``'s ``num_tokens`` prompt tokens are loaded; all but the last,
    which it recomputes, count as computed (module docstring), and its blocks' demand as any
    holder's."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    c[TRANSFER_SLOTS] -= s.num_blocks[i] * bs
    s.num_computed_tokens[i] = num_tokens - 1
    c[COMPUTED_SLOTS] += num_tokens - 1
    c[DEMAND_SLOTS] += min(s.final_len[i], s.num_blocks[i] * bs)
