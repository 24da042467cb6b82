"""How accurate is the time: each cost model's GPU time per iteration against measured GPU timings.

    python benchmarks/cost_accuracy.py [--measured DIR] [--gpus a100-80gb,h100-80gb,a40]

For each measured GPU, in the same run: the roofline (``sim/cost/roofline.py``, unfitted) on every
measured cell of every model (``sim/cost/measured.py``), and the calibrated roofline
(``sim/cost/calibrated.py``) leave-one-model-out: every model priced with constants fitted
(``sim/cost/calibration_fit.py``) on the other models only. Prints |predicted/measured - 1| as
median / p90 / max per GPU and phase (before -> after), and over the decode-sized cells
(at most 256 tokens, where serving runs), then per held-out model, as the
markdown tables of docs/accuracy.md. ``DIR`` defaults to
``$PAGESIM_SHARED/measured`` or ``../shared/measured``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

import pandas as pd  # noqa: E402

from pagesim.sim.cost import error as cost_error  # noqa: E402
from pagesim.sim.cost.calibration_fit import (attention_source, leave_one_model_out,  # noqa: E402
                                              score)
from pagesim.sim.cost.measured import measured_gpus, read_measured  # noqa: E402
from pagesim.sim.specs import get_gpu  # noqa: E402


#: decode-sized steps: a cell of at most this many tokens (decode batch, prefill chunk or layer tokens)
DECODE_SIZED = 256


def band(s: dict) -> str:
    return f"{100 * s['median']:.1f} / {100 * s['p90']:.1f} / {100 * s['max']:.0f}"


def main() -> None:
    shared = Path(os.environ.get("PAGESIM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=str(shared / "measured"),
                    help="measured folder (sim/cost/measured.py)")
    ap.add_argument("--gpus", default=None, help="comma-separated GPU presets (default: every measured one)")
    args = ap.parse_args()
    gpus = args.gpus.split(",") if args.gpus else measured_gpus(args.measured)
    per_gpu, per_model = [], []
    t0 = time.perf_counter()
    for name in gpus:
        gpu = get_gpu(name)
        measured = read_measured(args.measured, gpu.name)
        roof = pd.concat([score(measured, m, gpu, "roofline") for m in sorted(measured.models)], ignore_index=True)
        lomo = leave_one_model_out(measured, gpu, attention_source(args.measured, measured))
        r, c = cost_error.summary(roof), cost_error.summary(lomo)
        for phase in ("all", "decode", "prefill", "layers"):
            if phase in c:
                per_gpu.append((gpu.name, phase, c[phase]["cells"], band(r[phase]), band(c[phase])))
        # the steps serving runs at: every cell of at most DECODE_SIZED tokens (issue #33's target)
        small_r, small_c = roof[roof["tokens"] <= DECODE_SIZED], lomo[lomo["tokens"] <= DECODE_SIZED]
        per_gpu.append((gpu.name, f"<= {DECODE_SIZED} tokens", len(small_c), band(cost_error.stats(small_r["error"])),
                        band(cost_error.stats(small_c["error"]))))
        rm = roof.groupby("model")
        for model, g in lomo.groupby("model", sort=True):
            per_model.append((gpu.name, model, len(g), band(cost_error.stats(rm.get_group(model)["error"])),
                              band(cost_error.stats(g["error"]))))
    print(f"# cost accuracy: |predicted / measured - 1|, median / p90 / max in %  ({args.measured}, "
          f"{time.perf_counter() - t0:.0f} s)\n")
    print("| GPU | phase | cells | roofline | calibrated (leave-one-model-out) |")
    print("|---|---|---:|---|---|")
    for row in per_gpu:
        print("| " + " | ".join(map(str, row)) + " |")
    print("\n| GPU | held-out model | cells | roofline | calibrated (fitted without it) |")
    print("|---|---|---:|---|---|")
    for row in per_model:
        print("| " + " | ".join(map(str, row)) + " |")


if __name__ == "__main__":
    main()
