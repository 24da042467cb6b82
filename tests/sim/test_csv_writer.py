"""sim/csv_writer.py writes the bytes ``DataFrame.to_csv(index=False)`` writes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagesim.sim.csv_writer import write_csv

# floats Arrow formats unlike repr (no '.', exponent, positional below 1e-4) and ones it formats alike
AWKWARD = [0.0, -0.0, 123.0, 5e15, 9.999999999999999e15, 1e16, 1e22, 1e-5, 1.5e-7, 0.0001, 0.00012, 1e-4 * 0.999,
           0.1, 1 / 3, 123456789.123, 2.5e-300, 5e-324, 1e300, np.inf, -np.inf, np.nan, -1.5, 0.05074696766863906]


def same_bytes(frame: pd.DataFrame, tmp_path) -> None:
    frame.to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(frame, tmp_path / "ours.csv")
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()


def test_awkward_values(tmp_path):
    n = len(AWKWARD)
    frame = pd.DataFrame({
        "step": np.arange(n, dtype=np.int64) - 3,
        "start_s": np.array(AWKWARD),
        "ok": np.arange(n) % 2 == 0,
        "status": pd.array(["finished", None, "re,jected", 'say "no"', "two\nlines"] * (n // 5) + ["x"] * (n % 5),
                           dtype="string"),
        "reason": ["", None, np.nan, "plain", "a,b"] * (n // 5) + ["y"] * (n % 5),
    })
    same_bytes(frame, tmp_path)


def test_empty_and_header_only(tmp_path):
    same_bytes(pd.DataFrame({"a": np.zeros(0, np.int64), "b,c": np.zeros(0)}), tmp_path)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=40))
def test_any_float(tmp_path_factory, values):
    same_bytes(pd.DataFrame({"x": np.array(values, dtype=np.float64)}), tmp_path_factory.mktemp("csv"))


@pytest.mark.parametrize("kind", ["int32", "uint8", "int64"])
def test_integer_widths(tmp_path, kind):
    same_bytes(pd.DataFrame({"x": np.array([0, 1, 7, 100], dtype=kind)}), tmp_path)


def test_lone_missing_field_is_quoted(tmp_path):
    same_bytes(pd.DataFrame({"x": [np.nan, 1.0, np.nan]}), tmp_path)


def test_rows_written_in_blocks_are_the_same_bytes(tmp_path, monkeypatch):
    """A table longer than a block goes out a block at a time: the same bytes, block edges in the
    middle of the rows (10 rows, blocks of 3)."""
    from pagesim.sim import csv_writer

    monkeypatch.setattr(csv_writer, "ROWS_PER_BLOCK", 3)
    n = 10
    same_bytes(pd.DataFrame({"x": np.array(AWKWARD[:n]), "i": np.arange(n),
                             "w": pd.array(["a", "b,c", None, "d", "e"] * 2, dtype="string")}), tmp_path)


def test_columns_by_name_are_written_as_their_frame(tmp_path, monkeypatch):
    """Columns by name (numpy, Arrow strings, Arrow words by code: ``sim.metrics.request_columns``)
    write the bytes their DataFrame writes; a block edge falls inside them."""
    import pyarrow as pa

    from pagesim.sim import csv_writer
    from pagesim.sim.metrics import frame_of

    monkeypatch.setattr(csv_writer, "ROWS_PER_BLOCK", 4)
    columns = {"request_id": pa.array(["r0", "r,1", "r2", "r3", "r4", "r5"]),
               "t_s": np.array([0.5, 1e-5, np.nan, 3.0, 2.5e-300, 0.1]),
               "status": pa.DictionaryArray.from_arrays(np.array([0, 1, 2, 1, 0, 2], np.int8),
                                                        ["unfinished", "finished", "rejected"]),
               "reason": pa.array(["", "", 'too "long", by 3', "", "two\nlines", ""])}
    frame_of(columns).to_csv(tmp_path / "pandas.csv", index=False)
    write_csv(columns, tmp_path / "ours.csv")
    assert (tmp_path / "ours.csv").read_bytes() == (tmp_path / "pandas.csv").read_bytes()
