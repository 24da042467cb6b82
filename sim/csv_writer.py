"""Writing a run's tables as CSV, byte for byte as ``DataFrame.to_csv(path, index=False)``
writes them, about five times faster.

Why not pandas: its writer formats every float through numpy's Dragon4 (about 3 us a value),
which made writing the Azure conv trace's 83,844 step rows 0.5-0.8 s, as long as the rest of
``pagesim simulate``. Here each column becomes strings with Arrow's C++ casts, rows are
joined by Arrow (``binary_join_element_wise``), and only what Arrow formats unlike Python's
``repr`` goes through ``repr``: a float Arrow writes without a ``.`` (``0``, ``123``, ``5e+15``,
``-0``), with an exponent (``1.5e-7``: ``repr`` pads to ``e-07``), or positionally below 1e-4
(``0.00001``: ``repr`` switches to ``1e-05`` there). Both are the shortest digits that read
back as the same float, so the other strings are the same. Text as ``to_csv``'s default
(``QUOTE_MINIMAL``): a field is quoted when it holds the delimiter, a quote or a line break,
quotes inside doubled; a missing value is an empty field (``""`` where it is a row's only field). ``tests/sim/test_csv_writer.py``
compares with ``to_csv`` on awkward values.

The rows go out a block at a time (:data:`ROWS_PER_BLOCK`): the strings of a block are a few
megabytes whatever the table's length, where the whole table's would be several times the file
(ten million requests: about 9 GB), and Arrow's casts run about three times faster on blocks
that stay in the cache. A table is a DataFrame or its columns by name (numpy arrays, Arrow or
pandas string arrays, columns computed for a block's rows: ``sim.metrics.request_columns``),
written without a DataFrame between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc


def _float_strings(values: np.ndarray) -> pa.Array:
    text = pa.array(values).cast(pa.string())
    # Arrow's string equals repr's where it is positional, with a '.', and not below 1e-4
    same = pc.and_(pc.match_substring(text, "."),
                   pc.invert(pc.or_(pc.match_substring(text, "e"), pc.match_substring_regex(text, r"^-?0\.0000"))))
    redo = np.flatnonzero(~same.to_numpy(zero_copy_only=False))
    if not len(redo):
        return text
    strings = text.to_numpy(zero_copy_only=False).astype(object)
    strings[redo] = [repr(v) for v in values[redo].tolist()]
    return pa.array(strings, pa.string())


def _quoted(value) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return ""
    text = str(value)
    if any(c in text for c in ',"\n\r'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _column_strings(column) -> pa.Array:
    """One column's fields as strings: ``column`` a pandas Series, a numpy array or an Arrow array."""
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        return _text_quoted(pc.fill_null(column.cast(pa.string()), ""))
    values = column.to_numpy() if hasattr(column, "to_numpy") else np.asarray(column)
    kind = values.dtype.kind
    if kind in "iu":
        return pa.array(values).cast(pa.string())
    if kind == "f":
        text = _float_strings(values)
        return pc.if_else(pc.is_nan(pa.array(values)), "", text) if np.isnan(values).any() else text
    if kind == "b":
        return pa.array(np.where(values, "True", "False"))
    try:  # text (None, NaN and NA missing): quoted in Python only where it must be
        text = pc.fill_null(pa.array(values, type=pa.string(), from_pandas=True), "")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # objects that are not strings: str() each
        return pa.array([_quoted(v) for v in values.tolist()], pa.string())
    return _text_quoted(text)


def _text_quoted(text: pa.Array) -> pa.Array:
    redo = np.flatnonzero(pc.match_substring_regex(text, '[,"\n\r]').to_numpy(zero_copy_only=False))
    if not len(redo):
        return text
    strings = text.to_numpy(zero_copy_only=False).astype(object)
    strings[redo] = [_quoted(v) for v in strings[redo].tolist()]
    return pa.array(strings, pa.string())


#: rows formatted and written together (:func:`write_csv`)
ROWS_PER_BLOCK = 1 << 17


def write_csv(table: "pd.DataFrame | Mapping[str, object]", path: str | Path) -> None:
    """``pd.DataFrame(table).to_csv(path, index=False)``, the same bytes: ``table`` a DataFrame
    or its columns by name, all of one length."""
    names = list(table.columns if isinstance(table, pd.DataFrame) else table)
    columns = [table[name] for name in names]
    rows = len(columns[0]) if columns else 0
    header = ",".join(_quoted(name) for name in names) + "\n"
    with open(path, "wb") as out:
        out.write(header.encode())
        for first in range(0, rows, ROWS_PER_BLOCK):
            out.write(_block_lines([_rows_of(column, first, first + ROWS_PER_BLOCK) for column in columns]))


def _rows_of(column, first: int, last: int):
    """Rows ``first:last`` of a column, without a copy."""
    return column.iloc[first:last] if isinstance(column, pd.Series) else column[first:last]


def _block_lines(columns: list) -> bytes:
    strings = [_column_strings(column) for column in columns]
    rows = pc.binary_join_element_wise(*strings, ",")
    if len(strings) == 1:  # an empty lone field is written "" (csv's rule: not a blank line)
        rows = pc.if_else(pc.equal(rows, ""), '""', rows)
    return _concatenated(pc.binary_join_element_wise(rows, "", "\n"))


def _concatenated(strings: pa.Array) -> bytes:
    """The strings of an Arrow string array back to back: its data buffer between the first
    and the last offset (no copy per string)."""
    strings = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    width = np.int64 if pa.types.is_large_string(strings.type) else np.int32
    offsets = np.frombuffer(strings.buffers()[1], dtype=width, count=len(strings) + 1,
                            offset=strings.offset * np.dtype(width).itemsize)
    return strings.buffers()[2].to_pybytes()[offsets[0]:offsets[-1]]
