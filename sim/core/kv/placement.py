"""Where the contiguous manager's extents go in the slot address space [0, capacity): the
binary buddy, first-fit and best-fit allocators, as plain functions over
the core's arrays (the policy is ``config[PLACEMENT_KIND]``).

Buddy. The capacity is covered by power-of-two chunks, largest first (15728 = 8192 + 4096 +
... + 16). Each chunk's base is a sum of larger powers of two, so every block of size 2**k
starts at a multiple of 2**k, its buddy is ``start ^ 2**k``, and a block may merge with its
buddy exactly when the aligned pair ``[start & -2**(k+1), + 2**(k+1))`` lies inside the pool
(a pair that would cross a chunk's end also crosses the pool's). The free blocks of order k
are one bit per aligned position (``start >> k``), 32 bits to an int64 word; the lowest free
block of an order is the first set bit (a per-order first word skips the words known empty).
A request of R slots takes the lowest-addressed free block of the smallest sufficient order,
split in halves down to ``next_pow2(R)`` (the upper halves stay free); a freed block merges
with its buddy while the buddy is free and whole::

    alloc(3) in 16:  [        16        ] -> [  8  ][  8  ] -> [4][4][  8  ]  -> takes [0, 4)
    free(0):         [4*][4 ][  8  ]      -> [  8  ][  8  ] -> [        16        ]

First-fit / best-fit. Holes sorted by address in ``holes`` (the first ``NUM_HOLES``):
first-fit takes the lowest hole that fits, best-fit the smallest (ties: the lowest); an
extent is carved from the front of its hole, and a freed extent coalesces with the holes on
either side. O(holes) scans: holes never outnumber running requests + 1.

The static manager's B fixed slots of max_seq_len (a request takes the lowest free slot) are first-fit over the address space ``[0, B * max_seq_len)``
(``config[ADDRESS_SPACE]``): with every extent max_seq_len long, the holes are whole slots and
the first that fits is the lowest free slot.

Growing in place (a predicted reservation that overflowed, ``extent.py``): a buddy block
doubles while it is the lower half of a pair inside the pool whose upper half is free and
whole; a fit extent takes the front of the hole that starts where it ends. Several
re-reservations in one step are first tried on the placement itself, saved before and
restored after (:func:`save`, :func:`restore`).

The arrays: ``buddy_bits``; ``buddy_orders[k]`` = (first word of order k's row, its free
blocks, a word before which none is free); ``holes[h]`` = (start, size).
"""

from __future__ import annotations

from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import BEST_FIT, BUDDY
from pagesim.sim.core.state import section, table

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    PLACEMENT_KIND      the contiguous manager's placement (BUDDY, FIRST_FIT, BEST_FIT)
    ADDRESS_SPACE       the contiguous manager's address space, in token slots
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    NUM_HOLES           the fit placements' holes (Core.holes' rows in use)
""")

# Core.buddy_orders: per order of the buddy placement
table("buddy_orders", """
    ORDER_ROW           its first word of Core.buddy_bits
    ORDER_FREE          its free blocks
    ORDER_FIRST_WORD    the first word that may hold one
""", size="ORDER_COLUMNS", into=globals())

# Core.holes: the fit placements' holes, by address
table("holes", """
    HOLE_START          its first slot
    HOLE_SIZE           its slots
""", size="HOLE_COLUMNS", into=globals())


WORD_BITS = 32  # bits used per int64 word: no sign bit, so `w & -w` is the lowest set bit


@njit(inline=True)
def next_pow2(x):
    """Smallest power of two >= x (1 for x <= 1)."""
    p = 1
    while p < x:
        p *= 2
    return p


@njit(inline=True)
def order_of(size):
    """log2 of a power of two."""
    k = 0
    while (1 << k) < size:
        k += 1
    return k


@njit(inline=True)
def largest_buddy_block(capacity):
    """The buddy's largest block in a pool of ``capacity`` slots: the highest power of two in
    it (0 for none), the first of the chunks that cover the pool (:func:`buddy_init`). The
    configuration check (sim/core/build.py) calls it too."""
    if capacity < 1:
        return 0
    p = 1
    while 2 * p <= capacity:
        p *= 2
    return p


@njit(inline=True)
def placed_size(s, size):
    """Slots an extent asked for ``size`` slots takes: the allocator slack is the difference."""
    return next_pow2(size) if s.config[PLACEMENT_KIND] == BUDDY else size


# -- the buddy's free blocks: one bit per aligned block of each order -------------------------
@njit(inline=True)
def buddy_is_free(s, k, start):
    bit = start >> k
    return (s.buddy_bits[s.buddy_orders[k, ORDER_ROW] + bit // WORD_BITS] >> (bit % WORD_BITS)) & 1 == 1


@njit(inline=True)
def buddy_mark_free(s, k, start):
    bit = start >> k
    w = bit // WORD_BITS
    s.buddy_bits[s.buddy_orders[k, ORDER_ROW] + w] |= 1 << (bit % WORD_BITS)
    s.buddy_orders[k, ORDER_FREE] += 1
    if w < s.buddy_orders[k, ORDER_FIRST_WORD]:
        s.buddy_orders[k, ORDER_FIRST_WORD] = w


@njit(inline=True)
def buddy_mark_taken(s, k, start):
    bit = start >> k
    s.buddy_bits[s.buddy_orders[k, ORDER_ROW] + bit // WORD_BITS] &= ~(1 << (bit % WORD_BITS))
    s.buddy_orders[k, ORDER_FREE] -= 1


@njit(inline=True)
def lowest_bit(word):
    """Index of the lowest set bit of a nonzero word."""
    low = word & -word
    k = 0
    while (1 << k) != low:
        k += 1
    return k


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def buddy_lowest_free(s, k):
    """The lowest-addressed free block of order k (one must exist)."""
    row = s.buddy_orders[k, ORDER_ROW]
    w = s.buddy_orders[k, ORDER_FIRST_WORD]
    while s.buddy_bits[row + w] == 0:
        w += 1
    s.buddy_orders[k, ORDER_FIRST_WORD] = w
    return (w * WORD_BITS + lowest_bit(s.buddy_bits[row + w])) << k


@njit(inline=True)
def buddy_order_for(s, size):
    """The smallest order >= next_pow2(size)'s with a free block, or -1."""
    for k in range(order_of(next_pow2(size)), len(s.buddy_orders)):
        if s.buddy_orders[k, ORDER_FREE] > 0:
            return k
    return -1


@njit
def buddy_init(s):
    """The empty pool: one free block per chunk, the largest block of what is left, in turn
    (the set bits of the capacity, largest first)."""
    base = 0
    left = s.config[ADDRESS_SPACE]
    while left > 0:
        chunk = largest_buddy_block(left)
        buddy_mark_free(s, order_of(chunk), base)
        base += chunk
        left -= chunk


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def buddy_alloc(s, size):
    k = buddy_order_for(s, size)
    want = order_of(next_pow2(size))
    start = buddy_lowest_free(s, k)
    buddy_mark_taken(s, k, start)
    while k > want:  # split; the upper half stays free
        k -= 1
        buddy_mark_free(s, k, start + (1 << k))
    return start


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def buddy_release(s, start, size):
    k = order_of(size)
    capacity = s.config[ADDRESS_SPACE]
    while (start & -(2 << k)) + (2 << k) <= capacity:  # the pair lies inside one chunk
        buddy = start ^ (1 << k)
        if not buddy_is_free(s, k, buddy):
            break
        buddy_mark_taken(s, k, buddy)
        start = min(start, buddy)
        k += 1
    buddy_mark_free(s, k, start)


# -- first-fit / best-fit: holes by address -----------------------------------------------------
@njit(inline=True)
def fit_find(s, size, best):
    """Index of the hole first-fit (``best`` False) or best-fit would carve, or -1."""
    found = -1
    for h in range(s.count[NUM_HOLES]):
        n = s.holes[h, HOLE_SIZE]
        if n >= size:
            if not best:
                return h
            if found < 0 or n < s.holes[found, HOLE_SIZE]:
                found = h
    return found


@njit
def delete_hole(s, h):
    for k in range(h, s.count[NUM_HOLES] - 1):
        s.holes[k, HOLE_START] = s.holes[k + 1, HOLE_START]
        s.holes[k, HOLE_SIZE] = s.holes[k + 1, HOLE_SIZE]
    s.count[NUM_HOLES] -= 1


@njit
def fit_init(s):
    s.count[NUM_HOLES] = 1
    s.holes[0, HOLE_START] = 0
    s.holes[0, HOLE_SIZE] = s.config[ADDRESS_SPACE]


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def fit_alloc(s, size, best):
    h = fit_find(s, size, best)
    start = s.holes[h, HOLE_START]
    if s.holes[h, HOLE_SIZE] > size:  # carved from the front: the hole keeps its place in the order
        s.holes[h, HOLE_START] += size
        s.holes[h, HOLE_SIZE] -= size
    else:
        delete_hole(s, h)
    return start


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def fit_release(s, start, size):
    num = s.count[NUM_HOLES]
    h = 0  # the first hole after the extent
    while h < num and s.holes[h, HOLE_START] < start:
        h += 1
    if h < num and s.holes[h, HOLE_START] == start + size:  # coalesce with the following hole
        size += s.holes[h, HOLE_SIZE]
        delete_hole(s, h)
        num -= 1
    if h > 0 and s.holes[h - 1, HOLE_START] + s.holes[h - 1, HOLE_SIZE] == start:  # and with the preceding one
        s.holes[h - 1, HOLE_SIZE] += size
        return
    for k in range(num, h, -1):
        s.holes[k, HOLE_START] = s.holes[k - 1, HOLE_START]
        s.holes[k, HOLE_SIZE] = s.holes[k - 1, HOLE_SIZE]
    s.holes[h, HOLE_START] = start
    s.holes[h, HOLE_SIZE] = size
    s.count[NUM_HOLES] = num + 1


# -- the placement the config names ------------------------------------------------------------
@njit
def init(s):
    if s.config[PLACEMENT_KIND] == BUDDY:
        buddy_init(s)
    else:
        fit_init(s)


@njit
def can_place(s, size):
    if s.config[PLACEMENT_KIND] == BUDDY:
        return buddy_order_for(s, size) >= 0
    return fit_find(s, size, s.config[PLACEMENT_KIND] == BEST_FIT) >= 0


@njit
def place(s, size):
    """Start of a new extent for ``size`` slots (``can_place`` said yes); it takes
    ``placed_size(s, size)`` slots."""
    if s.config[PLACEMENT_KIND] == BUDDY:
        return buddy_alloc(s, size)
    return fit_alloc(s, size, s.config[PLACEMENT_KIND] == BEST_FIT)


@njit
def release(s, start, placed):
    """Give back the extent ``[start, start + placed)``."""
    if s.config[PLACEMENT_KIND] == BUDDY:
        buddy_release(s, start, placed)
    else:
        fit_release(s, start, placed)


# -- growing an extent in place ---------------------
@njit
def can_grow(s, start, placed, size):
    """Whether the extent ``[start, start + placed)`` can grow in place to hold ``size`` slots."""
    if s.config[PLACEMENT_KIND] != BUDDY:
        extra, h = fit_growth(s, start, placed, size)
        return extra <= 0 or (h >= 0 and s.holes[h, HOLE_SIZE] >= extra)
    k, want = order_of(placed), order_of(next_pow2(size))
    while k < want:
        # the lower half of a pair inside the pool (one chunk), with its upper half free and whole
        if start & ((2 << k) - 1) or start + (2 << k) > s.config[ADDRESS_SPACE] \
                or not buddy_is_free(s, k, start + (1 << k)):
            return False
        k += 1
    return True


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def grow(s, start, placed, size):
    """Grow the extent at ``start`` in place (``can_grow`` said yes); returns its new placed size."""
    if s.config[PLACEMENT_KIND] != BUDDY:
        extra, h = fit_growth(s, start, placed, size)
        if extra <= 0:
            return placed
        if s.holes[h, HOLE_SIZE] > extra:  # its front is taken: the hole keeps its place in the order
            s.holes[h, HOLE_START] += extra
            s.holes[h, HOLE_SIZE] -= extra
        else:
            delete_hole(s, h)
        return size
    k, want = order_of(placed), order_of(next_pow2(size))
    for order in range(k, want):
        buddy_mark_taken(s, order, start + (1 << order))
    return max(placed, 1 << want)


@njit(inline=True)
def fit_growth(s, start, placed, size):
    """A fit placement's growth of ``[start, start + placed)`` to ``size`` slots: the slots it
    needs more (<= 0: none) and the hole right after it that they would come from (-1: none)."""
    extra = size - placed
    return extra, (hole_at(s, start + placed) if extra > 0 else -1)


@njit(inline=True)
def hole_at(s, start):
    """Index of the hole beginning at ``start``, or -1."""
    for h in range(s.count[NUM_HOLES]):
        if s.holes[h, HOLE_START] == start:
            return h
    return -1


# -- a trial on the placement itself, undone after ----------------------------------------------
# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def save(s):
    """Copy the placement's state (free blocks, or holes) into ``placement_saved``."""
    saved = s.placement_saved
    if s.config[PLACEMENT_KIND] == BUDDY:
        n = len(s.buddy_bits)
        for w in range(n):
            saved[w] = s.buddy_bits[w]
        for k in range(len(s.buddy_orders)):
            saved[n + 2 * k] = s.buddy_orders[k, ORDER_FREE]
            saved[n + 2 * k + 1] = s.buddy_orders[k, ORDER_FIRST_WORD]
        return
    saved[0] = s.count[NUM_HOLES]
    for h in range(s.count[NUM_HOLES]):
        saved[1 + 2 * h] = s.holes[h, HOLE_START]
        saved[2 + 2 * h] = s.holes[h, HOLE_SIZE]


# inlined into its one caller, itself a call (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def restore(s):
    """The placement as :func:`save` left it."""
    saved = s.placement_saved
    if s.config[PLACEMENT_KIND] == BUDDY:
        n = len(s.buddy_bits)
        for w in range(n):
            s.buddy_bits[w] = saved[w]
        for k in range(len(s.buddy_orders)):
            s.buddy_orders[k, ORDER_FREE] = saved[n + 2 * k]
            s.buddy_orders[k, ORDER_FIRST_WORD] = saved[n + 2 * k + 1]
        return
    s.count[NUM_HOLES] = saved[0]
    for h in range(saved[0]):
        s.holes[h, HOLE_START] = saved[1 + 2 * h]
        s.holes[h, HOLE_SIZE] = saved[2 + 2 * h]


def saved_size(num_words: int, num_orders: int, num_holes: int) -> int:
    """Room :func:`save` needs (called from Python, at build time)."""
    return max(num_words + 2 * num_orders, 1 + 2 * num_holes)
