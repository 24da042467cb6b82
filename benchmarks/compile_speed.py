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
Run: ``python benchmarks/compile_speed.py``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

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


def main() -> None:
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
