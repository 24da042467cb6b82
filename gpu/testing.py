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
