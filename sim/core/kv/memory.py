"""The manager the config names (``config[MANAGER_KIND]``): the scheduler's memory verbs go to
the paged manager (``kv_cache.py``), the contiguous one (``extent.py``) or SGLang's token pool
under its radix tree (``radix_cache.py``). The scheduler is written once for each.

Each verb takes ``traits``, what the caller's scheduler family does (``sim/core/compile/families.py``
``TRAITS``): a constant in each family's code, so numba drops the managers and features that family
never runs before it compiles them (SGLang's radix cache is SGLang's alone; static batching and
vLLM v0's scheduler over contiguous extents, Orca's, run the contiguous manager, vLLM v1 and vLLM
v0's scheduler over paged memory the paged one). Each test is written out on ``traits``
(``traits & EXTENTS``), as numba prunes a branch by an operation of constants it sees in the
condition, not through a function's returned value. Called from Python, ``traits`` is
``config[FAMILY_TRAITS]``; ``sim/core/build.py`` sets it and the manager, and checks them against
:data:`MANAGERS`."""

from __future__ import annotations

from pagesim.sim.core.kv import extent, kv_cache, prefix_cache, radix_cache
from pagesim.sim.core.sched import speculative
from pagesim.sim.core.compile.families import (BLOCK_TABLE, EXTENTS, KV_GROUPS, RADIX_TREE,
                                               SPECULATES, TRAITS)
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import CONTIGUOUS, FAMILY_TRAITS, MANAGER_KIND, PAGED, PREFIX_CACHING, RADIX

#: the managers a family of each manager trait runs: what the ``traits`` tests below assume
MANAGERS = {BLOCK_TABLE: (PAGED,), EXTENTS: (CONTIGUOUS,), RADIX_TREE: (RADIX,)}


def check_family(config) -> None:
    """A state's manager is one its family runs (:data:`MANAGERS`, by the family's one manager
    trait): else the family's loop would have compiled it out."""
    traits, manager = int(config[FAMILY_TRAITS]), int(config[MANAGER_KIND])
    if traits not in TRAITS.values():
        raise ValueError(f"traits {traits} are no scheduler family's (sim/core/compile/families.py TRAITS)")
    kinds = [kind for trait, kinds in MANAGERS.items() if traits & trait for kind in kinds]
    if manager not in kinds:
        raise ValueError(f"a scheduler family of traits {traits} does not run manager {manager} "
                         "(sim/core/kv/memory.py MANAGERS)")


@njit(inline=True)
def can_allocate(s, i, num_tokens, traits):
    if traits & EXTENTS:
        return extent.can_allocate(s, i, num_tokens)
    return kv_cache.can_allocate(s, i, num_tokens)


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed, traits):
    """Returns the tokens a prefix-cache hit already holds (0 for a contiguous extent)."""
    if traits & EXTENTS:
        extent.allocate(s, i, num_tokens, num_computed)
        return 0
    return kv_cache.allocate(s, i, num_tokens, num_computed)


@njit(inline=True)
def take_decode_slot(s, i, traits):
    """Room for request ``i``'s next decode token (a contiguous extent has it already: an
    outgrown predicted reservation was re-reserved before the step, ``extent.rereserve_overflowing``)."""
    if traits & BLOCK_TABLE:
        kv_cache.take_decode_slot(s, i)


@njit(inline=True)
def joined_decode(s, i, traits):
    """Request ``i`` joined the decode set: a contiguous extent notes when (its re-reservations
    go in that order); SGLang puts the prompt it computed into the tree and holds it there
    (``checkpoint_kv_cache`` after its prefill batch, batch_result_processor.py:393-394,
    mem_cache/common.py:271-280); nothing for the others."""
    if traits & RADIX_TREE:
        radix_cache.cache_unfinished_req(s, i)
    elif traits & EXTENTS:
        extent.joined(s, i)


@njit(inline=True)
def preempted(s, i, traits):
    """Running request ``i`` is preempted, its memory about to go: a paged prefix cache maps the
    keys of its own it held out of the map while it ran (``prefix_cache.publish``)."""
    if traits & BLOCK_TABLE and s.config[PREFIX_CACHING]:
        prefix_cache.publish(s, i)


@njit(inline=True)
def swap_out(s, i, traits):
    """Running request ``i``'s memory goes to the host: a group's sequences keep how they shared
    their blocks, to come back so (``kv_cache.swap_out``); else as :func:`free`."""
    if traits & BLOCK_TABLE and s.num_seqs[i] > 1:
        kv_cache.swap_out(s, i)
    else:
        free(s, i, traits)


@njit(inline=True)
def free(s, i, traits):
    if traits & RADIX_TREE:  # a finished request's tokens go into the radix tree
        radix_cache.cache_finished_req(s, i)
    elif traits & EXTENTS:
        extent.free(s, i)
    else:
        if traits & SPECULATES and speculative.speculating(s.config):  # its speculative slack goes with its blocks
            speculative.clear(s, i)
        if traits & KV_GROUPS and kv_cache.grouped(s):  # vLLM v1's KV cache groups, each its blocks
            kv_cache.free_groups(s, i)
        else:
            kv_cache.free(s, i)


@njit(inline=True)
def memory_categories(s, demand_waiting, out, traits):
    """The seven categories into ``out``; returns the blocks in use (paged)."""
    if traits & RADIX_TREE:
        return radix_cache.memory_categories(s, demand_waiting, out)
    if traits & EXTENTS:
        return extent.memory_categories(s, demand_waiting, out)
    used = kv_cache.memory_categories(s, demand_waiting, out)
    if traits & SPECULATES and speculative.speculating(s.config):  # the speculative slack, its own
        speculative.split_categories(s, out)
    return used
