"""SGLang's RadixAttention prefix cache (``--system sglang``) over the core's arrays.

As of the SGLang sources read for this (sgl-project/sglang, ``python/sglang/srt/mem_cache/radix_cache.py``,
the v0.5 line): a radix tree whose edges are runs of tokens. A request's tokens are matched from
the root (``match_prefix``: a partly matched node is split, ``_split_node``; every node on the
path gets a fresh last-access time); a request locks the node its prefix ends at, and so every
node up to the root (``inc_lock_ref`` / ``dec_lock_ref``: a node with ``lock_ref > 0`` is
protected, else evictable); a finished request's tokens are inserted (``cache_finished_req``:
its tokens already in the tree are freed, the new ones become a leaf, its lock is dropped); a
request whose prefill is chunked inserts what it has computed before its next chunk
(``cache_unfinished_req``: it then locks the new node instead of the old); both insert as SGLang
0.5.23's ``checkpoint`` does, splitting the node at the prompt's end where the tokens go past it; ``evict`` frees the
least recently accessed unlocked leaves first, a parent becoming an unlocked leaf joining them.
With ``page_size`` > 1 matches and insertions are whole pages (``RadixKey`` page alignment: the
unaligned tail of a finished request is freed, not cached).

What the trace can tell: a trace names prompt tokens only by ``prefix_hashes``, one chain hash per
``hash_block_tokens`` tokens (Mooncake: 512). Token ``t`` of request ``r`` is named by ``r``'s chain
hash of hash block ``t // H`` (so two requests agree on a token when they agree on the chain of its
block: the whole prefix up to it), for ``t`` below ``min(prompt, hashes * H)``; every other token
(beyond the hashes, and every generated token) is ``r``'s own. A node stores no tokens, only whose
tokens it holds (``NODE_OWNER``) and at which depths: matching compares chain hashes block by
block. So the tree is at token granularity, but two requests diverge only at a hash-block boundary
or where one's named tokens end: the trace's 512-token granularity, not SGLang's single token.

The pool is counted in tokens, page by page, not slot by slot (nothing outside the core reads a
sglang run's slots): the tree's tokens (``RADIX_TREE_TOKENS``, of which ``RADIX_EVICTABLE`` are
unlocked) and each running request's pages outside the tree (``num_blocks``: its tokens past its
prefix, ``ceil((computed - prefix) / page_size)``). Available = capacity - tree - private pages;
an allocation evicts when it is short.

Nodes are rows of ``radix_nodes`` (first child / next sibling lists); their number is bounded by
the pool's pages (every node but the root holds at least a page), so nothing is allocated.

With a host tier (``--kv-offload-gib``: SGLang's HiCache, ``sim/core/hicache.py``) a node may also
be on the host, or on the host alone: ``checkpoint`` and ``evict`` hand over to that module (under
``config[HICACHE_HOST_PAGES]``), and the walk goes through host-only nodes as through any.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, HASH_BLOCK_TOKENS, HICACHE_HOST_PAGES, INSERTED_LEN, LEFTOVER_SLOTS,
                                    LOCKED_NODE, NODE_END, NODE_EVICTED, NODE_FIRST_CHILD, NODE_LAST_ACCESS,
                                    NODE_LOCK_REF, NODE_NEXT_SIBLING, NODE_ON_HOST, NODE_OWNER, NODE_PARENT,
                                    NODE_PREV_SIBLING, NODE_START, NUM_BLOCKS, NUM_EVICTIONS, NUM_RUNNING, OWNED_NODES,
                                    PREFIX_LEN, RADIX_ACCESS_CLOCK, RADIX_EVICTABLE, RADIX_FREE_NODE,
                                    RADIX_NODES_USED, RADIX_PRIVATE_PAGES, RADIX_TREE_TOKENS)

ROOT = 0
FREE_NODE = -2  # NODE_PARENT of a node on the free list


# -- what the trace names ---------------------------------------------------------------------
@njit(inline=True)
def named_tokens(s, r):
    """Request ``r``'s leading tokens that its prefix hashes name (the rest are its own)."""
    num_hashes = s.chain_start[r + 1] - s.chain_start[r]
    return min(s.prompt_tokens[r], num_hashes * s.config[HASH_BLOCK_TOKENS])


@njit(inline=True)
def same_tokens(s, owner, r, depth, limit):
    """How many tokens from ``depth`` (up to ``limit``) request ``r`` shares with ``owner``:
    all of them if it is ``owner``; else those both name with the same chain hash, up to the
    first hash block whose chains differ."""
    if limit <= depth:
        return 0
    if owner == r:
        return limit - depth
    h = s.config[HASH_BLOCK_TOKENS]
    end = min(limit, named_tokens(s, r), named_tokens(s, owner))
    if end <= depth:
        return 0
    a, b = s.chain_start[r], s.chain_start[owner]
    for k in range(depth // h, (end - 1) // h + 1):
        if s.chains[a + k] != s.chains[b + k]:
            return max(k * h - depth, 0)
    return end - depth


# -- nodes ---------------------------------------------------------------------------------------
@njit(inline=True)
def length(s, x):
    return s.radix_nodes[x, NODE_END] - s.radix_nodes[x, NODE_START]


@njit  # called from two places
def new_node(s, parent, start, end, owner, lock_ref):
    """A node ``[start, end)`` of ``owner``'s tokens, the first child of ``parent``."""
    c, nodes = s.count, s.radix_nodes
    x = c[RADIX_FREE_NODE]
    if x >= 0:
        c[RADIX_FREE_NODE] = nodes[x, NODE_NEXT_SIBLING]
    else:
        x = c[RADIX_NODES_USED]
        c[RADIX_NODES_USED] = x + 1
    nodes[x, NODE_PARENT] = parent
    nodes[x, NODE_FIRST_CHILD] = -1
    nodes[x, NODE_START] = start
    nodes[x, NODE_END] = end
    nodes[x, NODE_OWNER] = owner
    s.radix_request[owner, OWNED_NODES] += 1
    nodes[x, NODE_LOCK_REF] = lock_ref
    nodes[x, NODE_ON_HOST] = 0  # (a row off the free list may have been a host tier's node)
    nodes[x, NODE_EVICTED] = 0
    # a new node reads the clock (SGLang's TreeNode.__init__, radix_cache.py:259): it is newer
    # than the walk that made it and every node before it
    c[RADIX_ACCESS_CLOCK] += 1
    nodes[x, NODE_LAST_ACCESS] = c[RADIX_ACCESS_CLOCK]
    link_child(s, parent, x)
    return x


@njit(inline=True)
def link_child(s, parent, x):
    nodes = s.radix_nodes
    first = nodes[parent, NODE_FIRST_CHILD]
    nodes[x, NODE_NEXT_SIBLING] = first
    nodes[x, NODE_PREV_SIBLING] = -1
    if first >= 0:
        nodes[first, NODE_PREV_SIBLING] = x
    nodes[parent, NODE_FIRST_CHILD] = x
    nodes[x, NODE_PARENT] = parent


@njit(inline=True)
def unlink_child(s, x):
    nodes = s.radix_nodes
    p, n = nodes[x, NODE_PREV_SIBLING], nodes[x, NODE_NEXT_SIBLING]
    if p >= 0:
        nodes[p, NODE_NEXT_SIBLING] = n
    else:
        nodes[nodes[x, NODE_PARENT], NODE_FIRST_CHILD] = n
    if n >= 0:
        nodes[n, NODE_PREV_SIBLING] = p


@njit(inline=True)
def split(s, x, at):
    """``_split_node``: node ``x`` becomes ``[at, end)`` under a new node ``[start, at)`` that
    takes its place (same owner and lock; its access time a new node's). Returns the new node."""
    nodes = s.radix_nodes
    parent = nodes[x, NODE_PARENT]
    unlink_child(s, x)
    top = new_node(s, parent, nodes[x, NODE_START], at, nodes[x, NODE_OWNER], nodes[x, NODE_LOCK_REF])
    # with a host tier, both halves are where it was (SGLang splits its device and host values:
    # redistribute_on_node_split, unified_tree_core.py:1501-1502)
    nodes[top, NODE_ON_HOST] = nodes[x, NODE_ON_HOST]
    nodes[top, NODE_EVICTED] = nodes[x, NODE_EVICTED]
    nodes[x, NODE_START] = at
    link_child(s, top, x)
    return top


@njit(inline=True)
def matching_child(s, node, r, depth, limit):
    """The child of ``node`` that shares request ``r``'s next page, and how many of its tokens
    (whole pages, up to ``limit``) it shares; (-1, 0) if none does."""
    nodes, page = s.radix_nodes, s.config[BLOCK_SIZE]
    # past its named tokens ``r`` shares tokens only with nodes of its own: the others are passed
    # without reading their owners' hashes (a node per request under the root: a walk meets all)
    named = named_tokens(s, r) > depth
    child = nodes[node, NODE_FIRST_CHILD]
    while child >= 0:  # at most one child shares the next page (children differ in their first page)
        owner = nodes[child, NODE_OWNER]
        if named or owner == r:
            m = same_tokens(s, owner, r, depth, min(limit, nodes[child, NODE_END]))
            m = m // page * page
            if m > 0:
                return child, m
        child = nodes[child, NODE_NEXT_SIBLING]
    return -1, 0


@njit
def descend(s, r, limit):
    """:func:`walk`'s way down from the root (a call)."""
    nodes = s.radix_nodes
    s.count[RADIX_ACCESS_CLOCK] += 1
    now = s.count[RADIX_ACCESS_CLOCK]
    node, depth = ROOT, 0
    while depth < limit:
        child, m = matching_child(s, node, r, depth, limit)
        if child < 0:
            break
        # the node is accessed now; one the match ends inside is stamped before it is split, so
        # its lower half keeps this time and the upper one is a new node, newer still (SGLang:
        # radix_cache.py:660 then :663 in _match_prefix_helper, :728 then :735 in _insert_helper)
        nodes[child, NODE_LAST_ACCESS] = now
        if depth + m < nodes[child, NODE_END]:
            child = split(s, child, depth + m)
        node, depth = child, depth + m
        if nodes[node, NODE_END] != depth:
            break
    return node, depth


@njit(inline=True)
def walk(s, r, limit):
    """From the root along request ``r``'s first ``limit`` tokens, whole pages only, splitting
    the node the match ends inside; every node on the path is accessed now. Returns (the
    deepest node reached, its depth: the matched tokens). Where no node can match (``r`` names
    no token by a hash and owns no node: on a trace without hashes, a request whose tokens are
    not in the tree yet), only the walk's tick of the clock, without the call down the tree (a
    walk is one, at each admission, insertion and touch of a waiting request)."""
    if limit <= 0 or (named_tokens(s, r) == 0 and s.radix_request[r, OWNED_NODES] == 0):
        s.count[RADIX_ACCESS_CLOCK] += 1
        return ROOT, np.int64(0)
    return descend(s, r, limit)


@njit
def cached_prefix(s, r, limit):
    """How many of request ``r``'s first ``limit`` tokens the tree holds (whole pages): the walk
    without its side effects (no split, no access time), what a router reads."""
    node, depth = ROOT, 0
    while depth < limit:
        child, m = matching_child(s, node, r, depth, limit)
        if child < 0:
            break
        node, depth = child, depth + m
        if s.radix_nodes[node, NODE_END] != depth:
            break
    return depth


#: ``match_prefix``: the node request ``r``'s cached prefix (of its first ``limit`` tokens) ends
#: at, and its length (the walk itself: one compiled function)
match_prefix = walk


@njit
def insert(s, r, num_tokens):
    """``insert``: request ``r``'s first ``num_tokens`` tokens (a multiple of the page) into the
    tree: the path its cached prefix takes, and a new unlocked leaf for the rest. Returns (the
    node they end at, how many of them the tree held already)."""
    node, depth = walk(s, r, num_tokens)
    if depth < num_tokens:
        c = s.count
        node = new_node(s, node, depth, num_tokens, r, np.int64(0))  # not 0: jit.njit's note on constants
        c[RADIX_TREE_TOKENS] += num_tokens - depth
        c[RADIX_EVICTABLE] += num_tokens - depth
    return node, depth


@njit
def checkpoint(s, r, num_tokens):
    """SGLang 0.5.23's ``RadixCache.checkpoint`` of request ``r``'s first ``num_tokens`` tokens (a
    multiple of the page), a finished request's or a chunk's: ``insert``, then, when they go past
    its prompt's whole pages, the prompt's again (``_insert_cache(split_prompt=True)``,
    radix_cache.py:485-502), which adds no token but splits the node the prompt ends inside, so
    that eviction can free the output's tokens and keep the prompt's. Returns ``insert``'s.
    (checkpoint then matches the key, :524: it stamps the path just stamped, an order no
    eviction reads, as only a leaf is evicted and its ancestors come after it.)"""
    if s.config[HICACHE_HOST_PAGES]:  # with a host tier: write-through (hicache.insert)
        node, depth = hicache.insert(s, r, num_tokens)
    else:
        node, depth = insert(s, r, num_tokens)
    prompt = s.prompt_tokens[r] // s.config[BLOCK_SIZE] * s.config[BLOCK_SIZE]
    if 0 < prompt < num_tokens:
        insert(s, r, prompt)  # the node ``insert`` returned keeps its row: a split keeps the lower half
    return node, depth


# -- locks ---------------------------------------------------------------------------------------
@njit
def inc_lock_ref(s, x):
    """A running request holds the path from node ``x`` to the root: each node is locked once
    more; one locked for the first time leaves the evictable tokens."""
    nodes = s.radix_nodes
    while x != ROOT:
        if nodes[x, NODE_LOCK_REF] == 0:
            s.count[RADIX_EVICTABLE] -= length(s, x)
        nodes[x, NODE_LOCK_REF] += 1
        x = nodes[x, NODE_PARENT]


@njit
def dec_lock_ref(s, x):
    nodes = s.radix_nodes
    while x != ROOT:
        nodes[x, NODE_LOCK_REF] -= 1
        if nodes[x, NODE_LOCK_REF] == 0:
            s.count[RADIX_EVICTABLE] += length(s, x)
        x = nodes[x, NODE_PARENT]


# -- the pool ------------------------------------------------------------------------------------
@njit(inline=True)
def capacity(s):
    return s.config[NUM_BLOCKS] * s.config[BLOCK_SIZE]


@njit(inline=True)
def available(s):
    """Free slots outside the tree (the token pool allocator's ``available_size``)."""
    c = s.count
    return capacity(s) - c[RADIX_TREE_TOKENS] - c[RADIX_PRIVATE_PAGES] * s.config[BLOCK_SIZE]


@njit(inline=True)
def evict(s, num_tokens):
    """``evict``: free at least ``num_tokens`` tokens (or every evictable one), least recently
    accessed unlocked leaf first (ties: the lower node row); a parent left an unlocked leaf is a
    candidate in turn. Returns the tokens freed."""
    if s.config[HICACHE_HOST_PAGES]:  # with a host tier: device leaves, demoted or deleted
        return hicache.evict_device(s, num_tokens)
    c, nodes = s.count, s.radix_nodes
    freed = 0
    while freed < num_tokens:
        victim = -1
        for x in range(1, c[RADIX_NODES_USED]):
            if (nodes[x, NODE_PARENT] != FREE_NODE and nodes[x, NODE_FIRST_CHILD] < 0 and nodes[x, NODE_LOCK_REF] == 0
                    and (victim < 0 or nodes[x, NODE_LAST_ACCESS] < nodes[victim, NODE_LAST_ACCESS])):
                victim = x
        if victim < 0:
            break
        n = length(s, victim)
        freed += n
        c[RADIX_TREE_TOKENS] -= n
        c[RADIX_EVICTABLE] -= n
        c[NUM_EVICTIONS] += 1
        delete_node(s, victim)
    return freed


@njit(inline=True)
def delete_node(s, x):
    """Leaf ``x`` leaves the tree: its row goes on the free list."""
    c, nodes = s.count, s.radix_nodes
    s.radix_request[nodes[x, NODE_OWNER], OWNED_NODES] -= 1
    unlink_child(s, x)
    nodes[x, NODE_PARENT] = FREE_NODE
    nodes[x, NODE_NEXT_SIBLING] = c[RADIX_FREE_NODE]
    c[RADIX_FREE_NODE] = x


@njit
def make_room(s, num_tokens):
    """``num_tokens`` slots available, evicting what is short (the allocator's callers evict
    first: ``_evict_tree_cache_if_needed``)."""
    short = num_tokens - available(s)
    if short > 0:
        evict(s, short)


@njit
def hold(s, i, num_tokens):
    """Request ``i`` holds ``num_tokens`` computed tokens: the pages past its prefix, taken from
    the pool (evicting when short)."""
    page = s.config[BLOCK_SIZE]
    pages = (num_tokens - s.radix_request[i, PREFIX_LEN] + page - 1) // page
    more = pages - s.num_blocks[i]
    if more > 0:
        make_room(s, more * page)
        s.count[RADIX_PRIVATE_PAGES] += more
        s.num_blocks[i] = pages


@njit
def release(s, i):
    """Request ``i``'s pages outside the tree go back to the pool and its lock is dropped
    (a retraction; a finish inserts first: :func:`cache_finished_req`)."""
    s.count[RADIX_PRIVATE_PAGES] -= s.num_blocks[i]
    s.num_blocks[i] = 0
    if s.radix_request[i, LOCKED_NODE] >= 0:
        dec_lock_ref(s, s.radix_request[i, LOCKED_NODE])
    s.radix_request[i, LOCKED_NODE] = -1
    s.radix_request[i, PREFIX_LEN] = 0
    s.radix_request[i, INSERTED_LEN] = 0  # (a retraction starts it over: schedule_batch.py:2059)
    s.num_computed_tokens[i] = 0


@njit(inline=True)
def cache_finished_req(s, i):
    """``cache_finished_req``: request ``i``'s computed tokens, whole pages, go into the tree
    (``checkpoint``: those it already held there are freed as duplicates, the unaligned tail
    freed), then its memory is released."""
    page = s.config[BLOCK_SIZE]
    checkpoint(s, i, s.num_computed_tokens[i] // page * page)
    release(s, i)


@njit(inline=True)
def cache_unfinished_req(s, i):
    """``cache_unfinished_req``: the chunked request ``i``'s computed tokens, whole pages, go
    into the tree (``checkpoint``); it locks their node instead of its old one and holds only
    the tail."""
    page = s.config[BLOCK_SIZE]
    aligned = s.num_computed_tokens[i] // page * page
    node, _ = checkpoint(s, i, aligned)
    inc_lock_ref(s, node)
    if s.radix_request[i, LOCKED_NODE] >= 0:
        dec_lock_ref(s, s.radix_request[i, LOCKED_NODE])
    s.radix_request[i, LOCKED_NODE] = node
    s.radix_request[i, PREFIX_LEN] = aligned
    pages = (s.num_computed_tokens[i] - aligned + page - 1) // page
    s.count[RADIX_PRIVATE_PAGES] += pages - s.num_blocks[i]
    s.num_blocks[i] = pages


@njit(inline=True)
def memory_categories(s, demand_waiting, out):
    """The six categories (sim.metrics.MEMORY_CATEGORIES): token states, the tree's locked
    tokens and the running requests' computed ones outside it; no reservation (a step's tokens
    are taken as they are computed); internal fragmentation, the unfilled rest of their last
    pages; no allocator slack; free (external fragmentation while a request waits for memory),
    the available slots, the evictable tokens (cached, nobody's: SGLang counts them with the
    available) and the pool's slots short of a page. They sum to the capacity."""
    c, page = s.count, s.config[BLOCK_SIZE]
    private_slots = c[RADIX_PRIVATE_PAGES] * page
    private_tokens = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        private_tokens += s.num_computed_tokens[i] - s.radix_request[i, PREFIX_LEN]
    free_slots = available(s) + c[RADIX_EVICTABLE] + s.config[LEFTOVER_SLOTS]
    out[0] = c[RADIX_TREE_TOKENS] - c[RADIX_EVICTABLE] + private_tokens
    out[1] = 0
    out[2] = private_slots - private_tokens
    out[3] = 0
    out[4] = free_slots if demand_waiting else 0
    out[5] = 0 if demand_waiting else free_slots
    return (capacity(s) - available(s) - c[RADIX_EVICTABLE] + page - 1) // page


# the host tier (sim/core/hicache.py) builds on this module's functions: imported last, as they
# are all defined by then (its calls above are resolved when they are first called or compiled)
from pagesim.sim.core import hicache  # noqa: E402
