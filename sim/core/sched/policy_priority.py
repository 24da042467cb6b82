"""Priority scheduling (vLLM's ``--scheduling-policy priority``), as vLLM 0.33.0 has it: requests
wait ordered by (priority, arrival time), a lower priority value first (``Request.__lt__``,
``vllm/v1/request.py:357-367``, ties then by request id: here by trace row, the order of ids
``r000001``..), a preempted request rejoining by the same key (``PriorityRequestQueue``,
``vllm/v1/core/sched/request_queue.py:131-172``: "no concept of prepending"); the victim of a
preemption is the running request with the largest (priority, arrival time), the first of
equals in the running list (``max(self.running, key=lambda r: (r.priority, r.arrival_time))``,
``vllm/v1/core/sched/scheduler.py:932-936``). What the scheduler does around a victim (one
scheduled earlier in the step gives its tokens back; one that preempts itself lets the requests
after it try) is ``scheduler_v1.py``'s.

Compiled code reaches this file only through the entries of its implementations of
``policies.py``'s interface (``jit.lazy_only``): an edit recompiles those alone, not every
family's loop."""

from __future__ import annotations

from pagesim.sim.core.sched import policies
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import KV_HOLDING_WAITING, NUM_RUNNING, WAITING_LEN


def order_key(s):
    """The waiting queue's order: (priority, arrival, row) (``policies.position_by``)."""
    return s.priority


@njit(implements=policies.chosen_waiting_position)
def waiting_position(s, i: int, returning: bool) -> int:
    """After every waiting request served before ``i`` (``returning`` changes nothing)."""
    return policies.position_by(s, s.priority, i, s.count[WAITING_LEN])


@njit(implements=policies.chosen_holding_position)
def holding_position(s, i: int) -> int:
    """Where request ``i`` joins the waiting queue's holding part (``lifecycle.hold_waiting``):
    by the same key, among those there (``kv_holding_waiting`` is a priority queue too)."""
    return policies.position_by(s, s.priority, i, s.count[KV_HOLDING_WAITING])


@njit(implements=policies.chosen_victim)
def victim(s) -> int:
    """The running list's position of the request to preempt: the largest (priority, arrival)."""
    worst = 0
    for k in range(1, s.count[NUM_RUNNING]):
        i, j = s.running[k], s.running[worst]
        if s.priority[i] > s.priority[j] or (s.priority[i] == s.priority[j] and s.arrival_s[i] > s.arrival_s[j]):
            worst = k
    return worst
