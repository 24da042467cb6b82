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

Compiled code reaches this file only through its lazy functions' entries (``jit.LAZY_ONLY``):
an edit recompiles those alone, not every family's loop."""

from __future__ import annotations

from pagesim.sim.core.jit import njit
from pagesim.sim.core.policy_choice import priority_chosen
from pagesim.sim.core.state import KV_HOLDING_WAITING, NUM_RUNNING, WAITING_HEAD, WAITING_LEN


@njit(inline=True)
def served_before(s, a, b):
    """Whether request ``a`` comes before request ``b`` in the waiting queue."""
    if s.priority[a] != s.priority[b]:
        return s.priority[a] < s.priority[b]
    if s.arrival_s[a] != s.arrival_s[b]:
        return s.arrival_s[a] < s.arrival_s[b]
    return a < b


# priority scheduling's (per arrival): a call, not inlined (sim/core/loop.py's docstring, "Compiled per family")
@njit(lazy=priority_chosen)
def waiting_position(s, i: int, returning: bool) -> int:
    """After every waiting request served before ``i`` (``returning`` changes nothing): found
    from the back, where a new arrival of the usual priority belongs."""
    return position_before(s, i, s.count[WAITING_LEN])


@njit(lazy=priority_chosen)
def holding_position(s, i: int) -> int:
    """Where request ``i`` joins the waiting queue's holding part (``lifecycle.hold_waiting``):
    by the same key, among those there (``kv_holding_waiting`` is a priority queue too)."""
    return position_before(s, i, s.count[KV_HOLDING_WAITING])


@njit(inline=True)
def position_before(s, i, end):
    """The position of the queue's first ``end`` places after every one served before ``i``."""
    c, n = s.count, len(s.waiting)
    p = end
    while p > 0 and served_before(s, i, s.waiting[(c[WAITING_HEAD] + p - 1) % n]):
        p -= 1
    return p


# per preemption under priority: a call (as every policy's victim, ``policies.victim``)
@njit(lazy=priority_chosen)
def victim(s) -> int:
    """The running list's position of the request to preempt: the largest (priority, arrival)."""
    worst = 0
    for k in range(1, s.count[NUM_RUNNING]):
        i, j = s.running[k], s.running[worst]
        if s.priority[i] > s.priority[j] or (s.priority[i] == s.priority[j] and s.arrival_s[i] > s.arrival_s[j]):
            worst = k
    return worst
