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
the pages of both tiers and by the requests' own pages (``build.radix_rows``), so nothing is
allocated.

With a host tier (``--kv-offload-gib``: SGLang's HiCache, the section at the end) a node may also
be on the host, or on the host alone: ``checkpoint`` and ``evict`` hand over to it (under
``config[HICACHE_HOST_PAGES]``), and the walk goes through host-only nodes as through any.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.compile.families import RADIX_TREE
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import FAMILY_TRAITS
from pagesim.sim.core.state import (BLOCK_SIZE, HASH_BLOCK_TOKENS, HICACHE_HOST_PAGES, HOST_BLOCK_S,
                                    HOST_EVICTIONS, HOST_HIT_TOKENS, HOST_LOADED_BLOCKS, HOST_STORED_BLOCKS,
                                    HOST_USED, LEFTOVER_SLOTS, LOAD_LINK_FREE_S, LOCKED_NODE, NOW,
                                    NUM_BLOCKS, NUM_EVICTIONS, NUM_RUNNING, PREFIX_LEN, STORE_LINK_FREE_S)
from pagesim.sim.core.state import section, table

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    HICACHE_LAYERS      the model's layers, over which a load back is pipelined with the step
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    RADIX_ACCESS_CLOCK  the radix tree's access clock: a node's last access is a tick of it
    RADIX_FREE_NODE     the head of the radix tree's list of free nodes
    RADIX_NODES_USED    the nodes ever used (evictions scan these)
    RADIX_TREE_TOKENS   sglang: the tokens the radix tree holds
    RADIX_EVICTABLE     those of them no running request locks
    RADIX_PRIVATE_PAGES  the pages the running requests hold outside the tree
    HICACHE_PENDING     sglang's host tier: the nodes whose copy (a write or a load) is not yet
        acknowledged (Core.host_work's HICACHE_PENDING_NODE row, in submission order)
    STEP_LOAD_TOKENS    sglang's host tier: the tokens this iteration's prefill loads back
""")

# Core.radix_nodes (--system sglang): a tree node, a run of tokens [START, END) of every path
# through it, named by the tokens of request OWNER; free nodes have PARENT -2
table("radix_nodes", """
    NODE_PARENT         its parent
    NODE_FIRST_CHILD    its first child
    NODE_NEXT_SIBLING   its next sibling
    NODE_PREV_SIBLING   its previous sibling
    NODE_START          its first token in OWNER's tokens
    NODE_END            its end
    NODE_OWNER          the request whose tokens name it
    NODE_LOCK_REF       the running requests locking it
    NODE_LAST_ACCESS    its last access (a tick of count[RADIX_ACCESS_CLOCK])
    NODE_ON_HOST        sglang's host tier: 1 when its tokens have a host copy (SGLang's backuped)
    NODE_EVICTED        sglang's host tier: 1 when its tokens have no device copy (host only)
    NODE_HEAP           not the node's: entry i of an eviction's heap of leaves (radix_cache.leaves_by_age),
        in this column as the heap holds each node at most once; read only inside that eviction
""", size="NODE_COLUMNS", into=globals())

# Core.radix_request: this file's entries, in its room of the shared table (sim/core/state.py)
section("radix_request", globals(), """
    OWNED_NODES         the tree's live nodes its tokens name (their NODE_OWNER): with none, and
        no token its prefix hashes name, a walk from the root matches nothing
        (radix_cache.match_prefix)
    INSERTED_LEN        sglang's host tier: its tokens inserted so far (SGLang's cache_inserted_len):
        an insert writes through only the nodes past them
""")

# Core.host_work: this file's entries, in its room of the shared table (sim/core/state.py)
section("host_work", globals(), """
    HICACHE_PENDING_NODE  sglang's host tier: a node whose copy is not acknowledged, in
        submission order (count[HICACHE_PENDING]); its copy's end is Core.host_ready_s[node]
    HICACHE_PATH        sglang's host tier: room for a path's nodes (radix_cache.insert_writing_through)
    HICACHE_CHAIN       and for a write's chain of ancestors (radix_cache.write)
""")


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


def with_radix_tree(config):
    """The runs that may call :func:`checkpoint`: SGLang's, over its radix tree."""
    return config[FAMILY_TRAITS] & RADIX_TREE != 0


@njit(lazy=with_radix_tree)  # compiled apart, the state by reference: SGLang's scheduler calls it
def checkpoint(s, r: int, num_tokens: int) -> int:
    """SGLang 0.5.23's ``RadixCache.checkpoint`` of request ``r``'s first ``num_tokens`` tokens (a
    multiple of the page), a finished request's or a chunk's: ``insert``, then, when they go past
    its prompt's whole pages, the prompt's again (``_insert_cache(split_prompt=True)``,
    radix_cache.py:485-502), which adds no token but splits the node the prompt ends inside, so
    that eviction can free the output's tokens and keep the prompt's. Returns the node ``insert``
    returned.
    (checkpoint then matches the key, :524: it stamps the path just stamped, an order no
    eviction reads, as only a leaf is evicted and its ancestors come after it.)"""
    if s.config[HICACHE_HOST_PAGES]:  # with a host tier: write-through (insert_writing_through)
        node, _ = insert_writing_through(s, r, num_tokens)
    else:
        node, _ = insert(s, r, num_tokens)
    prompt = s.prompt_tokens[r] // s.config[BLOCK_SIZE] * s.config[BLOCK_SIZE]
    if 0 < prompt < num_tokens:
        insert(s, r, prompt)  # the node ``insert`` returned keeps its row: a split keeps the lower half
    return node


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
def slots_in_use(counts, r, block_size):
    """Replica ``r``'s token pool in use (``counts``: the replicas' counters, a row each): the
    tree's tokens running requests lock, and the pages they hold outside the tree."""
    return counts[r, RADIX_TREE_TOKENS] - counts[r, RADIX_EVICTABLE] + counts[r, RADIX_PRIVATE_PAGES] * block_size


@njit(inline=True)
def evictable(s):
    """The tree's tokens no running request locks: an eviction may free them."""
    return s.count[RADIX_EVICTABLE]


@njit(inline=True)
def copies_pending(s):
    """The host tier's copies (writes or loads) not yet acknowledged."""
    return s.count[HICACHE_PENDING]


@njit(inline=True)
def loads_back(s):
    """The tokens this step's prefill loads back from the host tier (its price: :func:`step_price`)."""
    return s.count[STEP_LOAD_TOKENS]


@njit(inline=True)
def available(s):
    """Free slots outside the tree (the token pool allocator's ``available_size``)."""
    c = s.count
    return capacity(s) - c[RADIX_TREE_TOKENS] - c[RADIX_PRIVATE_PAGES] * s.config[BLOCK_SIZE]


@njit(inline=True)
def evict(s, num_tokens):
    """``evict`` (mem_cache/radix_cache.py:552-578 in 0.5.23): free at least ``num_tokens`` tokens (or every
    evictable one), least recently accessed unlocked leaf first (ties: the lower node row), from a
    heap of the leaves taken once (:func:`leaves_by_age`); a parent left an unlocked leaf joins
    it. Returns the tokens freed. With a host tier (``evict_device_leaf``,
    unified_tree_core.py:1788-1823) the leaves are device leaves (:func:`is_device_leaf`: host-only
    children do not count) and a backed-up one is demoted to the host, not deleted (``_demote``,
    :2090-2123; an unbacked one's children are device-only too: a backed-up node's ancestors are
    backed up, :func:`write`)."""
    c, nodes = s.count, s.radix_nodes
    tiers = s.config[HICACHE_HOST_PAGES] > 0
    kind = DEVICE_LEAF if tiers else LEAF
    size = leaves_by_age(s, kind)
    freed = 0
    while freed < num_tokens and size > 0:
        victim = heap_pop(s, size)
        size -= 1
        parent = nodes[victim, NODE_PARENT]
        n = length(s, victim)
        freed += n
        c[RADIX_TREE_TOKENS] -= n
        c[RADIX_EVICTABLE] -= n
        c[NUM_EVICTIONS] += 1
        if tiers and nodes[victim, NODE_ON_HOST]:
            nodes[victim, NODE_EVICTED] = 1  # the node stays, host-only
        else:
            delete_node(s, victim)
        size = push_if_leaf(s, size, parent, kind)
    return freed


#: the leaves an eviction takes (:func:`is_leaf`): without a host tier, an unlocked node with no
#: children; with one, a device leaf (:func:`evict`) or a host leaf (:func:`evict_host`)
LEAF, DEVICE_LEAF, HOST_LEAF = 0, 1, 2


@njit(inline=True)
def is_leaf(s, x, kind):
    nodes = s.radix_nodes
    if kind == HOST_LEAF:
        return is_host_leaf(s, x)
    if kind == DEVICE_LEAF:
        return is_device_leaf(s, x)
    return nodes[x, NODE_PARENT] != FREE_NODE and nodes[x, NODE_FIRST_CHILD] < 0 and nodes[x, NODE_LOCK_REF] == 0


@njit
def leaves_by_age(s, kind):
    """The leaves of ``kind`` as a heap (pushed one by one, :func:`heap_push`), least recently
    accessed first, ties the lower row: what an eviction takes (``evictable_leaves`` and
    ``heapq.heapify``, radix_cache.py:558-562). Taken once per eviction, as SGLang does, not a
    scan per leaf. Returns the heap's size."""
    size = 0
    for x in range(1, s.count[RADIX_NODES_USED]):
        if is_leaf(s, x, kind):
            size = heap_push(s, size, x)
    return size


@njit(inline=True)
def push_if_leaf(s, size, x, kind):
    """A parent left a leaf of ``kind`` by an eviction is a candidate in turn (radix_cache.py:573-575);
    returns the heap's size."""
    if x != ROOT and is_leaf(s, x, kind):
        return heap_push(s, size, x)
    return size


# -- the eviction heap: a binary min-heap of node rows in the column NODE_HEAP (heapq's order over
# (last access, row); numba's heapq takes lists, which the core, compiled without reference
# counting, does not make)
@njit(inline=True)
def before(s, a, b):
    """Node ``a`` goes before ``b``: accessed less recently, or as recently and the lower row."""
    nodes = s.radix_nodes
    ta, tb = nodes[a, NODE_LAST_ACCESS], nodes[b, NODE_LAST_ACCESS]
    return ta < tb or (ta == tb and a < b)


@njit
def heap_push(s, size, x):
    """Node ``x`` into the heap of ``size`` entries (``heapq._siftdown``); returns the new size."""
    heap = s.radix_nodes
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if not before(s, x, heap[up, NODE_HEAP]):
            break
        heap[i, NODE_HEAP] = heap[up, NODE_HEAP]
        i = up
    heap[i, NODE_HEAP] = x
    return size + 1


@njit
def heap_pop(s, size):
    """The first of the heap's ``size`` (> 0) entries, taken out: the last entry sifts down from
    the top (``heapq.heappop``). The heap has ``size - 1`` entries after."""
    heap = s.radix_nodes
    top = heap[0, NODE_HEAP]
    size -= 1
    last = heap[size, NODE_HEAP]
    i = 0
    while 2 * i + 1 < size:
        child = 2 * i + 1
        if child + 1 < size and before(s, heap[child + 1, NODE_HEAP], heap[child, NODE_HEAP]):
            child += 1
        if not before(s, heap[child, NODE_HEAP], last):
            break
        heap[i, NODE_HEAP] = heap[child, NODE_HEAP]
        i = child
    if size > 0:
        heap[i, NODE_HEAP] = last
    return top


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
    node = checkpoint(s, i, aligned)
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


# -- the host tier (``--kv-offload-gib``): SGLang's HiCache ----------------------------------------
# SGLang 0.5.23's hierarchical cache (HiCache: the GPU tier and a host tier, ``--system sglang
# --kv-offload-gib N``) over the tree above.
#
# Every rule below is SGLang 0.5.23's, read in ``docs/notes/sglang-hicache.md`` (file:line under
# ``python/sglang/srt/``) and checked call by call against SGLang's own ``UnifiedRadixCache`` by
# ``tests/peers/sglang_hicache_side.py``. The default ``--hicache-write-policy write_through``
# (threshold 1), L2 only (no storage backend); the host pool is sized in ``build.hicache_host_pages``:
#
# * **A node on two tiers.** Each node has a device copy, a host copy or both (``NODE_EVICTED``,
#   ``NODE_ON_HOST``; SGLang's ``evicted`` / ``backuped``, ``unified_cache/unified_tree_core.py:
#   162-173``). ``RADIX_TREE_TOKENS`` and ``RADIX_EVICTABLE`` count device tokens only; the host
#   pool's pages in use are ``count[HOST_USED]`` of ``config[HICACHE_HOST_PAGES]``.
# * **Write-through** (:func:`insert_writing_through`): an insert writes every node it walks past the request's
#   already inserted tokens that is on the device and not on the host, and the new leaf
#   (``_finish_insert_walk_node``, ``unified_tree_core.py:1368-1381``; ``_inc_hit_count_and_check``,
#   ``:1104-1123``, threshold 1 for ``write_through``, ``unified_radix_cache.py:558-560``;
#   ``_should_backup_after_insert``, ``:1430-1447``). A walked host-only node gets its device copy
#   back from the request's own KV, no transfer (``_unevict_node_on_insert``, ``:1564-1590``).
# * **A write** (:func:`write`): the node's ancestors not on the host first, from the top
#   (``_build_backup_kv_action``, ``unified_tree_core.py:2622-2644``), each taking its host pages at
#   once, evicting host leaves first where short; one that still does not fit is dropped, the node
#   staying device-only, and so is the rest of the chain (``_execute_kv_backup``,
#   ``unified_radix_cache.py:1681-1716, 1738-1762``); a written node is backed up at once
#   (``commit_backup``) and locked on the device until the copy is acknowledged
#   (``inc_lock_ref``, ``:1707-1708``; ``_finish_write_through_ack``, ``:1803-1818``). The copy goes
#   GPU -> host on the store link, after the copies before it; no step waits for it.
# * **Device eviction** (:func:`evict`): the least recently used device leaf (on the device,
#   unlocked, no child on the device: host-only children do not count, ``_is_device_leaf``,
#   ``unified_tree_core.py:2348-2364``); a backed-up one is demoted (device tokens freed, the node
#   stays host-only, ``_demote``, ``:2090-2123``), an unbacked one deleted
#   (``_delete_unbacked_device_leaf``, ``:1903-1929``; ``evict_device_leaf``, ``:1788-1823``).
# * **Host eviction** (:func:`evict_host`): the least recently used host leaf (host-only, unlocked,
#   no children, ``_is_host_leaf``, ``:2366-2387``) is deleted (``_evict_host_leaf``, ``:2046-2075``).
# * **A match** walks host-only nodes too (``_match_prefix_helper``, ``:906-984``), splitting them
#   as any: the radix cache's own walk. The device part is a prefix of the path (a host-only node's
#   descendants are host-only: device eviction goes leaf first), so the last device node is the
#   deepest node of the path on the device (:func:`device_node`) and the host hit the rest
#   (``host_hit_length``, ``components/full.py:123-145``).
# * **A load back** (:func:`load_back`) of a host hit of at least ``LOAD_BACK_THRESHOLD`` tokens
#   (else nothing is loaded and the request recomputes them: ``unified_radix_cache.py:1879-1886``):
#   device slots taken, evicting where short (``:1901-1908``), the nodes on the device at once and
#   locked until the load is acknowledged (``commit_load_back``, ``ongoing_load_back``,
#   ``:1917-1935``). The batch's loads are one copy on the load link from the step's start, layer
#   by layer, each attention layer waiting for its own layer (``mem_cache/l2_transfer.py:145-183``,
#   ``memory_pool.py:2852-2858``, ``managers/cache_controller.py:83-110``): :func:`step_price`.
# * **Acknowledgements** (:func:`acknowledge`): each scheduling iteration unlocks the nodes whose
#   copy has ended by then, in submission order (``check_hicache_events``, ``scheduler.py:
#   3880-3890``; ``writing_check`` / ``loading_check``, ``unified_radix_cache.py:3472-3583``).
#
# Not modelled: ``write_through_selective`` and ``write_back``, L3 storage, the host lock of a load
# in flight (``host_lock_ref``: a node being loaded is on the device, never a host leaf), the
# merging of a step's writes into one acknowledgement (each node is acknowledged at its own copy's
# end), the TP ranks' MIN-reduction of acknowledgements.


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
    n = length(s, x)
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
            dec_lock_ref(s, x)
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
    size = leaves_by_age(s, HOST_LEAF)
    freed = 0
    while freed < num_pages and size > 0:
        victim = heap_pop(s, size)
        size -= 1
        parent = nodes[victim, NODE_PARENT]
        n = pages(s, length(s, victim))
        freed += n
        s.count[HOST_USED] -= n
        s.count[HOST_EVICTIONS] += n
        nodes[victim, NODE_ON_HOST] = 0
        delete_node(s, victim)
        size = push_if_leaf(s, size, parent, HOST_LEAF)
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
    n = pages(s, length(s, x))
    if host_free(s) < n:
        evict_host(s, n - host_free(s))
        if host_free(s) < n:
            return False
    c[HOST_USED] += n
    c[HOST_STORED_BLOCKS] += n
    s.radix_nodes[x, NODE_ON_HOST] = 1
    inc_lock_ref(s, x)
    # one direction of the host link, in submission order (flush_pending_backups after the batch's
    # results, on the D2H stream behind the forward: scheduler.py:5105-5106, cache_controller.py:885-920)
    end = max(clock[NOW], clock[STORE_LINK_FREE_S]) + n * clock[HOST_BLOCK_S]
    clock[STORE_LINK_FREE_S] = end
    pend(s, x, end)
    return True


# -- the tree's calls ----------------------------------------------------------------------------
@njit
def insert_writing_through(s, r, num_tokens):
    """``insert`` of request ``r``'s first ``num_tokens`` tokens with write-through (the section's
    comment): the radix cache's walk (it splits as SGLang's does), then, from the root down,
    each walked node restored to the device where host-only and written where past the request's
    inserted tokens and not on the host; then the new leaf, written too. Returns (the node they end
    at, how many of them the tree held already, on either tier)."""
    nodes, c = s.radix_nodes, s.count
    node, held = walk(s, r, num_tokens)
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
        leaf = new_node(s, node, reached, num_tokens, r, np.int64(0))
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
    make_room(s, tokens)  # evict_for_alloc (:1901-1908): the hit's path is locked or host-only
    if available(s) < tokens:
        return 0
    x = best
    while x != device:
        restore(s, x)
        x = nodes[x, NODE_PARENT]
    inc_lock_ref(s, best)
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
    waiting for layer l's load (the section's comment), so the step ends once the whole load has
    landed and its last layer has run: max(forward, load + forward / layers), the load counted from the
    step's start (after the load link's earlier copies)."""
    load_s = s.clock[LOAD_LINK_FREE_S] - s.clock[NOW]
    return max(forward_s, load_s + forward_s / s.config[HICACHE_LAYERS])


# SGLang's scheduler meets the host tier at these points (``scheduler_sglang``: its iteration, the
# longest-prefix sort, the prefill adder)


@njit(inline=True)
def copies_ended(s):
    """An iteration starts: the host tier's copies that ended by now are acknowledged
    (``check_hicache_events``, scheduler.py:3898) and the step's load tokens start from 0;
    nothing without a host tier."""
    if not s.config[HICACHE_HOST_PAGES]:
        return
    s.count[STEP_LOAD_TOKENS] = 0
    if s.count[HICACHE_PENDING]:
        acknowledge(s)


@njit(inline=True)
def device_prefix(s, node, matched):
    """The tokens of a match of ``matched`` tokens ending at ``node`` that are on the device (with
    a host tier, ``req.prefix_len``: the host hit's are not, schedule_policy.py:365)."""
    if s.config[HICACHE_HOST_PAGES]:
        return depth(s, device_node(s, node))
    return matched


@njit(inline=True)
def match_for_admission(s, i, target):
    """Waiting request ``i``'s (``target`` tokens) match, at most ``target - 1`` tokens
    (``init_next_round_input``, schedule_batch.py): (the node its device prefix ends at, the
    deepest node matched on the device or the host, the device prefix's tokens); without a host
    tier both nodes are the match's."""
    node, prefix = match_prefix(s, i, max(target - 1, 0))
    best = node
    if s.config[HICACHE_HOST_PAGES]:  # the device part is the prefix, the rest the host hit
        node = device_node(s, best)
        prefix = depth(s, node)
    return node, best, prefix


@njit(inline=True)
def load_host_hit(s, node, best):
    """The admission locking ``node`` loads its host hit down to ``best`` back (:func:`load_back`),
    the request then locking ``best`` (schedule_policy.py:1690). Returns (the node it locks, the
    tokens loaded: 0 where there is no host hit, or it is recomputed)."""
    if best == node:
        return node, 0
    loaded = load_back(s, node, best)
    if not loaded:
        return node, 0
    dec_lock_ref(s, node)
    inc_lock_ref(s, best)
    s.count[HOST_HIT_TOKENS] += loaded
    return best, loaded
