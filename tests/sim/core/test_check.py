"""``--check`` on the core (sim/core/check.py): a run checked after every iteration gives the
same records as an unchecked one, and each invariant, broken by hand in a real mid-run state,
is named."""

from __future__ import annotations

import pytest

from pagesim.sim.core import state
from pagesim.sim.core.events import loop, replay
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, rand_trace
from pagesim.sim.core.kv.extent import EXTENT_START, PLACED_SLOTS
from pagesim.sim.core.kv.placement import HOLE_SIZE, NUM_HOLES
from pagesim.sim.core.sched.scheduler_vllm import BLOCKED_KIND


def mid_run(cfg, trace, iterations: int = 40) -> state.Core:
    """The core's state after ``iterations`` checked iterations (``cfg`` has ``check=True``)."""
    assert cfg.check
    s = initial_state(cfg, trace)
    run = replay.compiled_entry(loop.run_for(s.config[state.SCHEDULER_KIND]), s)
    for _ in range(iterations):
        assert run(s) == loop.STEPPED
    return s


@pytest.mark.parametrize("system,kw", [("vllm", {}), ("vllm", dict(preemption="swap")),
                                       ("vllm", dict(prefix_caching=True)), ("orca-pow2", {}),
                                       ("orca-oracle", dict(placement="first-fit")), ("static", {})])
def test_checked_run_is_the_unchecked_run(system, kw):
    slots = 2048 if system == "static" else 1200
    trace = rand_trace(3, n=60, prefix=kw.get("prefix_caching", False))
    checked = run_simulation(cfg_for(system, slots=slots, check=True, **kw), trace)
    plain = run_simulation(cfg_for(system, slots=slots, **kw), trace)
    assert checked.summary["engine"] == plain.summary["engine"] != "python"
    assert checked.requests.equals(plain.requests) and checked.steps.equals(plain.steps)
    assert checked.summary["num_preemptions"] == plain.summary["num_preemptions"]


def held_block(s):
    i = int(s.running[0])
    return int(s.block_table[s.seq_slot[i, 0], 0])


def free_a_held_block(s):
    s.free_block_ids[s.count[state.NUM_FREE_BLOCK_IDS]] = held_block(s)
    s.count[state.NUM_FREE_BLOCK_IDS] += 1


def free_a_free_block_twice(s):
    s.free_block_ids[s.count[state.NUM_FREE_BLOCK_IDS]] = s.free_block_ids[0]
    s.count[state.NUM_FREE_BLOCK_IDS] += 1


def lose_a_free_block(s):
    s.count[state.NUM_FREE_BLOCK_IDS] -= 1


def overfill_a_holder(s):
    i = s.running[0]
    s.num_computed_tokens[i] = s.num_blocks[i] * s.config[state.BLOCK_SIZE] + 1


def drop_a_sequences_table(s):
    s.seq_slot[s.running[0], 0] = -1


def run_a_request_twice(s):
    s.running[1] = s.running[0]


def run_a_request_again(s):
    """The running list one longer, its new last entry its first request."""
    s.running[s.count[state.NUM_RUNNING]] = s.running[0]
    s.count[state.NUM_RUNNING] += 1


def running_as_waiting(s):
    s.status[s.running[0]] = state.WAITING


PAGED_BREAKS = [
    (lambda s: s.count.__setitem__(state.COMPUTED_SLOTS, s.count[state.COMPUTED_SLOTS] + 1), "token-state counter"),
    (lambda s: s.count.__setitem__(state.DEMAND_SLOTS, s.count[state.DEMAND_SLOTS] - 1), "demand counter"),
    (lambda s: s.count.__setitem__(state.LOGICAL_BLOCKS, s.count[state.LOGICAL_BLOCKS] + 1), "logical block"),
    (lambda s: s.count.__setitem__(state.DECODE_SET_SIZE, s.count[state.DECODE_SET_SIZE] + 1), "decode set"),
    (lambda s: s.count.__setitem__(state.NUM_RUNNING_SEQS, s.count[state.NUM_RUNNING_SEQS] - 1), "running sequences"),
    (free_a_held_block, "held, free or cached at once"),
    (free_a_free_block_twice, "on the free stack twice"),
    (lose_a_free_block, "held \\+ free \\+ cached blocks != the pool"),
    (overfill_a_holder, r"request \d+: \d+ tokens in \d+ blocks"),
    (drop_a_sequences_table, r"request \d+'s sequence 0 has no block table"),
    (run_a_request_twice, "twice in the running list"),
    (run_a_request_again, "twice in the running list"),
    (running_as_waiting, "the waiting list is not the requests of that status"),
    (lambda s: s.status.__setitem__(s.running[0], state.LOADING + 1), "a request's status is none the core sets"),
    (lambda s: s.count.__setitem__(state.WAITING_LEN, len(s.waiting) + 1), "outside its ring"),
    (lambda s: s.running.__setitem__(0, -3), "a queue holds a request the run does not have"),
    (lambda s: s.running.__setitem__(0, len(s.status)), "a queue holds a request the run does not have"),
    (lambda s: s.count.__setitem__(state.NUM_FREE_BLOCK_IDS, -1), "-1 free blocks of .*: the pool was overdrawn"),
    (lambda s: s.count.__setitem__(state.NUM_FREE_SLOTS, len(s.free_slots) + 1), "free block-table rows of"),
]


@pytest.mark.parametrize("breaks,named", PAGED_BREAKS)
def test_a_broken_paged_state_is_named(breaks, named):
    s = mid_run(cfg_for("vllm", slots=1200, check=True), rand_trace(3, n=60))
    replay.checked(s, 0.0)  # whole, it passes
    breaks(s)
    with pytest.raises(InvariantError, match=named):
        replay.checked(s, 0.0)


def test_shared_reference_counts_are_recomputed():
    s = mid_run(cfg_for("vllm", slots=1200, check=True, prefix_caching=True), rand_trace(3, n=60, prefix=True))
    replay.checked(s, 0.0)
    s.block_info[held_block(s), state.REF] += 1
    with pytest.raises(InvariantError, match="reference counts differ"):
        replay.checked(s, 0.0)


def test_a_shared_block_holding_different_tokens_for_its_holders_is_named():
    """Two running requests share a prefix's block; one of them made to hold it partly (its
    computed tokens ending inside it) says that block holds fewer tokens than the other says."""
    s = mid_run(cfg_for("vllm", slots=1200, check=True, prefix_caching=True), rand_trace(3, n=60, prefix=True))
    replay.checked(s, 0.0)
    bs, running = int(s.config[state.BLOCK_SIZE]), s.running[:s.count[state.NUM_RUNNING]].tolist()
    held = {}  # block -> (request, index) of its first holder
    for i in running:
        for k in range(int(s.num_computed_tokens[i]) // bs):  # its full blocks
            b = int(s.block_table[s.seq_slot[i, 0], k])
            if b in held:
                s.num_computed_tokens[i] = k * bs + 1  # the second holder: block k now partly held
                with pytest.raises(InvariantError, match="a shared block holds different tokens"):
                    replay.checked(s, 0.0)
                return
            held[b] = (i, k)
    pytest.fail("no block shared by two running requests in this state")


def test_a_free_block_with_a_key_is_named():
    s = mid_run(cfg_for("vllm", slots=6000, check=True, prefix_caching=True), rand_trace(3, n=60, prefix=True),
                iterations=5)
    replay.checked(s, 0.0)
    assert s.count[state.NUM_FREE_BLOCK_IDS]
    s.block_info[s.free_block_ids[0], state.KEY_END] = 16
    with pytest.raises(InvariantError, match="a free block still has a key"):
        replay.checked(s, 0.0)


def overlap_two_extents(s):
    first, second = sorted(s.running[:s.count[state.NUM_RUNNING]].tolist(), key=lambda i: s.extent[i, 0])[:2]
    s.extent[second, EXTENT_START] = s.extent[first, EXTENT_START] + 1


@pytest.mark.parametrize("breaks,named", [
    (overlap_two_extents, "overlaps"),
    (lambda s: s.count.__setitem__(PLACED_SLOTS, s.count[PLACED_SLOTS] + 1), "placed sums"),
    (lambda s: s.holes.__setitem__((0, HOLE_SIZE), s.holes[0, HOLE_SIZE] - 1), "not tiled|do not cover"),
])
def test_a_broken_contiguous_state_is_named(breaks, named):
    s = mid_run(cfg_for("orca-pow2", slots=1200, check=True, placement="first-fit"), rand_trace(3, n=60))
    assert s.count[state.NUM_RUNNING] >= 2 and s.count[NUM_HOLES] >= 1
    replay.checked(s, 0.0)
    breaks(s)
    with pytest.raises(InvariantError, match=named):
        replay.checked(s, 0.0)


def test_a_skipped_head_that_fits_is_named():
    """max_num_seqs=2 in a roomy pool: the head is blocked on max_num_seqs. Recorded as blocked
    on memory instead, it would be skipped though it fits."""
    s = mid_run(cfg_for("vllm", slots=6000, check=True, max_num_seqs=2), rand_trace(3, n=60), iterations=5)
    c = s.count
    assert c[state.WAITING_LEN] and c[BLOCKED_KIND] == state.BLOCKED_ON_MAX_SEQS
    replay.checked(s, 0.0)
    c[BLOCKED_KIND] = state.BLOCKED_ON_MEMORY
    with pytest.raises(InvariantError, match="skipped as blocked but would be admitted"):
        replay.checked(s, 0.0)


def test_time_going_back_is_named():
    s = mid_run(cfg_for("vllm", slots=1200, check=True), rand_trace(3, n=60), iterations=3)
    with pytest.raises(InvariantError, match="went backwards"):
        replay.checked(s, 1e9)
