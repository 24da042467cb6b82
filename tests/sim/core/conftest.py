"""The core's tests call its functions directly, compiled as a run's loop is: numba is loaded
here, where a run would load it only when it needs it (``sim/core/compile/jit.py``)."""

from pagesim.sim.core.compile import jit

jit.use_numba()
