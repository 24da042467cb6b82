"""The canonical trace form (see :mod:`traces`), vectorized checks that name the first bad row, and
the one-line warnings loaders give about what they repaired or doubt."""

from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

from pagesim.sim import errors
from pagesim.sim.errors import PagesimWarning, TraceError

CANONICAL_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL_COLUMNS = ("n", "beam_width", "priority", "prefix_hashes")
INT_COLUMNS = ("prompt_tokens", "output_tokens", "n", "beam_width")


class TraceWarning(PagesimWarning):
    """A trace the loader repaired (re-sorted) or doubts (implausible units); printed as one line."""


def warn(message: str) -> None:
    """Warn about a trace: ``pagesim: warning: <message>`` on one line, without a source line."""
    errors.warn(message, TraceWarning, stacklevel=3)


def _source(df: pd.DataFrame, source: str | None) -> str:
    return source if source is not None else str(df.attrs.get("source", "<trace>"))


def first_true(mask: np.ndarray) -> int | None:
    """Index of the first True in ``mask`` (vectorized), or None."""
    mask = np.asarray(mask, dtype=bool)
    i = int(mask.argmax()) if mask.size else 0
    return i if mask.size and mask[i] else None


def plain(value):
    """A cell as a message shows it: a numpy scalar as its Python number (``-5``, not
    ``np.int64(-5)``), anything else as it is."""
    return value.item() if isinstance(value, np.generic) else value


def row_number(rows: np.ndarray | None, i: int) -> int:
    """1-based data row of position ``i``; ``rows`` maps positions to source rows when given."""
    return int(rows[i]) if rows is not None else i + 1


#: the largest token count a trace may give: 2^40, far beyond any context, so that a request's
#: prompt plus output and the slots and blocks made from them stay exact in int64
MAX_TOKENS = 2**40


def refuse_booleans(s: pd.Series, *, path: str, field: str, rows: np.ndarray | None = None) -> None:
    """A yes/no value (JSON's true/false, a boolean column) is no number: True would read as 1.
    TraceError at the first one."""
    if pd.api.types.is_bool_dtype(s.dtype):
        i = 0 if len(s) else None
    elif s.dtype == object:
        i = first_true(np.fromiter((isinstance(v, (bool, np.bool_)) for v in s), bool, len(s)))
    else:
        i = None
    if i is not None:
        raise TraceError(f"a yes/no value ({plain(s.iloc[i])!r}), not a number", path=path,
                         row=row_number(rows, i), field=field)


def to_tokens(values, *, path: str, field: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Parse a token-count column to int64, raising TraceError at the first value that is not a
    whole number from 1 to :data:`MAX_TOKENS` (non-numeric, NaN, zero, negative, fractional, or
    one that would overflow the counts made from it)."""
    s = values if isinstance(values, pd.Series) else pd.Series(values)
    refuse_booleans(s, path=path, field=field, rows=rows)
    if pd.api.types.is_integer_dtype(s.dtype) and not isinstance(s.dtype, pd.CategoricalDtype):
        if s.dtype == np.uint64 and not s.hasnans:  # above int64's range, read as unsigned
            arr = np.minimum(s.to_numpy(), MAX_TOKENS + 1).astype(np.int64)
        else:
            arr = s.to_numpy(dtype=np.int64, na_value=-1) if s.hasnans else s.to_numpy(dtype=np.int64)
        i = first_true((arr < 1) | (arr > MAX_TOKENS))
        if i is not None:
            raise TraceError(f"token count must be a whole number from 1 to {MAX_TOKENS:,} (2^40), "
                             f"got {plain(s.iloc[i])}",
                             path=path, row=row_number(rows, i), field=field)
        return arr
    num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(num) | (num < 1) | (num != np.floor(num)) | (num > MAX_TOKENS)
    i = first_true(bad)
    if i is not None:
        raw = plain(s.iloc[i])  # 1e+20, not np.float64(1e+20)
        why = ("is missing" if pd.isna(raw) or (isinstance(raw, str) and not raw.strip())
               else f"must be a whole number from 1 to {MAX_TOKENS:,} (2^40), got {raw!r}")
        raise TraceError(f"token count {why}", path=path, row=row_number(rows, i), field=field)
    return num.astype(np.int64)


def to_integers(values, *, path: str, field: str, rows: np.ndarray | None = None) -> np.ndarray:
    """Parse a column of whole numbers of any sign (a priority) to int64, raising TraceError at the
    first value that is missing, not a number or not whole."""
    s = values if isinstance(values, pd.Series) else pd.Series(values)
    if pd.api.types.is_integer_dtype(s.dtype) and not s.hasnans:
        return s.to_numpy(dtype=np.int64)
    refuse_booleans(s, path=path, field=field, rows=rows)  # (no level: a yes/no column named for another meaning)
    num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    i = first_true(~np.isfinite(num) | (num != np.floor(num)) | (np.abs(num) >= 2.0**62))
    if i is not None:
        raw = plain(s.iloc[i])
        why = ("is missing" if pd.isna(raw) or (isinstance(raw, str) and not raw.strip())
               else f"must be below 2^62 in magnitude, got {raw!r}: too large" if np.isfinite(num[i])
               and num[i] == np.floor(num[i])
               else f"must be a whole number, got {raw!r}")
        raise TraceError(why, path=path, row=row_number(rows, i), field=field)
    return num.astype(np.int64)


def to_seconds(values, *, path: str, field: str, rows: np.ndarray | None = None, scale: float = 1.0) -> np.ndarray:
    """Parse a numeric time column (``scale`` converts to seconds, e.g. 1e-3 for ms)."""
    s = values if isinstance(values, pd.Series) else pd.Series(values)
    refuse_booleans(s, path=path, field=field, rows=rows)
    num = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    i = first_true(~np.isfinite(num) | (num < 0))
    if i is not None:
        raw = s.iloc[i]
        raise TraceError(f"timestamp must be a finite number >= 0, got {raw!r}", path=path,
                         row=row_number(rows, i), field=field)
    return num * scale


def rows_out_of_order(a: np.ndarray) -> int:
    """The fewest rows that must move to sort ``a``: its length minus its longest non-decreasing
    subsequence (one late row among 7,106 is 1, not the 7,104 positions a sort shifts).

    A row that is >= every row before it and <= every row after it is in every longest
    subsequence, and the other rows' longest subsequence adds to those, so the per-row search
    (patience sorting) runs over the other rows only: few in a nearly sorted trace."""
    a = np.asarray(a)
    anchored = (a >= np.maximum.accumulate(a)) & (a <= np.minimum.accumulate(a[::-1])[::-1])
    rest = a[~anchored].tolist()
    tails: list = []  # tails[k]: the smallest last value of a non-decreasing run of length k + 1
    for x in rest:
        k = bisect.bisect_right(tails, x)
        if k == len(tails):
            tails.append(x)
        else:
            tails[k] = x
    return len(rest) - len(tails)


def sort_by_arrival(df: pd.DataFrame, report: dict, *, path: str) -> pd.DataFrame:
    """Stable-sort by ``arrival_s`` if needed; record (``rows_resorted``) and warn how many rows
    were out of order (:func:`rows_out_of_order`)."""
    a = df["arrival_s"].to_numpy()
    if a.size < 2 or bool(np.all(a[1:] >= a[:-1])):
        report.setdefault("rows_resorted", 0)
        return df
    late = rows_out_of_order(a)
    report["rows_resorted"] = late
    warn(f"{path}: timestamps not sorted: {late} of {a.size} rows out of order; sorted by arrival")
    order = np.argsort(a, kind="stable")
    out = df.iloc[order].reset_index(drop=True)
    out.attrs = dict(df.attrs)
    return out


def ids_for(n: int, start: int = 0) -> pd.Series:
    """Request ids '0', '1', ... as the str dtype (vectorized; Arrow writes the digits)."""
    import pyarrow as pa
    return pa.array(np.arange(start, start + n)).cast(pa.string()).to_pandas()


def validate_canonical(df: pd.DataFrame, source: str | None = None, *, unique_ids: bool = False) -> pd.DataFrame:
    """Check that ``df`` is in canonical form (see :mod:`traces`); return it unchanged.

    Raises :class:`~sim.errors.TraceError` naming ``source`` (default ``df.attrs['source']``),
    the first offending 1-based row and the field: a missing column, a token count or
    ``n``/``beam_width`` that is not an integer >= 1, a ``priority`` that is not an integer, a non-finite or negative or decreasing
    ``arrival_s``, a duplicate ``request_id``, a ``prefix_hashes`` cell that is not a tuple.
    ``unique_ids=True`` skips the duplicate check, for ids the caller made unique (a loader's
    row numbers: the check costs seconds on tens of millions of rows).
    """
    src = _source(df, source)
    if not isinstance(df, pd.DataFrame):
        raise TraceError(f"expected a pandas DataFrame, got {type(df).__name__}", path=src)
    for col in CANONICAL_COLUMNS:
        if col not in df.columns:
            raise TraceError(f"missing column (have: {', '.join(map(str, df.columns))})", path=src, field=col)
    if len(df) == 0:
        raise TraceError("trace has no requests", path=src)
    for col in INT_COLUMNS:
        if col not in df.columns:
            continue
        s = df[col]
        if not pd.api.types.is_integer_dtype(s.dtype):
            i = first_true(pd.to_numeric(s, errors="coerce").isna().to_numpy()) if not pd.api.types.is_numeric_dtype(s.dtype) else None
            raise TraceError(f"must be an integer column, got dtype {s.dtype}", path=src,
                             row=None if i is None else i + 1, field=col)
        i = first_true(s.to_numpy() < 1)
        if i is not None:
            raise TraceError(f"must be >= 1, got {s.iloc[i]}", path=src, row=i + 1, field=col)
    a = df["arrival_s"]
    if not pd.api.types.is_float_dtype(a.dtype):
        raise TraceError(f"must be float64 seconds, got dtype {a.dtype}", path=src, field="arrival_s")
    av = a.to_numpy()
    i = first_true(~np.isfinite(av) | (av < 0))
    if i is not None:
        raise TraceError(f"must be finite and >= 0, got {av[i]}", path=src, row=i + 1, field="arrival_s")
    i = first_true(np.r_[False, av[1:] < av[:-1]])
    if i is not None:
        raise TraceError(f"arrivals must be non-decreasing ({av[i]} after {av[i - 1]})", path=src, row=i + 1,
                         field="arrival_s")
    if not unique_ids:
        ids = df["request_id"]
        i = first_true(ids.duplicated().to_numpy())
        if i is not None:
            raise TraceError(f"duplicate request_id {plain(ids.iloc[i])!r}", path=src, row=i + 1, field="request_id")
    if "priority" in df.columns and not pd.api.types.is_integer_dtype(df["priority"].dtype):
        raise TraceError(f"must be an integer column, got dtype {df['priority'].dtype}", path=src, field="priority")
    if "prefix_hashes" in df.columns:
        ok = df["prefix_hashes"].map(lambda t: isinstance(t, tuple)).to_numpy(dtype=bool)
        i = first_true(~ok)
        if i is not None:
            raise TraceError("must be a tuple of ints", path=src, row=i + 1, field="prefix_hashes")
    return df
