"""The scheduling policies, one file each, dispatched on ``config[SCHEDULING_POLICY]``: where a
request joins the waiting queue (and its holding part: ``lifecycle.hold_waiting``) and which
running request a preemption takes. A new policy is a file with these functions and a line in
each below (and its name in ``sim.systems.SCHEDULING_POLICIES``). Priority's functions are
lazy (compiled for the runs that choose it, ``policy_choice.py``) and its file compiled by their
entries alone (``jit.LAZY_ONLY``)."""

from __future__ import annotations

from pagesim.sim.core import policy_fcfs, policy_priority
from pagesim.sim.core.jit import njit
from pagesim.sim.core.policy_choice import priority_chosen


@njit(inline=True)
def waiting_position(s, i, returning):
    if priority_chosen(s.config):
        return policy_priority.waiting_position(s, i, returning)
    return policy_fcfs.waiting_position(s, i, returning)


@njit(inline=True)
def holding_position(s, i):
    if priority_chosen(s.config):
        return policy_priority.holding_position(s, i)
    return policy_fcfs.holding_position(s, i)


# per preemption: a call, not inlined (sim/core/loop.py's docstring, "Compiled per family")
@njit
def victim(s):
    if priority_chosen(s.config):
        return policy_priority.victim(s)
    return policy_fcfs.victim(s)


@njit(inline=True)
def arrival_ordered(s):
    """Whether the waiting queue is in arrival order (a preempted request arrived before
    everyone still waiting): FCFS's is, priority's is not."""
    return not priority_chosen(s.config)
