"""The calibrated model on decode-sized cells (at most 256 tokens), held out, and without each of its
measured tables.

    python benchmarks/decode_sized_variants.py [--measured DIR]

For each measured GPU, leave-one-model-out as ``benchmarks/cost_accuracy.py`` (each model priced by
a calibration fitted on the other models only), p90 of |error| over the decode-sized cells:

* as shipped: each GEMM the formula times the ratio of its nearest measured shapes within the
  fitted radius (``sim.cost.calibrated.nearest_ratios``), the all-reduce from the measured
  collective table;
* without the shape ratios (the formula alone), with the all-reduce by the fitted line instead of
  the table, and with neither (the model before 2026-11-29's second session);
* unseen shapes: the held-out model's own GEMM shapes struck from the ratio table (Llama-2-70B and
  Llama-3-70B run the same shapes, CodeLlama-34B's attention ones too): how the ratios carry to a
  shape nobody measured;
* the cells at TP 1, where there is no all-reduce.

Then the GEMMs alone (qkv, o, up, down of every layer cell of at most 256 tokens), median / p90 of
|error|, held out: the formula, with the shape ratios, and with the held-out shapes struck.

Within the collective table's sizes a cell's all-reduce is its measurement (the cells add the
same table), so the shipped cells' error is the held-out model's operations', attention's and
the LM head's. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_path import import_path  # noqa: E402

import_path()  # `import pagesim` works from this working tree, installed or not

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from pagesim.sim.cost import calibration_fit as fit  # noqa: E402
from pagesim.sim.cost.calibrated import layer_gemm_shapes  # noqa: E402
from pagesim.sim.cost.measured import measured_gpus, read_measured  # noqa: E402
from pagesim.sim.specs import get_gpu  # noqa: E402

DECODE_SIZED = 256
NO_RATIOS = dict(gemm_neighbours=0, gemm_radius=0.0, gemm_shape_k=(), gemm_shape_n=(), gemm_grid_tokens=(),
                 gemm_ratio=())
NO_TABLE = dict(allreduce_table_tp=(), allreduce_table_bytes=(), allreduce_table_s=())


def strike_shapes(cal, shapes):
    """``cal`` without the ratio rows of ``shapes`` (its neighbour count kept, at most the rows left)."""
    grid = len(cal.gemm_grid_tokens)
    keep = [i for i, shape in enumerate(zip(cal.gemm_shape_k, cal.gemm_shape_n)) if shape not in shapes]
    return replace(cal, gemm_shape_k=tuple(cal.gemm_shape_k[i] for i in keep),
                   gemm_shape_n=tuple(cal.gemm_shape_n[i] for i in keep),
                   gemm_ratio=tuple(x for i in keep for x in cal.gemm_ratio[i * grid:(i + 1) * grid]),
                   gemm_neighbours=min(cal.gemm_neighbours, len(keep)))


def model_shapes(measured, model) -> set:
    spec = measured.models[model].spec
    return {(float(k), float(n)) for tp in measured.models[model].ops["tp"].unique()
            for k, n in layer_gemm_shapes(spec, int(tp))}


def gemm_errors(measured, gpu, model, cal) -> np.ndarray:
    """|error| of ``model``'s GEMM timings of at most 256 tokens under ``cal`` (ratios or not)."""
    rows = fit._gemm_rows(measured, [model])
    tokens, y = rows[0], rows[4]
    constants = {f: getattr(cal, f) for f in ("gemm_fixed_s", "gemm_compute_eff", "gemm_memory_eff", "gemm_overlap",
                                              "gemm_tile_tokens")}
    price = fit._gemm_formula(rows, gpu, constants)
    if cal.gemm_neighbours:
        price = price * fit.row_ratios(rows, *cal.gemm_table(), cal.gemm_neighbours, cal.gemm_radius)
    return np.abs(price / y - 1)[tokens <= DECODE_SIZED]


def main() -> None:
    shared = Path(os.environ.get("PAGESIM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=str(shared / "measured"))
    args = ap.parse_args()
    variants = {"shipped": lambda cal, held: cal, "no shape ratios": lambda cal, held: replace(cal, **NO_RATIOS),
                "AR line": lambda cal, held: replace(cal, **NO_TABLE),
                "neither": lambda cal, held: replace(cal, **NO_RATIOS, **NO_TABLE), "unseen shapes": None}
    cell_rows, gemm_rows = [], []
    for name in measured_gpus(args.measured):
        gpu = get_gpu(name)
        measured = read_measured(args.measured, gpu.name)
        attention = fit.attention_source(args.measured, measured)
        frames = {v: [] for v in variants}
        gemms = {v: [] for v in ("formula", "shape ratios", "unseen shapes")}
        for held in sorted(measured.models):
            cal = fit.fit_calibration(measured, gpu, [m for m in sorted(measured.models) if m != held], attention)
            unseen = strike_shapes(cal, model_shapes(measured, held))
            for v, edit in variants.items():
                priced = unseen if edit is None else edit(cal, held)
                frames[v].append(fit.score(measured, held, gpu, "calibrated", priced))
            for v, c in (("formula", replace(cal, **NO_RATIOS)), ("shape ratios", cal), ("unseen shapes", unseen)):
                gemms[v].append(gemm_errors(measured, gpu, held, c))
        row = [gpu.name]
        for v in variants:
            cells = pd.concat(frames[v], ignore_index=True)
            cells = cells[cells["tokens"] <= DECODE_SIZED]
            row.append(f"{100 * np.quantile(np.abs(cells['error']), 0.9):.1f}")
            if v == "shipped":
                tp1 = cells[cells["tp"] == 1]
                cell_count, tp1_p90 = len(cells), np.quantile(np.abs(tp1["error"]), 0.9)
        cell_rows.append(row + [f"{100 * tp1_p90:.1f}", str(cell_count)])
        gemm_rows.append([gpu.name] + [f"{100 * np.median(np.concatenate(e)):.1f} / "
                                       f"{100 * np.quantile(np.concatenate(e), 0.9):.1f}" for e in gemms.values()])
    print("| GPU | shipped | no shape ratios | AR line | neither | unseen shapes | TP 1 | cells |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in cell_rows:
        print("| " + " | ".join(row) + " |")
    print("\np90 of |error| in %, held out, over the decode-sized cells (at most 256 tokens): as shipped;")
    print("without the GEMM shapes' ratios; the all-reduce by the fitted line instead of the measured")
    print("table; neither; the held-out model's own shapes struck from the ratio table; shipped, TP 1.")
    print("\n| GPU | GEMMs: formula | shape ratios | unseen shapes |")
    print("|---|---|---|---|")
    for row in gemm_rows:
        print("| " + " | ".join(row) + " |")
    print("\nmedian / p90 of |error| in %, held out, over the GEMM timings of at most 256 tokens.")


if __name__ == "__main__":
    main()
