"""Read request traces into the canonical form (see :mod:`traces`), vectorized.

Formats (``format=`` / ``--format``; ``None`` detects from the extension, the header and, for
Mooncake, the numbers). Each named format is a column map (:data:`LAYOUTS`) that ``--columns``
entries may override:

``azure``      Azure LLM inference trace 2023/2024 (Splitwise, DynamoLLM): CSV ``TIMESTAMP,
               ContextTokens,GeneratedTokens``; ``TIMESTAMP`` is a date-time string such as
               ``2023-11-16 18:17:03.9799600`` (2023) or ``2024-05-12 00:00:00.001163+00:00``
               (2024). Re-zeroed to the first request.
``mooncake``   Mooncake FAST'25 JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``,
               ``hash_ids`` (512-token prefix-block hashes, kept as ``prefix_hashes`` tuples,
               ``attrs['hash_block_tokens'] = 512``). Detected only when the numbers fit:
               timestamps are JSON numbers and every ``hash_ids`` is a list of
               ``ceil(input_length / 512)`` ids. A file with these keys whose numbers do not fit
               (RAGPulse: timestamps in seconds as strings, ``hash_ids`` a dict) is read as
               ``generic`` with ``timestamp`` in seconds (or ``--time-unit``), with a one-line
               warning saying why; its hashes are used only with ``--hash-block-tokens``.
               Timestamps are quantized to ~3 s steps; ``spread_timestamps=True`` spreads rows
               that share a timestamp uniformly (seeded) over the gap to the next distinct
               timestamp (at most the median gap, the quantization step), keeping the file's
               order within each group.
``burstgpt``   BurstGPT CSV ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``
               (``Timestamp`` in seconds). Rows with 0 response tokens, then rows with 0 request
               tokens, are failed requests: dropped and counted in the report, each under its reason.
``lengths``    A table of lengths without timestamps (default columns ``num_prefill_tokens,
               num_decode_tokens``, e.g. the ShareGPT stats file; override with ``columns``),
               given synthetic arrivals: ``arrival`` (``poisson``/``gamma``), ``rate`` (req/s,
               default 2.0) and ``cv`` (gamma burstiness), seeded with ``seed``. File order kept.
``canonical``  What :func:`write_trace` writes (CSV/Parquet/JSONL with ``request_id,arrival_s,
               prompt_tokens,output_tokens[,n,beam_width,priority,prefix_hashes]``; in CSV,
               ``prefix_hashes`` is space-separated ints). Arrivals are kept as they are.
``generic``    Any CSV / JSONL / Parquet plus a column map (``columns=`` dict or the string
               ``prompt=COL,output=COL[,arrival=COL]``). Keys: ``prompt``, ``output`` (required),
               at most one of ``arrival`` (numbers, in seconds or ``--time-unit``),
               ``arrival_ms`` (numbers in milliseconds) or ``timestamp`` (date-time strings; with
               ``--time-unit``, numbers in that unit), and optional ``id``, ``n``,
               ``beam_width``, ``priority`` and ``hashes`` (prefix-block hash ids; needs ``--hash-block-tokens``).
               Without a time column the rows get synthetic arrivals as for ``lengths``. Times
               are re-zeroed to the first request. A file with vidur's columns ``arrived_at,
               num_prefill_tokens,num_decode_tokens`` needs no map.

Time units (``time_unit=`` / ``--time-unit s|ms|us|ns``): the unit of a numeric arrival column,
default the format's (Mooncake ms, every other s). It is refused where the column says its own
unit: Azure's date-times, ``arrival_ms=``, the canonical ``arrival_s``, a trace without times.
Date-times may all carry a UTC offset (then compared as UTC instants) or none; a file mixing
the two is refused at the first row that differs.

Prefix hashes (``hash_block_tokens=`` / ``--hash-block-tokens N``): hash ``j`` covers prompt
tokens ``[jN, (j+1)N)``; equal hashes mean a shareable KV prefix. Default: Mooncake's 512, the
canonical file's own. A cell may be a list of ints, space-separated ints (CSV) or a dict of
lists, concatenated in the order the keys first appear in the file (RAGPulse's ``sys_prompt,
passages_ids, history, web_search, user_input``: the order its own replayer builds a prompt).

Every loader returns the DataFrame with ``attrs['load_report']``::

    {"path", "format", "rows_read", "rows_dropped": {reason: count}, "rows_resorted",
     "arrival_origin" (what became 0 s, or None), "time_unit" (of the file's times: a unit,
     "date-time", or None), "stopped_early", "spread_timestamps", "synthetic_arrivals"}

``window=`` (:class:`traces.reading.Window`) lets a CSV reader stop once past the rows the
caller keeps (see :mod:`traces.reading`); ``rows_read`` then counts the rows read and
``stopped_early`` is True.

Bad input raises :class:`sim.errors.TraceError` naming the file, the 1-based data row
(header excluded; the line for JSONL) and the field. Unsorted timestamps are sorted (stable)
with a one-line :class:`traces.schema.TraceWarning` saying how many rows were out of order,
also recorded as ``rows_resorted``. A trace whose times look like the wrong unit (a span of
more than a year, or more than 1,000 rows at under 1e-3 req/s) gets a one-line warning too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pagesim.sim.errors import TraceError
from pagesim.traces.arrivals import arrivals, describe
from pagesim.traces.names import FORMATS, TIME_UNITS
from pagesim.traces.reading import TimeColumn, Window, file_kind, header, read
from pagesim.traces.schema import (CANONICAL_COLUMNS, first_true, ids_for, plain, refuse_booleans, row_number,
                                   sort_by_arrival, to_integers, to_tokens, validate_canonical, warn)

COLUMN_KEYS = ("prompt", "output", "arrival", "arrival_ms", "timestamp", "id", "n", "beam_width", "priority",
               "hashes")
TIME_KEYS = ("arrival", "arrival_ms", "timestamp")
DEFAULT_LENGTHS_RATE = 2.0
MOONCAKE_BLOCK_TOKENS = 512
#: a trace spanning more than this, or holding more than PLAUSIBLE_MIN_ROWS rows at under
#: PLAUSIBLE_MIN_RATE req/s, was probably read in the wrong time unit
PLAUSIBLE_MAX_SPAN_S = 365.25 * 86400
PLAUSIBLE_MIN_RATE = 1e-3
PLAUSIBLE_MIN_ROWS = 1000


@dataclass(frozen=True)
class Layout:
    """A named format: its columns (``--columns`` keys -> file columns), the default unit of a
    numeric arrival column, the default tokens per prefix hash, whether times are re-zeroed to
    the first request, and the keys whose 0 marks a failed request (dropped and counted).
    ``stated_unit``: the format's documentation states its times' unit (a ``--time-unit`` that
    differs is warned about: the file may be a converted one, but more likely the flag is wrong)."""

    columns: dict = field(default_factory=dict)
    optional: tuple = ()
    time_unit: str = "s"
    stated_unit: bool = False
    hash_block_tokens: int | None = None
    rezero: bool = True
    failed_if_zero: tuple = ()


LAYOUTS = {
    "azure": Layout({"prompt": "ContextTokens", "output": "GeneratedTokens", "timestamp": "TIMESTAMP"}),
    "mooncake": Layout({"prompt": "input_length", "output": "output_length", "arrival": "timestamp",
                        "hashes": "hash_ids"}, optional=("hashes",), time_unit="ms", stated_unit=True,
                       hash_block_tokens=MOONCAKE_BLOCK_TOKENS),  # FAST'25 release: milliseconds
    "burstgpt": Layout({"prompt": "Request tokens", "output": "Response tokens", "arrival": "Timestamp"},
                       failed_if_zero=("output", "prompt"), stated_unit=True),  # BurstGPT's README: seconds
    "lengths": Layout({"prompt": "num_prefill_tokens", "output": "num_decode_tokens"}),
    "canonical": Layout({"prompt": "prompt_tokens", "output": "output_tokens", "arrival": "arrival_s",
                         "id": "request_id", "n": "n", "beam_width": "beam_width", "priority": "priority",
                         "hashes": "prefix_hashes"},
                        optional=("id", "n", "beam_width", "priority", "hashes"), rezero=False,
                        hash_block_tokens=MOONCAKE_BLOCK_TOKENS),
    "generic": Layout(),
}
assert tuple(LAYOUTS) == FORMATS
VIDUR_COLUMNS = {"prompt": "num_prefill_tokens", "output": "num_decode_tokens", "arrival": "arrived_at"}


# ----------------------------------------------------------------------------------------- options

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
            if key.strip() in out:
                raise TraceError(f"--columns: {key.strip()}= given twice ({out[key.strip()]} and {col.strip()}): "
                                 "give it once")
            out[key.strip()] = col.strip()
    else:
        out = dict(columns)
    bad = [k for k in out if k not in COLUMN_KEYS]
    if bad:
        raise TraceError(f"--columns: unknown key(s) {', '.join(bad)}; valid: {', '.join(COLUMN_KEYS)}")
    if sum(k in out for k in TIME_KEYS) > 1:
        raise TraceError("--columns: give at most one of arrival=, arrival_ms=, timestamp=")
    return out


def detect_format(path: str | Path, columns: dict | None = None) -> str:
    """Guess the format of ``path`` from its extension and header (see module docstring); a
    header with Mooncake's keys gives ``mooncake``, which :func:`load_trace` confirms from the numbers."""
    path = Path(path)
    names = header(path, file_kind(path))
    if not names:
        raise TraceError("empty file (no header)", path=str(path))
    h = set(names)
    if columns:
        return "generic"
    for name in ("canonical", "azure", "mooncake", "burstgpt"):
        layout = LAYOUTS[name]
        if {c for k, c in layout.columns.items() if k not in layout.optional} <= h:
            return name
    if set(VIDUR_COLUMNS.values()) <= h:
        return "generic"
    if set(LAYOUTS["lengths"].columns.values()) <= h:
        return "lengths"
    raise TraceError(f"cannot tell the trace format from the columns [{', '.join(names[:8])}]; pass --format "
                     f"({', '.join(FORMATS)}) or --columns prompt=COL,output=COL[,arrival=COL]", path=str(path))


def _column_map(fmt: str, layout: Layout, user: dict, path: Path, kind: str) -> dict[str, str]:
    """The format's columns with the user's ``--columns`` entries over them."""
    cols = dict(layout.columns)
    if fmt == "generic" and not user and set(VIDUR_COLUMNS.values()) <= set(header(path, kind)):
        cols = dict(VIDUR_COLUMNS)
    if any(k in user for k in TIME_KEYS):
        cols = {k: v for k, v in cols.items() if k not in TIME_KEYS}
    cols.update(user)
    if fmt == "lengths":  # a lengths table has no times, whatever else is mapped
        cols = {k: v for k, v in cols.items() if k not in TIME_KEYS}
    if fmt == "generic" and not cols:
        raise TraceError("format 'generic' needs --columns prompt=COL,output=COL[,arrival=COL]", path=str(path))
    for k in ("prompt", "output"):
        if k not in cols:
            raise TraceError(f"--columns needs {k}=COL (got {', '.join(f'{a}={b}' for a, b in cols.items())})",
                             path=str(path))
    return cols


def _time_column(fmt: str, layout: Layout, cols: dict, time_unit: str | None, path: str) -> TimeColumn | None:
    """The arrival column and its unit; TraceError where ``time_unit`` contradicts the file."""
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise TraceError(f"unknown time unit '{time_unit}'; valid: {', '.join(TIME_UNITS)}", path=path)
    key = next((k for k in TIME_KEYS if k in cols), None)
    given = f"--time-unit {time_unit}"
    if key is None:
        if time_unit is not None:
            raise TraceError(f"{given}: this trace has no time column (its arrivals are synthetic)", path=path)
        return None
    name = cols[key]
    if key == "timestamp":
        if time_unit is not None and "timestamp" in layout.columns:
            raise TraceError(f"{given}: {name} holds date-times, which carry their own unit", path=path, field=name)
        return TimeColumn(name, time_unit)
    if key == "arrival_ms":
        if time_unit not in (None, "ms"):
            raise TraceError(f"{given}: arrival_ms= says milliseconds; map the column with arrival= instead",
                             path=path, field=name)
        return TimeColumn(name, "ms")
    if not layout.rezero and time_unit not in (None, "s"):
        raise TraceError(f"{given}: the canonical arrival_s is in seconds", path=path, field=name)
    if layout.stated_unit and time_unit not in (None, layout.time_unit):
        warn(f"{path}: {fmt} traces state their times in {layout.time_unit}; {given} reads {name} in {time_unit}")
    return TimeColumn(name, time_unit or layout.time_unit, rezeroed=layout.rezero)


# ----------------------------------------------------------------------------------------- conversions

def _numbers_to_seconds(s: pd.Series, time: TimeColumn, *, path: str, rows: np.ndarray | None,
                        rezero: bool) -> tuple[np.ndarray, str | None]:
    """Numeric times -> seconds (re-zeroed to the earliest when ``rezero``); differences are
    taken before scaling, exactly for integers (nanoseconds since 1970 need all 63 bits)."""
    refuse_booleans(s, path=path, field=time.name, rows=rows)
    num = pd.to_numeric(s, errors="coerce")
    if pd.api.types.is_integer_dtype(num.dtype):
        v = num.to_numpy(dtype=np.int64)
        bad = v < 0
    else:
        v = num.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(v) | (v < 0)
    i = first_true(bad)
    if i is not None:
        raise TraceError(f"timestamp must be a finite number >= 0, got {plain(s.iloc[i])!r}", path=path,
                         row=row_number(rows, i), field=time.name)
    scale = TIME_UNITS[time.unit]
    if not rezero:
        return v.astype(np.float64) * scale, None
    origin = v.min()
    return (v - origin).astype(np.float64) * scale, f"{origin:g} {time.unit}"


_UTC_OFFSET = r"(?:Z|[+-]\d\d(?::?\d\d)?)\s*$"


def _datetimes_to_seconds(s: pd.Series, time: TimeColumn, *, path: str,
                          rows: np.ndarray | None) -> tuple[np.ndarray, str]:
    """Date-times (parsed by the reader, or strings) -> seconds since the earliest (vectorized);
    TraceError at the first bad one, at the first row that differs from row 1 in having a UTC
    offset, or on numbers (whose unit only ``--time-unit`` can say)."""
    field_ = time.name
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        t = s
    else:
        if pd.api.types.is_numeric_dtype(s.dtype) or bool(pd.to_numeric(s, errors="coerce").notna().all()):
            raise TraceError("holds numbers, not date-times; give their unit with --time-unit s|ms|us|ns",
                             path=path, field=field_)
        text = s.astype(str)
        aware = text.str.contains(_UTC_OFFSET, regex=True).to_numpy(dtype=bool)
        i = first_true(aware != aware[0])
        if i is not None:
            def has(k):
                return f"row {row_number(rows, k)} {'has' if aware[k] else 'has none'}"
            raise TraceError(f"mixes date-times with and without a UTC offset ({has(0)}, {has(i)}); "
                             f"give every time an offset or none", path=path, row=row_number(rows, i), field=field_)
        utc = bool(aware[0])
        t = pd.to_datetime(text, format="ISO8601", errors="coerce", utc=utc)
        bad = t.isna().to_numpy()
        if bad.any():  # maybe just a format pandas' ISO parser dislikes: try the flexible parser on all
            t2 = pd.to_datetime(text, format="mixed", errors="coerce", utc=utc)
            if t2.isna().sum() < bad.sum():
                t = t2
        i = first_true(t.isna().to_numpy())
        if i is not None:
            raise TraceError(f"unparseable timestamp {plain(s.iloc[i])!r}", path=path, row=row_number(rows, i),
                             field=field_)
    t0 = t.min()
    return (t - t0).dt.total_seconds().to_numpy(dtype=np.float64), str(t0)


def _hash_tuples(values: pd.Series, *, path: str, field_: str, rows: np.ndarray | None) -> list[tuple]:
    """Hash cells -> tuples of ints: lists, space-separated ints (CSV), or dicts of lists
    concatenated in the order their keys first appear in the file; empty cells -> ()."""
    cells = values.tolist()
    key_order = list(dict.fromkeys(k for v in cells if isinstance(v, dict) for k in v))

    def one(v):
        if isinstance(v, dict):
            return tuple(int(x) for k in key_order for x in v.get(k) or ())
        if isinstance(v, (list, tuple, np.ndarray)):
            return tuple(int(x) for x in v)
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return ()
        if isinstance(v, str):
            return tuple(int(x) for x in v.replace(",", " ").strip("[]() ").split())
        raise TypeError(v)

    out = []
    for i, v in enumerate(cells):
        try:
            out.append(one(v))
        except (TypeError, ValueError):
            raise TraceError(f"must be a list of integers (or a dict of lists, or space-separated integers), "
                             f"got {v!r}", path=path, row=row_number(rows, i), field=field_) from None
    return out


def _mooncake_misfit(raw: pd.DataFrame, cols: dict, path: str) -> str | None:
    """Why a file with Mooncake's keys does not hold Mooncake's numbers, or None when it does.
    A row's hashes fit when they are a list of ``ceil(prompt / 512)``. Where most rows fit, the
    file is Mooncake's and a row that does not is a TraceError naming it (one bad row must not
    turn every timestamp from milliseconds into seconds); where most do not, the reason."""
    ts = raw[cols["arrival"]]
    if not pd.api.types.is_numeric_dtype(ts.dtype):
        return f"{cols['arrival']} holds strings, Mooncake's are numbers of milliseconds"
    if cols.get("hashes") not in raw.columns:
        return f"no {LAYOUTS['mooncake'].columns['hashes']} to confirm Mooncake's 512-token blocks"
    hashes = raw[cols["hashes"]]
    lists = hashes.map(lambda v: isinstance(v, list)).to_numpy(dtype=bool)
    prompt = pd.to_numeric(raw[cols["prompt"]], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    blocks = np.ceil(prompt / MOONCAKE_BLOCK_TOKENS)
    lengths = np.array([len(v) if isinstance(v, list) else -1 for v in hashes], dtype=np.float64)
    # (a row without a whole prompt count is the prompt check's to refuse, not a misfit)
    fits = (lists & (lengths == blocks)) | ~np.isfinite(blocks)
    if fits.all():
        return None
    i = first_true(~fits)
    if 2 * int(fits.sum()) > len(fits):
        got = f"a list of {int(lengths[i])}" if lists[i] else f"{type(hashes.iloc[i]).__name__} {hashes.iloc[i]!r:.40}"
        raise TraceError(f"must be a list of ceil({cols['prompt']} / {MOONCAKE_BLOCK_TOKENS}) = {int(blocks[i])} block "
                         f"hashes, as the file's other rows are (Mooncake's), got {got}", path=path,
                         row=row_number(None, i), field=cols["hashes"])
    if not lists[i]:
        return f"{cols['hashes']} holds {type(hashes.iloc[i]).__name__}s, Mooncake's are lists"
    return f"{cols['hashes']} lengths are not ceil({cols['prompt']} / {MOONCAKE_BLOCK_TOKENS})"


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


def _warn_if_implausible(arrival_s: np.ndarray, path: str, unit: str) -> None:
    """One line when the span or the rate says the times were probably read in the wrong unit."""
    span = float(arrival_s.max() - arrival_s.min())
    rows = arrival_s.size
    rate = (rows - 1) / span if span > 0 else math.inf
    if span > PLAUSIBLE_MAX_SPAN_S or (rows > PLAUSIBLE_MIN_ROWS and rate < PLAUSIBLE_MIN_RATE):
        warn(f"{path}: {rows:,} requests over {span:.4g} s ({span / PLAUSIBLE_MAX_SPAN_S:.3g} years, "
             f"{rate:.3g} req/s) is implausible for a request trace; its times were read as {unit} "
             f"(set --time-unit to change)")


# ----------------------------------------------------------------------------------------- public

def load_trace(path: str | Path, format: str | None = None, columns: str | dict | None = None,
               spread_timestamps: bool = False, arrival: str = "poisson", seed: int = 0, *,
               rate: float | None = None, cv: float = 1.0, time_unit: str | None = None,
               hash_block_tokens: int | None = None, window: Window | None = None) -> pd.DataFrame:
    """Load ``path`` into the canonical form; ``df.attrs['load_report']`` says what happened.

    ``format``: one of :data:`FORMATS` or None (detect). ``columns``: column map over the
    format's own (see module docstring). ``spread_timestamps``: spread rows that share a
    timestamp within the quantization step (seeded with ``seed``; reads the whole file).
    ``arrival``/``rate``/``cv``: the synthetic arrival process for traces without times
    (``lengths``, or ``generic`` without a time column); ``rate`` defaults to 2.0 req/s there
    and is ignored for timed traces (use :func:`traces.transform.scale_rate`). ``time_unit``,
    ``hash_block_tokens``: see the module docstring. ``window``: the rows the caller keeps,
    letting a CSV reader stop early (see :mod:`traces.reading`).
    """
    path = Path(path)
    p = str(path)
    if not path.exists():
        raise TraceError("file not found", path=p)
    if path.is_dir():
        raise TraceError("is a directory, expected a trace file", path=p)
    if path.stat().st_size == 0:
        raise TraceError("empty file", path=p)
    if hash_block_tokens is not None and not (isinstance(hash_block_tokens, int) and hash_block_tokens >= 1):
        raise TraceError(f"--hash-block-tokens must be an integer >= 1, got {hash_block_tokens}", path=p)
    user = parse_columns(columns)
    detected = format is None
    if detected:
        format = detect_format(path, user)
    if format not in LAYOUTS:
        raise TraceError(f"unknown trace format '{format}'; valid: {', '.join(FORMATS)}", path=p)
    kind = file_kind(path)
    layout = LAYOUTS[format]
    cols = _column_map(format, layout, user, path, kind)
    time = _time_column(format, layout, cols, time_unit, p)
    required = [c for k, c in cols.items() if k not in layout.optional or k in user]
    wanted = None  # JSON lines are read whole
    if kind != "jsonl":
        present = header(path, kind)
        missing = [c for c in required if c not in present]
        if missing:
            raise TraceError(f"missing column (have: {', '.join(map(str, present))})", path=p, field=missing[0])
        wanted = list(dict.fromkeys(c for c in cols.values() if c in present))
    text = tuple(c for k, c in cols.items() if k in ("id", "hashes") and (wanted is None or c in wanted))
    raw, stopped = read(path, kind, wanted, time=time, text=text, window=None if spread_timestamps else window)
    for c in required:
        if c not in raw.columns:
            raise TraceError(f"missing column (have: {', '.join(map(str, raw.columns))})", path=p, field=c)
    cols = {k: c for k, c in cols.items() if c in raw.columns}

    rep: dict[str, Any] = dict(path=p, format=format, rows_read=int(len(raw)), rows_dropped={}, rows_resorted=0,
                               arrival_origin=None, time_unit=None, stopped_early=bool(stopped),
                               spread_timestamps=False, synthetic_arrivals=None)
    block = hash_block_tokens if hash_block_tokens is not None else layout.hash_block_tokens
    if format == "canonical" and hash_block_tokens is None:
        block = int(raw.attrs.get("hash_block_tokens", block))
    if format == "mooncake" and detected:
        why = _mooncake_misfit(raw, cols, p)
        if why is not None:  # read it as generic: times in seconds unless told, hashes only with a block size
            time = replace(time, unit=time_unit or "s")
            rep["format"] = "generic"
            block = hash_block_tokens
            ignored = cols.pop("hashes", None) if block is None else None
            if time_unit is None or ignored:
                warn(f"{p}: has Mooncake's keys but not its numbers ({why}); read as generic with "
                     f"{time.name} in {time.unit}"
                     + (" (set --time-unit to change, or --format mooncake for milliseconds)" if time_unit is None else "")
                     + (f"; {ignored} ignored (give --hash-block-tokens N to use it)" if ignored else ""))
    if "hashes" in cols and block is None:
        raise TraceError(f"hashes={cols['hashes']} needs --hash-block-tokens N (prompt tokens per hash; "
                         f"Mooncake 512, Qwen/Bailian 16)", path=p, field=cols["hashes"])

    rows = None  # 1-based source rows of the kept rows, when rows were dropped
    for key in layout.failed_if_zero:
        name = cols[key]
        zero = pd.to_numeric(raw[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan) == 0
        if zero.any():
            rep["rows_dropped"][f"failed request (0 {name.lower()})"] = int(zero.sum())
            rows = (np.arange(1, len(raw) + 1) if rows is None else rows)[~zero]
            raw = raw.loc[~zero].reset_index(drop=True)
            if len(raw) == 0:
                raise TraceError(f"every row is a failed request ({', '.join(rep['rows_dropped'])})", path=p)

    data: dict[str, Any] = {k: to_tokens(raw[cols[k]], path=p, field=cols[k], rows=rows)
                            for k in ("prompt", "output", "n", "beam_width") if k in cols}
    if "priority" in cols:
        data["priority"] = to_integers(raw[cols["priority"]], path=p, field=cols["priority"], rows=rows)
    if time is None:
        r = DEFAULT_LENGTHS_RATE if rate is None else rate
        arrival_s = arrivals(arrival, r, num_requests=len(raw), cv=cv, rng=np.random.default_rng(seed))
        rep["synthetic_arrivals"] = describe(arrival, r, cv, seed)
    else:
        if time.unit is None:
            arrival_s, rep["arrival_origin"] = _datetimes_to_seconds(raw[time.name], time, path=p, rows=rows)
        else:
            arrival_s, rep["arrival_origin"] = _numbers_to_seconds(raw[time.name], time, path=p, rows=rows,
                                                                   rezero=layout.rezero)
        rep["time_unit"] = time.unit or "date-time"
        _warn_if_implausible(arrival_s, p, rep["time_unit"])
        if spread_timestamps:
            arrival_s = spread_ties(arrival_s, np.random.default_rng(seed))
            rep["spread_timestamps"] = True

    if "id" in cols:
        ids = raw[cols["id"]].astype(str)
    else:
        ids = ids_for(len(raw)) if rows is None else pd.Series(rows - 1).astype(str)
    frame = {"request_id": ids.reset_index(drop=True).astype(str), "arrival_s": np.asarray(arrival_s, dtype=np.float64),
             "prompt_tokens": data["prompt"], "output_tokens": data["output"]}
    for k in ("n", "beam_width", "priority"):
        if k in data:
            frame[k] = data[k]
    if "hashes" in cols:
        frame["prefix_hashes"] = pd.Series(_hash_tuples(raw[cols["hashes"]], path=p, field_=cols["hashes"], rows=rows),
                                           dtype=object)
    df = pd.DataFrame(frame, copy=False)  # no copies of tens of millions of rows
    df.attrs = {"source": p}
    if "hashes" in cols:
        df.attrs["hash_block_tokens"] = int(block)
    df = sort_by_arrival(df, rep, path=p)
    df.attrs["load_report"] = rep
    return validate_canonical(df, source=p, unique_ids="id" not in cols)


def write_trace(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` in canonical form: ``.parquet``/``.pq`` (Parquet), ``.jsonl`` or CSV otherwise.

    In CSV, ``prefix_hashes`` becomes space-separated ints (read back by :func:`load_trace`).
    """
    path = Path(path)
    validate_canonical(df)
    cols = [c for c in (*CANONICAL_COLUMNS, "n", "beam_width", "priority", "prefix_hashes") if c in df.columns]
    out = df[cols].copy()
    out.attrs = {k: v for k, v in df.attrs.items() if k == "hash_block_tokens"}
    kind = file_kind(path)
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
