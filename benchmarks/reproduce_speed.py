"""Speed of ``pagesim reproduce all`` from an empty run cache (issue 13: < 20 s on 2 cores).

    python benchmarks/reproduce_speed.py [--workers 2] [--repeat 3] [--serial] [--quick]
                                         [--baseline-path DIR]

Each timed run is the real command (``python -m pagesim.sim.cli reproduce all``) in a fresh
process with a fresh cache folder; numba's compiled cache is warmed first (untimed), as after
any first run. Prints per run the wall time, the CPU seconds of the process and its workers,
and the machine's load average; then, as ratios against baselines measured in the same run:

* the simulation work alone: the sum of the runs' own times (each cache entry's
  ``meta.json`` ``wall_time_s``) divided by the workers -> wall / that (the overhead of pool,
  cache, figures and report over a perfectly parallel run);
* ``--serial``: the same command with ``--workers 1`` -> serial / parallel;
* ``--baseline-path DIR``: another checkout (DIR holds a link ``pagesim`` to it, e.g. the code
  before a change), timed alternately with this one -> baseline / this; its CSVs must equal
  this one's byte for byte (a difference is printed).

The machine is shared: take the best of ``--repeat`` runs and read the load beside it.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _import_path import child_env, import_path  # noqa: E402


def this_path() -> str:
    """A PYTHONPATH entry under which ``import pagesim`` is this working tree."""
    return import_path()


def warm(path: str) -> None:
    """Every scheduler family's loops compiled into numba's cache (as the test suite's warm-up)."""
    subprocess.run([sys.executable, "-m", "pagesim.sim.precompile", "--warm"], env=child_env(path), check=True,
                   stderr=subprocess.DEVNULL)


def timed(path: str, out: Path, workers: int, quick: bool) -> tuple[float, float, float]:
    """(wall s, CPU s of the command and its workers, sum of the runs' own times)."""
    cache = out / "cache"
    cmd = [sys.executable, "-m", "pagesim.sim.cli", "reproduce", "all", "--out", str(out / "out"),
           "--cache-dir", str(cache), "--no-progress", "--workers", str(workers)] + (["--quick"] if quick else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=child_env(path), check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    runs = sum(json.loads(m.read_text()).get("wall_time_s", 0.0) for m in cache.glob("*/*/meta.json"))
    return wall, cpu, runs


def csv_differences(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.glob("*.csv")} | {p.name for p in b.glob("*.csv")})
    return [n for n in names if not ((a / n).exists() and (b / n).exists()
                                     and filecmp.cmp(a / n, b / n, shallow=False))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--serial", action="store_true", help="also time --workers 1")
    ap.add_argument("--quick", action="store_true", help="reproduce all --quick (a smoke test of this script)")
    ap.add_argument("--baseline-path", default=None, metavar="DIR",
                    help="a folder holding a link 'pagesim' to another checkout, timed alternately")
    args = ap.parse_args()
    paths = {"this": this_path()}
    if args.baseline_path:
        paths = {"baseline": str(Path(args.baseline_path).resolve()), **paths}
    for p in paths.values():
        warm(p)
    best: dict[str, tuple[float, float, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            for name, p in paths.items():
                out = Path(tmp) / f"{name}-{i}"
                wall, cpu, runs = timed(p, out, args.workers, args.quick)
                load = os.getloadavg()[0]
                print(f"{name:9s} run {i + 1}: {wall:6.1f} s wall, {cpu:6.1f} s CPU, runs' own {runs:6.1f} s, "
                      f"load {load:.1f}", flush=True)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu, runs)
        if args.baseline_path:
            diff = csv_differences(Path(tmp) / "baseline-0" / "out", Path(tmp) / "this-0" / "out")
            print("CSVs: identical to the baseline's" if not diff else f"CSVs DIFFER from the baseline's: {diff}")
        if args.serial:
            wall1, cpu1, _ = timed(paths["this"], Path(tmp) / "serial", 1, args.quick)
            print(f"serial (--workers 1): {wall1:.1f} s wall, {cpu1:.1f} s CPU, load {os.getloadavg()[0]:.1f}")
    wall, cpu, runs = best["this"]
    ideal = runs / args.workers
    print(f"best: {wall:.1f} s wall ({cpu:.1f} s CPU) on {args.workers} workers; the runs alone {runs:.1f} s "
          f"-> {ideal:.1f} s if perfectly parallel: wall / that = {wall / ideal:.2f}x")
    if args.serial:
        print(f"serial / parallel = {wall1 / wall:.2f}x")
    if args.baseline_path:
        b = best["baseline"]
        print(f"baseline: {b[0]:.1f} s wall ({b[1]:.1f} s CPU): baseline / this = {b[0] / wall:.2f}x wall, "
              f"{b[1] / cpu:.2f}x CPU")
    if not args.quick:
        print(f"target: < 20 s on 2 cores from an empty cache: {'met' if wall < 20 else 'NOT met'}")


if __name__ == "__main__":
    main()
