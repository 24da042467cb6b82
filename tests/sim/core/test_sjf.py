"""Shortest prompt first (``--system vllm-v1 --scheduling-policy sjf``: sim/core/sched/policy_sjf.py),
pinned by tiny runs worked out by hand, each beside what FCFS does with the same trace, so that
a test fails if the policy's rule falls back to FCFS's. Pools of blocks of 4 slots (OPT-13B),
every iteration checked (``--check`` verifies the waiting queue's order by the policy's key).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.sim.core import state
from pagesim.sim.core.compile import jit
from pagesim.sim.core.sched import policies, policy_sjf
from pagesim.sim.run import initial_state, run_simulation

from tests.sim.core.test_priority import v1


def trace(*rows) -> pd.DataFrame:
    """rows: (arrival_s, prompt_tokens, output_tokens)."""
    arrival, prompt, output = zip(*rows)
    return pd.DataFrame({"request_id": [f"r{i}" for i in range(len(rows))], "arrival_s": [float(a) for a in arrival],
                         "prompt_tokens": list(prompt), "output_tokens": list(output)})


def first_token_order(result) -> list[int]:
    return list(np.argsort(result.requests["first_token_s"].to_numpy(), kind="stable"))


def test_waiting_requests_are_served_shortest_prompt_first_then_by_arrival():
    """A (prompt 12), B (4), C (8) and D (4) arrive together, outputs 1, a budget of 12 tokens
    a step. By (prompt, arrival, row): B and D (8 tokens) then C's first 4 (a chunk) in step 0,
    C's last 4 in step 1, then A: first tokens B, D, C, A. (FCFS: A alone fills step 0; B and
    C step 1; D step 2.)"""
    rows = ((0, 12, 1), (0, 4, 1), (0, 8, 1), (0, 4, 1))
    sjf = run_simulation(v1(64, "sjf", max_num_batched_tokens=12), trace(*rows))
    assert first_token_order(sjf) == [1, 3, 2, 0]
    fcfs = run_simulation(v1(64, "fcfs", max_num_batched_tokens=12), trace(*rows))
    assert first_token_order(fcfs) == [0, 1, 2, 3]


def test_an_arrival_goes_behind_the_shorter_and_before_the_longer():
    """Request 0 (prompt 8, output 3) runs alone (one sequence a step); 1 (prompt 8), 2 (prompt 12)
    and 3 (prompt 4) arrive during its run, in that order. The queue by (prompt, arrival): 3, 1,
    2, so 3 is served first though it arrived last (FCFS: 1, 2, 3)."""
    rows = ((0, 8, 3), (0.001, 8, 1), (0.002, 12, 1), (0.003, 4, 1))
    sjf = run_simulation(v1(64, "sjf", max_num_seqs=1), trace(*rows))
    assert first_token_order(sjf) == [0, 3, 1, 2]
    fcfs = run_simulation(v1(64, "fcfs", max_num_seqs=1), trace(*rows))
    assert first_token_order(fcfs) == [0, 1, 2, 3]


def test_the_queue_by_hand_positions_and_victim():
    """The policy's functions on a state set by hand: waiting queue [1 (prompt 4), 2 (prompt 8)]
    with request 0 (prompt 8, arrived first) joining: after 1 and before 2 (same prompt,
    earlier arrival); request 3 (prompt 8, arrived last) joins after 2; a preempted request
    rejoins by the same key (``returning`` changes nothing; FCFS: the front). The victim is the
    running list's last (vLLM v1's ``self.running.pop()`` for every policy but priority)."""
    s = initial_state(v1(64, "sjf"), trace((0, 8, 1), (1, 4, 1), (2, 8, 1), (3, 8, 1)))
    s.waiting[:2] = [1, 2]
    s.count[state.WAITING_HEAD], s.count[state.WAITING_LEN] = 0, 2
    position = jit.interpreted(policy_sjf.waiting_position)
    assert position(s, 0, False) == 1 and position(s, 0, True) == 1
    assert position(s, 3, False) == 2
    assert jit.interpreted(policies.waiting_position)(s, 0, True) == 1  # through the interface
    s.config[state.SCHEDULING_POLICY] = state.POLICY_FCFS
    assert jit.interpreted(policies.waiting_position)(s, 0, True) == 0
    s.running[:3] = [2, 0, 1]
    s.count[state.NUM_RUNNING] = 3
    assert jit.interpreted(policy_sjf.victim)(s) == 2


def test_a_preempted_request_rejoins_by_its_prompt_not_at_the_front():
    """4 blocks of 4 slots. A (prompt 4, output 12) arrives first, alone, then B (prompt 8,
    output 2) and C (prompt 4, output 2) while A runs. SJF admits C before B. When memory runs
    out a preemption takes the latest admitted; the preempted request waits by its prompt, so
    every request finishes and --check (which verifies the queue's order after every step)
    passes; the run's order differs from FCFS's."""
    rows = ((0, 4, 12), (0.001, 8, 2), (0.002, 4, 2))
    sjf = run_simulation(v1(16, "sjf"), trace(*rows))
    fcfs = run_simulation(v1(16, "fcfs"), trace(*rows))
    assert (sjf.requests["status"] == "finished").all() and (fcfs.requests["status"] == "finished").all()
    assert first_token_order(sjf) == [0, 2, 1] and first_token_order(fcfs) == [0, 1, 2]


def test_check_refuses_a_queue_out_of_the_policys_order():
    """--check verifies the waiting queue by the run's policy's key (policy_sjf.order_key): a
    queue put out of order by hand is refused, naming the policy."""
    from pagesim.sim.core import check

    s = initial_state(v1(64, "sjf"), trace((0, 8, 1), (0, 4, 1)))
    s.waiting[:2] = [0, 1]  # 8 before 4: out of order
    s.count[state.WAITING_HEAD], s.count[state.WAITING_LEN] = 0, 2
    s.status[:2] = state.WAITING
    mine = np.ones(len(s.status), bool)
    with pytest.raises(AssertionError, match="policy_sjf's order"):
        check.check_queues(s, mine)
    s.waiting[:2] = [1, 0]
    check.check_queues(s, mine)


def test_the_cli_takes_sjf_for_vllm_v1(capsys):
    assert main(["simulate", "--workload", "sharegpt", "--rate", "50", "--num-requests", "40", "--system", "vllm-v1",
                 "--scheduling-policy", "sjf", "--kv-gib", "2", "--no-progress", "--json", "--check"]) == 0


def test_a_trace_with_priorities_is_said_to_be_served_by_the_policy_whatever_their_priority():
    """The run says which order it serves a trace's priorities by: sjf's, not FCFS's (the policies
    that read the column: sim.systems.Policy.orders_by)."""
    from pagesim.sim.errors import PagesimWarning

    rows = trace((0, 8, 1), (0, 4, 1)).assign(priority=np.array([1, 0], np.int64))
    with pytest.warns(PagesimWarning, match=r"by --scheduling-policy sjf, whatever their priority \(--system "
                                            r"vllm-v1 --scheduling-policy priority orders them by it\)"):
        run_simulation(v1(64, "sjf"), rows)
