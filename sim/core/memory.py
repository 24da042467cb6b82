"""The manager the config names (``config[MANAGER_KIND]``): the scheduler's memory verbs go to
the paged manager (``kv_cache.py``) or the contiguous one (``extent.py``). One branch on a
read-only flag per call: the scheduler is written once for both."""

from __future__ import annotations

from pagesim.sim.core import extent, kv_cache, radix_cache
from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import CONTIGUOUS, MANAGER_KIND, RADIX


@njit(inline=True)
def can_allocate(s, i, num_tokens):
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        return extent.can_allocate(s, i, num_tokens)
    return kv_cache.can_allocate(s, i, num_tokens)


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed):
    """Returns the tokens a prefix-cache hit already holds (0 for a contiguous extent)."""
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        extent.allocate(s, i, num_tokens, num_computed)
        return 0
    return kv_cache.allocate(s, i, num_tokens, num_computed)


@njit(inline=True)
def take_decode_slot(s, i):
    """Room for request ``i``'s next decode token (a contiguous extent has it already: an
    outgrown predicted reservation was re-reserved before the step, ``extent.rereserve_overflowing``)."""
    if s.config[MANAGER_KIND] != CONTIGUOUS:
        kv_cache.take_decode_slot(s, i)


@njit(inline=True)
def joined_decode(s, i):
    """Request ``i`` joined the decode set: a contiguous extent notes when (its re-reservations
    go in that order); nothing for the others."""
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        extent.joined(s, i)


@njit(inline=True)
def free(s, i):
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        extent.free(s, i)
    elif s.config[MANAGER_KIND] == RADIX:  # --system sglang: a finished request's tokens go into the tree
        radix_cache.cache_finished_req(s, i)
    else:
        kv_cache.free(s, i)


@njit(inline=True)
def memory_categories(s, demand_waiting, out):
    """The six categories into ``out``; returns the blocks in use (paged)."""
    if s.config[MANAGER_KIND] == CONTIGUOUS:
        return extent.memory_categories(s, demand_waiting, out)
    if s.config[MANAGER_KIND] == RADIX:
        return radix_cache.memory_categories(s, demand_waiting, out)
    return kv_cache.memory_categories(s, demand_waiting, out)
