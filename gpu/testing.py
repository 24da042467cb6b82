"""Random paged-attention problems for tests and validation (numpy, CPU-only).

``make_case`` builds a pool with shuffled (non-contiguous) block tables, optional shared
prefix blocks (several sequences pointing at the same physical blocks, as after fork /
prefix caching), ragged context lengths (0 and 1 included when there is room) and table
entries past each sequence's last needed block filled with ``garbage`` ids that must never be
read (out of range, so a kernel reading them faults or the check fails).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagesim.gpu.executor import plan_step
from pagesim.gpu.reference import round_to


@dataclass
class Case:
    query: np.ndarray  # storage dtype (float16, or uint16 bf16 bits)
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray  # int32 [S, max_blocks], garbage past the needed entries
    context_lens: np.ndarray  # int32 [S]
    block_size: int
    dtype: str
    scale: float

    @property
    def max_context_len(self) -> int:
        return int(self.context_lens.max()) if len(self.context_lens) else 0


def ragged_lengths(rng: np.random.Generator, num_seqs: int, max_ctx: int) -> np.ndarray:
    lens = rng.integers(1, max_ctx + 1, size=num_seqs)
    if num_seqs >= 3:
        lens[0] = max_ctx
        lens[1] = 1
    if num_seqs >= 4:
        lens[2] = 0
    return lens.astype(np.int32)


def make_case(rng: np.random.Generator, *, num_seqs=4, num_heads=8, num_kv_heads=2, head_dim=64,
              block_size=16, max_ctx=100, dtype="float16", shared=True, lens=None, extra_cols=2,
              garbage=None, spare_blocks=3, scale=None) -> Case:
    lens = ragged_lengths(rng, num_seqs, max_ctx) if lens is None else np.asarray(lens, dtype=np.int32)
    need = [-(-int(L) // block_size) for L in lens]
    # shared prefix: sequences 1.. reuse sequence 0's first full blocks (up to their own length)
    share = [0] * num_seqs
    if shared and num_seqs > 1:
        full0 = int(lens[0]) // block_size
        for s in range(1, num_seqs):
            share[s] = min(full0, int(lens[s]) // block_size, 2)
    own = sum(n - sh for n, sh in zip(need, share))
    num_blocks = own + spare_blocks
    perm = rng.permutation(num_blocks)
    it = iter(perm.tolist())
    width = max(max(need, default=0) + extra_cols, 1)
    garbage = num_blocks + 1000 if garbage is None else garbage
    tables = np.full((num_seqs, width), garbage, dtype=np.int32)
    for s in range(num_seqs):
        row = [int(tables[0, j]) for j in range(share[s])] if s else []
        row += [next(it) for _ in range(need[s] - share[s])]
        tables[s, :len(row)] = row
    q = rng.standard_normal((num_seqs, num_heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((num_blocks, block_size, num_kv_heads, head_dim), dtype=np.float32)
    return Case(round_to(q, dtype), round_to(k, dtype), round_to(v, dtype), tables, lens, block_size, dtype,
                1.0 / math.sqrt(head_dim) if scale is None else scale)


class HandSteps:
    """Steps built by hand over a backend, without a scheduler (kernel tests, timing benchmarks):
    each sequence takes fresh blocks as it grows (ids in order of need), a prefill writes a
    whole prompt, a decode one token per sequence; plans come from ``gpu.executor.plan_step``."""

    def __init__(self, model, backend, *, num_blocks: int, block_size: int = 16, host_blocks: int = 0,
                 include_prep: bool = True):
        self.backend = backend
        self.block_size, self.num_blocks = block_size, num_blocks
        self.include_prep = include_prep
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}
        self.next_block = 0
        self.step = 0
        backend.setup(model, num_blocks, block_size, host_blocks)

    def _grow(self, s: int, length: int) -> None:
        table = self.tables.setdefault(s, [])
        while len(table) * self.block_size < length:
            if self.next_block >= self.num_blocks:
                raise ValueError(f"the pool's {self.num_blocks} blocks are all taken")
            table.append(self.next_block)
            self.next_block += 1
        self.lens[s] = length

    def _tables(self, ids) -> np.ndarray:
        width = max(1, max(len(self.tables[s]) for s in ids))
        out = np.full((len(ids), width), -1, np.int32)
        for r, s in enumerate(ids):
            out[r, :len(self.tables[s])] = self.tables[s]
        return out

    def plan_prefill(self, ids, lens):
        for s, n in zip(ids, lens):
            self._grow(s, int(n))
        lens = np.asarray(lens, np.int64)
        return plan_step(self.step, self.block_size, self.num_blocks, prefill_seq_ids=np.asarray(ids, np.int64),
                         prefill_tokens=lens, prefill_context=lens, prefill_tables=self._tables(ids))

    def plan_decode(self, ids):
        for s in ids:
            self._grow(s, self.lens[s] + 1)
        ctx = np.array([self.lens[s] for s in ids], np.int64)
        return plan_step(self.step, self.block_size, self.num_blocks, decode_seq_ids=np.asarray(ids, np.int64),
                         decode_context=ctx, decode_tables=self._tables(ids))

    def run(self, make_plan, *args) -> float:
        """Build the plan (``make_plan(*args)``) and run it; seconds, with the plan's preparation
        when ``include_prep`` and the backend measures real time (as the GPU executor counts it)."""
        import time
        t0 = time.perf_counter()
        plan = make_plan(*args)
        prep = time.perf_counter() - t0
        dt = float(self.backend.execute(plan))
        if self.include_prep and getattr(self.backend, "measures_time", False):
            dt += prep
        self.step += 1
        return dt

    def prefill(self, ids, lens) -> float:
        return self.run(self.plan_prefill, ids, lens)

    def decode(self, ids) -> float:
        return self.run(self.plan_decode, ids)
