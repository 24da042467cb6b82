"""Contiguous reservations (Orca): one extent per sequence, sized at admission by a policy.

Reservation policies (P = prompt, O = F - P true output length, M = max_seq_len)::

    max        R = M                                   Orca (Max)
    pow2       R = min(M, P + next_pow2(O))            Orca (Pow2): O = 25 -> 32
    oracle     R = F                                   Orca (Oracle)
    predicted  R = min(M, P + round(O * (1 + e)))      e ~ N(0, predictor_error), seeded per
                                                       (seed, seq_id, F); at least 1 output slot

The extent is placed by a :mod:`sim.memory.placement` policy (buddy by default); the placed
size A >= R, and ``A - R`` is allocator slack. Holes between extents are external fragmentation::

    0                                                     capacity
    [ seq 3: LLLLrrrr....~~~~ ][ hole ][ seq 7: LLrr..~~ ][ hole ]
      L token  r reservation  . internal_frag  ~ allocator_slack

Overflow (only when a sequence outgrows R: ``predicted`` under-estimates): ``can_append`` /
``append`` re-reserve R' = min(M, max(L + n, P + 2 * (R - P))) (double the predicted output),
growing in place if the placement allows, else moving to a new extent (counted in ``overflows``,
``grows_in_place``, ``moves``); if neither fits, ``can_append`` is False and the scheduler preempts.
"""

from __future__ import annotations

import copy

import numpy as np

from pagesim.sim.errors import ConfigError, OutOfMemory
from pagesim.sim.memory._extent import ExtentManager
from pagesim.sim.memory.base import Admit, SeqSpec, settle_lane_before
from pagesim.sim.memory.placement import make_placement, next_pow2

POLICIES = ("max", "pow2", "oracle", "predicted")


@settle_lane_before
class ContiguousManager(ExtentManager):
    kind = "contiguous"

    def __init__(self, capacity: int, max_seq_len: int, reservation: str = "max",
                 placement: str = "buddy", predictor_error: float = 0.3, seed: int = 0):
        if reservation not in POLICIES:
            raise ConfigError(f"unknown reservation '{reservation}'; valid: {', '.join(POLICIES)}")
        if max_seq_len < 1:
            raise ConfigError(f"max_seq_len must be >= 1, got {max_seq_len} (e.g. 2048)")
        if capacity < max_seq_len:
            raise ConfigError(f"KV pool of {capacity} slots is smaller than one max_seq_len={max_seq_len} "
                              f"request; use max_seq_len <= {capacity} or a larger pool (kv_gib)")
        if predictor_error < 0:
            raise ConfigError(f"predictor_error must be >= 0, got {predictor_error} (e.g. 0.3)")
        super().__init__(capacity, max_seq_len)
        self.reservation = reservation
        self.placement = make_placement(placement, capacity)
        self.predictor_error = float(predictor_error)
        self.seed = int(seed)
        if self.placement.placed_size(max_seq_len) > self.placement.largest_possible():
            raise ConfigError(
                f"with {placement} placement a max_seq_len={max_seq_len} request takes "
                f"{self.placement.placed_size(max_seq_len)} slots but the largest block of a {capacity}-slot "
                f"pool is {self.placement.largest_possible()}; use max_seq_len <= "
                f"{self.placement.largest_possible()}, placement first-fit, or a pool of "
                f">= {self.placement.placed_size(max_seq_len)} slots")

    # ---- reservation policy ------------------------------------------------------------
    def request_size(self, spec: SeqSpec) -> int:
        """R for a sequence under this policy (deterministic for a given spec)."""
        P, F, M = spec.prompt_len, max(spec.final_len, spec.prompt_len), self.max_seq_len
        out = max(F - P, 1)
        if self.reservation == "max":
            R = M
        elif self.reservation == "pow2":
            R = P + next_pow2(out)
        elif self.reservation == "oracle":
            R = F
        else:
            z = np.random.default_rng((self.seed, spec.seq_id, F)).standard_normal()
            R = P + max(1, int(round(out * (1.0 + self.predictor_error * z))))
        return max(1, min(R, M))

    def can_allocate(self, spec: SeqSpec) -> Admit:
        if spec.final_len > self.max_seq_len or spec.prompt_len > self.max_seq_len:
            return Admit.NEVER
        R = self.request_size(spec)
        if self.placement.placed_size(R) > self.placement.largest_possible():
            return Admit.NEVER
        return Admit.OK if self.placement.can_alloc(R) else Admit.LATER

    def explain_never(self, spec: SeqSpec) -> str:
        if spec.final_len <= self.max_seq_len and spec.prompt_len <= self.max_seq_len:
            R = self.request_size(spec)
            return (f"sequence {spec.seq_id}: its {self.reservation} reservation of {R} slots "
                    f"({self.placement.placed_size(R)} placed) exceeds the largest {self.placement.name} "
                    f"extent {self.placement.largest_possible()}")
        return super().explain_never(spec)

    def allocate(self, spec: SeqSpec) -> int:
        if self.can_allocate(spec) is not Admit.OK:
            raise OutOfMemory(f"no extent for sequence {spec.seq_id}")
        R = self.request_size(spec)
        start = self.placement.alloc(R)
        self._add(spec.seq_id, start, 0, spec.final_len, R, self.placement.placed_size(R), spec.prompt_len)
        self._counters["allocations"] += 1
        return 0

    def free(self, seq_id: int) -> None:
        start, _ = self._remove(seq_id)
        self.placement.free(start)
        self._counters["frees"] += 1

    def can_fork(self, parent_id: int, child_final_len: int | None = None) -> bool:
        self._check_seq(parent_id)
        return self.placement.can_alloc(self._fork_R(parent_id, child_final_len))

    def _fork_R(self, parent_id: int, child_final_len: int | None) -> int:
        P, L = int(self._prompt[parent_id]), int(self._L[parent_id])
        F = int(self._F[parent_id]) if child_final_len is None else int(child_final_len)
        return max(self.request_size(SeqSpec(parent_id, P, max(F, L))), L)

    def fork(self, parent_id: int, child_id: int, child_final_len: int | None = None) -> None:
        self._check_seq(parent_id)
        R = self._fork_R(parent_id, child_final_len)
        start = self.placement.alloc(R)
        if start is None:
            raise OutOfMemory(f"no extent to fork sequence {parent_id}")
        F = int(self._F[parent_id]) if child_final_len is None else int(child_final_len)
        self._add(child_id, start, int(self._L[parent_id]), F, R, self.placement.placed_size(R),
                  int(self._prompt[parent_id]))
        self._counters["fork_copies"] += 1

    # ---- overflow: re-reserve -------------------------------------------------------------
    def _new_R(self, seq_id: int, need: int) -> int:
        P, R = int(self._prompt[seq_id]), int(self._R[seq_id])
        return min(self.max_seq_len, max(need, P + 2 * (R - P)))

    def _can_rereserve(self, pl, seq_id: int, need: int) -> bool:
        if need > self.max_seq_len:
            return False
        R2 = self._new_R(seq_id, need)
        start, A = int(self._start[seq_id]), int(self._A[seq_id])
        return pl.placed_size(R2) <= A or pl.can_grow(start, R2) or pl.can_alloc(R2)

    def can_append(self, seq_id: int, n: int = 1) -> bool:
        self._check_seq(seq_id)
        need = int(self._L[seq_id]) + n
        return need <= int(self._R[seq_id]) or self._can_rereserve(self.placement, seq_id, need)

    def _rereserve(self, seq_id: int, need: int) -> None:
        if not self._can_rereserve(self.placement, seq_id, need):
            raise OutOfMemory(f"sequence {seq_id} outgrew its reservation and no extent of {need} fits")
        R2 = self._new_R(seq_id, need)
        start, A = int(self._start[seq_id]), int(self._A[seq_id])
        pl = self.placement
        self._counters["overflows"] += 1
        if pl.placed_size(R2) <= A:
            self._set_RA(seq_id, R2, A)
        elif pl.can_grow(start, R2):
            pl.grow(start, R2)
            self._set_RA(seq_id, R2, pl.allocated[start])
            self._counters["grows_in_place"] += 1
        else:
            new = pl.alloc(R2)
            pl.free(start)
            self._set_RA(seq_id, R2, pl.placed_size(R2), new)
            self._counters["moves"] += 1
            self.num_releases += 1

    def _can_rereserve_many(self, seq_ids: list[int]) -> bool:
        if len(seq_ids) == 1:
            return self.can_append(seq_ids[0], 1)
        # several overflow in one step (rare): dry-run them in order on a copy of the placement
        pl = copy.deepcopy(self.placement)
        for s in seq_ids:
            need = int(self._L[s]) + 1
            if not self._can_rereserve(pl, s, need):
                return False
            R2 = self._new_R(s, need)
            start, A = int(self._start[s]), int(self._A[s])
            if pl.placed_size(R2) <= A:
                continue
            if pl.can_grow(start, R2):
                pl.grow(start, R2)
            else:
                pl.alloc(R2)
                pl.free(start)
        return True

    def check(self) -> None:
        super().check()
        self.placement.check()
        live = {int(self._start[s]): int(self._A[s]) for s in np.flatnonzero(self._active)}
        assert live == self.placement.allocated, "manager extents differ from the placement's"
        assert self.placement.free_slots() == self.capacity - self._sum_A, "free slots drifted"
