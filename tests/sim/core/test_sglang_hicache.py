"""SGLang 0.5.23's hierarchical cache (``--system sglang --kv-offload-gib N``: sim/core/kv/radix_cache.py)
pinned by tiny cases worked out by hand (docs/notes/sglang-hicache.md, section 7's example).

OPT-13B on an A100: 819,200 KV bytes a token, the host link 25e9 bytes/s, so a token (page 1)
takes 819,200 / 25e9 = 32.768 us over it, either way; 40 layers. A device pool of 24 tokens; a
host pool of ``host`` tokens is ``host + 1`` pages (SGLang's padding page, pool_host/base.py:
227-230). Prompts name their tokens by prefix hashes, one per 4 tokens (``H = 4``):

    A: 16 tokens (1, 2, 3, 4)      B: 16 tokens (1, 2, 3, 9): A's first 12, then its own 4
    D: 16 tokens (5, 6, 7, 8)      C: 12 tokens (5, 6, 10): D's first 8, then its own 4
    P: 8 tokens (11, 12)   Q: 8 tokens (13, 14)   R: 12 tokens (15, 16, 17)   T: 12 (18, 19, 20)

The tree's functions are called in CPython (``interpreted``) on a state built for these requests;
the scheduler's and the price's rules are read off tiny runs, every iteration checked (``--check``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.events import replay
from pagesim.sim.core.kv import radix_cache
from pagesim.sim.core.sched import scheduler_sglang
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import initial_state, prepare, result, run_simulation
from tests.sim.helpers import OPT13B_SLOT
from pagesim.sim.core.kv.radix_cache import (HICACHE_LAYERS, HICACHE_PENDING, NODE_END, NODE_EVICTED, NODE_LOCK_REF,
                                             NODE_ON_HOST, NODE_OWNER, NODE_PARENT, NODE_START, RADIX_EVICTABLE,
                                             RADIX_NODES_USED, RADIX_PRIVATE_PAGES, RADIX_TREE_TOKENS,
                                             STEP_LOAD_TOKENS)
from pagesim.sim.core.sched.scheduler_sglang import EXTEND_LEN, MATCH_LEN

H = 4
TOKEN_S = OPT13B_SLOT / 25e9  # a token over the host link: 32.768 us
checkpoint = interpreted(radix_cache.checkpoint)
match_prefix = interpreted(radix_cache.match_prefix)
evict = interpreted(radix_cache.evict)
acknowledge = interpreted(radix_cache.acknowledge)
load_back = interpreted(radix_cache.load_back)
device_node = interpreted(radix_cache.device_node)
step_price = interpreted(radix_cache.step_price)
get_new_batch_prefill = interpreted(scheduler_sglang.get_new_batch_prefill)
sort_by_longest_prefix = interpreted(scheduler_sglang.sort_by_longest_prefix)

ROWS = {"A": (16, (1, 2, 3, 4)), "B": (16, (1, 2, 3, 9)), "D": (16, (5, 6, 7, 8)), "C": (12, (5, 6, 10)),
        "P": (8, (11, 12)), "Q": (8, (13, 14)), "R": (12, (15, 16, 17)), "T": (12, (18, 19, 20))}
A, B, D, C, P, Q, R, T = range(8)


def sglang(slots: int, host: int, **settings) -> SimConfig:
    """sglang for OPT-13B, a pool of ``slots`` tokens and a host tier of ``host`` tokens (+ a page)."""
    settings.setdefault("max_seq_len", slots)
    settings.setdefault("check", True)
    return SimConfig.for_system("sglang", model="opt-13b", gpu="a100-40gb", kv_gib=slots * OPT13B_SLOT / 2**30,
                                kv_offload_gib=host * OPT13B_SLOT / 2**30, **settings)


def trace(*rows) -> pd.DataFrame:
    """rows: (arrival_s, request name, output tokens)."""
    df = pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))],
                       "arrival_s": [float(r[0]) for r in rows],
                       "prompt_tokens": [ROWS[r[1]][0] for r in rows], "output_tokens": [r[2] for r in rows],
                       "prefix_hashes": [ROWS[r[1]][1] for r in rows]})
    df.attrs["hash_block_tokens"] = H
    return df


def tree(host: int = 48):
    """A state over all eight requests (row k: the k-th name), nothing run."""
    return initial_state(sglang(24, host), trace(*[(0, name, 1) for name in ROWS]))


def nodes(s):
    """The live nodes as (start, end, owner, lock_ref, on device, on host), sorted."""
    n = s.radix_nodes
    return sorted((int(n[x, NODE_START]), int(n[x, NODE_END]), int(n[x, NODE_OWNER]),
                   int(n[x, NODE_LOCK_REF]), int(not n[x, NODE_EVICTED]), int(n[x, NODE_ON_HOST]))
                  for x in range(1, int(s.count[RADIX_NODES_USED])) if n[x, NODE_PARENT] != -2)


def test_the_host_pool_is_the_offload_gib_in_tokens_and_a_padding_page():
    """48 tokens' bytes: 48 pages and SGLang's padding page, 49 (pool_host/base.py:221-230); the
    link's price per page, 32.768 us; OPT-13B's 40 layers."""
    s = tree()
    assert s.config[state.HICACHE_HOST_PAGES] == 49 and s.config[state.HOST_BLOCKS] == 0
    assert s.clock[state.HOST_BLOCK_S] == pytest.approx(32.768e-6)
    assert s.config[HICACHE_LAYERS] == 40


def test_an_insert_writes_its_new_leaf_through_locked_until_its_copy_ends():
    """A's 16 tokens inserted at t = 0: one leaf on both tiers, 16 host pages, locked (not
    evictable) until its copy ends at 16 x 32.768 us = 524.288 us; at 500 us it is still locked,
    at 1 ms acknowledged: evictable."""
    s = tree()
    checkpoint(s, A, 16)
    assert nodes(s) == [(0, 16, A, 1, 1, 1)]
    c = s.count
    assert (c[state.HOST_USED], c[state.HOST_STORED_BLOCKS], c[RADIX_EVICTABLE]) == (16, 16, 0)
    assert s.clock[state.STORE_LINK_FREE_S] == pytest.approx(16 * TOKEN_S)
    s.clock[state.NOW] = 500e-6
    acknowledge(s)
    assert nodes(s) == [(0, 16, A, 1, 1, 1)] and c[HICACHE_PENDING] == 1
    s.clock[state.NOW] = 1e-3
    acknowledge(s)
    assert nodes(s) == [(0, 16, A, 0, 1, 1)] and c[HICACHE_PENDING] == 0 and c[RADIX_EVICTABLE] == 16


def written(host: int = 48, *requests) -> object:
    """``requests`` inserted at t = 0 (written through) and acknowledged at t = 1 s."""
    s = tree(host)
    for r in requests:
        checkpoint(s, r, ROWS["ABDCPQRT"[r]][0])
    s.clock[state.NOW] = 1.0
    acknowledge(s)
    return s


def test_a_device_eviction_demotes_a_backed_up_leaf_and_a_match_walks_and_splits_it():
    """Evicting 9 tokens frees A's whole leaf (16): demoted, host-only, its host pages kept. B's
    match (its 15 tokens but the last) walks into it and splits it at 12: no device prefix (the
    root), a host hit of 12 ([0, 12)), [12, 16) host-only below."""
    s = written(48, A)
    assert evict(s, 9) == 16
    assert nodes(s) == [(0, 16, A, 0, 0, 1)]
    c = s.count
    assert (c[RADIX_TREE_TOKENS], c[RADIX_EVICTABLE], c[state.HOST_USED], c[state.NUM_EVICTIONS]) == (
        0, 0, 16, 1)
    best, depth = match_prefix(s, B, 15)
    assert depth == 12 and device_node(s, best) == radix_cache.ROOT
    assert nodes(s) == [(0, 12, A, 0, 0, 1), (12, 16, A, 0, 0, 1)]


def test_a_leaf_without_a_host_copy_is_deleted():
    """A host pool of 8 tokens (9 pages) cannot take A's 16: the write is dropped, A's leaf
    stays device-only and unlocked; an eviction deletes it."""
    s = tree(8)
    checkpoint(s, A, 16)
    assert nodes(s) == [(0, 16, A, 0, 1, 0)] and s.count[state.HOST_STORED_BLOCKS] == 0
    assert evict(s, 1) == 16 and nodes(s) == [] and s.count[RADIX_TREE_TOKENS] == 0


def test_a_write_evicts_the_least_recently_used_host_leaf_and_is_dropped_when_none_is_left():
    """Host pool 20 tokens (21 pages). P and Q written (16 pages) and demoted; P's match then
    stamps P's node, so Q's is the least recently used host leaf. R's 12 find 5 pages free: Q's
    8 are evicted (R written: 8 + 12 = 20 used). T's 12 then find 1 free: P's 8 are evicted, 9 free,
    still short: T's write is dropped (T device-only, unlocked), R's pending write is no host leaf."""
    s = written(20, P, Q)
    evict(s, 16)
    assert nodes(s) == [(0, 8, P, 0, 0, 1), (0, 8, Q, 0, 0, 1)]
    match_prefix(s, P, 8)
    checkpoint(s, R, 12)
    c = s.count
    assert nodes(s) == [(0, 8, P, 0, 0, 1), (0, 12, R, 1, 1, 1)]
    assert (c[state.HOST_USED], c[state.HOST_EVICTIONS]) == (20, 8)
    checkpoint(s, T, 12)
    assert nodes(s) == [(0, 12, R, 1, 1, 1), (0, 12, T, 0, 1, 0)]
    assert (c[state.HOST_USED], c[state.HOST_EVICTIONS], c[state.HOST_STORED_BLOCKS]) == (12, 16, 16 + 12)


def test_an_insert_writes_a_walked_node_without_a_host_copy():
    """Host pool 12 tokens (13 pages): A's 16 do not fit, its write is dropped. B's insert of its
    first 12 (A's) walks A's leaf and splits it at 12: [0, 12) is past B's inserted tokens (none)
    and has no host copy: written, 12 pages (_finish_insert_walk_node, unified_tree_core.py:
    1368-1381); A's [12, 16) stays device-only."""
    s = tree(12)
    checkpoint(s, A, 16)
    checkpoint(s, B, 12)
    assert nodes(s) == [(0, 12, A, 1, 1, 1), (12, 16, A, 0, 1, 0)]
    assert s.count[state.HOST_USED] == 12


def test_a_write_takes_its_ancestors_without_a_host_copy_first():
    """Host pool 12 tokens (13 pages). Q's 8 written (5 pages free); A's first chunk, [0, 8), finds
    no host leaf to evict: dropped. Q demoted (the older leaf). A's second chunk inserts [8, 16)
    past its inserted 8: the write takes its ancestor [0, 8) first (_build_backup_kv_action,
    unified_tree_core.py:2622-2644): Q's host leaf evicted, [0, 8) written (5 free again); then
    [8, 16) finds no host leaf (A's [0, 8) is on the device): dropped."""
    s = tree(12)
    checkpoint(s, Q, 8)
    s.clock[state.NOW] = 1.0
    acknowledge(s)
    checkpoint(s, A, 8)
    assert nodes(s) == [(0, 8, A, 0, 1, 0), (0, 8, Q, 0, 1, 1)]
    evict(s, 8)
    checkpoint(s, A, 16)
    assert nodes(s) == [(0, 8, A, 1, 1, 1), (8, 16, A, 0, 1, 0)]
    assert (s.count[state.HOST_USED], s.count[state.HOST_EVICTIONS]) == (8, 8)


def test_an_insert_through_a_host_only_node_gives_it_its_device_copy_back():
    """D written and demoted; C's insert (12) walks D's host-only node, split at 8: [0, 8) is on
    the device again from C's own KV, no load (_unevict_node_on_insert, unified_tree_core.py:
    1564-1590), and on the host still; C's new leaf [8, 12) is written (20 pages in use), its
    write's lock on its path, [0, 8) too (the note's section 7: "lock 1 hits 2")."""
    s = written(48, D)
    evict(s, 16)
    checkpoint(s, C, 12)
    assert nodes(s) == [(0, 8, D, 1, 1, 1), (8, 12, C, 1, 1, 1), (8, 16, D, 0, 0, 1)]
    c = s.count
    assert (c[RADIX_TREE_TOKENS], c[state.HOST_USED], c[state.HOST_LOADED_BLOCKS]) == (12, 20, 0)


def test_a_host_hit_of_ten_or_more_is_loaded_back_and_one_under_ten_is_not():
    """A and D written and demoted. B's host hit of 12 is loaded at t = 1 s: [0, 12) on the device
    again, locked by the load until it ends at 1 s + 12 x 32.768 us; the load link's clock and
    the step's loaded tokens say so. C's host hit, D's first 8, is under the threshold (10):
    nothing is loaded (the match split D's node at 8, both halves host-only)."""
    s = written(48, A, D)
    evict(s, 32)
    best, depth = match_prefix(s, B, 15)
    assert load_back(s, device_node(s, best), best) == 12
    c = s.count
    assert (0, 12, A, 1, 1, 1) in nodes(s) and (12, 16, A, 0, 0, 1) in nodes(s)
    assert (c[RADIX_TREE_TOKENS], c[RADIX_EVICTABLE], c[state.HOST_LOADED_BLOCKS]) == (12, 0, 12)
    assert c[STEP_LOAD_TOKENS] == 12
    assert s.clock[state.LOAD_LINK_FREE_S] == pytest.approx(1.0 + 12 * TOKEN_S)
    best, depth = match_prefix(s, C, 11)
    assert depth == 8 and load_back(s, device_node(s, best), best) == 0
    assert (0, 8, D, 0, 0, 1) in nodes(s) and (8, 16, D, 0, 0, 1) in nodes(s)
    assert c[RADIX_TREE_TOKENS] == 12 and c[state.HOST_LOADED_BLOCKS] == 12


def test_a_load_back_evicts_device_leaves_for_its_slots():
    """A and D written, A demoted, D on the device (16 of 24 slots). B's load of 12 finds 8
    available: D's leaf is demoted for it (16 freed)."""
    s = written(48, A, D)
    evict(s, 1)  # A's leaf, inserted first, is the older
    assert nodes(s) == [(0, 16, A, 0, 0, 1), (0, 16, D, 0, 1, 1)]
    best, _ = match_prefix(s, B, 15)
    assert load_back(s, device_node(s, best), best) == 12
    assert (0, 16, D, 0, 0, 1) in nodes(s) and s.count[RADIX_TREE_TOKENS] == 12


def admission(private_pages: int):
    """A written and demoted; B waits, the pool's other slots held by ``private_pages``."""
    s = written(48, A)
    evict(s, 16)
    s.count[RADIX_PRIVATE_PAGES] = private_pages
    s.waiting[0] = B
    s.count[state.WAITING_HEAD], s.count[state.WAITING_LEN] = 0, 1
    s.status[B] = state.WAITING
    return s


@pytest.mark.parametrize("private_pages, admitted", [(5, True), (10, False)])
def test_the_admission_budget_counts_the_host_hit_in_the_total_tokens(private_pages, admitted):
    """B: no device prefix, a host hit of 12. add_one_req's total (schedule_policy.py:1407-1412):
    its extend from the device prefix, 16, its output left, 1, and a page: 18, against the
    available and evictable tokens, 24 - 5 = 19 (admitted: 12 loaded, 4 to compute) or
    24 - 10 = 14 (not: it would be, 4 + 1 + 1 = 6, were the host hit counted as cached there)."""
    s = admission(private_pages)
    assert bool(get_new_batch_prefill(s)) == admitted
    if admitted:
        assert s.radix_request[B, state.PREFIX_LEN] == 12 and s.radix_request[B, EXTEND_LEN] == 4
        assert (s.count[state.HOST_HIT_TOKENS], s.count[state.PREFIX_HIT_TOKENS]) == (12, 0)
    else:
        assert s.count[state.WAITING_LEN] == 1 and s.count[state.HOST_USED] == 16


def test_the_chunk_budget_counts_a_loaded_host_hit_as_cached():
    """Chunks of 12. A: chunks of 12 and 4, cached (and written) as [0, 12) and [12, 16). D at 10 s:
    its first 12 find 8 available, A's leaf [12, 16) is demoted; its last 4 find none, A's [0, 12),
    a device leaf now, is demoted. B at 20 s: a host hit of 12 (A's [0, 12)), loaded (D's leaf
    [12, 16) demoted for it); its extend past it is 4 (_select_prefill_admission,
    schedule_policy.py:1596-1603): one prefill of 4, not a chunk of 12."""
    result = run_simulation(sglang(24, 48, chunk_budget=12), trace((0, "A", 1), (10, "D", 1), (20, "B", 1)))
    prefills = [n for n in result.steps["num_prefill_tokens"].tolist() if n]
    assert prefills == [12, 4, 12, 4, 4]
    assert result.summary["mgr_prefix_hit_tokens"] == 0
    assert result.summary["host_loaded_gib"] == pytest.approx(12 * OPT13B_SLOT / 2**30)


def test_a_host_hit_under_ten_is_recomputed_in_a_run():
    """Chunks of 8. A: chunks of 8 and 8, cached as [0, 8) and [8, 16). D at 10 s: its first 8 fit
    the 8 available; its last 8 demote A's leaf [8, 16) alone ([0, 8) keeps a device child no
    more, but D's 8 are found by then). B at 20 s: a device prefix of 8 (A's [0, 8)) and a host hit
    of 4 ([8, 12) of A's demoted leaf): under 10, recomputed: B computes its 8 tokens past the
    device prefix, nothing is loaded."""
    result = run_simulation(sglang(24, 48, chunk_budget=8), trace((0, "A", 1), (10, "D", 1), (20, "B", 1)))
    assert [n for n in result.steps["num_prefill_tokens"].tolist() if n] == [8, 8, 8, 8, 8]
    assert result.summary["mgr_prefix_hit_tokens"] == 8 and result.summary["host_loaded_gib"] == 0


def test_lpm_keys_a_request_by_its_host_hit_too_and_checks_its_device_prefix_in_batch():
    """lpm: X's 40 tokens (hashes 1..10) written and demoted, host-only. Y and Z name the same 40,
    W 8 of its own. Each is keyed by its whole match, host hit included, but the last token
    (``num_matched_prefix_tokens``, common.py:260-261): Y 39, Z 39, W 0; the in-batch check reads
    the device prefix alone (``r.prefix_len``, schedule_policy.py:365): Y's and Z's are 0, so Y
    joins the waiting-queue tree and Z, sharing 40 with Y, goes last (:378-383). Order: Y, W, Z."""
    hashes = tuple(range(1, 11))
    rows = pd.DataFrame({"request_id": ["X", "Y", "Z", "W"], "arrival_s": [0.0] * 4,
                         "prompt_tokens": [40, 40, 40, 8], "output_tokens": [1] * 4,
                         "prefix_hashes": [hashes, hashes, hashes, (50, 51)]})
    rows.attrs["hash_block_tokens"] = H
    s = initial_state(sglang(64, 48, schedule_policy="lpm"), rows)
    checkpoint(s, 0, 40)
    s.clock[state.NOW] = 1.0
    acknowledge(s)
    evict(s, 40)
    s.waiting[:3] = [1, 2, 3]
    s.count[state.WAITING_HEAD], s.count[state.WAITING_LEN] = 0, 3
    sort_by_longest_prefix(s)
    assert s.waiting[:3].tolist() == [1, 3, 2]
    assert s.radix_request[[1, 2, 3], MATCH_LEN].tolist() == [39, -1, 0]


def test_the_step_price_overlaps_the_load_with_the_forward_layer_by_layer():
    """At t = 1 s, a load ending at 1.012 s, 40 layers: a forward of 40 ms hides it (40 ms); one
    of 10 ms waits for it and then runs its last layer: 12 + 10 / 40 = 12.25 ms."""
    s = tree()
    s.clock[state.NOW], s.clock[state.LOAD_LINK_FREE_S] = 1.0, 1.012
    assert step_price(s, 0.040) == pytest.approx(0.040)
    assert step_price(s, 0.010) == pytest.approx(0.01225)


def run_with_link(token_s: float):
    """A at 0, D at 10 s, B at 20 s (one output token each), the link at ``token_s`` a token."""
    cfg = sglang(24, 48)
    prepared = prepare(cfg, trace((0, "A", 1), (10, "D", 1), (20, "B", 1)))
    prepared.state.clock[state.HOST_BLOCK_S] = token_s
    s, wall = replay.run(prepared.state, None, None)
    return result(cfg, prepared._replace(state=s), wall)


def test_a_run_prices_the_loading_step_and_counts_both_tiers():
    """A (16) is written through as it is cached; D (16) at 10 s demotes it for its slots and is
    written; B at 20 s loads A's 12 (D demoted for them) and computes 4, then its own 4 are written.
    B's step with a link priced 0 is its forward f; at 10 ms a token, max(f, 12 x 10 ms + f / 40).
    Written: 16 + 16 + 4 = 36 pages, loaded 12, each of 819,200 bytes; of the 48 prompt tokens
    looked up, 12 came from the host (25 %), none from the GPU."""
    free, slow = run_with_link(0.0), run_with_link(0.010)
    forward = free.steps["dt_s"][free.steps["num_prefill_tokens"] == 4].item()
    loading = slow.steps["dt_s"][slow.steps["num_prefill_tokens"] == 4].item()
    assert loading == pytest.approx(max(forward, 0.120 + forward / 40))
    summary = slow.summary
    assert summary["host_stored_gib"] == pytest.approx(36 * OPT13B_SLOT / 2**30)
    assert summary["host_loaded_gib"] == pytest.approx(12 * OPT13B_SLOT / 2**30)
    assert summary["host_prefix_hit_rate"] == pytest.approx(0.25) and summary["gpu_prefix_hit_rate"] == 0
    assert (summary["host_blocks_used"], summary["host_blocks"], summary["host_evicted_blocks"]) == (36, 49, 0)


def test_plain_sglang_has_no_host_tier():
    s = initial_state(SimConfig.for_system("sglang", model="opt-13b", gpu="a100-40gb",
                                           kv_gib=24 * OPT13B_SLOT / 2**30, max_seq_len=24),
                      trace((0, "A", 1)))
    assert s.config[state.HICACHE_HOST_PAGES] == 0


def test_what_is_not_modelled_is_refused_in_one_line(capsys):
    with pytest.raises(ConfigError, match="--replicas > 1"):
        from pagesim.sim.cluster import check_cluster
        check_cluster(2, "round-robin", 0.0, sglang(24, 48, check=False))
    assert main(["simulate", "--system", "vllm", "--kv-offload-gib", "1", "--workload", "sharegpt",
                 "--num-requests", "1"]) == 2
    assert "kv_offload_gib" in capsys.readouterr().err
    assert np.isfinite(TOKEN_S)


def test_the_tree_holds_a_node_per_page_of_both_tiers():
    """40 requests of a one-token prompt (distinct hashes) and one output token, a second apart: each
    caches its token as a leaf of its own, written through to the host; the device's 24 tokens hold
    the 24 latest, the 16 before them demoted to the host alone. 40 live nodes and the root: more
    rows than the device's 24 pages and 3 (the table's size before it counted the host's pages:
    compiled code wrote past it), within 1 + min(24 + 101 host pages, 40 x 2 pages of keys) + 2."""
    n = 40
    rows = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": np.arange(n, dtype=float),
                         "prompt_tokens": 1, "output_tokens": 1, "prefix_hashes": [(100 + i,) for i in range(n)]})
    rows.attrs["hash_block_tokens"] = H
    cfg = sglang(24, 100)
    prepared = prepare(cfg, rows)
    assert len(prepared.state.radix_nodes) == 1 + min(24 + 101, n * 2) + 2
    s, wall = replay.run(prepared.state, None, None)
    assert result(cfg, prepared._replace(state=s), wall).summary["unfinished"] == 0
    live = nodes(s)
    assert [(start, end, owner) for start, end, owner, *_ in live] == [(0, 1, r) for r in range(n)]
    assert [owner for _, _, owner, _, on_device, _ in live if on_device] == list(range(16, n))
    assert all(on_host for *_, on_host in live)
    assert s.count[RADIX_NODES_USED] == n + 1
