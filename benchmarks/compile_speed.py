"""Cold compile of the simulator's core (issue #35): CPU seconds per scheduler family.

Each scheduler family has its own compiled loop (``sim/core/loop.py``: ``loop_for``), so a run
compiles its own family only. For each family (by a system of it) a fresh process runs a tiny
``pagesim simulate`` with an empty numba cache (``NUMBA_CACHE_DIR``) and ``PAGESIM_JIT=numba``
(no extension module written after it): its CPU time is that family's cold compile alone (a
first run's). Then every family in turn over one cache, as a test run compiles them: the later
ones reuse the functions the earlier compiled (the core's functions called, not inlined).

Baseline, in the same run: a fresh process that imports numba and compiles a reference function
(a loop with a few branches over an array), so that figures taken on other machines compare.
Targets (#35): one family <= 40 s of CPU, every family together <= 90 s, on 2 cores.

``--edit``: a contributor's cycle instead. In a copy of the checkout, a policy file's tests run
once (numba's cache warm, not timed); then the file is edited (a comment appended) and its tests
rerun, timed by the wall clock: compiled as the test command runs them, and interpreted
(``PAGESIM_JIT=0``, the same functions in CPython). Target (#35): <= 60 s.
``--wheel``: what an installed pagesim's first run costs. The checkout is built into a wheel
(``pip wheel .``: ``setup.py`` compiles every family into it), installed into a fresh virtual
environment, and each family's first run there (an empty numba cache) is timed, with whether it
compiled (its notice) and whether it imported numba; then each family's first cluster run
(``--replicas 2``). Target (#35): a wheel's first run compiles nothing.
Run: ``python benchmarks/compile_speed.py [--edit | --wheel]``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _import_path  # noqa: F401  (the checkout's pagesim)

FAMILIES = (("vllm v0 and Orca", "vllm"), ("vLLM v1", "vllm-v1"), ("SGLang", "sglang"), ("static", "static"))

REFERENCE = """
import numba, numpy as np
@numba.njit
def reference(x):
    total = 0.0
    for i in range(x.size):
        if x[i] > 0.5:
            total += x[i] * 2
        elif x[i] > 0.25:
            total -= x[i]
        else:
            total += 1.0
    return total
reference(np.random.default_rng(0).random(1000))
"""


def child_cpu(argv: list[str], env: dict) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def simulate(system: str, cache: str) -> tuple[float, float]:
    env = dict(os.environ, PAGESIM_JIT="numba", NUMBA_CACHE_DIR=cache)
    argv = [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--system", system, "--workload", "sharegpt",
            "--num-requests", "20", "--no-progress"]
    return child_cpu(argv, env)


#: (the policy file edited, its tests): two systems' scheduler files (their family recompiles
#: alone), and a scheduling policy shared by vLLM v0 and v1 (every family recompiles)
EDITS = (("sim/core/scheduler_v1.py", "tests/sim/core/test_vllm_v1.py tests/sim/core/test_priority.py"),
         ("sim/core/scheduler_sglang.py", "tests/sim/core/test_sglang.py"),
         ("sim/core/policy_priority.py", "tests/sim/core/test_priority.py"))


def edit_cycle() -> None:
    root = Path(__file__).resolve().parent.parent
    print(f"{'policy file edited':<30} {'its tests (tests/sim/core/)':<34} {'warm: wall s':>12} {'compiled':>9} "
          f"{'interpreted':>12}")
    for policy, tests in EDITS:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp, "pagesim")
            shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__", ".git", "site", "out", "*.egg-info",
                                                                    ".pytest_cache", ".hypothesis"))
            env = dict(os.environ, PYTHONPATH=tmp)  # `import pagesim` is the copy
            env.pop("NUMBA_CACHE_DIR", None)  # the copy's own cache, in its sim/core/__pycache__
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests.split()]

            def run(extra: dict) -> float:
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=copy, env=dict(env, **extra), check=True, stdout=subprocess.DEVNULL)
                return time.perf_counter() - t0

            warm = run({})
            with open(copy / policy, "a") as f:
                f.write("# an edit\n")
            compiled = run({})
            interpreted = run({"PAGESIM_JIT": "0"})
        names = " ".join(t.rsplit("/", 1)[-1] for t in tests.split())
        print(f"{policy.rsplit('/', 1)[-1]:<30} {names:<34} {warm:>12.1f} {compiled:>9.1f} {interpreted:>12.1f}")
    print("target (#35): edit one system's policy file and rerun its tests <= 60 s of wall time")


FIRST_RUN = """
import sys, time
from pagesim.sim.cli import main
t0 = time.process_time()
rc = main(["simulate", "--system", sys.argv[1], "--workload", "sharegpt", "--num-requests", "20", "--no-progress",
           "--out", sys.argv[2], *sys.argv[3:]])
print(rc, time.process_time() - t0, "numba" in sys.modules)
"""


def wheel_install() -> None:
    from pagesim.sim.core import aot

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        build_cpu, _ = child_cpu([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", f"{tmp}/wheels",
                                  str(root)], dict(os.environ))
        build_wall = time.perf_counter() - t0
        wheel = next(Path(tmp, "wheels").glob("pagesim-*.whl"))
        import zipfile
        names = zipfile.ZipFile(wheel).namelist()
        engines, clusters = (sum(f"/compiled/pagesim_{loop}_" in n for n in names) for loop in (aot.CORE, aot.CLUSTER))
        print(f"wheel {wheel.name}: built in {build_wall:.0f} s wall ({build_cpu:.0f} s of CPU), "
              f"the compiled loops of {engines} families' engines and {clusters} families' clusters in it")
        subprocess.run([sys.executable, "-m", "venv", f"{tmp}/venv"], check=True)
        python = f"{tmp}/venv/bin/python"
        subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
        print(f"{'first run of (system)':<24} {'CPU s':>7} {'compiled?':>10} {'numba imported?':>16}")
        # each family's first run, then its first run of two replicas
        runs = [(system, ()) for _, system in FAMILIES]
        runs += [(system, ("--replicas", "2")) for _, system in FAMILIES]
        for system, extra in runs:
            env = dict(os.environ, NUMBA_CACHE_DIR=f"{tmp}/cache-{system}-{len(extra)}")
            env.pop("PYTHONPATH", None)
            env.pop("PAGESIM_JIT", None)
            out = subprocess.run([python, "-c", FIRST_RUN, system, f"{tmp}/out-{system}-{len(extra)}", *extra],
                                 cwd=tmp, env=env, capture_output=True, text=True, check=True)
            rc, cpu, numba = out.stdout.strip().splitlines()[-1].split()  # after the run's own summary
            compiled = "compil" in out.stderr
            name = " ".join((system, *extra))
            print(f"{name:<24} {float(cpu):>7.2f} {'yes' if compiled else 'no':>10} {numba:>16}")
        print("target (#35): a wheel install's first run compiles nothing (a cluster's imports numba)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--edit", action="store_true", help="time an edit of a policy file and a rerun of its tests")
    mode.add_argument("--wheel", action="store_true", help="build a wheel, install it, time each family's first run")
    args = ap.parse_args()
    if args.edit:
        edit_cycle()
        return
    if args.wheel:
        wheel_install()
        return
    with tempfile.TemporaryDirectory() as cache:
        base, _ = child_cpu([sys.executable, "-c", REFERENCE], dict(os.environ, NUMBA_CACHE_DIR=cache))
    print(f"baseline: numba's import and a reference function's compile: {base:.1f} s of CPU")
    print(f"{'family (system)':<28} {'alone: CPU s':>13} {'x base':>7} {'in turn: CPU s':>15} {'x base':>7}")
    alone, turn = {}, {}
    for name, system in FAMILIES:
        with tempfile.TemporaryDirectory() as cache:
            alone[name], _ = simulate(system, cache)
    with tempfile.TemporaryDirectory() as shared:
        for name, system in FAMILIES:
            turn[name], _ = simulate(system, shared)
    for name, system in FAMILIES:
        print(f"{name + ' (' + system + ')':<28} {alone[name]:>13.1f} {alone[name] / base:>7.1f} "
              f"{turn[name]:>15.1f} {turn[name] / base:>7.1f}")
    total = sum(turn.values())
    print(f"{'every family, in turn':<28} {'':>13} {'':>7} {total:>15.1f} {total / base:>7.1f}")
    print(f"targets (#35, 2 cores): a family alone <= 40 s (worst here {max(alone.values()):.0f} s); "
          f"every family <= 90 s (here {total:.0f} s)")


if __name__ == "__main__":
    main()
