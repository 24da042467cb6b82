"""Shared bookkeeping of the managers that give each sequence one contiguous extent.

Per sequence (numpy arrays indexed by ``seq_id``, grown on demand)::

    start  where its extent begins            A  placed size (slots it holds)
    R      what the reservation policy asked  F  true final length     L  computed tokens

    |<------------------------------ A ------------------------------>|
    |<---------------------- R --------------------->|                |
    |<------------ F ------------>|                  |                |
    |<---- L ---->|               |                  |                |
    [ token_states | reservation  |  internal_frag   | allocator_slack]

Four running sums (L, min(R, F), R, A) give every category in O(1); the free slots are
``capacity - sum(A)`` and go to external_frag or free_idle by ``demand_waiting``.
A sequence that outgrows its final length (never, with a correct trace) has F raised to L.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from pagesim.sim.errors import OutOfMemory
from pagesim.sim.memory.base import (ExtentSnapshot, KVCacheManager, MemoryUsage, grow_seq_arrays,
                             settle_lane_before)

_FIELDS = ("start", "L", "F", "R", "A", "prompt")


@settle_lane_before
class ExtentManager(KVCacheManager):
    """Accounting and the vectorized decode path; subclasses decide R, A and where extents go."""

    def __init__(self, capacity: int, max_seq_len: int):
        self.capacity = int(capacity)
        self.max_seq_len = int(max_seq_len)
        n = 64
        for f in _FIELDS:
            setattr(self, "_" + f, np.zeros(n, dtype=np.int64))
        self._active = np.zeros(n, dtype=bool)
        self._n = 0
        self._sum_L = self._sum_minRF = self._sum_R = self._sum_A = 0
        self._counters = {"allocations": 0, "frees": 0, "fork_copies": 0, "overflows": 0, "moves": 0,
                          "grows_in_place": 0}
        # decode lane (as PagedManager's): lockstep steps inside min(R, F) are counted in O(1)
        self._lane_ids: np.ndarray | None = None
        self._lane_room = 0
        self._lane_k = 0

    # ---- per-sequence arrays ----------------------------------------------------------
    def _ensure(self, seq_id: int) -> None:
        grow_seq_arrays(self, seq_id, _FIELDS)

    def has_seq(self, seq_id: int) -> bool:
        return 0 <= seq_id < len(self._active) and bool(self._active[seq_id])

    def _add(self, seq_id: int, start: int, L: int, F: int, R: int, A: int, prompt: int) -> None:
        if self.has_seq(seq_id):
            raise ValueError(f"sequence {seq_id} is already allocated")
        self._ensure(seq_id)
        F = max(F, L)
        self._start[seq_id], self._L[seq_id], self._F[seq_id] = start, L, F
        self._R[seq_id], self._A[seq_id], self._prompt[seq_id] = R, A, prompt
        self._active[seq_id] = True
        self._n += 1
        self._sum_L += L
        self._sum_minRF += min(R, F)
        self._sum_R += R
        self._sum_A += A

    def _remove(self, seq_id: int) -> tuple[int, int]:
        """Forget a sequence; return its (start, A)."""
        self._check_seq(seq_id)
        L, F, R, A = (int(self._L[seq_id]), int(self._F[seq_id]), int(self._R[seq_id]),
                      int(self._A[seq_id]))
        self._sum_L -= L
        self._sum_minRF -= min(R, F)
        self._sum_R -= R
        self._sum_A -= A
        self._active[seq_id] = False
        self._n -= 1
        return int(self._start[seq_id]), A

    def _set_RA(self, seq_id: int, R: int, A: int, start: int | None = None) -> None:
        F = int(self._F[seq_id])
        oR, oA = int(self._R[seq_id]), int(self._A[seq_id])
        self._sum_minRF += min(R, F) - min(oR, F)
        self._sum_R += R - oR
        self._sum_A += A - oA
        self._R[seq_id], self._A[seq_id] = R, A
        if start is not None:
            self._start[seq_id] = start

    def _advance(self, seq_id: int, n: int) -> None:
        """L += n (room already checked); raises F if the sequence outgrows it."""
        L, F, R = int(self._L[seq_id]), int(self._F[seq_id]), int(self._R[seq_id])
        if L + n > R:
            raise OutOfMemory(f"sequence {seq_id}: {L}+{n} tokens exceed its reservation {R}")
        if L + n > F:
            self._sum_minRF += min(R, L + n) - min(R, F)
            self._F[seq_id] = F = L + n
        self._L[seq_id] = L + n
        self._sum_L += n

    def _check_seq(self, seq_id: int) -> None:
        if not self.has_seq(seq_id):
            raise KeyError(f"sequence {seq_id} is not allocated")

    # ---- protocol ------------------------------------------------------------------------
    def num_tokens(self, seq_id: int) -> int:
        self._check_seq(seq_id)
        return int(self._L[seq_id])

    def num_seqs(self) -> int:
        return self._n

    def usage(self, demand_waiting: bool = False) -> MemoryUsage:
        free = self.capacity - self._sum_A
        return MemoryUsage(self._sum_L, self._sum_minRF - self._sum_L, self._sum_R - self._sum_minRF,
                           self._sum_A - self._sum_R, free if demand_waiting else 0,
                           0 if demand_waiting else free)

    def stats(self) -> dict[str, int]:
        return dict(self._counters, num_seqs=self._n)

    def add_counts(self, **counts: int) -> None:
        """Event counts made elsewhere (the core, sim/core/) join :meth:`stats`'s counters."""
        for k, v in counts.items():
            self._counters[k] += v

    def append(self, seq_id: int, n: int = 1) -> None:
        self._check_seq(seq_id)
        if int(self._L[seq_id]) + n > int(self._R[seq_id]):
            self._rereserve(seq_id, int(self._L[seq_id]) + n)
        self._advance(seq_id, n)

    def _rereserve(self, seq_id: int, need: int) -> None:
        raise OutOfMemory(f"sequence {seq_id} needs {need} slots, more than its fixed extent")

    def can_append_batch(self, seq_ids: Sequence[int], last: int | None = None) -> bool:
        if seq_ids is self._lane_ids and self._lane_room > 0:
            return True
        self._settle()
        ids = np.asarray(seq_ids, dtype=np.int64)
        if not len(ids):
            return True
        over = ids[self._L[ids] + 1 > self._R[ids]]
        if not len(over):
            return True
        return self._can_rereserve_many([int(s) for s in over])

    def _can_rereserve_many(self, seq_ids: list[int]) -> bool:
        return all(self.can_append(s, 1) for s in seq_ids) if len(seq_ids) <= 1 else False

    # ---- macro steps: m lane steps at once (the engine's decode-only stretches) ----------
    macro_steps_ok = True

    def lane_steps(self, seq_ids, limit: int) -> int:
        """How many further lockstep appends of ``seq_ids`` stay in the lane (a new array opens
        its lane first, as its first ``append_batch`` would)."""
        if limit <= 0:
            return 0
        if seq_ids is not self._lane_ids:
            self._settle()
            self._open_lane(seq_ids)
        if seq_ids is not self._lane_ids or self._lane_room <= 0:
            return 0
        return min(int(limit), self._lane_room)

    def _open_lane(self, seq_ids) -> None:
        """A lane on ``seq_ids`` (settled state): every member has room in its reservation and
        below its final length for ``room`` more tokens."""
        if isinstance(seq_ids, np.ndarray) and seq_ids.dtype == np.int64 and len(seq_ids) \
                and seq_ids.max() < len(self._active) and self._active[seq_ids].all():
            room = int((np.minimum(self._R[seq_ids], self._F[seq_ids]) - self._L[seq_ids]).min())
            if room > 0:
                self._lane_ids, self._lane_room, self._lane_k = seq_ids, room, 0

    def lane_advance(self, m: int, demand_waiting: bool):
        """``m`` lane steps as ``m`` calls of ``append_batch``; per-step usage rows (m x 6)."""
        W = len(self._lane_ids)
        self._lane_k += m
        self._lane_room -= m
        if m <= 48:  # short stretches in scalars (tiny numpy calls cost more)
            free = self.capacity - self._sum_A
            rf, r, a = self._sum_minRF, self._sum_R - self._sum_minRF, self._sum_A - self._sum_R
            fi, fe = (free, 0) if demand_waiting else (0, free)
            L0 = self._sum_L
            self._sum_L += W * m
            return [(L0 + W * j, rf - L0 - W * j, r, a, fi, fe) for j in range(1, m + 1)], None
        L = self._sum_L + W * np.arange(1, m + 1, dtype=np.int64)
        self._sum_L += W * m
        free = self.capacity - self._sum_A
        mem = np.empty((m, 6), np.int64)
        mem[:, 0] = L
        mem[:, 1] = self._sum_minRF - L
        mem[:, 2] = self._sum_R - self._sum_minRF
        mem[:, 3] = self._sum_A - self._sum_R
        mem[:, 4] = free if demand_waiting else 0
        mem[:, 5] = 0 if demand_waiting else free
        return mem, None

    def _settle(self) -> None:
        if self._lane_k:
            self._L[self._lane_ids] += self._lane_k
            self._lane_k = 0
        self._lane_ids = None

    def append_batch(self, seq_ids: Iterable[int]) -> None:
        if seq_ids is not self._lane_ids:
            self._settle()
            self._open_lane(seq_ids)  # this append is the new lane's first step when it has room
        if seq_ids is self._lane_ids and self._lane_room > 0:
            self._lane_k += 1
            self._lane_room -= 1
            self._sum_L += len(seq_ids)
            return
        self._settle()
        self._append_batch_full(seq_ids)
        self._open_lane(seq_ids)

    def _append_batch_full(self, seq_ids: Iterable[int]) -> None:
        ids = np.asarray(list(seq_ids) if not isinstance(seq_ids, (np.ndarray, list, tuple)) else seq_ids,
                         dtype=np.int64)
        if not len(ids):
            return
        if not self._active[ids].all():
            bad = [int(s) for s in ids if not self.has_seq(int(s))]
            raise KeyError(f"sequences {bad} are not allocated")
        L = self._L[ids]
        fast = (L + 1 <= self._R[ids]) & (L + 1 <= self._F[ids])
        f_ids = ids[fast]
        self._L[f_ids] += 1
        self._sum_L += len(f_ids)
        for s in ids[~fast]:
            self.append(int(s), 1)

    def export(self) -> ExtentSnapshot:
        ids = np.flatnonzero(self._active)
        return ExtentSnapshot(self.capacity,
                              {int(s): (int(self._start[s]), int(self._A[s])) for s in ids},
                              {int(s): int(self._L[s]) for s in ids})

    def check(self) -> None:
        ids = np.flatnonzero(self._active)
        L, F, R, A = self._L[ids], self._F[ids], self._R[ids], self._A[ids]
        assert len(ids) == self._n, "sequence count drifted"
        assert (L <= F).all() and (L <= R).all() and (R <= A).all() and (L >= 0).all(), \
            "an extent breaks L <= F, L <= R <= A"
        assert int(L.sum()) == self._sum_L and int(np.minimum(R, F).sum()) == self._sum_minRF, "sums drifted"
        assert int(R.sum()) == self._sum_R and int(A.sum()) == self._sum_A, "sums drifted"
        ext = sorted((int(self._start[s]), int(self._A[s])) for s in ids)
        for (s0, n0), (s1, _) in zip(ext, ext[1:]):
            assert s0 + n0 <= s1, f"extents overlap at {s1}: a slot is owned twice"
        assert all(0 <= s and s + n <= self.capacity for s, n in ext), "extent outside the pool"
        super().check()
