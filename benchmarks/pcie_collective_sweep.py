"""Does one collective latency over PCIe explain both multi-GPU runs on RTX PRO 6000s?

LLMServingSim's two runs over two RTX PRO 6000s (Qwen3-32B at TP 2, two all-reduces per layer;
Qwen3-30B-A3B on two data-parallel ranks with expert parallel, an all-gather and a
reduce-scatter per MoE layer) replay a quarter to a third too fast, the one-GPU run of the same
machine 11 % (docs/accuracy.md). The serving model prices every collective at the latency fitted
over the H100's NVLink (``allreduce_s``). This replays the three runs with that one latency set
to each of ``--latencies`` (microseconds) on the RTX PRO 6000, everything else the shipped
constants, and prints each run's error of its mean E2E and TPOT: if one latency brought both
multi-GPU runs within reach, it would be a term to measure; where the two ask for different
ones, latency alone is not what they miss. Nothing is fitted or written; prints.

    python benchmarks/pcie_collective_sweep.py [--latencies 16 50 100 150 200]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from _import_path import ROOT, import_path

import_path()

from pagesim.experiments.real_validate import replay_config, validate_run  # noqa: E402
from pagesim.sim.cost import serving  # noqa: E402
from pagesim.traces.real_runs import read_real_runs  # noqa: E402

GPU = "rtx-pro-6000"
FACTS = ROOT / "experiments" / "data" / "llmservingsim_runs.csv"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latencies", type=float, nargs="+", default=[16, 50, 100, 150, 200, 300])
    args = ap.parse_args()
    runs = [r for r in read_real_runs(FACTS) if r.info.get("gpu") == GPU]
    shipped = serving.load_serving
    print(f"{GPU}: each run's sim / real - 1 of its mean E2E and TPOT, every collective at one latency")
    print(f"{'latency':>9}  " + "  ".join(f"{r.name.removeprefix('RTXPRO6000-')[:24]:>24}" for r in runs))
    try:
        for latency_us in args.latencies:
            def load(gpu, latency_s=latency_us * 1e-6):
                constants, fitted_on, err = shipped(gpu)
                return (replace(constants, allreduce_s=latency_s) if gpu == GPU else constants), fitted_on, err

            serving.load_serving = load
            cells = []
            for run in runs:
                e = validate_run(run, replay_config(run, None, {"cost_model": "serving"})).errors()
                e = e[e["scope"] == "overall"].set_index("metric")["error"]
                cells.append(f"E2E {100 * e['e2e_mean']:+6.1f} TPOT {100 * e['tpot_mean']:+6.1f}")
            print(f"{latency_us:>6.0f} us  " + "  ".join(f"{c:>24}" for c in cells), flush=True)
    finally:
        serving.load_serving = shipped
    return 0


if __name__ == "__main__":
    sys.exit(main())
