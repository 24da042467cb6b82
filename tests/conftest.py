"""The whole suite's start: every scheduler family's loops compiled at once, one per core, before
any test runs (``python -m pagesim.sim.precompile --warm``), so that the tests' workers
(README's ``-n auto``) find them in the cache rather than each compiling the same loop (a
family's loop takes 1-2.5 min of CPU to compile cold, and every worker's first tests would).
Only where the whole suite runs, from its controller: a run of chosen tests compiles only what
they run, as before."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests import checked_core  # noqa: E402

checked_core.apply()  # numba's bounds checking on, in a cache of the suite's, before numba loads

# the simulator imported first, from where this interpreter finds it (the install, or
# PYTHONPATH's link), as the warm-up's process imports it: the benchmarks' modules that
# tests/benchmarks imports put a link to the checkout first on sys.path
# (benchmarks/_import_path.py), and sim/ imported through it has other file paths, by which
# numba names its cache folders: every worker missed the loops compiled first
import pagesim.sim  # noqa: E402,F401  (a regular package: its modules' paths are fixed now)

#: the user's PAGESIM_JIT (the whole suite's, where the user set none: pytest_sessionstart), which
#: tests/peers/__init__.py sets as the peers are collected (each runs interpreted when alone); put
#: back once every module is collected (pytest_collection_finish)
USERS_JIT = os.environ.get("PAGESIM_JIT")


def pytest_sessionstart(session):
    global USERS_JIT
    config = session.config
    if hasattr(config, "workerinput") or config.args_source is not pytest.Config.ArgsSource.TESTPATHS:
        return  # a worker (its controller warmed the cache), or chosen tests
    from pagesim.sim.core.compile import jit

    if not jit.COMPILED:
        return
    if USERS_JIT is None:
        # numba's dispatcher, no extension module written (sim/core/compile/aot.py): each module is
        # another 10-25 s of CPU linking the same machine code, and the suite runs the core
        # in its own processes, where numba is loaded anyway; tests/sim/core/test_aot.py
        # builds and checks the modules itself. The workers, the warm-up and every process
        # a test starts inherit it (and pytest_collection_finish puts it back)
        os.environ["PAGESIM_JIT"] = USERS_JIT = "numba"
    # a failure is the tests' to meet: they compile as they go
    subprocess.run([sys.executable, "-m", "pagesim.sim.precompile", "--warm"], check=False)


def pytest_collection_finish(session):
    """The user's PAGESIM_JIT back in the environment: the processes the tests start inherit
    it, and with the peers' "0" every command a test ran in a child ran interpreted, not the
    compiled code the suite compiled first (and numba's patches in ``jit.use_numba`` unmade)."""
    if USERS_JIT is None:
        os.environ.pop("PAGESIM_JIT", None)
    else:
        os.environ["PAGESIM_JIT"] = USERS_JIT


def pytest_configure(config):
    """A worker that crashes (a test past setup.cfg's ``faulthandler_timeout``) ends the run
    with that test's name, unless ``--max-worker-restart`` says otherwise: xdist's scheduling
    by file gives the crashed test again to each new worker, which would each wait as long."""
    if getattr(config.option, "numprocesses", None) and config.option.maxworkerrestart is None:
        config.option.maxworkerrestart = "0"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Each file's tests to one worker (xdist's ``--dist loadfile``): a file's tests share what
    they compile (the core's functions a test calls from Python) and its fixtures."""
    from xdist.scheduler import LoadFileScheduling

    return LoadFileScheduling(config, log)
