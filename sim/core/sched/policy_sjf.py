"""Shortest prompt first (``--scheduling-policy sjf``): requests wait ordered by (prompt tokens,
arrival time, row), a preempted request rejoining by the same key; the victim of a preemption
is the latest admitted, as under FCFS (vLLM v1 takes ``self.running.pop()`` for every policy
but priority: ``vllm/v1/core/sched/scheduler.py:970``). vLLM's SJF request queue
(``vllm/v1/core/sched/policy/shortest_job_first.py``, vllm-project/vllm at 2f912b02, in no
release pagesim models) orders by a score of waiting time and prompt length, each through a
sigmoid around a median (5 s, 32,768 tokens), weighted 0.5 each, and re-scores by the wall
clock as it compares; this is that order's limit with the waiting time's weight 0: the prompt's
length alone, the clock out of it, so that a run is the same every time.

Compiled code reaches this file only through the entries of its implementations of
``policies.py``'s interface (``jit.lazy_only``): an edit recompiles those alone."""

from __future__ import annotations

from pagesim.sim.core.sched import policies
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import KV_HOLDING_WAITING, NUM_RUNNING, WAITING_LEN


def order_key(s):
    """The waiting queue's order: (prompt tokens, arrival, row) (``policies.position_by``)."""
    return s.prompt_tokens


@njit(implements=policies.chosen_waiting_position)
def waiting_position(s, i: int, returning: bool) -> int:
    """After every waiting request with a shorter prompt, or as long and sent before ``i``."""
    return policies.position_by(s, s.prompt_tokens, i, s.count[WAITING_LEN])


@njit(implements=policies.chosen_holding_position)
def holding_position(s, i: int) -> int:
    """By the same key among the waiting queue's holding part (``lifecycle.hold_waiting``)."""
    return policies.position_by(s, s.prompt_tokens, i, s.count[KV_HOLDING_WAITING])


@njit(implements=policies.chosen_victim)
def victim(s) -> int:
    """The running list's position of the request to preempt: the latest admitted."""
    return s.count[NUM_RUNNING] - 1
