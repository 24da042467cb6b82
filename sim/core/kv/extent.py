"""The contiguous (Orca) manager over the core's arrays: one extent per request, sized at
admission by the reservation policy and placed by ``placement.py`` (Orca's reservations, and a
length predictor's).

Reservation R (P the tokens to hold at admission, F = max(final length, P), O = max(F - P, 1),
M = max_seq_len), at most M and at least 1::

    max        R = M
    pow2       R = P + next_pow2(O)                  O = 25 -> 32
    oracle     R = F
    predicted  R = P + max(1, round(O * (1 + e)))    e = predictor_error * z

where z is the request's standard normal draw (``predictor_draw``; replay.py draws it as the
Python manager does, seeded by (seed, request, F), so every admission of a request draws the
same z) and round is Python's, halves to even.

Only a predicted reservation can be outgrown: a decode token that would not fit in R
re-reserves R' = min(M, max(L + 1, P + 2 (R - P))) (the predicted output doubled). The extent
keeps its place when its placed size already holds R', grows in place when the placement
allows, else moves to a new extent (placed before the old one is released) and its old place
is freed: a request blocked on memory may fit now, so the blocked-head shortcut is voided. A
step's re-reservations go in the order their requests joined the decode set (the Python
scheduler's decode-set order: admission order, except that a request swapped back in joins at
once, before earlier-admitted ones still in their prefill); when they do not all fit, the
scheduler preempts the latest-admitted request and tries again (``decode_fits``;
``ExtentManager.can_append_batch``).

Accounting, per request (``_extent.py``'s diagram)::

    [ L token states | min(R, F) - L reservation | R - min(R, F) internal frag | A - R slack ]

kept as running sums: ``COMPUTED_SLOTS`` (L), ``DEMAND_SLOTS`` (min(R, F)), ``RESERVED_SLOTS``
(R), ``PLACED_SLOTS`` (A); the free ``capacity - sum(A)`` are external fragmentation while a
request waits for memory, else free.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import placement
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.kv.kv_cache import ALLOCATE_LATER, CAN_ALLOCATE, NEVER_FITS
from pagesim.sim.core.state import (CAPACITY, COMPUTED_SLOTS, DEMAND_SLOTS, FREE_EPOCH, MAX_SEQ_LEN,
                                    NUM_ALLOCATIONS, NUM_FREES, NUM_GROWS_IN_PLACE, NUM_MOVES, NUM_OVERFLOWS,
                                    NUM_RUNNING, PREDICTOR_ERROR, RESERVE_MAX, RESERVE_ORACLE, RESERVE_POW2,
                                    RESERVE_PREDICTED)
from pagesim.sim.core.state import section, table

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    RESERVATION_KIND    the contiguous manager's reservation (RESERVE_*)
    LARGEST_EXTENT      the largest reservation the contiguous manager places
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    RESERVED_SLOTS      the contiguous manager: token slots reserved
    NUM_JOINS           requests that joined the decode set (their order: Core.extent's EXTENT_JOINED)
    PLACED_SLOTS        the contiguous manager: token slots placed (reserved and rounded up)
""")

# Core.extent: the contiguous manager's reservation of each request
table("extent", """
    EXTENT_START        its first slot
    EXTENT_RESERVED     R, the slots it asked for
    EXTENT_PLACED       A >= R, the slots placed
    EXTENT_PROMPT       the tokens it held at admission (P of a re-reservation)
    EXTENT_JOINED       when it joined the decode set (a count): re-reservations go in this order
""", size="EXTENT_COLUMNS", into=globals())


@njit(inline=True)
def slots_in_use(counts, r):
    """Replica ``r``'s address space in use (``counts``: the replicas' counters, a row each): the
    slots its reservations placed."""
    return counts[r, PLACED_SLOTS]


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
    elif kind == RESERVE_ORACLE:
        r = final
    else:  # predicted
        predicted = int(round(output * (1.0 + s.clock[PREDICTOR_ERROR] * s.predictor_draw[i])))
        r = num_tokens + max(1, predicted)
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
    s.extent[i, EXTENT_PROMPT] = num_tokens
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
    """The six categories (sim.metrics.MEMORY_CATEGORIES), in order; they sum to the capacity."""
    c = s.count
    free_slots = s.config[CAPACITY] - c[PLACED_SLOTS]
    out[0] = c[COMPUTED_SLOTS]
    out[1] = c[DEMAND_SLOTS] - c[COMPUTED_SLOTS]
    out[2] = c[RESERVED_SLOTS] - c[DEMAND_SLOTS]
    out[3] = c[PLACED_SLOTS] - c[RESERVED_SLOTS]
    out[4] = free_slots if demand_waiting else 0
    out[5] = 0 if demand_waiting else free_slots
    return 0  # no blocks: the step table has no block columns for this manager


# -- a predicted reservation outgrown: re-reserve -----------------------------------------------
@njit(inline=True)
def overflows(s, i):
    """Whether request ``i``'s next decode token would not fit in its reservation."""
    return s.num_computed_tokens[i] + 1 > s.extent[i, EXTENT_RESERVED]


@njit(inline=True)
def reservation_after_overflow(s, i):
    """R' = min(M, max(L + 1, P + 2 (R - P))): the predicted output doubled."""
    p, r = s.extent[i, EXTENT_PROMPT], s.extent[i, EXTENT_RESERVED]
    return min(s.config[MAX_SEQ_LEN], max(s.num_computed_tokens[i] + 1, p + 2 * (r - p)))


@njit
def can_rereserve(s, i):
    """Whether request ``i``'s extent can take R' now: it holds it already, grows in place, or
    a new extent fits (beside the old one, which is released only after)."""
    if s.num_computed_tokens[i] + 1 > s.config[MAX_SEQ_LEN]:
        return False
    r = reservation_after_overflow(s, i)
    start, a = s.extent[i, EXTENT_START], s.extent[i, EXTENT_PLACED]
    return placement.placed_size(s, r) <= a or placement.can_grow(s, start, a, r) or placement.can_place(s, r)


@njit
def resize_extent(s, i, r):
    """The placement's part of re-reserving request ``i`` to ``r`` slots (``can_rereserve``):
    returns its extent's new (start, placed size, how: 0 kept, 1 grown in place, 2 moved)."""
    start, a = s.extent[i, EXTENT_START], s.extent[i, EXTENT_PLACED]
    if placement.placed_size(s, r) <= a:
        return start, a, 0
    if placement.can_grow(s, start, a, r):
        return start, placement.grow(s, start, a, r), 1
    new = placement.place(s, r)
    placement.release(s, start, a)
    return new, placement.placed_size(s, r), 2


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def rereserve(s, i):
    """Re-reserve request ``i``'s overflowing extent (``can_rereserve`` said yes)."""
    r2 = reservation_after_overflow(s, i)
    start, a2, how = resize_extent(s, i, r2)
    r, a, f = s.extent[i, EXTENT_RESERVED], s.extent[i, EXTENT_PLACED], s.final_len[i]
    c = s.count
    c[DEMAND_SLOTS] += min(r2, f) - min(r, f)
    c[RESERVED_SLOTS] += r2 - r
    c[PLACED_SLOTS] += a2 - a
    s.extent[i, EXTENT_START] = start
    s.extent[i, EXTENT_RESERVED] = r2
    s.extent[i, EXTENT_PLACED] = a2
    c[NUM_OVERFLOWS] += 1
    if how == 1:
        c[NUM_GROWS_IN_PLACE] += 1
    elif how == 2:
        c[NUM_MOVES] += 1
        c[FREE_EPOCH] += 1  # its old place is free: a blocked request may fit now


@njit(inline=True)
def joined(s, i):
    """Request ``i`` joins the decode set (its prefill done, or swapped back in)."""
    s.extent[i, EXTENT_JOINED] = s.count[NUM_JOINS]
    s.count[NUM_JOINS] += 1


@njit
def next_overflowing(s, after):
    """The decoding request whose next token overflows its reservation and that joined first
    after the join count ``after``; -1 when none."""
    found = -1
    for k in range(s.count[NUM_RUNNING]):
        i = s.running[k]
        if (s.in_decode[i] and overflows(s, i) and s.extent[i, EXTENT_JOINED] > after
                and (found < 0 or s.extent[i, EXTENT_JOINED] < s.extent[found, EXTENT_JOINED])):
            found = i
    return found


@njit(inline=True)
def decode_fits(s):
    """Whether every decoding request's next token fits: those that overflow re-reserve, in
    join order (one: asked directly; several: tried in that order on the placement, which is
    restored after). Only a predicted reservation overflows (asked here, every step: a call
    passing the state field by field costs more than the step's other work; the lazy function's
    takes it by reference)."""
    return s.config[RESERVATION_KIND] != RESERVE_PREDICTED or predicted_decode_fits(s)


def predicting(config):
    """The runs of a predicted reservation (Orca's Predicted): the only ones whose reservations
    overflow, and that compile the re-reservations below (``njit``'s lazy: the contiguous
    family's other runs, ``pagesim reproduce fig2``'s, never do)."""
    return config[RESERVATION_KIND] == RESERVE_PREDICTED


@njit(lazy=predicting)
def predicted_decode_fits(s) -> bool:
    # np.int64(-1), not -1: jit.njit's note on constants
    i = next_overflowing(s, np.int64(-1))
    if i < 0:
        return True
    if next_overflowing(s, s.extent[i, EXTENT_JOINED]) < 0:
        return can_rereserve(s, i)
    placement.save(s)
    fits = True
    while i >= 0:
        if not can_rereserve(s, i):
            fits = False
            break
        resize_extent(s, i, reservation_after_overflow(s, i))
        i = next_overflowing(s, s.extent[i, EXTENT_JOINED])
    placement.restore(s)
    return fits


@njit(inline=True)
def rereserve_overflowing(s):
    """Re-reserve, in join order, every decoding request whose next token overflows
    (``decode_fits`` said they fit). Only a predicted reservation overflows."""
    if s.config[RESERVATION_KIND] == RESERVE_PREDICTED:
        rereserve_predicted(s)


@njit(lazy=predicting)
def rereserve_predicted(s) -> None:
    i = next_overflowing(s, np.int64(-1))
    while i >= 0:
        rereserve(s, i)
        i = next_overflowing(s, s.extent[i, EXTENT_JOINED])
