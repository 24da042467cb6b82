"""Block tables for the GPU kernels, built from a memory manager's snapshot.

``build_block_tables(snapshot)`` turns a :class:`sim.memory.base.BlockTableSnapshot`
(block_size, num_blocks, tables: seq_id -> [block ids], context_lens: seq_id -> L) into the
dense int32 arrays the kernel takes. Pure numpy (tested on CPU); ``to_device`` and
``allocate_kv_pool`` need CuPy.

Padding: rows are padded with ``pad`` (default -1) up to the longest table. The kernel reads
only the first ceil(L / block_size) entries of a row, so padding is never dereferenced; -1
makes any bug that would read it fault loudly instead of silently reading block 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pagesim.sim.errors import ConfigError


@dataclass
class BlockTables:
    block_tables: np.ndarray  # [num_seqs, max_blocks_per_seq] int32
    context_lens: np.ndarray  # [num_seqs] int32
    seq_ids: np.ndarray  # [num_seqs] int64, row order
    max_context_len: int
    block_size: int
    num_blocks: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    def row_of(self, seq_id: int) -> int:
        hits = np.flatnonzero(self.seq_ids == seq_id)
        if not len(hits):
            raise KeyError(seq_id)
        return int(hits[0])

    def slot_mapping(self, seq_id: int, start: int, end: int) -> np.ndarray:
        """Slots (block * block_size + offset) of token positions [start, end) of a sequence."""
        row = self.block_tables[self.row_of(seq_id)]
        pos = np.arange(start, end, dtype=np.int64)
        return row[pos // self.block_size].astype(np.int64) * self.block_size + pos % self.block_size


def build_block_tables(snapshot, seq_ids: Sequence[int] | None = None, *, pad: int = -1,
                       context_lens: dict[int, int] | None = None) -> BlockTables:
    """Dense tables for ``seq_ids`` (default: every sequence in the snapshot, sorted).

    ``context_lens`` overrides the snapshot's lengths (e.g. the decode step's length including
    the new token). Raises ConfigError when a table is too short for its length or holds a
    block id outside [0, num_blocks).
    """
    bs, nb = int(snapshot.block_size), int(snapshot.num_blocks)
    if bs < 1:
        raise ConfigError(f"block_size must be >= 1, got {bs}")
    ids = sorted(snapshot.tables) if seq_ids is None else [int(s) for s in seq_ids]
    lens_src = snapshot.context_lens if context_lens is None else context_lens
    rows = []
    lens = np.zeros(len(ids), dtype=np.int32)
    for i, sid in enumerate(ids):
        if sid not in snapshot.tables:
            raise ConfigError(f"sequence {sid} has no block table in the snapshot")
        t = list(snapshot.tables[sid])
        L = int(lens_src.get(sid, 0))
        if L < 0:
            raise ConfigError(f"sequence {sid}: negative context length {L}")
        if -(-L // bs) > len(t):
            raise ConfigError(f"sequence {sid}: {L} tokens need {-(-L // bs)} blocks of {bs}, table has {len(t)}")
        if t and (min(t) < 0 or max(t) >= nb):
            raise ConfigError(f"sequence {sid}: block id outside [0, {nb}) in its table")
        rows.append(t)
        lens[i] = L
    width = max((len(r) for r in rows), default=0)
    width = max(width, 1)
    tab = np.full((len(ids), width), pad, dtype=np.int32)
    for i, r in enumerate(rows):
        tab[i, :len(r)] = r
    return BlockTables(tab, lens, np.asarray(ids, dtype=np.int64), int(lens.max()) if len(lens) else 0, bs, nb)


def to_device(tables: BlockTables):
    """(block_tables, context_lens) as CuPy int32 arrays."""
    from pagesim.gpu.device import require_cupy
    cp = require_cupy("to_device")
    return cp.asarray(tables.block_tables), cp.asarray(tables.context_lens)


def kv_pool_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, int, int, int]:
    return (int(num_blocks), int(block_size), int(num_kv_heads), int(head_dim))


def allocate_kv_pool(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str = "float16",
                     *, zero: bool = True):
    """(key_cache, value_cache) CuPy arrays [num_blocks, block_size, num_kv_heads, head_dim].

    bf16 pools are uint16 arrays of raw bits (CuPy has no bfloat16); pass ``dtype="bfloat16"``
    to the kernels with them.
    """
    from pagesim.gpu.device import require_cupy
    cp = require_cupy("allocate_kv_pool")
    if dtype not in ("float16", "bfloat16"):
        raise ConfigError(f"KV dtype must be float16 or bfloat16, got {dtype}")
    shape = kv_pool_shape(num_blocks, block_size, num_kv_heads, head_dim)
    st = cp.float16 if dtype == "float16" else cp.uint16
    alloc = cp.zeros if zero else cp.empty
    return alloc(shape, dtype=st), alloc(shape, dtype=st)
