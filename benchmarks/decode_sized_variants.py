"""Variants of the calibrated roofline tried on decode-sized cells (at most 256 tokens), held out.

    python benchmarks/decode_sized_variants.py [--measured DIR]

For each measured GPU, leave-one-model-out as ``benchmarks/cost_accuracy.py``:

* GEMMs alone (qkv, o, up, down of every layer cell), median / p90 of |error| over the
  held-out model's GEMM timings of at most 256 tokens, for the shipped formula
  (``sim.core.cost_calibrated.gemm_seconds``: rows padded to a whole tile) and three variants:
  rows padded by a fitted fraction of the tile (``half``: a fitted weight on the padding),
  every extra tile of rows re-reading a fitted fraction of the weights from HBM (``reread``),
  and the compute efficiency scaled by the share of the SMs the tiles' last wave fills, to a
  fitted power (``occupancy``: tiles of the fitted rows x 128 columns over the GPU's SMs);
* the decode-sized cells' p90 with the all-reduce priced as the cheaper of two fitted
  latency + size / bandwidth lines per TP degree (NCCL picks the protocol it predicts fastest)
  instead of one line, the rest of each cell as shipped; and with the all-reduce taken from the
  measured collective table itself (not a model: what is left when the all-reduce is exact),
  overall and at TP 1 (where no cell has one);
* floors: the decode-sized cells' p90 with every operation of the held-out model exact (its own
  measurement; only the all-reduce and attention priced), with the all-reduce as shipped and as
  the best non-decreasing curve through the collective table (fitted on the table itself: a
  bound for any all-reduce model that never gets cheaper as it grows, not a held-out model);
  and with the operations' held-out error scaled by 0.75 and 0.5 (the all-reduce as shipped):
  how much better the per-operation formulas would have to be.

The variants are written here, not in the simulator: none is kept. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
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
#: streaming multiprocessors per GPU (NVIDIA's datasheets), for the occupancy variant
SMS = {"a100-80gb": 108, "a40": 84, "h100-80gb": 132}
TILE_COLUMNS = 128


def gemm(tokens, k, n, dtype, peak, bw, fixed, compute_eff, memory_eff, overlap, tile, pad_weight, reread,
         occupancy=0.0, sms=1):
    """``sim.core.cost_calibrated.gemm_seconds`` with the variants' knobs (1, 0, 0: as shipped)."""
    tiles = -(-tokens // tile)
    rows = tokens + pad_weight * (tiles * tile - tokens)
    blocks = tiles * -(-n // TILE_COLUMNS)  # the kernel's thread blocks, a wave of them per sms
    fill = blocks / (-(-blocks // sms) * sms)
    compute = 2.0 * rows * k * n / (peak * compute_eff * fill ** occupancy)
    memory = dtype * (k * n * (1 + reread * (tiles - 1)) + tokens * (k + n)) / (bw * memory_eff)
    return fixed + (1 + overlap) * 0.5 * (compute + memory) + (1 - overlap) * 0.5 * abs(compute - memory)


def gemm_rows(measured, models):
    return fit._stack(measured, models, lambda spec, tp: [
        (op, (*shape, spec.dtype_bytes)) for op, shape in zip(fit.GEMM_OPS, layer_gemm_shapes(spec, tp))])


def gemm_variant(measured, gpu, variant: str) -> np.ndarray:
    """|error| of the held-out GEMM timings of at most 256 tokens, every model held out in turn."""
    errors = []
    for held in sorted(measured.models):
        tokens, k, n, dtype, y = gemm_rows(measured, [m for m in sorted(measured.models) if m != held])
        best = None
        for tile in fit.TILE_TOKENS:
            if variant == "shipped":
                price = lambda p: gemm(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, *p, tile, 1.0, 0.0)  # noqa: E731
                x0 = [5e-6, 0.7, 0.8, 0.3]
            elif variant == "half":
                price = lambda p: gemm(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, *p, tile, 0.0)  # noqa: E731
                x0 = [5e-6, 0.7, 0.8, 0.3, 0.5]
            elif variant == "reread":
                price = lambda p: gemm(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, *p[:4], tile, 1.0, p[4])  # noqa: E731
                x0 = [5e-6, 0.7, 0.8, 0.3, 0.3]
            else:
                price = lambda p: gemm(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, *p[:4], tile, 1.0, 0.0,  # noqa: E731
                                       p[4], SMS[gpu.name])
                x0 = [5e-6, 0.7, 0.8, 0.3, 0.3]
            p, loss = fit.robust_fit(price, y, x0)
            if best is None or loss < best[0]:
                best = (loss, tile, list(p))
        _, tile, p = best
        fitted = p[4] if variant != "shipped" else 0.0  # the variant's own constant
        knobs = {"shipped": [1.0, 0.0, 0.0], "half": [fitted, 0.0, 0.0], "reread": [1.0, fitted, 0.0],
                 "occupancy": [1.0, 0.0, fitted]}[variant]
        t2, k2, n2, d2, y2 = gemm_rows(measured, [held])
        e = gemm(t2, k2, n2, d2, gpu.peak_flops, gpu.mem_bw, *p[:4], tile, *knobs, SMS[gpu.name]) / y2 - 1
        errors.append(np.abs(e[t2 <= DECODE_SIZED]))
    return np.concatenate(errors)


def two_lines(size, p):
    return np.minimum(p[0] + size / p[1], p[2] + size / p[3])


def allreduce_variant(cells: pd.DataFrame, priced: dict) -> tuple[float, float, float, float]:
    """The decode-sized cells' p90 as shipped, with the all-reduce as the cheaper of two lines,
    and with it as measured (the collective table, interpolated as the cells' measurement is):
    overall and at TP 1."""
    measured_s = cells["measured_s"].to_numpy()
    shipped = np.quantile(np.abs(cells["error"]), 0.9)
    variant = cells["predicted_s"].to_numpy() + priced["two lines"] - priced["shipped"]
    exact = cells["predicted_s"].to_numpy() + priced["measured"] - priced["shipped"]
    as_measured = np.abs(exact / measured_s - 1)
    return (shipped, np.quantile(np.abs(variant / measured_s - 1), 0.9), np.quantile(as_measured, 0.9),
            np.quantile(as_measured[cells["tp"].to_numpy() == 1], 0.9))


def nondecreasing(y: np.ndarray) -> np.ndarray:
    """The least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    means, counts = [], []
    for v in y:
        means.append(float(v))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            n = counts[-2] + counts[-1]
            means[-2:] = [(means[-2] * counts[-2] + means[-1] * counts[-1]) / n]
            counts[-2:] = [n]
    return np.repeat(means, counts)


def allreduce_priced(measured, cells: pd.DataFrame) -> dict:
    """Each cell's two all-reduces (s; 0 where the cell has none) as shipped (one fitted line), as
    the cheaper of two fitted lines, as measured (the table, interpolated as the cells' measurement
    is) and as the non-decreasing fit of the table (in log time)."""
    one = fit.fit_allreduce(measured)
    priced = {kind: np.zeros(len(cells)) for kind in ("shipped", "two lines", "measured", "non-decreasing")}
    for i, tp in enumerate(one["allreduce_tp"]):
        t = measured.allreduce[measured.allreduce["tp"] == tp]
        size, y = t["size"].to_numpy(float), t["ms"].to_numpy(float) * 1e-3
        lat, bw = one["allreduce_latency_s"][i], one["allreduce_bytes_per_s"][i]
        best = None
        for x0 in ([5e-6, 2e10, lat, bw], [1.5e-5, 5e10, 4e-5, 1.5e11]):
            p, loss = fit.robust_fit(lambda p: two_lines(size, p), y, x0)
            if best is None or loss < best[1]:
                best = (p, loss)
        sel = ((cells["tp"] == tp) & (cells["phase"] == "layers")).to_numpy()
        specs = [measured.models[m].spec for m in cells.loc[sel, "model"]]
        s = cells.loc[sel, "tokens"].to_numpy() * np.array([x.hidden_size * x.dtype_bytes for x in specs])
        priced["shipped"][sel] = 2 * (lat + s / bw)
        priced["two lines"][sel] = 2 * two_lines(s, best[0])
        priced["measured"][sel] = 2 * measured.allreduce_ms(int(tp), s) * 1e-3
        priced["non-decreasing"][sel] = 2 * np.interp(s, size, np.exp(nondecreasing(np.log(y))))
    return priced


def floors(cells: pd.DataFrame, priced: dict) -> list[float]:
    """p90 of the decode-sized cells: the held-out model's operations exact with the all-reduce as
    shipped and as the non-decreasing fit of its table; the operations' error scaled by 0.75 and 0.5."""
    # an attention cell's operations are its model's layers cell at the same token count (TP 1)
    layers = cells[cells["phase"] == "layers"].set_index(["model", "tp", "tokens"])
    key = pd.MultiIndex.from_arrays([cells["model"], cells["tp"], cells["tokens"]])
    attention = (cells["phase"] != "layers").to_numpy()
    ops_measured = np.where(attention, layers["measured_s"].reindex(key).to_numpy(),
                            cells["measured_s"].to_numpy() - priced["measured"])
    ops_predicted = np.where(attention, layers["predicted_s"].reindex(key).to_numpy(),
                             cells["predicted_s"].to_numpy() - priced["shipped"])
    rest = cells["predicted_s"].to_numpy() - ops_predicted  # attention or the all-reduce, as priced
    measured_s = cells["measured_s"].to_numpy()

    def p90(predicted):
        return float(np.quantile(np.abs(predicted / measured_s - 1), 0.9))

    out = [p90(ops_measured + rest), p90(ops_measured + rest - priced["shipped"] + priced["non-decreasing"])]
    out += [p90(ops_measured + scale * (ops_predicted - ops_measured) + rest) for scale in (0.75, 0.5)]
    return out


def main() -> None:
    shared = Path(os.environ.get("PAGESIM_SHARED") or Path(__file__).resolve().parents[2] / "shared")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measured", default=str(shared / "measured"))
    args = ap.parse_args()
    print("| GPU | GEMMs shipped | padded | re-read | occupancy | cells | two lines | AR measured | TP 1 |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    floor_rows = []
    for name in measured_gpus(args.measured):
        gpu = get_gpu(name)
        measured = read_measured(args.measured, gpu.name)
        row = [gpu.name]
        for variant in ("shipped", "half", "reread", "occupancy"):
            e = gemm_variant(measured, gpu, variant)
            row.append(f"{100 * np.median(e):.1f} / {100 * np.quantile(e, 0.9):.1f}")
        lomo = fit.leave_one_model_out(measured, gpu, fit.attention_source(args.measured, measured))
        cells = lomo[lomo["tokens"] <= DECODE_SIZED]
        priced = allreduce_priced(measured, cells)
        row += [f"{100 * x:.1f}" for x in allreduce_variant(cells, priced)]
        print("| " + " | ".join(row) + " |")
        floor_rows.append([gpu.name] + [f"{100 * x:.1f}" for x in floors(cells, priced)])
    print("\nmedian / p90 of |error| in %, held out. GEMMs alone: as shipped; rows padded by a fitted")
    print("weight; extra tiles re-reading weights; SM occupancy. Then p90 over every decode-sized cell:")
    print("one all-reduce line (shipped); the cheaper of two lines; the all-reduce as measured (its table);")
    print("of that, the TP 1 cells alone (the A40 has no collective table: all its cells are at TP 1).")
    print("\n| GPU | ops exact, AR shipped | ops exact, AR non-decreasing | ops' error x 0.75 | x 0.5 |")
    print("|---|---:|---:|---:|---:|")
    for row in floor_rows:
        print("| " + " | ".join(row) + " |")
    print("\np90 of |error| in % over the decode-sized cells: every operation of the held-out model")
    print("exact (attention and the all-reduce priced), the all-reduce as shipped or as the best")
    print("non-decreasing curve through its table (in-sample: a bound, not a model); then the")
    print("operations' held-out error scaled, the all-reduce as shipped.")


if __name__ == "__main__":
    main()
