"""Calibrate the simulator's table cost model on this GPU (thin wrapper over ``gpu.calibrate``).

    python benchmarks/calibrate.py --model llama-2-7b --out profile.csv [--quick] [--tp 1] [--dtype float16]

Same as ``pagesim gpu calibrate``; see gpu/calibrate.py for the profile CSV format.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not


def main(argv=None) -> int:
    from pagesim.sim.cli import main as pagesim_main
    return pagesim_main(["gpu", "calibrate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
