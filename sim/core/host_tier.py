"""vLLM v1's CPU offload tier (``--kv-offload-gib N``, vllm-v1 with prefix caching) over the
core's arrays, as vLLM 0.33.0's native offloading runs it; file:line below are of that release.

**Which path.** ``kv_offloading_size`` (config/cache.py:383-392) with the default backend
``native`` becomes the ``OffloadingConnector`` with ``cpu_bytes_to_use = N GiB``
(config/vllm.py:1157-1175; ``SimpleCPUOffloadConnector`` only under ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``,
envs.py:2241, off by default). Its scheduler side is
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py`` (below: scheduler.py), its CPU
manager ``v1/kv_offload/cpu/manager.py`` with the ``lru`` policy (cpu/spec.py:142, the default;
cpu/policies/lru.py).

**The tier.** ``N GiB // (KV bytes of a block)`` host blocks (cpu/spec.py:111-123: one GPU block
per chunk, ``blocks_per_chunk`` 1 by default, offloading/config.py:121), each named by the key
that names the GPU block (its prefix's block hash: scheduler.py:412-429), in a map of their own
(``Core.host_entries``, ``prefix_cache``'s open addressing) and an LRU list (``Core.host_blocks``).

**What is stored, and when** (``_build_store_jobs``, scheduler.py:1815-2101): each step, every
scheduled request offers the prompt blocks its step fills (``num_computed + scheduled`` tokens,
cut to the prompt: ``offload_prompt_only`` is True by default, kv_offload/base.py:725-731,
scheduler.py:762-771), from where its offers stopped; an admission starts them at its first block
(scheduler.py:1241-1244), GPU prefix hits included, and past its host hits when it loads
(``CHUNK_LEVEL``, scheduler.py:1468-1472). A block the tier holds is only touched; a new one takes
a free host block or evicts the LRU head (``prepare_store``, cpu/manager.py:262-360). Its bytes go
GPU -> host on the link's store direction, in submission order (``SingleDirectionOffloadingHandler``,
cpu/gpu_worker.py:284-289, one handler per direction :872-875): a lookup finds it once they are
there (a chunk is not ready before ``complete_store``, cpu/manager.py:197-205, 362-380).

**A hit.** At admission, past the GPU prefix cache's hits, the consecutive blocks the tier holds
ready extend the prefix (``_maximal_prefix_lookup``, scheduler.py:773-803), within the GPU's limit
of ``prompt - 1`` tokens (see "not modelled"). The request's GPU blocks for the whole hit are taken
(``allocate_slots`` with the external tokens, scheduler (v1/core/sched) scheduler.py:1425-1441;
the whole sequence must fit, as any admission, and the hit's blocks leave free those the prefills
in flight still need: ``reserved_blocks``), the hit's tokens count as computed
(scheduler.py:1514-1537), and it waits, holding them, while they load (``WAITING_FOR_REMOTE_KVS``:
the load is asynchronous, ``sync_load_budget_bytes`` 0 by default, offloading
scheduler.py:1279-1302), in the waiting queue's holding part, ahead of the rest
(``lifecycle.hold_waiting``: the rule every connector's loads share): its bytes go host -> GPU from
the step's start (``start_kv_transfers``, worker.py) on the load direction, in order. The first
scheduling pass at or after their end admits it before any request without blocks
(``_handle_blocked_waiting_request``, v1 scheduler.py:3519-3535), caching the loaded blocks
(``_update_waiting_for_remote_kv``: ``cache_blocks``, :3467-3517); no step waits for a load (they
overlap compute), so the time shows in its TTFT, not in a step's price.

**LRU order** (cpu/policies/lru.py): a block stored or loaded goes to the most recent end; when a
request finishes its blocks in the tier are touched from its deepest to its first, so its first
block is the most recent (``on_request_finished``, lru.py:157-166, ``order_request_keys``,
policies/base.py:8-20; cpu/manager.py:430-452).

**Not modelled** (approximations, each small against a store or load of many blocks): vLLM ranks a
running request's blocks by when the request first touched the tier (lru.py:136-155), here by when
each block is touched; a block being stored or loaded is not pinned against eviction
(cpu/manager.py:225-236); a block whose store has not landed ends the hit where vLLM defers the
request a step (``HIT_PENDING``, scheduler.py:786-802); a store counts from the step that computes
it where vLLM submits it at the next step's start (worker.py ``prepare_store_kv``); a full-prompt
host hit stops one block short as a GPU hit does, where vLLM loads it and recomputes the last token
(scheduler.py:3510-3512).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import prefix_cache
from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, COMPUTED_SLOTS, HOST_BLOCK_S, HOST_BLOCKS, HOST_EVICTIONS,
                                    HOST_HIT_TOKENS, HOST_KEY_CHAIN, HOST_KEY_END, HOST_KEY_SLOT, HOST_LOADED_BLOCKS,
                                    HOST_LRU_HEAD, HOST_LRU_TAIL, HOST_NEXT, HOST_PREV, HOST_STORED_BLOCKS,
                                    HOST_TABLE_MASK, HOST_USED, LOAD_LINK_FREE_S, NOW, NUM_LOADING,
                                    OFFLOAD_GPU_HITS, OFFLOAD_LOADING, OFFLOAD_OFFERED, STORE_LINK_FREE_S,
                                    WAITING_HEAD)
from pagesim.sim.core.state import FINISHED, KV_HOLDING_WAITING, NUM_RUNNING, STEP_NUM_FINISHED


@njit(inline=True)
def find(s, i, k):
    """The host block holding request ``i``'s block ``k`` (its GPU key), or -1."""
    return prefix_cache.map_lookup(s.host_entries, s.config[HOST_TABLE_MASK], (k + 1) * s.config[BLOCK_SIZE],
                                   prefix_cache.key_chain(s, i, k))


# -- the LRU list, oldest first ----------------------------------------------------------------
@njit(inline=True)
def lru_append(s, b):
    c = s.count
    s.host_blocks[b, HOST_PREV] = c[HOST_LRU_TAIL]
    s.host_blocks[b, HOST_NEXT] = -1
    if c[HOST_LRU_TAIL] >= 0:
        s.host_blocks[c[HOST_LRU_TAIL], HOST_NEXT] = b
    else:
        c[HOST_LRU_HEAD] = b
    c[HOST_LRU_TAIL] = b


@njit(inline=True)
def lru_remove(s, b):
    c = s.count
    p, n = s.host_blocks[b, HOST_PREV], s.host_blocks[b, HOST_NEXT]
    if p >= 0:
        s.host_blocks[p, HOST_NEXT] = n
    else:
        c[HOST_LRU_HEAD] = n
    if n >= 0:
        s.host_blocks[n, HOST_PREV] = p
    else:
        c[HOST_LRU_TAIL] = p


@njit(inline=True)
def touch(s, b):
    """Host block ``b`` becomes the most recently used."""
    if s.count[HOST_LRU_TAIL] != b:
        lru_remove(s, b)
        lru_append(s, b)


@njit
def count_hits(s, i, first, limit):
    """Request ``i``'s consecutive blocks from ``first`` (its GPU hits) below ``limit`` that the
    tier holds, their stores landed."""
    k = first
    while k < limit:
        b = find(s, i, k)
        if b < 0 or s.host_ready_s[b] > s.clock[NOW]:
            break
        k += 1
    return k - first


@njit
def start_load(s, i, gpu_hits, host_hits):
    """Request ``i`` was given GPU blocks for ``gpu_hits + host_hits`` blocks, the GPU's hits
    holding theirs: the host hits' tokens count as computed into its blocks, their bytes load
    from now, queued on the load direction, and it waits for them (module docstring)."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    for k in range(gpu_hits + host_hits - 1, gpu_hits - 1, -1):  # the first block the most recent
        touch(s, find(s, i, k))
    s.num_computed_tokens[i] += host_hits * bs
    c[COMPUTED_SLOTS] += host_hits * bs
    start = max(s.clock[NOW], s.clock[LOAD_LINK_FREE_S])
    s.clock[LOAD_LINK_FREE_S] = start + host_hits * s.clock[HOST_BLOCK_S]
    s.load_ready_s[i] = s.clock[LOAD_LINK_FREE_S]
    s.offload[i, OFFLOAD_LOADING] = host_hits
    s.offload[i, OFFLOAD_GPU_HITS] = gpu_hits
    s.offload[i, OFFLOAD_OFFERED] = gpu_hits + host_hits
    c[NUM_LOADING] += 1
    c[HOST_HIT_TOKENS] += host_hits * bs
    c[HOST_LOADED_BLOCKS] += host_hits


@njit
def end_load(s, i):
    """Request ``i``'s load is over and it is admitted: the loaded blocks join the GPU prefix
    cache (``cache_blocks``); returns the tokens it holds computed."""
    bs = s.config[BLOCK_SIZE]
    first = s.offload[i, OFFLOAD_GPU_HITS]
    prefix_cache.register_full_blocks(s, i, s.seq_slot[i, 0], first * bs,
                                      (first + s.offload[i, OFFLOAD_LOADING]) * bs)
    s.offload[i, OFFLOAD_LOADING] = 0
    s.count[NUM_LOADING] -= 1
    return s.num_computed_tokens[i]


@njit
def offer(s, i):
    """Request ``i``'s prompt blocks its computed tokens fill, from where its offers stopped, go
    to the tier (``_build_store_jobs``, ``prepare_store``): one held is touched, a new one takes a
    free host block or the LRU head's, its bytes queued on the store direction."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    end = min(s.num_computed_tokens[i], s.prompt_tokens[i]) // bs
    for k in range(s.offload[i, OFFLOAD_OFFERED], end):
        b = find(s, i, k)
        if b >= 0:
            touch(s, b)
            continue
        if c[HOST_USED] < s.config[HOST_BLOCKS]:
            b = c[HOST_USED]  # the next fresh host block (cpu/manager.py:95-112)
            c[HOST_USED] += 1
        else:  # the least recently used, its key dropped
            b = c[HOST_LRU_HEAD]
            lru_remove(s, b)
            prefix_cache.map_delete(s.host_entries, s.config[HOST_TABLE_MASK], s.host_blocks[b, HOST_KEY_SLOT],
                                    s.host_blocks, HOST_KEY_SLOT)
            c[HOST_EVICTIONS] += 1
        end_token, chain = (k + 1) * bs, prefix_cache.key_chain(s, i, k)
        s.host_blocks[b, HOST_KEY_SLOT] = prefix_cache.map_insert(s.host_entries, s.config[HOST_TABLE_MASK], b,
                                                                  end_token, chain)
        s.host_blocks[b, HOST_KEY_END] = end_token
        s.host_blocks[b, HOST_KEY_CHAIN] = chain
        lru_append(s, b)
        s.clock[STORE_LINK_FREE_S] = max(s.clock[NOW], s.clock[STORE_LINK_FREE_S]) + s.clock[HOST_BLOCK_S]
        s.host_ready_s[b] = s.clock[STORE_LINK_FREE_S]
        c[HOST_STORED_BLOCKS] += 1
    s.offload[i, OFFLOAD_OFFERED] = max(end, s.offload[i, OFFLOAD_OFFERED])


@njit(inline=True)
def admitted(s, i):
    """Request ``i`` is admitted: its offers start again from its first block, its GPU hits'
    included (scheduler.py:1241-1244); a load (:func:`start_load`) moves them past its hits."""
    s.offload[i, OFFLOAD_OFFERED] = 0
    s.offload[i, OFFLOAD_GPU_HITS] = 0


@njit
def finished(s, i):
    """Request ``i`` finished: the keys it offered or loaded are touched, its deepest first (its
    first the most recent: ``on_request_finished``, cpu/manager.py:163-189, 422-452); a request
    admitted with a load offered none of its GPU hits (offloading/scheduler.py:1471-1472), so
    those are not touched."""
    for k in range(s.offload[i, OFFLOAD_OFFERED] - 1, s.offload[i, OFFLOAD_GPU_HITS] - 1, -1):
        b = find(s, i, k)
        if b >= 0:
            touch(s, b)
    s.offload[i, OFFLOAD_OFFERED] = 0


@njit
def touch_finished(s):
    """The requests the last completed step finished touch their keys (:func:`finished`), after
    this scheduling pass's stores: vLLM signals them in the next ``build_connector_meta``, once its
    store jobs are prepared (offloading/scheduler.py:2167-2184). Once each: it clears the offers."""
    for k in range(s.count[STEP_NUM_FINISHED]):
        i = s.step_finished[k]
        if s.status[i] == FINISHED and s.offload[i, OFFLOAD_OFFERED]:
            finished(s, i)


@njit
def next_load_end(s):
    """When the first load in flight past now ends (inf: none), of the waiting requests' (in the
    waiting queue's holding part: ``lifecycle.hold_waiting``)."""
    c = s.count
    first = np.inf
    for p in range(c[KV_HOLDING_WAITING]):
        i = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        if s.offload[i, OFFLOAD_LOADING] and s.clock[NOW] < s.load_ready_s[i] < first:
            first = s.load_ready_s[i]
    return first


@njit
def being_loaded(s, i, gpu_hits, host_hits):
    """Whether a block of request ``i``'s host hits (past its ``gpu_hits``) is being loaded for
    another request: vLLM then delays it, and the requests behind it may be admitted
    (``_chunks_being_loaded``, offloading/scheduler.py:1020-1045; the lookup's None,
    v1 scheduler.py:1146-1151: ``skip_request``)."""
    c = s.count
    for p in range(c[KV_HOLDING_WAITING]):
        j = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        if not s.offload[j, OFFLOAD_LOADING] or s.load_ready_s[j] <= s.clock[NOW]:
            continue
        first = s.offload[j, OFFLOAD_GPU_HITS]
        for k in range(max(gpu_hits, first), min(gpu_hits + host_hits, first + s.offload[j, OFFLOAD_LOADING])):
            if prefix_cache.key_chain(s, j, k) == prefix_cache.key_chain(s, i, k):  # the same key: the same end
                return True
    return False


@njit
def reserved_blocks(s):
    """The blocks the prefills in flight still need for their whole sequence, which an admission
    that loads must leave free (``_inflight_prefill_reserved_blocks``, v1 scheduler.py:3432-3436,
    :1420-1430): the running requests whose prompt is not all scheduled (:1590-1593, dropped once
    it is, :1862-1871) and the requests loading (:1542), each the blocks its ``num_tokens`` lack
    (``_request_remaining_blocks``, :3404-3420)."""
    c = s.count
    need = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.num_prompt_computed[i] < s.prompt_target[i]:
            need += remaining_blocks(s, i)
    for p in range(c[KV_HOLDING_WAITING]):
        i = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        if s.offload[i, OFFLOAD_LOADING]:
            need += remaining_blocks(s, i)
    return need


@njit(inline=True)
def remaining_blocks(s, i):
    """The blocks request ``i`` lacks for its ``prompt_target`` tokens (a prefill's whole sequence)."""
    return max((s.prompt_target[i] + s.config[BLOCK_SIZE] - 1) // s.config[BLOCK_SIZE] - s.num_blocks[i], 0)
