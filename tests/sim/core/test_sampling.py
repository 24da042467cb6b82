"""Parallel sampling in the core (sim/core/kv/kv_cache.py's fork and copy-on-write, the
scheduler's groups), worked by hand on a pool of 6 blocks of 4 tokens: request A has a
6-token prompt, 4 output tokens and n = 3 (its final length F = 10); B has n = 4, C n = 1."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
from pagesim.sim.core import state
from pagesim.sim.core.events import loop
from pagesim.sim.core.kv import kv_cache
from pagesim.sim.core.sched import lifecycle
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state

from tests.sim.helpers import cfg_for, schedule_vllm
from pagesim.sim.core.sched.scheduler_vllm import BLOCKED_KIND

schedule = schedule_vllm  # the scheduler's steps run by CPython (tests/sim/helpers.py)


def complete_step(s, now):
    """The step's end, by the loop's function for the state's family (sim/core/kv/memory.py)."""
    interpreted(lifecycle.complete_step)(s, now, s.config[state.FAMILY_TRAITS])

A = 0


@pytest.fixture
def core():
    trace = pd.DataFrame({"request_id": ["A", "B", "C"], "arrival_s": [0.0, 0.0, 0.0], "prompt_tokens": [6, 4, 4],
                          "output_tokens": [4, 4, 4], "n": [3, 4, 1]})
    cfg = cfg_for(slots=24, block_size=4, max_seq_len=24, watermark=0.0, max_num_seqs=3)
    s = initial_state(cfg, trace)
    assert s.config[state.NUM_BLOCKS] == 6
    return s


def memory(s):
    out = np.zeros(state.MEMORY_CATEGORIES, np.int64)  # the six, speculative slack, in transfer
    used = kv_cache.memory_categories(s, 0, out)
    return used, out[:6].tolist()


def rows(s, i):
    return [s.block_table[s.seq_slot[i, j], :s.num_blocks[i]].tolist() for j in range(s.num_seqs[i])]


def prefilled_and_forked(s):
    kv_cache.allocate(s, A, 6, 0)
    kv_cache.compute_tokens(s, A, 6, s.config[state.FAMILY_TRAITS])
    kv_cache.fork(s, A)


def test_fork_shares_every_block_and_changes_no_token_count(core):
    s = core
    prefilled_and_forked(s)
    a0, a1 = rows(s, A)[0]
    assert rows(s, A) == [[a0, a1]] * 3
    assert s.block_info[a0, state.REF] == s.block_info[a1, state.REF] == 3
    # 6 tokens, demand min(F, 8) = 8, 2 blocks used; 6 logical blocks (3 tables of 2)
    assert memory(s) == (2, [6, 2, 0, 0, 0, 16])
    assert s.count[state.LOGICAL_BLOCKS] == 6 and s.count[state.NUM_FORKS] == 2
    assert s.count[state.NUM_RUNNING_SEQS] == 0  # none added: a request counts its width from its admission


def test_writing_into_the_shared_tail_copies_it_first_but_for_the_last_writer(core):
    s = core
    prefilled_and_forked(s)
    a0, a1 = rows(s, A)[0]
    # 3 writers into a1 (3 references): 2 copies; the last sequence takes one too (a copy)
    assert kv_cache.decode_blocks_needed(s, A) == 2
    kv_cache.take_decode_slots(s, A)
    r = rows(s, A)
    assert [t[0] for t in r] == [a0] * 3 and r[2][1] == a1 and len({t[1] for t in r}) == 3
    assert s.block_info[a1, state.REF] == 1 and s.block_info[a0, state.REF] == 3
    assert s.count[state.NUM_COW_COPIES] == 2 and s.count[state.STEP_COPIED_BLOCKS] == 2
    # the copies hold the tail's 2 tokens each (6 + 4; the caller counts the 3 new ones),
    # and each has demand min(F - 4, 4) = 4: 16; 4 blocks used
    assert memory(s) == (4, [10, 6, 0, 0, 0, 8])
    s.num_computed_tokens[A] += 1
    s.count[state.COMPUTED_SLOTS] += 3
    assert kv_cache.decode_blocks_needed(s, A) == 0  # private tails with room
    s.num_computed_tokens[A] += 1
    s.count[state.COMPUTED_SLOTS] += 3
    assert kv_cache.decode_blocks_needed(s, A) == 3  # 8 tokens: every sequence crosses
    kv_cache.free(s, A)  # every sequence lets its blocks go: all six are free again
    assert s.count[state.NUM_FREE_BLOCK_IDS] == 6 and s.count[state.NUM_FREES] == 3
    assert memory(s) == (0, [0, 0, 0, 0, 0, 24])


def test_copies_are_priced_as_the_roofline_copied_tokens_term(core):
    """Two copied 4-token blocks: 8 tokens read and written once each."""
    s = core
    c = s.count
    c[state.STEP_DECODE_SEQS] = 3
    plain = loop.step_time(s, 30, s.config[state.FAMILY_TRAITS])
    c[state.STEP_COPIED_BLOCKS] = 2
    from pagesim.sim.core.price import cost

    k = s.cost
    extra = 2 * 8 * k[cost.KV_BYTES_PER_TOKEN] / k[cost.MEMORY_BANDWIDTH]
    assert loop.step_time(s, 30, s.config[state.FAMILY_TRAITS]) == pytest.approx(plain + extra, rel=1e-12)


def test_a_group_counts_all_its_sequences_against_max_num_seqs(core):
    """max_num_seqs = 3: B (n = 4) is rejected at arrival; A (n = 3) is admitted when no
    sequence runs and takes all 3 from its admission, before its fork (vLLM 0.4.2 counts a
    group's best_of at its prompt stage, sequence.py:479-494)."""
    s = core
    lifecycle.add_arrival(s, 1)
    assert s.status[1] == state.REJECTED and s.reject_code[1] == state.REJECT_TOO_WIDE
    lifecycle.add_arrival(s, A)
    schedule(s)
    assert s.count[state.STEP_PREFILL_SEQS] == 1 and s.count[state.NUM_RUNNING_SEQS] == 3
    complete_step(s, 1.0)  # prefill done: forked
    assert s.num_seqs[A] == 3 and s.count[state.NUM_RUNNING_SEQS] == 3
    assert s.count[state.DECODE_SET_SIZE] == 3


def test_admission_counts_the_sequences_a_request_will_fork(core):
    """C (one sequence) runs: A's 3 sequences would make 4 > max_num_seqs = 3, so A waits,
    blocked by max_num_seqs, and the step decodes C."""
    s = core
    lifecycle.add_arrival(s, 2)
    schedule(s)
    complete_step(s, 1.0)
    lifecycle.add_arrival(s, A)
    schedule(s)
    assert s.count[state.STEP_PREFILL_SEQS] == 0 and s.count[state.STEP_DECODE_SEQS] == 1
    assert s.status[A] == state.WAITING and s.count[BLOCKED_KIND] == state.BLOCKED_ON_MAX_SEQS


def test_a_group_decodes_lockstep_and_is_preempted_as_one(core):
    """Through the scheduler: A's prefill (one sequence), the fork, a decode step of its 3
    sequences (context 7 each, which vLLM v0's kernel reads as 2 whole blocks of 4: 3 x 8 = 24
    tokens read; 2 copies of the shared tail; 3 inter-token latencies), then preempted as one:
    swapped out (vLLM 0.4.2 cannot recompute a group: its 3 x 7 tokens go to the CPU, the
    prompt's full block they share once: 7 + 2 x 3 = 13), every block free; with no swap space
    left it restarts for recompute as one sequence."""
    s = core
    c = s.count
    lifecycle.add_arrival(s, A)
    schedule(s)
    complete_step(s, 1.0)
    assert schedule(s) == 24
    assert c[state.STEP_DECODE_SEQS] == 3 and c[state.STEP_COPIED_BLOCKS] == 2
    complete_step(s, 2.0)
    assert s.itl_hist.sum() == 3 and c[state.ITL_COUNT] == 3
    assert s.num_generated[A] == 2
    no_swap_space = copy.deepcopy(s)
    no_swap_space.config[state.SWAP_CAPACITY_TOKENS] = 0
    for core, status, seqs in ((s, state.SWAPPED, 3), (no_swap_space, state.WAITING, 1)):
        c = core.count
        interpreted(lifecycle.preempt)(core, c[state.NUM_RUNNING] - 1, core.config[state.FAMILY_TRAITS])
        assert core.status[A] == status and core.num_seqs[A] == seqs
        assert c[state.NUM_RUNNING_SEQS] == 0 and c[state.DECODE_SET_SIZE] == 0
        assert c[state.NUM_FREE_BLOCK_IDS] == 6 and c[state.NUM_FREES] == 3
    assert s.count[state.SWAP_USED_TOKENS] == 13 and s.count[state.NUM_SWAP_FALLBACKS] == 0
    assert no_swap_space.prompt_target[A] == 8 and no_swap_space.count[state.NUM_SWAP_FALLBACKS] == 1
