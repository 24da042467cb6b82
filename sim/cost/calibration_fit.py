"""Fitting the calibrated roofline's constants on measured timings (``pagesim cost fit``).

Each group of constants is fitted on the timings of the kernels it prices, on relative error
(residuals ``log(predicted / measured)``), with Levenberg-Marquardt over the logarithms of the
constants (they stay positive) and Huber weights (iteratively reweighted: a residual beyond
5 % counts linearly, not squared), so a few cells where cuBLAS switched to a slow kernel do not
drag the rest:

    GEMM          gemm_fixed_s, compute_eff, memory_eff, overlap  on every qkv/o/up/down timing of every
                  fitted model and TP degree, for each tile of 64, 128 or 256 rows; the tile with the
                  lowest loss wins
    GEMM shapes   each measured shape's measured / formula ratio   median over the models sharing it, at
                  at every measured token count                   each token count (no fit: the table)
                  neighbours, radius: how many nearest shapes     chosen leave-one-model-out among the
                  price one, and within what distance             fitted models (choose_neighbours)
    elementwise   fixed_s, memory_eff per kind                    on that kind's timings
    decode attn   fixed_s, per_seq_s, bw_coef, bw_exponent        on the measured decode attention rows
    prefill attn  fixed_s, compute_eff, causal_fraction          on the measured prefill attention rows
    all-reduce    latency_s, bytes_per_s per TP degree           on the measured collective table, which
                                                                  is kept too: it prices the sizes it holds

Attention is measured for one GPU and model only (A100, Llama-2-7B): a GPU without attention rows
takes that fit's constants (efficiencies as fractions of its own peaks), and its provenance says so.
The fit is deterministic: same tables, same constants.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from pagesim.sim.core.price import cost_calibrated as formulas
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.cost import error as cost_error
from pagesim.sim.cost.calibrated import elementwise_bytes_per_token, layer_gemm_shapes, nearest_ratios
from pagesim.sim.cost.calibration import ELEMENTWISE, Calibration
from pagesim.sim.cost.measured import MeasuredGPU, cells, measured_gpus, read_measured
from pagesim.sim.errors import ConfigError
from pagesim.sim.specs import GPUSpec, get_gpu

#: a line per phase of a fit (``pagesim cost fit`` takes minutes): the command line prints them
LOG = logging.getLogger(__name__)

# the formulas over numpy arrays of measured rows: their interpreted form (the same source)
gemm_seconds = interpreted(formulas.gemm_seconds)
elementwise_seconds = interpreted(formulas.elementwise_seconds)
allreduce_seconds = interpreted(formulas.allreduce_seconds)
decode_bandwidth = interpreted(formulas.decode_bandwidth)
decode_attention_seconds = interpreted(formulas.decode_attention_seconds)
prefill_attention_flops = interpreted(formulas.prefill_attention_flops)
prefill_attention_seconds = interpreted(formulas.prefill_attention_seconds)

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # layer_gemm_shapes' order
ELEMENTWISE_OPS = {"norm": ("input_layernorm", "post_attention_layernorm"), "rope": ("attn_rope",),
                   "act": ("mlp_act",), "add": ("add",)}
TILE_TOKENS = (64, 128, 256)
#: how many nearest measured shapes may price a GEMM, and within what distance
#: (sim.cost.calibrated.nearest_ratios: |ln K ratio| + |ln N ratio|; 0.25 is about 30 % in one
#: dimension, inf any): the fit chooses one of each, leave-one-model-out (choose_neighbours)
NEIGHBOURS = (1, 2, 3, 4, 6)
RADII = (0.25, 0.5, 1.0, math.inf)
HUBER_DELTA = 0.05
MAX_LOG_STEP = 2.0


def levenberg_marquardt(residuals, x0, max_iter: int = 200) -> np.ndarray:
    """Minimize ``sum(residuals(x)**2)`` over positive ``x``, stepping in ``log x`` (forward-difference
    Jacobian). Returns the positive minimizer."""
    z = np.log(np.asarray(x0, float))
    r = residuals(np.exp(z))
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(max_iter):
        jac = np.empty((len(r), len(z)))
        for j in range(len(z)):
            dz = np.zeros_like(z)
            dz[j] = 1e-7
            jac[:, j] = (residuals(np.exp(z + dz)) - r) / 1e-7
        a, g = jac.T @ jac, jac.T @ r
        while True:
            # a step changes no constant by more than e^2 (7x): far steps overflow, not converge
            step = np.clip(np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -g), -MAX_LOG_STEP, MAX_LOG_STEP)
            r_new = residuals(np.exp(z + step))
            cost_new = float(r_new @ r_new)
            if np.isfinite(cost_new) and cost_new < cost:
                z, r, cost = z + step, r_new, cost_new
                damping = max(damping / 3, 1e-12)
                break
            damping *= 4
            if damping > 1e12:
                return np.exp(z)
        if np.max(np.abs(step)) < 1e-10:
            break
    return np.exp(z)


def huber_loss(residuals: np.ndarray) -> float:
    """The Huber loss of relative (log) residuals: squared up to :data:`HUBER_DELTA`, linear beyond."""
    a = np.abs(residuals)
    return float(np.sum(np.where(a <= HUBER_DELTA, 0.5 * a * a, HUBER_DELTA * (a - 0.5 * HUBER_DELTA))))


def robust_fit(predict, measured: np.ndarray, x0, rounds: int = 4) -> tuple[np.ndarray, float]:
    """Constants minimizing the Huber loss of ``log(predict(x) / measured)`` by iteratively
    reweighted least squares, and that loss."""
    log_measured = np.log(measured)
    weights = np.ones_like(log_measured)
    x = np.asarray(x0, float)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # rejected trial steps
        for _ in range(rounds):
            w = weights
            x = levenberg_marquardt(lambda p: (np.log(predict(p)) - log_measured) * w, x)
            a = np.abs(np.log(predict(x)) - log_measured)
            weights = np.sqrt(np.where(a <= HUBER_DELTA, 1.0, HUBER_DELTA / np.maximum(a, 1e-300)))
        return x, huber_loss(np.log(predict(x)) - log_measured)


def _stack(measured: MeasuredGPU, models, ops_of, labels: bool = False) -> tuple[np.ndarray, ...]:
    """Rows of (tokens, shape..., measured seconds) over the models' operation tables; ``ops_of(spec, tp)``
    gives ``[(op column, shape tuple)]``. With ``labels``, each row's model, TP degree and op after them."""
    cols: list[list] = []
    for name in models:
        mm = measured.models[name]
        for tp, g in mm.ops.groupby("tp"):
            for op, shape in ops_of(mm.spec, int(tp)):
                if op not in g:
                    continue
                n = len(g)
                cols.append([g["num_tokens"].to_numpy(np.int64), *[np.full(n, float(s)) for s in shape],
                             g[op].to_numpy(float) * 1e-3]
                            + ([np.full(n, name, dtype=object), np.full(n, int(tp)), np.full(n, op, dtype=object)]
                               if labels else []))
    return tuple(np.concatenate([c[i] for c in cols]) for i in range(len(cols[0])))


def _gemm_ops(spec, tp: int) -> list:
    return [(op, (*shape, spec.dtype_bytes)) for op, shape in zip(GEMM_OPS, layer_gemm_shapes(spec, tp))]


def _gemm_rows(measured: MeasuredGPU, models) -> tuple[np.ndarray, ...]:
    """Every qkv/o/up/down timing of ``models``: tokens, K, N, dtype bytes, seconds."""
    return _stack(measured, models, _gemm_ops)


def gemm_timings(measured: MeasuredGPU) -> pd.DataFrame:
    """Every qkv/o/up/down timing of every measured model, a row each: ``model``, ``tp``,
    ``num_tokens``, ``op``, ``k``, ``n``, ``dtype_bytes``, ``seconds``."""
    tokens, k, n, dtype, seconds, model, tp, op = _stack(measured, list(measured.models), _gemm_ops, labels=True)
    return pd.DataFrame({"model": model, "tp": tp, "num_tokens": tokens, "op": op, "k": k, "n": n,
                         "dtype_bytes": dtype, "seconds": seconds})


def fit_gemm(measured: MeasuredGPU, models, gpu: GPUSpec) -> dict:
    tokens, k, n, dtype, y = _gemm_rows(measured, models)

    best = None
    for tile in TILE_TOKENS:  # the tile of rows is a choice of cuBLAS's: the one that fits best
        p, loss = robust_fit(lambda p: gemm_seconds(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, *p, tile),
                             y, [5e-6, 0.7, 0.8, 0.3])
        if best is None or loss < best[0]:
            best = (loss, tile, p)
    _loss, tile, p = best
    return dict(gemm_fixed_s=p[0], gemm_compute_eff=p[1], gemm_memory_eff=p[2], gemm_overlap=p[3],
                gemm_tile_tokens=tile)


def _gemm_formula(rows, gpu: GPUSpec, constants: dict) -> np.ndarray:
    tokens, k, n, dtype, _ = rows
    c = constants
    return gemm_seconds(tokens, k, n, dtype, gpu.peak_flops, gpu.mem_bw, c["gemm_fixed_s"], c["gemm_compute_eff"],
                        c["gemm_memory_eff"], c["gemm_overlap"], c["gemm_tile_tokens"])


def gemm_ratio_table(measured: MeasuredGPU, models, gpu: GPUSpec, constants: dict):
    """The measured GEMM shapes of ``models`` (an array of K, N), the token counts they were
    measured at (the grid) and each shape's measured / formula ratio at each (a shape x grid
    array): the median over the models and TP degrees that ran the shape; between its own token
    counts a shape is interpolated onto the grid."""
    rows = _gemm_rows(measured, models)
    ratio = rows[4] / _gemm_formula(rows, gpu, constants)
    frame = pd.DataFrame({"tokens": rows[0], "k": rows[1], "n": rows[2], "ratio": ratio})
    grid = np.unique(rows[0]).astype(float)
    medians = frame.groupby(["k", "n", "tokens"], sort=True)["ratio"].median()
    shapes, table = [], []
    for (k, n), curve in medians.groupby(level=["k", "n"], sort=True):
        shapes.append((k, n))
        table.append(np.interp(grid, curve.index.get_level_values("tokens").to_numpy(float), curve.to_numpy()))
    return np.array(shapes, dtype=float), grid, np.array(table)


def row_ratios(rows, shapes: np.ndarray, grid: np.ndarray, ratios: np.ndarray, neighbours: int,
               radius: float) -> np.ndarray:
    """Each GEMM timing's ratio (``rows``: :func:`_gemm_rows`'s) from the ratio table (``shapes``,
    ``grid``, ``ratios``: :func:`gemm_ratio_table`'s) by :func:`nearest_ratios`, as a step reads it:
    ``np.interp`` reads a row as ``sim.core.cost_calibrated.grid_value`` does (the ends' values
    beyond the grid)."""
    tokens, k, n = rows[0], rows[1], rows[2]
    distinct, which = np.unique(np.column_stack([k, n]), axis=0, return_inverse=True)
    which = which.ravel()
    out = np.empty(len(tokens))
    for j, curve in enumerate(nearest_ratios(distinct, shapes, ratios, neighbours, radius)):
        out[which == j] = np.interp(tokens[which == j], grid, curve)  # a shape's timings at once
    return out


def choose_neighbours(measured: MeasuredGPU, models, gpu: GPUSpec, constants: dict) -> tuple[int, float]:
    """How many nearest shapes price a GEMM and within what distance (:data:`NEIGHBOURS` x
    :data:`RADII`): each of ``models`` in turn priced from the ratio table of the others, the pair
    with the lowest p90 of |error| over all their GEMM timings (the fewer neighbours, then the
    smaller radius, on a tie; (1, inf) for a single model: nothing to leave out)."""
    if len(models) < 2:
        return 1, math.inf
    errors = {(count, radius): [] for count in NEIGHBOURS for radius in RADII}
    for held in models:
        shapes, grid, ratios = gemm_ratio_table(measured, [m for m in models if m != held], gpu, constants)
        rows = _gemm_rows(measured, [held])
        formula = _gemm_formula(rows, gpu, constants)
        for count, radius in errors:  # a count beyond the shapes left takes them all (every pair, every model)
            errors[count, radius].append(np.abs(formula * row_ratios(rows, shapes, grid, ratios, count, radius)
                                                / rows[4] - 1))
    p90 = {pair: float(np.quantile(np.concatenate(e), 0.9)) for pair, e in errors.items()}
    return min(p90, key=lambda pair: (p90[pair], *pair))


def fit_gemm_ratios(measured: MeasuredGPU, models, gpu: GPUSpec, constants: dict) -> dict:
    """The :class:`Calibration` fields of the GEMM shapes' ratio table and its neighbour count."""
    shapes, grid, ratios = gemm_ratio_table(measured, models, gpu, constants)
    neighbours, radius = choose_neighbours(measured, models, gpu, constants)
    return dict(gemm_neighbours=min(neighbours, len(shapes)), gemm_radius=radius,
                gemm_shape_k=tuple(shapes[:, 0]), gemm_shape_n=tuple(shapes[:, 1]),
                gemm_grid_tokens=tuple(grid), gemm_ratio=tuple(float(f"{x:.6g}") for x in ratios.ravel()))


def fit_elementwise(measured: MeasuredGPU, models, gpu: GPUSpec) -> dict:
    fixed, eff = [], []
    for i, kind in enumerate(ELEMENTWISE):
        tokens, b, y = _stack(measured, models, lambda spec, tp: [
            (op, (elementwise_bytes_per_token(spec, tp)[i],)) for op in ELEMENTWISE_OPS[kind]])
        p, _ = robust_fit(lambda p: elementwise_seconds(tokens, b, gpu.mem_bw, *p), y, [3e-6, 0.5])
        fixed.append(p[0])
        eff.append(p[1])
    return dict(elementwise_fixed_s=tuple(fixed), elementwise_memory_eff=tuple(eff))


def fit_attention(measured: MeasuredGPU, gpu: GPUSpec) -> dict:
    """Decode and prefill attention constants from every attention table of ``measured``."""
    dec, pre = [], []
    for name, rows in sorted(measured.attention.items()):
        if name not in measured.models:
            raise ConfigError(f"attention rows of '{name}' on {measured.gpu} but no operation table for its shape")
        spec = measured.models[name].spec
        kv_layer = spec.kv_bytes_per_token(1)  # one layer, TP 1 (the attention rows are TP 1)
        d = rows[rows["kind"] == "decode"]
        dec.append((d["n"].to_numpy(float), (d["kv"].to_numpy(float) + 1) * d["n"].to_numpy() * kv_layer,
                    d["n"].to_numpy(float) * spec.num_heads, d["ms"].to_numpy(float) * 1e-3))
        q = rows[rows["kind"] == "prefill"]
        pre.append((spec.num_heads, spec.head_dim, q["n"].to_numpy(float), q["kv"].to_numpy(float),
                    q["ms"].to_numpy(float) * 1e-3))
    seqs, kv_bytes, streams, y = (np.concatenate([d[i] for d in dec]) for i in range(4))

    def predict_decode(p):
        bw = decode_bandwidth(streams, gpu.mem_bw, p[2], p[3])
        return decode_attention_seconds(seqs, kv_bytes, bw, p[0], p[1])

    pd_, _ = robust_fit(predict_decode, y, [5e-6, 1e-6, 0.3, 0.15])
    y_pre = np.concatenate([p[4] for p in pre])

    def predict_prefill(p):
        flops = np.concatenate([prefill_attention_flops(h, hd, n * kv, n * n, p[2]) for h, hd, n, kv, _ in pre])
        return prefill_attention_seconds(flops, gpu.peak_flops, p[0], p[1])

    pp, _ = robust_fit(predict_prefill, y_pre, [1e-5, 0.3, 0.6])
    return dict(decode_fixed_s=pd_[0], decode_per_seq_s=pd_[1], decode_bw_coef=pd_[2], decode_bw_exponent=pd_[3],
                prefill_fixed_s=pp[0], prefill_compute_eff=pp[1], prefill_causal_fraction=pp[2])


def fit_allreduce(measured: MeasuredGPU) -> dict:
    """A latency + size / bandwidth line per TP degree, and the table itself (sizes beyond it are
    priced from its last size at the line's bandwidth)."""
    tps, lat, bw = [], [], []
    for tp in measured.allreduce_tps():
        t = measured.allreduce[measured.allreduce["tp"] == tp]
        size, y = t["size"].to_numpy(float), t["ms"].to_numpy(float) * 1e-3
        p, _ = robust_fit(lambda p: allreduce_seconds(size, 1.0, *p), y, [2e-5, 1e11])
        tps.append(tp)
        lat.append(p[0])
        bw.append(p[1])
    table = measured.allreduce.sort_values(["tp", "size"])
    return dict(allreduce_tp=tuple(tps), allreduce_latency_s=tuple(lat), allreduce_bytes_per_s=tuple(bw),
                allreduce_table_tp=tuple(int(x) for x in table["tp"]),
                allreduce_table_bytes=tuple(float(x) for x in table["size"]),
                allreduce_table_s=tuple(float(f"{x * 1e-3:.6g}") for x in table["ms"]))


def fit_calibration(measured: MeasuredGPU, gpu: GPUSpec, models=None,
                    attention_from: tuple[MeasuredGPU, GPUSpec] | None = None) -> Calibration:
    """The constants of ``gpu`` fitted on ``models`` (default: every measured model) of ``measured``;
    attention from ``attention_from`` (another GPU's measurements) when ``measured`` has none."""
    models = sorted(measured.models) if models is None else list(models)
    if not models:
        raise ConfigError(f"no model left to fit on {measured.gpu}")
    if measured.attention:
        attention = fit_attention(measured, gpu)
    elif attention_from is not None:
        attention = fit_attention(*attention_from)
    else:
        raise ConfigError(f"no attention timings for {measured.gpu} nor another GPU to take them from")
    gemm = fit_gemm(measured, models, gpu)
    return Calibration(gpu=gpu.name, **gemm, **fit_gemm_ratios(measured, models, gpu, gemm),
                       **fit_elementwise(measured, models, gpu), **attention, **fit_allreduce(measured))


def attention_source(root, measured: MeasuredGPU) -> tuple[MeasuredGPU, GPUSpec] | None:
    """Where ``measured``'s GPU takes its attention constants from: itself when it has attention rows,
    else the first GPU of ``root`` that has some (None when no GPU has)."""
    if measured.attention:
        return None
    for name in measured_gpus(root):
        other = read_measured(root, name)
        if other.attention:
            return other, get_gpu(name)
    return None



def score(measured: MeasuredGPU, model: str, gpu: GPUSpec, cost_model: str, calibration=None) -> pd.DataFrame:
    """``model``'s measured cells scored under ``cost_model`` (``sim.cost.error.scored``, plus ``model``)."""
    c = cells(measured, model)
    pred = cost_error.predict(c, measured.models[model].spec, gpu, cost_model, calibration)
    return cost_error.scored(c, pred).assign(model=model)


def leave_one_model_out(measured: MeasuredGPU, gpu: GPUSpec, attention_from=None) -> pd.DataFrame:
    """Every model's cells scored under constants fitted on the other models (attention constants
    always from all attention rows: only one model has them)."""
    parts = []
    for i, held in enumerate(sorted(measured.models), 1):
        LOG.info("leave-one-model-out: fitting without %s (%d of %d)", held, i, len(measured.models))
        cal = fit_calibration(measured, gpu, [m for m in sorted(measured.models) if m != held], attention_from)
        parts.append(score(measured, held, gpu, "calibrated", cal))
    return pd.concat(parts, ignore_index=True)


def error_table(frame: pd.DataFrame) -> dict:
    """What a calibration file stores of a scored frame: :func:`sim.cost.error.summary` overall and
    per model."""
    out = cost_error.summary(frame)
    out["models"] = {m: cost_error.summary(g) for m, g in frame.groupby("model", sort=True)}
    return out
