"""The core's scheduler rules worked by hand (sim/core/scheduler_vllm.py), calling its functions
directly on the core's state before a run (sim.run.initial_state)."""

from __future__ import annotations

import pandas as pd
import pytest
from pagesim.sim.core import lifecycle, state
from pagesim.sim.core.jit import interpreted
from pagesim.sim.run import initial_state

from tests.sim.helpers import cfg_for, schedule_vllm

schedule = schedule_vllm  # the scheduler's steps run by CPython (tests/sim/helpers.py)



def complete_step(s, now):
    """The step's end, by the loop's function for the state's family (sim/core/memory.py)."""
    interpreted(lifecycle.complete_step)(s, now, s.config[state.SCHEDULER_KIND])


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
