"""The manager the config names (``config[MANAGER_KIND]``): the scheduler's memory verbs go to
the paged manager (``kv_cache.py``) or the contiguous one (``extent.py``). One branch on a
read-only flag per call: the scheduler is written once for both.

The verbs the families share (a request's end, a preemption, the memory categories: the callers
in ``lifecycle.py`` and ``loop.py``) also take ``family``, the loop's scheduler family: a
constant in each family's loop, so numba drops the managers that family never runs before it
compiles them (SGLang's radix cache is SGLang's alone; static batching and vLLM v0's scheduler
over contiguous extents, Orca's, run the contiguous manager, vLLM v1 and vLLM v0's scheduler over
paged memory the paged one): each test is written out, ``family == STATIC or family ==
CONTINUOUS_CONTIGUOUS``, as numba prunes a branch by a constant it sees in the condition, not
through a function's returned value. Called from Python, ``family`` is ``config[SCHEDULER_KIND]``;
``sim/core/build.py`` sets both, and checks them against :data:`MANAGERS`."""

from __future__ import annotations

from pagesim.sim.core.kv import extent, kv_cache, radix_cache
from pagesim.sim.core.sched import speculative
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import (CONTINUOUS, CONTINUOUS_CONTIGUOUS, CONTIGUOUS, MANAGER_KIND, PAGED, RADIX,
                                    SCHEDULER_KIND, SGLANG, STATIC, V1)

#: the managers each scheduler family runs: what the ``family`` tests below assume
MANAGERS = {CONTINUOUS: (PAGED,), CONTINUOUS_CONTIGUOUS: (CONTIGUOUS,), STATIC: (CONTIGUOUS,), V1: (PAGED,),
            SGLANG: (RADIX,)}


def check_family(config) -> None:
    """A state's manager is one its family runs (:data:`MANAGERS`): else the family's loop
    would have compiled it out."""
    family, manager = int(config[SCHEDULER_KIND]), int(config[MANAGER_KIND])
    if manager not in MANAGERS[family]:
        raise ValueError(f"scheduler family {family} does not run manager {manager} "
                         "(sim/core/kv/memory.py MANAGERS)")


@njit(inline=True)
def can_allocate(s, i, num_tokens, family):
    if family == CONTINUOUS_CONTIGUOUS:
        return extent.can_allocate(s, i, num_tokens)
    return kv_cache.can_allocate(s, i, num_tokens)


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed, family):
    """Returns the tokens a prefix-cache hit already holds (0 for a contiguous extent)."""
    if family == CONTINUOUS_CONTIGUOUS:
        extent.allocate(s, i, num_tokens, num_computed)
        return 0
    return kv_cache.allocate(s, i, num_tokens, num_computed)


@njit(inline=True)
def take_decode_slot(s, i, family):
    """Room for request ``i``'s next decode token (a contiguous extent has it already: an
    outgrown predicted reservation was re-reserved before the step, ``extent.rereserve_overflowing``)."""
    if family != CONTINUOUS_CONTIGUOUS:
        kv_cache.take_decode_slot(s, i)


@njit(inline=True)
def joined_decode(s, i, family):
    """Request ``i`` joined the decode set: a contiguous extent notes when (its re-reservations
    go in that order); SGLang puts the prompt it computed into the tree and holds it there
    (``checkpoint_kv_cache`` after its prefill batch, batch_result_processor.py:393-394,
    mem_cache/common.py:271-280); nothing for the others."""
    if family == SGLANG:
        radix_cache.cache_unfinished_req(s, i)
    elif family == STATIC or family == CONTINUOUS_CONTIGUOUS:
        extent.joined(s, i)


@njit(inline=True)
def free(s, i, family):
    if family == SGLANG:  # a finished request's tokens go into the radix tree
        radix_cache.cache_finished_req(s, i)
    elif family == STATIC or family == CONTINUOUS_CONTIGUOUS:
        extent.free(s, i)
    else:
        if family == V1 and speculative.speculating(s.config):  # its speculative slack goes with its blocks
            speculative.clear(s, i)
        if family == V1 and kv_cache.grouped(s):  # vLLM v1's KV cache groups, each its blocks
            kv_cache.free_groups(s, i)
        else:
            kv_cache.free(s, i)


@njit(inline=True)
def memory_categories(s, demand_waiting, out, family):
    """The seven categories into ``out``; returns the blocks in use (paged)."""
    if family == SGLANG:
        return radix_cache.memory_categories(s, demand_waiting, out)
    if family == STATIC or family == CONTINUOUS_CONTIGUOUS:
        return extent.memory_categories(s, demand_waiting, out)
    used = kv_cache.memory_categories(s, demand_waiting, out)
    if family == V1 and speculative.speculating(s.config):  # the speculative slack, its own
        speculative.split_categories(s, out)
    return used
