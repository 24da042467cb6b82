"""vLLM's CPU time per iteration, measured: Vidur's ``cpu_overheads.csv``, fitted per TP degree.

The calibrated roofline prices the GPU from measured kernels; the CPU side of an iteration
(scheduling, preparing inputs, sampling, processing outputs) needs its own measurement. Vidur
profiled it on vLLM (``data/profiling/<gpu>/cpu_overheads.csv`` of github.com/microsoft/vidur,
last at commit 6d98aa8f, removed from the repository after; MIT license, Agrawal et al., MLSys
2024) and prices an iteration's CPU time as

    schedule + sampler_e2e + prepare_inputs_e2e + process_model_outputs   (medians, ms)
    + ray_comm_time                                                       (mean, ms)

each learned as a function of the batch size for one model and TP degree
(``simulator/execution_time_predictor/sklearn_execution_time_predictor.py``,
``_train_cpu_overhead_models``, at that commit). :func:`fit_cpu_overheads` sums the same
columns and fits ``fixed_s + per_seq_s * batch`` by least squares over every model measured at
each TP degree (pagesim's step price has those two CPU terms: ``overhead_s`` and
``per_seq_overhead_s``), and reports each fit's relative residuals.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError

#: the per-iteration CPU operations Vidur adds up (medians), and the TP workers' Ray round trip (mean)
MEDIANS = ("schedule_median", "sampler_e2e_median", "prepare_inputs_e2e_median", "process_model_outputs_median")
RAY = "ray_comm_time_mean"
KEYS = ("model_name", "batch_size", "tensor_parallel_degree")


def read_cpu_overheads(path: str | Path) -> pd.DataFrame:
    """``path`` (Vidur's CSV, either column-name case) as rows of model, batch, TP and the
    iteration's CPU milliseconds (``cpu_ms``); one-line errors naming the file and column."""
    path = Path(path)
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read a CPU-overhead table ({e})") from None
    df.columns = [str(c).lower() for c in df.columns]
    missing = [c for c in (*KEYS, *MEDIANS) if c not in df.columns]
    if missing:
        raise ConfigError(f"{path}: no column '{missing[0]}' (Vidur's cpu_overheads.csv has {', '.join(MEDIANS)})")
    df = df.drop_duplicates()
    parts = df[list(MEDIANS)].apply(pd.to_numeric, errors="coerce")
    ray = pd.to_numeric(df[RAY], errors="coerce").fillna(0.0) if RAY in df.columns else 0.0
    bad = parts.isna().any(axis=1) | ~np.isfinite(parts.to_numpy()).all(axis=1) | (parts < 0).any(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0]) + 2  # the header is line 1
        raise ConfigError(f"{path}: line {row}: the CPU-time columns must be finite numbers >= 0")
    out = df[list(KEYS)].copy()
    out["cpu_ms"] = parts.sum(axis=1) + ray
    return out.reset_index(drop=True)


def fit_cpu_overheads(table: pd.DataFrame) -> dict:
    """Per TP degree (ascending): ``fixed_s + per_seq_s * batch`` fitted on every model's rows,
    the models used, and the median and largest relative residual."""
    fits = {"tp": [], "fixed_s": [], "per_seq_s": [], "models": [], "median_error": [], "max_error": []}
    for tp, rows in table.groupby("tensor_parallel_degree"):
        batch = rows["batch_size"].to_numpy(float)
        if len(np.unique(batch)) < 2:
            continue  # one batch size fixes no slope
        measured = rows["cpu_ms"].to_numpy(float) * 1e-3
        design = np.column_stack([np.ones_like(batch), batch])
        (fixed, per_seq), *_ = np.linalg.lstsq(design, measured, rcond=None)
        error = np.abs(design @ (fixed, per_seq) / measured - 1)
        fits["tp"].append(int(tp))
        fits["fixed_s"].append(float(fixed))
        fits["per_seq_s"].append(float(per_seq))
        fits["models"].append(sorted(rows["model_name"].unique().tolist()))
        fits["median_error"].append(float(np.median(error)))
        fits["max_error"].append(float(error.max()))
    if not fits["tp"]:
        raise ConfigError("the CPU-overhead table has no TP degree with two batch sizes or more to fit")
    return fits
