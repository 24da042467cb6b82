"""Reading the columns of a trace file into pandas, fast, for :mod:`traces.loaders`.

CSV goes through pyarrow, block by block (date-times parsed in C, one block's text in memory at a
time): 27 M rows in seconds instead of minutes, in about the memory of the parsed columns. pyarrow types every column on the way; when it cannot (a bad number, a
malformed line, times with and without a UTC offset), the file is read again by pandas as text,
so that the loaders' checks find and name the bad row. JSON lines and Parquet go through pandas.

A caller that keeps only a window of the trace (``--time-slice``, ``--num-requests``) passes a
:class:`Window`: a CSV file is then read in blocks and reading stops at the first block past the
window, provided every row so far was in time order. Rows further on are assumed to be in order
too (a trace sorted up to the window's end and unsorted later would lose late rows that belong
in the window); a file found out of order before that point is read in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pagesim.sim.errors import TraceError
from pagesim.traces.names import TIME_UNITS

#: bytes of CSV text parsed at a time: small enough that stopping early saves most of a week-long
#: file when the window is an hour and that the text in memory stays small, large enough to keep
#: pyarrow's per-block cost low
READ_BLOCK_BYTES = 1 << 22


@dataclass(frozen=True)
class Window:
    """The rows a caller keeps: those arriving in ``[start_s, end_s)`` seconds after the first
    row, at most the first ``count`` of them (None: no limit)."""

    start_s: float = 0.0
    end_s: float = math.inf
    count: int | None = None

    def passed(self, relative_s: np.ndarray, kept_before: int) -> tuple[bool, int]:
        """Whether a sorted file is past the window after this block of relative arrival times,
        and how many rows at or after ``start_s`` have been seen. Comparisons leave a margin
        of a microsecond (relative 1e-12) so that rounding in the caller's own selection never
        wants a row the reader skipped."""
        margin = 1e-6 + 1e-12 * max(abs(self.start_s), abs(self.end_s) if math.isfinite(self.end_s) else 0.0)
        kept = kept_before + int(np.count_nonzero(relative_s >= self.start_s + margin))
        past_end = relative_s.size > 0 and relative_s[-1] > self.end_s + margin
        return past_end or (self.count is not None and kept >= self.count), kept


@dataclass(frozen=True)
class TimeColumn:
    """A file's arrival column: ``unit`` (a key of :data:`traces.names.TIME_UNITS`) for numbers,
    None for date-time strings."""

    name: str
    unit: str | None
    rezeroed: bool = True  # the loader makes the first row 0 s (else times are kept as they are)


def file_kind(path: Path) -> str:
    """``csv``, ``jsonl`` or ``parquet``, from the extension (after a compression suffix)."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "csv"


def header(path: Path, kind: str) -> list[str]:
    """The column names of ``path`` (for JSON lines: the first object's keys) without reading the data."""
    import json
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


def read(path: Path, kind: str, columns: list[str] | None = None, *, time: TimeColumn | None = None,
         text: tuple[str, ...] = (), window: Window | None = None) -> tuple[pd.DataFrame, bool]:
    """The ``columns`` of ``path`` (None: all; JSON lines are always read whole) and whether reading
    stopped early at the end of ``window``. ``time`` names the arrival column (needed to stop
    early, and to parse date-times in C); ``text`` columns are kept as strings (ids, hashes)."""
    p = str(path)
    stopped = False
    try:
        if kind == "parquet":
            df = pd.read_parquet(path, columns=columns)
        elif kind == "jsonl":
            df = _read_jsonl(path)
        else:
            df, stopped = _read_csv(path, columns, time, text, window)
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
    if columns is not None:
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise TraceError(f"missing column (have: {', '.join(map(str, df.columns))})", path=p, field=missing[0])
    if len(df) == 0:
        raise TraceError("no data rows", path=p)
    return df, stopped


def _read_jsonl(path: Path) -> pd.DataFrame:
    try:
        return pd.read_json(path, lines=True, dtype=False)
    except ValueError as e:
        _raise_bad_json_line(path, e)


def _raise_bad_json_line(path: Path, err: Exception):
    """Error path only: find the first line that is not a JSON object (per-line Python is fine here)."""
    import json
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


def _column_types(time: TimeColumn | None, text: tuple[str, ...]) -> list[dict]:
    """pyarrow types to try in turn: date-times without, then with, a UTC offset."""
    import pyarrow as pa
    base = {c: pa.string() for c in text}
    if time is None or time.unit is not None:
        return [base]
    return [{**base, time.name: pa.timestamp("ns")}, {**base, time.name: pa.timestamp("ns", tz="UTC")}]


def _read_csv(path: Path, columns: list[str] | None, time: TimeColumn | None, text: tuple[str, ...],
              window: Window | None) -> tuple[pd.DataFrame, bool]:
    import pyarrow as pa
    if window is not None and (time is None or (window.end_s == math.inf and window.count is None)):
        window = None
    for types in _column_types(time, text):
        try:
            table, stopped = _read_csv_blocks(path, columns, types, time, window)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            continue
        # self_destruct frees each column's Arrow memory once converted: the peak stays near one copy
        return table.to_pandas(self_destruct=True, split_blocks=True), stopped
    # pyarrow could not type it: pandas reads text, and the loaders' checks name the bad row
    if columns is not None:
        have = list(pd.read_csv(path, nrows=0).columns)
        missing = [c for c in columns if c not in have]
        if missing:
            raise TraceError(f"missing column (have: {', '.join(have)})", path=str(path), field=missing[0])
    as_text = {c: str for c in (*text, *([time.name] if time is not None and time.unit is None else []))}
    return pd.read_csv(path, usecols=columns, dtype=as_text or None, skipinitialspace=True), False


def _raw_times(column, time: TimeColumn) -> tuple[np.ndarray, float]:
    """One pyarrow column's arrival times as numbers (date-times: int64 ns; NaN where missing or
    not a number) and the seconds per unit."""
    import pyarrow as pa
    if pa.types.is_timestamp(column.type):
        return column.cast(pa.int64()).to_numpy(zero_copy_only=False), 1e-9
    values = column.to_numpy(zero_copy_only=False)
    if values.dtype.kind not in "iuf":
        values = np.full(len(values), np.nan)
    return values, TIME_UNITS[time.unit]


def _read_csv_blocks(path: Path, columns: list[str] | None, types: dict, time: TimeColumn | None,
                     window: Window | None):
    """The file as a pyarrow Table, read block by block (one block's text in memory at a time),
    stopping after the block that passes ``window``; rows out of order before that point turn
    the window off (the whole file is read). Returns ``(table, stopped_early)``."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=READ_BLOCK_BYTES),
                            convert_options=pacsv.ConvertOptions(include_columns=columns, column_types=types))
    batches, first, last, kept = [], None, -math.inf, 0
    for batch in reader:
        batches.append(batch)
        if window is None or batch.num_rows == 0:
            continue
        t, scale = _raw_times(batch.column(time.name), time)
        if not (t[0] >= last and bool(np.all(t[1:] >= t[:-1]))):  # also False on NaN
            window = None
            continue
        if first is None:
            first = t[0] if time.rezeroed else 0
        last = t[-1]
        done, kept = window.passed((t - first) * scale, kept)
        if done:
            return pa.Table.from_batches(batches, reader.schema), True
    return pa.Table.from_batches(batches, reader.schema), False
