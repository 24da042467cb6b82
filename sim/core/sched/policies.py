"""The scheduling policies' interface: where a request joins the waiting queue (and its holding
part: ``lifecycle.hold_waiting``) and which running request a preemption takes, as the run's
``config[SCHEDULING_POLICY]`` chose.

A policy is one file of the core implementing the three functions below, each given to
``@njit(implements=policies.chosen_<name>)`` with the parameters and result declared here
(``policy_priority.py``, ``policy_sjf.py``), and naming its waiting order's key
(``order_key(s)``: a request array, the queue ordered by (key, arrival, row): :func:`position_by`,
which ``--check`` verifies, ``check.py``); and one line in ``sim.systems.SCHEDULING_POLICIES``
naming its file. Compiled code calls a policy's function
through its interface's slot (``jit.njit``'s ``chosen``): no loop names a policy, and each
policy's functions are compiled apart, keyed by its own file (``jit.lazy_only``), so that
adding or editing one recompiles its entries alone. FCFS, every run's default and the first of
the registry, is inlined into every loop (``policy_fcfs.py``): its calls cost nothing.
"""

from __future__ import annotations

import functools
import importlib

from pagesim.sim.core.sched import policy_fcfs
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import POLICY_FCFS, SCHEDULING_POLICY, WAITING_HEAD


@njit(inline=True)
def chosen_elsewhere(config):
    """Whether the run's policy is not FCFS: its functions are called through the interfaces."""
    return config[SCHEDULING_POLICY] != POLICY_FCFS


@functools.cache
def policy_module(code: int):
    """The file of the policy of ``code`` (``config[SCHEDULING_POLICY]``: its place in the
    registry, ``sim.systems.SCHEDULING_POLICIES``), imported."""
    from pagesim.sim.systems import SCHEDULING_POLICIES

    return importlib.import_module(f"{__package__}.{list(SCHEDULING_POLICIES.values())[code].file}")


def implementation(interface, config):
    """The function of the run's policy that implements ``interface`` (``chosen_<name>``: its
    ``<name>``), the plain one (``jit.njit``'s ``chosen``)."""
    fn = getattr(policy_module(int(config[SCHEDULING_POLICY])), interface.__name__.removeprefix("chosen_"))
    return getattr(fn, "py_func", fn)


@njit(lazy=chosen_elsewhere, chosen=implementation)
def chosen_waiting_position(s, i: int, returning: bool) -> int:
    """Where request ``i`` joins the waiting queue (``returning``: from a preemption)."""
    return implementation(chosen_waiting_position, s.config)(s, i, returning)


@njit(lazy=chosen_elsewhere, chosen=implementation)
def chosen_holding_position(s, i: int) -> int:
    """Where request ``i`` joins the waiting queue's holding part (``lifecycle.hold_waiting``)."""
    return implementation(chosen_holding_position, s.config)(s, i)


@njit(lazy=chosen_elsewhere, chosen=implementation)
def chosen_victim(s) -> int:
    """The running list's position of the request a preemption takes."""
    return implementation(chosen_victim, s.config)(s)


@njit(inline=True)
def waiting_position(s, i, returning):
    if chosen_elsewhere(s.config):
        return chosen_waiting_position(s, i, returning)
    return policy_fcfs.waiting_position(s, i, returning)


@njit(inline=True)
def holding_position(s, i):
    if chosen_elsewhere(s.config):
        return chosen_holding_position(s, i)
    return policy_fcfs.holding_position(s, i)


# per preemption: a call, not inlined (sim/core/events/loop.py's docstring, "Compiled per family")
@njit
def victim(s):
    if chosen_elsewhere(s.config):
        return chosen_victim(s)
    return policy_fcfs.victim(s)


@njit(inline=True)
def arrival_ordered(s):
    """Whether the waiting queue is in arrival order (a preempted request arrived before
    everyone still waiting): FCFS's is; no other policy's is said to be."""
    return not chosen_elsewhere(s.config)


# -- a waiting queue ordered by a key (a policy's order_key) ----------------------------------
@njit(inline=True)
def served_before(s, key, a, b):
    """Whether request ``a`` comes before request ``b`` in a queue ordered by (``key``, arrival,
    row): the row as vLLM's last tie-break, the request id (``Request.__lt__``,
    ``vllm/v1/request.py:357-367``; ids ``r000001``.. in trace order)."""
    if key[a] != key[b]:
        return key[a] < key[b]
    if s.arrival_s[a] != s.arrival_s[b]:
        return s.arrival_s[a] < s.arrival_s[b]
    return a < b


@njit(inline=True)
def position_by(s, key, i, end):
    """Where request ``i`` goes among the waiting queue's first ``end`` places ordered by
    (``key``, arrival, row): after every one served before it, found from the back, where a new
    arrival usually belongs (a heap's push, ``request_queue.py``'s priority queue: no place is
    kept for a request that returns from a preemption)."""
    n = len(s.waiting)
    p = end
    while p > 0 and served_before(s, key, i, s.waiting[(s.count[WAITING_HEAD] + p - 1) % n]):
        p -= 1
    return p
