"""Static slots (FasterTransformer): ``cache_k[max_batch, max_seq_len]``.

B fixed slots of ``max_seq_len`` each; slot i is the address range [i*M, (i+1)*M). A sequence
takes the lowest free slot for its whole life, so per slot R = A = M (max_seq_len)::

    capacity 64, M 16, B 4 (B*M may be < capacity: the tail is permanently free)
    slot 0         slot 1         slot 2         slot 3
    [LLLLrrr.......][LLrr..........][              ][              ]
     L token_states  r reservation (F - L)  . internal_frag (M - F)

Fork (beam search / parallel sampling) copies the parent into a free slot: no sharing.
"""

from __future__ import annotations

import heapq

import numpy as np

from pagesim.sim.errors import ConfigError, OutOfMemory
from pagesim.sim.memory._extent import ExtentManager
from pagesim.sim.memory.base import Admit, SeqSpec, settle_lane_before


@settle_lane_before
class StaticManager(ExtentManager):
    kind = "static"

    def __init__(self, capacity: int, max_seq_len: int, batch_size: int | None = None):
        if max_seq_len < 1:
            raise ConfigError(f"max_seq_len must be >= 1, got {max_seq_len} (e.g. 2048)")
        if capacity < max_seq_len:
            raise ConfigError(f"KV pool of {capacity} slots is smaller than one max_seq_len={max_seq_len} "
                              f"request; use max_seq_len <= {capacity} or a larger pool (kv_gib)")
        fit = capacity // max_seq_len
        if batch_size is None:
            batch_size = fit
        if not 1 <= batch_size <= fit:
            raise ConfigError(f"static_batch_size={batch_size} slots of {max_seq_len} do not fit in "
                              f"{capacity} slots; use static_batch_size <= {fit}")
        super().__init__(capacity, max_seq_len)
        self.batch_size = int(batch_size)
        self._free_slots = list(range(self.batch_size))  # a heap: lowest slot first

    @property
    def num_slots(self) -> int:
        """B, the number of max_seq_len slots (what the static scheduler batches up to)."""
        return self.batch_size

    def can_allocate(self, spec: SeqSpec) -> Admit:
        if spec.final_len > self.max_seq_len or spec.prompt_len > self.max_seq_len:
            return Admit.NEVER
        return Admit.OK if self._free_slots else Admit.LATER

    def allocate(self, spec: SeqSpec) -> int:
        if self.can_allocate(spec) is not Admit.OK:
            raise OutOfMemory(f"no free slot for sequence {spec.seq_id}")
        slot = heapq.heappop(self._free_slots)
        M = self.max_seq_len
        self._add(spec.seq_id, slot * M, 0, spec.final_len, M, M, spec.prompt_len)
        self._counters["allocations"] += 1
        return 0

    def can_append(self, seq_id: int, n: int = 1) -> bool:
        self._check_seq(seq_id)
        return int(self._L[seq_id]) + n <= self.max_seq_len

    def can_fork(self, parent_id: int, child_final_len: int | None = None) -> bool:
        return bool(self._free_slots)

    def fork(self, parent_id: int, child_id: int, child_final_len: int | None = None) -> None:
        self._check_seq(parent_id)
        if not self._free_slots:
            raise OutOfMemory(f"no free slot to fork sequence {parent_id}")
        slot = heapq.heappop(self._free_slots)
        F = int(self._F[parent_id]) if child_final_len is None else min(int(child_final_len), self.max_seq_len)
        M = self.max_seq_len
        self._add(child_id, slot * M, int(self._L[parent_id]), F, M, M, int(self._prompt[parent_id]))
        self._counters["fork_copies"] += 1

    def free(self, seq_id: int) -> None:
        start, _ = self._remove(seq_id)
        heapq.heappush(self._free_slots, start // self.max_seq_len)
        self._counters["frees"] += 1

    def check(self) -> None:
        super().check()
        used = {int(x) // self.max_seq_len for x in self._start[np.flatnonzero(self._active)]}
        assert len(used) == self._n and not used & set(self._free_slots), "a slot is owned twice"
        assert used | set(self._free_slots) == set(range(self.batch_size)), "a slot was lost"
