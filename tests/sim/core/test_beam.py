"""Beam search in the core (sim/core/sched/beam.py's churn, sim/core/rng.py's draws), worked by hand
on a pool of 6 blocks of 4 tokens: request A has a 6-token prompt, 4 output tokens and
beam_width 3 (final length F = 10), B a 2-token prompt and 4 beams, C (3 tokens) two parallel
samples, which never churn. The run's churn probability is the measured 0.38 (sim/core/sched/beam.py);
the cases are worked at 0.25, set by hand in the state (the core reads it from there).

Each case seeds the Generator so that its draws are the ones the case needs; a twin of the
Generator shows the draws (numpy's own), and the rest is worked by hand from them. After a
churn the Generator must be exactly where the twin is: no draw more, none less."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest

try:
    import numba
except ImportError:  # the interpreted core
    numba = None

from pagesim.sim.core import state
from pagesim.sim.core.compile import jit
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import beam, lifecycle
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.rng import below
from pagesim.sim.run import initial_state

from tests.sim.helpers import cfg_for, schedule_vllm
from pagesim.sim.core.sched.beam import BEAM_CHURN, BEAM_SEARCH

schedule = schedule_vllm  # the scheduler's steps run by CPython (tests/sim/helpers.py)


def complete_step(s, now):
    """The step's end, by the loop's function for the state's family (sim/core/kv/memory.py)."""
    interpreted(lifecycle.complete_step)(s, now, s.config[state.FAMILY_TRAITS])

A, C, B = 0, 1, 2


@pytest.fixture
def core():
    trace = pd.DataFrame({"request_id": ["A", "C", "B"], "arrival_s": [0.0, 0.0, 0.0], "prompt_tokens": [6, 3, 2],
                          "output_tokens": [4, 4, 3], "beam_width": [3, 1, 4], "n": [1, 2, 1]})
    cfg = cfg_for(slots=24, block_size=4, max_seq_len=24, watermark=0.0, max_num_seqs=5)
    s = initial_state(cfg, trace)
    assert s.config[state.NUM_BLOCKS] == 6
    assert s.config[BEAM_SEARCH] == 1 and s.clock[BEAM_CHURN] == 0.38
    s.clock[BEAM_CHURN] = 0.25
    return s


def memory(s):
    out = np.zeros(state.MEMORY_CATEGORIES, np.int64)  # the six, speculative slack, in transfer
    used = kv_cache.memory_categories(s, 0, out)
    return used, out[:6].tolist()


def rows(s, i):
    return [s.block_table[s.seq_slot[i, j], :s.num_blocks[i]].tolist() for j in range(s.num_seqs[i])]


def decoded_once(s):
    """A prefilled (blocks a0, a1: 4 + 2 tokens), forked into 3 beams, and one decode token:
    beams 0 and 1 copied the shared tail a1 (c0, c1), beam 2 kept it; 7 tokens each."""
    kv_cache.allocate(s, A, 6, 0)
    kv_cache.compute_tokens(s, A, 6, s.config[state.FAMILY_TRAITS])
    kv_cache.fork(s, A)
    kv_cache.take_decode_slots(s, A)
    s.num_computed_tokens[A] += 1
    s.count[state.COMPUTED_SLOTS] += 3
    (a0, c0), (_, c1), (_, a1) = rows(s, A)
    # 4 blocks: a0 full (4), three tails of 3 tokens; demand 4 + 3 * min(F - 4, 4) = 16
    assert memory(s) == (4, [13, 3, 0, 0, 0, 8])
    assert s.count[state.LOGICAL_BLOCKS] == 6 and s.count[state.NUM_FORKS] == 2
    return a0, a1, c0, c1


def with_seed(s, seed):
    """``s`` drawing from a Generator seeded ``seed``, and its twin (the same draws, for the test)."""
    g = np.random.default_rng(seed)
    return s._replace(rng=g), copy.deepcopy(g)


def test_a_dead_beam_lets_its_tail_go_and_is_replaced_by_a_fork_of_a_survivor(core):
    s, twin = with_seed(core, 1284)
    a0, a1, c0, c1 = decoded_once(s)
    u = twin.random(3)
    assert (u < 0.25).tolist() == [True, False, False]  # beam 0 dies
    assert u[0] >= 0.2 and u[1] < 0.3  # at 0.2 it would live, at 0.3 beam 1 would die
    assert twin.integers(2) == 1  # the parent: survivor 1 of [beam 1, beam 2], i.e. beam 2
    epoch, frees = s.count[state.FREE_EPOCH], s.count[state.NUM_FREES]
    beam.churn_beams(s, A)
    assert s.rng.random() == twin.random()  # exactly those draws
    # beam 0's tail c0 goes back to the pool (a0 is still held); the survivors keep their
    # order, the new beam (beam 2's blocks: a0, a1) comes after them
    assert rows(s, A) == [[a0, c1], [a0, a1], [a0, a1]]
    assert s.block_info[a0, state.REF] == 3 and s.block_info[a1, state.REF] == 2
    assert s.block_info[c1, state.REF] == 1
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 3 and s.free_block_ids[2] == c0
    # 3 blocks: 4 + 3 + 3 tokens, demand 4 + 4 + 4 (the shared tail counts once)
    assert memory(s) == (3, [10, 2, 0, 0, 0, 12])
    assert s.count[state.LOGICAL_BLOCKS] == 6 and s.count[state.NUM_FORKS] == 3
    assert s.count[state.NUM_FREES] == frees + 1 and s.count[state.FREE_EPOCH] == epoch + 1
    assert s.num_seqs[A] == 3 and s.count[state.NUM_RUNNING_SEQS] == 0  # A was never started here
    # the next token: beam 2 shares its tail with the new beam, so it copies it (into c0, the
    # block the dead beam freed); the new beam, its last holder, writes in place
    assert kv_cache.decode_blocks_needed(s, A) == 1
    cow = s.count[state.NUM_COW_COPIES]
    kv_cache.take_decode_slots(s, A)
    assert rows(s, A) == [[a0, c1], [a0, c0], [a0, a1]]
    assert s.block_info[a1, state.REF] == 1 and s.count[state.NUM_COW_COPIES] == cow + 1
    assert memory(s) == (4, [13, 3, 0, 0, 0, 8])  # the copy holds a1's 3 tokens


def test_when_every_beam_would_die_one_drawn_at_random_lives(core):
    s, twin = with_seed(core, 604)
    a0, a1, c0, c1 = decoded_once(s)
    u = twin.random(3)
    assert (u < 0.25).all() and u[0] >= 0.2
    assert twin.integers(3) == 2  # beam 2 lives; its two forks draw their parent from one
    beam.churn_beams(s, A)
    assert s.rng.random() == twin.random()  # integers(1) draws nothing, as numpy's
    assert rows(s, A) == [[a0, a1]] * 3
    assert s.block_info[a0, state.REF] == 3 and s.block_info[a1, state.REF] == 3
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 4 and s.free_block_ids[2:4].tolist() == [c0, c1]
    assert memory(s) == (2, [7, 1, 0, 0, 0, 16])
    assert s.count[state.NUM_FORKS] == 4 and s.count[state.LOGICAL_BLOCKS] == 6
    assert kv_cache.decode_blocks_needed(s, A) == 2  # as right after the first fork


def test_beams_that_all_live_change_nothing(core):
    s, twin = with_seed(core, 2)
    a0, a1, c0, c1 = decoded_once(s)
    u = twin.random(3)
    assert (u >= 0.25).all() and u[0] < 0.3
    epoch, before = s.count[state.FREE_EPOCH], memory(s)
    beam.churn_beams(s, A)
    assert s.rng.random() == twin.random()  # three draws, no integer
    assert rows(s, A) == [[a0, c0], [a0, c1], [a0, a1]]
    assert memory(s) == before and s.count[state.FREE_EPOCH] == epoch and s.count[state.NUM_FORKS] == 2


def test_only_forked_beams_churn_and_only_after_a_decode_step(core):
    """Through the scheduler: A and C prefill (no draw: nothing decoded), both fork, 3 of 6
    blocks free; then a decode step: A's 3 beams, at their turn, find 3 free blocks and take
    2 (copies of their shared tail), which leaves 1 for C's 2 samples: vLLM's rule asks 2
    (one per sequence), so C, the last running, is preempted (swapped out: a group), and A
    alone decodes and draws (C's samples would not churn)."""
    s, twin = with_seed(core, 2)
    lifecycle.add_arrival(s, A)
    lifecycle.add_arrival(s, C)
    schedule(s)
    assert s.count[state.STEP_PREFILL_SEQS] == 2
    complete_step(s, 1.0)
    assert s.num_seqs[A] == 3 and s.num_seqs[C] == 2
    assert s.rng.bit_generator.state == twin.bit_generator.state
    schedule(s)
    assert s.count[state.STEP_DECODE_SEQS] == 3 and s.status[C] == state.SWAPPED and s.num_preemptions[C] == 1
    complete_step(s, 2.0)
    twin.random(3)
    assert s.rng.bit_generator.state == twin.bit_generator.state


def test_tails_shared_in_pairs_copy_once_per_pair(core):
    """After churns a group's tails may be shared by some of its beams, not all: B's 4 beams
    hold tails [c0, c0, c2, c2] (beams 1 and 3 died, forked from 0 and 2). The next token
    copies each shared tail once (beams 0 and 2; beams 1 and 3, their last holders, write in
    place), and the last beam shares its tail (vLLM's rule asks one block of it)."""
    s = core
    kv_cache.allocate(s, B, 2, 0)
    kv_cache.compute_tokens(s, B, 2, s.config[state.FAMILY_TRAITS])
    kv_cache.fork(s, B)
    kv_cache.take_decode_slots(s, B)  # three copies of the 2-token block; the fourth beam keeps it
    s.num_computed_tokens[B] += 1
    (c0,), (c1,), (c2,), (b0,) = rows(s, B)
    kv_cache.release_seq(s, B, 1)
    kv_cache.release_seq(s, B, 3)
    kv_cache.fork_seq(s, B, 0, 1)
    kv_cache.fork_seq(s, B, 2, 3)
    assert rows(s, B) == [[c0], [c0], [c2], [c2]]
    assert kv_cache.decode_blocks_needed(s, B) == 2
    cow = s.count[state.NUM_COW_COPIES]
    kv_cache.take_decode_slots(s, B)
    r = rows(s, B)
    assert r[1] == [c0] and r[3] == [c2] and len({t[0] for t in r}) == 4
    assert s.count[state.NUM_COW_COPIES] == cow + 2 and s.count[state.STEP_COPIED_BLOCKS] == 5


def draws(rng, bounds, out):
    for k in range(len(bounds)):
        out[2 * k] = rng.random()
        out[2 * k + 1] = below(rng, bounds[k])


# compiled as the core is, but not cached: the cache of a function in this file would not see an
# edit of rng.below (sim/core's cache is dropped when a core source changes, this one is not)
compiled_draws = numba.njit(_nrt=False)(draws) if jit.COMPILED else draws


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_below_draws_as_numpy_integers(seed):
    """rng.below, compiled (numba's Generator) and interpreted, is ``rng.integers(n)``,
    interleaved with ``rng.random()``: the same numbers and the same state after."""
    bounds = np.array([2, 3, 1, 6, 5, 1, 2, 4, 7, 3, 1000, 2 ** 31 + 5] * 20, np.int64)
    twin = np.random.default_rng(seed)
    expected = []
    for n in bounds.tolist():
        expected += [twin.random(), float(twin.integers(n))]
    for run in (compiled_draws, draws):
        g = np.random.default_rng(seed)
        out = np.zeros(2 * len(bounds))
        run(g, bounds, out)
        assert out.tolist() == expected
        assert g.bit_generator.state == twin.bit_generator.state
