"""Each scheduler family's loop holds only the managers the family runs (``sim/core/memory.py``:
``free``, ``joined_decode`` and ``memory_categories`` take the loop's family, a constant there,
and numba prunes the other managers' branches). What that assumes, ``memory.MANAGERS``, is
checked on every state built: a state whose manager its family's loop compiled out is refused.
A preemption, a call, is compiled once per family that preempts (``lifecycle.preempt_for``)
with the same pruning."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pagesim.sim.core import jit, memory, state
from pagesim.sim.run import initial_state
from pagesim.sim.systems import SYSTEMS
from tests.sim.helpers import TESTS_ROOT, cfg_for, rand_trace, subprocess_path


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


PREEMPT = """
import sys
from pagesim.sim.core import jit, lifecycle, placement, radix_cache
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, rand_trace
jit.use_numba()
preempt = getattr(lifecycle, sys.argv[1])
s = initial_state(cfg_for(sys.argv[2]), rand_trace(0, n=8))
preempt.compile((preempt.typeof_pyval(s), jit.numba.int64))
print(len(radix_cache.cache_finished_req.signatures) + len(radix_cache.insert.signatures),
      len(placement.release.signatures))
"""


@pytest.mark.skipif(not jit.COMPILED, reason="numba is not installed")
@pytest.mark.parametrize("preempt, system, contiguous", [("preempt_v1", "vllm-v1", 0),
                                                         ("preempt_continuous", "vllm", 1)])
def test_a_familys_preemption_compiles_its_managers_alone(preempt, system, contiguous, tmp_path):
    """Compiled from an empty cache, vLLM v1's preemption holds no release of SGLang's radix tree
    nor of the contiguous manager (placement.release), vLLM v0's and Orca's the contiguous one
    but not the radix tree's (it was a call taking the family: numba compiled every branch)."""
    env = dict(os.environ, PYTHONPATH=subprocess_path(), NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("PAGESIM_JIT", None)
    out = subprocess.run([sys.executable, "-c", PREEMPT, preempt, system], check=True, env=env, cwd=TESTS_ROOT,
                         capture_output=True, text=True)
    assert out.stdout.split() == ["0", str(contiguous)]
