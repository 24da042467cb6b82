"""The core's loops written ahead of time into extension modules (sim/core/compile/aot.py): the same
records as numba's dispatcher, the engine's and the cluster's, a run that finds the engine's
imports no numba, and a module that is stale, failed or being built by another process is
never loaded or rebuilt."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.cluster import run_cluster
from pagesim.sim.core import state
from pagesim.sim.core.compile import aot, jit
from pagesim.sim.core.events import loop, replay
from pagesim.sim.core.events.replay import array_kind
from pagesim.sim.run import initial_state, run_simulation
from pagesim.sim.terminal import NOTICE_KEY
from tests.sim.helpers import OPT13B_SLOT, TESTS_ROOT, cfg_for, rand_trace, subprocess_path, write_table_profile

F = (aot.CORE, state.CONTINUOUS)  # vllm's family's engine loop: the module the default run builds
CAN_BUILD = (jit.COMPILED and importlib.util.find_spec("setuptools") is not None
             and shutil.which(sysconfig.get_config_var("CC").split()[0] if sysconfig.get_config_var("CC") else "cc"))


def kinds_of(cfg, trace):
    return (array_kind(initial_state(cfg, trace)),)  # the loop's one argument


@pytest.fixture(autouse=True)
def modules_on(monkeypatch):
    """The modules loaded and written, as a user's runs do: not the whole suite's
    ``PAGESIM_JIT=numba`` (tests/conftest.py); written by the run that compiled its loop too
    (``PAGESIM_AOT_WAIT=1``, as the benchmarks have it), so that a cold cache builds them."""
    monkeypatch.delenv("PAGESIM_JIT", raising=False)
    monkeypatch.setenv("PAGESIM_AOT_WAIT", "1")


@pytest.fixture(scope="module")
def module_built():
    """The module for the default state's kinds, built by a run as a first run builds it."""
    if not CAN_BUILD:
        pytest.skip("numba, setuptools or a C compiler missing: runs load numba's cache instead")
    with pytest.MonkeyPatch.context() as m:
        m.delenv("PAGESIM_JIT", raising=False)
        m.setenv("PAGESIM_AOT_WAIT", "1")  # (modules_on's, which a module's fixture comes before)
        kinds = kinds_of(cfg_for("vllm"), rand_trace(0, n=20))
        if aot.load(kinds, F) is None:
            replay._ENTRIES.clear()
            run_simulation(cfg_for("vllm"), rand_trace(0, n=20))
            aot.wait_for_builds()  # the run writes it in a process of its own
            aot._LOADED.clear()
        assert aot.load(kinds, F) is not None, (aot.cache_dir() / (aot.module_name(kinds, F) + ".failed")).read_text()
    return kinds


def from_the_module(entry, loop_kind=aot.CORE) -> bool:
    """Whether ``entry`` is an extension module's function (numba's names the core's module),
    called with the lazy functions it does not link set (``aot._with_unlinked``)."""
    if getattr(entry, "func", None) is aot._with_unlinked:
        entry = entry.args[0]
    return entry.__module__.startswith(f"pagesim_{loop_kind}_")


def tables(cfg, trace):
    r = run_simulation(cfg, trace)
    return r.requests, r.steps


@pytest.mark.parametrize("kw", [
    dict(),
    dict(slots=1200, prefix_caching=True),
    dict(slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, width={"beam_width": [1, 2, 3]}),
    dict(slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, width={"n": [1, 2, 3]}),
    dict(slots=1200, chunked_prefill=True, chunk_budget=64, block_size=8, cost_model="calibrated"),
    dict(slots=1200, profile=True, cost_scale=0.5),
    dict(system="orca-max", slots=1000, reservation="predicted"),
    dict(system="orca-pow2", slots=1200),
    dict(system="static", slots=1200),
    dict(system="sglang", slots=1200, block_size=4, schedule_policy="lpm"),
    # a policy's functions are not in the module: the run sets them (aot._with_unlinked)
    dict(system="vllm-v1", slots=600, scheduling_policy="sjf"),
])
def test_the_module_gives_numbas_records(kw, module_built, monkeypatch, tmp_path):
    kw = dict(kw)
    if kw.get("profile"):
        kw["profile"] = str(write_table_profile(tmp_path / "profile.csv"))
    width = kw.pop("width", None)
    cfg = cfg_for(kw.pop("system", "vllm"), seed=0, **kw)
    trace = rand_trace(0, rate=200.0, prefix=True, width=width)
    assert kinds_of(cfg, trace) == module_built  # the module of its family runs it
    monkeypatch.setattr(replay, "_ENTRIES", {})
    tables(cfg, trace)  # builds its family's module where the default run's is the only one yet
    aot.wait_for_builds()
    monkeypatch.setattr(replay, "_ENTRIES", {})
    monkeypatch.setattr(aot, "_LOADED", {})
    ahead = tables(cfg, trace)
    assert aot.entry_of(next(iter(replay._ENTRIES))[0]) == (aot.CORE, cfg.family)
    assert from_the_module(next(iter(replay._ENTRIES.values())))
    monkeypatch.setattr(replay, "_ENTRIES", {})
    monkeypatch.setenv("PAGESIM_JIT", "numba")  # numba's dispatcher
    jitted = tables(cfg, trace)
    assert not from_the_module(next(iter(replay._ENTRIES.values())))
    for a, b in zip(ahead, jitted):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_the_cluster_module_gives_numbas_records(module_built, monkeypatch):
    """A cluster's loop (sim/core/events/cluster.py, over a list of the replicas' states) is written into
    a module of its own after its first compile, and gives numba's records."""
    cfg = cfg_for("vllm", seed=0, slots=1200, prefix_caching=True)
    trace = rand_trace(0, rate=200.0, prefix=True)

    def cluster_tables():
        monkeypatch.setattr(replay, "_ENTRIES", {})
        r = run_cluster(cfg, trace, 3, "prefix-affinity")
        [(fn, *_)] = [key for key in replay._ENTRIES if aot.entry_of(key[0]) != F]
        return r.requests, r.steps, aot.entry_of(fn), replay._ENTRIES

    cluster_tables()  # builds the cluster's module where none was
    aot.wait_for_builds()
    monkeypatch.setattr(aot, "_LOADED", {})
    *ahead, which, entries = cluster_tables()
    assert which == (aot.CLUSTER, state.CONTINUOUS)
    assert [from_the_module(entry, aot.CLUSTER) for entry in entries.values()].count(True) == 1
    monkeypatch.setenv("PAGESIM_JIT", "numba")  # numba's dispatcher
    *jitted, _, entries = cluster_tables()
    assert not any(from_the_module(entry, aot.CLUSTER) for entry in entries.values())
    assert ahead[0]["replica"].nunique() == 3
    for a, b in zip(ahead, jitted):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


RUN = """
import sys
from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, rand_trace
assert "numba" not in sys.modules, "importing the simulator imported numba"
r = run_simulation(cfg_for("vllm"), rand_trace(0, n=20))
print(r.summary["engine"], "numba" in sys.modules)
"""


def test_the_kinds_of_a_list_are_its_first_items_and_of_a_state_its_fields():
    """The cluster loop's replicas: numba types a list by its first item (and checks the others
    against it), so its module is named by that item's kinds; a state by each of its fields."""
    ints, floats = (np.zeros(2, np.int64), np.zeros((2, 3))), (np.zeros(2), np.zeros((2, 3)))
    assert array_kind(ints) == (("<i8", 1, "C", True, True), ("<f8", 2, "C", True, True))
    assert array_kind([ints, floats]) == ("list", array_kind(ints)) != array_kind([floats])


def test_a_run_that_finds_the_module_imports_no_numba(module_built):
    env = dict(os.environ, PYTHONPATH=subprocess_path())
    env.pop("PAGESIM_JIT", None)
    out = subprocess.run([sys.executable, "-c", RUN], check=True, env=env, cwd=TESTS_ROOT, capture_output=True,
                         text=True)
    assert out.stdout.split() == ["core", "False"]


#: a run of keywords (cfg_for's, JSON in argv[1]): "core", whether it imported numba
RUN_WITH = RUN.replace('cfg_for("vllm")', 'cfg_for("vllm", **json.loads(sys.argv[1]))').replace(
    "n=20)", "n=20, prefix=True)").replace("import sys", "import json, sys")
#: configurations that each need a lazy function the default run does not (kv_cache's
#: allocate_cached_blocks, the calibrated price, vLLM v0's swap-ins)
NEEDING = [dict(slots=1200, prefix_caching=True), dict(cost_model="calibrated"), dict(slots=1200, preemption="swap")]


def test_a_run_needing_a_lazy_function_the_module_does_not_link_loads_it_with_numba(module_built):
    """A module links the lazy functions of the run that built it (whichever came first on this
    machine): a run that needs one it does not link runs that module and loads that one from
    numba (aot._with_unlinked)."""
    import json

    linked = aot.load(module_built, F).args[1]
    needing = [kw for kw in NEEDING
               if aot.linked_for((initial_state(cfg_for("vllm", **kw), rand_trace(0, n=20, prefix=True)),), F) & ~linked]
    assert needing, "the module links every candidate's lazy function: add another candidate"
    env = dict(os.environ, PYTHONPATH=subprocess_path())
    env.pop("PAGESIM_JIT", None)
    out = subprocess.run([sys.executable, "-c", RUN_WITH, json.dumps(needing[0])], check=True, env=env,
                         cwd=TESTS_ROOT, capture_output=True, text=True)
    assert out.stdout.split() == ["core", "True"]


def test_a_module_links_the_lazy_functions_its_run_needed_and_the_wheels_every_one(module_built, monkeypatch):
    """``aot.linked_for``: the bits of the slots of the lazy functions a run's configuration needs
    (``jit.lazy_mask``), never an interface's; every one for the wheel (``FOR_THE_WHEEL``)."""
    jit.every_entry()
    slot = {getattr(fn, "__qualname__", fn): s for fn, (s, _) in jit._LAZY.items()}
    plain = initial_state(cfg_for("vllm"), rand_trace(0, n=20))
    cached = initial_state(cfg_for("vllm", slots=1200, prefix_caching=True), rand_trace(0, n=20, prefix=True))
    v1 = initial_state(cfg_for("vllm-v1"), rand_trace(0, n=20))
    assert aot.linked_for((plain,), F) == 0
    assert aot.linked_for((cached,), F) == 1 << slot["allocate_cached_blocks"]
    assert aot.linked_for((v1,), (aot.CORE, state.V1)) == (1 << slot["allocate_cached_blocks"]
                                                           | 1 << slot["preempt_for.<locals>.preempt_family"])
    configs = np.stack([plain.config, cached.config])  # a cluster's replicas: any of them
    assert aot.linked_for((None, configs), (aot.CLUSTER, state.CONTINUOUS)) == 1 << slot["allocate_cached_blocks"]
    every = sum(1 << s for fn, (s, _) in jit._LAZY.items() if not jit.is_interface(fn))
    assert aot.linked_for(None, F) == every and not every >> slot["chosen_victim"] & 1
    monkeypatch.setattr(aot, "FOR_THE_WHEEL", True)
    assert aot.linked_for((plain,), F) == every
    monkeypatch.setattr(aot, "_LOADED", {})
    # the module says what it links (the lazy functions of the run that built it, whichever it was)
    assert aot.load(module_built, F).args[1] & ~every == 0


def test_a_module_of_other_sources_or_kinds_is_not_loaded(module_built, monkeypatch):
    monkeypatch.setattr(aot, "_LOADED", {})
    assert aot.load(module_built, F) is not None
    other_kinds = (module_built[0][:-1] + (("<f8", 1, "C", True, True),),)
    assert aot.module_name(other_kinds, F) != aot.module_name(module_built, F) and aot.load(other_kinds, F) is None
    assert aot.module_name(module_built, (aot.CORE, state.V1)) != aot.module_name(module_built, F)  # another family's
    assert aot.module_name(module_built, (aot.CLUSTER, state.CONTINUOUS)) != aot.module_name(module_built, F)
    with monkeypatch.context() as m:
        m.setattr(jit, "digest_read", lambda group=None: "an edited core")  # the sources this process read
        assert aot.load(module_built, F) is None
    with monkeypatch.context() as m:
        m.setattr(aot.np, "__version__", "another numpy")  # built against numpy's C interface
        assert aot.load(module_built, F) is None
    monkeypatch.setenv("PAGESIM_JIT", "numba")
    assert aot.load(module_built, F) is None  # PAGESIM_JIT=numba skips it


@pytest.fixture
def builds(monkeypatch, tmp_path):
    """aot's cache in ``tmp_path``, its compile replaced by one that records each call (and
    fails while ``builds.failing``)."""
    calls = types.SimpleNamespace(names=[], failing=False)

    def compile_(args, name, path, which, linked):
        calls.names.append(name)
        if calls.failing:
            raise RuntimeError("no C compiler")
        path.write_text("built")

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(aot, "_compile", compile_)
    monkeypatch.delenv("PAGESIM_JIT", raising=False)
    monkeypatch.delenv("PAGESIM_AOT_WAIT", raising=False)
    return calls


KINDS = (("<i8", 1, "C", True, True),)


def test_a_failed_build_is_said_once_remembered_and_not_retried(builds, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pagesim")
    builds.failing = True
    aot.build(None, KINDS, F)
    aot.build(None, KINDS, F)
    assert len(builds.names) == 1
    [line] = [r.getMessage() for r in caplog.records]
    assert "not written into an extension module (RuntimeError: no C compiler)" in line
    assert (tmp_path / "pagesim_core" / (aot.module_name(KINDS, F) + ".failed")).read_text() == "RuntimeError: no C compiler\n"
    assert not aot.module_path(aot.module_name(KINDS, F)).exists()


def test_a_failed_background_build_is_said_by_the_next_run_once(builds, tmp_path, caplog):
    """A build in a process of its own (aot.build_in_background) fails unheard: the next run that
    would build the module says why, once, and starts none."""
    caplog.set_level(logging.INFO, logger="pagesim")
    name = aot.module_name(KINDS, F)
    aot.cache_dir().mkdir(parents=True)
    (aot.cache_dir() / (name + ".failed")).write_text("RuntimeError: no C compiler\n")
    aot.build_in_background(None, KINDS, F)
    aot.build_in_background(None, KINDS, F)
    assert aot._BACKGROUND == [] and builds.names == []
    [line] = [r.getMessage() for r in caplog.records]
    assert "not written into an extension module (RuntimeError: no C compiler)" in line


def test_a_build_happens_once_and_not_while_another_process_builds(builds):
    name = aot.module_name(KINDS, F)
    with aot._build_lock(name) as mine:
        assert mine
        aot.build(None, KINDS, F)  # another holds the lock: skipped, not waited for
        assert builds.names == []
    aot.build(None, KINDS, F)
    aot.build(None, KINDS, F)  # built already
    assert builds.names == [name]


class Started:
    """What ``subprocess.Popen`` is given, a process that ends at once."""

    def __init__(self):
        self.commands = []

    def __call__(self, command, **kw):
        self.commands.append(command)
        return types.SimpleNamespace(stdin=types.SimpleNamespace(write=len, close=lambda: None), poll=lambda: 0)


def test_a_command_that_compiled_the_loop_writes_no_module_and_a_later_one_that_loaded_it_does(builds, monkeypatch):
    """A loop run by one command on a machine is not worth a module: the run that compiled it
    (numba's cache missed) starts no build, nor another process of its command that loaded it
    (a sweep's worker); a later command's that loaded it starts one; the wheel's runs
    (sim/precompile.py) write it where they compiled it."""
    import subprocess as sp

    started = Started()
    monkeypatch.setattr(sp, "Popen", started)
    monkeypatch.setattr(aot, "_BACKGROUND", [])
    monkeypatch.setattr(jit, "numba", types.SimpleNamespace(typeof=type))  # (the request's types)
    args = (initial_state(cfg_for("vllm"), rand_trace(0, n=20)),)
    monkeypatch.setenv(NOTICE_KEY, "a command")  # (the CLI's, which its workers inherit)
    aot.build_in_background(args, KINDS, F, compiled=True)
    assert started.commands == []
    aot.build_in_background(args, KINDS, F, compiled=False)  # another process of the same command
    assert started.commands == []
    monkeypatch.setenv(NOTICE_KEY, "a later command")
    aot.build_in_background(args, KINDS, F, compiled=False)
    assert len(started.commands) == 1 and started.commands[0][-1] == aot.__name__
    monkeypatch.setenv(NOTICE_KEY, "a command")
    monkeypatch.setattr(aot, "FOR_THE_WHEEL", True)
    aot.build_in_background(args, KINDS, F, compiled=True)
    assert len(started.commands) == 2 and builds.names == []


def test_a_run_says_whether_numba_compiled_its_loop_or_loaded_it(monkeypatch):
    """``replay.compiled_entry``: compiled where numba's cache missed (numba counts each miss,
    ``Dispatcher.stats``), loaded where it hit."""
    said = []
    monkeypatch.setattr(aot, "build_in_background", lambda args, kinds, which, compiled: said.append(compiled))
    monkeypatch.setattr(aot, "load", lambda kinds, which: None)
    cfg, trace = cfg_for("vllm"), rand_trace(0, n=20)
    monkeypatch.setattr(replay, "_ENTRIES", {})
    run_simulation(cfg, trace)  # in numba's cache from here on, whichever it was
    dispatcher = jit.compiled(loop.run_for(state.CONTINUOUS))
    monkeypatch.setattr(dispatcher, "overloads", type(dispatcher.overloads)())  # not in this process: loaded
    monkeypatch.setattr(replay, "_ENTRIES", {})
    run_simulation(cfg, trace)
    assert said[-1] is False
    loaded = dispatcher.compile

    def compiling(sig):  # what numba's compile counts where its cache misses
        dispatcher._cache_misses[sig] += 1
        return loaded(sig)

    monkeypatch.setattr(dispatcher, "compile", compiling)
    monkeypatch.setattr(replay, "_ENTRIES", {})
    run_simulation(cfg, trace)
    assert said[-1] is True


def test_the_benchmarks_runs_build_the_module_themselves(builds, monkeypatch):
    """PAGESIM_AOT_WAIT=1 (benchmarks/_import_path.py sets it): no process beside, the run
    builds it."""
    monkeypatch.setenv("PAGESIM_AOT_WAIT", "1")
    aot.build_in_background(None, KINDS, F)
    assert aot._BACKGROUND == [] and builds.names == [aot.module_name(KINDS, F)]


def test_a_background_build_waits_for_another_process_building_the_same_module(builds):
    """A run's background build that finds the module being built by another process (a
    command a moment before, whose builder goes on) waits for it and builds nothing: so that
    aot.wait_for_builds returns with the module written."""
    import threading
    import time

    name = aot.module_name(KINDS, F)
    held = threading.Event()

    def other_process():
        with aot._build_lock(name) as mine:  # another open file: flock sees another holder
            assert mine
            held.set()
            time.sleep(0.3)
            aot.module_path(name).write_text("built by the other")

    other = threading.Thread(target=other_process)
    other.start()
    held.wait()
    t0 = time.perf_counter()
    aot._build(None, KINDS, F, 0, wait=True)
    assert time.perf_counter() - t0 >= 0.2 and builds.names == []
    other.join()
    assert aot.module_path(name).read_text() == "built by the other"


def test_the_interpreted_core_calls_plain_functions_after_numba_loads():
    """``jit.interpreted`` is the specification run by CPython: the core functions it calls are
    the plain ones even once numba's dispatchers have taken their names (``jit.use_numba``)."""
    jit.use_numba()
    assert hasattr(loop.start_step, "py_func")  # the module's name is numba's now
    plain = jit.interpreted(loop.run_continuous)
    assert isinstance(plain, types.FunctionType) and plain.__code__ is loop.run_continuous.py_func.__code__
    assert isinstance(plain.__globals__["start_step"], types.FunctionType)
    # a core module's functions reached as attributes (extent.memory_categories) are the plain
    # ones too: --check's categories after every step typed the state's ~60 arrays for numba
    # at each call, ten times the check's own work
    from pagesim.sim.core.kv import extent, kv_cache, memory

    categories = jit.interpreted(memory.memory_categories)
    assert hasattr(extent.memory_categories, "py_func")
    reached = categories.__globals__["extent"]
    assert isinstance(reached, jit.InterpretedModule)
    assert reached.memory_categories is jit.interpreted(extent.memory_categories)
    assert isinstance(reached.memory_categories, types.FunctionType)
    assert categories.__globals__["kv_cache"].CAN_ALLOCATE == kv_cache.CAN_ALLOCATE  # constants as they are


def test_numbas_c_sources_that_do_not_name_the_module_compile_once_per_machine(monkeypatch, tmp_path):
    """pycc compiles numba's C sources into every module; those that do not name the module
    (all but modulemixin.c) are compiled once, with one neutral name and their paths without
    '..' (the compiler's objects mirror them under the build folder), and their objects linked
    into every later module; the one that names it compiles for each module with its name. Where
    that fails, numba's own way builds the module."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(jit, "numba", types.SimpleNamespace(__version__="0.test"))
    (tmp_path / "pycc").mkdir()
    sources = [tmp_path / "pycc" / "modulemixin.c", tmp_path / "listobject.c", tmp_path / "pycc" / ".." / "nrt.cpp"]
    for source in sources:
        source.write_text(f"/* {source.name} */")
    compiled, paths = [], []

    class Toolchain:
        failing = False

        def get_python_include_dirs(self):
            return []

        def compile_objects(self, sources, build_dir, include_dirs, macros, extra_cflags):
            if self.failing:
                raise OSError("no such folder")
            paths.extend(sources)
            compiled.append(([os.path.basename(p) for p in sources], dict(macros)["PYCC_MODULE_NAME"]))
            objects = [os.path.join(build_dir, os.path.basename(p) + ".o") for p in sources]
            for obj in objects:
                open(obj, "w").write("object")
            return objects

    def cc_of(name):
        cc = types.SimpleNamespace(_toolchain=Toolchain(), _compile_mixins=lambda build_dir: ["numba's own"],
                                   _get_mixin_sources=lambda: [str(s) for s in sources],
                                   _get_mixin_defines=lambda: [("PYCC_MODULE_NAME", name), ("PYCC_USE_NRT", 1)],
                                   _get_extra_cflags=lambda: [])
        aot._reuse_shared_objects(cc)
        return cc

    first = cc_of("pagesim_core_a")._compile_mixins(str(tmp_path))
    second = cc_of("pagesim_core_b")._compile_mixins(str(tmp_path))
    assert compiled == [(["listobject.c", "nrt.cpp"], "pagesim_shared"), (["modulemixin.c"], "pagesim_core_a"),
                        (["modulemixin.c"], "pagesim_core_b")]
    assert first[1:] == second[1:] and [os.path.basename(p) for p in second[1:]] == ["00-listobject.c.o",
                                                                                    "01-nrt.cpp.o"]
    assert not any(".." in p for p in paths)
    sources[1].write_text("/* another numba's listobject.c */")  # another numba: compiled again
    cc_of("pagesim_core_c")._compile_mixins(str(tmp_path))
    assert compiled[-2] == (["listobject.c", "nrt.cpp"], "pagesim_shared")
    Toolchain.failing = True
    assert cc_of("pagesim_core_d")._compile_mixins(str(tmp_path)) == ["numba's own"]


def test_a_broken_module_is_not_loaded_but_replaced(builds, monkeypatch):
    monkeypatch.setattr(aot, "_LOADED", {})
    path = aot.module_path(aot.module_name(KINDS, F))
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not an extension module")
    assert aot.load(KINDS, F) is None and not path.exists()
    aot.build(None, KINDS, F)
    assert builds.names == [aot.module_name(KINDS, F)]


def test_a_module_shipped_with_the_package_is_loaded_first(module_built, monkeypatch, tmp_path):
    """``sim/core/compiled/`` (a wheel's, sim/precompile.py) is read before numba's cache, and a
    family found there is not built again."""
    built = aot.module_path(aot.module_name(module_built, F))
    shipped = tmp_path / "compiled"
    shipped.mkdir()
    shutil.copy2(built, shipped / built.name)
    monkeypatch.setattr(aot, "SHIPPED", shipped)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cache"))  # aot.cache_dir(): an empty one
    monkeypatch.setattr(aot, "_LOADED", {})
    entry = aot.load(module_built, F)
    assert entry is not None and from_the_module(entry)
    aot.build(None, module_built, F)  # the shipped one stands: nothing is compiled or written
    assert not (tmp_path / "cache").exists()


def test_the_package_build_compiles_a_system_of_every_family():
    from pagesim.sim import precompile

    assert sorted(precompile.families()) == sorted(loop.FAMILIES)
    assert precompile.main([]) == 2  # usage


@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["-h"], 0), (["--hepl"], 2),
                                        (["--hepl", "--system", "vllm"], 2)])
def test_precompile_answers_help_and_refuses_an_unknown_option(argv, code, capsys, monkeypatch):
    """An option is never taken for the folder to build into (``--help`` once built every family
    into ``./--help``)."""
    from pagesim.sim import precompile

    monkeypatch.setattr(precompile, "build_one", lambda *a: pytest.fail("built"))
    monkeypatch.setattr(precompile.subprocess, "Popen", lambda *a, **k: pytest.fail("started a build"))
    assert precompile.main(argv) == code
    out = capsys.readouterr()
    assert "usage: python -m pagesim.sim.precompile" in (out.out if code == 0 else out.err)


def test_the_wheels_jobs_share_one_cache_the_lazy_functions_compiled_first(monkeypatch, tmp_path):
    """``precompile DIR`` (the wheel's build): every family's module links every lazy function,
    so the lazy functions' job starts first and every job's numba cache is the same temporary
    folder, where the families' modules load them rather than compile them again."""
    from pagesim.sim import precompile

    started, built = [], []

    class Ended:
        returncode = 0

        def __init__(self, argv, **kwargs):
            started.append((argv[3:], os.environ["PAGESIM_WHEEL_CACHE"]))

        def poll(self):
            return 0

    monkeypatch.setattr(precompile.subprocess, "Popen", Ended)
    monkeypatch.delenv("PAGESIM_WHEEL_CACHE", raising=False)
    assert precompile.main([str(tmp_path)]) == 0
    assert [argv[2] for argv, _ in started] == [precompile.LAZY_JOB, "vllm-v1", "vllm", "orca-max", "sglang", "static"]
    assert len({cache for _, cache in started}) == 1 and "PAGESIM_WHEEL_CACHE" not in os.environ
    monkeypatch.setenv("PAGESIM_WHEEL_CACHE", str(tmp_path / "shared"))
    monkeypatch.setenv("NUMBA_CACHE_DIR", os.environ.get("NUMBA_CACHE_DIR", ""))  # (restored after: the job sets it)
    monkeypatch.setattr(precompile, "build_one", lambda system, into: built.append(os.environ["NUMBA_CACHE_DIR"]))
    assert precompile.main([str(tmp_path), "--system", "static"]) == 0
    assert built == [str(tmp_path / "shared")]


def test_warming_the_cache_compiles_every_family_longest_first_into_this_machines_cache(monkeypatch, capsys):
    """``precompile --warm`` (the test suite's start): a process per family, vLLM v1's first (its
    engine's, cluster's and disaggregated pools' loops), and one for the lazy functions fourth, each
    compiling into the cache this process uses (NUMBA_CACHE_DIR untouched) and copying no module
    anywhere."""
    from pagesim.sim import precompile

    started, built = [], []

    class Ended:
        returncode = 0

        def __init__(self, argv, **kwargs):
            started.append(argv[3:])

        def poll(self):
            return 0

    monkeypatch.setattr(precompile.subprocess, "Popen", Ended)
    assert precompile.main(["--warm"]) == 0
    systems = [argv[2] for argv in started]
    assert all(argv[:2] == ["--warm", "--system"] for argv in started)
    # the longest first, by their CPU on 2 cores (the lazy functions' job fourth: last, one core
    # idled through it); vLLM v0's and Orca's scheduler over paged memory, then over contiguous extents
    assert systems == ["vllm-v1", "vllm", "orca-max", precompile.LAZY_JOB, "sglang", "static"]
    said = capsys.readouterr().err.splitlines()  # a line a job as it ends (here at once), then the whole
    families = [system for system in systems if system != precompile.LAZY_JOB]
    assert [line.split("'")[0] for line in said[:-1] if "lazy" not in line] == ["pagesim: " + f for f in families]
    assert all(re.fullmatch(r"pagesim: \S+'s family compiled in \d+ s \(\d+ s in\)", line)
               for line in said[:-1] if "lazy" not in line)
    assert re.fullmatch(r"pagesim: the lazy functions compiled in \d+ s \(\d+ s in\)", said[3])
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/the/users/cache")
    monkeypatch.setattr(precompile, "build_one", lambda system, into: built.append((system, into,
                                                                                    os.environ["NUMBA_CACHE_DIR"])))
    assert precompile.main(["--warm", "--system", "static"]) == 0
    assert built == [("static", None, "/the/users/cache")]
