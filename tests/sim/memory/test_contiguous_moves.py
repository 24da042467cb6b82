"""A contiguous (Orca) extent that outgrows its reservation and moves frees the place it
leaves (sim/memory/contiguous.py, ``num_releases``): a request that did not fit before the
move may fit after it, so the scheduler's blocked-queue-head shortcut must not outlive it."""

from __future__ import annotations

from pagesim.sim.memory.base import Admit, SeqSpec
from pagesim.sim.memory.contiguous import ContiguousManager


def test_a_moved_extent_leaves_a_hole_a_waiting_request_fits_in():
    # 16 slots, first-fit, oracle reservations (R = final length):
    #   filler [0, 3), A [3, 6) (prompt 2, final 3), B [6, 12); tail [12, 16) free
    # freeing the filler leaves holes of 3 and 4: a 6-slot request waits (LATER)
    pool = ContiguousManager(16, 16, reservation="oracle", placement="first-fit")
    pool.allocate(SeqSpec(0, 3, 3))
    pool.allocate(SeqSpec(1, 2, 3))
    pool.allocate(SeqSpec(2, 6, 6))
    pool.free(0)
    head = SeqSpec(3, 6, 6)
    assert pool.can_allocate(head) is Admit.LATER
    assert pool.num_releases == 0
    # A writes 3 tokens, then a 4th past its reservation: R' = max(4, 2 + 2 x (3 - 2)) = 4
    # slots; B is its neighbour, so it cannot grow in place and moves to the tail [12, 16).
    # Its old place joins the filler's hole: [0, 6), where the 6-slot request fits
    pool.append(1, 3)
    pool.append(1, 1)
    assert pool.stats()["moves"] == 1
    assert pool.num_releases == 1
    assert pool.can_allocate(head) is Admit.OK
    pool.check()


def test_growing_in_place_releases_nothing():
    # A [0, 3) with the rest free grows in place to 4 slots: no space is freed
    pool = ContiguousManager(16, 16, reservation="oracle", placement="first-fit")
    pool.allocate(SeqSpec(1, 2, 3))
    pool.append(1, 4)
    assert pool.stats()["grows_in_place"] == 1
    assert pool.num_releases == 0
