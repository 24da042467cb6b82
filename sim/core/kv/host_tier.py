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
(``Core.host_entries``, ``prefix_cache``'s open addressing), and ranks (``Core.host_blocks``) kept
in lists in rank order (``Core.host_blocks``' ``HOST_GROUP``, ``HOST_PREV``, ``HOST_NEXT``).

**What is stored, and when** (``_build_store_jobs``, scheduler.py:1815-2101): each step, every
scheduled request offers the prompt blocks its step fills (``num_computed + scheduled`` tokens, cut
to the prompt: ``offload_prompt_only`` is True by default, kv_offload/base.py:725-731,
scheduler.py:762-771), from where its offers stopped; an admission starts them at its first block
(scheduler.py:1241-1244), GPU prefix hits included, and past its host hits when it loads
(``CHUNK_LEVEL``, scheduler.py:1468-1472). The step's offers are made once its scheduling pass has
made every lookup, in scheduling order (``build_connector_meta``, scheduler.py:2168, after
``schedule``'s lookups, v1 scheduler.py:1139: :func:`offer_scheduled`), so a store cannot
evict what a later admission of the same pass finds. A block the tier holds is only touched; a new
one takes a free host block or evicts the LRU head (``prepare_store``, cpu/manager.py:262-360). Its
bytes go GPU -> host on the link's store direction, in submission order
(``SingleDirectionOffloadingHandler``, cpu/gpu_worker.py:284-289, one handler per direction
:872-875): a lookup finds it once they are there (a chunk is not ready before ``complete_store``,
cpu/manager.py:197-205, 362-380).

**A hit.** At admission, past the GPU prefix cache's hits, the consecutive blocks the tier holds
ready extend the prefix (``_maximal_prefix_lookup``, scheduler.py:773-803), up to the request's
last full block, past the GPU's limit of ``prompt - 1`` tokens: a prompt that ends on a block
boundary loads its last block and recomputes its last token (:func:`hit_limit`,
:func:`start_load`). The request's GPU blocks for the whole hit are taken
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

**With speculative decoding** (n-gram or a draft model; EAGLE and MTP are refused: vLLM keeps a
drafter group's trailing chunk off the tier, offloading/scheduler.py:207-240): a load schedules no
token, so it is neither padded to ``1 + K`` nor given its lookahead slots (v1 scheduler.py:1285-1288,
:1395-1400), and it leaves one verification step's blocks free beside the prefills in flight's,
each of which lacks such a step's slots past its sequence too (:371-381, :3404-3420:
:func:`reserved_blocks`); a prefill stays in flight until the pass that schedules its last chunk
ends (:func:`prefilling`). Once its KV has arrived its first step is padded and takes its
lookahead slots as any admission's (``scheduler_v1.holding_step``). Drafts never reach the prompt
blocks the tier stores.

**LRU order** (cpu/policies/lru.py): each block has a rank, the lowest evicted first. A request
takes a number from the tier's one counter at its first store or load, kept for its life; a block
it stores ranks (its number, -the block's end token), and one it reads (a ready block it offers
again, or loads) rises to that rank where it was lower, the first time the request uses its key
(``insert``, ``on_request_access``, lru.py:108-153; the keys a request has recorded,
cpu/manager.py:163-183: :func:`record`): a running request's blocks rank together, its deepest
first. When a request finishes, the keys it recorded in its life (an offer's new ones, stored or
not, and those the tier held ready; a load's) are touched from its deepest to its first,
each a new number, so its first block is the most recent (``on_request_finished``, lru.py:155-166,
``order_request_keys``, policies/base.py:8-20; cpu/manager.py:422-452). A block whose store has
not landed, or being loaded, is pinned (``ref_cnt``, cpu/manager.py:213-261, 362-380), and the
blocks of the offer being stored are protected; a request's offer is stored whole or, where too
few blocks can be evicted, not at all, and made again at its next step and as it finishes
(cpu/manager.py:321-340; offloading/scheduler.py:1821-1836, 1988-1999).

**Not modelled** (approximations, each small against a store or load of many blocks): a block
whose store has not landed ends the hit where vLLM defers the request a step (``HIT_PENDING``,
scheduler.py:786-802); a store counts from the step that computes it where vLLM submits it at the
next step's start (worker.py ``prepare_store_kv``); the
requests one step finished touch their blocks in finishing order (vLLM: a Python set's); a finished
request's last store is made from blocks its release already freed (vLLM holds them until it
lands).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import kv_cache, prefix_cache
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, COMPUTED_SLOTS, HOST_BLOCKS, HOST_BLOCK_S, HOST_EVICTIONS,
                                    HOST_HIT_TOKENS, HOST_LOADED_BLOCKS, HOST_STORED_BLOCKS, HOST_USED,
                                    LOAD_LINK_FREE_S, NOW, STEP_PREFILL_SEQS, STORE_LINK_FREE_S,
                                    WAITING_HEAD)
from pagesim.sim.core.state import (FINISHED, KV_HOLDING_WAITING, NUM_RUNNING, SPEC_LOOKAHEAD, SPEC_TOKENS,
                                    STEP_NUM_FINISHED)
from pagesim.sim.core.state import DECODE_SIDE, DISAGG_ROLE
from pagesim.sim.core.state import section, table

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    HOST_TABLE_MASK     the host tier's keys' hash table size less one (a power of two)
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    HOST_LAST_RANK      the last rank given in the host tier's LRU (a request's, or a touch's)
    HOST_GROUPS         the requests whose blocks rank by them, in Core.host_work's heap (GROUP_HEAP)
    HOST_TOUCHED_HEAD   the first (lowest-ranked) block of the host LRU's touched list (-1: none)
    HOST_TOUCHED_TAIL   and its last
    HOST_PENDING_HEAD   the host tier's first block whose store has not landed (in Core.host_work's ring of
        them, PENDING_BLOCK: they land in the order they were stored)
    HOST_PENDING_LEN    those blocks
    HOST_REFUSED        1 from a store refused until no running request's offers lag (its blocks
        offered again at its next step: host_tier.offer_scheduled)
    NUM_LOADING         requests waiting for their host blocks to load (in the waiting queue's
        holding part, holding GPU blocks: vLLM's WAITING_FOR_REMOTE_KVS)
""")

# Core.host_blocks (the host tier): a host block's row
table("host_blocks", """
    HOST_RANK           its rank in the LRU (the lowest evicted first: host_tier.py)
    HOST_PENDING        1 while its store has not landed (host_tier.land): it cannot be evicted
    HOST_KEY_SLOT       its key's row in Core.host_entries
    HOST_KEY_END        its key's end token
    HOST_KEY_CHAIN      its key's chain
    HOST_GROUP          the list holding it, in rank order: the request it ranks by, or -1 (the
        touched list)
    HOST_PREV           the block before it there (-1: it is the first)
    HOST_NEXT           and after it (-1: it is the last)
""", size="HOST_BLOCK_COLUMNS", into=globals())

# Core.host_work: this file's entries, in its room of the shared table (sim/core/state.py)
section("host_work", globals(), """
    GROUP_HEAP          a request whose blocks rank by it, in a min-heap by its number (HOST_GROUPS)
    KEPT_GROUP          a group evict took off the heap while passing it, put back after
    CHOSEN_BLOCK        a block evict chose
    NEW_BLOCK           a block of an offer the tier does not hold (host_tier.store)
    PENDING_BLOCK       a block whose store has not landed, in a ring (HOST_PENDING_*)
""")

# Core.offload (the host tier; a disaggregated decode side's OFFLOAD_PREFILLING; one row elsewhere):
# per request
table("offload", """
    OFFLOAD_OFFERED     its leading prompt blocks offered to the host tier since its admission
    OFFLOAD_LOADING     its host blocks being loaded (0: none; it waits in the queue's holding part)
    OFFLOAD_GPU_HITS    its GPU prefix hits at that admission, in blocks
    OFFLOAD_RANK        its rank in the host tier's LRU, given at its first store or load (0: none)
    OFFLOAD_SEEN_AT     its first entry in Core.host_seen (one for each of its prompt blocks)
    OFFLOAD_FRONT       the first (lowest-ranked, its deepest) of the host blocks ranking by it (-1: none)
    OFFLOAD_HEAP_AT     its place in the heap of groups (GROUP_HEAP; -1: not there)
    OFFLOAD_PREFILLING  1 while vLLM counts it a prefill in flight (host_tier.reserved_blocks)
""", size="OFFLOAD_COLUMNS", into=globals())


@njit(inline=True)
def with_tier(config):
    """The runs with a host tier: the only ones that reach the tier's code, and so compile its
    larger functions (``njit``'s lazy: the others never compile them)."""
    return config[HOST_BLOCKS] > 0


@njit(inline=True)
def asynchronous_loads(config):
    """:func:`loads_async` by the run's ``config``: a host tier's loads, and a disaggregated
    decode side's transfers (any connector's ``load_kv_async``, v1 scheduler.py:1420-1430, 1542);
    the runs that may call :func:`reserved_blocks` and :func:`next_load_end` (``njit``'s lazy)."""
    return config[HOST_BLOCKS] > 0 or config[DISAGG_ROLE] == DECODE_SIDE


@njit(inline=True)
def find(s, i, k):
    """The host block holding request ``i``'s block ``k`` (its GPU key), or -1. A prompt block's
    entry in ``Core.host_seen`` (:func:`record`) keeps the host block the request last found or
    stored its key in, checked before the map is probed: a finish's touches and a store's new
    blocks then read the request's own entries, in order, instead of probing the map at random
    (the tier's cost was its map's cache misses). A key of the request's own (past the trace's
    prefix hashes) is stored by no other request, and its store keeps the entry: its entry alone
    names it (such keys are not in the map: :func:`store`), and where the entry names no block
    holding it, the tier does not hold it."""
    end, chain = (k + 1) * s.config[BLOCK_SIZE], prefix_cache.key_chain(s, i, k)
    prompt = k < s.prompt_tokens[i] // s.config[BLOCK_SIZE]
    if prompt:
        b = (s.host_seen[s.offload[i, OFFLOAD_SEEN_AT] + k] >> 1) - 1
        if b >= 0 and s.host_blocks[b, HOST_KEY_END] == end and s.host_blocks[b, HOST_KEY_CHAIN] == chain:
            return b
        if not mapped(i, chain):
            return -1
    b = prefix_cache.map_lookup(s.host_entries, s.config[HOST_TABLE_MASK], end, chain)
    if prompt and b >= 0:
        remember(s, i, k, b)
    return b


@njit(inline=True)
def mapped(i, chain):
    """Whether request ``i``'s key of this chain is kept in the map: a key of the trace's prefix
    hashes, which other requests share; not one of its own (:func:`find`)."""
    return not prefix_cache.is_own(i, chain)


@njit(inline=True)
def remember(s, i, k, b):
    """Request ``i``'s prompt block ``k`` has its key in host block ``b`` (:func:`find`)."""
    at = s.offload[i, OFFLOAD_SEEN_AT] + k
    s.host_seen[at] = (b + 1) << 1 | s.host_seen[at] & 1


# -- the LRU: ranks, and lists in rank order ---------------------------------------------------
#: a rank is (a request's or a touch's number) x RANK_SPAN - (the block's end token): vLLM's
#: (rank, -position) pairs (lru.py:108-121) in one integer, the end token below RANK_SPAN
RANK_SPAN = 1 << 31


@njit(inline=True)
def next_rank(s):
    """The next number of the tier's one counter (lru.py ``_next_rank``)."""
    s.count[HOST_LAST_RANK] += 1
    return s.count[HOST_LAST_RANK]


@njit(inline=True)
def request_rank(s, i):
    """Request ``i``'s number, taken at its first store or load and kept for its life
    (``_get_request_rank``, lru.py:50-60): its blocks rank together, by it."""
    r = s.offload[i, OFFLOAD_RANK]
    if r == 0:
        r = next_rank(s)
        s.offload[i, OFFLOAD_RANK] = r
    return r


# vLLM keeps the ranks in a heap, pushing an entry at each rise and passing over stale ones
# (lru.py:62-86). Here every block holding a key is in one list in rank order, which gives the same
# order at O(1) a store, rise or touch:
# - the touched list: a touch takes the counter's next number, the highest rank given, so it goes
#   to the list's end;
# - a request's group: the blocks ranking by its number, its deepest (lowest) first. Its blocks
#   are stored and read first to deepest, so each new one goes to the front (a readmission's
#   re-store walks to its place);
# - a heap of the non-empty groups by their numbers (an entry per request holding blocks, not per
#   block).
# The lowest rank is the lower of the touched list's first block and the lowest group's. A block
# whose store has not landed is in its list too, and passed over as pinned, so a touch before it
# lands puts it where vLLM's rank puts it when it lands.
@njit(inline=True)
def group_rank(s, i):
    """Group ``i``'s number: its request's (given at its first store or load)."""
    return s.offload[i, OFFLOAD_RANK]


@njit
def group_place(s, i, k):
    """Put group ``i`` at heap place ``k`` and sift it up or down to its place by its number."""
    heap, n, rank = s.host_work[GROUP_HEAP], s.count[HOST_GROUPS], group_rank(s, i)
    while k > 0 and group_rank(s, heap[(k - 1) // 2]) > rank:  # the parents above it move down
        parent = heap[(k - 1) // 2]
        heap[k] = parent
        s.offload[parent, OFFLOAD_HEAP_AT] = k
        k = (k - 1) // 2
    while 2 * k + 1 < n:  # the lower child moves up until it ranks below them
        low = 2 * k + 1
        if low + 1 < n and group_rank(s, heap[low + 1]) < group_rank(s, heap[low]):
            low += 1
        if group_rank(s, heap[low]) >= rank:
            break
        heap[k] = heap[low]
        s.offload[heap[k], OFFLOAD_HEAP_AT] = k
        k = low
    heap[k] = i
    s.offload[i, OFFLOAD_HEAP_AT] = k


@njit
def group_push(s, i):
    """Group ``i`` (not empty now) into the heap."""
    s.count[HOST_GROUPS] += 1
    group_place(s, i, s.count[HOST_GROUPS] - 1)


@njit
def group_drop(s, i):
    """Group ``i`` out of the heap (the last entry takes its place)."""
    c, heap = s.count, s.host_work[GROUP_HEAP]
    k = s.offload[i, OFFLOAD_HEAP_AT]
    s.offload[i, OFFLOAD_HEAP_AT] = -1
    c[HOST_GROUPS] -= 1
    if k < c[HOST_GROUPS]:
        group_place(s, heap[c[HOST_GROUPS]], k)


@njit(inline=True)
def join(s, group, before, after):
    """``before`` then ``after`` next to each other in list ``group``; -1 for one is the list's end,
    the other becoming its first or last (a group keeps its first alone)."""
    h = s.host_blocks
    if after >= 0:
        h[after, HOST_PREV] = before
    elif group < 0:
        s.count[HOST_TOUCHED_TAIL] = before
    if before >= 0:
        h[before, HOST_NEXT] = after
    elif group < 0:
        s.count[HOST_TOUCHED_HEAD] = after
    else:
        s.offload[group, OFFLOAD_FRONT] = after


@njit(inline=True)
def unlink(s, b):
    """Host block ``b`` out of its list (a group left empty leaves the heap)."""
    group = s.host_blocks[b, HOST_GROUP]
    join(s, group, s.host_blocks[b, HOST_PREV], s.host_blocks[b, HOST_NEXT])
    if group >= 0 and s.offload[group, OFFLOAD_FRONT] < 0:
        group_drop(s, group)


@njit(inline=True)
def link(s, b, group, before, after):
    """Host block ``b`` into list ``group`` between ``before`` and ``after`` (-1: an end; a group
    that was empty joins the heap)."""
    empty = group >= 0 and s.offload[group, OFFLOAD_FRONT] < 0
    s.host_blocks[b, HOST_GROUP] = group
    join(s, group, before, b)
    join(s, group, b, after)
    if empty:
        group_push(s, group)


@njit(inline=True)
def rank_of(s, i, k):
    """The rank request ``i`` gives its block ``k``: (its number, -the block's end token)."""
    return request_rank(s, i) * RANK_SPAN - (k + 1) * s.config[BLOCK_SIZE]


@njit(inline=True)
def rank_by(s, i, b, k):
    """Host block ``b``, request ``i``'s block ``k``, ranks by the request, its deeper blocks
    first: into its group, before the shallower ones."""
    h = s.host_blocks
    h[b, HOST_RANK] = rank_of(s, i, k)
    before, after = -1, s.offload[i, OFFLOAD_FRONT]
    while after >= 0 and h[after, HOST_RANK] < h[b, HOST_RANK]:
        before, after = after, h[after, HOST_NEXT]
    link(s, b, i, before, after)


@njit(inline=True)
def pend(s, b):
    """Host block ``b``'s store is queued: it cannot be evicted until it lands (``ref_cnt`` -1)."""
    c = s.count
    s.host_blocks[b, HOST_PENDING] = 1
    s.host_work[PENDING_BLOCK, (c[HOST_PENDING_HEAD] + c[HOST_PENDING_LEN]) % s.config[HOST_BLOCKS]] = b
    c[HOST_PENDING_LEN] += 1


@njit(inline=True)
def land(s):
    """The stores landed by now: their blocks can be evicted (``complete_store``,
    ``mark_evictable``: cpu/manager.py:362-380, lru.py:220-228). The link stores one block after
    another, so they land in the order they were stored."""
    c = s.count
    while c[HOST_PENDING_LEN]:
        b = s.host_work[PENDING_BLOCK, c[HOST_PENDING_HEAD]]
        if s.host_ready_s[b] > s.clock[NOW]:
            return
        c[HOST_PENDING_HEAD] = (c[HOST_PENDING_HEAD] + 1) % s.config[HOST_BLOCKS]
        c[HOST_PENDING_LEN] -= 1
        s.host_blocks[b, HOST_PENDING] = 0


@njit(inline=True)
def landed(s):
    """The host blocks whose stores have landed: a bound on those that can be evicted."""
    return s.count[HOST_USED] - s.count[HOST_PENDING_LEN]


@njit(inline=True)
def touch(s, b):
    """Host block ``b`` becomes the most recently used: a number of its own
    (``_assign_new_rank``, lru.py:62-67), the touched list's last."""
    unlink(s, b)
    s.host_blocks[b, HOST_RANK] = next_rank(s) * RANK_SPAN
    link(s, b, -1, s.count[HOST_TOUCHED_TAIL], -1)


@njit(inline=True)
def access(s, i, b, k):
    """Request ``i`` reads or offers host block ``b``, its block ``k``: the first time in its life
    (:func:`record`) the block ranks at least by the request, its deeper blocks first
    (``on_request_access``, lru.py:133-153)."""
    if record(s, i, k) and rank_of(s, i, k) > s.host_blocks[b, HOST_RANK]:
        unlink(s, b)
        rank_by(s, i, b, k)


@njit(inline=True)
def record(s, i, k):
    """Request ``i`` offers or loads its block ``k``'s key (an offer's new keys, stored or not,
    and those the tier holds ready; a load's): True the first time in its life, when vLLM records
    it (``_record_request_cache_access``, cpu/manager.py:163-183, 303-310; its ``seen_keys`` last
    the request's life, :36-47). Its finish touches the keys recorded."""
    at = s.offload[i, OFFLOAD_SEEN_AT] + k  # (k is a prompt block: only those are offered, or held)
    if s.host_seen[at] & 1:  # (the bit above it: find's host block)
        return False
    s.host_seen[at] |= 1
    return True


@njit(inline=True)
def pinned(s, b):
    """Whether host block ``b`` cannot be evicted now: its store has not landed (``ref_cnt`` -1
    until ``complete_store``) or a request is loading it (``ref_cnt`` > 0 until
    ``complete_load``: cpu/manager.py:213-261, 362-380)."""
    if s.host_blocks[b, HOST_PENDING]:
        return True
    k = s.host_blocks[b, HOST_KEY_END] // s.config[BLOCK_SIZE] - 1
    c = s.count
    for p in range(c[KV_HOLDING_WAITING]):
        j = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        first, end = loading_blocks(s, j)
        if first <= k < end and prefix_cache.key_chain(s, j, k) == s.host_blocks[b, HOST_KEY_CHAIN]:
            return True
    return False


@njit(inline=True)
def loading_blocks(s, j):
    """Request ``j``'s blocks whose load runs now: ``first..end`` (empty when none)."""
    if not s.offload[j, OFFLOAD_LOADING] or s.load_ready_s[j] <= s.clock[NOW]:
        return 0, 0
    first = s.offload[j, OFFLOAD_GPU_HITS]
    return first, first + s.offload[j, OFFLOAD_LOADING]


@njit(inline=True)
def offered_by(s, i, b, first, end):
    """Whether host block ``b`` holds one of request ``i``'s blocks ``first..end``."""
    k = s.host_blocks[b, HOST_KEY_END] // s.config[BLOCK_SIZE] - 1
    return first <= k < end and prefix_cache.key_chain(s, i, k) == s.host_blocks[b, HOST_KEY_CHAIN]


@njit(lazy=with_tier)
def evict(s, n: int, i: int, first: int, end: int) -> bool:
    """The ``n`` lowest-ranked blocks that can be evicted, passed over request ``i``'s offer
    (blocks ``first..end``: ``protected``), into ``host_work[CHOSEN_BLOCK, :n]`` and out of their
    lists; where fewer are, none is taken and False is returned (``evict``, lru.py:178-218;
    cpu/manager.py:321-340). The touched list and the groups are walked together, lowest first."""
    c, h, work = s.count, s.host_blocks, s.host_work
    touched = c[HOST_TOUCHED_HEAD]
    grouped = s.offload[work[GROUP_HEAP, 0], OFFLOAD_FRONT] if c[HOST_GROUPS] else -1
    passed = 0  # groups walked past, off the heap until the walk ends (KEPT_GROUP)
    found = 0
    while found < n:
        if grouped >= 0 and (touched < 0 or h[grouped, HOST_RANK] < h[touched, HOST_RANK]):
            b, grouped = grouped, h[grouped, HOST_NEXT]
            if grouped < 0:  # the group walked past: the next lowest
                group = work[GROUP_HEAP, 0]
                group_drop(s, group)
                work[KEPT_GROUP, passed] = group
                passed += 1
                grouped = s.offload[work[GROUP_HEAP, 0], OFFLOAD_FRONT] if c[HOST_GROUPS] else -1
        elif touched >= 0:
            b, touched = touched, h[touched, HOST_NEXT]
        else:
            break
        if not (pinned(s, b) or offered_by(s, i, b, first, end)):
            work[CHOSEN_BLOCK, found] = b
            found += 1
    for k in range(passed):
        group_push(s, work[KEPT_GROUP, k])
    if found < n:
        return False
    for k in range(n):
        unlink(s, work[CHOSEN_BLOCK, k])
    return True


@njit(inline=True)
def hit_limit(s, num_tokens):
    """At most this many leading blocks of a request of ``num_tokens`` tokens can be the tier's
    hits: every full one, its last token's too (``_lookup_complete_chunks`` bounds a hit by
    ``req.num_tokens``, offloading/scheduler.py:862, to whole chunks, :898-906), one block past
    the GPU's limit of ``num_tokens - 1`` where the tokens end on a block boundary; such a hit
    then recomputes the last token alone (:func:`start_load`)."""
    return num_tokens // s.config[BLOCK_SIZE]


@njit(lazy=with_tier)
def count_hits(s, i: int, first: int, limit: int) -> int:
    """Request ``i``'s consecutive blocks from ``first`` (its GPU hits) below ``limit`` that the
    tier holds, their stores landed."""
    k = first
    while k < limit:
        b = find(s, i, k)
        if b < 0 or s.host_ready_s[b] > s.clock[NOW]:
            break
        k += 1
    return k - first


@njit(lazy=with_tier)
def start_load(s, i: int, gpu_hits: int, host_hits: int) -> None:
    """Request ``i`` was given GPU blocks for ``gpu_hits + host_hits`` blocks, the GPU's hits
    holding theirs: the host hits' tokens count as computed into its blocks, their bytes load
    from now, queued on the load direction, and it waits for them (module docstring). A hit of
    all its tokens (:func:`hit_limit`) leaves the last to compute, so that the next one can be
    sampled: vLLM counts it computed once the load is over (``_update_waiting_for_remote_kv``,
    v1 sched/scheduler.py:3515-3516; the loaded blocks cached first, :3501), here at once."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    for k in range(gpu_hits, gpu_hits + host_hits):  # read by it (prepare_load, cpu/manager.py:213-238)
        access(s, i, find(s, i, k), k)
    loaded = min(host_hits * bs, s.prompt_target[i] - 1 - s.num_computed_tokens[i])
    s.num_computed_tokens[i] += loaded
    c[COMPUTED_SLOTS] += loaded
    start = max(s.clock[NOW], s.clock[LOAD_LINK_FREE_S])
    s.clock[LOAD_LINK_FREE_S] = start + host_hits * s.clock[HOST_BLOCK_S]
    s.load_ready_s[i] = s.clock[LOAD_LINK_FREE_S]
    s.offload[i, OFFLOAD_LOADING] = host_hits
    s.offload[i, OFFLOAD_GPU_HITS] = gpu_hits
    s.offload[i, OFFLOAD_OFFERED] = gpu_hits + host_hits
    c[NUM_LOADING] += 1
    c[HOST_HIT_TOKENS] += host_hits * bs
    c[HOST_LOADED_BLOCKS] += host_hits


@njit(inline=True)
def loading_seat(s, i):
    """Whether request ``i`` holds a seat counted in ``NUM_LOADING``: a host load's, from
    :func:`start_load` to :func:`end_load` (a transfer's, a disaggregated decode side's, is not)."""
    return with_tier(s.config) and s.offload[i, OFFLOAD_LOADING] > 0


@njit(lazy=with_tier)
def end_load(s, i: int) -> int:
    """Request ``i``'s load is over and it is admitted: the loaded blocks join the GPU prefix
    cache (``cache_blocks``); returns the tokens it holds computed."""
    bs = s.config[BLOCK_SIZE]
    first = s.offload[i, OFFLOAD_GPU_HITS]
    prefix_cache.register_computed_blocks(s, i, s.seq_slot[i, 0], first * bs,
                                          (first + s.offload[i, OFFLOAD_LOADING]) * bs)
    s.offload[i, OFFLOAD_LOADING] = 0
    s.count[NUM_LOADING] -= 1
    return s.num_computed_tokens[i]


@njit(inline=True)
def offer(s, i, computed):
    """Request ``i``'s prompt blocks its ``computed`` tokens fill, from where its offers stopped, go
    to the tier at once (``_build_store_jobs``, ``prepare_store``, cpu/manager.py:262-360): the
    ones it holds ready are read by the request (:func:`access`; one whose store has not landed
    is passed over), the new ones take free host blocks or the lowest-ranked that can be evicted,
    not the offer's own; where too few can, none is stored and the offer is made again at the
    next step (``None``: offloading/scheduler.py:1988-1999). Each stored block ranks by the
    request, its bytes queued on the store direction."""
    end = offer_end(s, i, computed)
    if s.offload[i, OFFLOAD_OFFERED] < end:  # (each scheduled request, each step: a call only with blocks to offer)
        store(s, i, s.offload[i, OFFLOAD_OFFERED], end)


@njit(inline=True)
def offer_end(s, i, computed):
    """One past the last prompt block of request ``i`` that ``computed`` tokens fill (prompt
    blocks only: ``offload_prompt_only``)."""
    return min(computed, s.prompt_tokens[i]) // s.config[BLOCK_SIZE]


@njit(lazy=with_tier)
def store(s, i: int, first: int, end: int) -> None:
    """:func:`offer`'s blocks ``first..end``."""
    c, bs = s.count, s.config[BLOCK_SIZE]
    land(s)
    new = 0
    for k in range(first, end):  # (a key whose store has not landed is passed over: cpu/manager.py:275-280)
        b = find(s, i, k)
        if b < 0:
            if record(s, i, k):  # recorded before its store may fail (cpu/manager.py:303-310)
                request_rank(s, i)  # (on_request_access takes the request's number: lru.py:138)
            if new < s.config[HOST_BLOCKS]:  # (more cannot be stored: the store fails below)
                s.host_work[NEW_BLOCK, new] = k
            new += 1
        elif s.host_ready_s[b] <= s.clock[NOW]:
            access(s, i, b, k)
    if new:
        evicting = new - (s.config[HOST_BLOCKS] - c[HOST_USED])
        # more than the landed blocks (a bound on the evictable ones) fails at once, as vLLM's
        # count of them does (cpu/manager.py:321-324); else evict may find too few
        if evicting > landed(s) or evicting > 0 and not evict(s, evicting, i, first, end):
            c[HOST_REFUSED] = 1  # offered again at its next step (:func:`offer_scheduled`)
            return
        for taken in range(new):
            k = s.host_work[NEW_BLOCK, taken]
            if c[HOST_USED] < s.config[HOST_BLOCKS]:
                b = c[HOST_USED]  # the next fresh host block (cpu/manager.py:95-112)
                c[HOST_USED] += 1
            else:  # an evicted one, its key dropped (from the map, where it was: find)
                b = s.host_work[CHOSEN_BLOCK, taken - (new - evicting)]
                if s.host_blocks[b, HOST_KEY_SLOT] >= 0:
                    prefix_cache.map_delete(s.host_entries, s.config[HOST_TABLE_MASK],
                                            s.host_blocks[b, HOST_KEY_SLOT], s.host_blocks, HOST_KEY_SLOT)
                c[HOST_EVICTIONS] += 1
            end_token, chain = (k + 1) * bs, prefix_cache.key_chain(s, i, k)
            s.host_blocks[b, HOST_KEY_SLOT] = -1  # a key of the request's own: its entry alone names it (find)
            if mapped(i, chain):
                s.host_blocks[b, HOST_KEY_SLOT] = prefix_cache.map_insert(s.host_entries, s.config[HOST_TABLE_MASK], b,
                                                                          end_token, chain)
            s.host_blocks[b, HOST_KEY_END] = end_token
            s.host_blocks[b, HOST_KEY_CHAIN] = chain
            remember(s, i, k, b)
            pend(s, b)
            rank_by(s, i, b, k)
            s.clock[STORE_LINK_FREE_S] = max(s.clock[NOW], s.clock[STORE_LINK_FREE_S]) + s.clock[HOST_BLOCK_S]
            s.host_ready_s[b] = s.clock[STORE_LINK_FREE_S]
            c[HOST_STORED_BLOCKS] += 1
    s.offload[i, OFFLOAD_OFFERED] = max(end, s.offload[i, OFFLOAD_OFFERED])


@njit(inline=True)
def lags(s, i):
    """Whether running request ``i``'s offers lag the blocks it has computed (a store refused)."""
    return s.offload[i, OFFLOAD_OFFERED] < offer_end(s, i, s.num_computed_tokens[i])


@njit(inline=True)
def admitted(s, i):
    """Request ``i`` is admitted: its offers start again from its first block, its GPU hits'
    included (scheduler.py:1241-1244); a load (:func:`start_load`) moves them past its hits."""
    s.offload[i, OFFLOAD_OFFERED] = 0
    s.offload[i, OFFLOAD_GPU_HITS] = 0


@njit(lazy=with_tier)
def finished(s, i: int) -> None:
    """Request ``i`` finished: the keys it recorded in its life (:func:`record`) are touched, its
    deepest first (its first the most recent: ``on_request_finished``, cpu/manager.py:422-452,
    lru.py:155-166); a request admitted with a load offers none of its GPU hits
    (offloading/scheduler.py:1471-1472), so those are not touched unless it offered them in an
    earlier admission."""
    at = s.offload[i, OFFLOAD_SEEN_AT]
    for k in range(s.prompt_tokens[i] // s.config[BLOCK_SIZE] - 1, -1, -1):
        if s.host_seen[at + k] & 1:
            b = find(s, i, k)
            if b >= 0:
                touch(s, b)
    s.offload[i, OFFLOAD_OFFERED] = -1  # done with the tier


@njit(lazy=with_tier)
def touch_finished(s) -> None:
    """The requests the last completed step finished: their last stores first (a store refused
    before is offered again: ``_build_store_jobs`` over ``finished_req_ids``,
    offloading/scheduler.py:1821-1836, their prompts), then their keys touched (:func:`finished`),
    after this scheduling pass's stores: vLLM signals them in the next ``build_connector_meta``,
    once its store jobs are prepared (offloading/scheduler.py:2167-2184). Once each."""
    n = s.count[STEP_NUM_FINISHED]
    for k in range(n):
        i = s.step_finished[k]
        if s.status[i] == FINISHED and s.offload[i, OFFLOAD_OFFERED] >= 0:
            offer(s, i, s.prompt_tokens[i])
    for k in range(n):
        i = s.step_finished[k]
        if s.status[i] == FINISHED and s.offload[i, OFFLOAD_OFFERED] >= 0:
            finished(s, i)


@njit(inline=True)
def loading(s):
    """The requests waiting for their host blocks to load."""
    return s.count[NUM_LOADING]


@njit(lazy=asynchronous_loads)
def next_load_end(s) -> float:
    """When the first load in flight past now ends (inf: none), of the waiting requests' (in the
    waiting queue's holding part: ``lifecycle.hold_waiting``)."""
    c = s.count
    first = np.inf
    for p in range(c[KV_HOLDING_WAITING]):
        i = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        if s.offload[i, OFFLOAD_LOADING] and s.clock[NOW] < s.load_ready_s[i] < first:
            first = s.load_ready_s[i]
    return first


@njit(lazy=with_tier)
def being_loaded(s, i: int, gpu_hits: int, host_hits: int) -> bool:
    """Whether a block of request ``i``'s host hits (past its ``gpu_hits``) is being loaded for
    another request: vLLM then delays it, and the requests behind it may be admitted
    (``_chunks_being_loaded``, offloading/scheduler.py:1020-1045; the lookup's None,
    v1 scheduler.py:1146-1151: ``skip_request``)."""
    c = s.count
    for p in range(c[KV_HOLDING_WAITING]):
        j = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        first, end = loading_blocks(s, j)
        for k in range(max(gpu_hits, first), min(gpu_hits + host_hits, end)):
            if prefix_cache.key_chain(s, j, k) == prefix_cache.key_chain(s, i, k):  # the same key: the same end
                return True
    return False


@njit(inline=True)
def loads_async(s):
    """Whether this replica's admissions load KV asynchronously, and it keeps vLLM's prefills in
    flight (:func:`prefilling`) for :func:`reserved_blocks`."""
    return asynchronous_loads(s.config)


@njit(lazy=asynchronous_loads)
def reserved_blocks(s) -> int:
    """The blocks the prefills in flight still need for their whole sequence, which an admission
    that loads (from the host tier, or a prefill replica's transfer) must leave free
    (``_inflight_prefill_reserved_blocks``, v1 scheduler.py:3432-3436,
    :1420-1430), each the blocks its ``num_tokens`` lack (``_request_remaining_blocks``,
    :3404-3420: ``OFFLOAD_PREFILLING`` marks vLLM's set, :func:`prefilling`); with speculative
    decoding, one verification step's blocks more (``_spec_decode_step_blocks``, :371-381)."""
    c = s.count
    bs = s.config[BLOCK_SIZE]
    need = (verification_tokens(s) + bs - 1) // bs
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.offload[i, OFFLOAD_PREFILLING]:
            need += remaining_blocks(s, i)
    for p in range(c[KV_HOLDING_WAITING]):
        i = s.waiting[(c[WAITING_HEAD] + p) % len(s.waiting)]
        if s.offload[i, OFFLOAD_PREFILLING]:
            need += remaining_blocks(s, i)
    return need


@njit(inline=True)
def prefilling(s, i, loading):
    """Request ``i``, just admitted, joins vLLM's prefills in flight if it loads (scheduler.py:1542)
    or its prompt is not all scheduled in this pass (:1590-1593); it leaves them when a pass
    has scheduled the rest (:func:`prefilled`), or at a preemption (:1820: its next admission
    sets it anew). A request that finishes its prompt in this pass stays in them until the pass
    ends: with speculative decoding it still lacks a verification step's blocks."""
    s.offload[i, OFFLOAD_PREFILLING] = loading or s.num_prompt_computed[i] < s.prompt_target[i]


@njit(inline=True)
def prefilled(s):
    """The pass is over: its prefill chunks that reached their prompt's end leave the prefills
    in flight (``_update_after_schedule``, scheduler.py:1862-1871)."""
    for k in range(s.count[STEP_PREFILL_SEQS]):
        i = s.step_prefill_ids[k]
        if s.num_prompt_computed[i] >= s.prompt_target[i]:
            s.offload[i, OFFLOAD_PREFILLING] = 0


@njit(inline=True)
def remaining_blocks(s, i):
    """The blocks request ``i`` lacks for its ``prompt_target`` tokens (a prefill's whole sequence)
    and, with speculative decoding, a verification step's tokens past them (scheduler.py:3407-3409)."""
    bs = s.config[BLOCK_SIZE]
    return max((s.prompt_target[i] + verification_tokens(s) + bs - 1) // bs - s.num_blocks[i], 0)


@njit(inline=True)
def verification_tokens(s):
    """The slots one verification step takes with speculative decoding: its token, its K drafts
    and the lookahead slots (``1 + num_spec_tokens + num_lookahead_tokens``, scheduler.py:371-376,
    :3407-3409); 0 without."""
    return 1 + s.config[SPEC_TOKENS] + s.config[SPEC_LOOKAHEAD] if s.config[SPEC_TOKENS] else 0


# vLLM v1's scheduler meets the tier at these points of its waiting loop (``scheduler_v1.admit_waiting``;
# the connector's calls in v1 sched/scheduler.py:1071-1074, 1139-1151, 1285-1302, 1542)


@njit(inline=True)
def seats_loading(s, i):
    """The seats of ``max_num_seqs`` the requests loading host blocks hold (each a block-table
    row: vLLM counts the running list alone, sched/scheduler.py:1071-1074, here they count too),
    less request ``i``'s own (-1: none), which it takes when its load has ended."""
    return s.count[NUM_LOADING] - (1 if i >= 0 and loading_seat(s, i) else 0)


@njit(inline=True)
def lookup(s, i, target):
    """The connector's lookup as waiting request ``i`` (``target`` tokens) is considered, before any
    block is counted (``get_num_new_matched_tokens``, scheduler.py:1139-1151): (its GPU prefix
    hits, those of them nobody holds, the consecutive host hits past them), its offers starting
    again (:func:`admitted`); (0, 0, 0) without a tier."""
    if not with_tier(s.config):
        return 0, 0, 0
    gpu_hits, revived = prefix_cache.count_hits(s, i, target)
    host_hits = count_hits(s, i, gpu_hits, hit_limit(s, target))
    admitted(s, i)
    return gpu_hits, revived, host_hits


@njit(inline=True)
def reserved_for(s, loads):
    """The free blocks an admission must leave to the prefills in flight: :func:`reserved_blocks`
    for one that ``loads`` its KV (a host load, a prefill replica's transfer), 0 for one that
    computes it (scheduler.py:1420-1430)."""
    return reserved_blocks(s) if loads else 0


@njit(inline=True)
def load_on_admission(s, i, target, gpu_hits, revived, host_hits, watermark):
    """Waiting request ``i`` (``target`` tokens), whose whole sequence fits, has ``host_hits`` to
    load: it takes its hits' blocks (a fresh one per host hit, a GPU hit nobody holds out of the
    free queue; ``revived`` of them), leaving the prefills in flight theirs and the ``watermark``
    (``allocate_slots``' reserved_blocks, kv_cache_manager.py:579-588), and its load starts
    (:func:`start_load`); it computes nothing now (scheduler.py:1285-1288) and waits in the queue's
    holding part for the load (the caller's). Returns False, taking nothing, where the blocks
    are not free."""
    if host_hits + revived + watermark > kv_cache.num_free_blocks(s) - reserved_blocks(s):
        return False
    kv_cache.allocate_hits(s, i, target, gpu_hits + host_hits)
    start_load(s, i, gpu_hits, host_hits)
    prefilling(s, i, True)
    return True


@njit(inline=True)
def arrived(s, i):
    """Request ``i``, holding blocks whose KV has arrived, is admitted: a host load's blocks join
    the GPU prefix cache (:func:`end_load`; a transfer's did at its end,
    ``remote_kv.transfer_loaded``). Returns the tokens it holds computed."""
    return end_load(s, i) if with_tier(s.config) else s.num_computed_tokens[i]


@njit(inline=True)
def admitted_prefill(s, i, loaded):
    """Request ``i`` was admitted and scheduled (``loaded``: its KV had arrived): it joins the
    prefills in flight where this replica's admissions may load (:func:`prefilling`)."""
    if loads_async(s):
        prefilling(s, i, loaded)


@njit
def offer_scheduled(s, reached, ran):
    """The step's stores, once the pass has made every lookup (``build_connector_meta``'s
    ``_build_store_jobs``, offloading/scheduler.py:2168, after ``schedule``'s lookups,
    scheduler.py:1139): the prompt blocks each scheduled request fills go to the host tier, in
    scheduling order: the running requests the pass reached (``running[:reached]``), then those
    it admitted (``running[ran:]``). A store made at its admission would evict blocks that a
    request admitted after it in the same pass finds in vLLM's lookup. While no store refused
    lags (``HOST_REFUSED``), only the step's prefill chunks have blocks to offer, in the same
    order (``step_prefill_ids``: the running list's, then the admissions')."""
    c = s.count
    if not c[HOST_REFUSED]:
        for k in range(c[STEP_PREFILL_SEQS]):
            i = s.step_prefill_ids[k]
            offer(s, i, s.num_computed_tokens[i])
        return
    lagging = False
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if k < reached or k >= ran:
            offer(s, i, s.num_computed_tokens[i])
        lagging |= lags(s, i)
    c[HOST_REFUSED] = int(lagging)  # (a refusal in this loop leaves one lagging)


@njit(inline=True)
def pass_ended(s, reached, ran):
    """vLLM v1's scheduling pass is over, having reached ``running[:reached]`` of the running list
    and admitted ``running[ran:]``: the step's stores (:func:`offer_scheduled`) and the finished
    requests' (:func:`touch_finished`), then the prefills in flight that reached their prompt's
    end leave them (:func:`prefilled`)."""
    if with_tier(s.config):
        offer_scheduled(s, reached, ran)
        touch_finished(s)
    if loads_async(s):
        prefilled(s)
