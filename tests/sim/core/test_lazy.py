"""A feature's functions compiled only for the runs that call them (``jit.njit``'s ``lazy``): a
run without the feature compiles none of them, a run with it finds each at its address, and a
function reached without one stops the run with its name."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pagesim.sim.core import state
from pagesim.sim.core.compile import families, jit
from pagesim.sim.core.events import replay
from pagesim.sim.core.kv import host_tier
from pagesim.sim.core.sched.beam import BEAM_SEARCH
from pagesim.sim.core.sched.scheduler_v1 import HAS_CLIENT_TIMEOUT
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.run import prepare
from tests.sim.core.test_host_tier import test_a_block_the_gpu_evicted_is_loaded_from_the_host_tier, trace, v1

compiled_only = pytest.mark.skipif(not jit.COMPILED, reason="interpreted, every function is its source")

#: what a process prints after one tiny run: the lazy functions it compiled (or loaded), by name
COMPILED_LAZIES = """
import sys
from pagesim.sim.config import SimConfig
from pagesim.sim.core.compile import jit
from pagesim.sim.run import run_simulation
from pagesim.traces.synth import make_workload
settings = dict(prefix_caching=True, kv_offload_gib=1.0) if sys.argv[1] == "tier" else {}
cfg = SimConfig.for_system("vllm-v1", model="opt-13b", gpu="a100-80gb", **settings)
run_simulation(cfg, make_workload("sharegpt", rate=2.0, num_requests=5, seed=0))
print(sorted(fn.__name__ for fn in jit.lazy_functions_compiled()))
"""


def compiled_lazies(kind: str) -> str:
    done = subprocess.run([sys.executable, "-c", COMPILED_LAZIES, kind], capture_output=True, text=True,
                          env={**os.environ, "PAGESIM_JIT": "numba"}, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@compiled_only
def test_a_run_without_the_tier_compiles_none_of_its_functions_and_a_run_with_it_its_own():
    """A vllm-v1 run of the default configuration needs no lazy function of a feature, only
    the two its scheduler's entry calls by reference (its prefix caching's allocation, on by
    default, and its preemption); one with a host tier (with prefix caching, as the tier asks)
    those whose ``lazy`` says a tier's runs call them too, every other (the groups', priority's,
    a disaggregated pool's, the other price models') left uncompiled."""
    entry = ["allocate_cached_blocks", "preempt_family"]
    assert compiled_lazies("plain") == str(entry)
    rules = {getattr(rule, "py_func", rule) for rule in (host_tier.with_tier, host_tier.asynchronous_loads)}
    tier = [fn.__name__ for fn, (_, needed) in jit._LAZY.items() if needed in rules]
    assert len(tier) == 10
    assert compiled_lazies("tier") == str(sorted(tier + entry))


def test_the_runs_that_need_each_lazy_function_are_those_of_its_feature():
    """Each function's ``lazy`` read on configurations worked by hand (``config``'s slots)."""
    config = [0] * state.NUM_CONFIG
    needed = {fn.__name__: rule for fn, (_, rule) in jit._LAZY.items()}
    assert not any(rule(config) for rule in needed.values())  # the default: none
    config[state.HOST_BLOCKS] = 8
    assert needed["store"](config) and needed["reserved_blocks"](config) and not needed["free_groups"](config)
    config[state.HOST_BLOCKS], config[state.DISAGG_ROLE] = 0, state.DECODE_SIDE
    assert needed["reserved_blocks"](config) and needed["next_load_end"](config) and not needed["store"](config)
    assert needed["allocate_for_transfer"](config)
    config[state.DISAGG_ROLE], config[state.STATE_GROUPS] = 0, 1
    assert needed["free_groups"](config) and needed["mamba_aligned_split"](config)
    config[state.STATE_GROUPS], config[state.SCHEDULING_POLICY] = 0, 1  # a policy but the first (FCFS)
    assert needed["chosen_waiting_position"](config) and needed["chosen_victim"](config)
    assert not needed["free_groups"](config)
    config[state.SCHEDULING_POLICY], config[state.SPEC_TOKENS] = 0, 3
    assert needed["draft_time"](config) and not needed["follow_record"](config)
    config[state.SPEC_TOKENS], config[BEAM_SEARCH] = 0, 1
    assert needed["follow_record"](config) and not needed["draft_time"](config)
    config[BEAM_SEARCH], config[HAS_CLIENT_TIMEOUT] = 0, 1
    assert needed["abort_timed_out"](config) and not needed["record_swap"](config)
    config[HAS_CLIENT_TIMEOUT], config[state.EXTERNAL_STEPS] = 0, 1
    config[state.MANAGER_KIND] = state.CONTIGUOUS  # (a contiguous extent's swaps are not listed)
    assert not needed["record_swap"](config)
    config[state.MANAGER_KIND] = state.PAGED
    assert needed["record_swap"](config) and not any(rule(config) for name, rule in needed.items()
                                                     if name != "record_swap")
    # what a scheduler's entry calls by reference (jit.njit's lazy): its family's every run
    config[state.EXTERNAL_STEPS], config[state.SCHEDULER_KIND] = 0, state.V1
    config[state.FAMILY_TRAITS] = families.TRAITS[state.V1]
    assert needed["preempt_family"](config) and not needed["allocate_cached_blocks"](config)
    config[state.PREFIX_CACHING] = 1
    assert needed["allocate_cached_blocks"](config) and not needed["checkpoint"](config)
    config[state.SCHEDULER_KIND] = state.SGLANG  # (its radix tree is another cache)
    config[state.FAMILY_TRAITS] = families.TRAITS[state.SGLANG]
    assert needed["checkpoint"](config) and not needed["allocate_cached_blocks"](config)
    assert not needed["preempt_family"](config)
    config[state.SCHEDULER_KIND] = state.CONTINUOUS  # vLLM v0's prefix caching
    config[state.FAMILY_TRAITS] = families.TRAITS[state.CONTINUOUS]
    assert needed["allocate_cached_blocks"](config) and not needed["preempt_family"](config)


@compiled_only
def test_a_lazy_function_reached_without_its_address_stops_the_run_with_its_name(monkeypatch):
    """The host tier's lookup, said not to be needed, is reached by a tier's run: the run stops
    with the function named, where it would have called address 0."""
    monkeypatch.setenv("PAGESIM_JIT", "numba")
    monkeypatch.setattr(replay, "_ENTRIES", {})
    count_hits = getattr(host_tier.count_hits, "py_func", host_tier.count_hits)
    monkeypatch.setitem(jit._LAZY, count_hits, (jit._LAZY[count_hits][0], lambda config: False))
    cfg = v1(32, host_blocks=16)
    t = trace((0.0, 12, 1, (1, 2, 3)), (1.0, 12, 1, (1, 2, 3)))
    with pytest.raises(RuntimeError, match=r"host_tier\.count_hits called, but not compiled for this run"):
        replay.run(prepare(cfg, t).state, None, None)


@compiled_only
def test_a_running_loop_leaves_its_copy_of_the_state_where_lazy_functions_read_it(monkeypatch):
    """The loop writes the address of its copy of the state (``by_reference.py``) into the slot
    the lazy functions' calls read while it runs: after a compiled run it is still there."""
    monkeypatch.setenv("PAGESIM_JIT", "numba")
    monkeypatch.setattr(replay, "_ENTRIES", {})
    s = prepare(v1(32, host_blocks=16), trace((0.0, 12, 1, (1, 2, 3)), (1.0, 12, 1, (1, 2, 3)))).state
    s.config[state.STATE_ADDRESS] = 0
    s, _ = replay.run(s, None, None)
    assert s.config[state.STATE_ADDRESS] != 0


@compiled_only
def test_a_clusters_loop_leaves_no_replica_pointing_at_its_gone_copy_of_the_state(monkeypatch):
    """A cluster's loop calls each replica's loop, whose copy of the state is gone when it
    returns, and may then call a replica's lazy functions itself: ``loop.call_engine`` clears
    the replica's slot after each call, so that those calls stop unless their caller pins the
    replica (``by_reference.py``)."""
    from pagesim.sim import cluster
    from tests.sim.helpers import cfg_for, rand_trace

    monkeypatch.setenv("PAGESIM_JIT", "numba")
    monkeypatch.setattr(replay, "_ENTRIES", {})
    replicas = []
    run = cluster.Cluster.run

    def run_and_keep(self):
        wall = run(self)
        replicas.extend(self.replicas)
        return wall

    monkeypatch.setattr(cluster.Cluster, "run", run_and_keep)
    cluster.run_cluster(cfg_for("vllm-v1", scheduling_policy="priority"), rand_trace(0, n=40), 2, "round-robin")
    assert len(replicas) == 2 and all(s.config[state.STATE_ADDRESS] == 0 for s in replicas)


@compiled_only
def test_a_lazy_function_called_on_a_state_not_pinned_stops_the_run_naming_it():
    """Compiled code outside a loop (a cluster's, between a replica's runs) pins the replica's
    state before it calls the replica's functions (``by_reference.pin``): a lazy function reached
    without it stops the run with its name, where it would have read a copy gone with its
    function; pinned, it reads the state."""
    from pagesim.sim.core.compile import by_reference
    from pagesim.sim.core.sched import policies, policy_priority
    from tests.sim.helpers import cfg_for, rand_trace

    jit.use_numba()
    numba = jit.numba
    s = prepare(cfg_for("vllm-v1", scheduling_policy="priority"), rand_trace(0, n=4)).state
    jit.set_lazy_addresses(s, numba.typeof(s))

    @numba.njit
    def unpinned(s):
        return policies.chosen_waiting_position(s, 0, False)

    @numba.njit
    def pinned(s):
        by_reference.pin(s)
        position = policies.chosen_waiting_position(s, 0, False)
        by_reference.unpin(s)
        return position

    with pytest.raises(RuntimeError, match=r"policies\.chosen_waiting_position called on a state not pinned"):
        unpinned(s)
    assert pinned(s) == jit.interpreted(policy_priority.waiting_position)(s, 0, False)
    assert s.config[state.STATE_ADDRESS] == 0


@compiled_only
def test_an_entry_is_written_again_only_where_what_it_compiles_changed(monkeypatch, tmp_path):
    """A lazy function's entry is a file of its own (``jit.lazy_entry_dispatcher``), which numba
    caches by its time and size: written with the digest of the sources it compiles, its time
    set from that digest; written again unchanged (by another process), text and time are the
    same, and the code cached stays fresh; with another digest (an edit of a source), both change."""
    from pagesim.sim.core.sched import policy_priority

    jit.use_numba()
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "_LAZY_ENTRY", {})
    holding = getattr(policy_priority.holding_position, "py_func", policy_priority.holding_position)
    jit.lazy_entry_dispatcher(holding)
    path = tmp_path / "pagesim-lazy" / "pagesim_lazy_sched_policy_priority_holding_position.py"
    text, stamp = path.read_text(), path.stat().st_mtime
    assert "lazy function pagesim.sim.core.sched.policy_priority.holding_position" in text
    assert jit._lazy_digest(holding) in text and "def entry(ref, like, i):" in text
    assert "    return body(state_at(ref, like), i)" in text
    path.unlink()  # another process writes it again, unchanged
    monkeypatch.setattr(jit, "_LAZY_ENTRY", {})
    jit.lazy_entry_dispatcher(holding)
    assert (path.read_text(), path.stat().st_mtime) == (text, stamp)
    monkeypatch.setattr(jit, "_LAZY_ENTRY", {})
    monkeypatch.setattr(jit, "_lazy_digest", lambda fn: "0" * 16)
    jit.lazy_entry_dispatcher(holding)
    assert path.read_text() != text and path.stat().st_mtime != stamp


#: a process that compiles one lazy function for a v1 state and prints whether numba's cache had it
ENTRY_CACHED = """
from pagesim.sim.core.compile import jit
from pagesim.sim.core.sched import policy_priority
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, rand_trace
jit.use_numba()
s = initial_state(cfg_for("vllm-v1"), rand_trace(0, n=4))
holding = policy_priority.holding_position.py_func
jit.lazy_compiled(holding, jit.numba.typeof(s))
print(sum(jit._LAZY_ENTRY[holding].stats.cache_hits.values()))
"""


@compiled_only
def test_a_second_process_loads_an_entry_from_numbas_cache(tmp_path):
    """The first process compiles a lazy function's entry, the second finds it in the cache."""
    from tests.sim.helpers import TESTS_ROOT, subprocess_path

    env = {**os.environ, "PAGESIM_JIT": "numba", "NUMBA_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": subprocess_path()}
    hits = [subprocess.run([sys.executable, "-c", ENTRY_CACHED], capture_output=True, text=True, env=env,
                           cwd=TESTS_ROOT, timeout=600) for _ in range(2)]
    assert [done.returncode for done in hits] == [0, 0], hits[-1].stderr[-2000:]
    assert [done.stdout.split()[-1] for done in hits] == ["0", "1"]


@compiled_only
def test_the_tier_run_by_hand_through_the_addresses():
    """The host tier's run worked by hand (``test_host_tier.py``), its functions called at their
    addresses: the same figures."""
    test_a_block_the_gpu_evicted_is_loaded_from_the_host_tier()


def test_a_lazy_function_declares_its_scalars_and_result():
    def unannotated(s, i):
        return i

    def stateless(i: int) -> int:
        return i

    with pytest.raises(TypeError, match=r"unannotated: declare i, return as one of int, float, bool, None"):
        njit(lazy=lambda config: True)(unannotated)
    with pytest.raises(TypeError, match=r"stateless: a lazy function takes the state first, as s"):
        njit(lazy=lambda config: True)(stateless)
    assert unannotated not in jit._LAZY and stateless not in jit._LAZY


def test_the_slots_are_enough_for_every_lazy_function():
    width = {f.name: f.width for f in state.TABLES["config"]}["LAZY_ADDRESSES"]
    assert 0 < len(jit._LAZY) <= width
    assert sorted(slot for slot, _ in jit._LAZY.values()) == list(range(len(jit._LAZY)))


#: the lazy functions' names in their slots' order, in a process that imports argv[1] first
SLOTS = """
import importlib, sys
importlib.import_module(sys.argv[1])
from pagesim.sim.core.compile import jit
jit.fix_lazy_slots()
print(" ".join(f"{fn.__module__}.{fn.__qualname__}" for fn in sorted(jit._LAZY, key=lambda fn: jit._LAZY[fn][0])))
"""


def test_the_slots_are_numbered_by_name_whatever_a_process_imports_first():
    """A process that imports ``kv/extent.py`` first declares the lazy functions in another
    order than one that imports the loop first, while both run machine code with the slots'
    indices in it (numba's cache, the extension modules): ``jit.fix_lazy_slots`` numbers them by
    name, the whole core imported first."""
    from tests.sim.helpers import TESTS_ROOT, subprocess_path

    env = dict(os.environ, PYTHONPATH=subprocess_path())
    orders = [subprocess.run([sys.executable, "-c", SLOTS, first], env=env, cwd=TESTS_ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
              for first in ("pagesim.sim.core.kv.extent", "pagesim.sim.core.sched.scheduler_v1",
                            "pagesim.sim.core.events.loop")]
    assert orders[0] == orders[1] == orders[2] == sorted(orders[0]) and len(orders[0]) == len(jit._LAZY)


def test_every_cache_groups_digest_reads_the_slots(monkeypatch):
    """A lazy function declared in one group's file moves the slots after it in every group's
    code: every digest (numba's cache keys, the extension modules' names) reads them."""
    jit.fix_lazy_slots()
    groups = (None, *jit._GROUP_FILES)
    before = {group: jit.sources_digest(group=group) for group in groups}
    first, second = sorted(jit._LAZY, key=lambda fn: jit._LAZY[fn][0])[:2]
    monkeypatch.setitem(jit._LAZY, first, (1, jit._LAZY[first][1]))
    monkeypatch.setitem(jit._LAZY, second, (0, jit._LAZY[second][1]))
    assert all(jit.sources_digest(group=group) != before[group] for group in groups)


@compiled_only
def test_a_lazy_functions_call_casts_its_arguments_to_their_declared_types_only_without_a_loss():
    """Priority's place in the queue declares ``i: int, returning: bool``: a call giving an int32
    and a bool compiles (each cast safely), one giving a float for ``i`` is refused at typing,
    naming the parameter; the call returns the declared int (``jit._lazy_call``)."""
    import numba
    import numpy as np
    from numba.core.errors import TypingError

    from pagesim.sim.core.sched import policies
    from tests.sim.helpers import cfg_for, rand_trace

    s = prepare(cfg_for("vllm-v1", scheduling_policy="priority"), rand_trace(0, n=4)).state
    position = policies.chosen_waiting_position

    def given(i):
        caller = numba.njit(lambda s: position(s, i, False))
        caller.compile((numba.typeof(s),))
        return caller.nopython_signatures[0].return_type

    assert given(np.int32(1)) == numba.types.int64
    with pytest.raises(TypingError, match=r"waiting_position's i is declared int64, given float64"):
        given(1.5)


def test_every_entry_is_each_lazy_function_but_the_interfaces_and_every_policys_implementations():
    """What ``pagesim.sim.precompile --warm`` compiles beside the families (jit.every_entry): no
    interface (it has no code: its slot holds a policy's function), and the three functions of
    every policy but the inlined FCFS."""
    from pagesim.sim.core.sched import policies, policy_priority, policy_sjf

    names = {f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}" for fn in jit.every_entry()}
    assert not {name for name in names if name.startswith("policies.")}
    for module in (policy_priority, policy_sjf):
        for name in ("waiting_position", "holding_position", "victim"):
            assert f"{module.__name__.rsplit('.', 1)[-1]}.{name}" in names
    assert jit.is_interface(policies.chosen_victim) and not jit.is_interface(policy_sjf.victim)
