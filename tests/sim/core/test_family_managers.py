"""Each scheduler family's loop holds only the managers the family runs (``sim/core/memory.py``:
``free``, ``joined_decode`` and ``memory_categories`` take the loop's family, a constant there,
and numba prunes the other managers' branches). What that assumes, ``memory.MANAGERS``, is
checked on every state built: a state whose manager its family's loop compiled out is refused."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.core import memory, state
from pagesim.sim.run import initial_state
from pagesim.sim.systems import SYSTEMS
from tests.sim.helpers import cfg_for, rand_trace


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_runs_a_manager_its_family_keeps(system):
    s = initial_state(cfg_for(system), rand_trace(0, n=8))
    assert int(s.config[state.MANAGER_KIND]) in memory.MANAGERS[int(s.config[state.SCHEDULER_KIND])]


def test_the_pairs_by_hand():
    assert memory.MANAGERS == {state.CONTINUOUS: (state.PAGED, state.CONTIGUOUS), state.STATIC: (state.CONTIGUOUS,),
                               state.V1: (state.PAGED,), state.SGLANG: (state.RADIX,)}


@pytest.mark.parametrize("family, manager", [(state.V1, state.CONTIGUOUS), (state.STATIC, state.PAGED),
                                             (state.CONTINUOUS, state.RADIX), (state.SGLANG, state.PAGED)])
def test_a_manager_the_family_compiled_out_is_refused(family, manager):
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.SCHEDULER_KIND], config[state.MANAGER_KIND] = family, manager
    with pytest.raises(ValueError, match="does not run manager"):
        memory.check_family(config)


@pytest.mark.parametrize("family, manager", [(state.CONTINUOUS, state.PAGED), (state.CONTINUOUS, state.CONTIGUOUS),
                                             (state.STATIC, state.CONTIGUOUS), (state.SGLANG, state.RADIX)])
def test_a_manager_the_family_runs_passes(family, manager):
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.SCHEDULER_KIND], config[state.MANAGER_KIND] = family, manager
    memory.check_family(config)
