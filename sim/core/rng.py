"""Draws from the run's numpy ``Generator`` (``sim/run.py`` seeds it), the same numbers whether
the core is compiled or interpreted.

numba compiles a ``Generator`` passed in (it sits in the state, ``Core.rng``) to calls of its
bit generator, sharing its state: ``rng.random()`` draws as numpy's does. numba's
``rng.integers`` makes a one-element array even for one number, which the core cannot (it is
compiled without reference counting, ``jit.py``), so :func:`below` is ``int(rng.integers(n))``
in CPython and, compiled, the scalar that numba's ``integers`` puts into that array: numpy's
bounded draw (Lemire's method over 32-bit words for ``n`` < 2**32; none for ``n`` = 1).
"""

from __future__ import annotations

from pagesim.sim.core.compile.jit import on_numba_load


def below(rng, n):
    """A uniform integer in ``[0, n)`` (``n`` >= 1), as ``rng.integers(n)`` draws it."""
    return int(rng.integers(n))


@on_numba_load
def _compiled_below():
    import numpy as np
    from numba.extending import overload
    from numba.np.random.random_methods import buffered_bounded_lemire_uint32

    @overload(below)
    def _below(rng, n):
        def impl(rng, n):
            # numba's integers(0, n) for int64 (random_bounded_uint64_fill): rng = n - 1,
            # 0 draws nothing, below 0xFFFFFFFF one bounded 32-bit draw (the core's n, a
            # sequence count, is far below 2**32)
            if n <= 1:
                return 0
            return np.int64(buffered_bounded_lemire_uint32(rng.bit_generator, np.uint32(n - 1)))
        return impl
