"""Cold compile of the simulator's core (issue #35): CPU seconds per scheduler family.

Each scheduler family has its own compiled loop (``sim/core/events/loop.py``: ``loop_for``), so a run
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
``--clusters``: each family's cluster loops instead (``--replicas 2``; vLLM v1's disaggregated
pools too): the CPU seconds of a cluster's first run, its family's engine loop cached by an
engine run first (not timed), as a test run meets them. With ``--base``, paired as below.
``--base REV``: the same figures for git revision ``REV`` (checked out into a temporary worktree,
``git worktree add --detach``) and for this checkout, measured in turn (each family alone: the
revision, then the checkout; then every family in turn, the same), so that a before/after claim
is paired on a shared machine; prints both and their ratio. ``--repeats N`` measures each figure
``N`` times, the order swapped every other round (the median is printed, and every run);
``--systems`` picks families by a system of each (``vllm,sglang``; ``lazy``: every lazy function,
``jit.njit``'s ``lazy``, compiled as ``precompile --warm`` does); ``--alone`` skips the run of
every family in turn.
Each child imports the tree it measures (``PYTHONPATH``: ``_import_path``), its bytecode compiled
beforehand (not timed).
Run: ``python benchmarks/compile_speed.py [--edit | --wheel | [--clusters] [--base REV]
[--repeats N] [--systems vllm,...] [--alone]]``. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _import_path import ROOT, child_env, import_path  # the checkout's pagesim

FAMILIES = (("vLLM v0 and Orca, paged", "vllm"), ("vLLM v0 and Orca, contiguous", "orca-max"), ("vLLM v1", "vllm-v1"),
            ("SGLang", "sglang"), ("static", "static"))
#: every lazy function (``jit.njit``'s ``lazy``), compiled as ``precompile --warm`` compiles them
#: beside the families: measured where ``--systems`` names it, and no family
LAZY = ("the lazy functions", "lazy")

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


def simulate(system: str, cache: str, path: str | None = None, *extra: str) -> tuple[float, float]:
    """A tiny run of ``system`` with numba's cache in ``cache``: the pagesim of import folder
    ``path`` (a folder holding a link ``pagesim``; this checkout's by default); ``extra``: more
    of ``simulate``'s options."""
    from pagesim.sim.precompile import LAZY_JOB

    env = child_env(path, PAGESIM_JIT="numba", NUMBA_CACHE_DIR=cache)
    argv = [sys.executable, "-m", "pagesim.sim.cli", "simulate", "--system", system, "--workload", "sharegpt",
            "--num-requests", "20", "--no-progress", *extra]
    if system == LAZY[1]:
        argv = [sys.executable, "-m", "pagesim.sim.precompile", "--warm", "--system", LAZY_JOB]
    return child_cpu(argv, env)


#: a cluster's loops: (what, simulate's options), each compiled over its family's engine loop
CLUSTERS = (("2 replicas", ("--replicas", "2")), ("disaggregated 1+1", ("--prefill-replicas", "1",
                                                                        "--decode-replicas", "1")))


def clusters_cpu(system: str, path: str | None = None) -> dict:
    """The CPU seconds of each of ``system``'s cluster loops' first run (:data:`CLUSTERS`; the
    disaggregated one for ``vllm-v1`` only), its family's engine loop compiled first (not
    timed), each over a cache of its own."""
    cpu = {}
    for what, extra in CLUSTERS:
        if extra[0] == "--prefill-replicas" and system != "vllm-v1":
            continue
        with tempfile.TemporaryDirectory() as cache:
            simulate(system, cache, path)
            cpu[what], _ = simulate(system, cache, path, *extra)
    return cpu


def clusters(rev: str | None, chosen: tuple, repeats: int) -> None:
    """``--clusters``: each family's cluster loops' first compile (:func:`clusters_cpu`), for this
    checkout, or paired with revision ``rev`` (its worktree and this in turn, the order swapped
    every other round; the median of ``repeats`` rounds)."""
    precompile_bytecode(ROOT)
    sides = {"this": import_path()}
    with tempfile.TemporaryDirectory() as tmp:
        if rev:
            commit = git("rev-parse", "--verify", rev + "^{commit}")
            tree = Path(tmp, "base")
            git("worktree", "add", "--detach", str(tree), commit)
            Path(tmp, "import").mkdir()
            Path(tmp, "import", "pagesim").symlink_to(tree, target_is_directory=True)
            precompile_bytecode(tree)
            sides = {"base": str(Path(tmp, "import")), **sides}
            print(f"base: {rev} ({commit[:10]}), a worktree; this: the checkout")
        try:
            runs = {side: {} for side in sides}
            for round_ in range(repeats):
                for name, system in chosen:
                    for side in (list(sides) if round_ % 2 == 0 else list(sides)[::-1]):
                        for what, cpu in clusters_cpu(system, sides[side]).items():
                            runs[side].setdefault((name, what), []).append(cpu)
        finally:
            if rev:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    print(f"a cluster loop's first run, its family's engine loop cached: CPU s, the median of {repeats}")
    print(f"{'family (system)':<42} {'cluster':<18} " + " ".join(f"{side:>7}" for side in sides)
          + ("  ratio" if rev else ""))
    for (name, what), this in runs["this"].items():
        system = dict(chosen)[name]
        values = [statistics.median(runs[side][(name, what)]) for side in sides]
        ratio = f"  {values[-1] / values[0]:5.2f}" if rev else ""
        print(f"{name + ' (' + system + ')':<42} {what:<18} " + " ".join(f"{v:>7.1f}" for v in values) + ratio)


#: (the policy file edited, its tests): two systems' scheduler files (their scheduler's entry
#: recompiles alone), and vLLM v1's priority policy (its implementations' entries alone: jit.lazy_only)
EDITS = (("sim/core/sched/scheduler_v1.py", "tests/sim/core/test_vllm_v1.py tests/sim/core/test_priority.py"),
         ("sim/core/sched/scheduler_sglang.py", "tests/sim/core/test_sglang.py"),
         ("sim/core/sched/policy_priority.py", "tests/sim/core/test_priority.py"))


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
    from pagesim.sim.core.compile import aot

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
              f"the compiled loops of {engines} families' engines and {clusters} families' clusters in it "
              f"(issue 85: <= 300 s of CPU)")
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


def reference_cpu() -> float:
    with tempfile.TemporaryDirectory() as cache:
        base, _ = child_cpu([sys.executable, "-c", REFERENCE], dict(os.environ, NUMBA_CACHE_DIR=cache))
    return base


def precompile_bytecode(tree: Path) -> None:
    """Python's bytecode of a tree, written before anything is timed (a fresh worktree has none)."""
    for folder in ("sim", "traces", "gpu"):
        if (tree / folder).is_dir():
            compileall.compile_dir(str(tree / folder), quiet=1)


def families(systems: str | None) -> tuple:
    if not systems:
        return FAMILIES
    wanted = systems.split(",")
    known = (*FAMILIES, LAZY)
    unknown = set(wanted) - {system for _, system in known}
    if unknown:
        raise SystemExit(f"--systems: not a family's system here: {', '.join(sorted(unknown))} "
                         f"(one of {', '.join(system for _, system in known)})")
    return tuple((name, system) for name, system in known if system in wanted)


def measure(chosen: tuple, with_turn: bool = True) -> tuple[dict, dict]:
    """Each family's cold compile alone (an empty cache each), then every family in turn over
    one cache: (alone, in turn), CPU seconds by family name."""
    alone, turn = {}, {}
    for name, system in chosen:
        with tempfile.TemporaryDirectory() as cache:
            alone[name], _ = simulate(system, cache)
    if not with_turn:
        return alone, turn
    with tempfile.TemporaryDirectory() as shared:
        for name, system in chosen:
            turn[name], _ = simulate(system, shared)
    return alone, turn


def single(chosen: tuple, with_turn: bool) -> None:
    precompile_bytecode(ROOT)
    base = reference_cpu()
    print(f"baseline: numba's import and a reference function's compile: {base:.1f} s of CPU")
    print(f"{'family (system)':<42} {'alone: CPU s':>13} {'x base':>7} {'in turn: CPU s':>15} {'x base':>7}")
    alone, turn = measure(chosen, with_turn)
    for name, system in chosen:
        in_turn = f"{turn[name]:>15.1f} {turn[name] / base:>7.1f}" if with_turn else ""
        print(f"{name + ' (' + system + ')':<42} {alone[name]:>13.1f} {alone[name] / base:>7.1f} {in_turn}".rstrip())
    families_alone = [alone[name] for name, system in chosen if (name, system) in FAMILIES]
    if not families_alone:  # the lazy functions alone: no family's target
        return
    line = f"targets (#35, 2 cores): a family alone <= 40 s (worst here {max(families_alone):.0f} s)"
    if with_turn:
        total = sum(turn.values())
        print(f"{'every family, in turn':<42} {'':>13} {'':>7} {total:>15.1f} {total / base:>7.1f}")
        if len(chosen) == len(FAMILIES):
            line += f"; every family <= 90 s (here {total:.0f} s)"
    print(line)


def git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *argv], check=True, capture_output=True, text=True).stdout.strip()


def paired(rev: str, chosen: tuple, repeats: int, with_turn: bool) -> None:
    """The figures for revision ``rev`` and for this checkout, measured in turn (see the module
    docstring): each family alone, revision then checkout (swapped every other round), then
    every family in turn, the same."""
    commit = git("rev-parse", "--verify", rev + "^{commit}")
    head = git("rev-parse", "--short", "HEAD")
    dirty = " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp, "base")
        git("worktree", "add", "--detach", str(tree), commit)
        try:
            folder = Path(tmp, "import")  # the revision's import folder: a link `pagesim` to its tree
            folder.mkdir()
            (folder / "pagesim").symlink_to(tree, target_is_directory=True)
            paths = {"base": str(folder), "this": import_path()}
            for path in (tree, ROOT):
                precompile_bytecode(path)
            print(f"base: {rev} ({commit[:10]}), a worktree; this: the checkout ({head}{dirty})")
            reference = reference_cpu()
            print(f"baseline: numba's import and a reference function's compile: {reference:.1f} s of CPU")
            runs = {side: {"alone": {name: [] for name, _ in chosen}, "turn": {name: [] for name, _ in chosen}}
                    for side in paths}
            for round_ in range(repeats):
                order = ("base", "this") if round_ % 2 == 0 else ("this", "base")
                for name, system in chosen:
                    for side in order:
                        with tempfile.TemporaryDirectory() as cache:
                            runs[side]["alone"][name].append(simulate(system, cache, paths[side])[0])
                if with_turn:
                    for side in order:
                        with tempfile.TemporaryDirectory() as shared:
                            for name, system in chosen:
                                runs[side]["turn"][name].append(simulate(system, shared, paths[side])[0])
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)

    def median(values):
        return statistics.median(values) if values else float("nan")

    def runs_of(values):
        return " ".join(f"{v:.1f}" for v in values) if len(values) > 1 else ""

    print(f"CPU seconds: the median of {repeats} run(s) of each, every run listed where more than one; "
          f"ratio: this / base")
    print(f"{'family (system)':<42} {'':<8} {'base':>7} {'this':>7} {'ratio':>6}   runs (base | this)")
    totals = {}
    for kind, label in (("alone", "alone"), ("turn", "in turn")) if with_turn else (("alone", "alone"),):
        for name, system in chosen:
            base, this = (median(runs[side][kind][name]) for side in ("base", "this"))
            print(f"{name + ' (' + system + ')':<42} {label:<8} {base:>7.1f} {this:>7.1f} {this / base:>6.2f}   "
                  f"{runs_of(runs['base'][kind][name])} | {runs_of(runs['this'][kind][name])}".rstrip(" |"))
        if kind == "turn":
            # each round's sum over the families, then the median of those sums
            for side in paths:
                totals[side] = [sum(runs[side]["turn"][name][r] for name, _ in chosen) for r in range(repeats)]
            base, this = median(totals["base"]), median(totals["this"])
            print(f"{'every family, in turn':<42} {'':<8} {base:>7.1f} {this:>7.1f} {this / base:>6.2f}   "
                  f"{runs_of(totals['base'])} | {runs_of(totals['this'])}".rstrip(" |"))
    chosen_families = [name for name, system in chosen if (name, system) in FAMILIES]
    if not chosen_families:  # the lazy functions alone: no family's target
        return
    worst = {side: max(median(runs[side]["alone"][name]) for name in chosen_families) for side in paths}
    line = (f"targets (#35, 2 cores): a family alone <= 40 s (worst: base {worst['base']:.0f} s, "
            f"this {worst['this']:.0f} s)")
    if with_turn and len(chosen) == len(FAMILIES):
        line += (f"; every family <= 90 s (base {median(totals['base']):.0f} s, "
                 f"this {median(totals['this']):.0f} s)")
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--edit", action="store_true", help="time an edit of a policy file and a rerun of its tests")
    mode.add_argument("--wheel", action="store_true", help="build a wheel, install it, time each family's first run")
    mode.add_argument("--clusters", action="store_true",
                      help="each family's cluster loops' first compile, its engine loop cached (with --base: paired)")
    ap.add_argument("--base", metavar="REV", help="the same figures for git revision REV and this checkout, paired")
    ap.add_argument("--repeats", type=int, default=1, help="with --base: each figure this many times (median)")
    ap.add_argument("--systems", help="families by a system of each, comma-separated (default: every family)")
    ap.add_argument("--alone", action="store_true", help="each family alone only (not every family in turn)")
    args = ap.parse_args()
    if args.base and (args.edit or args.wheel):
        ap.error("--base pairs the compile figures or --clusters, not --edit or --wheel")
    if args.alone and (args.clusters or args.edit or args.wheel):
        ap.error("--alone is for the families' compile figures")
    if args.edit:
        edit_cycle()
        return
    if args.wheel:
        wheel_install()
        return
    chosen = families(args.systems)
    if args.clusters:
        clusters(args.base, chosen, max(1, args.repeats))
        return
    if args.base:
        paired(args.base, chosen, max(1, args.repeats), not args.alone)
        return
    single(chosen, not args.alone)


if __name__ == "__main__":
    main()
