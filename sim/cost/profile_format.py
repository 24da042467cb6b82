"""The GPU profile CSV read by the simulator's table cost model (CPU-only: numpy/pandas).

One row per measurement::

    component,num_tokens,batch,context,time_us,model,gpu,dtype,tp

    component     meaning of time_us                                         keys (others empty)
    linear        all layers' linear layers (qkv, o, mlp) + lm head for      num_tokens
                  ``num_tokens`` tokens batched in one iteration (``pagesim
                  gpu calibrate``: with the runner's fused element-wise kernels)
    attn_decode   all layers' decode attention for ``batch`` sequences,      batch, context
                  each attending to ``context`` tokens
    attn_prefill  all layers' causal prefill attention for one sequence     num_tokens
                  of ``num_tokens`` prompt tokens
    overhead      fixed per-iteration time (launches, sampling, Python)      (none)

    time_us       microseconds, > 0 (median of repeats)
    model, gpu    names (e.g. llama-2-7b, h200); dtype float16/bfloat16; tp >= 1 (tensor parallel)

Integer keys are > 0. A key that does not apply must be empty. ``read_profile`` returns a
``pandas.DataFrame`` with exactly these columns (num_tokens/batch/context as nullable
``Int64``, time_us float64, tp int64) and raises :class:`sim.errors.ConfigError` naming the
file, the 1-based data row and the field for any malformed value, unknown component, missing
column or duplicate key.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Iterable, Mapping

import pandas as pd

from pagesim.sim.errors import ConfigError

COLUMNS = ("component", "num_tokens", "batch", "context", "time_us", "model", "gpu", "dtype", "tp")
COMPONENTS = ("linear", "attn_decode", "attn_prefill", "overhead")
#: which integer keys each component needs (the others must be empty)
KEYS = {"linear": ("num_tokens",), "attn_decode": ("batch", "context"), "attn_prefill": ("num_tokens",),
        "overhead": ()}
INT_KEYS = ("num_tokens", "batch", "context")
DTYPES = ("float16", "bfloat16")


def _err(path, row, field, msg) -> ConfigError:
    parts = [str(path)] if path is not None else []
    loc = ", ".join(x for x in (f"row {row}" if row is not None else "",
                                f"field '{field}'" if field is not None else "") if x)
    if loc:
        parts.append(loc)
    return ConfigError(": ".join(parts + [msg]))


def _int(v, path, row, field) -> int:
    try:
        f = float(str(v).strip())
    except ValueError:
        raise _err(path, row, field, f"not an integer: {v!r}") from None
    if not math.isfinite(f) or f != int(f):
        raise _err(path, row, field, f"not an integer: {v!r}")
    if int(f) < 1:
        raise _err(path, row, field, f"must be >= 1, got {v!r}")
    return int(f)


def _empty(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() in ("", "nan", "<NA>", "None")


def validate_row(raw: Mapping, path=None, row: int | None = None) -> dict:
    """One normalized row (dict with every column) or ConfigError."""
    missing = [c for c in COLUMNS if c not in raw]
    if missing:
        raise _err(path, row, missing[0], "missing column")
    comp = str(raw["component"]).strip()
    if comp not in COMPONENTS:
        raise _err(path, row, "component", f"unknown component {comp!r}; valid: {', '.join(COMPONENTS)}")
    out: dict = {"component": comp}
    for k in INT_KEYS:
        v = raw[k]
        if k in KEYS[comp]:
            if _empty(v):
                raise _err(path, row, k, f"required for component '{comp}'")
            out[k] = _int(v, path, row, k)
        else:
            if not _empty(v):
                raise _err(path, row, k, f"must be empty for component '{comp}', got {v!r}")
            out[k] = None
    try:
        t = float(str(raw["time_us"]).strip())
    except ValueError:
        raise _err(path, row, "time_us", f"not a number: {raw['time_us']!r}") from None
    if not math.isfinite(t) or t <= 0:
        raise _err(path, row, "time_us", f"must be a finite number > 0, got {raw['time_us']!r}")
    out["time_us"] = t
    for k in ("model", "gpu"):
        v = "" if _empty(raw[k]) else str(raw[k]).strip()
        if not v:
            raise _err(path, row, k, "must not be empty")
        out[k] = v
    dt = str(raw["dtype"]).strip()
    if dt not in DTYPES:
        raise _err(path, row, "dtype", f"must be one of {', '.join(DTYPES)}, got {dt!r}")
    out["dtype"] = dt
    out["tp"] = _int(raw["tp"], path, row, "tp")
    return out


def _frame(rows: list[dict]) -> pd.DataFrame:
    data = {}
    for k in COLUMNS:
        vals = [r[k] for r in rows]
        if k in INT_KEYS:
            data[k] = pd.array([None if v is None else int(v) for v in vals], dtype="Int64")
        elif k == "time_us":
            data[k] = pd.array(vals, dtype="float64")
        elif k == "tp":
            data[k] = pd.array(vals, dtype="int64")
        else:
            data[k] = pd.Series(vals, dtype=object)
    return pd.DataFrame(data, columns=list(COLUMNS))


def _check_duplicates(rows: list[dict], path) -> None:
    seen: dict[tuple, int] = {}
    for i, r in enumerate(rows, 1):
        key = tuple(r[c] for c in COLUMNS if c != "time_us")
        if key in seen:
            raise _err(path, i, None, f"duplicate measurement (same keys as row {seen[key]})")
        seen[key] = i


def validate_rows(rows: Iterable[Mapping], path=None) -> pd.DataFrame:
    norm = [validate_row(r, path, i) for i, r in enumerate(rows, 1)]
    _check_duplicates(norm, path)
    return _frame(norm)


def write_profile(rows: Iterable[Mapping] | pd.DataFrame, path) -> Path:
    """Validate and write ``rows`` (dicts or a DataFrame with the columns) as the profile CSV."""
    if isinstance(rows, pd.DataFrame):
        rows = [{k: (None if v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v) for k, v in r.items()}
                for r in rows.to_dict("records")]
    df = validate_rows(list(rows), path)
    p = Path(path)
    if p.parent and not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in df.itertuples(index=False):
            w.writerow(["" if (v is None or v is pd.NA) else (f"{v:.3f}" if c == "time_us" else v)
                        for c, v in zip(COLUMNS, r)])
    return p


def read_profile(path) -> pd.DataFrame:
    """Read and validate a profile CSV (see the module docstring); ConfigError on any problem."""
    p = Path(path)
    try:
        p.read_bytes().decode("utf-8")
        f = p.open(newline="")
    except FileNotFoundError:
        raise ConfigError(f"{p}: profile file not found") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not a profile CSV (not UTF-8 text)") from None
    with f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            raise ConfigError(f"{p}: empty profile file (expected header {','.join(COLUMNS)})")
        header = [h.strip() for h in reader.fieldnames]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ConfigError(f"{p}: missing column '{missing[0]}' (expected header {','.join(COLUMNS)})")
        reader.fieldnames = header
        rows = []
        for i, raw in enumerate(reader, 1):
            if None in raw:
                raise _err(p, i, None, f"more fields than the {len(header)} columns of the header")
            if any(v is None for v in raw.values()):
                raise _err(p, i, None, f"fewer fields than the {len(header)} columns of the header")
            rows.append(raw)
    if not rows:
        raise ConfigError(f"{p}: profile has a header but no rows")
    return validate_rows(rows, p)
