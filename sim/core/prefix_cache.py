"""Prefix caching (vLLM v0's, as ``sim/memory/paged.py`` states it) over the core's arrays.

A full prompt block is named by a key ``(end, chain)``: ``end = (k + 1) * block_size``
is the token its block ``k`` ends at, ``chain`` the chain hash of the request's prefix up to
the hash block holding token ``end - 1`` (``chains``, computed in Python by
``sim.memory.paged.prefix_chain`` once per request: the same values the Python manager keys
its dict with). Three structures, none allocating:

* the key -> block map: open addressing with linear probing over ``key_end`` /
  ``key_chain`` / ``key_block`` (a power of two, at least twice the pool, so at most half
  full: every key names a distinct block), deletion by backward shift (no tombstones);
* per block: its key's end (0: none) and its entry in the map (``block_key_slot``, kept
  when entries move), so an eviction finds its entry without probing;
* ``block_ref``: how many running requests' tables hold each block;
* the evictable blocks (cached, no reference) in a doubly linked list over block ids,
  oldest first (``lru_prev`` / ``lru_next``, head and tail in ``count``): O(1) to add at
  the tail, revive from the middle, or evict the head.

Rules (paged.py's ``_keys``, ``_hits``, ``allocate``, ``append``, ``free``): block ``k`` of
a request admitted with ``P`` prompt tokens is keyable when ``end <= min(P, hashes * H)``;
an admission reuses the longest run of leading keyable blocks found in the map, at most
``P - 1`` tokens (the last prompt token is always computed); a keyable block is registered
when its last token is computed, unless its key is there already; a request's blocks go back
tail first, those with a key to the LRU's tail (tails are evicted first), the others to the
free stack; a block for new use comes from the free stack, else the LRU's head is evicted
(its key dropped). Cached unreferenced blocks count as free in the memory categories.
"""

from __future__ import annotations

from sim.core.jit import njit
from sim.core.state import (BLOCK_SIZE, HASH_BLOCK_TOKENS, LRU_HEAD, LRU_TAIL, NUM_CACHED_KEYS,
                            NUM_EVICTIONS, NUM_LRU, TABLE_MASK)

# the map's home slot: Python's hash is well mixed in every bit; the end token is not
END_MIX = 0x9E3779B1


@njit(inline=True)
def home(s, end, chain):
    return (chain ^ (chain >> 31) ^ (end * END_MIX)) & s.config[TABLE_MASK]


@njit(inline=True)
def lookup(s, end, chain):
    """The block cached under ``(end, chain)``, or -1."""
    mask = s.config[TABLE_MASK]
    j = home(s, end, chain)
    while s.key_block[j] >= 0:
        if s.key_end[j] == end and s.key_chain[j] == chain:
            return s.key_block[j]
        j = (j + 1) & mask
    return -1


@njit(inline=True)
def register(s, b, end, chain):
    """Cache block ``b`` under ``(end, chain)`` unless the key is there already (one probe)."""
    mask = s.config[TABLE_MASK]
    j = home(s, end, chain)
    while s.key_block[j] >= 0:
        if s.key_end[j] == end and s.key_chain[j] == chain:
            return
        j = (j + 1) & mask
    s.key_end[j] = end
    s.key_chain[j] = chain
    s.key_block[j] = b
    s.block_key_end[b] = end
    s.block_key_slot[b] = j
    s.count[NUM_CACHED_KEYS] += 1


@njit(inline=True)
def unregister(s, b):
    """Drop block ``b``'s key from the map: its entry is emptied and the entries after it in
    the probe run move back where their probe would now stop short (backward shift)."""
    mask = s.config[TABLE_MASK]
    i = s.block_key_slot[b]
    s.block_key_end[b] = 0
    s.count[NUM_CACHED_KEYS] -= 1
    j = i
    while True:
        s.key_block[i] = -1
        while True:
            j = (j + 1) & mask
            if s.key_block[j] < 0:
                return
            h = home(s, s.key_end[j], s.key_chain[j])
            # the entry at j stays when its home lies cyclically in (i, j]
            if (h > i and h <= j) if i <= j else (h > i or h <= j):
                continue
            break
        s.key_end[i] = s.key_end[j]
        s.key_chain[i] = s.key_chain[j]
        s.key_block[i] = s.key_block[j]
        s.block_key_slot[s.key_block[j]] = i
        i = j


# -- the evictable blocks, oldest first ------------------------------------------------------
@njit(inline=True)
def lru_append(s, b):
    c = s.count
    s.lru_prev[b] = c[LRU_TAIL]
    s.lru_next[b] = -1
    if c[LRU_TAIL] >= 0:
        s.lru_next[c[LRU_TAIL]] = b
    else:
        c[LRU_HEAD] = b
    c[LRU_TAIL] = b
    c[NUM_LRU] += 1


@njit(inline=True)
def lru_remove(s, b):
    c = s.count
    p, n = s.lru_prev[b], s.lru_next[b]
    if p >= 0:
        s.lru_next[p] = n
    else:
        c[LRU_HEAD] = n
    if n >= 0:
        s.lru_prev[n] = p
    else:
        c[LRU_TAIL] = p
    c[NUM_LRU] -= 1


@njit(inline=True)
def evict_oldest(s):
    """The least recently released cached block, its key dropped, for new use."""
    b = s.count[LRU_HEAD]
    lru_remove(s, b)
    unregister(s, b)
    s.count[NUM_EVICTIONS] += 1
    return b


# -- a request's keys --------------------------------------------------------------------------
@njit(inline=True)
def keyable_blocks(s, i, prompt_len):
    """How many leading blocks of request ``i`` admitted with ``prompt_len`` tokens have a key."""
    num_hashes = s.chain_start[i + 1] - s.chain_start[i]
    return min(prompt_len, num_hashes * s.config[HASH_BLOCK_TOKENS]) // s.config[BLOCK_SIZE]


@njit(inline=True)
def key_chain(s, i, k):
    """The chain hash in block ``k``'s key (the hash block holding its last token)."""
    end = (k + 1) * s.config[BLOCK_SIZE]
    return s.chains[s.chain_start[i] + (end - 1) // s.config[HASH_BLOCK_TOKENS]]


@njit(inline=True)
def hit_limit(s, i, prompt_len):
    """At most this many leading blocks can be hits: keyable, and short of the last prompt
    token (always computed, as vLLM's)."""
    return min(keyable_blocks(s, i, prompt_len), max(prompt_len - 1, 0) // s.config[BLOCK_SIZE])


@njit
def count_hits(s, i, prompt_len):
    """The leading blocks of request ``i`` found in the cache (at most ``prompt_len - 1``
    tokens' worth), and how many of them are unreferenced (reviving one takes a free block)."""
    bs = s.config[BLOCK_SIZE]
    hits = 0
    revived = 0
    for k in range(hit_limit(s, i, prompt_len)):
        b = lookup(s, (k + 1) * bs, key_chain(s, i, k))
        if b < 0:
            break
        hits += 1
        if s.block_ref[b] == 0:
            revived += 1
    return hits, revived


@njit
def register_full_blocks(s, i, old_len, new_len):
    """Request ``i``'s tokens ``[old_len, new_len)`` were computed: the keyable blocks they
    filled are cached, unless their key is there already."""
    bs = s.config[BLOCK_SIZE]
    last = min(new_len // bs, s.num_keys[i])
    slot = s.slot[i]
    for k in range(old_len // bs, last):
        register(s, s.block_table[slot, k], (k + 1) * bs, key_chain(s, i, k))
