"""Build the simulator's compiled core, every scheduler family's, into a folder:
``python -m pagesim.sim.precompile DIR``.

The package build runs it (``setup.py``, for a wheel or ``pip install .``) into the package's
``sim/core/compiled/``, so that an installed pagesim's first run loads machine code instead of
compiling it (1-2 minutes of CPU per family, cold). Each family is compiled by a small run of a
system of its own, and a small cluster of two of its replicas (``--replicas``; not SGLang's, which
runs one engine), in a process of its own (as many at once as there are cores) with numba's cache in
a temporary folder, and the extension modules those runs write (``sim/core/compile/aot.py``: the engine's
loop and the cluster's) are copied into ``DIR``. Where this cannot be done (numba, setuptools or a C
compiler missing), it says why in one line and exits 1: the package is built without the modules,
and its runs compile, or run in CPython, as they would have.

``python -m pagesim.sim.precompile --warm`` compiles the same loops into this machine's own cache
instead (numba's, ``$NUMBA_CACHE_DIR`` or ``sim/core/__pycache__``; the modules beside it are
written by the runs that load it after, ``aot.build_in_background``):
what a first run of each family would compile, done at once on every core, and every lazy
function (``jit.njit``'s ``lazy``: those only a feature's runs compile) as one more job. The test
suite starts so (``tests/conftest.py``), before its workers share the cache.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def families() -> dict[int, str]:
    """A system of each scheduler family (``sim/core/compile/families.py``; the registry's first), by
    family."""
    from pagesim.sim import systems

    first: dict[int, str] = {}
    for system in systems.SYSTEMS.values():
        first.setdefault(system.family, system.name)
    return first


def _compile_order(job: str, wheel: bool = False) -> int:
    """The longest jobs first, so that the cores finish together (on 2 cores, each starting as
    one ends): vLLM v1's (its engine's, cluster's and, warming, disaggregated pools' loops),
    vLLM v0's and Orca's over paged memory, then over contiguous extents, the lazy functions
    (``--warm``), then SGLang's and static's. Their wall time side by side on this project's
    machine, cold (a clean clone's ``.ci/run``, 2026-11-28, evening): 77, 51, 43, 32, 40 and 22 s,
    134 s in all (with the lazy functions' job last, one core had once idled through its 69 s).
    For the wheel the lazy functions come first: every family's module links them, and loads
    them from the jobs' shared cache where that job has written them, not compiling them again."""
    from pagesim.sim import systems
    from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS, SGLANG, STATIC, V1

    longest_first = [V1, CONTINUOUS, CONTINUOUS_CONTIGUOUS, LAZY_JOB, SGLANG, STATIC]
    if wheel:
        longest_first.remove(LAZY_JOB)
        longest_first.insert(0, LAZY_JOB)
    kind = job if job == LAZY_JOB else systems.SYSTEMS[job].family
    return longest_first.index(kind) if kind in longest_first else len(longest_first)


def _trace():
    """A few requests that preempt nothing: the machine code is the same for every run of a family."""
    import pandas as pd

    return pd.DataFrame({"request_id": [f"r{i}" for i in range(8)], "arrival_s": [0.1 * i for i in range(8)],
                         "prompt_tokens": [64 + 16 * i for i in range(8)], "output_tokens": [8 + i for i in range(8)]})


def build_one(system: str, into: Path | None) -> list[Path]:
    """Compile the loops of ``system``'s family, the engine's and (where it runs in a cluster)
    the cluster's, and copy their extension modules into ``into`` (None: left in the cache;
    numba's cache: ``$NUMBA_CACHE_DIR``, set by :func:`main` before numba is imported)."""
    from pagesim.sim.cluster import run_cluster
    from pagesim.sim.config import SimConfig
    from pagesim.sim.core.compile import aot, jit
    from pagesim.sim.disagg import run_disaggregated
    from pagesim.sim.run import run_simulation
    from pagesim.sim.systems import SYSTEMS

    if not jit.COMPILED:
        raise RuntimeError("numba is not installed (or PAGESIM_JIT=0)")
    trace = _trace()
    cfg = SimConfig.for_system(system)
    # the wheel's modules, written by these runs, link every lazy function: an installed
    # pagesim's runs compile none
    aot.FOR_THE_WHEEL = into is not None
    run_simulation(cfg, trace)
    run_cluster(cfg, trace, 2, "round-robin")
    aot.wait_for_builds()  # each run's module, written by a process of its own
    if into is None:  # this machine's cache: its disaggregated pools' loop too (vLLM v1's), not shipped
        if cfg.capabilities.disaggregates:
            run_disaggregated(cfg, cfg, trace, 1, 1)
        return []
    loops = [aot.CORE, aot.CLUSTER]
    family = SYSTEMS[system].family
    copied = []
    for entry in loops:
        built = sorted(aot.cache_dir().glob(f"{aot.module_prefix((entry, family))}*{aot.module_path('').name}"))
        if not built:
            failed = sorted(aot.cache_dir().glob("*.failed"))
            raise RuntimeError(failed[-1].read_text().strip() if failed else f"no {entry} module was written for "
                               f"{system}")
        into.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[-1], into / built[-1].name)
        copied.append(into / built[-1].name)
    return copied


#: ``--warm``'s job beside the families': every lazy function (``jit.njit``'s ``lazy``) and every
#: policy's implementations (``jit.every_entry``), which no family's small run compiles and the
#: tests' runs of each feature would compile in their workers
LAZY_JOB = "lazy-functions"


def build_lazy() -> None:
    """Compile every lazy function into this machine's cache for the states every family's loop
    takes (one type whatever the system: ``tests/sim/core/test_one_machine_code.py``)."""
    from pagesim.sim.config import SimConfig
    from pagesim.sim.core.compile import jit
    from pagesim.sim.run import initial_state

    s = initial_state(SimConfig.for_system("vllm-v1"), _trace())
    jit.use_numba()
    state_type = jit.numba.typeof(s)
    for fn in jit.every_entry():
        jit.lazy_compiled(fn, state_type)


def main(argv: list[str] | None = None) -> int:
    """Every family at once, one process each (a family's compile is single-threaded), as many
    at a time as there are cores; with ``--system S``, the family of ``S`` in this process.
    ``DIR``: into a temporary cache, the modules copied into ``DIR``; ``--warm``: into this
    machine's cache."""
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m pagesim.sim.precompile (DIR | --warm) [--system SYSTEM]"
    if argv[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    # an option other than --warm is refused, not taken for a folder to build into
    if (len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--system")
            or (argv[0].startswith("-") and argv[0] != "--warm")):
        print(usage, file=sys.stderr)
        return 2
    into = None if argv[0] == "--warm" else Path(argv[0])
    if len(argv) == 3:
        with contextlib.ExitStack() as stack:
            if into is not None:  # the package's build: a cache of its own, read by numba at its import
                if "PAGESIM_WHEEL_CACHE" not in os.environ:  # (the jobs': one cache, shared, made below)
                    os.environ["PAGESIM_WHEEL_CACHE"] = stack.enter_context(tempfile.TemporaryDirectory())
                os.environ["NUMBA_CACHE_DIR"] = os.environ["PAGESIM_WHEEL_CACHE"]
                os.environ.pop("PAGESIM_JIT", None)
            try:
                build_lazy() if argv[2] == LAZY_JOB else build_one(argv[2], into)
            except Exception as e:  # noqa: BLE001 - any failure: the package is built without the modules
                print(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
                return 1
        return 0
    if into is None:
        return _run_jobs(argv[0], False)
    # the wheel's jobs share one cache: each module links every lazy function, compiled once
    # there by the lazy functions' job, which starts first (_compile_order)
    with tempfile.TemporaryDirectory() as shared:
        os.environ["PAGESIM_WHEEL_CACHE"] = shared
        try:
            return _run_jobs(argv[0], True)
        finally:
            del os.environ["PAGESIM_WHEEL_CACHE"]


def _run_jobs(where: str, wheel: bool) -> int:
    """Every family's job and the lazy functions', each a process (``--system``), as many at
    once as there are cores (``where``: main's ``DIR`` or ``--warm``)."""
    t0 = time.perf_counter()
    jobs = sorted([*families().values(), LAZY_JOB], key=lambda job: _compile_order(job, wheel))
    running: list[tuple[str, subprocess.Popen, object]] = []
    failures: list[str] = []
    started: dict[str, float] = {}
    while jobs or running:
        while jobs and len(running) < max(1, os.cpu_count() or 1):
            system, said = jobs.pop(0), tempfile.TemporaryFile("w+")
            running.append((system, subprocess.Popen([sys.executable, "-m", "pagesim.sim.precompile", where,
                                                      "--system", system], stderr=said, text=True), said))
            started[system] = time.perf_counter()
        ended = [job for job in running if job[1].poll() is not None]  # the next family starts at once
        if not ended:
            time.sleep(0.1)
        for system, process, said in ended:
            running.remove((system, process, said))
            said.seek(0)
            err = said.read().strip()
            said.close()
            # each family's time: which job bounds the wait (a suite's warm-up on 2 cores)
            what = "the lazy functions" if system == LAZY_JOB else f"{system}'s family"
            print(f"pagesim: {what} {'failed' if process.returncode else 'compiled'} in "
                  f"{time.perf_counter() - started[system]:.0f} s ({time.perf_counter() - t0:.0f} s in)",
                  file=sys.stderr)
            if process.returncode:
                failures.append(f"{system}: {err.splitlines()[-1] if err else process.returncode}")
    if failures:
        print(f"pagesim: the compiled core was not built ({failures[0]}); runs will compile it on first use",
              file=sys.stderr)
        return 1
    print(f"pagesim: compiled the core of every scheduler family in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
