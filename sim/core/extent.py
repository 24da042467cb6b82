"""The contiguous (Orca) manager over the core's arrays: one extent per request, sized at
admission by the reservation policy and placed by ``placement.py`` (``sim/memory/contiguous.py``
and ``_extent.py`` are the Python statement of the same rules).

Reservation R (P the tokens to hold at admission, F = max(final length, P), O = max(F - P, 1),
M = max_seq_len), at most M and at least 1::

    max     R = M
    pow2    R = P + next_pow2(O)          O = 25 -> 32
    oracle  R = F

The extent is reserved whole at admission, so a request never runs out while decoding
(L, its computed tokens, stays below F <= R) and the scheduler never preempts for it.
Accounting, per request (``_extent.py``'s diagram)::

    [ L token states | min(R, F) - L reservation | R - min(R, F) internal frag | A - R slack ]

kept as running sums: ``COMPUTED_SLOTS`` (L), ``DEMAND_SLOTS`` (min(R, F)), ``RESERVED_SLOTS``
(R), ``PLACED_SLOTS`` (A); the free ``capacity - sum(A)`` are external fragmentation while a
request waits for memory, else free.
"""

from __future__ import annotations

from pagesim.sim.core import placement
from pagesim.sim.core.jit import njit
from pagesim.sim.core.kv_cache import ALLOCATE_LATER, CAN_ALLOCATE, NEVER_FITS
from pagesim.sim.core.state import (CAPACITY, COMPUTED_SLOTS, DEMAND_SLOTS, EXTENT_PLACED, EXTENT_RESERVED,
                            EXTENT_START, LARGEST_EXTENT, MAX_SEQ_LEN, NUM_ALLOCATIONS, NUM_FREES,
                            PLACED_SLOTS, RESERVATION_KIND, RESERVE_MAX, RESERVE_POW2, RESERVED_SLOTS)


@njit(inline=True)
def request_size(s, i, num_tokens):
    """R for request ``i`` admitted with ``num_tokens`` to hold (its prompt, or prompt and
    generated tokens after a recompute)."""
    m = s.config[MAX_SEQ_LEN]
    final = max(s.final_len[i], num_tokens)
    output = max(final - num_tokens, 1)
    kind = s.config[RESERVATION_KIND]
    if kind == RESERVE_MAX:
        r = m
    elif kind == RESERVE_POW2:
        r = num_tokens + placement.next_pow2(output)
    else:  # oracle
        r = final
    return max(1, min(r, m))


@njit(inline=True)
def can_allocate(s, i, num_tokens):
    """Whether request ``i``'s extent fits now, later, or never (longer than max_seq_len, or
    placed larger than the largest extent the empty pool has)."""
    if s.final_len[i] > s.config[MAX_SEQ_LEN] or num_tokens > s.config[MAX_SEQ_LEN]:
        return NEVER_FITS
    r = request_size(s, i, num_tokens)
    if placement.placed_size(s, r) > s.config[LARGEST_EXTENT]:
        return NEVER_FITS
    return CAN_ALLOCATE if placement.can_place(s, r) else ALLOCATE_LATER


@njit(inline=True)
def allocate(s, i, num_tokens, num_computed):
    """Reserve and place request ``i``'s extent; ``num_computed`` of its tokens already hold K/V."""
    r = request_size(s, i, num_tokens)
    a = placement.placed_size(s, r)
    s.extent[i, EXTENT_START] = placement.place(s, r)
    s.extent[i, EXTENT_RESERVED] = r
    s.extent[i, EXTENT_PLACED] = a
    s.num_computed_tokens[i] = num_computed
    c = s.count
    c[COMPUTED_SLOTS] += num_computed
    c[DEMAND_SLOTS] += min(r, s.final_len[i])
    c[RESERVED_SLOTS] += r
    c[PLACED_SLOTS] += a
    c[NUM_ALLOCATIONS] += 1


@njit(inline=True)
def free(s, i):
    r, a = s.extent[i, EXTENT_RESERVED], s.extent[i, EXTENT_PLACED]
    placement.release(s, s.extent[i, EXTENT_START], a)
    c = s.count
    c[COMPUTED_SLOTS] -= s.num_computed_tokens[i]
    c[DEMAND_SLOTS] -= min(r, s.final_len[i])
    c[RESERVED_SLOTS] -= r
    c[PLACED_SLOTS] -= a
    s.num_computed_tokens[i] = 0
    s.extent[i, EXTENT_START] = -1
    s.extent[i, EXTENT_RESERVED] = 0
    s.extent[i, EXTENT_PLACED] = 0
    c[NUM_FREES] += 1


@njit(inline=True)
def memory_categories(s, demand_waiting, out):
    """The six categories (sim/memory/base.py), in order; they sum to the capacity."""
    c = s.count
    free_slots = s.config[CAPACITY] - c[PLACED_SLOTS]
    out[0] = c[COMPUTED_SLOTS]
    out[1] = c[DEMAND_SLOTS] - c[COMPUTED_SLOTS]
    out[2] = c[RESERVED_SLOTS] - c[DEMAND_SLOTS]
    out[3] = c[PLACED_SLOTS] - c[RESERVED_SLOTS]
    out[4] = free_slots if demand_waiting else 0
    out[5] = 0 if demand_waiting else free_slots
    return 0  # no blocks: the step table has no block columns for this manager
