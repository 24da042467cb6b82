"""The core's contiguous (Orca) manager and its placements, worked by hand on tiny pools:
where each extent lands, its reservation and slack, and the external fragmentation when the
next one does not fit (sim/core/kv/extent.py, sim/core/kv/placement.py)."""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import state
from pagesim.sim.core.kv import extent, kv_cache, placement
from pagesim.sim.core.sched import lifecycle, scheduler_vllm
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, trace
from pagesim.sim.core.kv.extent import EXTENT_JOINED, EXTENT_PLACED, EXTENT_RESERVED, EXTENT_START
from pagesim.sim.core.kv.placement import NUM_HOLES
from pagesim.sim.core.sched.scheduler_vllm import FORKS_SHARE_BLOCKS

OK, LATER, NEVER = kv_cache.CAN_ALLOCATE, kv_cache.ALLOCATE_LATER, kv_cache.NEVER_FITS


def core_state(system, rows, slots=16, max_seq_len=16, **kw):
    """The core's state before the run: ``rows`` (arrival, prompt, output) over ``slots``."""
    cfg = cfg_for(system, slots=slots, max_seq_len=max_seq_len, **kw)
    s = initial_state(cfg, trace(rows))
    c = s.config
    if c[state.MANAGER_KIND] == state.CONTIGUOUS:
        assert c[state.CAPACITY] == slots
    else:  # vAttention's pages (test_sampling_width_is_rejected_on_managers_that_cannot_share_blocks)
        assert c[state.NUM_BLOCKS] * c[state.BLOCK_SIZE] + c[state.LEFTOVER_SLOTS] == slots
    return s


def admit(s, i):
    """Request ``i``'s admission answer; its extent when it fits."""
    prompt = int(s.prompt_tokens[i])
    answer = extent.can_allocate(s, i, prompt)
    if answer == OK:
        extent.allocate(s, i, prompt, 0)
    return answer


def extent_of(s, i):
    """(start, R, A) of request ``i``'s extent."""
    return tuple(int(s.extent[i, k]) for k in (EXTENT_START, EXTENT_RESERVED, EXTENT_PLACED))


def categories(s, demand_waiting):
    out = np.zeros(6, np.int64)
    extent.memory_categories(s, demand_waiting, out)
    return out.tolist()


def holes(s):
    """[start, size] of the fit placements' holes, by address."""
    return s.holes[:s.count[NUM_HOLES]].tolist()


def buddy_free_blocks(s):
    """{size: [starts]} of the buddy's free blocks, read from its bitmaps (by CPython: a compiled
    call from Python types the whole state, ~1 ms, and a pool of 15,728 asks ~30,000 times)."""
    is_free = interpreted(placement.buddy_is_free)
    blocks = {}
    for k in range(len(s.buddy_orders)):
        starts = [b << k for b in range(int(s.config[state.CAPACITY]) >> k) if is_free(s, k, b << k)]
        if starts:
            blocks[1 << k] = starts
    return blocks


def test_pow2_reservations_on_a_buddy_of_16():
    """pow2: R = P + next_pow2(O), placed at next_pow2(R).
    r0: P 3, O 3 -> R 3 + 4 = 7 (F 6: internal 1), placed 8 (slack 1): 16 -> 8|8, takes [0, 8).
    r1: P 2, O 1 -> R 2 + 1 = 3, placed 4 (slack 1): the lowest free 4 after splitting 8@8: [8, 12).
    r2: P 2, O 3 -> R 2 + 4 = 6, placed 8: only 4@12 is free: it waits, and those 4 slots are
    external fragmentation."""
    s = core_state("orca-pow2", [(0, 3, 3), (0, 2, 1), (0, 2, 3)])
    assert buddy_free_blocks(s) == {16: [0]}
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 7, 8)
    assert buddy_free_blocks(s) == {8: [8]}
    assert admit(s, 1) == OK and extent_of(s, 1) == (8, 3, 4)
    assert buddy_free_blocks(s) == {4: [12]}
    assert admit(s, 2) == LATER
    # token states, reservation (min(R, F) - L), internal (R - F), slack (A - R), external, free
    assert categories(s, True) == [0, 6 + 3, 1 + 0, 1 + 1, 4, 0]
    assert categories(s, False) == [0, 9, 1, 2, 0, 4]
    extent.free(s, 0)  # 8@0 is free again; its buddy 8@8 is split: no merge
    assert buddy_free_blocks(s) == {4: [12], 8: [0]}
    assert admit(s, 2) == OK and extent_of(s, 2) == (0, 6, 8)
    extent.free(s, 1)  # 4@8 merges with 4@12 into 8@8
    assert buddy_free_blocks(s) == {8: [8]}
    extent.free(s, 2)  # 8@0 and 8@8 merge into the whole pool
    assert buddy_free_blocks(s) == {16: [0]}
    assert categories(s, False) == [0, 0, 0, 0, 0, 16]


def test_max_and_oracle_reservations():
    """max: R = max_seq_len (16) whatever the request; oracle: R = F, placed at next_pow2(F)."""
    s = core_state("orca-max", [(0, 2, 3), (0, 1, 1)])
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 16, 16)
    assert admit(s, 1) == LATER
    assert categories(s, True) == [0, 5, 11, 0, 0, 0]
    s = core_state("orca-oracle", [(0, 2, 3), (0, 1, 1), (0, 4, 5)])
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 5, 8)
    assert admit(s, 1) == OK and extent_of(s, 1) == (8, 2, 2)
    assert admit(s, 2) == LATER  # F 9 needs a 16: 6 slots free in 2@10 and 4@12
    assert categories(s, True) == [0, 7, 0, 3, 6, 0]


def test_reservations_capped_and_never():
    """R is capped at max_seq_len; a final length over it never fits."""
    s = core_state("orca-pow2", [(0, 9, 5), (0, 9, 8)])  # 9 + next_pow2(5) = 17 -> 16
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 16, 16)
    assert extent.can_allocate(s, 1, 9) == NEVER  # F 17 > 16


def test_recomputed_prompt_sizes_the_reservation():
    """After a recompute the tokens to hold are prompt + generated: pow2 rounds what is left."""
    s = core_state("orca-pow2", [(0, 2, 9)], slots=32, max_seq_len=32)
    assert extent.request_size(s, 0, 2) == 2 + 16
    assert extent.request_size(s, 0, 8) == 8 + 4  # 3 tokens left -> 4


def test_first_fit_and_best_fit():
    """oracle extents 5, 2, 3, 6 fill 16 slots; freeing the 5 and the 3 leaves holes [0, 5) and
    [7, 10). A 3-slot extent: first-fit takes the lowest hole that fits (0), best-fit the
    smallest (7, exact). Freeing the 2 between them coalesces [0, 10)."""
    rows = [(0, 4, 1), (0, 1, 1), (0, 2, 1), (0, 5, 1), (0, 2, 1), (0, 9, 1)]
    for name, where in (("first-fit", 0), ("best-fit", 7)):
        s = core_state("orca-oracle", rows, placement=name)
        for i, start in enumerate((0, 5, 7, 10)):
            assert admit(s, i) == OK and extent_of(s, i) == (start, *2 * [int(s.final_len[i])])
        extent.free(s, 0)
        extent.free(s, 2)
        assert holes(s) == [[0, 5], [7, 3]]
        assert admit(s, 4) == OK and extent_of(s, 4) == (where, 3, 3)
        assert admit(s, 5) == LATER  # 10 slots: 5 free, but no hole of 10
        assert categories(s, True)[4:] == [5, 0]
        extent.free(s, 4)
        extent.free(s, 1)  # [0, 5) + [5, 7) + [7, 10)
        assert holes(s) == [[0, 10]]
        assert admit(s, 5) == OK and extent_of(s, 5) == (0, 10, 10)


def test_buddy_chunks_do_not_merge_across():
    """48 slots are chunks 32@0 and 16@32: the smallest sufficient block is taken first, and
    freed blocks go back to their own chunk (32 and 16 never merge into 48)."""
    s = core_state("orca-oracle", [(0, 10, 6), (0, 10, 10), (0, 1, 1)], slots=48, max_seq_len=32)
    assert buddy_free_blocks(s) == {32: [0], 16: [32]}
    assert admit(s, 0) == OK and extent_of(s, 0) == (32, 16, 16)
    assert admit(s, 1) == OK and extent_of(s, 1) == (0, 20, 32)
    assert admit(s, 2) == LATER
    extent.free(s, 0)
    extent.free(s, 1)
    assert buddy_free_blocks(s) == {32: [0], 16: [32]}


def test_paper_opt13b_max_admits_seven():
    """vLLM paper Fig. 13: Orca (Max), OPT-13B, 15,728 slots, max_seq_len 2048: seven
    requests, and 1,392 slots (1024 + 256 + 64 + 32 + 16) external fragmentation."""
    s = core_state("orca-max", [(0, 100, 200)] * 9, slots=15728, max_seq_len=2048)
    assert [admit(s, i) for i in range(8)] == [OK] * 7 + [LATER]
    # the smallest sufficient block first: the 2048 chunk, then the 4096 chunk's halves, then
    # the 8192 chunk's quarters
    assert [int(s.extent[i, EXTENT_START]) for i in range(7)] == [12288, 8192, 10240, 0, 2048, 4096, 6144]
    assert categories(s, True) == [0, 7 * 300, 7 * (2048 - 300), 0, 1392, 0]


def test_best_fit_ties_go_to_the_lowest_address():
    """Two holes of 3 ([0, 3) and [5, 8)) and one of 8 elsewhere: best-fit takes the lowest of
    the smallest."""
    s = core_state("orca-oracle", [(0, 2, 1), (0, 1, 1), (0, 2, 1), (0, 7, 1), (0, 2, 1)], placement="best-fit")
    for i, start in enumerate((0, 3, 5, 8)):
        assert admit(s, i) == OK and int(s.extent[i, EXTENT_START]) == start
    extent.free(s, 0)
    extent.free(s, 2)
    assert admit(s, 4) == OK and extent_of(s, 4) == (0, 3, 3)


def test_sampling_width_is_rejected_on_managers_that_cannot_share_blocks():
    """Forks share blocks only in the paged managers (config[FORKS_SHARE_BLOCKS]): on Orca's
    extents and vAttention's pages a request of n > 1 is rejected at the queue's head, with its
    reason, and the requests behind it are admitted as usual."""
    for system, slots in (("orca-max", 64), ("vattention", 2048)):
        s = core_state(system, [(0, 3, 2), (0, 4, 2), (0, 2, 2)], slots=slots, max_seq_len=16)
        s.width[1] = 2
        for i in range(3):
            lifecycle.add_arrival(s, i)
        scheduler_vllm.admit_waiting(s, 1 << 20, s.config[state.FAMILY_TRAITS])
        assert s.status[:3].tolist() == [state.RUNNING, state.REJECTED, state.RUNNING], system
        assert s.reject_code[1] == state.REJECT_WIDTH_UNSHARED and s.count[state.NUM_REJECTED] == 1
        assert s.config[FORKS_SHARE_BLOCKS] == 0
    tr = trace([(0, 3, 2), (0, 4, 2), (0, 2, 2)], n=[1, 2, 1])
    r = run_simulation(cfg_for("orca-max", slots=64, max_seq_len=16), tr)
    assert r.requests["reject_reason"].tolist() == [
        "", "parallel sampling / beam search (width 2) needs a manager that shares blocks (paged); "
            "this one would copy whole reservations", ""]
    assert r.requests["status"].tolist() == ["finished", "rejected", "finished"]


# -- the predicted reservation: R from the request's draw z, and re-reservations ---------------
def predicted_state(rows, draws, slots=32, max_seq_len=16, error=0.5, **kw):
    """The core's state for ``orca-max --reservation predicted`` with the requests' draws z set
    by hand (the run draws them from the seed: test_predictor_draws_are_the_managers)."""
    s = core_state("orca-max", rows, slots=slots, max_seq_len=max_seq_len, reservation="predicted",
                   predictor_error=error, **kw)
    s.predictor_draw[:] = draws
    return s


def test_predicted_reservation_from_the_draw():
    """R = P + max(1, round(O * (1 + e z))), at most M; round is Python's (halves to even).
    e 0.25: z 1 -> O * 1.25: O 10 -> 12.5 -> 12 (even), O 6 -> 7.5 -> 8 (even, not floor 7);
    z -1 -> O * 0.75: O 10 -> 7.5 -> 8; z -5 -> O * -0.25 -> at least 1 output slot;
    z 3 -> O 10 * 1.75 = 17.5 -> 18: P 4 + 18 = 22, capped at M 16."""
    rows = [(0, 4, 10), (0, 4, 6), (0, 4, 10), (0, 4, 10), (0, 4, 10)]
    s = predicted_state(rows, [1.0, 1.0, -1.0, -5.0, 3.0], slots=64, error=0.25)
    assert [extent.request_size(s, i, 4) for i in range(5)] == [4 + 12, 4 + 8, 4 + 8, 4 + 1, 16]
    # after a recompute (4 prompt + 6 generated held), O = F - 10 = 4: 4 * 1.25 = 5
    assert extent.request_size(s, 0, 10) == 10 + 5


def test_predictor_draws_are_the_managers():
    """Each request's z is numpy's standard normal seeded by (seed, request row, final length):
    the same seed, the same reservations, bit for bit."""
    s = core_state("orca-max", [(0, 3, 5), (0, 7, 2)], slots=64, reservation="predicted", seed=11)
    want = [np.random.default_rng((11, 0, 8)).standard_normal(), np.random.default_rng((11, 1, 9)).standard_normal()]
    assert s.predictor_draw.tolist() == want


def decoding(s, i, prompt, computed):
    """Request ``i`` admitted with ``prompt`` tokens, ``computed`` of them in its extent, decoding
    (last in the running list)."""
    assert extent.can_allocate(s, i, prompt) == OK
    extent.allocate(s, i, prompt, computed)
    s.running[s.count[state.NUM_RUNNING]] = i
    s.count[state.NUM_RUNNING] += 1
    s.in_decode[i] = 1
    extent.joined(s, i)


def test_overflow_keeps_grows_or_moves_the_extent_on_a_buddy():
    """e 0.5, buddy of 32, M 16. r0: P 3, O 8, z -1.5 -> 8 * 0.25 = 2: R 5, placed 8 at [0, 8);
    r1: P 2, O 4, z 0: R 6, placed 8 at [8, 16). r0 holding 5 tokens overflows:
    R' = max(L + 1, P + 2 (R - P)) = max(6, 3 + 4) = 7: its 8 slots hold it (kept).
    At 7 tokens: R' = max(8, 3 + 2 * 4) = 11, placed 16: its buddy 8@8 is r1's, so it moves to
    the free 16@16 and [0, 8) is freed; the blocked head's shortcut is voided (free epoch)."""
    s = predicted_state([(0, 3, 8), (0, 2, 4)], [-1.5, 0.0])
    decoding(s, 0, 3, 5)
    decoding(s, 1, 2, 2)
    assert extent_of(s, 0) == (0, 5, 8) and extent_of(s, 1) == (8, 6, 8)
    assert buddy_free_blocks(s) == {16: [16]}
    assert extent.overflows(s, 0) and not extent.overflows(s, 1)
    assert extent.decode_fits(s)
    extent.rereserve(s, 0)
    assert extent_of(s, 0) == (0, 7, 8) and buddy_free_blocks(s) == {16: [16]}
    s.num_computed_tokens[0] += 2  # two decode steps (the scheduler counts their token states)
    s.count[state.COMPUTED_SLOTS] += 2
    epoch = int(s.count[state.FREE_EPOCH])
    extent.rereserve(s, 0)
    assert extent_of(s, 0) == (16, 11, 16)
    assert buddy_free_blocks(s) == {8: [0]}  # its old place; 8@8 is r1's: no merge
    assert s.count[state.FREE_EPOCH] == epoch + 1
    c = s.count
    assert (c[state.NUM_OVERFLOWS], c[state.NUM_GROWS_IN_PLACE], c[state.NUM_MOVES]) == (2, 0, 1)
    # F 11: token states 7 + 2 (r0's L, r1's L), reservation 11 - 7 + 6 - 2, slack 16 - 11 + 8 - 6
    assert categories(s, False) == [9, 8, 0, 7, 0, 8]


def test_overflow_grows_in_place_into_a_free_buddy():
    """As above with r1 gone: 8@8 is free, so r0's 8@0 doubles in place to 16@0."""
    s = predicted_state([(0, 3, 8), (0, 2, 4)], [-1.5, 0.0])
    decoding(s, 0, 3, 7)
    s.extent[0, EXTENT_RESERVED] = 7  # its first overflow (R 5 -> 7) taken already
    extent.allocate(s, 1, 2, 2)
    extent.free(s, 1)
    assert buddy_free_blocks(s) == {8: [8], 16: [16]}
    extent.rereserve(s, 0)
    assert extent_of(s, 0) == (0, 11, 16) and buddy_free_blocks(s) == {16: [16]}
    assert (s.count[state.NUM_GROWS_IN_PLACE], s.count[state.NUM_MOVES]) == (1, 0)


def test_overflow_on_first_fit_grows_into_the_next_hole_or_moves():
    """First-fit over 24 slots, M 16, e 0.5, z -1.5. r0: P 3, O 8 -> R 5 at [0, 5); r1: P 3, O 8
    -> R 5 at [5, 10); hole [10, 24). r1 at 5 tokens: R' 7 grows into the hole after it ->
    [5, 12), hole [12, 24). r0 at 5 tokens: R' 7, the slots after it are r1's: it moves to the
    first hole of 7, [12, 19), and its old place is a hole: [0, 5), [19, 24)."""
    s = predicted_state([(0, 3, 8), (0, 3, 8)], [-1.5, -1.5], slots=24, placement="first-fit")
    decoding(s, 0, 3, 5)
    decoding(s, 1, 3, 5)
    assert holes(s) == [[10, 14]]
    extent.rereserve(s, 1)
    assert extent_of(s, 1) == (5, 7, 7) and holes(s) == [[12, 12]]
    extent.rereserve(s, 0)
    assert extent_of(s, 0) == (12, 7, 7) and holes(s) == [[0, 5], [19, 5]]
    assert (s.count[state.NUM_GROWS_IN_PLACE], s.count[state.NUM_MOVES]) == (1, 1)


def test_several_overflows_are_tried_together_and_the_placement_restored():
    """Buddy of 32, M 16: r0 and r1 (P 3, O 8, R 5) hold 8@0 and 8@8, both at 7 tokens after a
    first overflow (R 7): each needs R' 11, a 16. Either alone fits (16@16 is free), both
    cannot: the step does not fit, and the trial leaves the placement as it was. With r1
    preempted (freed), r0 alone grows in place."""
    s = predicted_state([(0, 3, 8), (0, 3, 8)], [-1.5, -1.5])
    for i in (0, 1):
        decoding(s, i, 3, 7)
        s.extent[i, EXTENT_RESERVED] = 7
    assert extent.can_rereserve(s, 0) and extent.can_rereserve(s, 1)
    assert not extent.decode_fits(s)
    assert buddy_free_blocks(s) == {16: [16]} and extent_of(s, 0) == (0, 7, 8)
    extent.free(s, 1)
    s.count[state.NUM_RUNNING] = 1
    assert extent.decode_fits(s)
    extent.rereserve_overflowing(s)
    assert extent_of(s, 0) == (0, 11, 16) and buddy_free_blocks(s) == {16: [16]}


def test_overflow_past_max_seq_len_cannot_rereserve():
    """R' is capped at M; a sequence at M tokens has no next slot (the scheduler preempts)."""
    s = predicted_state([(0, 3, 13)], [-1.5], slots=32)  # O 13 * 0.25 = 3.25 -> 3: R 6
    decoding(s, 0, 3, 6)
    assert extent.reservation_after_overflow(s, 0) == min(16, max(7, 3 + 2 * 3))
    s.num_computed_tokens[0] = 16
    s.extent[0, EXTENT_RESERVED] = 16
    assert not extent.can_rereserve(s, 0)


def test_a_move_is_placed_before_its_old_place_is_freed():
    """First-fit over 24 slots (e 0.5, z -1.5): ra P 2, O 2 -> 2 * 0.25 = 0.5 rounds to 0 -> one
    output slot, R 3 at [0, 3); r0 and r1 (P 3, O 8, R 5) at [3, 8) and [8, 13); ra leaves, so
    hole [0, 3). r0 at 5 tokens needs R' 7 and cannot grow (r1 follows it): the new extent is
    placed while r0 still holds [3, 8), at the first hole of 7, [13, 20); then [3, 8) is freed
    and coalesces with [0, 3)."""
    s = predicted_state([(0, 2, 2), (0, 3, 8), (0, 3, 8)], [-1.5, -1.5, -1.5], slots=24, placement="first-fit")
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 3, 3)
    decoding(s, 1, 3, 5)
    decoding(s, 2, 3, 3)
    extent.free(s, 0)
    assert holes(s) == [[0, 3], [13, 11]]
    extent.rereserve(s, 1)
    assert extent_of(s, 1) == (13, 7, 7) and holes(s) == [[0, 8], [20, 4]]


def test_an_upper_buddy_never_grows_into_the_next_block():
    """Buddy of 32 in 8s: r0 [0, 8), r1 [8, 16), r2 [16, 24), r3 [24, 32); r2 leaves, so 8@16 is
    free. r1 (upper half of 16@0) needing a 16 cannot grow into [8, 24) (not an aligned block)
    and no 16 is free: its re-reservation does not fit."""
    s = predicted_state([(0, 3, 8)] * 4, [-1.5] * 4)
    for i in range(4):
        decoding(s, i, 3, 3)
    extent.free(s, 2)
    s.count[state.NUM_RUNNING] = 2  # r0, r1 decode
    s.num_computed_tokens[1] = 7
    s.extent[1, EXTENT_RESERVED] = 7  # R' = 3 + 2 * 4 = 11: a 16
    assert buddy_free_blocks(s) == {8: [16]}
    assert not extent.can_rereserve(s, 1) and not extent.decode_fits(s)


def test_overflows_re_reserve_in_the_order_requests_joined_the_decode_set():
    """Buddy of 64, M 16: r0 and r1 (P 3, O 8) at 7 tokens with R 7 hold 8@0 and 8@8 and each
    needs a 16 (R' 11); 16@16 and 32@32 are free. r1 joined the decode set first (swapped back
    in while r0, admitted before it, was in its prefill): r1 (an upper half: it cannot grow)
    moves to the lowest 16, [16, 32), and r0 then grows in place into the 8 r1 left. (In the
    running order r0 would move to [16, 32) and r1 to [32, 48).)"""
    s = predicted_state([(0, 3, 8), (0, 3, 8)], [-1.5, -1.5], slots=64)
    for i in (0, 1):
        decoding(s, i, 3, 7)
        s.extent[i, EXTENT_RESERVED] = 7
    s.extent[1, EXTENT_JOINED] = 0  # r1 joined first, r0 second; the running order is r0, r1
    s.extent[0, EXTENT_JOINED] = 1
    assert buddy_free_blocks(s) == {16: [16], 32: [32]}
    assert extent.decode_fits(s) and buddy_free_blocks(s) == {16: [16], 32: [32]}
    extent.rereserve_overflowing(s)
    assert extent_of(s, 1) == (16, 11, 16) and extent_of(s, 0) == (0, 11, 16)
    assert buddy_free_blocks(s) == {32: [32]}
    assert (s.count[state.NUM_MOVES], s.count[state.NUM_GROWS_IN_PLACE]) == (1, 1)


# -- three requests on a 64-slot pool, every reservation (A: P 4, F 6; B: P 2, F 16; C: P 8, F 9) --
ABC = [(0, 4, 2), (0, 2, 14), (0, 8, 1)]


def prefilled(s, i):
    """Request ``i`` admitted with its prompt computed (its prefill done)."""
    prompt = int(s.prompt_tokens[i])
    assert extent.can_allocate(s, i, prompt) == OK
    extent.allocate(s, i, prompt, prompt)


def both(s, token_states, reservation, internal, slack, free):
    """The six categories with nobody waiting (free slots idle) and with a request waiting for
    memory (free slots external fragmentation)."""
    assert categories(s, False) == [token_states, reservation, internal, slack, 0, free]
    assert categories(s, True) == [token_states, reservation, internal, slack, free, 0]


def test_max_reservations_of_three_on_a_buddy_of_64():
    """max: R = M = 16 each, placed 16, lowest free first: [0, 16), [16, 32), [32, 48).
    Token states 4 + 2 + 8 = 14; reservation min(R, F) - L = 2 + 14 + 1 = 17; internal
    R - F = 10 + 0 + 7 = 17; no slack; 64 - 48 = 16 free."""
    s = core_state("orca-max", ABC, slots=64)
    for i in range(3):
        prefilled(s, i)
    assert [extent_of(s, i) for i in range(3)] == [(0, 16, 16), (16, 16, 16), (32, 16, 16)]
    both(s, 14, 17, 17, 0, 16)


def test_pow2_reservations_of_three_on_a_buddy_of_64():
    """pow2: A R = 4 + next_pow2(2) = 6, placed 8 (64 -> 32|32 -> 16|16 -> 8|8: [0, 8));
    B 2 + next_pow2(14) = 18, capped at M = 16, placed 16: the lowest free 16 is [16, 32);
    C 8 + next_pow2(1) = 9, placed 16: 32@32 splits, [32, 48).
    Token states 14; reservation min(R, F) - L = 2 + 14 + 1 = 17; internal R - F = 0 each;
    slack A - R = 2 + 0 + 7 = 9; free 64 - 8 - 16 - 16 = 24. Freeing A and C leaves B's 2
    tokens and 14 reserved, 64 - 16 = 48 free."""
    s = core_state("orca-pow2", ABC, slots=64)
    assert [extent.request_size(s, i, int(s.prompt_tokens[i])) for i in range(3)] == [6, 16, 9]
    for i in range(3):
        prefilled(s, i)
    assert [extent_of(s, i) for i in range(3)] == [(0, 6, 8), (16, 16, 16), (32, 9, 16)]
    both(s, 14, 17, 0, 9, 24)
    extent.free(s, 0)
    extent.free(s, 2)
    both(s, 2, 14, 0, 0, 48)


def test_pow2_rounds_an_output_of_25_to_32():
    """P 10, O 25: R = 10 + next_pow2(25) = 10 + 32 (M 512 does not cap it)."""
    s = core_state("orca-pow2", [(0, 10, 25)], slots=1024, max_seq_len=512)
    assert extent.request_size(s, 0, 10) == 10 + 32


def test_oracle_first_fit_leaves_external_fragmentation():
    """oracle (R = F) first-fit over 64: A [0, 6), B [6, 22), C [22, 31); token states 14,
    reservation F - L = 17, no internal or slack, 64 - 31 = 33 free. A leaves: holes [0, 6)
    and [31, 64). r3 (P 10, F 16) takes the lowest hole that fits, [31, 47); r4 (the same)
    [47, 63); r5 (P 3, F 7) waits: 6 + 1 = 7 slots are free but the largest hole is 6, and
    those 7 slots are external fragmentation."""
    rows = ABC + [(0, 10, 6), (0, 10, 6), (0, 3, 4)]
    s = core_state("orca-oracle", rows, slots=64, placement="first-fit")
    for i in range(3):
        prefilled(s, i)
    assert [extent_of(s, i)[:2] for i in range(3)] == [(0, 6), (6, 16), (22, 9)]
    both(s, 14, 17, 0, 0, 33)
    extent.free(s, 0)
    assert admit(s, 3) == OK and extent_of(s, 3)[:2] == (31, 16)
    assert admit(s, 4) == OK and extent_of(s, 4)[:2] == (47, 16)
    assert admit(s, 5) == LATER
    assert holes(s) == [[0, 6], [63, 1]]
    assert categories(s, True)[4] == 7 and sum(categories(s, True)) == 64


def test_a_move_frees_its_old_place_for_a_blocked_head():
    """First-fit over 16, predicted (e 0.5): filler P 2, O 1, z 0 -> R 3 at [0, 3); A P 2, O 5,
    z -1.5 -> 5 * 0.25 = 1.25 rounds to 1: R 3 at [3, 6); B P 5, O 1, z 0 -> R 6 at [6, 12);
    [12, 16) free. The filler leaves: holes of 3 and 4, so the head (P 5, O 1: R 6) waits.
    A at 3 tokens overflows: R' = max(3 + 1, 2 + 2 x (3 - 2)) = 4; B follows it, so it cannot
    grow in place and moves to [12, 16). Its old place joins the filler's hole, [0, 6), and
    the head fits: the move counts as a free (FREE_EPOCH), so the scheduler retries a head
    blocked on memory (scheduler_vllm.head_still_blocked)."""
    s = predicted_state([(0, 2, 1), (0, 2, 5), (0, 5, 1), (0, 5, 1)], [0.0, -1.5, 0.0, 0.0], slots=16,
                        placement="first-fit")
    assert admit(s, 0) == OK and extent_of(s, 0) == (0, 3, 3)
    decoding(s, 1, 2, 3)
    assert extent_of(s, 1) == (3, 3, 3)
    assert admit(s, 2) == OK and extent_of(s, 2) == (6, 6, 6)
    extent.free(s, 0)
    assert holes(s) == [[0, 3], [12, 4]]
    assert admit(s, 3) == LATER
    epoch = int(s.count[state.FREE_EPOCH])
    assert extent.overflows(s, 1) and extent.can_rereserve(s, 1)
    extent.rereserve(s, 1)
    assert extent_of(s, 1) == (12, 4, 4) and holes(s) == [[0, 6]]
    assert s.count[state.NUM_MOVES] == 1 and s.count[state.FREE_EPOCH] == epoch + 1
    assert admit(s, 3) == OK and extent_of(s, 3) == (0, 6, 6)


def test_growing_in_place_frees_nothing():
    """A alone (P 2, O 5, z -1.5: R 3 at [0, 3)) at 3 tokens grows in place to R' 4: nothing
    is freed, so a blocked head stays blocked (FREE_EPOCH unchanged)."""
    s = predicted_state([(0, 2, 5)], [-1.5], slots=16, placement="first-fit")
    decoding(s, 0, 2, 3)
    epoch = int(s.count[state.FREE_EPOCH])
    extent.rereserve(s, 0)
    assert extent_of(s, 0) == (0, 4, 4) and holes(s) == [[4, 12]]
    assert s.count[state.NUM_GROWS_IN_PLACE] == 1 and s.count[state.NUM_MOVES] == 0
    assert s.count[state.FREE_EPOCH] == epoch


# -- the placements on their own (sim/core/kv/placement.py) -----------------------------------------
def test_next_pow2():
    assert [placement.next_pow2(x) for x in (0, 1, 2, 3, 4, 5, 25, 1024, 1025)] == [1, 1, 2, 4, 4, 8, 32, 1024, 2048]


def test_buddy_splits_and_merges_by_address():
    """A buddy of 64. 3 slots are placed in a 4: 64 -> 32|32 -> 16|16 -> 8|8 -> 4|4, the lowest
    half each time: [0, 4), leaving 4@4, 8@8, 16@16, 32@32. 8 takes 8@8, 4 takes 4@4. Freeing
    4@0 merges nothing (its buddy 4@4 is taken); freeing 4@4 merges 4@0 + 4@4 into 8@0 (its
    buddy 8@8 is taken); freeing 8@8 merges 8@0 + 8@8, then with 16@16, then with 32@32: the
    whole pool."""
    s = core_state("orca-pow2", [(0, 1, 1)], slots=64, max_seq_len=64)
    assert buddy_free_blocks(s) == {64: [0]}
    assert placement.place(s, 3) == 0
    assert buddy_free_blocks(s) == {4: [4], 8: [8], 16: [16], 32: [32]}
    assert placement.place(s, 8) == 8
    assert placement.place(s, 4) == 4
    assert buddy_free_blocks(s) == {16: [16], 32: [32]}
    placement.release(s, 0, 4)
    assert buddy_free_blocks(s) == {4: [0], 16: [16], 32: [32]}
    placement.release(s, 4, 4)
    assert buddy_free_blocks(s) == {8: [0], 16: [16], 32: [32]}
    placement.release(s, 8, 8)
    assert buddy_free_blocks(s) == {64: [0]}


def test_a_buddy_of_15728_is_its_binary_digits():
    """15,728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16: one chunk per set bit, by
    address from the largest (the paper's OPT-13B pool, test_paper_opt13b_max_admits_seven)."""
    s = core_state("orca-max", [(0, 1, 1)], slots=15728, max_seq_len=2048)
    assert buddy_free_blocks(s) == {8192: [0], 4096: [8192], 2048: [12288], 1024: [14336], 256: [15360],
                                    64: [15616], 32: [15680], 16: [15712]}


def test_placements_fill_every_slot():
    """One slot at a time, a buddy of 100 (64 + 32 + 4) and a first-fit pool of 100 place 100
    extents, then nothing more."""
    for name in ("buddy", "first-fit"):
        s = core_state("orca-oracle", [(0, 1, 1)], slots=100, placement=name)
        starts = []
        while placement.can_place(s, 1):
            starts.append(int(placement.place(s, 1)))
        assert sorted(starts) == list(range(100)), name
