"""How long ``pagesim validate --against`` takes on one real run, as a whole process, compiled
(issue 82: <= 5 s on 2 cores), beside a bare ``import numpy, pandas`` measured in the same run.
Every run of the shipped fact tables (the 16 H100 runs, LLMServingSim's, the published offline
rows), each the best of ``--repeat`` fresh processes, CPU seconds (user + system, ``wait4``)
and wall seconds; the first pass compiles what is missing and is not counted. Prints; asserts
nothing.

    python benchmarks/validate_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from _import_path import ROOT, import_path
from _measure import measured

import_path()

from pagesim.traces.real_runs import read_real_runs  # noqa: E402

TABLES = ("real_runs_h100", "llmservingsim_runs", "published_throughput")
TARGET_S = 5.0


def timed(argv: list[str]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds and exit code of one process of ``argv``."""
    start = time.perf_counter()
    m = measured(argv, check=False)
    return m.cpu_s, time.perf_counter() - start, m.exit_code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    heavy = min(measured([sys.executable, "-c", "import numpy, pandas"]).cpu_s for _ in range(args.repeat))
    print(f"baseline: import numpy, pandas {heavy:.2f} s of CPU")
    worst = 0.0
    for table in TABLES:
        for run in read_real_runs(ROOT / "experiments" / "data" / f"{table}.csv"):
            argv = [sys.executable, "-m", "pagesim.sim.cli", "validate", "--against", table, "--run", run.name,
                    "--no-progress"]
            code = timed(argv)[2]  # compiles what is missing
            cpu, wall, _ = min((timed(argv) for _ in range(args.repeat)), key=lambda t: t[1])
            worst = max(worst, wall)
            note = "" if code == 0 else f"  (exit {code}: refused)"
            print(f"{table:<21} {run.name[-44:]:<44} {cpu:5.2f} s CPU {wall:5.2f} s wall "
                  f"(x{cpu / heavy:.1f} the import){note}")
    print(f"the slowest run: {worst:.2f} s wall (target <= {TARGET_S:g} s): {'met' if worst <= TARGET_S else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
