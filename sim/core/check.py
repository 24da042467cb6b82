"""``--check``: after every iteration, the core's incremental state against its definitions,
recomputed from scratch out of the arrays (plain Python, slow on purpose: a second, naive
statement of what the counters mean, not of the policy).

What is recomputed:

* queues: the waiting and swapped rings and the running list hold exactly the requests of
  that status, each once; finished and rejected counts; the running sequences, the decode set
  and the swap space in use; vLLM v0's and Orca's running list in arrival order unless marked;
* the paged pool: every running sequence's block-table row; reference counts (where blocks
  are shared) equal the rows' references, unshared blocks are held once; held, free-stack and
  cached-unreferenced (LRU) blocks are disjoint and add up to the pool; the token, demand and
  logical-block counters equal their sums over held blocks (a block at index k of a table
  holds ``min(max(L - k * block_size, 0), block_size)`` tokens, the same for every holder);
  sequence slots;
* the contiguous pool: extents of running requests inside the address space, apart, sized
  ``A >= R``, buddy extents aligned powers of two, fit holes sorted, apart, coalesced and,
  with the extents, tiling the address space; the four sums;
* the radix cache (``--system sglang``): the tree's nodes each start where their parent ends, its
  token and evictable counts are the sums over its live nodes, each node's lock count is the
  running requests whose locked node lies below it, a request's prefix is its node's depth, and
  the pages held outside the tree are each running request's ``ceil((computed - prefix) / page)``,
  and each request's count of the nodes it owns is theirs;
* vLLM v1's KV cache groups: each group's table (a sliding one's leading null blocks no more than
  its window has left), each group's categories summing to its held slots, every block counted
  once; with prefix caching a block held by several requests at one index of one group in each,
  keyed in that group, and the shared-slot counters the references past each block's first;
* speculative decoding's slack: each running request's mark between its computed tokens and its
  blocks' slots, and the counters its sums;
* the memory categories sum to the capacity, none negative; time never goes back;
* a disaggregated replica (``mine``: its own requests): the blocks held by in-flight transfers
  (a finished prefill's, a loading request's) are held, their slots the in-transfer count; a
  decode replica's loaded requests hold their prompt and are its waiting queue's front;
* the waiting head the scheduler skips as blocked does not fit.

A broken invariant raises :class:`AssertionError` naming it (``replay.run`` turns it into an
:class:`~sim.errors.InvariantError` with the simulated time).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import host_tier, kv_cache, memory, prefix_cache
from pagesim.sim.core.sched import policies, speculative
from pagesim.sim.core.compile.families import EVICTS_ANY_BLOCK, WHOLE_BATCHES
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.state import (BLOCKED_ON_MAX_SEQS, BLOCK_SIZE, BUDDY, CAPACITY, COMPUTED_SLOTS, CONTIGUOUS,
                                    DECODE_SET_SIZE, DECODE_SIDE, DEMAND_SLOTS, DEMAND_WAITING, DISAGG_ROLE,
                                    FAMILY_TRAITS, FINISHED, FREE_EPOCH, FULL_GROUPS, HICACHE_HOST_PAGES,
                                    HOST_BLOCKS, HOST_USED, KEY_END, KV_HOLDING_WAITING, LEFTOVER_SLOTS, LOADING,
                                    LOCKED_NODE, LOGICAL_BLOCKS, MAMBA_ALIGN, MANAGER_KIND, MAX_NUM_SEQS,
                                    MEMORY_CATEGORIES, NOT_BLOCKED, NUM_BLOCKS, NUM_CACHED_KEYS, NUM_FINISHED,
                                    NUM_FREE_BLOCK_IDS, NUM_FREE_SLOTS, NUM_LRU, NUM_REJECTED, NUM_RUNNING,
                                    NUM_RUNNING_SEQS, PREFILL_SIDE, PREFIX_CACHING, PREFIX_LEN, RADIX, REF, REJECTED,
                                    RUNNING, SCHEDULING_POLICY, SHARED_BLOCKS, SLIDING_GROUPS, SLIDING_WINDOW,
                                    SPECULATIVE_SLACK, SPEC_TOKENS, STATE_GROUPS, STATE_SLOTS, STORE_LINK_FREE_S,
                                    SWAPPED, SWAPPED_HEAD, SWAPPED_LEN, SWAP_USED_TOKENS, TRANSFERS, TRANSFER_SLOTS,
                                    WAITING, WAITING_HEAD, WAITING_LEN)
from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS, SCHEDULER_KIND
from pagesim.sim.core.kv.kv_cache import (FULL_SHARED_SLOTS, SKIPPED_SLOTS, SLIDING_SHARED_SLOTS, STATE_BLOCKS,
                                          WINDOW_SKIPPED)
from pagesim.sim.core.kv.prefix_cache import ENTRY_BLOCK, KEY_GROUP, KEY_SLOT, LRU_HEAD, NEXT
from pagesim.sim.core.kv.extent import EXTENT_PLACED, EXTENT_RESERVED, EXTENT_START, PLACED_SLOTS, RESERVED_SLOTS
from pagesim.sim.core.kv.placement import ADDRESS_SPACE, HOLE_SIZE, HOLE_START, NUM_HOLES, PLACEMENT_KIND
from pagesim.sim.core.sched.scheduler_vllm import BLOCKED_EPOCH, BLOCKED_KIND, BLOCKED_REQUEST, RUNNING_UNSORTED
from pagesim.sim.core.kv.host_tier import (GROUP_HEAP, HOST_GROUP, HOST_GROUPS, HOST_KEY_CHAIN, HOST_KEY_END,
                                           HOST_KEY_SLOT, HOST_LAST_RANK, HOST_NEXT, HOST_PENDING, HOST_PENDING_HEAD,
                                           HOST_PENDING_LEN, HOST_PREV, HOST_RANK, HOST_TABLE_MASK,
                                           HOST_TOUCHED_HEAD, HOST_TOUCHED_TAIL, NUM_LOADING, OFFLOAD_FRONT,
                                           OFFLOAD_HEAP_AT, OFFLOAD_LOADING, OFFLOAD_RANK, OFFLOAD_SEEN_AT,
                                           PENDING_BLOCK)
from pagesim.sim.core.sched.speculative import SPEC_DEMAND_SLOTS, SPEC_HIGH, SPEC_SLOTS
from pagesim.sim.core.kv.radix_cache import (HICACHE_PENDING, HICACHE_PENDING_NODE, NODE_END, NODE_EVICTED,
                                             NODE_LOCK_REF, NODE_ON_HOST, NODE_OWNER, NODE_PARENT, NODE_START,
                                             OWNED_NODES, RADIX_EVICTABLE, RADIX_NODES_USED, RADIX_PRIVATE_PAGES,
                                             RADIX_TREE_TOKENS)


def check(s, mine=None) -> None:
    """Every invariant of the state ``s`` (a :class:`~sim.core.state.Core`) after an iteration.
    ``mine``: the requests this state owns, where replicas share the request columns (a
    disaggregated cluster's replica, sim/disagg.py); None: all."""
    mine = np.ones(len(s.status), bool) if mine is None else mine
    check_queues(s, mine)
    # a count out of its range reads or writes its table at a wrapped index (compiled code takes a
    # negative index as Python does): an overdrawn pool, not caught by a bounds check
    free, slots = int(s.count[NUM_FREE_BLOCK_IDS]), int(s.count[NUM_FREE_SLOTS])
    if s.config[MANAGER_KIND] != RADIX:  # (which lists no free block: build.py)
        assert 0 <= free <= len(s.free_block_ids), \
            f"{free} free blocks of {len(s.free_block_ids)}: the pool was overdrawn"
    assert 0 <= slots <= len(s.free_slots), f"{slots} free block-table rows of {len(s.free_slots)}"
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        check_extents(s)
    elif s.config[MANAGER_KIND] == RADIX:
        check_radix(s)
    else:
        check_blocks(s, mine)
    check_categories(s)
    check_blocked_head(s)
    if speculative.speculating(s.config):
        check_speculative(s)
    if host_tier.with_tier(s.config):
        check_host_tier(s)


def check_speculative(s) -> None:
    """Speculative decoding (sim/core/sched/speculative.py): each running request's high-water mark
    lies between its computed tokens and its blocks' slots, nobody else holds one, and the
    slack counters are the sums over the running requests."""
    c, bs = s.count, int(s.config[BLOCK_SIZE])
    slots = demand = 0
    running = set(s.running[:c[NUM_RUNNING]].tolist())
    for i in range(len(s.status)):
        high = int(s.speculative[i, SPEC_HIGH])
        if i not in running:
            assert high == 0, f"request {i} is not running but holds a speculative mark"
            continue
        held = int(s.num_computed_tokens[i])
        if high:
            assert held <= high <= int(s.num_blocks[i]) * bs, \
                f"request {i}: speculative mark {high} outside [{held}, {int(s.num_blocks[i]) * bs}]"
            slots += high - held
            demand += min(high, int(s.final_len[i])) - held
    assert (c[SPEC_SLOTS], c[SPEC_DEMAND_SLOTS]) == (slots, demand), "speculative slack counters drifted"


def ring(entries: np.ndarray, head: int, length: int) -> list[int]:
    """The ``length`` entries of a ring buffer from ``head``: two slices (an index per entry
    took a tenth of --check's queues)."""
    head, end, n = int(head), int(head) + int(length), len(entries)
    assert 0 <= head < max(n, 1) and 0 <= length <= n, f"a queue of {length} from {head} outside its ring of {n}"
    return entries[head:end].tolist() + entries[:max(end - n, 0)].tolist()


def transfer_holders(s, mine) -> tuple[np.ndarray, np.ndarray]:
    """A disaggregated replica's requests holding blocks outside its running list
    (sim/core/kv/remote_kv.py): those whose blocks are in transfer (a prefill replica's finished
    prefills, a decode replica's loading requests), and a decode replica's loaded requests
    waiting to run."""
    role, held = s.config[DISAGG_ROLE], mine & (s.num_blocks > 0)
    none = np.zeros(0, np.int64)
    if role == PREFILL_SIDE:
        return np.flatnonzero(held & (s.status == FINISHED)), none
    if role == DECODE_SIDE:
        return np.flatnonzero(held & (s.status == LOADING)), np.flatnonzero(held & (s.status == WAITING))
    return none, none


#: each queue's name and the status of the requests it holds
QUEUES = (("waiting", WAITING), ("swapped", SWAPPED), ("running", RUNNING))
#: by status, the status of the list a request of it is in (-1: none holds it)
LISTED_AS = np.full(max(WAITING, RUNNING, SWAPPED, FINISHED, REJECTED, LOADING) + 1, -1, np.int64)
LISTED_AS[[want for _, want in QUEUES]] = [want for _, want in QUEUES]


def check_queues(s, mine) -> None:
    c, status = s.count, s.status
    waiting = ring(s.waiting, c[WAITING_HEAD], c[WAITING_LEN])
    lists = (waiting, ring(s.swapped, c[SWAPPED_HEAD], c[SWAPPED_LEN]), s.running[:c[NUM_RUNNING]].tolist())
    # every request marked with the status of the list it is in, once, against its own status
    # (counted over all three lists at once: --check runs every iteration)
    members, listed = np.array(waiting + lists[1] + lists[2], np.int64), np.full(len(status), -1, np.int64)
    try:
        times = np.bincount(members, minlength=len(status))
        start = 0
        for (_, want), held in zip(QUEUES, lists):
            listed[members[start:start + len(held)]] = want
            start += len(held)
    except (ValueError, IndexError):  # a negative id, or one past the requests
        raise AssertionError("a queue holds a request the run does not have") from None
    # how many of this state's requests have each status
    count = np.bincount(status[mine], minlength=len(LISTED_AS))
    assert len(count) == len(LISTED_AS), "a request's status is none the core sets"
    expected = np.where(mine, LISTED_AS[status], -1)
    if times.max(initial=0) > 1 or (listed != expected).any():  # named as each list, in turn, finds it
        for (name, want), held in zip(QUEUES, lists):
            assert len(set(held)) == len(held), f"a request is twice in the {name} list"
            assert sorted(held) == np.flatnonzero(expected == want).tolist(), \
                f"the {name} list is not the requests of that status"
    loaded = transfer_holders(s, mine)[1]
    holding = set(loaded.tolist())  # lifecycle.hold_waiting: a transfer's, a host load's
    if host_tier.with_tier(s.config):
        holding |= set(np.flatnonzero(mine & (s.offload[:len(status), OFFLOAD_LOADING] > 0)).tolist())
    assert set(waiting[:c[KV_HOLDING_WAITING]]) == holding, \
        "the requests holding blocks for their KV are not the waiting queue's front"
    if policies.chosen_elsewhere(s.config):  # the run's policy's order (policies.position_by), each part apart
        policy = policies.policy_module(int(s.config[SCHEDULING_POLICY]))
        key = policy.order_key(s)
        for part in (waiting[:c[KV_HOLDING_WAITING]], waiting[c[KV_HOLDING_WAITING]:]):
            keys = [(int(key[i]), float(s.arrival_s[i]), i) for i in part]
            assert keys == sorted(keys), f"the waiting queue is not in {policy.__name__.rsplit('.', 1)[-1]}'s order"
    assert c[NUM_FINISHED] == count[FINISHED], "finished count drifted"
    assert c[NUM_REJECTED] == count[REJECTED], "rejected count drifted"
    running = s.running[:c[NUM_RUNNING]]
    assert c[NUM_RUNNING_SEQS] == int(s.width[running].sum()), "running sequences drifted"
    assert c[DECODE_SET_SIZE] == int((s.in_decode[running] * s.num_seqs[running]).sum()), "decode set drifted"
    assert not s.in_decode[status != RUNNING].any(), "a request not running is in the decode set"
    if s.config[SCHEDULER_KIND] in (CONTINUOUS, CONTINUOUS_CONTIGUOUS):  # vLLM v0's and Orca's list
        assert c[RUNNING_UNSORTED] or (np.diff(s.arrival_s[running]) >= 0).all(), \
            "the running list is out of arrival order unmarked"
    assert c[SWAP_USED_TOKENS] == sum(swapped_size(s, i, s.swapped_tokens[i]) for i in lists[1]), \
        "swap space in use drifted"
    idle = mine & (status != RUNNING) & (status != LOADING)  # a loading request's local hits are computed
    idle[loaded] = False
    loading = np.zeros(len(status), bool)  # requests loading host blocks (host_tier.py) hold K/V too
    if host_tier.with_tier(s.config):
        loading = mine & (s.offload[:len(status), OFFLOAD_LOADING] > 0)
    assert (s.num_computed_tokens[idle & ~loading] == 0).all(), \
        "a request not running or loading holds K/V"
    if host_tier.with_tier(s.config):
        assert (status[loading] == WAITING).all(), "a request loading host blocks is not waiting"
        assert c[NUM_LOADING] == int(loading.sum()), "the count of requests loading drifted"


def holders(s, mine) -> list[int]:
    """The requests holding blocks: the running ones, and those waiting for a load from the host
    tier (sim/core/kv/host_tier.py: their blocks are theirs while the load runs)."""
    held = s.running[:s.count[NUM_RUNNING]].tolist()
    if host_tier.with_tier(s.config):
        held += np.flatnonzero(mine & (s.offload[:len(s.status), OFFLOAD_LOADING] > 0)).tolist()
    return held


def check_host_tier(s) -> None:
    """The host tier (sim/core/kv/host_tier.py): its blocks in use at most its capacity, each with a
    rank of the numbers given so far, no two alike; each block in one list, the lists in rank
    order: the touched list of touches' ranks, each request's group of its own ranks, the heap of
    the non-empty groups a heap by their numbers, knowing its places; the blocks being stored in
    the ring, in the order they land; each shared key in the map at its row naming its block, the
    map holding those keys alone, each request's own key named by its entry alone, and every store
    landed by the link's last."""
    c, cap = s.count, int(s.config[HOST_BLOCKS])
    used = int(c[HOST_USED])
    assert 0 <= used <= cap, f"host tier holds {used} blocks of {cap}"
    ranks = s.host_blocks[:used, HOST_RANK]
    assert (ranks > 0).all() and (ranks // host_tier.RANK_SPAN <= c[HOST_LAST_RANK]).all(), \
        "a host block's rank was not given"
    assert len(set(ranks.tolist())) == used, "two host blocks share a rank"
    heap = s.host_work[GROUP_HEAP, :int(c[HOST_GROUPS])].tolist()
    numbers = [int(s.offload[i, OFFLOAD_RANK]) for i in heap]
    assert all(numbers[(k - 1) // 2] <= numbers[k] for k in range(1, len(heap))), \
        "the host LRU's heap of groups is not a heap"
    assert all(s.offload[i, OFFLOAD_HEAP_AT] == k for k, i in enumerate(heap)), "a group's place in the heap is wrong"
    assert (s.offload[:, OFFLOAD_HEAP_AT] >= 0).sum() == len(heap) == (s.offload[:, OFFLOAD_FRONT] >= 0).sum(), \
        "the heap of groups does not hold the non-empty groups alone"
    listed = []
    for group, first in [(-1, int(c[HOST_TOUCHED_HEAD]))] + [(i, int(s.offload[i, OFFLOAD_FRONT])) for i in heap]:
        b, before = first, -1
        while b >= 0:
            assert s.host_blocks[b, HOST_GROUP] == group and s.host_blocks[b, HOST_PREV] == before, \
                f"host block {b} is linked wrongly in its list"
            end = -int(ranks[b]) % host_tier.RANK_SPAN
            number = (int(ranks[b]) + end) // host_tier.RANK_SPAN
            if group < 0:
                assert end == 0, f"host block {b} in the touched list has a request's rank"
            else:
                assert number == s.offload[group, OFFLOAD_RANK] and end == s.host_blocks[b, HOST_KEY_END], \
                    f"host block {b} in request {group}'s group does not rank by it"
            assert before < 0 or ranks[before] < ranks[b], f"host block {b} is out of rank order in its list"
            listed.append(b)
            b, before = int(s.host_blocks[b, HOST_NEXT]), b
        if group < 0:
            assert before == c[HOST_TOUCHED_TAIL], "the touched list's last block is not its tail"
    assert sorted(listed) == list(range(used)), "the host LRU's lists do not hold each block once"
    pending = s.host_blocks[:used, HOST_PENDING] == 1
    ring = [int(s.host_work[PENDING_BLOCK, (c[HOST_PENDING_HEAD] + k) % cap])
            for k in range(int(c[HOST_PENDING_LEN]))]
    assert sorted(ring) == np.flatnonzero(pending).tolist(), "the blocks being stored are not the ring's"
    assert all(s.host_ready_s[a] <= s.host_ready_s[b] for a, b in zip(ring, ring[1:])), \
        "the blocks being stored land out of their order"
    lookup = interpreted(prefix_cache.map_lookup)
    mapped = 0
    for b in range(used):
        assert s.host_ready_s[b] <= s.clock[STORE_LINK_FREE_S], f"host block {b} lands after the link's last store"
        end, chain = int(s.host_blocks[b, HOST_KEY_END]), int(s.host_blocks[b, HOST_KEY_CHAIN])
        i = own_request(s, chain)
        if i >= 0:  # a request's own key: named by its entry alone (host_tier.find), not in the map
            k = end // int(s.config[BLOCK_SIZE]) - 1
            assert s.host_seen[s.offload[i, OFFLOAD_SEEN_AT] + k] >> 1 == b + 1, \
                f"request {i}'s block {k} is in host block {b}, and its entry does not say so"
            assert s.host_blocks[b, HOST_KEY_SLOT] == -1, f"host block {b} holds an own key with a map row"
            continue
        mapped += 1
        row = int(s.host_blocks[b, HOST_KEY_SLOT])
        assert s.host_entries[row, ENTRY_BLOCK] == b, f"host block {b}'s key row names another block"
        assert lookup(s.host_entries, int(s.config[HOST_TABLE_MASK]), end, chain) == b, \
            f"host block {b}'s key does not find it"
    rows = np.flatnonzero(s.host_entries[:, ENTRY_BLOCK] >= 0)
    assert len(rows) == mapped, "the host key map holds other keys than its blocks' shared ones"


def own_request(s, chain: int) -> int:
    """The request whose own keys have this chain (``prefix_cache.own_chain``), or -1."""
    i, rest = divmod(-(chain + 1), prefix_cache.OWN_MIX)
    return i - 1 if rest == 0 and 1 <= i <= len(s.prompt_tokens) else -1


def check_blocks(s, mine) -> None:
    c, bs, nb = s.count, int(s.config[BLOCK_SIZE]), int(s.config[NUM_BLOCKS])
    if s.config[SLIDING_GROUPS] or s.config[STATE_GROUPS]:
        check_groups(s)
        return
    rows, tokens, demand, held_slots = [], [], [], []  # one entry per table reference
    in_transfer, loaded = transfer_holders(s, mine)
    transfer_rows = [np.zeros(0, np.int64)]  # the blocks transfers hold (remote_kv.py)
    for i in in_transfer.tolist():
        slot, n = int(s.seq_slot[i, 0]), int(s.num_blocks[i])
        held_slots.append(slot)
        # a loading request's local prefix hits (its computed tokens) are in use; the rest in transfer
        h = int(s.num_computed_tokens[i]) // bs
        rows.append(s.block_table[slot, :h].astype(np.int64))
        tokens.append(np.full(h, bs, np.int64))
        demand.append(np.full(h, bs, np.int64))
        transfer_rows.append(s.block_table[slot, h:n].astype(np.int64))
    # every holder's sequences at once (a loop of small arrays per sequence took most of --check's time)
    holding = np.array(holders(s, mine) + loaded.tolist(), np.int64)
    n, L, F = (s.num_blocks[holding].astype(np.int64), s.num_computed_tokens[holding].astype(np.int64),
               s.final_len[holding].astype(np.int64))
    over = int(np.argmax((L > n * bs) | (L > F))) if len(holding) else 0  # the first overfull holder, if any
    assert not len(holding) or (L[over] <= n[over] * bs and L[over] <= F[over]), \
        f"request {holding[over]}: {L[over]} tokens in {n[over]} blocks (final length {F[over]})"
    widths = s.num_seqs[holding].astype(np.int64)
    own = np.arange(s.seq_slot.shape[1]) < widths[:, None]  # each holder's sequences, in turn
    table = s.seq_slot[holding]
    slots = table[own].astype(np.int64)
    if (slots < 0).any():
        missing = np.argwhere(own & (table < 0))
        raise AssertionError(f"request {holding[missing[0, 0]]}'s sequence {missing[0, 1]} has no block table")
    held_slots += slots.tolist()
    n, L, F = np.repeat(n, widths), np.repeat(L, widths), np.repeat(F, widths)  # per sequence
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)  # each block's index in its table
    rows.append(s.block_table[np.repeat(slots, n), k].astype(np.int64))
    # a block at index k holds these, for every holder
    tokens.append(np.minimum(np.maximum(np.repeat(L, n) - k * bs, 0), bs))
    demand.append(np.minimum(np.maximum(np.repeat(F, n) - k * bs, 0), bs))
    blocks, tokens, demand = np.concatenate(rows), np.concatenate(tokens), np.concatenate(demand)
    by_transfers = np.concatenate(transfer_rows)
    assert (blocks >= 0).all() and (by_transfers >= 0).all(), \
        "a block table holds no block (-1): a request grew past the free blocks"
    assert len(set(held_slots)) == len(held_slots), "a block-table row is held twice"
    assert not set(s.free_slots[:c[NUM_FREE_SLOTS]].tolist()) & set(held_slots), \
        "a held block-table row is on the free list"
    refs = np.bincount(np.concatenate([blocks, by_transfers]), minlength=nb)
    if s.config[SHARED_BLOCKS]:
        assert (s.block_info[:, REF] == refs).all(), "reference counts differ from the tables' references"
        prefill_side = by_transfers if s.config[DISAGG_ROLE] == PREFILL_SIDE else by_transfers[:0]
        assert (s.block_info[:nb, TRANSFERS] == np.bincount(prefill_side, minlength=nb)).all(), \
            "transfer counts differ from the transfers' references"
    else:
        assert refs.max(initial=0) <= 1, "an unshared block is held twice"
    only_transfers = (refs > 0) & (np.bincount(blocks, minlength=nb) == 0)
    assert c[TRANSFER_SLOTS] == int(only_transfers.sum()) * bs, "in-transfer slots drifted"
    # each held block's tokens and demand counted once; only a block held more than once can
    # hold different tokens for different holders (np.unique over all of them: a fifth of this)
    shared = refs[blocks] > 1
    computed, demanded = int(tokens[~shared].sum()), int(demand[~shared].sum())
    if shared.any():
        held_ids, first = np.unique(blocks[shared], return_index=True)
        tokens, demand = tokens[shared], demand[shared]
        assert (tokens == tokens[first][np.searchsorted(held_ids, blocks[shared])]).all(), \
            "a shared block holds different tokens for different holders"
        computed, demanded = computed + int(tokens[first].sum()), demanded + int(demand[first].sum())
    free = s.free_block_ids[:c[NUM_FREE_BLOCK_IDS]].astype(np.int64)
    check_places(refs > 0, free, lru_blocks(s), nb)
    if s.config[PREFIX_CACHING]:  # the LRU: keyed blocks, copies of a key cached already, vLLM 0.4.2's partial ones
        assert not s.block_info[free, KEY_END].any(), "a free block still has a key"
        assert int((s.block_info[:nb, KEY_END] > 0).sum()) == c[NUM_CACHED_KEYS], "cached keys drifted"
        check_key_map(s, nb)
    assert c[COMPUTED_SLOTS] == computed, "token-state counter drifted"
    assert c[DEMAND_SLOTS] == demanded, "demand counter drifted"
    assert c[LOGICAL_BLOCKS] == len(blocks) + len(by_transfers), "logical block counter drifted"


def check_key_map(s, nb: int) -> None:
    """The prefix key map's rows are its mapped blocks' (``KEY_SLOT``), each row naming its block;
    under vLLM 0.4.2 a key is held out of the map (no row: ``prefix_cache.apart``) only while its
    request has not been preempted: a running request preempted before holds none."""
    keyed = s.block_info[:nb, KEY_END] > 0
    mapped = keyed & (s.block_info[:nb, KEY_SLOT] >= 0)
    rows = np.flatnonzero(s.key_entries[:, ENTRY_BLOCK] >= 0)
    assert len(rows) == int(mapped.sum()), "the prefix key map's rows are not its mapped blocks'"
    blocks = np.flatnonzero(mapped)
    assert (s.key_entries[s.block_info[blocks, KEY_SLOT], ENTRY_BLOCK] == blocks).all(), \
        "a mapped block's key row names another block"
    if s.config[FAMILY_TRAITS] & EVICTS_ANY_BLOCK:
        for i in s.running[:s.count[NUM_RUNNING]].tolist():
            if s.num_preemptions[i]:
                for j in range(int(s.num_seqs[i])):
                    table = s.block_table[s.seq_slot[i, j], :s.num_blocks[i]]
                    assert not (keyed[table] & ~mapped[table]).any(), \
                        f"request {i}, preempted before, holds a key out of vLLM 0.4.2's map"


def group_categories(s) -> np.ndarray:
    """Each KV cache group's token states, reservation and internal fragmentation (rows: the
    groups, full first, state ones last), recomputed from its block table: a held block at index
    k holds ``min(max(L - k * block_size, 0), block_size)`` tokens, counted once, with its first
    holder (prefix caching: a block several hold); a state block its state's ``STATE_SLOTS``, the
    rest padding; they sum to its held slots."""
    bs, full, states = int(s.config[BLOCK_SIZE]), int(s.config[FULL_GROUPS]), int(s.config[STATE_GROUPS])
    groups = full + int(s.config[SLIDING_GROUPS])
    width = s.block_table.shape[1] // (groups + states)
    out = np.zeros((groups + states, 3), np.int64)
    counted = set()
    for i in s.running[:s.count[NUM_RUNNING]].tolist():
        n, L, F = int(s.num_blocks[i]), int(s.num_computed_tokens[i]), int(s.final_len[i])
        slot = int(s.seq_slot[i, 0])
        for g in range(groups):
            row = s.block_table[slot, g * width:g * width + n]
            k = np.array([k for k in np.flatnonzero(row >= 0).tolist() if int(row[k]) not in counted], np.int64)
            counted.update(row[k].tolist())
            tokens, demand = np.clip(L - k * bs, 0, bs).sum(), np.clip(F - k * bs, 0, bs).sum()
            out[g] += (tokens, demand - tokens, len(k) * bs - demand)
        if n and s.config[MAMBA_ALIGN]:  # its live states (a hit one counted with its first holder)
            for g in range(groups, groups + states):
                row = s.block_table[slot, g * width:g * width + n]
                live = [b for b in row[row >= 0].tolist() if b not in counted]
                counted.update(live)
                out[g] += (len(live) * int(s.config[STATE_SLOTS]), 0, len(live) * (bs - int(s.config[STATE_SLOTS])))
        elif n:  # the drafts' state blocks (kv_cache.state_blocks) hold nothing of theirs yet: fragmentation
            drafts = int(s.config[SPEC_TOKENS]) * bs
            out[groups:] += (int(s.config[STATE_SLOTS]), 0, bs - int(s.config[STATE_SLOTS]) + drafts)
    return out


def check_groups(s) -> None:
    """vLLM v1's KV cache groups: each group's table holds its blocks, a sliding group's first
    ``WINDOW_SKIPPED`` null and no more than its window has left; every block is held once or
    free; a holder holds one block in each state group; the counters are their sums; each
    group's categories sum to its held slots. With prefix caching (:func:`check_group_cache`) a
    block may be held by several requests, each block is still counted once, and the held,
    free and cached ones make the pool."""
    c, bs, nb = s.count, int(s.config[BLOCK_SIZE]), int(s.config[NUM_BLOCKS])
    full, window = int(s.config[FULL_GROUPS]), int(s.config[SLIDING_WINDOW])
    groups, states = full + int(s.config[SLIDING_GROUPS]), int(s.config[STATE_GROUPS])
    width = s.block_table.shape[1] // (groups + states)
    blocks, tokens, demand, skipped_slots, holders = [], 0, 0, 0, 0
    state_blocks = set()  # MAMBA_ALIGN: the distinct state blocks held (a hit state by several)
    for i in s.running[:c[NUM_RUNNING]].tolist():
        n, L, F = int(s.num_blocks[i]), int(s.num_computed_tokens[i]), int(s.final_len[i])
        slot, skipped = int(s.seq_slot[i, 0]), int(s.window[i, WINDOW_SKIPPED])
        assert L <= n * bs and L <= F, f"request {i}: {L} tokens in {n} blocks (final length {F})"
        assert skipped <= max(0, L - window + 1) // bs, f"request {i} freed blocks still in its window"
        for g in range(groups):
            row = s.block_table[slot, g * width:g * width + n].astype(np.int64)
            first = skipped if g >= full else 0
            assert (row[:first] == -1).all() and (row[first:] >= 0).all(), \
                f"request {i}: group {g}'s table is not {first} null blocks then held ones"
            blocks.extend(row[first:].tolist())
        if n and s.config[MAMBA_ALIGN]:  # its live state columns (1 or 2 per group: kv_cache.take_state_blocks)
            rows = s.block_table[slot, ((groups + np.arange(states)) * width)[:, None] + np.arange(n)].ravel()
            assert ((rows >= 0).reshape(states, n).sum(axis=1) >= 1).all(), f"request {i} holds no state in a group"
            blocks.extend(rows[rows >= 0].tolist())
            state_blocks.update(rows[rows >= 0].tolist())
        elif n:  # its state blocks: each state group's and one per draft (kv_cache.state_blocks)
            per = 1 + int(s.config[SPEC_TOKENS])
            blocks.extend(s.block_table[slot, ((groups + np.arange(states)) * width)[:, None] + np.arange(per)]
                          .ravel().tolist())
            holders += 1
        tokens, demand, skipped_slots = tokens + L, demand + min(F, n * bs), skipped_slots + skipped * bs
    free = s.free_block_ids[:c[NUM_FREE_BLOCK_IDS]].tolist()
    if s.config[PREFIX_CACHING]:
        check_group_cache(s, blocks, free)
    else:
        assert len(set(blocks)) == len(blocks), "a block is held twice (in one group or two)"
        assert not set(blocks) & set(free) and len(set(free)) == len(free), "a block is held and free, or free twice"
        assert len(blocks) + len(free) == nb, "held + free blocks != the pool"
    assert (c[COMPUTED_SLOTS], c[DEMAND_SLOTS]) == (tokens, demand), "token / demand counters drifted"
    assert c[SKIPPED_SLOTS] == skipped_slots, "skipped-slot counter drifted"
    assert c[STATE_BLOCKS] == (len(state_blocks) if s.config[MAMBA_ALIGN] else holders * states), \
        "state-block counter drifted"
    assert c[LOGICAL_BLOCKS] == len(blocks), "logical block counter drifted"
    per_group = group_categories(s)
    assert per_group.min() >= 0, f"a negative category in a group: {per_group.tolist()}"
    out = np.zeros(MEMORY_CATEGORIES, np.int64)
    memory_categories(s, s.count[DEMAND_WAITING], out, s.config[FAMILY_TRAITS])
    # the speculative slack, taken out of each attention group's reservation and fragmentation, and
    # the state groups' blocks for the drafts' states out of theirs
    drafts_states = int(c[STATE_BLOCKS]) * int(s.config[SPEC_TOKENS]) * bs
    out[1] += groups * c[SPEC_DEMAND_SLOTS]
    out[2] += groups * (c[SPEC_SLOTS] - c[SPEC_DEMAND_SLOTS]) + drafts_states
    assert out[SPECULATIVE_SLACK] == groups * c[SPEC_SLOTS] + drafts_states, "the speculative slack is not the groups'"
    assert (per_group.sum(axis=0) == out[:3]).all(), "the groups' categories do not sum to the pool's"


def check_group_cache(s, blocks: list, free: list) -> None:
    """Prefix caching over the groups: ``blocks`` (the tables' references, a block once per holder)
    give each block's reference count; a block is held, free or cached (the LRU) and the three make
    the pool; a shared block sits at one index of one group in every table holding it (its key's
    end, its key's group); cached and free blocks hold no reference, cached ones a key, free ones
    none; the shared slots are the references past each block's first, per kind of group."""
    c, bs, nb = s.count, int(s.config[BLOCK_SIZE]), int(s.config[NUM_BLOCKS])
    full, groups = int(s.config[FULL_GROUPS]), int(s.config[FULL_GROUPS] + s.config[SLIDING_GROUPS])
    width = s.block_table.shape[1] // (groups + int(s.config[STATE_GROUPS]))
    refs = np.bincount(np.asarray(blocks, np.int64), minlength=nb)
    assert (s.block_info[:nb, REF] == refs).all(), "reference counts differ from the tables' references"
    cached = lru_blocks(s)
    check_places(refs > 0, np.asarray(free, np.int64), cached, nb)
    assert not any(s.block_info[b, KEY_END] for b in free), "a free block still has a key"
    assert all(s.block_info[b, KEY_END] for b in cached), "a cached block has no key"
    assert int((s.block_info[:nb, KEY_END] > 0).sum()) == c[NUM_CACHED_KEYS], "cached keys drifted"
    check_key_map(s, nb)
    shared, place = [0, 0], {}  # the full groups' shared slots, the sliding ones'; each block's (group, index)
    for i in s.running[:c[NUM_RUNNING]].tolist():
        slot = int(s.seq_slot[i, 0])
        for g in range(groups):
            for k in range(int(s.num_blocks[i])):
                b = int(s.block_table[slot, g * width + k])
                if b < 0:
                    continue
                if s.block_info[b, KEY_END]:
                    assert s.block_info[b, KEY_END] == (k + 1) * bs and s.block_info[b, KEY_GROUP] == g, \
                        f"request {i}: block {b} at index {k} of group {g} is keyed elsewhere"
                if b in place:
                    assert place[b] == (g, k), f"shared block {b} sits at {place[b]} and at {(g, k)}"
                    shared[g >= full] += bs
                place[b] = (g, k)
    assert (c[FULL_SHARED_SLOTS], c[SLIDING_SHARED_SLOTS]) == tuple(shared), "shared-slot counters drifted"


def pool_counts(ids: np.ndarray, nb: int) -> np.ndarray:
    """How many times each of the pool's ``nb`` block ids is in ``ids``."""
    assert ((ids >= 0) & (ids < nb)).all(), "a block id outside the pool"
    return np.bincount(ids, minlength=nb)


def check_places(held: np.ndarray, free: np.ndarray, cached: list, nb: int) -> None:
    """Every block of the pool is in exactly one place: held (``held``, a flag per id), on the
    free stack, or cached (the LRU). Counted over the pool's ids, not in sets: --check runs every
    iteration."""
    free_count = pool_counts(free, nb)
    assert free_count.max(initial=0) <= 1, "a block is on the free stack twice"
    places = held[:nb] + free_count + pool_counts(np.array(cached, np.int64), nb)
    assert places.max(initial=0) <= 1, "a block is held, free or cached at once"
    assert int(places.sum()) == nb, "held + free + cached blocks != the pool"


def lru_blocks(s) -> list[int]:
    if not s.config[PREFIX_CACHING]:
        assert s.count[NUM_LRU] == 0, "cached blocks without prefix caching"
        return []
    # the links read once as a list (a read of the array per block took a quarter of --check's time)
    blocks, b, following, most = [], int(s.count[LRU_HEAD]), s.block_info[:, NEXT].tolist(), int(s.config[NUM_BLOCKS])
    while b >= 0 and len(blocks) <= most:
        blocks.append(b)
        b = following[b]
    assert len(blocks) == s.count[NUM_LRU] and len(set(blocks)) == len(blocks), "the LRU list drifted"
    return blocks


def check_extents(s) -> None:
    c, space = s.count, int(s.config[ADDRESS_SPACE])
    running = s.running[:c[NUM_RUNNING]].tolist()
    extents = sorted((int(s.extent[i, EXTENT_START]), int(s.extent[i, EXTENT_PLACED]), i) for i in running)
    reserved = placed = demand = tokens = 0
    end = 0
    for start, size, i in extents:
        r = int(s.extent[i, EXTENT_RESERVED])
        if s.config[FAMILY_TRAITS] & WHOLE_BATCHES:  # a member's L is written back when its batch ends
            held = int(s.prompt_tokens[i]) + min(int(s.num_generated[i]), int(s.output_tokens[i]) - 1)
        else:
            held = int(s.num_computed_tokens[i])
        assert 0 <= start and start + size <= space, f"request {i}'s extent [{start}, +{size}) is outside the pool"
        assert start >= end, f"request {i}'s extent overlaps the one before it"
        assert 1 <= r <= size, f"request {i}: reserved {r}, placed {size}"
        assert held <= r, f"request {i} holds more tokens than it reserved"
        if s.config[PLACEMENT_KIND] == BUDDY:
            assert size & (size - 1) == 0 and start % size == 0, f"request {i}'s buddy extent is not aligned"
        end = start + size
        reserved, placed = reserved + r, placed + size
        demand += min(r, int(s.final_len[i]))
        tokens += held
    assert (c[RESERVED_SLOTS], c[PLACED_SLOTS]) == (reserved, placed), "reserved / placed sums drifted"
    assert (c[COMPUTED_SLOTS], c[DEMAND_SLOTS]) == (tokens, demand), "token / demand sums drifted"
    idle = np.ones(s.status.shape, bool)
    idle[running] = False
    assert (s.extent[idle, EXTENT_START] == -1).all(), "a request not running holds an extent"
    if s.config[PLACEMENT_KIND] != BUDDY:  # the holes and the extents tile the address space
        holes = [(int(h[HOLE_START]), int(h[HOLE_SIZE])) for h in s.holes[:c[NUM_HOLES]]]
        pieces = sorted([(a, n, "hole") for a, n in holes] + [(a, n, "extent") for a, n, _ in extents])
        at, previous = 0, ""
        for start, size, kind in pieces:
            assert start == at and size > 0, f"the pool is not tiled at slot {at}"
            assert not (kind == previous == "hole"), f"two holes side by side at slot {start}"
            at, previous = start + size, kind
        assert at == space, "the holes and extents do not cover the address space"


def check_radix(s) -> None:
    c, nodes, page = s.count, s.radix_nodes, int(s.config[BLOCK_SIZE])
    live = [x for x in range(1, int(c[RADIX_NODES_USED])) if nodes[x, NODE_PARENT] != -2]
    locks = {x: 0 for x in live}
    pages = 0
    for i in s.running[:c[NUM_RUNNING]].tolist():
        x = int(s.radix_request[i, LOCKED_NODE])
        assert x >= 0, f"running request {i} locks no node"
        depth = int(nodes[x, NODE_END]) if x else 0
        assert s.radix_request[i, PREFIX_LEN] == depth, f"request {i}'s prefix is not its node's depth"
        while x:
            locks[x] += 1
            x = int(nodes[x, NODE_PARENT])
        pages += -(-(int(s.num_computed_tokens[i]) - depth) // page)
        assert s.num_blocks[i] == -(-(int(s.num_computed_tokens[i]) - depth) // page), f"request {i}'s pages drifted"
    hicache = int(s.config[HICACHE_HOST_PAGES]) > 0
    if hicache:  # a node whose copy to or from the host is not acknowledged is locked too
        for x in s.host_work[HICACHE_PENDING_NODE, :int(c[HICACHE_PENDING])].tolist():
            assert nodes[x, NODE_PARENT] != -2, f"pending node {x} left the tree"
            while x:
                locks[x] += 1
                x = int(nodes[x, NODE_PARENT])
        check_hicache(s, live)
    for x in live:
        parent = int(nodes[x, NODE_PARENT])
        start = int(nodes[parent, NODE_END]) if parent else 0
        assert nodes[x, NODE_START] == start and nodes[x, NODE_END] > start, f"node {x} does not follow its parent"
        assert nodes[x, NODE_START] % page == 0 and nodes[x, NODE_END] % page == 0, f"node {x} is not whole pages"
        assert nodes[x, NODE_LOCK_REF] == locks[x], f"node {x}'s lock count drifted"
    # (with a host tier the tree's device tokens: a host-only node holds none)
    lengths = {x: int(nodes[x, NODE_END] - nodes[x, NODE_START]) for x in live if not nodes[x, NODE_EVICTED]}
    assert c[RADIX_TREE_TOKENS] == sum(lengths.values()), "the tree's token count drifted"
    assert c[RADIX_EVICTABLE] == sum(n for x, n in lengths.items() if locks[x] == 0), "evictable tokens drifted"
    assert c[RADIX_PRIVATE_PAGES] == pages, "the pages held outside the tree drifted"
    owners = np.bincount(nodes[live, NODE_OWNER], minlength=len(s.radix_request)) if live else 0
    assert (s.radix_request[:, OWNED_NODES] == owners).all(), "the nodes each request owns drifted"


def check_hicache(s, live: list) -> None:
    """sglang's host tier (sim/core/kv/radix_cache.py): the host pages in use are those of the nodes on the
    host, at most the pool's; no node is on neither tier, and a host-only node's children are
    host-only (device eviction goes leaf first); a running request's prefix is on the device."""
    c, nodes, page = s.count, s.radix_nodes, int(s.config[BLOCK_SIZE])
    used = sum(int(nodes[x, NODE_END] - nodes[x, NODE_START]) // page for x in live if nodes[x, NODE_ON_HOST])
    assert c[HOST_USED] == used, f"the host pages in use drifted: {int(c[HOST_USED])}, recounted {used}"
    assert used <= s.config[HICACHE_HOST_PAGES], "the host pool holds more pages than it has"
    for x in live:
        assert not nodes[x, NODE_EVICTED] or nodes[x, NODE_ON_HOST], f"node {x} is on neither tier"
        parent = int(nodes[x, NODE_PARENT])
        assert not (parent and nodes[parent, NODE_EVICTED]) or nodes[x, NODE_EVICTED], \
            f"node {x} is on the device below a host-only node"
        assert not (parent and nodes[x, NODE_ON_HOST]) or nodes[parent, NODE_ON_HOST], \
            f"node {x} is on the host below a node that is not"
    for i in s.running[:c[NUM_RUNNING]].tolist():
        assert not nodes[int(s.radix_request[i, LOCKED_NODE]), NODE_EVICTED], f"request {i}'s prefix is host-only"


#: the core's own functions the checks call, run by CPython (as every call from Python to a core
#: function but a loop is: jit._interpreted_from_python): machine code called from Python would
#: type the state's ~60 arrays each time (1-3 ms), ten times a checked step's own work
memory_categories = interpreted(memory.memory_categories)
can_allocate = interpreted(memory.can_allocate)
swapped_size = interpreted(kv_cache.swapped_size)


def check_categories(s) -> None:
    out = np.zeros(MEMORY_CATEGORIES, np.int64)
    memory_categories(s, s.count[DEMAND_WAITING], out, s.config[FAMILY_TRAITS])
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        capacity = int(s.config[CAPACITY])
    else:
        capacity = int(s.config[NUM_BLOCKS]) * int(s.config[BLOCK_SIZE]) + int(s.config[LEFTOVER_SLOTS])
    assert out.min() >= 0, f"a negative memory category: {out.tolist()}"
    assert int(out.sum()) == capacity, f"memory categories sum to {int(out.sum())}, capacity {capacity}"


def check_blocked_head(s) -> None:
    """The head the next iteration will skip without trying (``scheduler_vllm.head_still_blocked``)
    must not fit."""
    c = s.count
    if (c[BLOCKED_KIND] == NOT_BLOCKED or c[WAITING_LEN] == 0 or c[BLOCKED_EPOCH] != c[FREE_EPOCH]
            or c[BLOCKED_REQUEST] != s.waiting[c[WAITING_HEAD]]):
        return
    i = int(c[BLOCKED_REQUEST])
    if c[BLOCKED_KIND] == BLOCKED_ON_MAX_SEQS:
        assert c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS], \
            f"queue head {i} is skipped as blocked on max_num_seqs but would fit"
        return
    fits = can_allocate(s, i, int(s.prompt_target[i]), s.config[FAMILY_TRAITS])
    assert fits != kv_cache.CAN_ALLOCATE, f"queue head {i} is skipped as blocked but would be admitted"
