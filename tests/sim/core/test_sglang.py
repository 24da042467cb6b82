"""SGLang's RadixAttention serving (``--system sglang``: sim/core/kv/radix_cache.py and
sim/core/sched/scheduler_sglang.py), pinned by tiny cases worked out by hand.

Prompts name their tokens by prefix hashes, one per 4 tokens (``H = 4``): two requests share a
token when they share the chain of hashes up to its block. The tree's functions are called in
CPython (``interpreted``) on a state built for a few requests; the scheduler's rules are read
off the records of tiny runs (one row per iteration, every iteration's state checked: ``--check``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import radix_cache
from pagesim.sim.core.sched import scheduler_sglang
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import OPT13B_SLOT, ConstExecutor
from pagesim.sim.core.kv.radix_cache import (NODE_END, NODE_LAST_ACCESS, NODE_LOCK_REF, NODE_NEXT_SIBLING,
                                             NODE_OWNER, NODE_PARENT, NODE_START, OWNED_NODES, RADIX_ACCESS_CLOCK,
                                             RADIX_EVICTABLE, RADIX_FREE_NODE, RADIX_NODES_USED, RADIX_TREE_TOKENS)
from pagesim.sim.core.sched.scheduler_sglang import MATCH_LEN, NEW_TOKEN_RATIO, WAITING_REFRESHES

H = 4
match_prefix = interpreted(radix_cache.match_prefix)
insert = interpreted(radix_cache.insert)
inc_lock_ref = interpreted(radix_cache.inc_lock_ref)
dec_lock_ref = interpreted(radix_cache.dec_lock_ref)
evict = interpreted(radix_cache.evict)
cached_prefix = interpreted(radix_cache.cached_prefix)
checkpoint = interpreted(radix_cache.checkpoint)
touch_waiting_prefixes = interpreted(scheduler_sglang.touch_waiting_prefixes)
sort_by_longest_prefix = interpreted(scheduler_sglang.sort_by_longest_prefix)


def sglang(slots: int, **settings) -> SimConfig:
    """sglang for OPT-13B with a pool of exactly ``slots`` tokens, every iteration checked."""
    settings.setdefault("max_seq_len", slots)
    settings.setdefault("check", True)
    return SimConfig.for_system("sglang", model="opt-13b", gpu="a100-40gb", kv_gib=slots * OPT13B_SLOT / 2**30,
                                **settings)


def trace(*rows, hashes=None) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens); hashes: one tuple per row (4 tokens each)."""
    arrival, prompt, output = zip(*rows)
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(a) for a in arrival],
                       "prompt_tokens": list(prompt), "output_tokens": list(output)})
    if hashes is not None:
        df["prefix_hashes"] = [tuple(h) for h in hashes]
        df.attrs["hash_block_tokens"] = H
    return df


def column(result, name):
    return result.steps[name].tolist()


def nodes(s):
    """The live nodes as (start, end, owner, lock_ref, parent's start), sorted."""
    n = s.radix_nodes
    return sorted((int(n[x, NODE_START]), int(n[x, NODE_END]), int(n[x, NODE_OWNER]),
                   int(n[x, NODE_LOCK_REF]), int(n[n[x, NODE_PARENT], NODE_START]))
                  for x in range(1, int(s.count[RADIX_NODES_USED])) if n[x, NODE_PARENT] != -2)


# A: 12 tokens (1, 2, 3); B: 12 tokens (1, 2, 9), sharing A's first 8; C: 6 tokens (5, 6);
# E: 10 tokens of which the hashes (1, 2) name 8, its last 2 its own
ROWS = ((0, 12, 1), (0, 12, 1), (0, 6, 1), (0, 10, 1))
HASHES = ((1, 2, 3), (1, 2, 9), (5, 6), (1, 2))
A, B, C, E = 0, 1, 2, 3


def tree(page: int = 1):
    return initial_state(sglang(64, block_size=page), trace(*ROWS, hashes=HASHES))


def test_insert_then_match_splits_the_node_at_the_first_block_whose_hashes_differ():
    """A's 12 tokens make one leaf. B matches its first 8 (blocks 0 and 1 agree, block 2 not):
    the leaf is split into [0, 8) and [8, 12); inserting B adds its own leaf [8, 12) under
    [0, 8), of which 8 tokens were there already."""
    s = tree()
    assert insert(s, A, 12)[1] == 0
    assert nodes(s) == [(0, 12, A, 0, 0)]
    node, depth = match_prefix(s, B, 11)  # its tokens but the last
    assert depth == 8 and s.radix_nodes[node, NODE_END] == 8
    assert nodes(s) == [(0, 8, A, 0, 0), (8, 12, A, 0, 0)]
    assert insert(s, B, 12)[1] == 8
    assert nodes(s) == [(0, 8, A, 0, 0), (8, 12, A, 0, 0), (8, 12, B, 0, 0)]
    assert s.count[RADIX_TREE_TOKENS] == 16 and s.count[RADIX_EVICTABLE] == 16
    assert match_prefix(s, C, 5)[1] == 0  # nothing shared with (5, 6)


def test_a_match_stops_at_its_limit_and_where_the_named_tokens_end():
    """A match is at most its limit (a request's tokens but the last), and a request's tokens
    past its hashes are its own: A matches 8 of E's 10 (E's last 2 are E's), E 8 of A's (the same
    rule the other way); A matches 11 of its own 12 (its limit)."""
    s = tree()
    insert(s, E, 10)
    assert match_prefix(s, A, 11)[1] == 8
    s = tree()
    insert(s, A, 12)
    assert match_prefix(s, E, 9)[1] == 8
    assert match_prefix(s, A, 11)[1] == 11


def test_a_request_matches_its_own_tokens_past_its_hashes():
    """A's 12 tokens cached, then E's 10: E shares A's first 8 (its hashes name no more), so A's
    leaf is split at 8 and E's last 2 are a leaf of E's own beside A's [8, 12). E then matches
    all 10: past its hashes only its own node can match, and that one does."""
    s = tree()
    insert(s, A, 12)
    insert(s, E, 10)
    assert nodes(s) == [(0, 8, A, 0, 0), (8, 10, E, 0, 0), (8, 12, A, 0, 0)]
    assert match_prefix(s, E, 10)[1] == 10


def test_a_request_without_hashes_matches_only_its_own_nodes_and_counts_them():
    """Requests F (12 tokens) and G (8), no hashes: each names its tokens alone. F's 12 inserted:
    F owns one node (OWNED_NODES), and matches its 11 (split at 11: it owns two); G, owning none,
    matches nothing, the walk's tick of the clock all the same. Evicting 1 token takes F's leaf
    [11, 12): F owns one again."""
    s = initial_state(sglang(64), trace((0, 12, 1), (0, 8, 1), hashes=((), ())))
    F, G = 0, 1
    insert(s, F, 12)
    assert s.radix_request[F, OWNED_NODES] == 1
    assert match_prefix(s, F, 11)[1] == 11 and s.radix_request[F, OWNED_NODES] == 2
    clock = int(s.count[RADIX_ACCESS_CLOCK])
    assert match_prefix(s, G, 7)[1] == 0 and s.count[RADIX_ACCESS_CLOCK] == clock + 1
    evict(s, 1)
    assert nodes(s) == [(0, 11, F, 0, 0)] and s.radix_request[F, OWNED_NODES] == 1


def test_pages_match_and_split_whole_pages_only():
    """Page 4: A's 11-token limit matches 8 of its cached 12 (two pages), not 11 (page 1)."""
    s = tree(page=4)
    insert(s, A, 12)
    node, depth = match_prefix(s, A, 11)
    assert depth == 8 and nodes(s) == [(0, 8, A, 0, 0), (8, 12, A, 0, 0)]


def test_locks_run_from_the_node_to_the_root_and_take_tokens_out_of_the_evictable():
    """Locking B's leaf locks it and [0, 8): 12 of the 16 tokens are protected, A's leaf (4)
    evictable; unlocking gives them back."""
    s = tree()
    insert(s, A, 12)
    leaf, _ = insert(s, B, 12)
    inc_lock_ref(s, leaf)
    assert nodes(s) == [(0, 8, A, 1, 0), (8, 12, A, 0, 0), (8, 12, B, 1, 0)]
    assert s.count[RADIX_EVICTABLE] == 4
    inc_lock_ref(s, leaf)
    dec_lock_ref(s, leaf)
    assert s.count[RADIX_EVICTABLE] == 4
    dec_lock_ref(s, leaf)
    assert s.count[RADIX_EVICTABLE] == 16 and nodes(s)[0][3] == 0


def test_eviction_takes_the_least_recently_accessed_unlocked_leaf_first():
    """Inserted A (12), then C (6), then A's whole path matched again: C's leaf is now the least
    recently accessed, so evicting 1 token frees C's 6, and the next eviction A's 12."""
    s = tree()
    insert(s, A, 12)
    insert(s, C, 6)
    match_prefix(s, A, 12)  # a whole node: no split
    assert evict(s, 1) == 6
    assert nodes(s) == [(0, 12, A, 0, 0)]
    assert evict(s, 1) == 12 and nodes(s) == []
    assert s.count[RADIX_TREE_TOKENS] == 0 and s.count[state.NUM_EVICTIONS] == 2


def test_a_node_is_stamped_before_it_is_split_and_a_new_node_is_newer():
    """SGLang stamps a node its walk reaches, then splits it (radix_cache.py:660, :663): the
    part below keeps the walk's time, the part above is a new node, newer still. A match that
    ends inside A's leaf leaves both parts newer than C's leaf: C goes first, then A's lower
    part [11, 12) (its parent is no leaf)."""
    s = tree()
    insert(s, A, 12)
    insert(s, C, 6)
    match_prefix(s, A, 11)
    assert evict(s, 1) == 6
    assert nodes(s) == [(0, 11, A, 0, 0), (11, 12, A, 0, 0)]
    assert evict(s, 1) == 1 and nodes(s) == [(0, 11, A, 0, 0)]


def test_an_inserted_leaf_is_newer_than_the_part_split_off_beside_it():
    """Inserting B splits A's leaf at 8: A's lower part [8, 12) is stamped by the walk, B's new
    leaf after it (TreeNode reads the clock: radix_cache.py:259), so A's part is evicted first,
    whatever rows they sit in: here X's and Y's, evicted before, are reused (the split's upper
    part takes Y's, B's leaf X's, below A's row); the shared [0, 8) stays while B's leaf holds it."""
    x, y, a, b = range(4)
    s = initial_state(sglang(64), trace((0, 4, 1), (0, 4, 1), (0, 12, 1), (0, 12, 1),
                                        hashes=((7,), (8,), (1, 2, 3), (1, 2, 9))))
    insert(s, x, 4)
    insert(s, y, 4)
    insert(s, a, 12)
    assert evict(s, 8) == 8 and nodes(s) == [(0, 12, a, 0, 0)]
    insert(s, b, 12)
    assert evict(s, 1) == 4
    assert nodes(s) == [(0, 8, a, 0, 0), (8, 12, b, 0, 0)]


def test_a_checkpoint_past_the_prompt_splits_the_leaf_at_the_prompts_end():
    """SGLang 0.5.23's checkpoint (radix_cache.py:485-502) inserts A's 15 tokens (its prompt of 12
    and 3 generated), then its prompt's 12 again: no token more, but the leaf is split at 12, the
    prompt's part above (a new node, stamped after the output's part). C's 6 come after. Evicting
    1 token then frees the output's 3 alone; the next, the prompt's 12 (older than C); then C."""
    s = tree()
    x = checkpoint(s, A, 15)  # the node the first insert made, which keeps its row (the output's part)
    assert nodes(s) == [(0, 12, A, 0, 0), (12, 15, A, 0, 0)]
    assert (s.radix_nodes[x, NODE_START], s.radix_nodes[x, NODE_END]) == (12, 15)
    assert s.count[RADIX_TREE_TOKENS] == 15 and s.count[RADIX_EVICTABLE] == 15
    insert(s, C, 6)
    assert evict(s, 1) == 3 and nodes(s) == [(0, 6, C, 0, 0), (0, 12, A, 0, 0)]
    assert evict(s, 1) == 12 and evict(s, 1) == 6


def test_a_checkpoint_within_the_prompt_or_its_pages_is_one_insert():
    """No second insert where the tokens end within the prompt (a chunk: 8 of A's 12) or at its
    whole pages' end (page 4: E's 10-token prompt has 8 in whole pages; 8 tokens checkpointed):
    one node, and the clock ticks as one insert's (its walk and its new node). Past the whole
    pages (12 of E's tokens at page 4) the split is at 8, not 10."""
    s = tree()
    checkpoint(s, A, 8)
    assert nodes(s) == [(0, 8, A, 0, 0)] and s.count[RADIX_ACCESS_CLOCK] == 2
    s = tree(page=4)
    checkpoint(s, E, 8)
    assert nodes(s) == [(0, 8, E, 0, 0)] and s.count[RADIX_ACCESS_CLOCK] == 2
    s = tree(page=4)
    checkpoint(s, E, 12)
    assert nodes(s) == [(0, 8, E, 0, 0), (8, 12, E, 0, 0)]


def waiting(s, *requests):
    """The waiting queue holds ``requests``, the first at its head."""
    for k, r in enumerate(requests):
        s.waiting[k] = r
    s.count[state.WAITING_HEAD], s.count[state.WAITING_LEN] = 0, len(requests)


@pytest.mark.parametrize("queue, first_evicted", [((B, C), 6), ((C, B), 4)])
def test_fcfs_touches_the_waiting_prefixes_head_last(queue, first_evicted):
    """SGLang's fcfs pass walks the waiting requests' tokens from the tree, the head last
    (_touch_waiting_prefixes, schedule_policy.py:281-302). A inserted, then C: A is the older.
    With B and C waiting, B at the head: C's walk, then B's, which shares A's first 8 tokens and
    splits A's leaf there, A's [8, 12) stamped by B's walk: C's leaf is now the least recently
    accessed (6 tokens go first; untouched, A's 12 would). With C at the head, B's walk comes
    first: A's [8, 12) goes first (4)."""
    s = tree()
    insert(s, A, 12)
    insert(s, C, 6)
    waiting(s, *queue)
    touch_waiting_prefixes(s)
    assert nodes(s) == [(0, 6, C, 0, 0), (0, 8, A, 0, 0), (8, 12, A, 0, 0)]
    assert evict(s, 1) == first_evicted


def test_fcfs_touches_the_waiting_prefixes_one_pass_in_32():
    """The first pass over a waiting queue touches it, the next 31 do not, the 33rd does
    (WAITING_PREFIX_REFRESH_INTERVAL, schedule_policy.py:139, :295-300); a pass over an empty
    queue is not counted (:287)."""
    s = tree()
    insert(s, A, 12)
    touch_waiting_prefixes(s)  # nobody waits: not a pass
    assert s.count[WAITING_REFRESHES] == 0
    waiting(s, A)
    clocks = []
    for _ in range(33):
        before = int(s.count[RADIX_ACCESS_CLOCK])
        touch_waiting_prefixes(s)
        clocks.append(int(s.count[RADIX_ACCESS_CLOCK]) - before)
    assert clocks == [1] + [0] * 31 + [1] and s.count[WAITING_REFRESHES] == 33


# 40-token prompts (10 hashes): P; V shares P's first 36 tokens, W and Y its first 32 (and W's
# next blocks differ from Y's); Z shares nothing; P2 is P again
IN_BATCH_HASHES = (tuple(range(1, 11)), tuple(range(1, 10)) + (40,), tuple(range(1, 9)) + (60, 61),
                   tuple(range(1, 9)) + (70, 71), tuple(range(80, 90)), tuple(range(1, 11)))
P, V, W, Y, Z, P2 = range(6)


def in_batch_tree():
    return initial_state(sglang(256), trace(*[(0, 40, 1)] * 6, hashes=IN_BATCH_HASHES))


def test_lpm_puts_last_a_request_sharing_32_tokens_with_one_ahead_in_the_queue():
    """P's 40 tokens cached; V, W, Y, Z wait in that order. V matches 36 of the tree: more than 32,
    so it is neither checked nor put in the waiting-queue tree (schedule_policy.py:365). W matches
    32, at most 32: checked, it shares 32 with V but V is not in that tree: W joins it. Y matches
    32: it shares 32 with W ahead of it, so it goes last (:376-382). Z matches nothing and shares
    nothing: it joins. Sorted (keys V 36, W 32, Z 0, Y last): V, W, Z, Y."""
    s = in_batch_tree()
    insert(s, P, 40)
    waiting(s, V, W, Y, Z)
    sort_by_longest_prefix(s)
    assert [int(s.waiting[k]) for k in range(4)] == [V, W, Z, Y]
    assert [int(s.radix_request[r, MATCH_LEN]) for r in (V, W, Y, Z)] == [36, 32, -1, 0]


def test_lpm_puts_last_a_request_whose_hashes_name_exactly_the_32_tokens_it_shares():
    """P's 40 tokens cached; W, X, Z wait. X's hashes name 32 tokens (P's first 32, its last 8 its
    own): it matches 32 of the tree, is checked, and shares all 32 it names with W ahead of it
    (in that tree): last. Sorted (keys W 32, Z 0, X last): W, Z, X."""
    x_hashes = tuple(range(1, 9))
    s = initial_state(sglang(256), trace(*[(0, 40, 1)] * 6, hashes=IN_BATCH_HASHES[:5] + (x_hashes,)))
    X = 5
    insert(s, P, 40)
    waiting(s, W, X, Z)
    sort_by_longest_prefix(s)
    assert [int(s.waiting[k]) for k in range(3)] == [W, Z, X]
    assert [int(s.radix_request[r, MATCH_LEN]) for r in (W, X, Z)] == [32, -1, 0]


def test_lpm_matches_a_waiting_request_on_all_its_tokens_and_keys_it_by_all_but_the_last():
    """P's 40 tokens cached; P2 (the same 40) waits: lpm's match takes all 40 (match_kv_cache
    without a limit, schedule_policy.py:353-354), so P's leaf is not split, and the key is 39,
    the tokens but the last (num_matched_prefix_tokens, common.py:260-261)."""
    s = in_batch_tree()
    insert(s, P, 40)
    waiting(s, P2)
    sort_by_longest_prefix(s)
    assert int(s.radix_request[P2, MATCH_LEN]) == 39 and nodes(s) == [(0, 40, P, 0, 0)]


def test_a_routers_reading_of_the_tree_changes_nothing():
    """cached_prefix (a cluster's prefix-affinity router): the match's length, whole pages,
    without the match's split or access times."""
    s = tree()
    insert(s, A, 12)
    before, clock = s.radix_nodes.copy(), s.count[RADIX_ACCESS_CLOCK]
    assert cached_prefix(s, B, 11) == 8 and cached_prefix(s, A, 11) == 11 and cached_prefix(s, C, 5) == 0
    assert (s.radix_nodes == before).all() and s.count[RADIX_ACCESS_CLOCK] == clock
    s = tree(page=4)
    insert(s, A, 12)
    assert cached_prefix(s, A, 11) == 8


def test_eviction_frees_unlocked_leaves_only_and_a_parent_once_it_is_a_leaf():
    """A and B share [0, 8); B's leaf locked: evicting everything frees A's leaf (4) only: the
    shared [0, 8) is locked through B. Unlocked, [0, 8) goes once B's leaf has gone."""
    s = tree()
    insert(s, A, 12)
    leaf, _ = insert(s, B, 12)
    inc_lock_ref(s, leaf)
    assert evict(s, 100) == 4
    assert nodes(s) == [(0, 8, A, 1, 0), (8, 12, B, 1, 0)]
    dec_lock_ref(s, leaf)
    assert evict(s, 100) == 12 and nodes(s) == []
    assert s.count[RADIX_TREE_TOKENS] == 0 and s.count[RADIX_EVICTABLE] == 0


def test_a_parent_is_evicted_only_after_its_children():
    """A, then B (splitting A's leaf: [0, 8) accessed with B's leaf, A's [8, 12) keeping its older
    time). Evicting 1 token frees A's [8, 12); the next, B's leaf (as recent as [0, 8), which is
    not a leaf yet); then [0, 8)."""
    s = tree()
    insert(s, A, 12)
    insert(s, B, 12)
    assert evict(s, 1) == 4 and nodes(s) == [(0, 8, A, 0, 0), (8, 12, B, 0, 0)]
    assert evict(s, 1) == 4 and nodes(s) == [(0, 8, A, 0, 0)]
    assert evict(s, 1) == 8 and nodes(s) == []


def test_one_eviction_takes_leaves_by_access_time_then_row():
    """Eight leaves under the root (requests 0..7, 4 tokens each, rows 1..8 in insertion order),
    their access times set by hand to 5, 2, 7, 2, 1, 9, 2, 4. One eviction of 20 tokens frees five
    leaves, least recently accessed first and ties by the lower row: rows 5 (1), 2, 4, 7 (2 each),
    8 (4); rows 1, 3 and 6 stay. Freed rows go to the head of the free list, the last first."""
    s = initial_state(sglang(64), trace(*[(0, 4, 1)] * 8, hashes=[(10 + k,) for k in range(8)]))
    for k in range(8):
        insert(s, k, 4)
    access = (5, 2, 7, 2, 1, 9, 2, 4)
    for row, t in enumerate(access, start=1):
        s.radix_nodes[row, NODE_LAST_ACCESS] = t
    assert evict(s, 20) == 20
    assert sorted(int(s.radix_nodes[x, NODE_OWNER]) for x in (1, 3, 6)) == [0, 2, 5]
    assert [start for start, *_ in nodes(s)] == [0, 0, 0] and len(nodes(s)) == 3
    freed, x = [], int(s.count[RADIX_FREE_NODE])
    while x >= 0:
        freed.append(x)
        x = int(s.radix_nodes[x, NODE_NEXT_SIBLING])
    assert freed == [8, 7, 4, 2, 5]


def test_prefill_first_and_a_finished_request_is_cached_for_the_next():
    """Pool 64, page 1. A (8 tokens (1, 2), 2 out) at 0; B (the same 8 tokens, 2 out) at 10.

    step 0  prefill A (8): token states 8, free 56
    step 1  decode A (its 9th token's K/V; its 2nd and last token): 9, free 55. A finishes: its
            9 tokens go into the tree, unlocked (free: cached, nobody's)
    step 2  B matches 7 (its tokens but the last): locked, 1 to compute: token states 7 + 1,
            free 54 available + the 2 tokens of A's evictable leaf
    step 3  decode B: 9, free 55"""
    result = run_simulation(sglang(64), trace((0, 8, 2), (10, 8, 2), hashes=((1, 2), (1, 2))))
    assert column(result, "num_prefill_tokens") == [8, 0, 1, 0]
    assert column(result, "num_decode_tokens") == [0, 1, 0, 1]
    assert column(result, "mem_token_states") == [8, 9, 8, 9]
    assert column(result, "mem_free_idle") == [56, 55, 56, 55]
    assert result.summary["mgr_prefix_hit_tokens"] == 7
    assert result.summary["prefix_cache_hit_rate"] == 7 / 16


def test_a_finished_request_is_evicted_output_first_and_its_prompt_still_hits():
    """Pool 64, page 1. A (8 tokens (1, 2), 4 out) finishes with 11 tokens computed: checkpointed
    as its prompt's 8 and its output's 3, split (SGLang 0.5.23, radix_cache.py:485-502). B (55
    of its own tokens, 1 out) at 5 s finds 53 available: 2 short, the least recent leaf, A's
    output's 3, is evicted alone. C (A's 8 prompt tokens, 1 out) at 10 s still matches 7 of them."""
    result = run_simulation(sglang(64), trace((0, 8, 4), (5, 55, 1), (10, 8, 1), hashes=((1, 2), (9,), (1, 2))))
    assert result.summary["mgr_prefix_hit_tokens"] == 7
    assert result.summary["mgr_evictions"] == 1


def test_a_prompt_is_cached_once_prefilled_and_hits_while_its_request_runs():
    """SGLang 0.5.23 puts a prompt into the tree after its prefill batch, locked by its request
    (``checkpoint_kv_cache``, batch_result_processor.py:393-394): B (A's 8 tokens) arrives while A
    still decodes and matches 7 of them, computing 1."""
    result = run_simulation(sglang(128), trace((0, 8, 50), (0.2, 8, 2), hashes=((1, 2), (1, 2))))
    assert result.summary["mgr_prefix_hit_tokens"] == 7
    assert column(result, "num_prefill_tokens")[:3] == [8, 0, 0] and 1 in column(result, "num_prefill_tokens")


def test_pages_leave_internal_fragmentation_and_cache_whole_pages():
    """Page 4: A's 10 prompt tokens take 3 pages (2 slots unfilled); B, the same 10 tokens
    later, finds A's 2 whole pages (8 tokens: the tree holds whole pages only) and computes 2."""
    result = run_simulation(sglang(64, block_size=4),
                            trace((0, 10, 1), (10, 10, 1), hashes=((1, 2, 3), (1, 2, 3))))
    assert column(result, "num_prefill_tokens") == [10, 2]
    assert column(result, "mem_token_states") == [10, 10]
    assert column(result, "mem_internal_frag") == [2, 2]
    assert column(result, "mem_free_idle") == [52, 52]


def test_a_long_prompt_is_chunked_and_its_chunks_are_cached_as_they_go():
    """chunk 4 (chunked_prefill_size), pool 64. A (10 tokens) at 0; B (A's tokens) during A's
    first chunk.

    step 0  A's first chunk: 4
    step 1  A's computed 4 go into the tree (cache_unfinished_req); its next chunk, 4, spends
            the budget: B matches A's 4 but its 6 do not fit the chunk budget left (0)
    step 2  A's 8 are in the tree; its last 2 (its first token), then B: it matches 8 (its limit
            is 9, A's 9th is not computed yet) and computes its last 2 within the budget's 2"""
    result = run_simulation(sglang(64, chunk_budget=4),
                            trace((0, 10, 1), (0.001, 10, 1), hashes=((1, 2, 3), (1, 2, 3))))
    assert column(result, "num_prefill_tokens") == [4, 4, 2 + 2]
    assert column(result, "batch_size") == [1, 1, 2]
    assert result.summary["mgr_prefix_hit_tokens"] == 8


def test_admission_counts_the_running_requests_future_tokens():
    """1 s steps, pool 64, requests that may stop at EOS (``--no-ignore-eos``). A (10 tokens, 40
    out) at 0, B (20 tokens, 10 out) at 0.5.

    step 0  the adder takes A (10 + 40 + a page of 1 < 64)
    step 1  B needs 20 + 10 + 1 below (64 - A's 10) - A's remaining 39 tokens x new_token_ratio
            0.7: 31 is not below 26.7 (NO_TOKEN): the batch is full until a request leaves
            (without the estimate it would be taken at once), so B waits for A to finish"""
    result = run_simulation(sglang(64, ignore_eos=False), trace((0, 10, 40), (0.5, 20, 10)),
                            executor=ConstExecutor())
    prefill = column(result, "num_prefill_tokens")
    assert prefill == [10] + [0] * 39 + [20] + [0] * 9
    assert column(result, "mem_external_frag")[1] > 0  # B waits for memory
    assert result.requests["first_token_s"][1] >= result.requests["finish_s"][0]


def test_schedule_conservativeness_scales_the_estimate():
    """The same with conservativeness 0.01 and --no-ignore-eos (ratio 0.007): at step 1 B's 31 is below
    (64 - 10) - 39 x 0.007, so it is taken at once."""
    result = run_simulation(sglang(64, schedule_conservativeness=0.01, ignore_eos=False),
                            trace((0, 10, 40), (0.5, 20, 10)), executor=ConstExecutor())
    assert column(result, "num_prefill_tokens")[:2] == [10, 20]


def test_a_prefill_while_nothing_ran_replaces_the_full_batch_and_admission_is_tried_again():
    """Pool 300, 1 s steps, --no-ignore-eos. A, B, C, D (10 tokens, 100 out) at 0. Step 0: A and B
    are taken (10 + 100 + a page = 111 each, below 300 and 189), C's 111 is not below 78: the
    running batch, empty, is marked full (scheduler.py:4282-4284). Step 1: that prefill's batch,
    never marked, becomes the running batch (:3957-3958), so admission is tried again: C's 111 is
    below (300 - 20) - 2 x 99 x 0.7 = 141.4, and D's is not below 30.4. Without the replacement the
    batch stays full and step 1 decodes A and B."""
    result = run_simulation(sglang(300, ignore_eos=False), trace(*[(0, 10, 100)] * 4), executor=ConstExecutor())
    assert column(result, "num_prefill_tokens")[:3] == [20, 10, 0]
    assert column(result, "num_decode_tokens")[:3] == [0, 0, 3]


@pytest.mark.parametrize("ignore_eos, prefill", [
    (False, [10, 20]),  # 35 below (64 - 10) - 19 x 0.7 = 40.7: taken at once
    (True, [10] + [0] * 19 + [20]),  # 35 not below 54 - 19 = 35: B waits for A to finish
    (None, [10] + [0] * 19 + [20]),  # the default: ignore_eos
])
def test_with_ignore_eos_a_running_requests_remaining_output_is_charged_whole(ignore_eos, prefill):
    """1 s steps, pool 64. A (10 tokens, 20 out) at 0, B (20 tokens, 14 out) at 0.5. At step 1 B
    needs 20 + 14 + a page = 35 below (64 - A's 10) less A's 19 remaining tokens, at
    new_token_ratio 0.7 without ignore_eos, whole with it (schedule_policy.py:785-794)."""
    result = run_simulation(sglang(64, ignore_eos=ignore_eos), trace((0, 10, 20), (0.5, 20, 14)),
                            executor=ConstExecutor())
    assert column(result, "num_prefill_tokens")[:len(prefill)] == prefill


def test_a_request_reserves_a_page_beyond_its_tokens():
    """Pool 64, page 1. A (10, 20 out) and B (12, 20 out) arrive together. The adder charges A
    10 + 20 and a page (per_req_token_overhead, schedule_policy.py:1412; PrefillBudget.reserve,
    prefill_budget.py:166): 31, leaving 33; B's 12 + 20 + 1 is not below 33, so step 0 takes A
    alone and B comes at step 1 (33 below 64 - 10 - A's 19 tokens to go = 35; without the page:
    A 30, leaving 34, and B's 32 below it: both at step 0)."""
    result = run_simulation(sglang(64), trace((0, 10, 20), (0, 12, 20)), executor=ConstExecutor())
    assert column(result, "num_prefill_tokens")[:2] == [10, 12]


def test_a_pass_short_of_memory_keeps_the_batch_full_until_a_request_leaves():
    """Conservativeness 0.01, --no-ignore-eos, pool 64. A (10, 40 out) at 0, B and C (20, 10 out)
    at 0.5. Step 0 takes A alone. Step 1 takes B (31 below 54 - 39 x 0.007 = 53.7); C's 31 is not
    below 53.7 - 31 = 22.7 (NO_TOKEN) with A running: the batch is marked full
    (scheduler.py:4279-4284). At step 2 C would fit (31 below 64 - A's 11 - B's 20, less their
    remaining tokens x 0.007: 32.8), but a full batch tries no one (:4098-4101) until a request
    leaves: C waits for B's 10th token, at step 10."""
    result = run_simulation(sglang(64, schedule_conservativeness=0.01, ignore_eos=False),
                            trace((0, 10, 40), (0.5, 20, 10), (0.5, 20, 10)), executor=ConstExecutor())
    assert column(result, "num_prefill_tokens")[:12] == [10, 20] + [0] * 9 + [20]


@pytest.mark.parametrize("prompt_a, prompt_b, pool, retracted", [(4, 4, 40, 1), (6, 4, 42, 0)])
def test_out_of_memory_retracts_the_fewest_generated_then_the_longest_prompt(prompt_a, prompt_b, pool, retracted):
    """conservativeness 0.01 and --no-ignore-eos (ratio 0.007: the adder all but ignores future tokens), 1 s steps.
    A (30 out) at 0 is taken at step 0; B (30 out) at 0.5 at step 1 (its 4 + 30 + 1 below the
    pool less A's tokens and 29 x 0.007). Both decode
    16 steps, filling the pool; at the 17th neither can grow: equal tokens generated (17), so
    the longer prompt is retracted, or, prompts equal, the later in the batch (B). The other
    decodes on to its end; then the retracted one is recomputed (its prompt and 17 tokens) and
    decodes its last 12."""
    result = run_simulation(sglang(pool, schedule_conservativeness=0.01, ignore_eos=False),
                            trace((0, prompt_a, 30), (0.5, prompt_b, 30)), executor=ConstExecutor())
    prompts = (prompt_a, prompt_b)
    assert result.requests["preemptions"].tolist() == [int(retracted == 0), int(retracted == 1)]
    assert column(result, "num_prefill_tokens") == list(prompts) + [0] * 29 + [prompts[retracted] + 17] + [0] * 12
    assert column(result, "num_decode_tokens") == [0, 0] + [2] * 16 + [1] * 13 + [0] + [1] * 12
    assert result.summary["completed"] == 2


@pytest.mark.parametrize("policy, prefill", [("fcfs", [12, 12, 1]), ("lpm", [12, 1 + 12])])
def test_lpm_takes_the_longest_cached_prefix_first_fcfs_the_arrival_order(policy, prefill):
    """R (12 tokens (1, 2, 3)) runs and is cached. X (7, 8, 9) then Y (R's tokens) arrive together;
    max_prefill_tokens 12. fcfs: X spends the input budget (the pass ends), then Y (11 hits, 1
    computed); lpm: Y (1 computed), then X: with chunked prefill the input budget turns no
    request away (schedule_policy.py:1627-1633), X spends it and the pass ends after it."""
    result = run_simulation(sglang(64, schedule_policy=policy, max_num_batched_tokens=12),
                            trace((0, 12, 1), (1, 12, 1), (1, 12, 1), hashes=((1, 2, 3), (7, 8, 9), (1, 2, 3))))
    assert column(result, "num_prefill_tokens") == prefill
    assert result.summary["mgr_prefix_hit_tokens"] == 11


def test_lpm_falls_back_to_fcfs_beyond_128_waiting():
    from pagesim.sim.core.sched.scheduler_sglang import LPM_QUEUE_LIMIT
    assert LPM_QUEUE_LIMIT == 128


def test_requests_that_never_fit_are_rejected():
    """A request whose prompt, output and a page (add_one_req's check in an empty pool) reach the
    pool, or that runs n > 1 sequences, is rejected; the others run. Pool 64, page 1: 40 + 30 + 1
    and 40 + 23 + 1 reach it; 40 + 22 + 1 = 63 runs (the budget's check is ``>=``)."""
    df = trace((0, 40, 30), (0, 4, 2), (0, 4, 2), (0, 40, 23), (1, 40, 22))
    df["n"] = [1, 1, 2, 1, 1]
    result = run_simulation(sglang(64), df)
    assert result.requests["status"].tolist() == ["rejected", "finished", "rejected", "rejected", "finished"]


@pytest.mark.parametrize("settings, words", [
    (dict(prefix_caching=True), "radix tree"), (dict(preemption="swap"), "swap"),
    (dict(chunked_prefill=True), "chunked_prefill_size")])
def test_settings_sglang_has_not_are_refused(settings, words):
    with pytest.raises(ConfigError, match=words):
        SimConfig.for_system("sglang", **settings)


def test_defaults_follow_the_gpu():
    h100 = SimConfig.for_system("sglang", gpu="h100-80gb")
    assert (h100.block_size, h100.schedule_policy, h100.max_num_batched_tokens, h100.chunk_budget,
            h100.max_num_seqs) == (1, "fcfs", 16384, 8192, 4096)
    assert SimConfig.for_system("sglang", gpu="a100-40gb").chunk_budget == 4096


def test_cli_runs_sglang(capsys):
    rc = main(["simulate", "--system", "sglang", "--page-size", "4", "--schedule-policy", "lpm", "--duration", "5",
               "--rate", "2", "--kv-gib", "2", "--json", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and '"sglang"' in out and '"block_size": 4' in out


def test_retraction_takes_the_fewest_generated_before_the_longest_prompt():
    """Every step takes 1 s. Pool 44, conservativeness 0.01, --no-ignore-eos. A (6 tokens, 30 out) at 0 decodes
    alone in steps 1 and 2 (3 tokens); B (4, 30) arrives at 2.5 and is prefilled at step 3
    (4 + 30 below 44 - 8 - A's 27 x 0.007). Both decode; before their j-th step they hold
    12 + 2(j - 1): the 17th cannot grow. A has 19 tokens, B 17: B is retracted though A's
    prompt is longer."""
    result = run_simulation(sglang(44, schedule_conservativeness=0.01, ignore_eos=False), trace((0, 6, 30), (2.5, 4, 30)),
                            executor=ConstExecutor())
    assert result.requests["preemptions"].tolist() == [0, 1]
    assert column(result, "num_decode_tokens")[:22] == [0, 1, 1, 0] + [2] * 16 + [1, 1]


def test_a_retracted_request_waits_at_the_queue_end_and_the_estimate_jumps():
    """As the retraction test with prompts 4 and 4 (pool 40, 1 s steps: A prefilled in step 0,
    B in 1, both decode in steps 2-17, B retracted in 18), and C (4 tokens, 4 out) arriving at
    17.5 with the pool full. B goes behind C. new_token_ratio becomes min(1, (A's 18 + 20 x 1)
    / (30 + 1)) = 1: at step 19 C's 4 + 4 + 1 is not below (40 - A's 21) - 12 x 1 = 7, so C
    waits (at the old 0.007 it would be taken at once) until A finishes; then C, ahead of B,
    is prefilled first (4 tokens), B's 21 only after."""
    result = run_simulation(sglang(40, schedule_conservativeness=0.01, ignore_eos=False),
                            trace((0, 4, 30), (0.5, 4, 30), (17.5, 4, 4)), executor=ConstExecutor())
    prefill = column(result, "num_prefill_tokens")
    assert result.requests["preemptions"].tolist() == [0, 1, 0]
    assert prefill[:19] == [4, 4] + [0] * 17
    a_done = result.requests["finish_s"][0]
    assert result.requests["first_token_s"][2] > a_done
    later = [n for n in prefill[19:] if n]
    assert later[:2] == [4, 21]


def test_new_token_ratio_decays_while_decodes_fit():
    """1 s steps, pool 1200, ``--no-ignore-eos``. A (10 tokens, 1000 out) and C (10, 30 out) at 0, B (100, 400 out)
    at 0.5. Step 1: B's 501 is not below 1180 - (999 + 29) x 0.7 (NO_TOKEN: the batch is full).
    C's 30th token comes at step 29; at step 30 B is tried again, the ratio decayed 29 times
    by (0.7 - 0.098) / 600 to 0.6709: 501 is below (1200 - A's 39) - 970 x 0.6709 = 510.2 (at
    0.7, 482: B would wait for A's end)."""
    result = run_simulation(sglang(1200, check=False, ignore_eos=False), trace((0, 10, 1000), (0, 10, 30), (0.5, 100, 400)),
                            executor=ConstExecutor())
    assert result.requests["first_token_s"][2] < result.requests["finish_s"][0]
    assert column(result, "num_prefill_tokens").index(100) == 30


def test_retraction_stops_once_the_rest_decodes():
    """Conservativeness 0.01, --no-ignore-eos, pool 66, 1 s steps: A, B, C (4 tokens, 30 out) at 0, 0.5 and 1.5
    are prefilled in steps 0-2, then decode together: 12 + 3k tokens after k steps fill the
    pool at k = 18. The 19th cannot grow: all have 19 tokens generated and equal prompts, so
    C (the latest) is retracted, freeing 22; A and B's step needs 2: it fits, and the
    retraction stops (check_decode_mem, schedule_batch.py:3458-3461), where holding 20 steps of
    the rest (40) would have taken B too. A and B end in the pool's 66 (33 tokens each)."""
    result = run_simulation(sglang(66, schedule_conservativeness=0.01, ignore_eos=False),
                            trace((0, 4, 30), (0.5, 4, 30), (1.5, 4, 30)), executor=ConstExecutor())
    assert result.requests["preemptions"].tolist() == [0, 0, 1]


def test_the_budget_is_checked_again_once_the_prefix_is_locked():
    """1 s steps, pool 64. X (20 tokens, 1 out) and Z (10, 10 out, unshared) at 0: X is cached
    (20 evictable). Y (X's 20, 35 out) at 0.5 matches 19: before the lock its 1 + 35 is below
    64 - Z's 10 - 9 x 0.7; locked, the 19 are not evictable: 36 is not below 35 - 6.3, so Y
    waits until Z has finished (without the second check it would start at step 1)."""
    result = run_simulation(sglang(64), trace((0, 20, 1), (0, 10, 10), (0.5, 20, 35),
                                              hashes=((1, 2, 3, 4, 5), (), (1, 2, 3, 4, 5))),
                            executor=ConstExecutor())
    assert result.requests["first_token_s"][2] > result.requests["finish_s"][1]


class Watch(ConstExecutor):
    """1 s steps, and after each iteration is scheduled (before it completes) the core's
    ``new_token_ratio`` and its count of tree leaves evicted so far; ``at``: {step: f(core)}, run
    on the core then."""

    def __init__(self, at=None):
        super().__init__()
        self.ratio, self.evictions, self.at = [], [], at or {}

    def step(self, core) -> float:
        self.ratio.append(float(core.clock[NEW_TOKEN_RATIO]))
        self.evictions.append(int(core.count[state.NUM_EVICTIONS]))
        if len(self.ratio) - 1 in self.at:
            self.at[len(self.ratio) - 1](core)
        return super().step(core)


def test_the_ratio_after_a_retraction_is_over_max_new_plus_one():
    """Conservativeness 0.01, --no-ignore-eos (ratio 0.007), pool 70, 1 s steps. A (4 tokens, 60 out) at 0 is
    prefilled in step 0, B (40, 20 out) at 0.5 in step 1 (its 40 + 20 + 1 below 70 - 4 - 59 x
    0.007). Both decode from step 2: before step k they hold 44 + 2(k - 2) tokens, so steps 2-14
    fit (70 after step 14) and step 15 cannot grow. Each has generated 1 + 13 = 14 tokens: B, the
    longer prompt, is retracted. A is left: new_token_ratio = min(1, (A's 14 generated + 20 x 1
    running) / (A's max_new 60 + 1)) = 34 / 61 = 0.5574 (estimate_new_token_ratio_after_retract,
    new_token_ratio_tracker.py:41-49; over 60 it would be 0.5667), then it decays from there."""
    watch = Watch()
    result = run_simulation(sglang(70, schedule_conservativeness=0.01, ignore_eos=False), trace((0, 4, 60), (0.5, 40, 20)),
                            executor=watch)
    assert result.requests["preemptions"].tolist() == [0, 1]
    assert column(result, "num_decode_tokens")[:17] == [0, 0] + [2] * 13 + [1, 1]
    assert watch.ratio[14] == pytest.approx(0.007 - 13 * (0.007 - 0.00098) / 600)
    assert watch.ratio[15] == pytest.approx(34 / 61, rel=1e-12)


def test_a_continuing_chunk_takes_the_whole_chunk_budget_when_memory_holds_nothing():
    """Pool 110, chunks of 8, 1 s steps, ``--no-ignore-eos``. A (4 tokens, 100 out) is prefilled in step 0 (4 + 100 +
    1 below 110); B (20 tokens, 1 out) at 0.5 is admitted in step 1 (20 + 1 + 1 below 110 - 4 -
    A's 99 x 0.7 = 36.7) and chunked: 8. A natural run does not reach memory holding nothing
    for the continuing chunk (B was admitted against the same estimate and nothing decodes
    between its chunks), so here the ratio is raised to 1 after step 1 (as a retraction's can
    be). Step 2: free + evictable = 110 - A's 4 - B's 8 = 98, less A's 99 x 1 = -1: no room,
    so the chunk takes the whole budget, 8 (available_chunk_tokens, prefill_budget.py:142-145);
    step 3: B's last 4 (98 - 8 - 99 < 0 again: the budget, 8, of which 4 are left to do)."""

    def raise_ratio(core):
        core.clock[NEW_TOKEN_RATIO] = 1.0

    watch = Watch(at={1: raise_ratio})
    result = run_simulation(sglang(110, chunk_budget=8, ignore_eos=False), trace((0, 4, 100), (0.5, 20, 1)),
                            executor=watch)
    assert column(result, "num_prefill_tokens")[:5] == [4, 8, 8, 4, 0]
    assert watch.ratio[:4] == [0.7, 0.7, 1.0, 1.0]
    assert result.summary["completed"] == 2


@pytest.mark.parametrize("page, evicted", [(4, 2), (1, 0)])
def test_the_allocator_evicts_for_a_prefill_batch_and_a_page_per_request(page, evicted):
    """Pool 64, 1 s steps. Twelve 4-token requests (1 out, unshared) at 0, 1, ..., 11 are each
    prefilled and finished in their step: 12 leaves of 4 in the tree (48 evictable), 16
    available. X and Y (8 tokens each, unshared) at 12 are admitted together (8 + 1 + page below
    64, then below 64 - (8 + page + 1)). Before allocating, the batch's 16 extend tokens and,
    paged, a page per request: make_room(16 + 2 x 4 = 24) at page 4 is 8 short, two leaves
    (alloc_paged_token_slots_extend, allocation.py:190-201); make_room(16) at page 1 is not
    short (alloc_token_slots, :157). (Without the pages: none; with one page: one leaf.)"""
    rows = [(k, 4, 1) for k in range(12)] + [(12, 8, 1), (12, 8, 1)]
    hashes = [(100 + k,) for k in range(12)] + [(1, 2), (3, 4)]
    watch = Watch()
    result = run_simulation(sglang(64, block_size=page), trace(*rows, hashes=hashes), executor=watch)
    assert column(result, "num_prefill_tokens") == [4] * 12 + [16]
    assert watch.evictions == [0] * 12 + [evicted]


def test_the_allocator_evicts_a_page_per_decoding_request():
    """Page 4, pool 32 (8 pages), 1 s steps. Seven 4-token requests C1-C7 (1 out, unshared) at
    0-6, each prefilled and finished in its step: 7 leaves of 4 (28 evictable), 4 available. D
    (5 tokens, 10 out) at 6.5, step 7: make_room(5 + a page) is 5 short: C1 and C2 go (12
    available); D takes 2 pages (4 available), its first page into the tree, locked.
    Decode: step 8 D's 6th token, 9 the 7th, 10 the 8th (its second page full), 11 the 9th in a
    new page (check_decode_mem's make_room(4): 4 available, none short; 0 left). Step 12, the
    10th token needs no new page, but alloc_for_decode evicts a page per decoding request first
    (allocation.py:582-585): make_room(4) with 0 available takes C3. Steps 13-14 (tokens 11, 12)
    have the page; step 15 (the 13th) a new one, 0 left; step 16 (the 14th, D's last) takes C4.
    (Without the decode eviction: none after step 7.)"""
    rows = [(k, 4, 1) for k in range(7)] + [(6.5, 5, 10)]
    hashes = [(100 + k,) for k in range(7)] + [(1,)]
    watch = Watch()
    result = run_simulation(sglang(32, block_size=4), trace(*rows, hashes=hashes), executor=watch)
    assert column(result, "num_prefill_tokens") == [4] * 7 + [5] + [0] * 9
    assert watch.evictions == [0] * 7 + [2] * 5 + [3] * 4 + [4]


def test_an_fcfs_pass_touches_the_waiting_prefixes_before_it_admits():
    """fcfs, pool 64, chunks of 48, 1 s steps. F0-F29 (4 tokens (9,), 1 out) at 0-29, one pass
    each (passes 0-29): F's leaf was last touched in pass 29. A (12 tokens (1, 2, 3), 1 out) at
    30 (pass 30), C (6 tokens (5, 6), 1 out) at 31 (pass 31): the tree holds F (4), A (12), C (6),
    least recent first; 42 available. X (48 of its own, 1 out) and W (A's 12 and 4 more) at 32:
    pass 32 is a touching one (one in 32, schedule_policy.py:295-300): W's walk stamps A's leaf,
    then X's, the head last. X takes the chunk budget; its 48 are 6 short: F's two nodes (split
    at 3 by the fillers' matches: 4 tokens) and then the least recent, C (the untouched order
    would take A). Step 33: W matches A's 12 and computes 4 (A evicted: 16)."""
    rows = [(k, 4, 1) for k in range(30)] + [(30, 12, 1), (31, 6, 1), (32, 48, 1), (32, 16, 1)]
    hashes = [(9,)] * 30 + [(1, 2, 3), (5, 6), tuple(range(20, 32)), (1, 2, 3, 4)]
    watch = Watch()
    result = run_simulation(sglang(64, chunk_budget=48), trace(*rows, hashes=hashes), executor=watch)
    assert column(result, "num_prefill_tokens") == [4] + [1] * 29 + [12, 6, 48, 4]
    assert watch.evictions[32] == 3
    assert result.summary["mgr_prefix_hit_tokens"] == 29 * 3 + 12


def test_the_radix_caches_tables_do_not_grow_with_the_pool():
    """sglang counts its pool's pages (radix_cache.py): nothing lists its 167,772,160 pages (a
    one-layer model of 256 B a token in 40 GiB, page 1), and the tree has a row per page of the six
    requests' keys (780 + 6 x 20 = 900) and 3, not per page of the pool: the state holds under a MB,
    where the free list alone took 640 MiB."""
    from tests.sim.helpers import tiny_model

    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(6)], "arrival_s": [0.1 * i for i in range(6)],
                          "prompt_tokens": [100, 200, 300, 50, 60, 70], "output_tokens": [20] * 6})
    s = initial_state(SimConfig.for_system("sglang", model=tiny_model(), gpu="h100-80gb", kv_gib=40,
                                           max_seq_len=4096), trace)
    assert s.config[state.NUM_BLOCKS] == 40 * 2**30 // 256
    assert len(s.free_block_ids) == 0 and len(s.radix_nodes) == 1 + 900 + 2
    assert sum(a.nbytes for a in s if isinstance(a, np.ndarray)) < 2**20
