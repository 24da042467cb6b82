"""Hand-worked accounting for every manager: three requests on a 64-slot pool.

Requests (P = prompt, F = final length): A (4, 6), B (2, 16), C (8, 9); max_seq_len 16.
"""

import pytest

from pagesim.sim.errors import ConfigError, OutOfMemory
from pagesim.sim.memory import (Admit, ContiguousManager, MemoryUsage, PagedManager, SeqSpec, StaticManager,
                        TokenManager, VAttentionManager)

SPECS = [SeqSpec(0, 4, 6), SeqSpec(1, 2, 16), SeqSpec(2, 8, 9)]


def admit_and_prefill(m):
    for s in SPECS:
        assert m.can_allocate(s) is Admit.OK
        assert m.allocate(s) == 0
    before = m.usage()
    for s in SPECS:
        m.append(s.seq_id, s.prompt_len)
    m.check()
    return before


def U(*xs):
    return MemoryUsage(*xs)


def both(m, ts, res, frag, slack, free):
    assert m.usage(False) == U(ts, res, frag, slack, 0, free)
    assert m.usage(True) == U(ts, res, frag, slack, free, 0)


def test_static_hand_worked():
    m = StaticManager(64, 16)  # B = 4 slots of 16
    admit_and_prefill(m)
    # token 4+2+8; reservation F-L = 2+14+1; internal M-F = 10+0+7; one slot free
    both(m, 14, 17, 17, 0, 16)
    assert m.export().extents == {0: (0, 16), 1: (16, 16), 2: (32, 16)}
    m.append_batch([0, 1, 2])
    both(m, 17, 14, 17, 0, 16)
    m.allocate(SeqSpec(3, 1, 2))
    assert m.can_allocate(SeqSpec(4, 1, 2)) is Admit.LATER
    assert m.can_allocate(SeqSpec(4, 1, 17)) is Admit.NEVER
    assert "max_seq_len" in m.explain_never(SeqSpec(4, 1, 17))
    m.free(1)
    assert m.allocate(SeqSpec(5, 1, 2)) == 0 and m.export().extents[5] == (16, 16)
    m.check()


def test_static_leftover_and_batch_size():
    m = StaticManager(70, 16, batch_size=2)  # 2 slots used; 38 slots permanently free
    assert m.usage().free_idle == 70
    m.allocate(SeqSpec(0, 1, 16))
    m.allocate(SeqSpec(1, 1, 16))
    assert m.can_allocate(SeqSpec(2, 1, 2)) is Admit.LATER
    assert m.usage().free_idle == 38
    with pytest.raises(ConfigError, match="static_batch_size <= 4"):
        StaticManager(70, 16, batch_size=5)


def test_contiguous_max_buddy_hand_worked():
    m = ContiguousManager(64, 16, "max", "buddy")
    admit_and_prefill(m)
    both(m, 14, 17, 17, 0, 16)
    assert m.export().extents == {0: (0, 16), 1: (16, 16), 2: (32, 16)}


def test_contiguous_pow2_buddy_hand_worked():
    m = ContiguousManager(64, 16, "pow2", "buddy")
    # R: A 4+2=6 (placed 8), B 2+16 -> clamp 16 (16), C 8+1=9 (16)
    assert [m.request_size(s) for s in SPECS] == [6, 16, 9]
    admit_and_prefill(m)
    both(m, 14, 17, 0, 2 + 0 + 7, 24)
    assert m.export().extents == {0: (0, 8), 1: (16, 16), 2: (32, 16)}
    m.free(0)
    m.free(2)
    both(m, 2, 14, 0, 0, 48)
    m.check()


def test_contiguous_pow2_output_25_reserves_32():
    m = ContiguousManager(1024, 512, "pow2", "first-fit")
    assert m.request_size(SeqSpec(0, 10, 35)) == 10 + 32


def test_contiguous_oracle_first_fit_external_fragmentation():
    m = ContiguousManager(64, 16, "oracle", "first-fit")
    admit_and_prefill(m)
    assert m.export().extents == {0: (0, 6), 1: (6, 16), 2: (22, 9)}
    both(m, 14, 17, 0, 0, 33)
    m.free(0)  # a 6-slot hole at the front, 33 at the back
    assert m.can_allocate(SeqSpec(3, 10, 16)) is Admit.OK
    m.allocate(SeqSpec(3, 10, 16))  # goes to [31, 47)
    assert m.export().extents[3] == (31, 16)
    assert m.can_allocate(SeqSpec(4, 10, 16)) is Admit.OK  # [47, 64) has 17
    m.allocate(SeqSpec(4, 10, 16))
    assert m.can_allocate(SeqSpec(5, 3, 7)) is Admit.LATER  # 7 free slots, largest hole 6
    u = m.usage(True)
    assert u.external_frag == 7 and u.total == 64
    m.check()


def test_contiguous_predicted_overflow_grows_or_moves():
    m = ContiguousManager(64, 32, "predicted", "first-fit", predictor_error=0.0)
    s = SeqSpec(0, 4, 12)
    assert m.request_size(s) == 12  # no error: exact
    m.allocate(s)
    m.append(0, 12)
    # outgrow the true length (a mis-prediction): R' = max(13, 4 + 2*8) = 20, grown in place
    assert m.can_append(0, 1)
    m.append(0, 1)
    st = m.stats()
    assert st["overflows"] == 1 and st["grows_in_place"] == 1
    assert m.export().extents[0] == (0, 20)
    m.allocate(SeqSpec(1, 2, 4))  # blocks growth in place: [20, 24)
    m.append(0, 7)  # L = 20 = R
    assert m.can_append(0, 1)  # R' = 32: moves to [24, 56)
    m.append(0, 1)
    assert m.stats()["moves"] == 1 and m.export().extents[0] == (24, 32)
    m.append(0, 11)
    assert not m.can_append(0, 1)  # beyond max_seq_len
    m.check()


def test_contiguous_predicted_is_seeded():
    a = ContiguousManager(4096, 2048, "predicted", predictor_error=0.5, seed=3)
    b = ContiguousManager(4096, 2048, "predicted", predictor_error=0.5, seed=3)
    c = ContiguousManager(4096, 2048, "predicted", predictor_error=0.5, seed=4)
    specs = [SeqSpec(i, 50, 50 + 10 * i) for i in range(20)]
    ra = [a.request_size(s) for s in specs]
    assert ra == [b.request_size(s) for s in specs] and ra != [c.request_size(s) for s in specs]
    assert all(50 < r <= 2048 for r in ra)


def test_paged_hand_worked_block4():
    m = PagedManager(64, 16, block_size=4, watermark=0)
    before = admit_and_prefill(m)
    # before prefill: 4 blocks (A 1, B 1, C 2), nothing computed, all demanded
    assert before == U(0, 16, 0, 0, 0, 48)
    both(m, 14, 2, 0, 0, 48)
    m.append_batch([0, 1, 2])
    # A: new block, dem min(6-4,4)=2 ; B: in place ; C: new block, dem 1
    both(m, 17, 2, 5, 0, 40)
    assert m.export().tables == {0: [0, 4], 1: [1], 2: [2, 3, 5]}
    assert m.num_seq_blocks(2) == 3 and m.num_free_blocks() == 10
    m.free(2)
    both(m, 8, 2, 2, 0, 52)
    m.check()


def test_paged_leftover_slots_are_free():
    m = PagedManager(70, 32, block_size=16, watermark=0)  # 4 blocks, 6 slots left over
    assert m.num_blocks == 4 and m.usage() == U(0, 0, 0, 0, 0, 70)
    m.allocate(SeqSpec(0, 20, 30))
    assert m.usage(True) == U(0, 30, 2, 0, 38, 0)


def test_fork_shared_partial_block_and_copy_on_write():
    m = PagedManager(64, 32, block_size=4, watermark=0)
    m.allocate(SeqSpec(0, 6, 8))
    m.append(0, 6)  # blocks [0 full, 1 half]
    both(m, 6, 2, 0, 0, 56)
    m.fork(0, 1, child_final_len=7)
    m.fork(0, 2, child_final_len=12)
    # shared half block: demand = max over sharers = min(12-4, 4) = 4 -> 2 reservation, 0 frag
    both(m, 6, 2, 0, 0, 56)
    assert m.export().refcounts == {0: 3, 1: 3}
    m.append(1, 1)  # copy-on-write: seq 1 gets a copy of block 1 (2 tokens + 1)
    assert m.stats()["cow_copies"] == 1
    assert m.export().tables[1] == [0, 2]
    # block 1 (seqs 0, 2): dem 4 -> res 2; block 2 (seq 1): filled 3, dem 3
    both(m, 9, 2, 1, 0, 52)
    m.append(0, 1)  # still shared with seq 2: a second copy
    assert m.stats()["cow_copies"] == 2
    m.append(2, 1)  # seq 2 is now the only owner: writes in place
    assert m.stats()["cow_copies"] == 2 and m.export().tables[2] == [0, 1]
    m.check()
    for s in (0, 1, 2):
        m.free(s)
    assert m.usage() == U(0, 0, 0, 0, 0, 64)
    m.check()


def test_append_batch_cow_counts_exactly():
    m = PagedManager(64, 32, block_size=4, watermark=0)
    m.allocate(SeqSpec(0, 5, 20))
    m.append(0, 5)
    for c in (1, 2, 3):
        m.fork(0, c)
    # 4 writers into a block with 4 references: 3 copies, the last writes in place
    assert m.blocks_needed_for_append_batch([0, 1, 2, 3]) == 3
    assert m.blocks_needed_for_append_batch([0, 1]) == 2
    free = m.num_free_blocks()
    m.append_batch([0, 1, 2, 3])
    assert m.stats()["cow_copies"] == 3 and m.num_free_blocks() == free - 3
    m.check()


def hashed(seq_id, prompt, final, hashes, H=4):
    return SeqSpec(seq_id, prompt, final, prefix_hashes=tuple(hashes), hash_block_tokens=H)


def test_prefix_cache_hits_and_lru_eviction():
    m = PagedManager(32, 32, block_size=4, watermark=0, prefix_caching=True)  # 8 blocks
    a = hashed(0, 12, 14, ["x", "y", "z"])
    assert m.allocate(a) == 0
    m.append(0, 12)
    m.append(0, 1)
    assert m.stats()["cached_blocks"] == 3
    b = hashed(1, 12, 13, ["x", "y", "w"])
    assert m.allocate(b) == 8  # x, y hit; w differs
    assert m.export().tables[1][:2] == m.export().tables[0][:2]
    # full prompt hit is capped at prompt_len - 1 tokens: the last block is recomputed
    c = hashed(2, 12, 12, ["x", "y", "z"])
    assert m.allocate(c) == 8
    assert m.stats()["prefix_hit_tokens"] == 16
    m.append(1, 4)
    m.append(2, 4)
    m.check()
    for s in (2, 1, 0):
        m.free(s)
    # all blocks free or cached; cached ones count as free
    assert m.usage() == U(0, 0, 0, 0, 0, 32)
    st = m.stats()
    assert st["cached_blocks"] == 4 and st["cached_tokens"] == 16  # x, y, z, y-w
    # LRU: seq 0 freed last, tail first -> its blocks are newest; seq 1's "w" block is oldest
    order = list(m._lru)
    assert order[0] == m._cache[m._keys(b)[2]]
    d = hashed(3, 28, 28, [f"n{i}" for i in range(7)])
    m.allocate(d)  # 7 blocks: 4 free + evicts 3 oldest
    assert m.stats()["evictions"] == 3 and m.stats()["cached_blocks"] == 1
    assert list(m._lru) == [m._cache[m._keys(a)[0]]]  # w, z, y evicted in that order; x left
    m.free(3)
    assert m.allocate(hashed(4, 5, 6, ["x", "q"])) == 4
    m.check()


def test_prefix_cache_lru_order_is_least_recently_freed():
    m = PagedManager(16, 16, block_size=4, watermark=0, prefix_caching=True)  # 4 blocks
    for i, h in enumerate("pq"):
        m.allocate(hashed(i, 5, 5, [h, "t"]))
        m.append(i, 5)
        m.free(i)  # block with key h cached; the partial tail block went to the free list
    # cache holds p (older) and q; a hit on p refreshes it
    assert m.allocate(hashed(2, 5, 5, ["p", "t"])) == 4
    m.free(2)
    m.allocate(SeqSpec(3, 16, 16))  # needs all 4 blocks: evicts q first, then p
    assert m.stats()["evictions"] == 2 and m.stats()["cached_blocks"] == 0
    m.free(3)
    m.check()


def test_prefix_hashes_coarser_than_blocks():
    m = PagedManager(256, 64, block_size=4, watermark=0, prefix_caching=True)
    a = hashed(0, 20, 21, ["a", "b"], H=16)  # keys for blocks ending at 4..20 (hash 2 covers 16..20)
    m.allocate(a)
    m.append(0, 20)
    assert m.stats()["cached_blocks"] == 5
    assert m.allocate(hashed(1, 40, 41, ["a", "c", "d"], H=16)) == 16
    m.check()


def test_no_hashes_no_sharing():
    m = PagedManager(64, 16, block_size=4, watermark=0, prefix_caching=True)
    m.allocate(SeqSpec(0, 8, 9))
    m.append(0, 8)
    assert m.allocate(SeqSpec(1, 8, 9)) == 0 and m.stats()["cached_blocks"] == 0


def test_watermark():
    m = PagedManager(160, 16, block_size=4, watermark=0.1)  # 40 blocks, watermark 4
    assert m.watermark_blocks == 4
    for i in range(9):
        m.allocate(SeqSpec(i, 16, 16))  # 36 blocks used, 4 free
    assert m.can_allocate(SeqSpec(9, 1, 2)) is Admit.LATER  # would leave 3 < 4
    m.free(0)
    assert m.can_allocate(SeqSpec(9, 16, 16)) is Admit.OK  # leaves exactly 4
    tiny = PagedManager(20, 16, block_size=4, watermark=0.4)  # 5 blocks, watermark 2
    assert tiny.can_allocate(SeqSpec(0, 16, 16)) is Admit.NEVER
    assert "watermark" in tiny.explain_never(SeqSpec(0, 16, 16))
    assert m.can_append(1, 1)  # appends ignore the watermark


def test_token_manager_is_block_size_one():
    m = TokenManager(32, 16, watermark=0)
    assert m.block_size == 1 and m.num_blocks == 32 and m.kind == "token"
    m.allocate(SeqSpec(0, 3, 10))
    m.append(0, 3)
    m.append_batch([0])
    assert m.usage() == U(4, 0, 0, 0, 0, 28)


def test_vattention_pages():
    m = VAttentionManager(1000, 300, page_tokens=102, watermark=0)  # 9 pages, 82 left over
    assert m.num_blocks == 9 and m.leftover == 82
    m.allocate(SeqSpec(0, 150, 160))
    m.append(0, 150)
    # 2 pages (204 slots): 150 computed, 10 more to come, 44 never
    assert m.usage() == U(150, 10, 44, 0, 0, 796)
    assert m.can_fork(0)
    m.fork(0, 1)  # eager copy, no sharing
    assert m.stats()["fork_copies"] == 2 and m.export().refcounts == {0: 1, 1: 1, 2: 1, 3: 1}
    assert m.usage().token_states == 300
    m.check()


def test_vattention_page_tokens_helper():
    from pagesim.sim.memory import vattention_page_tokens
    from pagesim.sim.specs import MODELS
    opt = MODELS["opt-13b"]
    assert vattention_page_tokens(opt, 64 * 1024) == 3
    assert vattention_page_tokens(opt, 2 * 1024 * 1024) == 102
    assert vattention_page_tokens(MODELS["llama-3-8b"], 64 * 1024) == 16
    assert vattention_page_tokens(opt, 64 * 1024, tp=2) == 6


@pytest.mark.parametrize("make", [
    lambda: StaticManager(10, 16),
    lambda: ContiguousManager(10, 16),
    lambda: PagedManager(10, 16, block_size=4),
    lambda: PagedManager(20, 16, block_size=8),  # 2 blocks = 16: ok; 17 needs 3
])
def test_pool_smaller_than_one_request(make):
    try:
        make()
    except ConfigError as e:
        assert "max_seq_len" in str(e)
    else:
        assert make().capacity == 20


@pytest.mark.parametrize("bs", [0, -1, 257])
def test_bad_block_size(bs):
    with pytest.raises(ConfigError, match="block_size"):
        PagedManager(4096, 16, block_size=bs)


def test_bad_configs_name_parameter():
    with pytest.raises(ConfigError, match="reservation"):
        ContiguousManager(64, 16, reservation="greedy")
    with pytest.raises(ConfigError, match="placement"):
        ContiguousManager(64, 16, placement="worst-fit")
    with pytest.raises(ConfigError, match="watermark"):
        PagedManager(64, 16, watermark=1.5)
    with pytest.raises(ConfigError, match="page_tokens"):
        VAttentionManager(64, 16, page_tokens=0)
    with pytest.raises(ConfigError, match="max_seq_len <= 20"):
        PagedManager(23, 24, block_size=4)


@pytest.mark.parametrize("make", [
    lambda: StaticManager(64, 16), lambda: ContiguousManager(64, 16, "pow2"),
    lambda: PagedManager(64, 16, 4, 0), lambda: VAttentionManager(64, 16, 5, 0)])
def test_too_long_is_never_and_misuse_raises(make):
    m = make()
    s = SeqSpec(0, 4, 17)
    assert m.can_allocate(s) is Admit.NEVER and "max_seq_len" in m.explain_never(s)
    with pytest.raises(OutOfMemory):
        m.allocate(s)
    with pytest.raises(KeyError):
        m.append(5, 1)
    m.allocate(SeqSpec(0, 4, 8))
    with pytest.raises(ValueError):
        m.allocate(SeqSpec(0, 4, 8))


def test_buddy_pool_whose_largest_chunk_is_too_small():
    with pytest.raises(ConfigError, match="max_seq_len <= 1024"):
        ContiguousManager(2000, 2000, "max", "buddy")
    assert ContiguousManager(2000, 2000, "max", "first-fit").capacity == 2000


@pytest.mark.parametrize("make", [
    lambda: StaticManager(64, 16), lambda: ContiguousManager(64, 16, "oracle"),
    lambda: PagedManager(64, 16, 4, 0, prefix_caching=True), lambda: TokenManager(64, 16, 0)])
def test_empty_prompt_and_output(make):
    m = make()
    m.allocate(SeqSpec(0, 0, 3))
    m.append_batch([0])
    m.append(0, 2)
    m.allocate(SeqSpec(1, 5, 2))  # final < prompt: treated as final = prompt
    m.append(1, 5)
    assert m.usage().token_states == 8
    m.check()
