"""What each measured GPU achieves against the serving model's fitted GPU, written to
``sim/data/serving/achieved.toml``.

The serving model's constants are fractions of the H100's datasheet peaks, fitted on real
serving runs of the H100. A GPU with per-operation timings of its own (Vidur's profiling in
``../shared/measured``: A100-80GB, A40) takes those fractions scaled by what it achieved on the
same operations against the H100 (``sim/cost/achieved.py`` states the rule,
``sim/cost/achieved_fit.py`` computes it): bandwidth on the
memory-bound GEMMs, FLOP/s on the compute-bound ones, the all-reduce's latency and link. Prints
each ratio with the number of measured pairs behind it; and the fitted GPU's fastest measured
compute-bound GEMM, the ceiling of the serving fit's GEMM fraction
(``benchmarks/fit_serving_time.py``).

    python benchmarks/gpu_achieved.py [--measured ../shared/measured]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
from pathlib import Path

from _import_path import ROOT, import_path

import_path()

from pagesim.sim.cost.achieved import ACHIEVED_PATH, RATIOS  # noqa: E402
from pagesim.sim.cost.achieved_fit import (COMPUTE_BOUND_TOKENS, LATENCY_BYTES, LINK_BYTES,  # noqa: E402
                                           MEMORY_BOUND_TOKENS, MIN_WEIGHT_BYTES, achieved_ratios,
                                           highest_compute_fraction)
from pagesim.sim.cost.measured import measured_gpus, read_measured, source_commit  # noqa: E402
from pagesim.sim.cost.serving import FITTED_ON  # noqa: E402
from pagesim.sim.specs import get_gpu  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", type=Path, default=ROOT.parent / "shared" / "measured")
    p.add_argument("--out", type=Path, default=ACHIEVED_PATH)
    args = p.parse_args(argv)
    gpus = [g for g in measured_gpus(args.measured) if g != FITTED_ON]
    if FITTED_ON not in measured_gpus(args.measured) or not gpus:
        raise SystemExit(f"{args.measured}: needs timings of {FITTED_ON} and of another GPU")
    reference = read_measured(args.measured, FITTED_ON)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    lines = ["# Each measured GPU's achieved fractions of its datasheet peaks over the fitted GPU's",
             "# (sim/cost/achieved.py states the rule; sim/cost/serving.py reads this file): written by",
             "# python benchmarks/gpu_achieved.py", "",
             f'reference = "{FITTED_ON}"', "",
             "[provenance]", f'measured = "Vidur profiling, microsoft/vidur@{source_commit(args.measured)}"',
             f"memory_bound_tokens = {MEMORY_BOUND_TOKENS}", f"compute_bound_tokens = {COMPUTE_BOUND_TOKENS}",
             f"min_weight_bytes = {MIN_WEIGHT_BYTES}", f"latency_bytes = {LATENCY_BYTES}",
             f"link_bytes = {LINK_BYTES}", f'pagesim_commit = "{commit}"', f'date = "{datetime.date.today()}"']
    highest, rows = highest_compute_fraction(reference, get_gpu(FITTED_ON))
    print(f"{FITTED_ON}: its fastest compute-bound GEMM reached {highest:.3f} of its datasheet FLOP/s "
          f"({rows} measured)")
    lines += ["", "[fitted]", f"highest_compute_fraction = {highest:.6g}", f"compute_bound_gemms = {rows}"]
    print(f"against {FITTED_ON} (median over the operations measured on both; pairs in brackets)")
    print(f"{'gpu':<12}" + "".join(f"{r:>24}" for r in RATIOS))
    for gpu in gpus:
        ratios = achieved_ratios(read_measured(args.measured, gpu), reference, get_gpu(gpu), get_gpu(FITTED_ON))
        print(f"{gpu:<12}" + "".join(f"{ratios[r]:>16.3f} ({ratios[r + '_pairs']:>5})" for r in RATIOS))
        lines += ["", f'[gpus."{gpu}"]'] + [f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}"
                                            for k, v in ratios.items()]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
