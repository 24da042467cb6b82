"""Where contiguous extents go in the slot address space [0, capacity): buddy, first-fit, best-fit.

Used by the contiguous (Orca) manager. A placement hands out ``[start, start + placed_size)``
ranges; ``placed_size(R) - R`` is the *allocator slack* (buddy rounding), and the holes it
leaves between extents are what the paper calls external fragmentation.

Binary buddy (default)
----------------------
A capacity that is not a power of two is covered by top-level power-of-two chunks, largest
first (each chunk is its own buddy tree; blocks never merge across chunks)::

    15728 = 8192 + 4096 + 2048 + 1024 + 256 + 64 + 32 + 16
    0              8192       12288  14336 15360 ...
    [    8192     ][  4096   ][2048 ][1024][256]..

A request of R slots takes a block of ``next_pow2(R)``: the lowest-addressed free block of the
smallest sufficient size is split in halves until it has that size; on free, a block merges with
its buddy (``base + ((start - base) ^ size)``) while the buddy is free and whole::

    alloc(3):  [        16        ]  ->  [  8  ][  8  ]  ->  [4][4][  8  ]   -> takes [0, 4)
    free(0):   [4*][4 ][  8  ]       ->  [  8  ][  8  ]  ->  [        16        ]

First-fit / best-fit
--------------------
Exact-size extents carved from the front of a hole (first-fit: lowest address that fits;
best-fit: smallest hole that fits, ties to the lowest address); freed extents coalesce with
adjacent holes. Holes are kept in address order (``bisect``)::

    [A....][ hole 5 ][B..][  hole 9  ]      first-fit(4) -> hole 5; best-fit(9) -> hole 9
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (1 for x <= 1)."""
    return 1 if x <= 1 else 1 << (int(x) - 1).bit_length()


class Placement(ABC):
    """An address-space allocator over [0, capacity)."""

    name: str = "base"

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.allocated: dict[int, int] = {}  # start -> placed size

    @abstractmethod
    def placed_size(self, size: int) -> int: ...

    @abstractmethod
    def largest_possible(self) -> int:
        """Largest extent this allocator could place in an empty pool."""

    @abstractmethod
    def can_alloc(self, size: int) -> bool: ...

    @abstractmethod
    def alloc(self, size: int) -> int | None:
        """Place ``size`` slots; return the start (placed size is ``placed_size(size)``) or None."""

    @abstractmethod
    def free(self, start: int) -> None: ...

    @abstractmethod
    def can_grow(self, start: int, new_size: int) -> bool:
        """True if the extent at ``start`` can grow in place to hold ``new_size`` slots."""

    @abstractmethod
    def grow(self, start: int, new_size: int) -> None: ...

    @abstractmethod
    def free_slots(self) -> int: ...

    @abstractmethod
    def check(self) -> None: ...

    def _check_cover(self, free_ranges: list[tuple[int, int]]) -> None:
        ranges = sorted(list(self.allocated.items()) + free_ranges)
        pos = 0
        for s, n in ranges:
            assert n > 0, f"empty range at {s}"
            assert s == pos, f"{self.name}: gap/overlap at {pos} (next range starts {s})"
            pos = s + n
        assert pos == self.capacity, f"{self.name}: ranges cover {pos} of {self.capacity}"


class BuddyPlacement(Placement):
    name = "buddy"

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.chunks: list[tuple[int, int]] = []  # (base, size), largest first
        base, rest = 0, self.capacity
        while rest > 0:
            size = 1 << (rest.bit_length() - 1)
            self.chunks.append((base, size))
            base += size
            rest -= size
        self._chunk_bases = [b for b, _ in self.chunks]
        self.free_lists: dict[int, set[int]] = {}
        for b, size in self.chunks:
            self.free_lists.setdefault(size, set()).add(b)
        self._free = self.capacity

    def _chunk(self, start: int) -> tuple[int, int]:
        return self.chunks[bisect.bisect_right(self._chunk_bases, start) - 1]

    def placed_size(self, size: int) -> int:
        return next_pow2(size)

    def largest_possible(self) -> int:
        return self.chunks[0][1] if self.chunks else 0

    def _find_order(self, s: int) -> int | None:
        best = None
        for k, starts in self.free_lists.items():
            if starts and k >= s and (best is None or k < best):
                best = k
        return best

    def can_alloc(self, size: int) -> bool:
        return self._find_order(next_pow2(size)) is not None

    def alloc(self, size: int) -> int | None:
        s = next_pow2(size)
        k = self._find_order(s)
        if k is None:
            return None
        start = min(self.free_lists[k])
        self.free_lists[k].remove(start)
        while k > s:  # split; the upper half stays free
            k //= 2
            self.free_lists.setdefault(k, set()).add(start + k)
        self.allocated[start] = s
        self._free -= s
        return start

    def free(self, start: int) -> None:
        s = self.allocated.pop(start)
        self._free += s
        base, csize = self._chunk(start)
        while 2 * s <= csize:
            buddy = base + ((start - base) ^ s)
            fl = self.free_lists.get(s)
            if fl is None or buddy not in fl:
                break
            fl.remove(buddy)
            start = min(start, buddy)
            s *= 2
        self.free_lists.setdefault(s, set()).add(start)

    def _grow_path(self, start: int, new_size: int) -> list[tuple[int, int]] | None:
        s = self.allocated[start]
        t = next_pow2(new_size)
        base, csize = self._chunk(start)
        path = []
        while s < t:
            if 2 * s > csize or (start - base) % (2 * s):
                return None
            buddy = start + s
            if buddy not in self.free_lists.get(s, ()):
                return None
            path.append((s, buddy))
            s *= 2
        return path

    def can_grow(self, start: int, new_size: int) -> bool:
        return self._grow_path(start, new_size) is not None

    def grow(self, start: int, new_size: int) -> None:
        path = self._grow_path(start, new_size)
        assert path is not None, "grow without can_grow"
        for s, buddy in path:
            self.free_lists[s].remove(buddy)
            self._free -= s
        self.allocated[start] = next_pow2(max(new_size, self.allocated[start]))

    def free_slots(self) -> int:
        return self._free

    def check(self) -> None:
        free_ranges = [(st, k) for k, sts in self.free_lists.items() for st in sts]
        self._check_cover(free_ranges)
        assert self._free == sum(k for _, k in free_ranges), "buddy free counter drifted"
        for st, k in free_ranges + list(self.allocated.items()):
            base, csize = self._chunk(st)
            assert k & (k - 1) == 0 and (st - base) % k == 0 and st + k <= base + csize, \
                f"buddy block ({st}, {k}) misaligned"
        for st, k in free_ranges:  # free buddies must have been merged
            base, csize = self._chunk(st)
            if 2 * k <= csize:
                assert base + ((st - base) ^ k) not in self.free_lists.get(k, ()), f"unmerged buddies at {st}"


class FitPlacement(Placement):
    """First-fit or best-fit over an address-ordered list of holes, with coalescing."""

    def __init__(self, capacity: int, best: bool = False):
        super().__init__(capacity)
        self.best = best
        self.name = "best-fit" if best else "first-fit"
        self._starts: list[int] = [0] if self.capacity else []  # hole starts, sorted
        self._holes: dict[int, int] = {0: self.capacity} if self.capacity else {}
        self._free = self.capacity

    def placed_size(self, size: int) -> int:
        return int(size)

    def largest_possible(self) -> int:
        return self.capacity

    def _find(self, size: int) -> int | None:
        if self.best:
            best = None
            for st in self._starts:
                n = self._holes[st]
                if n >= size and (best is None or n < self._holes[best]):
                    best = st
            return best
        for st in self._starts:
            if self._holes[st] >= size:
                return st
        return None

    def can_alloc(self, size: int) -> bool:
        return self._find(size) is not None

    def alloc(self, size: int) -> int | None:
        st = self._find(size)
        if st is None:
            return None
        n = self._holes.pop(st)
        i = bisect.bisect_left(self._starts, st)
        if n > size:
            self._starts[i] = st + size
            self._holes[st + size] = n - size
        else:
            del self._starts[i]
        self.allocated[st] = size
        self._free -= size
        return st

    def free(self, start: int) -> None:
        size = self.allocated.pop(start)
        self._free += size
        i = bisect.bisect_left(self._starts, start)
        # coalesce with the following hole
        if i < len(self._starts) and self._starts[i] == start + size:
            size += self._holes.pop(self._starts[i])
            del self._starts[i]
        # coalesce with the preceding hole
        if i > 0 and self._starts[i - 1] + self._holes[self._starts[i - 1]] == start:
            self._holes[self._starts[i - 1]] += size
        else:
            self._starts.insert(i, start)
            self._holes[start] = size

    def can_grow(self, start: int, new_size: int) -> bool:
        extra = new_size - self.allocated[start]
        if extra <= 0:
            return True
        nxt = start + self.allocated[start]
        return self._holes.get(nxt, 0) >= extra

    def grow(self, start: int, new_size: int) -> None:
        assert self.can_grow(start, new_size), "grow without can_grow"
        extra = new_size - self.allocated[start]
        if extra <= 0:
            return
        nxt = start + self.allocated[start]
        n = self._holes.pop(nxt)
        i = bisect.bisect_left(self._starts, nxt)
        if n > extra:
            self._starts[i] = nxt + extra
            self._holes[nxt + extra] = n - extra
        else:
            del self._starts[i]
        self.allocated[start] = new_size
        self._free -= extra

    def free_slots(self) -> int:
        return self._free

    def check(self) -> None:
        assert self._starts == sorted(self._holes), "hole index out of order"
        self._check_cover(list(self._holes.items()))
        assert self._free == sum(self._holes.values()), "fit free counter drifted"
        for a, b in zip(self._starts, self._starts[1:]):
            assert a + self._holes[a] < b, f"uncoalesced holes at {a} and {b}"


def make_placement(name: str, capacity: int) -> Placement:
    from pagesim.sim.errors import ConfigError
    if name == "buddy":
        return BuddyPlacement(capacity)
    if name in ("first-fit", "best-fit"):
        return FitPlacement(capacity, best=(name == "best-fit"))
    raise ConfigError(f"unknown placement '{name}'; valid: buddy, first-fit, best-fit")
