"""Calibrate the simulator's table cost model on this GPU (thin wrapper over ``gpu.calibrate``).

    python benchmarks/calibrate.py --model llama-2-7b --out profile.csv [--quick] [--tp 1] [--dtype float16]

Same as ``pagesim gpu calibrate``; see gpu/calibrate.py for the profile CSV format.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from sim.cli import main as pagesim_main
    return pagesim_main(["gpu", "calibrate", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
