"""Beam search in the core (sim/core/sched/beam.py: the beams follow a beam search's record;
kv_cache's swap of a group that keeps its sharing), worked by hand on a pool of 6 blocks of 4
tokens: request A has a 6-token prompt, 4 output tokens and beam_width 3 (final length F = 10),
B a 2-token prompt and 4 beams, C (3 tokens) two parallel samples, which follow no record.

Each case writes the record's rows it needs into the state (a row: each new beam's parent among
the step's beams), and the rest is worked by hand from them. Then the core against an
independent count: a request alone holds, at every step, the blocks ``traces/beam_search.py``
counts from its record's lineage (distinct ancestors per block)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.beam_lineage import RECORD_TOKENS, RECORDS, lineage_library
from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import beam, lifecycle
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state, run_simulation
from pagesim.traces import beam_search as bs

from tests.sim.helpers import cfg_for, schedule_vllm
from pagesim.sim.core.sched.beam import BEAM_SEARCH, BEAM_STEPS

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
    assert s.config[BEAM_SEARCH] == 1 and s.config[BEAM_STEPS] == RECORD_TOKENS - 1
    return s


def follow(s, i, t, parents):
    """Request ``i`` follows the record row ``parents`` after decoding its token ``t + 1`` (row t)."""
    s.beam_parents[s.beam_row[i] + t, :len(parents)] = parents
    s.num_generated[i] = t + 2
    beam.follow_record(s, i)


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


def test_a_beam_no_new_beam_continues_lets_its_tail_go_and_a_parent_of_two_forks(core):
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    epoch, frees = s.count[state.FREE_EPOCH], s.count[state.NUM_FREES]
    follow(s, A, 0, [1, 2, 2])  # new beams: old 1, old 2, old 2 again; old 0 continued by none
    # old 0's tail c0 goes back to the pool (a0 is still held); new beam 0 is old 1's sequence,
    # new beam 1 old 2's (its first child), new beam 2 a fork of new beam 1
    assert rows(s, A) == [[a0, c1], [a0, a1], [a0, a1]]
    assert s.block_info[a0, state.REF] == 3 and s.block_info[a1, state.REF] == 2
    assert s.block_info[c1, state.REF] == 1
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 3 and s.free_block_ids[2] == c0
    # 3 blocks: 4 + 3 + 3 tokens, demand 4 + 4 + 4 (the shared tail counts once)
    assert memory(s) == (3, [10, 2, 0, 0, 0, 12])
    assert s.count[state.LOGICAL_BLOCKS] == 6 and s.count[state.NUM_FORKS] == 3
    assert s.count[state.NUM_FREES] == frees + 1 and s.count[state.FREE_EPOCH] == epoch + 1
    assert s.num_seqs[A] == 3 and s.count[state.NUM_RUNNING_SEQS] == 0  # A was never started here
    # the next token: new beam 1 shares its tail with beam 2, so it copies it (into c0, the
    # block the dead beam freed); beam 2, its last holder, writes in place
    assert kv_cache.decode_blocks_needed(s, A) == 1
    cow = s.count[state.NUM_COW_COPIES]
    kv_cache.take_decode_slots(s, A)
    assert rows(s, A) == [[a0, c1], [a0, c0], [a0, a1]]
    assert s.block_info[a1, state.REF] == 1 and s.count[state.NUM_COW_COPIES] == cow + 1
    assert memory(s) == (4, [13, 3, 0, 0, 0, 8])  # the copy holds a1's 3 tokens


def test_survivors_move_to_their_first_childs_place_in_a_chain(core):
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    # new beam 0 is old 2, new beam 1 old 0 (its first child), new beam 2 a fork of it; old 1
    # dies. Old 0 moves to place 1, which old 1 (dead) left empty; old 2 to place 0
    follow(s, A, 0, [2, 0, 0])
    assert rows(s, A) == [[a0, a1], [a0, c0], [a0, c0]]
    assert s.block_info[c0, state.REF] == 2 and s.block_info[a0, state.REF] == 3
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 3 and s.free_block_ids[2] == c1


def test_a_permutation_only_reorders(core):
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    epoch, forks, before = s.count[state.FREE_EPOCH], s.count[state.NUM_FORKS], memory(s)
    follow(s, A, 0, [1, 2, 0])  # a cycle: old 0 to place 2, old 2 to place 1, old 1 to place 0
    assert rows(s, A) == [[a0, c1], [a0, a1], [a0, c0]]
    assert memory(s) == before and s.count[state.FREE_EPOCH] == epoch and s.count[state.NUM_FORKS] == forks


def test_beams_each_continued_once_in_place_change_nothing(core):
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    epoch, before = s.count[state.FREE_EPOCH], memory(s)
    follow(s, A, 0, [0, 1, 2])
    assert rows(s, A) == [[a0, c0], [a0, c1], [a0, a1]]
    assert memory(s) == before and s.count[state.FREE_EPOCH] == epoch and s.count[state.NUM_FORKS] == 2


def test_every_new_beam_from_one_parent(core):
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    follow(s, A, 0, [2, 2, 2])  # old 0 and old 1 die; old 2 continues, forked twice
    assert rows(s, A) == [[a0, a1]] * 3
    assert s.block_info[a0, state.REF] == 3 and s.block_info[a1, state.REF] == 3
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 4 and s.free_block_ids[2:4].tolist() == [c0, c1]
    assert memory(s) == (2, [7, 1, 0, 0, 0, 16])
    assert s.count[state.NUM_FORKS] == 4 and s.count[state.LOGICAL_BLOCKS] == 6
    assert kv_cache.decode_blocks_needed(s, A) == 2  # as right after the first fork


def test_a_record_read_past_its_end_repeats_its_second_half():
    steps = 6  # rows 0-5; past them rows 3, 4, 5, 3, 4, ...
    assert [beam.record_step(steps, t) for t in range(12)] == [0, 1, 2, 3, 4, 5, 3, 4, 5, 3, 4, 5]
    assert [beam.record_step(1, t) for t in range(3)] == [0, 0, 0]


def test_only_forked_beams_follow_and_only_after_a_decode_step(core):
    """Through the scheduler: A and C prefill and fork (A's record not read: nothing decoded
    yet), 3 of 6 blocks free; then a decode step: A's 3 beams, at their turn, find 3 free blocks
    and take 2 (copies of their shared tail), which leaves 1 for C's 2 samples: vLLM's rule asks
    2 (one per sequence), so C, the last running, is preempted (swapped out: a group), and A
    alone decodes and follows its record's row 0."""
    s = core
    s.beam_parents[s.beam_row[A] + 0, :3] = [2, 2, 2]
    lifecycle.add_arrival(s, A)
    lifecycle.add_arrival(s, C)
    schedule(s)
    assert s.count[state.STEP_PREFILL_SEQS] == 2
    complete_step(s, 1.0)
    assert s.num_seqs[A] == 3 and s.num_seqs[C] == 2
    assert rows(s, A) == [rows(s, A)[0]] * 3  # forked, all three the prompt's blocks
    schedule(s)
    assert s.count[state.STEP_DECODE_SEQS] == 3 and s.status[C] == state.SWAPPED and s.num_preemptions[C] == 1
    kept = rows(s, A)[2]  # the beam that kept the shared tail
    complete_step(s, 2.0)
    assert rows(s, A) == [kept] * 3  # every new beam old 2's


def test_tails_shared_in_pairs_copy_once_per_pair(core):
    """After a record's step a group's tails may be shared by some of its beams, not all: B's 4
    beams hold tails [c0, c0, c2, c2] (beams 1 and 3 died, forked from 0 and 2). The next token
    copies each shared tail once (beams 0 and 2; beams 1 and 3, their last holders, write in
    place), and the last beam shares its tail (vLLM's rule asks one block of it)."""
    s = core
    kv_cache.allocate(s, B, 2, 0)
    kv_cache.compute_tokens(s, B, 2, s.config[state.FAMILY_TRAITS])
    kv_cache.fork(s, B)
    kv_cache.take_decode_slots(s, B)  # three copies of the 2-token block; the fourth beam keeps it
    s.num_computed_tokens[B] += 1
    (c0,), (c1,), (c2,), (b0,) = rows(s, B)
    follow(s, B, 0, [0, 0, 2, 2])
    assert rows(s, B) == [[c0], [c0], [c2], [c2]]
    assert kv_cache.decode_blocks_needed(s, B) == 2
    cow = s.count[state.NUM_COW_COPIES]
    kv_cache.take_decode_slots(s, B)
    r = rows(s, B)
    assert r[1] == [c0] and r[3] == [c2] and len({t[0] for t in r}) == 4
    assert s.count[state.NUM_COW_COPIES] == cow + 2 and s.count[state.STEP_COPIED_BLOCKS] == 5


def test_a_swapped_group_comes_back_sharing_what_it_shared(core):
    """A's beams after a record's step share a decoded block: [a0, c1], [a0, a1], [a0, a1]:
    beam 1 shares a0 with beam 0, beam 2 both blocks with beam 1. Swapped out, each keeps that
    (vLLM 0.4.2 moves a shared block once, and back in once: its ``mapping``), so 7 + 3 + 0 = 10
    tokens move, not 7 + 3 + 3 as if only the prompt's full block were shared, and they come back
    holding 3 blocks, as they left."""
    s = core
    a0, a1, c0, c1 = decoded_once(s)
    follow(s, A, 0, [1, 2, 2])
    sharing = interpreted(kv_cache.sharing)
    assert [sharing(s, A, j) for j in (1, 2)] == [(0, 1), (1, 2)]
    assert interpreted(kv_cache.swapped_size)(s, A, 7) == 10
    interpreted(kv_cache.swap_out)(s, A)
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 6 and s.num_blocks[A] == 0
    assert [sharing(s, A, j) for j in (1, 2)] == [(0, 1), (1, 2)]  # kept while out
    assert interpreted(kv_cache.swapped_size)(s, A, 7) == 10
    assert interpreted(kv_cache.swap_in)(s, A, 7)
    (x0, x1), (y0, y1), (z0, z1) = rows(s, A)
    assert x0 == y0 == z0 and y1 == z1 and x1 != y1
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 3
    assert s.block_info[x0, state.REF] == 3 and s.block_info[y1, state.REF] == 2


def test_each_request_follows_record_i_mod_records_of_its_width():
    """``build.beam_arrays``: a section of records per width the trace has, request ``i`` on
    record ``i mod RECORDS`` of its width; a width above ``max_num_seqs`` (never decodes) none."""
    widths = [4, 1, 2, 4, 9] + [4] * RECORDS
    trace = pd.DataFrame({"request_id": [str(i) for i in range(len(widths))], "arrival_s": 0.0,
                          "prompt_tokens": 8, "output_tokens": 4, "beam_width": widths})
    s = initial_state(cfg_for(max_num_seqs=8), trace)
    steps = RECORD_TOKENS - 1
    assert s.beam_parents.shape == (2 * RECORDS * steps, 4)  # widths 2 and 4; not 1, not 9
    for i, w in enumerate(widths):
        if w in (2, 4):
            record = lineage_library(w)[i % RECORDS]
            assert (s.beam_parents[s.beam_row[i]:s.beam_row[i] + steps, :w] == record).all()
    assert s.beam_row[RECORDS] == s.beam_row[0] and s.beam_row[3] == s.beam_row[0] + 3 * steps
    assert s.beam_row[2] == 2 * steps and s.beam_row[0] == RECORDS * steps  # width 2's section first


@pytest.mark.parametrize("width, prompt", [(2, 40), (4, 40), (6, 23)])
def test_a_request_alone_holds_the_blocks_its_lineage_counts(width, prompt):
    """The core's blocks, step by step, against ``traces/beam_search.physical_blocks``, which
    counts them from the record alone (a block has as many copies as the beams have distinct
    ancestors at its last token): the same at every decode step (the step table's row k + 1 is
    the record's step k, its memory as the step starts; row 0 the prefill's)."""
    output = 300
    trace = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "prompt_tokens": [prompt],
                          "output_tokens": [output], "beam_width": [width]})
    cfg = SimConfig(model="opt-13b", gpu="a100-40gb", kv_gib=12, max_seq_len=2048, system="vllm", seed=0)
    steps = run_simulation(cfg, trace).steps
    physical, logical = bs.physical_blocks(lineage_library(width)[0, :output - 1], prompt, 16)
    # the decode steps: the record's steps but its last (the final token's, after which none runs)
    assert steps["used_blocks"].tolist()[1:] == physical[:-1].tolist()
    assert steps["logical_blocks"].tolist()[1:] == logical[:-1].tolist()
