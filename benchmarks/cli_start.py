"""How long a command's help takes to print, as a whole process (issue 85: a command imports only
what it uses), beside baselines measured in the same run: a bare interpreter (``python -c pass``)
and a bare ``import numpy, pandas``. Each the best of ``--repeat`` fresh processes, CPU seconds
(user + system, ``wait4``). Prints; asserts nothing.

    python benchmarks/cli_start.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys

from _measure import measured

COMMANDS = (["--help"], ["simulate", "--help"], ["trace", "--help"], ["reproduce", "--help"], ["report", "--help"],
            ["plan", "--help"], ["validate", "--help"])


def cpu_seconds(argv: list[str]) -> float:
    return measured(argv, check=False).cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    best = lambda argv: min(cpu_seconds(argv) for _ in range(args.repeat))  # noqa: E731
    bare = best([sys.executable, "-c", "pass"])
    heavy = best([sys.executable, "-c", "import numpy, pandas"])
    print(f"baselines: python -c pass {bare:.2f} s of CPU; import numpy, pandas {heavy:.2f} s")
    for command in COMMANDS:
        seconds = best([sys.executable, "-m", "pagesim.sim.cli", *command])
        print(f"pagesim {' '.join(command):<20} {seconds:5.2f} s  (x{seconds / bare:.1f} a bare interpreter, "
              f"x{seconds / heavy:.2f} import numpy, pandas)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
