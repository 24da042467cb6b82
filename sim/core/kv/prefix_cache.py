"""Prefix caching (vLLM v0's automatic prefix caching) over the core's arrays.

Every full block is named by a key ``(end, chain)``, as vLLM hashes every full block of a
request, its own tokens and its generated ones too (v1 ``hash_block_tokens`` over
``request.all_token_ids``, ``vllm/v1/core/kv_cache_utils.py``; 0.4.2 ``hash_of_block``):
``end = (k + 1) * block_size`` is the token its block ``k`` ends at, ``chain`` the chain hash
of the request's prefix up to the hash block holding token ``end - 1`` (``chains``, computed
in Python by :func:`prefix_chain` once per request) where the trace's ``prefix_hashes`` cover
it and another request's hashes share it (``build.shared_chains``), else the request's own
(:func:`own_chain`: its tokens past its shared prefix are its own, so only the request itself,
recomputed after a preemption, finds them). Three structures,
none allocating:

* the key -> block map: open addressing with linear probing over the rows of
  ``key_entries`` (end, chain, block; a power of two, at least eight times the pool, so at most
  an eighth full: every key names a distinct block), deletion by backward shift (no
  tombstones); the keys of a chain's blocks have consecutive homes, sixteen at a time
  (:func:`home_in`);
* per block, one row of ``block_info`` (one cache line: the structures are walked block by
  block, and a prompt of 10,000 tokens has 600 blocks): ``REF``, how many running requests'
  tables hold it; ``PREV`` / ``NEXT``, its neighbours in the list of evictable blocks (cached,
  no reference), oldest first, head and tail in ``count`` (O(1) to add at the tail, revive
  from the middle, or evict the head); ``KEY_END``, its key's end (0: none), and
  ``KEY_SLOT``, its row in the map (kept when rows move: an eviction finds it without a probe).

Rules: an admission of ``P`` prompt tokens reuses the longest run of leading blocks found in
the map, at most ``P - 1`` tokens (the last prompt token is always computed); a block is
registered when its last token is computed (a decode's too, for a request of one sequence),
unless its key is there already; a request's blocks go back tail first, the full ones to the
LRU's tail (tails are evicted first), keyed or a copy of a key cached already, the others to
the free stack, reused first (vLLM 0.33.0 ``BlockPool.free_blocks``); a block for new use comes
from the free stack, else the LRU's head is taken, its key dropped if it has one. vLLM 0.4.2
(:func:`v0_evictor`) differs in two: every block let go joins the LRU (the free stack holds the
blocks never used), and the one evicted is the deepest of the least recently accessed
(:func:`evict_oldest`; ``ACCESS_STEP``, ``HASHED_TOKENS``). A request's own keys (past the
prefix hashes it shares) stay out of the map until it is preempted (:func:`apart`). Cached
unreferenced blocks count as free in the memory categories.
"""

from __future__ import annotations

from pagesim.sim.core.compile.families import EVICTS_ANY_BLOCK
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import (ACCESS_STEP, BLOCK_SIZE, COMPUTED, HASH_BLOCK_TOKENS, HASHED_TOKENS,
                                    KEY_END, NUM_CACHED_KEYS, NUM_EVICTIONS, NUM_LRU, REF, RUN, RUN_LAST)
from pagesim.sim.core.state import FULL_GROUPS, SLIDING_GROUPS, SLIDING_WINDOW, STATE_GROUPS, WINDOW_JUNCTION
from pagesim.sim.core.state import MAMBA_ALIGN, SCHEDULED_STEPS
from pagesim.sim.core.state import FAMILY_TRAITS, PREFIX_CACHING
from pagesim.sim.core.state import section, table

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    BLOCK_SHIFT         log2 of BLOCK_SIZE where that is a power of two, else -1 (prefix_cache.block_of)
    TABLE_MASK          the prefix keys' hash table size less one (a power of two)
    SPEC_HASH_LOOKAHEAD  the tokens after each block that its prefix-cache key covers (vLLM's
        num_hash_lookahead_tokens: 1 for EAGLE and MTP with prefix caching; prefix_cache.key_chain)
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    LRU_HEAD            the LRU list's head of the cached blocks no running request holds
        (count[NUM_LRU]; evicted first)
    LRU_TAIL            its tail
""")

# Core.block_info: this file's entries, in its room of the shared table (sim/core/state.py)
section("block_info", globals(), """
    PREV                its neighbour towards the LRU list's head
    NEXT                its neighbour towards the tail
    KEY_SLOT            its key's row in Core.key_entries
    KEY_GROUP           with SLIDING_GROUPS: the KV cache group its key is in (vLLM keys a block
        by its hash and its group, kv_cache_utils.py:60-79; prefix_cache.register_in_group)
    STATE_CACHED_STEP   MAMBA_ALIGN: count[SCHEDULED_STEPS] when a state was last cached under its
        key (on the block a lookup of the key finds): a hit on it in that step is refused
        (cached_blocks_this_step, single_type_kv_cache_manager.py:1704-1712)
""")

# Core.key_entries: the prefix key -> block map (ENTRY_BLOCK -1: an empty row)
table("key_entries", """
    ENTRY_END           the key's end token
    ENTRY_CHAIN         the prefix chain's hash
    ENTRY_BLOCK         the block
""", size="ENTRY_COLUMNS", columns=4, into=globals())


def prefix_chain(hashes, hash_block_tokens: int) -> list[int]:
    """The chain ``c_j = hash((c_{j-1}, h_j))`` over a request's prefix hashes (a trace's
    ``prefix_hashes``, one per ``hash_block_tokens`` prompt tokens): ``c_j`` names its prefix up
    to hash block ``j``, as vLLM's block hash names a block by its tokens and its parent's hash."""
    chain, c = [], hash(("pagesim-prefix", int(hash_block_tokens)))
    for h in hashes:
        c = hash((c, h))
        chain.append(c)
    return chain


# the map's home slot: Python's hash is well mixed in every bit; the end token is not
END_MIX = 0x9E3779B1
#: the prefix map's keys have consecutive homes for runs of 2**SEGMENT_SHIFT blocks (home_in)
SEGMENT_SHIFT = 4


@njit(inline=True)
def block_of(s, position):
    """The block a table's token ``position`` falls in (``position // BLOCK_SIZE``), by a shift
    where the block size is a power of two, as every engine's default is: the per-step paths
    (``kv_cache.blocks_for``, the blocks a step's tokens fill) divide a few times per running
    request, and the divisions cost a noticeable share of vLLM v1's engine (docs/performance.md,
    "The compiler's machinery")."""
    shift = s.config[BLOCK_SHIFT]
    if shift >= 0:
        return position >> shift
    return position // s.config[BLOCK_SIZE]


@njit(inline=True)
def several_groups(config):
    """Whether the pool serves several KV cache groups (``kv_cache.grouped``), by the run's
    ``config``: the runs that may call the groups' functions, here and in ``kv_cache.py``, and
    so the only ones that compile them (``njit``'s lazy)."""
    return config[SLIDING_GROUPS] + config[STATE_GROUPS] > 0

@njit(inline=True)
def home(s, end, chain):
    return home_in(s.config[TABLE_MASK], end, chain, s.config[BLOCK_SHIFT])


@njit(inline=True)
def home_in(mask, end, chain, shift=-1):
    """A key's home row in a map of ``mask + 1`` rows (this one, and the host tier's:
    ``host_tier.py``, whose rows are (end, chain, block) as well). ``shift``: this map's, log2
    of the block size: the keys of a chain's blocks ``16 m`` to ``16 m + 15`` (a segment) have
    consecutive homes, the segment's first drawn from the chain and ``m``. A request's blocks
    are registered, looked up and evicted in order, so that their rows share cache lines rather
    than each costing a miss (docs/performance.md); a table eight times the pool keeps segments
    apart. -1 (the host tier's, and a block size not a power of two): each key's home drawn
    alone."""
    if shift < 0:
        return (chain ^ (chain >> 31) ^ (end * END_MIX)) & mask
    k = (end - 1) >> shift  # the key's block
    segment = chain ^ (chain >> 31) ^ ((k >> SEGMENT_SHIFT) * END_MIX)
    segment = ((segment ^ (segment >> 29)) & mask) * END_MIX  # a product's low bits need only the factors'
    return ((segment << SEGMENT_SHIFT) | (k & ((1 << SEGMENT_SHIFT) - 1))) & mask


@njit(inline=True)
def lookup(s, end, chain):
    """The block cached under ``(end, chain)``, or -1."""
    return map_lookup(s.key_entries, s.config[TABLE_MASK], end, chain, s.config[BLOCK_SHIFT])


@njit(inline=True)
def map_lookup(entries, mask, end, chain, shift=-1):
    """The block under ``(end, chain)`` in the map ``entries`` (rows of end, chain, block; homes
    by ``shift``: :func:`home_in`), or -1."""
    j = home_in(mask, end, chain, shift)
    while entries[j, ENTRY_BLOCK] >= 0:
        if entries[j, ENTRY_END] == end and entries[j, ENTRY_CHAIN] == chain:
            return entries[j, ENTRY_BLOCK]
        j = (j + 1) & mask
    return -1


@njit(inline=True)
def register(s, b, end, chain, mapped=True):
    """Cache block ``b`` under ``(end, chain)``. vLLM 0.4.2 keeps one block a key (a block whose
    key is there already is not cached); vLLM v1 caches it beside the other (``BlockHashToBlockMap``
    holds several blocks a hash and a lookup takes the earliest inserted still there,
    block_pool.py:36-110): a recompute's last prompt block, which cannot be a hit, duplicates a
    cached one, and outlives its eviction. The map keeps such entries in insertion order within
    their probe run (:func:`map_lookup` finds the earliest; :func:`map_delete` keeps the order).
    A block cached already is not cached again (vLLM caches a request's blocks past those it has
    cached, block_pool.py ``cache_full_blocks``). ``mapped`` off (:func:`apart`): the key is the
    request's own, held out of the map (``KEY_SLOT`` -1) until :func:`publish`."""
    if s.block_info[b, KEY_END]:
        return
    j = -1
    if mapped:
        j = map_insert(s.key_entries, s.config[TABLE_MASK], b, end, chain, not v0_evictor(s), s.config[BLOCK_SHIFT])
        if j < 0:
            return
    s.block_info[b, KEY_END] = end
    s.block_info[b, KEY_SLOT] = j
    s.count[NUM_CACHED_KEYS] += 1


@njit(inline=True)
def map_insert(entries, mask, b, end, chain, duplicates=False, shift=-1):
    """Put block ``b`` under ``(end, chain)`` in the map ``entries`` unless the key is there
    already (-1) and ``duplicates`` is off (else after the key's other entries); returns its row."""
    j = home_in(mask, end, chain, shift)
    while entries[j, ENTRY_BLOCK] >= 0:
        if entries[j, ENTRY_END] == end and entries[j, ENTRY_CHAIN] == chain and not duplicates:
            return -1
        j = (j + 1) & mask
    entries[j, ENTRY_END] = end
    entries[j, ENTRY_CHAIN] = chain
    entries[j, ENTRY_BLOCK] = b
    return j


@njit(inline=True)
def unregister(s, b):
    """Drop block ``b``'s key (from the map where it is there: :func:`map_delete`)."""
    s.block_info[b, KEY_END] = 0
    s.count[NUM_CACHED_KEYS] -= 1
    if s.block_info[b, KEY_SLOT] >= 0:  # (a key held out of the map has no row: register)
        map_delete(s.key_entries, s.config[TABLE_MASK], s.block_info[b, KEY_SLOT], s.block_info, KEY_SLOT,
                   s.config[BLOCK_SHIFT])


@njit(inline=True)
def map_delete(entries, mask, i, rows, slot_column, shift=-1):
    """Empty row ``i`` of the map ``entries``; the entries after it in the probe run move back
    where their probe would now stop short (backward shift), each block's row in ``rows`` (its
    ``slot_column``) following its entry."""
    j = i
    while True:
        entries[i, ENTRY_BLOCK] = -1
        while True:
            j = (j + 1) & mask
            if entries[j, ENTRY_BLOCK] < 0:
                return
            h = home_in(mask, entries[j, ENTRY_END], entries[j, ENTRY_CHAIN], shift)
            # the entry at j stays when its home lies cyclically in (i, j]
            if (h > i and h <= j) if i <= j else (h > i or h <= j):
                continue
            break
        entries[i, ENTRY_END] = entries[j, ENTRY_END]
        entries[i, ENTRY_CHAIN] = entries[j, ENTRY_CHAIN]
        entries[i, ENTRY_BLOCK] = entries[j, ENTRY_BLOCK]
        rows[entries[j, ENTRY_BLOCK], slot_column] = i
        i = j


# -- the evictable blocks, oldest first ------------------------------------------------------
@njit(inline=True)
def lru_append(s, b):
    c = s.count
    s.block_info[b, PREV] = c[LRU_TAIL]
    s.block_info[b, NEXT] = -1
    if c[LRU_TAIL] >= 0:
        s.block_info[c[LRU_TAIL], NEXT] = b
    else:
        c[LRU_HEAD] = b
    c[LRU_TAIL] = b
    c[NUM_LRU] += 1


@njit(inline=True)
def lru_remove(s, b):
    c = s.count
    p, n = s.block_info[b, PREV], s.block_info[b, NEXT]
    if p >= 0:
        s.block_info[p, NEXT] = n
    else:
        c[LRU_HEAD] = n
    if n >= 0:
        s.block_info[n, PREV] = p
    else:
        c[LRU_TAIL] = p
    c[NUM_LRU] -= 1


@njit(inline=True)
def v0_evictor(s):
    """vLLM 0.4.2's cache (the v0 scheduler's): every block let go is evictable, full or not,
    and the evictor takes the deepest of the least recently accessed (:func:`evict_oldest`);
    vLLM v1's frees a partial block to be reused first and evicts the least recently freed."""
    return s.config[FAMILY_TRAITS] & EVICTS_ANY_BLOCK != 0


@njit(inline=True)
def evict_oldest(s, run_end):
    """The block to evict for new use, its key dropped if it has one: vLLM v1's least recently
    released (the head); vLLM 0.4.2's ``LRUEvictor.evict`` (``evictor_v1.py:66-84``): from the
    head, in the order released, while no block was accessed later than the one chosen, the one
    of the most hashed tokens (the first of equals). ``run_end``: where the eviction just before
    found that scan to pass the head's run alone, that run's last block (else -1): the scan then
    takes the head, the run's deepest, and so again, the list changed by nothing but these
    evictions, until the run is spent (:func:`v0_victim`). Returns the block and the next
    eviction's ``run_end``."""
    b = s.count[LRU_HEAD]
    if v0_evictor(s):
        if run_end < 0:
            b, run_end = v0_victim(s, b)
        if b == run_end:  # the run spent
            run_end = -1
    lru_remove(s, b)
    s.block_info[b, COMPUTED] = 0  # vLLM 0.4.2's evictor resets it (evictor_v1.py:82)
    if s.block_info[b, KEY_END]:
        unregister(s, b)
        s.count[NUM_EVICTIONS] += 1
    return b, run_end


@njit  # vLLM 0.4.2's, once an eviction: a call
def v0_victim(s, head):
    """``LRUEvictor.evict``'s scan from ``head``, a run at a time: the blocks a request let go
    together with one last access lie one after another, deeper first (``kv_cache.release_seq``),
    so none after a run's first can be chosen over it or end the scan (the same access), and
    the scan goes from a run's first block to the block after its last (``RUN_LAST``, found
    again by walking the run where that one has left the list, revived or evicted). Returns the
    block chosen and, where the scan passed the head's run alone, that run's last block (else
    -1)."""
    info = s.block_info
    chosen = head
    x = head
    head_run_end = -1
    while x >= 0:
        if info[x, ACCESS_STEP] > info[chosen, ACCESS_STEP]:
            break
        if info[x, HASHED_TOKENS] > info[chosen, HASHED_TOKENS]:
            chosen = x
        last = info[x, RUN_LAST]
        if info[last, REF] != 0 or info[last, RUN] != info[x, RUN]:  # it left the list: walk the run
            last = x
            while info[last, NEXT] >= 0 and info[info[last, NEXT], RUN] == info[x, RUN]:
                last = info[last, NEXT]
            y = x
            while True:  # the run's blocks learn their last again
                info[y, RUN_LAST] = last
                if y == last:
                    break
                y = info[y, NEXT]
        head_run_end = last if x == head else -1
        x = info[last, NEXT]
    return chosen, head_run_end


# -- a request's keys --------------------------------------------------------------------------
# the chains of requests' own blocks: negative and apart from one another, within int64 for any
# request count below 3 x 10**9 (interpreted, Python's ints would not wrap); a trace's chains are
# Python's 64-bit hashes, as likely negative: a clash is a 2**-64 chance
OWN_MIX = 0x9E3779B1


@njit(inline=True)
def own_chain(i):
    """The chain in the keys of request ``i``'s own blocks (past its shared prefix)."""
    return -(i + 1) * OWN_MIX - 1


@njit(inline=True)
def is_own(i, chain):
    """Whether a key of ``chain`` is request ``i``'s own (past the prefix hashes it shares with
    another request: :func:`key_chain`): no other request's key has that chain, so none can hit
    it."""
    return chain == own_chain(i)


@njit(inline=True)
def key_chain(s, i, k):
    """The chain hash in block ``k``'s key: the trace's chain of the hash block holding the last
    token the key covers where its prefix hashes name every token of it and another request's
    share them (its chains are cut where none does: ``build.shared_chains``), else the request's
    own. A hash names prompt tokens only: past the prompt (a last hash block the prompt ends inside)
    the tokens are the request's generated ones, which no other request's prompt shares (vLLM
    hashes a block's token ids, kv_cache_utils.py ``hash_block_tokens``; the radix cache's
    ``named_tokens``). The key covers the block's tokens and, under EAGLE or MTP with prefix
    caching, the ``SPEC_HASH_LOOKAHEAD`` tokens after it (:func:`hash_lookahead`), so two prompts
    that part right after a block do not share it."""
    end = (k + 1) * s.config[BLOCK_SIZE] + hash_lookahead(s)
    num_hashes = s.chain_start[i + 1] - s.chain_start[i]
    if end <= min(s.prompt_tokens[i], num_hashes * s.config[HASH_BLOCK_TOKENS]):
        return s.chains[s.chain_start[i] + (end - 1) // s.config[HASH_BLOCK_TOKENS]]
    return own_chain(i)


# A request's own keys (past the prefix hashes it shares with another request) can be hit by nobody
# but the request itself, and only once it has been preempted: vLLM v1 looks a request's blocks up
# only when it is admitted, the first time or back from a preemption (``get_computed_blocks``,
# kv_cache_manager.py:266-328, called for a waiting request, sched/scheduler.py:665-676; a
# preemption frees its blocks, cached: ``_preempt_request``, :1799-1817); vLLM 0.4.2 looks each
# block's hash up as it allocates or promotes it (``CachedBlockAllocator.allocate``,
# block_manager_v1.py:102-120; ``_promote_last_block``, :320-339; a swap-in's, :474-499), where a
# request's own hash can only be there from an earlier run of its own (a preemption or a swap-out
# frees its blocks to the evictor, hashed: :123-133, :509-533). So such a key is held out of the
# map while its request runs (:func:`register`, ``mapped`` off) and goes into it only when the
# request is preempted (:func:`publish`): a finished request's own keys, most keys of a run, never
# cost a map row, and every lookup finds what it would have. Under vLLM v1 the order of a key's
# copies is kept: a request's own key is copied by that request alone, run after run, and each
# run's copies are published before the next run computes its own. vLLM 0.4.2 keeps one block a
# key (a block whose key is there already is not cached): once a request has been preempted its
# keys go into the map as they are cached, where that probe finds an earlier run's.
@njit(inline=True)
def apart(s, i, chain):
    """Whether request ``i``'s key of ``chain`` is held out of the map while it runs."""
    return is_own(i, chain) and (not v0_evictor(s) or s.num_preemptions[i] == 0)


@njit(inline=True)
def find(s, i, k):
    """The block cached under request ``i``'s block ``k``'s key, or -1: its own key (:func:`apart`)
    is in the map only after a preemption of it (:func:`publish`), else none is probed for."""
    chain = key_chain(s, i, k)
    if apart(s, i, chain) and s.num_preemptions[i] == 0:
        return -1
    return lookup(s, (k + 1) * s.config[BLOCK_SIZE], chain)


@njit  # once a preemption: a call
def publish(s, i):
    """Request ``i`` is preempted: its blocks' own keys, held out of the map while it ran
    (:func:`apart`), go into it before its blocks are freed (its readmission looks them up), in
    its table's order (vLLM v1: a key's earlier copies, published at its earlier preemptions,
    stay first)."""
    if keyed_by_group(s):  # (a group's keys are all in the map: register_in_group)
        return
    for j in range(s.num_seqs[i]):
        slot = s.seq_slot[i, j]
        for k in range(s.num_blocks[i]):
            b = s.block_table[slot, k]
            if s.block_info[b, KEY_END] and s.block_info[b, KEY_SLOT] < 0:
                s.block_info[b, KEY_SLOT] = map_insert(s.key_entries, s.config[TABLE_MASK], b,
                                                       s.block_info[b, KEY_END], own_chain(i), True,
                                                       s.config[BLOCK_SHIFT])


# EAGLE's and MTP's block hashes (vLLM 0.33.0): their drafter's KV at a block's last position is
# built from the token after it, so with prefix caching on and no KV connector each block's hash
# covers the next L = num_prefill_lookahead_tokens tokens too (``num_hash_lookahead_tokens``,
# config/vllm.py:677-692; L = 1, K for multi-module MTP, not modelled: :660-675), and that hash
# replaces EAGLE's dropping the hit's last block (scheduler.py:342-345: ``use_eagle_block_drop``
# off, so ``find_longest_cache_hit`` drops nothing, single_type_kv_cache_manager.py:829-831).
# The request's hasher emits a block's hash only once its tokens reach the block's end + L
# (``request_block_hasher``, kv_cache_utils.py:973-979, 996-1000): a lookup walks the hashes it
# has (:func:`hit_limit`), and ``cache_blocks`` caches no block past them
# (single_type_kv_cache_manager.py:501-503; :func:`register_full_blocks`).
@njit(inline=True)
def hash_lookahead(s):
    """L: the tokens after a block its key covers (0 but under EAGLE or MTP with prefix caching)."""
    return s.config[SPEC_HASH_LOOKAHEAD]


@njit(inline=True)
def hit_limit(s, i, prompt_len):
    """At most this many leading blocks can be hits: short of the last prompt token (always
    computed, as vLLM's), and within the blocks hashed once ``prompt_len`` tokens exist (those
    ending ``L`` tokens before it: :func:`hash_lookahead`)."""
    return max(prompt_len - max(1, hash_lookahead(s)), 0) // s.config[BLOCK_SIZE]


@njit
def count_hits(s, i, prompt_len):
    """The leading blocks of request ``i`` found in the cache (at most ``prompt_len - 1``
    tokens' worth), and how many of them are unreferenced (reviving one takes a free block)."""
    hits = 0
    revived = 0
    for k in range(hit_limit(s, i, prompt_len)):
        b = find(s, i, k)
        if b < 0:
            break
        hits += 1
        if s.block_info[b, REF] == 0:
            revived += 1
    return hits, revived


@njit
def held_hits(s, i, prompt_len):
    """Of waiting request ``i``'s leading hits (:func:`count_hits`), those running requests hold:
    the hits less those nobody holds, all an admission's count takes from them
    (``kv_cache.blocks_to_allocate``: a hit nobody holds is taken from the free queue as a fresh
    block is). Its own keys' blocks (past its trace's prefix hashes: :func:`key_chain`) no other
    request can hold, and it holds none while it waits, so the walk stops where they begin: a
    request back from a preemption, its own blocks mostly cached still, waits at the queue's head
    step after step without probing for them."""
    held = 0
    for k in range(hit_limit(s, i, prompt_len)):
        chain = key_chain(s, i, k)
        if is_own(i, chain):
            break
        b = lookup(s, (k + 1) * s.config[BLOCK_SIZE], chain)
        if b < 0:
            break
        if s.block_info[b, REF] != 0:
            held += 1
    return held


@njit(inline=True)
def keyed_by_group(s):
    """Whether each KV cache group keys its own blocks (vLLM's key is the hash and the group id,
    kv_cache_utils.py:60-79): the prefix cache over sliding-window groups, or over Mamba state
    groups in vLLM's "align" mode; then a hit is the groups' together (:func:`group_hits`)."""
    return s.config[SLIDING_GROUPS] > 0 or s.config[MAMBA_ALIGN] > 0


@njit(inline=True)
def register_computed_blocks(s, i, slot, old_len, new_len):
    """Request ``i``'s tokens ``[old_len, new_len)`` were computed into the blocks of ``slot``:
    the blocks they filled are cached, unless their key is there already, each group its own
    where the groups key their own (:func:`register_group_blocks`). vLLM v1's callers only: the
    other families' call :func:`register_full_blocks`, so that their loops never compile the
    groups' code (numba compiles both sides of a test it cannot decide)."""
    if keyed_by_group(s):
        register_group_blocks(s, i, slot, old_len, new_len)
    else:
        register_full_blocks(s, i, slot, old_len, new_len)


@njit
def register_full_blocks(s, i, slot, old_len, new_len):
    """:func:`register_computed_blocks` over one table (no KV cache groups)."""
    if hash_lookahead(s):
        register_hashed_blocks(s, i, slot, new_len, s.prompt_tokens[i] + s.num_generated[i])
        return
    bs = s.config[BLOCK_SIZE]
    for k in range(block_of(s, old_len), block_of(s, new_len)):
        chain = key_chain(s, i, k)
        register(s, s.block_table[slot, k], (k + 1) * bs, chain, not apart(s, i, chain))


def with_hash_lookahead(config):
    """The runs that may call :func:`register_hashed_blocks`: EAGLE or MTP with prefix caching."""
    return config[SPEC_HASH_LOOKAHEAD] > 0


@njit(lazy=with_hash_lookahead)  # compiled apart, the state by reference: no other run carries its code
def register_hashed_blocks(s, i: int, slot: int, computed: int, known: int) -> None:
    """Under a hash lookahead L: request ``i``'s blocks (in ``slot``) that its ``computed`` tokens
    fill and that are hashed once ``known`` tokens exist (its prompt and those it has sampled: a
    block ends ``L`` tokens before them, :func:`hash_lookahead`) are cached, from the first after
    its last cached one (its cached blocks are a leading run: hits, then each block in order), as
    vLLM's ``cache_blocks`` caches the full blocks within the hashes from ``num_cached_block``
    (single_type_kv_cache_manager.py:501-503): a block is cached at the first call past its
    hash, a prompt's block that ends where the prompt does once its first token is sampled."""
    bs = s.config[BLOCK_SIZE]
    last = block_of(s, max(min(computed, known - hash_lookahead(s)), 0))
    first = last
    while first > 0 and not s.block_info[s.block_table[slot, first - 1], KEY_END]:
        first -= 1
    for k in range(first, last):
        chain = key_chain(s, i, k)
        register(s, s.block_table[slot, k], (k + 1) * bs, chain, not apart(s, i, chain))


@njit(inline=True)
def sampled(s, i, emitted):
    """After a step, request ``i`` (running, one sequence) sampled ``emitted`` tokens, not counted
    yet. With drafts vLLM caches each such request's computed blocks at once, within the hashes
    its new tokens complete (``update_from_output``, scheduler.py:2401-2415, when
    ``num_spec_tokens > 0``): under a hash lookahead, the blocks those tokens let be hashed are
    cached before the next pass, which may preempt the request before its own caching."""
    if hash_lookahead(s):
        register_hashed_blocks(s, i, s.seq_slot[i, 0], s.num_computed_tokens[i],
                               s.prompt_tokens[i] + s.num_generated[i] + emitted)


# -- over vLLM v1's KV cache groups (a sliding-window model: kv_cache.py's groups) -------------
# vLLM 0.33.0 (docs/notes/swa-prefix-caching.md): every group keys its own blocks; the full groups
# hit their leading run, the sliding ones a run of window_blocks() ending where the hit ends; a
# sliding group caches only the runs a later hit can end at. The groups are pagesim's: full first.


@njit(inline=True)
def group_chain(chain, g):
    """The chain in group ``g``'s keys: vLLM keys a block by its hash and its group id
    (``BlockHashWithGroupId``, kv_cache_utils.py:60-79), so one prompt's block is cached apart in
    each group (group 0's chain is the plain one; bits 48 up tell the others apart, XOR keeping
    a 64-bit chain in range)."""
    return chain ^ (g << 48)


@njit(inline=True)
def group_lookup(s, i, k, g):
    """The block cached under request ``i``'s block ``k``'s key in group ``g``, or -1."""
    return lookup(s, (k + 1) * s.config[BLOCK_SIZE], group_chain(key_chain(s, i, k), g))


@njit(inline=True)
def cached_in_groups(s, i, k, first, last):
    """Whether request ``i``'s block ``k`` is cached in each of groups ``[first, last)``: the
    groups of one spec search as one, a block a hit only where every one of them has it
    (``get_cached_block``, block_pool.py:202-228; the groups merged, kv_cache_coordinator.py:718-750)."""
    for g in range(first, last):
        if group_lookup(s, i, k, g) < 0:
            return False
    return True


@njit(inline=True)
def window_blocks(s):
    """The cached blocks in a row a sliding group's hit needs, ``cdiv(window - 1, block_size)``
    (``_contiguous_blocks_for_hit``, single_type_kv_cache_manager.py:955-966)."""
    bs = s.config[BLOCK_SIZE]
    return (s.config[SLIDING_WINDOW] - 1 + bs - 1) // bs


@njit
def group_hits(s, i, num_tokens):
    """Request ``i``'s prefix-cache hit over the groups, looked up with ``num_tokens`` tokens, at
    most ``num_tokens - 1`` (``get_computed_blocks``, kv_cache_manager.py:266-328): (its blocks, the
    shared-prefix junction in blocks, 0 for none). The full groups find their leading run
    (``FullAttentionManager.find_longest_cache_hit``, single_type_kv_cache_manager.py:742-838),
    which bounds the sliding groups' search (kv_cache_coordinator.py:869; one pass: one full and
    one sliding spec, :836-840, :916-917): from that bound's last block down, the first
    ``window_blocks`` cached in a row end the hit, else the leading run from block 0
    (``SlidingWindowManager.find_longest_cache_hit``, :968-1064). State groups (MAMBA_ALIGN) search
    the same way for one block, their state: the rightmost cached in every state group ends the hit
    (``MambaManager.find_longest_cache_hit``, :1470-1547), else none. The junction is the full
    groups' hit where it is longer (``num_uncached_common_prefix_tokens``, kv_cache_coordinator.py:
    934-937; kv_cache_manager.py:318-328); a model without full groups has none (the unitary
    coordinator, :582-599)."""
    full = s.config[FULL_GROUPS]
    groups = full + s.config[SLIDING_GROUPS] + (s.config[STATE_GROUPS] if s.config[MAMBA_ALIGN] else 0)
    limit = hit_limit(s, i, num_tokens)
    if full:
        k = 0
        while k < limit and cached_in_groups(s, i, k, 0, full):
            k += 1
        limit = k
    need = 1 if s.config[MAMBA_ALIGN] else window_blocks(s)
    run = 0
    for k in range(limit - 1, -1, -1):
        if not cached_in_groups(s, i, k, full, groups):
            run = 0
            continue
        run += 1
        if run >= need:
            return k + run, limit if full and limit > k + run else 0
    return run, limit if full and limit > run else 0


@njit(inline=True)
def register_in_group(s, b, end, chain, g):
    """Cache block ``b`` of group ``g`` under ``(end, chain)`` in that group (:func:`register`)."""
    register(s, b, end, group_chain(chain, g))
    s.block_info[b, KEY_GROUP] = g


@njit(lazy=several_groups)
def register_group_blocks(s, i: int, slot: int, old_len: int, new_len: int) -> None:
    """:func:`register_full_blocks` over the groups: each full group caches every block the tokens
    filled (no mask, single_type_kv_cache_manager.py:544-569); a sliding group only those a later
    hit can end at, the ``window_blocks`` before the replay boundary ``prompt - 1`` and the
    ``window_blocks`` before its junction (``reachable_block_mask``, :1066-1146, retention 0;
    ``replay_boundaries``, kv_cache_coordinator.py:65-86). A block passed over is never cached
    later: vLLM's ``num_cached_block`` moves past it (:542)."""
    bs, full = s.config[BLOCK_SIZE], s.config[FULL_GROUPS]
    groups = full + s.config[SLIDING_GROUPS]
    width = s.block_table.shape[1] // (groups + s.config[STATE_GROUPS])
    align = s.config[MAMBA_ALIGN]
    need = 1 if align else window_blocks(s)
    replay = (s.prompt_tokens[i] - 1) // bs
    junction = s.window[i, WINDOW_JUNCTION] // bs
    for k in range(block_of(s, old_len), block_of(s, new_len)):
        chain = key_chain(s, i, k)
        reachable = replay - need <= k < replay or (junction > 0 and junction - need <= k < junction)
        for g in range(groups if reachable and not align else full):
            register_in_group(s, s.block_table[slot, g * width + k], (k + 1) * bs, chain, g)
        if align and reachable:
            register_state(s, slot, k, chain)


@njit
def register_state(s, slot, k, chain):
    """MAMBA_ALIGN: the state at column ``k`` of ``slot``'s state groups, where it has one (a null
    column is never cached: block_pool.py:276-282), cached in each group under block ``k``'s key
    when the chunk reaching it is scheduled (kv_cache_manager.py:619-625), and marked cached in this
    step on the block a lookup of the key finds, the earliest cached (``cached_blocks_this_step``,
    single_type_kv_cache_manager.py:1986-2011)."""
    bs, first = s.config[BLOCK_SIZE], s.config[FULL_GROUPS] + s.config[SLIDING_GROUPS]
    width = s.block_table.shape[1] // (first + s.config[STATE_GROUPS])
    for g in range(first, first + s.config[STATE_GROUPS]):
        b = s.block_table[slot, g * width + k]
        if b < 0:
            continue
        register_in_group(s, b, (k + 1) * bs, chain, g)
        s.block_info[b, STATE_CACHED_STEP] = s.count[SCHEDULED_STEPS]
        found = lookup(s, (k + 1) * bs, group_chain(chain, g))
        if found >= 0:
            s.block_info[found, STATE_CACHED_STEP] = s.count[SCHEDULED_STEPS]


@njit(inline=True)
def state_cached_now(s, b):
    """MAMBA_ALIGN: whether state block ``b`` was cached in this step (:func:`register_state`)."""
    return 0 < s.block_info[b, STATE_CACHED_STEP] == s.count[SCHEDULED_STEPS]  # (steps count from 1)


@njit(inline=True)
def step_starts(s):
    """vLLM v1 schedules a new step: in Mamba "align" mode no state is cached in it yet
    (``new_step_starts``, sched/scheduler.py:746; :func:`state_cached_now`)."""
    if s.config[MAMBA_ALIGN]:
        s.count[SCHEDULED_STEPS] += 1


@njit
def hit_tokens(s, i, target):
    """The tokens request ``i``'s prefix-cache hits cover, looked up with ``target`` tokens, before
    it takes them (vLLM v1's ``get_computed_blocks``, kv_cache_manager.py:266-328); 0 without
    prefix caching."""
    if not s.config[PREFIX_CACHING]:
        return 0
    if keyed_by_group(s):
        hits, _ = group_hits(s, i, target)
    else:
        hits, _ = count_hits(s, i, target)
    return hits * s.config[BLOCK_SIZE]
