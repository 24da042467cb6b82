"""Benchmark the PagedAttention decode kernel (thin wrapper over ``gpu.bench``; needs a CUDA GPU).

    python benchmarks/gpu_kernel.py [--quick] [--out CSV] [--reps N] [--mem-budget-gib G]

Same as ``pagesim gpu bench``; writes benchmarks/results/gpu_kernel_<date>_<gpu>.csv by default.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

from pagesim.sim.errors import PagesimError  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--mem-budget-gib", type=float, default=None)
    args = ap.parse_args(argv)
    from pagesim.gpu.bench import run
    try:
        run(quick=args.quick, out=args.out, reps=args.reps, mem_budget_gib=args.mem_budget_gib)
    except PagesimError as e:
        print(f"gpu_kernel.py: error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
