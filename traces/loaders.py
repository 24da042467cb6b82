"""Read request traces into the canonical form (see :mod:`traces`), vectorized.

Formats (``format=`` / ``--format``; ``None`` detects from the extension and header):

``azure``      Azure LLM inference trace 2023/2024 (Splitwise): CSV ``TIMESTAMP,ContextTokens,
               GeneratedTokens``; ``TIMESTAMP`` is a wall-clock string such as
               ``2023-11-16 18:17:03.9799600``. Re-zeroed to the first request.
``mooncake``   Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
               ``hash_ids`` (512-token prefix-block hashes, kept as ``prefix_hashes`` tuples,
               ``attrs['hash_block_tokens'] = 512``). Timestamps are quantized to ~3 s steps;
               ``spread_timestamps=True`` spreads rows that share a timestamp uniformly (seeded)
               over the gap to the next distinct timestamp (at most the median gap, the
               quantization step), keeping the file's order within each group.
``burstgpt``   BurstGPT CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
               (``Timestamp`` in seconds). Rows with 0 response tokens are failed requests: they
               are dropped and counted in the report.
``lengths``    A table of lengths without timestamps (default columns ``num_prefill_tokens,
               num_decode_tokens``, e.g. the ShareGPT stats file; override with ``columns``),
               given synthetic arrivals: ``arrival`` (``poisson``/``gamma``), ``rate`` (req/s,
               default 2.0) and ``cv`` (gamma burstiness), seeded with ``seed``. File order kept.
``canonical``  What :func:`write_trace` writes (CSV/Parquet/JSONL with ``request_id,arrival_s,
               prompt_tokens,output_tokens[,n,beam_width,prefix_hashes]``; in CSV,
               ``prefix_hashes`` is space-separated ints). Arrivals are kept as they are.
``generic``    Any CSV / JSONL / Parquet plus a column map (``columns=`` dict or the string
               ``prompt=COL,output=COL[,arrival=COL]``). Keys: ``prompt``, ``output`` (required),
               at most one of ``arrival`` (seconds), ``arrival_ms`` (milliseconds) or
               ``timestamp`` (date-time strings), and optional ``id``, ``n``, ``beam_width``.
               Without a time column the rows get synthetic arrivals as for ``lengths``. Times
               are re-zeroed to the first request.

Every loader returns the DataFrame with ``attrs['load_report']``::

    {"path", "format", "rows_read", "rows_dropped": {reason: count}, "rows_resorted",
     "arrival_origin" (what became 0 s, or None), "spread_timestamps", "synthetic_arrivals"}

Bad input raises :class:`sim.errors.TraceError` naming the file, the 1-based data row
(header excluded; the line for JSONL) and the field. Unsorted timestamps are sorted (stable)
with a :class:`UserWarning` saying how many rows moved, also recorded as ``rows_resorted``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.errors import TraceError
from traces.schema import (CANONICAL_COLUMNS, first_true, ids_for, sort_by_arrival, to_seconds, to_tokens,
                           validate_canonical)

from traces.names import FORMATS
COLUMN_KEYS = ("prompt", "output", "arrival", "arrival_ms", "timestamp", "id", "n", "beam_width")

AZURE_COLS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_COLS = ("timestamp", "input_length", "output_length")
BURSTGPT_COLS = ("Timestamp", "Request tokens", "Response tokens")
LENGTHS_COLS = ("num_prefill_tokens", "num_decode_tokens")
MOONCAKE_BLOCK_TOKENS = 512
DEFAULT_LENGTHS_RATE = 2.0


# ----------------------------------------------------------------------------------------- helpers

def parse_columns(columns: str | dict | None) -> dict[str, str]:
    """``"prompt=A,output=B,arrival=C"`` (or a dict) -> ``{"prompt": "A", ...}``, checked."""
    if columns is None or columns == "":
        return {}
    if isinstance(columns, str):
        out = {}
        for part in columns.split(","):
            key, sep, col = part.partition("=")
            if not sep or not key.strip() or not col.strip():
                raise TraceError(f"--columns: expected KEY=COLUMN, got {part!r} "
                                 f"(e.g. prompt=ContextTokens,output=GeneratedTokens,arrival=t)")
            out[key.strip()] = col.strip()
    else:
        out = dict(columns)
    bad = [k for k in out if k not in COLUMN_KEYS]
    if bad:
        raise TraceError(f"--columns: unknown key(s) {', '.join(bad)}; valid: {', '.join(COLUMN_KEYS)}")
    if sum(k in out for k in ("arrival", "arrival_ms", "timestamp")) > 1:
        raise TraceError("--columns: give at most one of arrival=, arrival_ms=, timestamp=")
    return out


def _kind(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "csv"


def _header(path: Path, kind: str) -> list[str]:
    """The column names of ``path`` without reading the data."""
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq
            return list(pq.read_schema(path).names)
        if kind == "jsonl":
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        obj = json.loads(line)
                        return list(obj) if isinstance(obj, dict) else []
            return []
        return list(pd.read_csv(path, nrows=0).columns)
    except pd.errors.EmptyDataError:
        return []
    except (ValueError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise TraceError(f"cannot read header ({e})", path=str(path), row=1) from None


def detect_format(path: str | Path, columns: dict | None = None) -> str:
    """Guess the format of ``path`` from its extension and header (see module docstring)."""
    path = Path(path)
    kind = _kind(path)
    header = _header(path, kind)
    if not header:
        raise TraceError("empty file (no header)", path=str(path))
    h = set(header)
    if columns:
        return "generic"
    if set(CANONICAL_COLUMNS[1:]) <= h:
        return "canonical"
    if set(AZURE_COLS) <= h:
        return "azure"
    if set(MOONCAKE_COLS) <= h:
        return "mooncake"
    if set(BURSTGPT_COLS) <= h:
        return "burstgpt"
    if set(LENGTHS_COLS) <= h:
        return "generic" if "arrived_at" in h else "lengths"
    raise TraceError(f"cannot tell the trace format from the columns [{', '.join(header[:8])}]; pass --format "
                     f"({', '.join(FORMATS)}) or --columns prompt=COL,output=COL[,arrival=COL]", path=str(path))


def _read(path: Path, kind: str, usecols: list[str] | None = None, dtype: dict | None = None) -> pd.DataFrame:
    p = str(path)
    try:
        if kind == "parquet":
            df = pd.read_parquet(path, columns=usecols)
        elif kind == "jsonl":
            try:
                df = pd.read_json(path, lines=True, dtype=False)
            except ValueError as e:
                _raise_bad_json_line(path, e)
        else:
            header = list(pd.read_csv(path, nrows=0).columns)
            if usecols is not None:
                missing = [c for c in usecols if c not in header]
                if missing:
                    raise TraceError(f"missing column (have: {', '.join(header)})", path=p, field=missing[0])
            df = pd.read_csv(path, usecols=usecols, dtype=dtype, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise TraceError("empty file", path=p) from None
    except pd.errors.ParserError as e:
        raise TraceError(f"malformed CSV ({str(e).strip()})", path=p) from None
    except UnicodeDecodeError as e:
        raise TraceError(f"not a text file ({e.reason})", path=p) from None
    except (ImportError, OSError) as e:
        if isinstance(e, (FileNotFoundError, PermissionError)):
            raise
        raise TraceError(f"cannot read ({e})", path=p) from None
    if usecols is not None:
        missing = [c for c in usecols if c not in df.columns]
        if missing:
            raise TraceError(f"missing column (have: {', '.join(map(str, df.columns))})", path=p, field=missing[0])
    if len(df) == 0:
        raise TraceError("no data rows", path=p)
    return df


def _raise_bad_json_line(path: Path, err: Exception):
    """Error path only: find the first line that is not a JSON object (per-line Python is fine here)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        n = 0
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            n += 1
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise TraceError(f"invalid JSON ({e.msg})", path=str(path), row=lineno) from None
            if not isinstance(obj, dict):
                raise TraceError("expected a JSON object per line", path=str(path), row=lineno) from None
    if n == 0:
        raise TraceError("empty file", path=str(path)) from None
    raise TraceError(f"cannot read JSON lines ({err})", path=str(path)) from None


def _require(df: pd.DataFrame, cols, path: Path) -> None:
    for c in cols:
        if c not in df.columns:
            raise TraceError(f"missing column (have: {', '.join(map(str, df.columns))})", path=str(path), field=c)


def _datetimes_to_seconds(s: pd.Series, *, path: str, field: str, rows: np.ndarray | None) -> tuple[np.ndarray, str]:
    """Date-time strings -> seconds since the earliest one (vectorized); TraceError at the first bad one."""
    t = pd.to_datetime(s, format="ISO8601", errors="coerce")
    bad = t.isna().to_numpy()
    if bad.any():  # maybe just a format pandas' ISO parser dislikes: try the flexible parser on all
        t2 = pd.to_datetime(s, format="mixed", errors="coerce")
        if t2.isna().sum() < bad.sum():
            t, bad = t2, t2.isna().to_numpy()
    i = first_true(bad)
    if i is not None:
        raise TraceError(f"unparseable timestamp {s.iloc[i]!r}", path=path, row=int(rows[i]) if rows is not None else i + 1,
                         field=field)
    t0 = t.min()
    return (t - t0).dt.total_seconds().to_numpy(dtype=np.float64), str(t0)


def spread_ties(arrival_s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Spread rows sharing a timestamp uniformly over [t, t + gap), where gap is the distance to the
    next distinct timestamp capped at the median such gap (the quantization step); file order is
    kept within each group, so the result stays sorted if the input was."""
    a = np.asarray(arrival_s, dtype=np.float64)
    u, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    if u.size == a.size:
        return a.copy()
    gaps = np.diff(u)
    step = float(np.median(gaps)) if gaps.size else 1.0
    width = np.minimum(np.r_[gaps, step], step)
    off = rng.random(a.size) * width[inv]
    off[counts[inv] == 1] = 0.0
    rows_by_group = np.lexsort((np.arange(a.size), inv))
    sorted_off = off[np.lexsort((off, inv))]
    new_off = np.empty_like(off)
    new_off[rows_by_group] = sorted_off
    return a + new_off


def _synthetic_arrivals(n: int, arrival: str, rate: float | None, cv: float, seed: int) -> tuple[np.ndarray, str]:
    from traces.synth import arrivals as make_arrivals
    rate = DEFAULT_LENGTHS_RATE if rate is None else rate
    a = make_arrivals(arrival, rate=rate, num_requests=n, cv=cv, rng=np.random.default_rng(seed))
    desc = f"{arrival} rate {rate:g} req/s" + (f" cv {cv:g}" if arrival == "gamma" else "") + f" seed {seed}"
    return a, desc


def _parse_hashes(values: pd.Series) -> list:
    """CSV cells of space-separated ints / lists / arrays -> tuples of Python ints."""
    def one(v):
        if isinstance(v, tuple):
            return v
        if isinstance(v, (list, np.ndarray)):
            return tuple(int(x) for x in v)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ()
        return tuple(int(x) for x in str(v).split())
    return [one(v) for v in values]


# ----------------------------------------------------------------------------------------- readers

def _azure(path, cols, rep, opts):
    raw = _read(path, "csv", usecols=list(AZURE_COLS), dtype={"TIMESTAMP": str})
    p = str(path)
    arrival, origin = _datetimes_to_seconds(raw["TIMESTAMP"], path=p, field="TIMESTAMP", rows=None)
    rep["arrival_origin"] = origin
    return dict(arrival_s=arrival,
                prompt_tokens=to_tokens(raw["ContextTokens"], path=p, field="ContextTokens"),
                output_tokens=to_tokens(raw["GeneratedTokens"], path=p, field="GeneratedTokens")), len(raw), None


def _mooncake(path, cols, rep, opts):
    raw = _read(path, "jsonl")
    _require(raw, MOONCAKE_COLS, path)
    p = str(path)
    ts = to_seconds(raw["timestamp"], path=p, field="timestamp", scale=1e-3)
    origin = float(ts.min())
    rep["arrival_origin"] = f"{origin * 1e3:g} ms"
    out = dict(arrival_s=ts - origin,
               prompt_tokens=to_tokens(raw["input_length"], path=p, field="input_length"),
               output_tokens=to_tokens(raw["output_length"], path=p, field="output_length"))
    if "hash_ids" in raw.columns:
        h = raw["hash_ids"]
        ok = h.map(lambda v: isinstance(v, list)).to_numpy(dtype=bool)
        i = first_true(~ok)
        if i is not None:
            raise TraceError(f"must be a list of ints, got {h.iloc[i]!r}", path=p, row=i + 1, field="hash_ids")
        out["prefix_hashes"] = [tuple(v) for v in h]
        out["_hash_block_tokens"] = MOONCAKE_BLOCK_TOKENS
    return out, len(raw), None


def _burstgpt(path, cols, rep, opts):
    raw = _read(path, "csv", usecols=list(BURSTGPT_COLS))
    p = str(path)
    resp = pd.to_numeric(raw["Response tokens"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    failed = resp == 0
    rows = np.arange(1, len(raw) + 1)
    if failed.any():
        rep["rows_dropped"]["failed request (0 response tokens)"] = int(failed.sum())
        keep = ~failed
        raw, rows = raw.loc[keep].reset_index(drop=True), rows[keep]
        if len(raw) == 0:
            raise TraceError("every row is a failed request (0 response tokens)", path=p)
    ts = to_seconds(raw["Timestamp"], path=p, field="Timestamp", rows=rows)
    origin = float(ts.min())
    rep["arrival_origin"] = f"{origin:g} s"
    return dict(arrival_s=ts - origin,
                prompt_tokens=to_tokens(raw["Request tokens"], path=p, field="Request tokens", rows=rows),
                output_tokens=to_tokens(raw["Response tokens"], path=p, field="Response tokens", rows=rows)), \
        len(rows) + int(failed.sum()), rows - 1


def _generic(path, cols, rep, opts, *, lengths_only=False):
    p = str(path)
    kind = _kind(path)
    if lengths_only:
        cols = {"prompt": LENGTHS_COLS[0], "output": LENGTHS_COLS[1], **cols}
    elif not cols:
        header = set(_header(path, kind))
        if {"arrived_at", *LENGTHS_COLS} <= header:  # vidur's processed traces
            cols = {"prompt": LENGTHS_COLS[0], "output": LENGTHS_COLS[1], "arrival": "arrived_at"}
        else:
            raise TraceError("format 'generic' needs --columns prompt=COL,output=COL[,arrival=COL]", path=p)
    for k in ("prompt", "output"):
        if k not in cols:
            raise TraceError(f"--columns needs {k}=COL (got {', '.join(f'{a}={b}' for a, b in cols.items())})", path=p)
    time_key = next((k for k in ("arrival", "arrival_ms", "timestamp") if k in cols), None)
    if lengths_only:
        time_key = None
    keys = ["prompt", "output", "id", "n", "beam_width"] + ([time_key] if time_key else [])
    wanted = list(dict.fromkeys(cols[k] for k in keys if k in cols))
    raw = _read(path, kind, usecols=wanted if kind != "jsonl" else None,
                dtype={cols["timestamp"]: str} if time_key == "timestamp" and kind == "csv" else None)
    _require(raw, wanted, path)
    out = dict(prompt_tokens=to_tokens(raw[cols["prompt"]], path=p, field=cols["prompt"]),
               output_tokens=to_tokens(raw[cols["output"]], path=p, field=cols["output"]))
    for k in ("n", "beam_width"):
        if k in cols:
            out[k] = to_tokens(raw[cols[k]], path=p, field=cols[k])
    ids = None
    if "id" in cols:
        ids = raw[cols["id"]].astype(str)
    if time_key == "timestamp":
        out["arrival_s"], rep["arrival_origin"] = _datetimes_to_seconds(raw[cols["timestamp"]], path=p,
                                                                        field=cols["timestamp"], rows=None)
    elif time_key is not None:
        ts = to_seconds(raw[cols[time_key]], path=p, field=cols[time_key],
                        scale=1e-3 if time_key == "arrival_ms" else 1.0)
        origin = float(ts.min())
        rep["arrival_origin"] = f"{origin:g} s"
        out["arrival_s"] = ts - origin
    else:
        out["arrival_s"] = None
    return out, len(raw), ids


def _lengths(path, cols, rep, opts):
    return _generic(path, cols, rep, opts, lengths_only=True)


def _canonical(path, cols, rep, opts):
    p = str(path)
    kind = _kind(path)
    raw = _read(path, kind, dtype={"request_id": str} if kind == "csv" else None)
    _require(raw, CANONICAL_COLUMNS[1:], path)
    out = dict(arrival_s=to_seconds(raw["arrival_s"], path=p, field="arrival_s"),
               prompt_tokens=to_tokens(raw["prompt_tokens"], path=p, field="prompt_tokens"),
               output_tokens=to_tokens(raw["output_tokens"], path=p, field="output_tokens"))
    for k in ("n", "beam_width"):
        if k in raw.columns:
            out[k] = to_tokens(raw[k], path=p, field=k)
    if "prefix_hashes" in raw.columns:
        try:
            out["prefix_hashes"] = _parse_hashes(raw["prefix_hashes"])
        except ValueError:
            bad = raw["prefix_hashes"].astype(str).str.fullmatch(r"[\s\d\-\[\],()]*").to_numpy(dtype=bool)
            i = first_true(~bad)
            raise TraceError("must be space-separated integers", path=p, row=None if i is None else i + 1,
                             field="prefix_hashes") from None
        out["_hash_block_tokens"] = int(raw.attrs.get("hash_block_tokens", MOONCAKE_BLOCK_TOKENS))
    ids = raw["request_id"].astype(str) if "request_id" in raw.columns else None
    rep["arrival_origin"] = None
    return out, len(raw), ids


READERS = dict(azure=_azure, mooncake=_mooncake, burstgpt=_burstgpt, lengths=_lengths, canonical=_canonical,
               generic=_generic)


# ----------------------------------------------------------------------------------------- public

def load_trace(path: str | Path, format: str | None = None, columns: str | dict | None = None,
               spread_timestamps: bool = False, arrival: str = "poisson", seed: int = 0, *,
               rate: float | None = None, cv: float = 1.0) -> pd.DataFrame:
    """Load ``path`` into the canonical form; ``df.attrs['load_report']`` says what happened.

    ``format``: one of :data:`FORMATS` or None (detect). ``columns``: column map for
    ``generic``/``lengths`` (see module docstring). ``spread_timestamps``: spread rows that share a
    timestamp within the quantization step (seeded with ``seed``). ``arrival``/``rate``/``cv``:
    the synthetic arrival process for traces without times (``lengths``, or ``generic`` without a
    time column); ``rate`` defaults to 2.0 req/s there and is ignored for timed traces (use
    :func:`traces.transform.scale_rate`).
    """
    path = Path(path)
    p = str(path)
    if not path.exists():
        raise TraceError("file not found", path=p)
    if path.is_dir():
        raise TraceError("is a directory, expected a trace file", path=p)
    if path.stat().st_size == 0:
        raise TraceError("empty file", path=p)
    cols = parse_columns(columns)
    if format is None:
        format = detect_format(path, cols)
    if format not in READERS:
        raise TraceError(f"unknown trace format '{format}'; valid: {', '.join(FORMATS)}", path=p)
    rep: dict[str, Any] = dict(path=p, format=format, rows_read=0, rows_dropped={}, rows_resorted=0,
                               arrival_origin=None, spread_timestamps=False, synthetic_arrivals=None)
    data, rows_read, ids = READERS[format](path, cols, rep, {})
    rep["rows_read"] = int(rows_read)
    n = len(data["prompt_tokens"])
    if data.get("arrival_s") is None:
        data["arrival_s"], rep["synthetic_arrivals"] = _synthetic_arrivals(n, arrival, rate, cv, seed)
    elif spread_timestamps:
        data["arrival_s"] = spread_ties(data["arrival_s"], np.random.default_rng(seed))
        rep["spread_timestamps"] = True
    block = data.pop("_hash_block_tokens", None)
    if ids is None:
        ids = ids_for(n)
    elif not isinstance(ids, pd.Series):  # row positions (burstgpt: kept rows)
        ids = pd.Series(np.asarray(ids)).astype(str)
    frame = {"request_id": ids.reset_index(drop=True).astype(str),
             "arrival_s": np.asarray(data["arrival_s"], dtype=np.float64),
             "prompt_tokens": data["prompt_tokens"], "output_tokens": data["output_tokens"]}
    for k in ("n", "beam_width", "prefix_hashes"):
        if k in data:
            frame[k] = pd.Series(data[k], dtype=object) if k == "prefix_hashes" else data[k]
    df = pd.DataFrame(frame)
    df.attrs = {"source": p}
    if block is not None:
        df.attrs["hash_block_tokens"] = block
    df = sort_by_arrival(df, rep, path=p)
    df.attrs["load_report"] = rep
    return validate_canonical(df, source=p)


def write_trace(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` in canonical form: ``.parquet``/``.pq`` (Parquet), ``.jsonl`` or CSV otherwise.

    In CSV, ``prefix_hashes`` becomes space-separated ints (read back by :func:`load_trace`).
    """
    path = Path(path)
    validate_canonical(df)
    cols = [c for c in (*CANONICAL_COLUMNS, "n", "beam_width", "prefix_hashes") if c in df.columns]
    out = df[cols].copy()
    out.attrs = {k: v for k, v in df.attrs.items() if k == "hash_block_tokens"}
    kind = _kind(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "parquet":
        if "prefix_hashes" in out.columns:
            out["prefix_hashes"] = out["prefix_hashes"].map(list)
        out.to_parquet(path, index=False)
    elif kind == "jsonl":
        if "prefix_hashes" in out.columns:
            out["prefix_hashes"] = out["prefix_hashes"].map(list)
        out.to_json(path, orient="records", lines=True)
    else:
        if "prefix_hashes" in out.columns:
            out["prefix_hashes"] = out["prefix_hashes"].map(lambda t: " ".join(map(str, t)))
        out.to_csv(path, index=False)
    return path
