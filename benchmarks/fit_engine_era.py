"""Fit the 2023 engines' GPU-time factor on the DistServe artifact's measured vLLM 0.1.7
(``experiments/engine_era.py`` says what it is and where it is used).

For each cost model, the ``distserve`` figure's colocated runs (vLLM v0's scheduler, three
replicas of OPT-13B on A100-80GB behind round-robin, the artifact's settings and its eight
per-GPU rates) are replayed with every step's GPU time multiplied by a factor, and the factor
whose SLO attainment curve is closest to the artifact's measured one (root mean square over the
rates) is kept: a grid of :data:`STEP` from :data:`LOW` to :data:`HIGH`, then the same around the
best at a tenth of the step. The same search over a CPU cost alone (``--step-overhead-ms``, then
``--per-seq-overhead-ms``, at each cost model's own GPU time) is written beside it. Prints each
candidate's error; writes ``experiments/data/engine_era.toml``.

    python benchmarks/fit_engine_era.py [--out experiments/data/engine_era.toml] [--workers N]
"""

from __future__ import annotations

import argparse
import datetime
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
from _import_path import ROOT, import_path

import_path()

from pagesim.experiments import engine_era, paper  # noqa: E402
from pagesim.experiments.figures.common import SweepOptions, figure_specs  # noqa: E402
from pagesim.experiments.figures.distserve import design_and_gpus, slo_attainment  # noqa: E402

#: the factors tried first: LOW, LOW + STEP, ..., HIGH; then a tenth of STEP around the best
LOW, HIGH, STEP = 1.0, 2.5, 0.1
#: the CPU costs tried alone (ms): a fixed cost per step, and a cost per sequence per step
STEP_OVERHEADS_MS = (3, 10, 20, 30, 40, 60, 80)
PER_SEQ_OVERHEADS_MS = (0.02, 0.1, 0.3, 0.5, 1.0, 2.0)
#: the cost models fitted (``pagesim reproduce --cost-model``'s choices)
COST_MODELS = ("roofline", "calibrated")


def measured() -> dict[float, float]:
    """The artifact's vLLM attainment per per-GPU rate (a fraction)."""
    curve = paper.distserve_paper_curve()
    curve = curve[curve["design"] == "colocated"]
    return dict(zip(curve["per_gpu_rate"].astype(float), curve["slo_attainment"].astype(float)))


def colocated_curve(opts: SweepOptions, **setting) -> dict[float, float]:
    """Ours: the colocated runs' attainment per per-GPU rate, with ``setting`` on every run."""
    specs = [s for s in figure_specs("distserve", False, 1.0, **setting)
             if design_and_gpus(s)[0] == "colocated"]
    summaries = opts.run(specs)
    return {round(spec.rate / design_and_gpus(spec)[1], 6): slo_attainment(summary)
            for spec, summary in zip(specs, summaries)}


def rms(ours: dict[float, float], theirs: dict[float, float]) -> float:
    """Root mean square of ours minus theirs over the rates both have (none: an error)."""
    both = [r for r in theirs if r in ours]
    if not both:
        raise SystemExit(f"no per-GPU rate in common: ours {sorted(ours)}, measured {sorted(theirs)}")
    return math.sqrt(float(np.mean([(ours[r] - theirs[r]) ** 2 for r in both])))


def search(opts: SweepOptions, theirs: dict[float, float], key: str, values, **fixed) -> tuple[float, float, dict]:
    """The value of setting ``key`` among ``values`` whose curve is closest: (value, rms, curve)."""
    best = None
    for v in values:
        curve = colocated_curve(opts, **fixed, **{key: float(v)})
        err = rms(curve, theirs)
        print(f"  {key} {v:g}: rms {100 * err:.1f} points  " + " ".join(f"{100 * curve[r]:.0f}" for r in sorted(curve)))
        if best is None or err < best[1]:
            best = (float(v), err, curve)
    return best


def git_revision() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def toml_list(values) -> str:
    return "[" + ", ".join(f"{v:.6g}" for v in values) + "]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=engine_era.PATH)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    opts = SweepOptions(workers=args.workers, progress=False)
    theirs = measured()
    print("measured (the artifact's vLLM 0.1.7): "
          + " ".join(f"{r:g}: {100 * a:.0f}" for r, a in sorted(theirs.items())))
    scales, fits, alternatives = {}, {}, {}
    for cost_model in COST_MODELS:
        print(f"{cost_model}: the GPU time's factor")
        coarse = np.round(np.arange(LOW, HIGH + STEP / 2, STEP), 6)
        best, _, _ = search(opts, theirs, "cost_scale", coarse, cost_model=cost_model)
        fine = np.round(np.arange(max(LOW, best - STEP), min(HIGH, best + STEP) + STEP / 20, STEP / 10), 6)
        scale, err, curve = search(opts, theirs, "cost_scale", fine, cost_model=cost_model)
        rates = sorted(theirs)
        scales[cost_model] = scale
        fits[cost_model] = {"scale": scale, "rms": err, "per_gpu_rate": rates,
                            "slo_attainment": [curve[r] for r in rates], "measured": [theirs[r] for r in rates]}
        print(f"{cost_model}: x{scale:g}, rms {100 * err:.1f} points")
        alternatives[cost_model] = {}
        for key, values in (("step_overhead_ms", STEP_OVERHEADS_MS), ("per_seq_overhead_ms", PER_SEQ_OVERHEADS_MS)):
            print(f"{cost_model}: {key} alone")
            value, err, _ = search(opts, theirs, key, values, cost_model=cost_model)
            alternatives[cost_model][key] = {"value": value, "rms": err}
    lines = [
        "# The 2023 engines' GPU-time factor per cost model, fitted on the DistServe artifact's measured",
        "# vLLM 0.1.7 (experiments/engine_era.py). Written by benchmarks/fit_engine_era.py; do not edit.",
        "",
        "[source]",
        'measured = "experiments/data/paper_numbers.csv: distserve, vllm, slo_attainment_pct (the DistServe '
        'artifact, github.com/LLMServe/DistServe at 82831f1, evaluation/2-benchmark-serving/plot.ipynb: '
        'vLLM 0.1.7, OPT-13B, A100-80GB, ShareGPT chatbot, 100 requests per GPU)"',
        'replayed = "experiments/configs/distserve.toml: its colocated case (vllm x 3, round-robin)"',
        f'objective = "root mean square of the attainment difference over the {len(theirs)} rates; grid {LOW:g}-'
        f'{HIGH:g} by {STEP:g}, then by {STEP / 10:g} around the best"',
        f'fitted = "{datetime.date.today().isoformat()} at {git_revision()}"',
        "",
        "[scale]",
        *(f"{cost_model} = {scale:.6g}" for cost_model, scale in scales.items()),
    ]
    for cost_model, fit in fits.items():
        lines += ["", f"[fit.{cost_model}]", f"scale = {fit['scale']:.6g}", f"rms = {fit['rms']:.6g}",
                  f"per_gpu_rate = {toml_list(fit['per_gpu_rate'])}",
                  f"slo_attainment = {toml_list(fit['slo_attainment'])}", f"measured = {toml_list(fit['measured'])}"]
    for cost_model, found in alternatives.items():
        for key, v in found.items():
            lines += ["", f"[alternatives.{cost_model}.{key}]", f"value = {v['value']:.6g}", f"rms = {v['rms']:.6g}"]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
