"""Each scheduler family's loop holds only the managers the family runs (``sim/core/kv/memory.py``:
``free``, ``joined_decode`` and ``memory_categories`` take the loop's family's traits, a constant there,
and numba prunes the other managers' branches). What that assumes, ``memory.MANAGERS``, is
checked on every state built: a state whose manager its family's loop compiled out is refused.
A preemption, a call, is compiled once per family that preempts (``lifecycle.preempt_for``)
with the same pruning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pagesim.sim.core import state
from pagesim.sim.core.compile import families, jit
from pagesim.sim.core.kv import memory
from pagesim.sim.run import initial_state
from pagesim.sim.systems import SYSTEMS
from tests.sim.helpers import TESTS_ROOT, cfg_for, rand_trace, subprocess_path


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_system_runs_a_manager_its_family_keeps(system):
    s = initial_state(cfg_for(system), rand_trace(0, n=8))
    traits = int(s.config[state.FAMILY_TRAITS])
    assert traits == families.TRAITS[int(s.config[state.SCHEDULER_KIND])]
    kept = [kind for trait, kinds in memory.MANAGERS.items() if traits & trait for kind in kinds]
    assert kept == [int(s.config[state.MANAGER_KIND])]


def test_the_pairs_by_hand():
    assert memory.MANAGERS == {families.BLOCK_TABLE: (state.PAGED,), families.EXTENTS: (state.CONTIGUOUS,),
                               families.RADIX_TREE: (state.RADIX,)}
    managers = families.BLOCK_TABLE | families.EXTENTS | families.RADIX_TREE
    assert {family: traits & managers for family, traits in families.TRAITS.items()} == {
        state.CONTINUOUS: families.BLOCK_TABLE, state.CONTINUOUS_CONTIGUOUS: families.EXTENTS,
        state.STATIC: families.EXTENTS, state.V1: families.BLOCK_TABLE, state.SGLANG: families.RADIX_TREE}


@pytest.mark.parametrize("family, manager", [(state.V1, state.CONTIGUOUS), (state.STATIC, state.PAGED),
                                             (state.CONTINUOUS, state.RADIX), (state.SGLANG, state.PAGED),
                                             (state.CONTINUOUS, state.CONTIGUOUS),
                                             (state.CONTINUOUS_CONTIGUOUS, state.PAGED)])
def test_a_manager_the_family_compiled_out_is_refused(family, manager):
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.FAMILY_TRAITS], config[state.MANAGER_KIND] = families.TRAITS[family], manager
    with pytest.raises(ValueError, match="does not run manager"):
        memory.check_family(config)


@pytest.mark.parametrize("family, manager", [(state.CONTINUOUS, state.PAGED),
                                             (state.CONTINUOUS_CONTIGUOUS, state.CONTIGUOUS),
                                             (state.STATIC, state.CONTIGUOUS), (state.SGLANG, state.RADIX)])
def test_a_manager_the_family_runs_passes(family, manager):
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.FAMILY_TRAITS], config[state.MANAGER_KIND] = families.TRAITS[family], manager
    memory.check_family(config)


#: compiled from an empty cache in one process, vLLM v0's paths first: after each stage, how many
#: times each manager's function was compiled (numba's signatures: a function compiled into
#: nothing that ran is not compiled at all)
COMPILED_PATHS = """
import json
from pagesim.sim.core.compile import jit
from pagesim.sim.core.compile.families import TRAITS
from pagesim.sim.core.kv import kv_cache, placement, prefix_cache, radix_cache
from pagesim.sim.core.sched import lifecycle
from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS, SGLANG, STATIC, V1
# each family's traits, as its code passes them (constants numba prunes by)
T_CONTINUOUS, T_CONTIGUOUS, T_STATIC = TRAITS[CONTINUOUS], TRAITS[CONTINUOUS_CONTIGUOUS], TRAITS[STATIC]
T_SGLANG, T_V1 = TRAITS[SGLANG], TRAITS[V1]
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, rand_trace
jit.use_numba()
numba = jit.numba
WATCHED = {"radix": (radix_cache.cache_finished_req, radix_cache.insert), "contiguous": (placement.release,),
           "groups": (kv_cache.free_groups, kv_cache.take_group_blocks, kv_cache.take_state_blocks,
                      kv_cache.allocate_group_hits, prefix_cache.register_group_blocks)}

@numba.njit
def other_families_paged_paths(s, i, n):
    # what vLLM v0 (and static batching, SGLang) reach of the paged manager but a preemption
    lifecycle.prefill(s, i, n, T_CONTINUOUS)
    lifecycle.prefill(s, i, n, T_STATIC)
    lifecycle.prefill(s, i, n, T_SGLANG)
    kv_cache.take_decode_slot(s, i)
    return kv_cache.allocate_cached(s, i, 0, n)

@numba.njit
def prefills_without_keys(s, i, n, now):
    # the contiguous family's and static batching's prefills: no prefix caching's keys
    lifecycle.prefill(s, i, n, T_CONTIGUOUS)
    lifecycle.prefill(s, i, n, T_STATIC)

@numba.njit
def ends_without_fork(s, i, n, now):
    # a step's end in vLLM v1's and the contiguous family's loops: no fork of parallel sampling
    # (vLLM v0's paged family's alone; vLLM v1 fans n out into requests)
    lifecycle.complete_step(s, now, T_V1)
    lifecycle.complete_step(s, now, T_CONTIGUOUS)

def pruned(function):
    # how many times prefix caching's key registration and parallel sampling's fork are compiled
    # once function is (numba's signatures)
    s = initial_state(cfg_for("vllm-v1", prefix_caching=True), rand_trace(0, n=8))
    function.compile((function.typeof_pyval(s), numba.int64, numba.int64, numba.float64))
    return {"keys": len(prefix_cache.register_full_blocks.signatures), "fork": len(kv_cache.fork.signatures)}

def compile_for(function, system, ints):
    s = initial_state(cfg_for(system, prefix_caching=True), rand_trace(0, n=8))
    if function.py_func in jit._LAZY:  # vLLM v1's preemption: compiled at its address (jit.njit's lazy)
        jit.lazy_compiled(function.py_func, numba.typeof(s))
    else:
        function.compile((function.typeof_pyval(s), *[numba.int64] * ints))
    # a lazy function (jit.njit's lazy) is compiled at its address, not where compiled code names it
    lazies = jit.lazy_functions_compiled()
    times = lambda f: int(f.py_func in lazies) if f.py_func in jit._LAZY else len(f.signatures)
    return {name: sum(times(f) for f in fs) for name, fs in WATCHED.items()}

# first: the keys before anything else compiles them (a paged prefill does)
print(json.dumps([pruned(prefills_without_keys), compile_for(lifecycle.preempt_continuous, "vllm", 1),
                  compile_for(lifecycle.preempt_contiguous, "orca-max", 1),
                  compile_for(other_families_paged_paths, "vllm", 2),
                  compile_for(lifecycle.preempt_v1, "vllm-v1", 1), pruned(ends_without_fork)]))
"""


@pytest.mark.skipif(not jit.COMPILED, reason="numba is not installed")
def test_each_familys_paths_compile_its_managers_alone(tmp_path):
    """Compiled from an empty cache: vLLM v0's and Orca's preemption over paged memory holds
    neither the contiguous manager's release nor SGLang's radix tree (it was a call taking the
    family: numba compiled every branch), over contiguous extents the contiguous manager's
    release alone (counted from here on: the numbers add up); a step's end in vLLM v1's and the
    contiguous family's loops holds no fork of parallel sampling (vLLM v0's paged family's
    alone), and the contiguous family's and static batching's prefills no registration of prefix
    caching's keys (their prefills first, the steps' ends last); the paged paths the other
    families share with vLLM v1 (a prefill's keys, a decode slot, a cached allocation) hold none
    of vLLM v1's KV cache groups' code (``traits & CACHES_COMPUTED`` in
    ``kv_cache.compute_tokens_seq``, ``traits & KV_GROUPS`` in ``memory.free``; ``grow_table``,
    ``allocate_hits``); vLLM v1's preemption (compiled at its
    address: ``jit.njit``'s lazy) holds neither the radix tree nor the contiguous manager, and its
    groups' release is called at an address, compiled only for the runs with groups (lazy too)."""
    env = dict(os.environ, PYTHONPATH=subprocess_path(), NUMBA_CACHE_DIR=str(tmp_path))
    env.pop("PAGESIM_JIT", None)
    out = subprocess.run([sys.executable, "-c", COMPILED_PATHS], check=True, env=env, cwd=TESTS_ROOT,
                         capture_output=True, text=True)
    keys, v0_preempt, orca_preempt, v0_paths, v1_preempt, fork = json.loads(out.stdout)
    assert keys == {"keys": 0, "fork": 0}
    assert fork["fork"] == 0  # (the keys by then compiled by the paged paths)
    assert v0_preempt == {"radix": 0, "contiguous": 0, "groups": 0}
    assert orca_preempt == {"radix": 0, "contiguous": 1, "groups": 0}
    assert v0_paths == {"radix": 0, "contiguous": 1, "groups": 0}
    assert v1_preempt == {"radix": 0, "contiguous": 1, "groups": 0}
