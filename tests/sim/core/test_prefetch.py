"""``prefetch_row``: compiled, a prefetch of a table row's first cache line (no load, no fault, so
any row, past the table too); interpreted, nothing. It changes no value a walk computes."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pagesim.sim.core.compile import jit
from pagesim.sim.core.compile.prefetch import prefetch_row

TABLE = np.arange(40, dtype=np.int32).reshape(10, 4)
ROWS = np.array([3, 0, 9, -7, 10**9], dtype=np.int64)


def walk(table, rows):
    """Each row's first entry where it is in the table, each row fetched ahead first."""
    total = 0
    for r in rows:
        prefetch_row(table, r)
        if 0 <= r < table.shape[0]:
            total += table[r, 0]
    return total


def test_interpreted_it_does_nothing():
    assert prefetch_row(TABLE, 3) is None
    assert walk(TABLE, ROWS) == 12 + 0 + 36


@pytest.mark.skipif(not jit.COMPILED, reason="interpreted, prefetch_row is its source")
def test_compiled_it_is_a_prefetch_for_any_row():
    jit.use_numba()
    import numba

    compiled = numba.njit(walk)
    assert compiled(TABLE, ROWS) == 12 + 0 + 36  # rows past the table, either side: no fault
    # the instruction itself (x86's prefetcht0, Arm's prfm), not a name that holds the word
    assert re.search(r"^\s*(prefetcht0|prfm)\s", compiled.inspect_asm(compiled.signatures[0]), re.M)
