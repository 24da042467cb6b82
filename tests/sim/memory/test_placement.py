"""Placement policies: buddy splits/merges by address, first-fit / best-fit holes, the paper's 7-slot case."""

import pytest

from pagesim.sim.memory import Admit, ContiguousManager, SeqSpec
from pagesim.sim.memory.placement import BuddyPlacement, FitPlacement, next_pow2


def fl(p: BuddyPlacement) -> dict[int, list[int]]:
    return {k: sorted(v) for k, v in p.free_lists.items() if v}


def test_next_pow2():
    assert [next_pow2(x) for x in (0, 1, 2, 3, 4, 5, 25, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 32, 1024, 2048]


def test_buddy_split_and_merge_by_address():
    p = BuddyPlacement(64)
    assert p.alloc(3) == 0  # 64 -> 32|32 -> 16|16 -> 8|8 -> 4|4, takes [0, 4)
    assert fl(p) == {4: [4], 8: [8], 16: [16], 32: [32]}
    assert p.alloc(8) == 8
    assert p.alloc(4) == 4
    assert fl(p) == {16: [16], 32: [32]}
    p.free(0)  # buddy [4, 8) is in use: no merge
    assert fl(p) == {4: [0], 16: [16], 32: [32]}
    p.free(4)  # 4@0 + 4@4 -> 8@0; its buddy 8@8 is in use
    assert fl(p) == {8: [0], 16: [16], 32: [32]}
    p.free(8)  # 8@0+8@8 -> 16@0, +16@16 -> 32@0, +32@32 -> 64@0
    assert fl(p) == {64: [0]}
    assert p.free_slots() == 64
    p.check()


def test_buddy_non_power_of_two_chunks_do_not_merge():
    p = BuddyPlacement(48)  # chunks 32@0 + 16@32
    assert p.chunks == [(0, 32), (32, 16)]
    assert p.alloc(16) == 32  # smallest sufficient block first
    assert p.alloc(20) == 0  # placed as 32
    assert p.alloc(1) is None
    p.free(32)
    p.free(0)
    assert fl(p) == {32: [0], 16: [32]}
    assert p.largest_possible() == 32
    p.check()


def test_buddy_grow_in_place():
    p = BuddyPlacement(64)
    a = p.alloc(4)
    assert a == 0 and p.can_grow(0, 16)  # buddies 4@4 and 8@8 are free
    p.grow(0, 13)
    assert p.allocated[0] == 16 and fl(p) == {16: [16], 32: [32]}
    b = p.alloc(16)
    assert b == 16 and not p.can_grow(0, 32)
    p.check()


def test_chunks_of_15728():
    p = BuddyPlacement(15728)
    assert [s for _, s in p.chunks] == [8192, 4096, 2048, 1024, 256, 64, 32, 16]


def test_opt13b_max_policy_admits_exactly_seven():
    """vLLM paper Fig. 13: Orca (Max), OPT-13B, 15,728 slots, max_seq_len 2048 -> batch 7.00."""
    m = ContiguousManager(15728, 2048, reservation="max", placement="buddy")
    n = 0
    while m.can_allocate(SeqSpec(n, 100, 300)) is Admit.OK:
        m.allocate(SeqSpec(n, 100, 300))
        n += 1
    assert n == 7
    assert m.can_allocate(SeqSpec(n, 100, 300)) is Admit.LATER
    u = m.usage(demand_waiting=True)
    assert u.external_frag == 1392 and u.free_idle == 0  # 1024+256+64+32+16, ~8.9% of 15728
    assert round(1392 / 15728, 3) == 0.089
    assert u.reservation == 7 * 300 and u.internal_frag == 7 * (2048 - 300) and u.allocator_slack == 0
    m.check()


def test_first_fit_and_best_fit_holes():
    for best, expect in ((False, 0), (True, 14)):
        p = FitPlacement(20, best=best)
        assert p.alloc(5) == 0 and p.alloc(3) == 5 and p.alloc(6) == 8 and p.alloc(2) == 14
        p.free(0)  # holes: [0,5) and [16,20)
        assert p.alloc(4) == (0 if not best else 16)
        p.check()
    p = FitPlacement(20)
    a, b, c = p.alloc(5), p.alloc(5), p.alloc(5)
    p.free(a), p.free(c)
    assert p._holes == {0: 5, 10: 10}
    p.free(b)  # coalesces both neighbours
    assert p._holes == {0: 20} and p.free_slots() == 20
    p.check()


def test_fit_grow_in_place():
    p = FitPlacement(20)
    a = p.alloc(5)
    b = p.alloc(5)
    assert not p.can_grow(a, 6)
    assert p.can_grow(b, 15) and not p.can_grow(b, 16)
    p.grow(b, 12)
    assert p.allocated[b] == 12 and p._holes == {17: 3}
    p.check()


@pytest.mark.parametrize("cls", [lambda: BuddyPlacement(100), lambda: FitPlacement(100)])
def test_alloc_none_when_full(cls):
    p = cls()
    while p.alloc(1) is not None:
        pass
    assert p.free_slots() == 0 and not p.can_alloc(1)
    p.check()
