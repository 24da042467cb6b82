"""First come, first served (vLLM's ``--scheduling-policy fcfs``, its default; vLLM v0's only
policy; Orca's): requests wait in arrival order, a preempted one goes back to the front
(vLLM 0.33.0 ``FCFSRequestQueue.prepend_request``, ``vllm/v1/core/sched/request_queue.py:92``;
vLLM 0.4.2 ``self.waiting.extendleft(running_scheduled.preempted)``, ``vllm/core/scheduler.py:773``),
and the victim of a preemption is the latest admitted (v1: ``self.running.pop()``,
``vllm/v1/core/sched/scheduler.py:970``; v0: ``running_queue.pop()``, ``vllm/core/scheduler.py:430``;
nano-vllm: ``self.running.pop()``)."""

from __future__ import annotations

from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import KV_HOLDING_WAITING, NUM_RUNNING, WAITING_LEN


@njit(inline=True)
def waiting_position(s, i, returning):
    """Where request ``i`` joins the waiting queue: the front when it comes back from a
    preemption (it arrived before everyone waiting), else the back."""
    return 0 if returning else s.count[WAITING_LEN]


@njit(inline=True)
def holding_position(s, i):
    """Where request ``i`` joins the waiting queue's holding part (``lifecycle.hold_waiting``):
    behind those there before it."""
    return s.count[KV_HOLDING_WAITING]


@njit(inline=True)
def victim(s):
    """The running list's position of the request to preempt: the latest admitted."""
    return s.count[NUM_RUNNING] - 1
