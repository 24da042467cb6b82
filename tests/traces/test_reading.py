"""Big traces: the pyarrow CSV reader, reading stopped at the end of a window, ids, and pyarrow as
a core dependency."""

from __future__ import annotations

import argparse
import configparser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import pagesim.traces.reading
from pagesim.traces.args import add_workload_args, read_window, workload_from_args
from pagesim.traces.loaders import load_trace
from pagesim.traces.reading import Window
from pagesim.traces.transform import time_slice

REPO = Path(__file__).resolve().parents[2]


def _azure(rows: int, gap_s: float = 1.0, *, swap: tuple[int, int] | None = None) -> str:
    """An Azure 2024 file with one request every ``gap_s`` seconds (``swap``: two rows exchanged)."""
    t = [i * gap_s for i in range(rows)]
    if swap:
        a, b = swap
        t[a], t[b] = t[b], t[a]
    stamps = pd.to_datetime(1715472000 + np.array(t), unit="s", utc=True).strftime("%Y-%m-%d %H:%M:%S.%f+00:00")
    return "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{s},{i + 1},1\n" for i, s in enumerate(stamps))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 KiB (~90 rows), so that a few hundred rows span several blocks."""
    monkeypatch.setattr(pagesim.traces.reading, "READ_BLOCK_BYTES", 4096)


def test_window_stops_reading_a_sorted_file(write, small_blocks):
    path = write("az.csv", _azure(2000))
    whole = load_trace(path)
    part = load_trace(path, window=Window(100.0, 200.0))
    rep = part.attrs["load_report"]
    assert rep["stopped_early"] and 200 < rep["rows_read"] < 400  # the block holding 200 s, not all 2000 rows
    pd.testing.assert_frame_equal(time_slice(part, 100.0, 200.0), time_slice(whole, 100.0, 200.0))
    assert len(time_slice(part, 100.0, 200.0)) == 100  # rows at 100, 101, ..., 199 s
    counted = load_trace(path, window=Window(50.0, count=10))
    assert counted.attrs["load_report"]["stopped_early"] and counted.attrs["load_report"]["rows_read"] < 200
    pd.testing.assert_frame_equal(time_slice(counted, 50.0).iloc[:10], time_slice(whole, 50.0).iloc[:10])


def test_window_reads_everything_when_rows_are_out_of_order_before_its_end(write, small_blocks):
    # row 5 and row 1500 swapped: the 1,499 s row sits at the top, before the window [100, 200) ends
    path = write("az.csv", _azure(2000, swap=(5, 1500)))
    with pytest.warns(UserWarning, match="2 of 2000 rows out of order"):
        part = load_trace(path, window=Window(100.0, 200.0))
    assert not part.attrs["load_report"]["stopped_early"] and part.attrs["load_report"]["rows_read"] == 2000
    assert len(time_slice(part, 0.0, 10.0)) == 10  # the 5 s row is found, 1,495 rows down


def test_window_margin_keeps_boundary_rows(write, small_blocks):
    # 1/3 s apart: rows at exactly the boundary after rounding must still be read
    path = write("az.csv", _azure(3000, gap_s=1 / 3))
    whole = load_trace(path)
    part = load_trace(path, window=Window(0.0, 100.0))
    pd.testing.assert_frame_equal(time_slice(part, 0.0, 100.0), time_slice(whole, 0.0, 100.0))


def test_window_never_stops_on_a_row_the_selection_keeps():
    """--time-slice 0.1: --rate-scale 7 --duration D keeps rows with (a - 0.1) / 7 < D; the window's
    end 0.1 + 7 D rounds below the row at 0.44 s that this keeps. A block ending with that row must
    not end the reading: a row tied with it may open the next block."""
    d = 0.04857142857142857
    w = read_window(_parse("--time-slice", "0.1:", "--rate-scale", "7", "--duration", repr(d)))
    assert (0.44 - 0.1) / 7 < d and 0.44 > w.end_s
    assert not w.passed(np.array([0.44]), 0)[0]


def _parse(*argv):
    p = argparse.ArgumentParser()
    add_workload_args(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("argv,expected", [
    (["--time-slice", "100:200"], Window(100.0, 200.0)),
    (["--time-slice", "100:", "--duration", "50", "--rate-scale", "2"], Window(100.0, 200.0)),  # 50 s at x2 = 100 s
    (["--num-requests", "10"], Window(0.0, count=10)),
    (["--time-slice", "100:200", "--rate", "3", "--num-requests", "10"], Window(100.0, 200.0)),  # --rate needs the slice
    ([], Window()),
])
def test_read_window_from_options(argv, expected):
    assert read_window(_parse(*argv)) == expected


def test_simulate_options_read_a_window_and_give_the_same_workload(write, small_blocks):
    path = str(write("az.csv", _azure(2000)))
    opts = ("--trace", path, "--time-slice", "100:400", "--rate-scale", "2", "--duration", "60", "--num-requests", "50")
    df, info = workload_from_args(_parse(*opts), 4096, "error")
    assert info["load_report"]["stopped_early"] and info["load_report"]["rows_read"] < 400
    full = load_trace(path)
    expected = time_slice(full, 100.0, 400.0)
    expected = expected.assign(arrival_s=expected["arrival_s"] / 2).iloc[:50].reset_index(drop=True)
    pd.testing.assert_frame_equal(df, expected, check_like=True)


def test_generated_ids_skip_the_duplicate_check(write, monkeypatch):
    def no_scan(self, *args, **kwargs):
        raise AssertionError("duplicate scan of generated ids")
    path = write("g.csv", "t,p,o,who\n0,1,1,a\n1,1,1,a\n")
    monkeypatch.setattr(pd.Series, "duplicated", no_scan)
    load_trace(path, columns="prompt=p,output=o,arrival=t")  # ids are row numbers: unique by construction
    monkeypatch.undo()
    from pagesim.sim.errors import TraceError
    with pytest.raises(TraceError, match="duplicate request_id 'a'"):  # ids from the file are still checked
        load_trace(path, columns="prompt=p,output=o,arrival=t,id=who")


def test_pyarrow_reader_gives_the_pandas_reader_times(shared_trace):
    """The arrival times are those the previous reader (pandas' C parser, pd.to_datetime) gave, bit for bit."""
    path = shared_trace("AzureLLMInferenceTrace_conv.csv")
    raw = pd.read_csv(path, dtype={"TIMESTAMP": str})
    t = pd.to_datetime(raw["TIMESTAMP"], format="ISO8601")
    df = load_trace(path)
    np.testing.assert_array_equal(df["arrival_s"].to_numpy(), (t - t.min()).dt.total_seconds().to_numpy())
    np.testing.assert_array_equal(df["prompt_tokens"].to_numpy(), raw["ContextTokens"].to_numpy())


def test_pyarrow_is_a_core_dependency():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    core = cfg["options"]["install_requires"].split()
    test = cfg["options.extras_require"]["test"].split()
    assert any(r.startswith("pyarrow") for r in core)
    assert not any(r.startswith("pyarrow") for r in test)
