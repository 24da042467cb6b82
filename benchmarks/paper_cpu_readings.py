"""The paper figures' CPU-cost readings: Fig. 14 and Fig. 16 rerun with 0.3 ms of CPU per sequence.

    python benchmarks/paper_cpu_readings.py [--workers N]

Fig. 13's reading finds that the paper's own batch sizes imply about 0.3 ms of CPU per sequence
per iteration (its 2023 Python sampler and block tables) where the roofline charges 0.02 ms.
Fig. 16's reading (``CPU_READING`` in ``experiments/figures/fig16.py``) quotes what its ratios
become with that CPU cost for every system; this script measures them, and Fig. 14's, beside the
default runs in the same invocation: the whole figures (as ``pagesim reproduce``), once with the
default CPU cost and once with ``per_seq_overhead_ms=0.3``.
Prints each figure's ratio table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

import pandas as pd  # noqa: E402

from pagesim.experiments.figures import fig14, fig16  # noqa: E402
from pagesim.experiments.figures.common import SweepOptions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    t0 = time.perf_counter()
    for label, base in (("default CPU cost", {}), ("0.3 ms CPU per sequence", {"per_seq_overhead_ms": 0.3})):
        opts = SweepOptions(workers=args.workers, progress=False, base=base)
        for fig in (fig14, fig16):
            r = fig.ratios(fig.run(opts))
            cols = [c for c in ("mode", "width", "workload", "system", "sustainable_rate", "vllm_throughput",
                                "orca_oracle_throughput", "vllm_ratio", "throughput_ratio", "paper_ratio")
                    if c in r.columns]
            print(f"== {fig.__name__.rsplit('.', 1)[-1]}, {label}")
            print(r[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
