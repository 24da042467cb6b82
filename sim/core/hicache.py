"""SGLang 0.5.23's hierarchical cache (HiCache: the GPU tier and a host tier, ``--system sglang
--kv-offload-gib N``) over the radix cache's arrays (``radix_cache.py``).

Every rule below is SGLang 0.5.23's, read in ``docs/notes/sglang-hicache.md`` (file:line under
``python/sglang/srt/``) and checked call by call against SGLang's own ``UnifiedRadixCache`` by
``tests/peers/sglang_hicache_side.py``. The default ``--hicache-write-policy write_through``
(threshold 1), L2 only (no storage backend); the host pool is sized in ``build.hicache_host_pages``:

* **A node on two tiers.** Each node has a device copy, a host copy or both (``NODE_EVICTED``,
  ``NODE_ON_HOST``; SGLang's ``evicted`` / ``backuped``, ``unified_cache/unified_tree_core.py:
  162-173``). ``RADIX_TREE_TOKENS`` and ``RADIX_EVICTABLE`` count device tokens only; the host
  pool's pages in use are ``count[HOST_USED]`` of ``config[HICACHE_HOST_PAGES]``.
* **Write-through** (:func:`insert`): an insert writes every node it walks past the request's
  already inserted tokens that is on the device and not on the host, and the new leaf
  (``_finish_insert_walk_node``, ``unified_tree_core.py:1368-1381``; ``_inc_hit_count_and_check``,
  ``:1104-1123``, threshold 1 for ``write_through``, ``unified_radix_cache.py:558-560``;
  ``_should_backup_after_insert``, ``:1430-1447``). A walked host-only node gets its device copy
  back from the request's own KV, no transfer (``_unevict_node_on_insert``, ``:1564-1590``).
* **A write** (:func:`write`): the node's ancestors not on the host first, from the top
  (``_build_backup_kv_action``, ``unified_tree_core.py:2622-2644``), each taking its host pages at
  once, evicting host leaves first where short; one that still does not fit is dropped, the node
  staying device-only, and so is the rest of the chain (``_execute_kv_backup``,
  ``unified_radix_cache.py:1681-1716, 1738-1762``); a written node is backed up at once
  (``commit_backup``) and locked on the device until the copy is acknowledged
  (``inc_lock_ref``, ``:1707-1708``; ``_finish_write_through_ack``, ``:1803-1818``). The copy goes
  GPU -> host on the store link, after the copies before it; no step waits for it.
* **Device eviction** (:func:`evict_device`): the least recently used device leaf (on the device,
  unlocked, no child on the device: host-only children do not count, ``_is_device_leaf``,
  ``unified_tree_core.py:2348-2364``); a backed-up one is demoted (device tokens freed, the node
  stays host-only, ``_demote``, ``:2090-2123``), an unbacked one deleted
  (``_delete_unbacked_device_leaf``, ``:1903-1929``; ``evict_device_leaf``, ``:1788-1823``).
* **Host eviction** (:func:`evict_host`): the least recently used host leaf (host-only, unlocked,
  no children, ``_is_host_leaf``, ``:2366-2387``) is deleted (``_evict_host_leaf``, ``:2046-2075``).
* **A match** walks host-only nodes too (``_match_prefix_helper``, ``:906-984``), splitting them
  as any: the radix cache's own walk. The device part is a prefix of the path (a host-only node's
  descendants are host-only: device eviction goes leaf first), so the last device node is the
  deepest node of the path on the device (:func:`device_node`) and the host hit the rest
  (``host_hit_length``, ``components/full.py:123-145``).
* **A load back** (:func:`load_back`) of a host hit of at least ``LOAD_BACK_THRESHOLD`` tokens
  (else nothing is loaded and the request recomputes them: ``unified_radix_cache.py:1879-1886``):
  device slots taken, evicting where short (``:1901-1908``), the nodes on the device at once and
  locked until the load is acknowledged (``commit_load_back``, ``ongoing_load_back``,
  ``:1917-1935``). The batch's loads are one copy on the load link from the step's start, layer
  by layer, each attention layer waiting for its own layer (``mem_cache/l2_transfer.py:145-183``,
  ``memory_pool.py:2852-2858``, ``managers/cache_controller.py:83-110``): :func:`step_price`.
* **Acknowledgements** (:func:`acknowledge`): each scheduling iteration unlocks the nodes whose
  copy has ended by then, in submission order (``check_hicache_events``, ``scheduler.py:
  3880-3890``; ``writing_check`` / ``loading_check``, ``unified_radix_cache.py:3472-3583``).

Not modelled: ``write_through_selective`` and ``write_back``, L3 storage, the host lock of a load
in flight (``host_lock_ref``: a node being loaded is on the device, never a host leaf), the
merging of a step's writes into one acknowledgement (each node is acknowledged at its own copy's
end), the TP ranks' MIN-reduction of acknowledgements.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import radix_cache
from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, HICACHE_CHAIN, HICACHE_HOST_PAGES, HICACHE_LAYERS, HICACHE_PATH,
                                    HICACHE_PENDING, HICACHE_PENDING_NODE, HOST_BLOCK_S, HOST_EVICTIONS,
                                    HOST_LOADED_BLOCKS, HOST_STORED_BLOCKS, HOST_USED, INSERTED_LEN,
                                    LOAD_LINK_FREE_S, NODE_END, NODE_EVICTED, NODE_FIRST_CHILD, NODE_LAST_ACCESS,
                                    NODE_LOCK_REF, NODE_NEXT_SIBLING, NODE_ON_HOST, NODE_PARENT, NOW, NUM_EVICTIONS,
                                    RADIX_EVICTABLE, RADIX_NODES_USED, RADIX_TREE_TOKENS, STEP_LOAD_TOKENS,
                                    STORE_LINK_FREE_S)

ROOT = radix_cache.ROOT
FREE_NODE = radix_cache.FREE_NODE
#: ``load_back_threshold`` (unified_radix_cache.py:576): a host hit of fewer tokens is recomputed
LOAD_BACK_THRESHOLD = 10


@njit(inline=True)
def pages(s, num_tokens):
    return num_tokens // s.config[BLOCK_SIZE]


@njit(inline=True)
def host_free(s):
    """The host pool's free pages (``HostKVCache.available_size``, pool_host/base.py:520)."""
    return s.config[HICACHE_HOST_PAGES] - s.count[HOST_USED]


# -- the path ------------------------------------------------------------------------------------
@njit
def device_node(s, x):
    """The deepest node on the path from the root to ``x`` that is on the device (SGLang's
    ``last_device_node``): the device part of a path is a prefix of it."""
    nodes = s.radix_nodes
    while x != ROOT and nodes[x, NODE_EVICTED]:
        x = nodes[x, NODE_PARENT]
    return x


@njit(inline=True)
def depth(s, x):
    """The tokens from the root to the end of node ``x``."""
    return 0 if x == ROOT else s.radix_nodes[x, NODE_END]


@njit
def restore(s, x):
    """Host-only node ``x`` is on the device again (a load, or an insert's own KV): its tokens
    count in the tree's device tokens, evictable where nobody locks it (``_unevict_node_on_insert``,
    unified_tree_core.py:1574-1580)."""
    n = radix_cache.length(s, x)
    s.radix_nodes[x, NODE_EVICTED] = 0
    s.count[RADIX_TREE_TOKENS] += n
    if s.radix_nodes[x, NODE_LOCK_REF] == 0:
        s.count[RADIX_EVICTABLE] += n


# -- acknowledgements ----------------------------------------------------------------------------
@njit
def pend(s, x, end_s):
    """Node ``x`` stays locked until its copy ends at ``end_s`` (:func:`acknowledge`)."""
    c = s.count
    s.host_ready_s[x] = end_s
    s.host_work[HICACHE_PENDING_NODE, c[HICACHE_PENDING]] = x
    c[HICACHE_PENDING] += 1


@njit
def acknowledge(s):
    """``check_hicache_events``' ``writing_check`` and ``loading_check`` (unified_radix_cache.py:
    3472-3583): every node whose copy has ended by now is unlocked (its write's or its load's
    lock), in submission order; the others stay pending, in order."""
    c, now = s.count, s.clock[NOW]
    row = s.host_work[HICACHE_PENDING_NODE]
    kept = 0
    for k in range(c[HICACHE_PENDING]):
        x = row[k]
        if s.host_ready_s[x] <= now:
            radix_cache.dec_lock_ref(s, x)
        else:
            row[kept] = x
            kept += 1
    c[HICACHE_PENDING] = kept


@njit
def next_end(s):
    """When the first pending copy ends (an idle engine wakes then to acknowledge it)."""
    end = np.inf
    for k in range(s.count[HICACHE_PENDING]):
        end = min(end, s.host_ready_s[s.host_work[HICACHE_PENDING_NODE, k]])
    return end


# -- the host pool -------------------------------------------------------------------------------
@njit(inline=True)
def is_host_leaf(s, x):
    """``_is_host_leaf`` (unified_tree_core.py:2366-2387): host-only, unlocked, no children."""
    nodes = s.radix_nodes
    return (nodes[x, NODE_PARENT] != FREE_NODE and nodes[x, NODE_EVICTED] == 1 and nodes[x, NODE_ON_HOST] == 1
            and nodes[x, NODE_LOCK_REF] == 0 and nodes[x, NODE_FIRST_CHILD] < 0)


@njit
def evict_host(s, num_pages):
    """``evict_host`` -> ``drive_host_eviction`` (unified_tree_core.py:1931-1958,
    components/full.py:250-280): delete host leaves, least recently used first (ties: the lower
    node row), until ``num_pages`` host pages are freed or none is left; a parent left a host leaf
    is a candidate in turn. Returns the pages freed."""
    nodes = s.radix_nodes
    freed = 0
    while freed < num_pages:
        victim = -1
        for x in range(1, s.count[RADIX_NODES_USED]):
            if is_host_leaf(s, x) and (victim < 0 or nodes[x, NODE_LAST_ACCESS] < nodes[victim, NODE_LAST_ACCESS]):
                victim = x
        if victim < 0:
            break
        n = pages(s, radix_cache.length(s, victim))
        freed += n
        s.count[HOST_USED] -= n
        s.count[HOST_EVICTIONS] += n
        nodes[victim, NODE_ON_HOST] = 0
        radix_cache.delete_node(s, victim)
    return freed


@njit
def write(s, x):
    """Write node ``x`` (on the device, not on the host) through to the host, its ancestors not on
    the host first, from the top, stopping at the first that does not fit
    (``_build_backup_kv_action``, unified_tree_core.py:2622-2644; ``_execute_and_commit_kv_backup``,
    unified_radix_cache.py:1681-1716): a backed-up node's ancestors are backed up."""
    nodes = s.radix_nodes
    chain = s.host_work[HICACHE_CHAIN]
    k = 0
    while x != ROOT and not nodes[x, NODE_ON_HOST]:
        chain[k] = x
        k += 1
        x = nodes[x, NODE_PARENT]
    for j in range(k - 1, -1, -1):
        if not write_one(s, chain[j]):
            return


@njit
def write_one(s, x):
    """One node's write (``_execute_kv_backup``, unified_radix_cache.py:1738-1762): its host pages,
    evicting host leaves where short (one that still does not fit is dropped: False, the node
    staying device-only); backed up at once (``commit_backup``) and locked on the device until its
    copy on the store link ends (``inc_lock_ref``, :1707-1708; ``_finish_write_through_ack``,
    :1803-1818). Returns whether it was written."""
    c, clock = s.count, s.clock
    n = pages(s, radix_cache.length(s, x))
    if host_free(s) < n:
        evict_host(s, n - host_free(s))
        if host_free(s) < n:
            return False
    c[HOST_USED] += n
    c[HOST_STORED_BLOCKS] += n
    s.radix_nodes[x, NODE_ON_HOST] = 1
    radix_cache.inc_lock_ref(s, x)
    # one direction of the host link, in submission order (flush_pending_backups after the batch's
    # results, on the D2H stream behind the forward: scheduler.py:5105-5106, cache_controller.py:885-920)
    end = max(clock[NOW], clock[STORE_LINK_FREE_S]) + n * clock[HOST_BLOCK_S]
    clock[STORE_LINK_FREE_S] = end
    pend(s, x, end)
    return True


# -- the tree's calls ----------------------------------------------------------------------------
@njit
def insert(s, r, num_tokens):
    """``insert`` of request ``r``'s first ``num_tokens`` tokens with write-through (module
    docstring): the radix cache's walk (it splits as SGLang's does), then, from the root down,
    each walked node restored to the device where host-only and written where past the request's
    inserted tokens and not on the host; then the new leaf, written too. Returns (the node they end
    at, how many of them the tree held already, on either tier)."""
    nodes, c = s.radix_nodes, s.count
    node, held = radix_cache.walk(s, r, num_tokens)
    path = s.host_work[HICACHE_PATH]
    k = 0
    x = node
    while x != ROOT:
        path[k] = x
        k += 1
        x = nodes[x, NODE_PARENT]
    inserted = s.radix_request[r, INSERTED_LEN]
    node, reached = ROOT, 0
    for j in range(k - 1, -1, -1):
        x = path[j]
        if nodes[x, NODE_PARENT] == FREE_NODE:  # a write above evicted it from the host (a host leaf)
            break
        if nodes[x, NODE_EVICTED]:
            restore(s, x)
        if nodes[x, NODE_END] > inserted and not nodes[x, NODE_ON_HOST]:
            write(s, x)
        node, reached = x, nodes[x, NODE_END]
    if reached < num_tokens:
        leaf = radix_cache.new_node(s, node, reached, num_tokens, r, np.int64(0))
        c[RADIX_TREE_TOKENS] += num_tokens - reached
        c[RADIX_EVICTABLE] += num_tokens - reached
        if num_tokens > inserted:
            write(s, leaf)
        node = leaf
    s.radix_request[r, INSERTED_LEN] = max(inserted, num_tokens)
    return node, min(held, reached)


@njit
def is_device_leaf(s, x):
    """``_is_device_leaf`` (unified_tree_core.py:2348-2364): on the device, unlocked, and no child
    on the device (host-only children do not count)."""
    nodes = s.radix_nodes
    if nodes[x, NODE_PARENT] == FREE_NODE or nodes[x, NODE_EVICTED] or nodes[x, NODE_LOCK_REF]:
        return False
    child = nodes[x, NODE_FIRST_CHILD]
    while child >= 0:
        if not nodes[child, NODE_EVICTED]:
            return False
        child = nodes[child, NODE_NEXT_SIBLING]
    return True


@njit
def evict_device(s, num_tokens):
    """``evict`` with a host tier (``evict_device_leaf``, unified_tree_core.py:1788-1823): free
    at least ``num_tokens`` device tokens, least recently used device leaf first (ties: the lower
    row); a backed-up leaf is demoted to the host, an unbacked one deleted. Returns the tokens freed."""
    c, nodes = s.count, s.radix_nodes
    freed = 0
    while freed < num_tokens:
        victim = -1
        for x in range(1, c[RADIX_NODES_USED]):
            if is_device_leaf(s, x) and (victim < 0 or nodes[x, NODE_LAST_ACCESS] < nodes[victim, NODE_LAST_ACCESS]):
                victim = x
        if victim < 0:
            break
        n = radix_cache.length(s, victim)
        freed += n
        c[RADIX_TREE_TOKENS] -= n
        c[RADIX_EVICTABLE] -= n
        c[NUM_EVICTIONS] += 1
        if nodes[victim, NODE_ON_HOST]:
            nodes[victim, NODE_EVICTED] = 1  # _demote: the node stays, host-only
        else:  # (its children are device-only too: a backed-up node's ancestors are backed up, write)
            radix_cache.delete_node(s, victim)
    return freed


@njit
def load_back(s, device, best):
    """``init_load_back`` -> ``load_back`` (unified_radix_cache.py:3586-3643, 1820-1937) of the host
    hit from ``device`` (the last device node, locked by the admission) down to ``best``: under
    ``LOAD_BACK_THRESHOLD`` tokens, or where the device cannot hold them even after evicting,
    nothing (0); else the nodes are on the device at once, their load queued on the load link, and
    ``best`` locked until it ends. Returns the tokens loaded."""
    nodes, c, clock = s.radix_nodes, s.count, s.clock
    tokens = depth(s, best) - depth(s, device)
    if tokens < LOAD_BACK_THRESHOLD:
        return 0
    radix_cache.make_room(s, tokens)  # evict_for_alloc (:1901-1908): the hit's path is locked or host-only
    if radix_cache.available(s) < tokens:
        return 0
    x = best
    while x != device:
        restore(s, x)
        x = nodes[x, NODE_PARENT]
    radix_cache.inc_lock_ref(s, best)
    n = pages(s, tokens)
    c[HOST_LOADED_BLOCKS] += n
    c[STEP_LOAD_TOKENS] += tokens
    # the batch's loads: one copy from the step's start (ready_to_load_host_cache, scheduler.py:4350-4355)
    end = max(clock[NOW], clock[LOAD_LINK_FREE_S]) + n * clock[HOST_BLOCK_S]
    clock[LOAD_LINK_FREE_S] = end
    pend(s, best, end)
    return tokens


@njit
def step_price(s, forward_s):
    """A step that loads host KV back: its layers' loads overlap the forward, layer l's attention
    waiting for layer l's load (module docstring), so the step ends once the whole load has landed
    and its last layer has run: max(forward, load + forward / layers), the load counted from the
    step's start (after the load link's earlier copies)."""
    load_s = s.clock[LOAD_LINK_FREE_S] - s.clock[NOW]
    return max(forward_s, load_s + forward_s / s.config[HICACHE_LAYERS])
