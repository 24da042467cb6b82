"""Every cost model against the decode steps a real GPU run measured (``pagesim validate``'s steps.csv).

    python3 benchmarks/validation_cost_models.py STEPS.csv[.gz] --model llama-2-7b --gpu h100

``validate`` itself prices each step with the roofline and the run's table model; this adds the
calibrated roofline, whose constants were fitted on other measurements (Vidur's tables for the
GPU), so the run is an out-of-sample test of it. Only decode steps whose launches were all
hidden behind the hold (``gaps_hidden``, device timing) are scored. Prints, per model, median,
p90 and median bias (predicted / measured - 1) of the whole step and of its GPU part (the
price less the model's host term, against the measured device time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()

from pagesim.gpu.validate import cpu_term  # noqa: E402
from pagesim.sim.batch import StepBatch  # noqa: E402
from pagesim.sim.cost.calibrated import CalibratedCostModel  # noqa: E402
from pagesim.sim.cost.roofline import RooflineCostModel  # noqa: E402
from pagesim.sim.specs import get_gpu, get_model  # noqa: E402


def score(steps: pd.DataFrame, cost_model) -> dict:
    n = steps["num_decode_seqs"].to_numpy(int)
    price = np.array([cost_model.step_time(StepBatch(decode_seq_ids=np.arange(b), decode_context_sum=c))
                      for b, c in zip(n.tolist(), steps["sum_decode_context"].to_numpy(int).tolist())])
    gpu = price - np.array([cpu_term(cost_model, int(b)) for b in n])
    whole = price / steps["measured_s"].to_numpy(float) - 1
    dev = gpu / steps["measured_gpu_s"].to_numpy(float) - 1
    q = lambda x, p: float(np.percentile(np.abs(x), p))  # noqa: E731
    return {"median": q(whole, 50), "p90": q(whole, 90), "bias": float(np.median(whole)),
            "gpu_median": q(dev, 50), "gpu_p90": q(dev, 90), "gpu_bias": float(np.median(dev))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps")
    ap.add_argument("--model", required=True)
    ap.add_argument("--gpu", required=True)
    a = ap.parse_args(argv)
    s = pd.read_csv(a.steps)
    hidden = s["gaps_hidden"].astype(str) == "True" if "gaps_hidden" in s else pd.Series(True, index=s.index)
    d = s[(s["step_type"] == "decode") & hidden]
    model, gpu = get_model(a.model), get_gpu(a.gpu)
    print(f"{a.steps}: {len(d)} decode steps with every launch hidden (of {len(s)} steps); "
          f"measured median {1e3 * d['measured_s'].median():.2f} ms, device {1e3 * d['measured_gpu_s'].median():.2f} ms")
    print(f"{'cost model':12s} {'whole median':>13s} {'p90':>7s} {'bias':>7s} {'GPU part median':>16s} {'p90':>7s} {'bias':>7s}")
    for name, cm in (("roofline", RooflineCostModel(model, gpu, 1)), ("calibrated", CalibratedCostModel(model, gpu, 1))):
        r = score(d, cm)
        print(f"{name:12s} {100 * r['median']:12.1f}% {100 * r['p90']:6.1f}% {100 * r['bias']:+6.1f}% "
              f"{100 * r['gpu_median']:15.1f}% {100 * r['gpu_p90']:6.1f}% {100 * r['gpu_bias']:+6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
