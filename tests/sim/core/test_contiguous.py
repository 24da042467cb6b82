"""The core's contiguous (Orca) manager and its placements, worked by hand on tiny pools:
where each extent lands, its reservation and slack, and the external fragmentation when the
next one does not fit (sim/core/extent.py, sim/core/placement.py)."""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import extent, kv_cache, placement, replay, scheduler, state
from pagesim.sim.engine import Engine
from pagesim.sim.run import build, run_simulation
from tests.sim.helpers import cfg_for, trace

OK, LATER, NEVER = kv_cache.CAN_ALLOCATE, kv_cache.ALLOCATE_LATER, kv_cache.NEVER_FITS


def core_state(system, rows, slots=16, max_seq_len=16, **kw):
    """The core's state before the run: ``rows`` (arrival, prompt, output) over ``slots``."""
    cfg = cfg_for(system, slots=slots, max_seq_len=max_seq_len, **kw)
    _, _, _, table, manager, sched, executor = build(cfg, trace(rows))
    assert manager.capacity == slots
    return replay.build(Engine(sched, manager, executor, table.arrival_s, engine="python"))


def admit(s, i):
    """Request ``i``'s admission answer; its extent when it fits."""
    prompt = int(s.prompt_tokens[i])
    answer = extent.can_allocate(s, i, prompt)
    if answer == OK:
        extent.allocate(s, i, prompt, 0)
    return answer


def extent_of(s, i):
    return tuple(int(v) for v in s.extent[i])


def categories(s, demand_waiting):
    out = np.zeros(6, np.int64)
    extent.memory_categories(s, demand_waiting, out)
    return out.tolist()


def holes(s):
    """[start, size] of the fit placements' holes, by address."""
    return s.holes[:s.count[state.NUM_HOLES]].tolist()


def buddy_free_blocks(s):
    """{size: [starts]} of the buddy's free blocks, read from its bitmaps."""
    blocks = {}
    for k in range(len(s.buddy_orders)):
        starts = [b << k for b in range(int(s.config[state.CAPACITY]) >> k) if placement.buddy_is_free(s, k, b << k)]
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
    assert [int(s.extent[i, state.EXTENT_START]) for i in range(7)] == [12288, 8192, 10240, 0, 2048, 4096, 6144]
    assert categories(s, True) == [0, 7 * 300, 7 * (2048 - 300), 0, 1392, 0]


def test_best_fit_ties_go_to_the_lowest_address():
    """Two holes of 3 ([0, 3) and [5, 8)) and one of 8 elsewhere: best-fit takes the lowest of
    the smallest."""
    s = core_state("orca-oracle", [(0, 2, 1), (0, 1, 1), (0, 2, 1), (0, 7, 1), (0, 2, 1)], placement="best-fit")
    for i, start in enumerate((0, 3, 5, 8)):
        assert admit(s, i) == OK and int(s.extent[i, state.EXTENT_START]) == start
    extent.free(s, 0)
    extent.free(s, 2)
    assert admit(s, 4) == OK and extent_of(s, 4) == (0, 3, 3)


def test_sampling_width_is_rejected_on_managers_that_cannot_share_blocks():
    """Forks share blocks only in the paged managers (ContinuousScheduler.fork_ok): on Orca's
    extents and vAttention's pages a request of n > 1 is rejected at the queue's head, with the
    Python scheduler's reason, and the requests behind it are admitted as usual."""
    for system, slots in (("orca-max", 64), ("vattention", 2048)):
        s = core_state(system, [(0, 3, 2), (0, 4, 2), (0, 2, 2)], slots=slots, max_seq_len=16)
        s.width[1] = 2
        for i in range(3):
            scheduler.add_arrival(s, i)
        scheduler.admit_waiting(s, 1 << 20)
        assert s.status[:3].tolist() == [state.RUNNING, state.REJECTED, state.RUNNING], system
        assert s.reject_code[1] == state.REJECT_WIDTH_UNSHARED and s.count[state.NUM_REJECTED] == 1
        assert s.config[state.FORKS_SHARE_BLOCKS] == 0
    tr = trace([(0, 3, 2), (0, 4, 2), (0, 2, 2)], n=[1, 2, 1])
    r = run_simulation(cfg_for("orca-max", slots=64, max_seq_len=16), tr, engine="core")
    assert r.requests["reject_reason"].tolist() == [
        "", "parallel sampling / beam search (width 2) needs a manager that shares blocks (paged); "
            "this one would copy whole reservations", ""]
    assert r.requests["status"].tolist() == ["finished", "rejected", "finished"]
