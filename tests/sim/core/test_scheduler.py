"""The core's scheduler rules worked by hand (sim/core/sched/scheduler_vllm.py), calling its functions
directly on the core's state before a run (sim.run.initial_state)."""

from __future__ import annotations

import pandas as pd
import pytest
from pagesim.sim.core import state
from pagesim.sim.core.sched import lifecycle, scheduler_vllm
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.run import initial_state

from tests.sim.helpers import cfg_for, schedule_vllm

schedule = schedule_vllm  # the scheduler's steps run by CPython (tests/sim/helpers.py)



def complete_step(s, now):
    """The step's end, by the loop's function for the state's family (sim/core/kv/memory.py)."""
    interpreted(lifecycle.complete_step)(s, now, s.config[state.FAMILY_TRAITS])


def core_for(n, **kw):
    trace = pd.DataFrame({"request_id": [f"r{i}" for i in range(n)], "arrival_s": [0.0] * n,
                          "prompt_tokens": [8] * n, "output_tokens": [10] * n})
    return initial_state(cfg_for(**kw), trace)


@pytest.mark.parametrize("chunked", [False, True])
def test_waiting_served_ratio_holds_admission_until_the_queue_grows(chunked):
    """ratio 1.0: two requests admitted (nothing ran); a third waits (1 waiting / 2 running
    = 0.5) and the step decodes; with a fourth, 2 / 2 reaches 1.0 and both are admitted
    (prefill-first, or chunked with a budget that holds them)."""
    s = core_for(4, waiting_served_ratio=1.0, chunked_prefill=chunked, chunk_budget=128)
    c = s.count
    lifecycle.add_arrival(s, 0)
    lifecycle.add_arrival(s, 1)
    schedule(s)
    assert c[state.STEP_PREFILL_SEQS] == 2 and c[state.NUM_RUNNING] == 2
    complete_step(s, 1.0)
    lifecycle.add_arrival(s, 2)
    schedule(s)
    assert c[state.STEP_PREFILL_SEQS] == 0 and c[state.STEP_DECODE_SEQS] == 2
    assert c[state.WAITING_LEN] == 1 and s.status[2] == state.WAITING
    complete_step(s, 2.0)
    lifecycle.add_arrival(s, 3)
    schedule(s)
    assert c[state.STEP_PREFILL_SEQS] == 2 and c[state.NUM_RUNNING] == 4 and c[state.WAITING_LEN] == 0


def test_without_a_ratio_a_waiting_request_is_admitted_at_once():
    s = core_for(3)
    c = s.count
    lifecycle.add_arrival(s, 0)
    lifecycle.add_arrival(s, 1)
    schedule(s)
    complete_step(s, 1.0)
    lifecycle.add_arrival(s, 2)
    schedule(s)
    assert c[state.STEP_PREFILL_SEQS] == 1 and c[state.NUM_RUNNING] == 3


def test_the_decode_pass_sorts_the_running_list_by_arrival_before_it_picks_a_victim():
    """A (arrives at 0) and B (at 1), prompts of 4, blocks of 4, a pool of 2 blocks: both prefill
    into a block each. The running list then [B, A], as it is after B came back from swap and
    A, recomputed, was admitted again behind it. Decoding, each crosses into a second block, none
    is free: vLLM 0.4.2 sorts the running list by arrival (scheduler.py:409) and preempts its last
    (:430), B; A decodes into B's block."""
    trace = pd.DataFrame({"request_id": ["A", "B"], "arrival_s": [0.0, 1.0], "prompt_tokens": [4, 4],
                          "output_tokens": [3, 3]})
    s = initial_state(cfg_for(slots=8, block_size=4, max_seq_len=8, watermark=0.0), trace)
    c = s.count
    lifecycle.add_arrival(s, 0)
    lifecycle.add_arrival(s, 1)
    schedule(s)
    complete_step(s, 1.0)
    assert s.running[:2].tolist() == [0, 1] and not c[scheduler_vllm.RUNNING_UNSORTED]
    rejoin(s, [1, 0])
    assert c[scheduler_vllm.RUNNING_UNSORTED] == 1  # A joined behind a later arrival
    schedule(s)
    assert s.status[1] == state.WAITING and s.num_preemptions[1] == 1
    assert c[state.NUM_RUNNING] == 1 and s.running[0] == 0 and s.num_computed_tokens[0] == 5
    assert not c[scheduler_vllm.RUNNING_UNSORTED]


def rejoin(s, order):
    """The running requests join the running list again in ``order`` (scheduler_vllm.join_running)."""
    c = s.count
    c[state.NUM_RUNNING] = c[state.NUM_RUNNING_SEQS] = 0
    for i in order:
        interpreted(scheduler_vllm.join_running)(s, i)


def test_the_running_list_is_marked_when_a_request_joins_behind_a_later_arrival_and_sorted_once():
    """A (0), B (1), C (2) prefill, then rejoin the running list as [A, C, B]: B joins behind C,
    which arrived later, and marks it; [A, B, C] is not marked. The decode pass reads a marked
    list, sorts it ([A, B, C]) and clears the mark; an unmarked list is taken as it is, unread
    (here [C, B, A] set by hand stays so: the mark is what says the list may be out of order)."""
    s = core_for(3)
    c = s.count
    for i in range(3):
        lifecycle.add_arrival(s, i)
    s.arrival_s[:3] = [0.0, 1.0, 2.0]
    schedule(s)
    complete_step(s, 1.0)
    rejoin(s, [0, 1, 2])
    assert not c[scheduler_vllm.RUNNING_UNSORTED]
    rejoin(s, [0, 2, 1])
    assert c[scheduler_vllm.RUNNING_UNSORTED] == 1
    schedule(s)
    assert s.running[:3].tolist() == [0, 1, 2] and not c[scheduler_vllm.RUNNING_UNSORTED]
    s.running[:3] = [2, 1, 0]
    complete_step(s, 2.0)
    schedule(s)
    assert s.running[:3].tolist() == [2, 1, 0]
