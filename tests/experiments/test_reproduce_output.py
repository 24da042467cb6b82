"""What ``pagesim reproduce`` prints: within 100 columns; ``all`` one line per figure (matches
the paper within the figure's own tolerance, or differs, and where), a single figure its
tables and its reading too. The verdict is each figure's compared rows' notes, named by their
keys (``figures.misses``); a ratio's note is its miss beyond 10 % (``common.ratio_miss``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from pagesim.experiments.figures import FIGURES, misses
from pagesim.experiments.figures.common import ratio_miss
from pagesim.sim.cli import main
from tests.experiments.fakes import fake_run


def test_ratio_miss_by_hand():
    assert ratio_miss(2.09, 1.67) == "2.09x against the paper's 1.67x"  # 25 % over
    assert ratio_miss(3.62, 3.58) == ""  # 1 % over
    assert ratio_miss(1.44, 1.3) == "1.44x against the paper's 1.3x"  # 10.8 % over
    assert ratio_miss(1.42, 1.3) == ""  # 9.2 %: within
    assert ratio_miss(1.1, 1.3) == "1.10x against the paper's 1.3x"  # 15 % under
    assert ratio_miss(math.nan, 1.3) == "" and ratio_miss(1.5, math.nan) == ""  # nothing to compare


def test_misses_reads_the_compared_tables_notes_named_by_their_keys():
    fig13 = pd.DataFrame({"workload": ["sharegpt", "alpaca", "alpaca"], "rate": [2, 30, 30],
                          "system": ["vllm", "vllm", "vllm"], "cost_scale": [math.nan, math.nan, 1.5],
                          "note": ["-22% vs paper (> 10%)", "", "+11% vs paper (> 10%)"]})
    assert misses("fig13", {"fig13": fig13}) == (3, ["sharegpt vllm: -22% vs paper (> 10%)",
                                                      "alpaca vllm GPU time x1.5: +11% vs paper (> 10%)"])
    # fig12 compares in its ratios table, not its curves; a missing note (NaN from a CSV) is no miss
    ratios = pd.DataFrame({"workload": ["sharegpt", "sharegpt"], "system": ["orca-max", "orca-oracle"],
                           "note": [math.nan, "ratio 1.63x outside the paper's 1.7-2.7x"]})
    assert misses("fig12", {"fig12": pd.DataFrame({"x": [1, 2, 3]}), "fig12_ratios": ratios}) == (
        2, ["sharegpt orca-oracle: ratio 1.63x outside the paper's 1.7-2.7x"])
    # fig19 compares both its end-to-end table and the microbenchmark's (block sizes as keys)
    fig19 = pd.DataFrame({"workload": ["sharegpt"], "block_size": [16], "note": [""]})
    micro = FIGURES["fig19"].microbenchmark(block_sizes=(16, 256))
    compared, found = misses("fig19", {"fig19": fig19, "fig19_micro": micro})
    assert compared == 3
    assert found == [f"block 256: recompute {micro['recompute_over_swap'].iloc[1]:.2f}x swap (paper at most 1.2x)"]


@pytest.fixture
def fake_engine(monkeypatch):
    import pagesim.experiments.sweep as S
    monkeypatch.setattr(S, "simulate_spec", fake_run)
    monkeypatch.setenv("COLUMNS", "100")


def test_reproduce_all_prints_one_line_per_figure_within_100_columns(fake_engine, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", "all", "--out", str(out), "--quick", "--workers", "1", "--no-progress",
                 "--cache-dir", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert not any(line.startswith("== ") for line in lines)  # no table: they are in the report and CSVs
    header = next(i for i, line in enumerate(lines) if line.startswith("figure "))
    # a figure's row, then its first miss on indented lines under it (closing_table)
    rows = [line for line in lines[header + 1:] if line.split() and line.split()[0] in FIGURES]
    assert [row.split()[0] for row in rows] == list(FIGURES)
    for row in rows:
        fig = row.split()[0]
        compared, found = misses(fig, {p.stem: pd.read_csv(p) for p in out.glob(f"{fig}*.csv")})
        verdict = "differs" if found else ("matches" if compared else "none")  # none: no paper
        assert verdict in row.split() and f"{len(found)} of {compared}" in row
    assert "hybrid" in [row.split()[0] for row in rows if "none" in row.split()]
    assert any(line.startswith("wrote ") and "report.html" in line for line in lines)


def test_reproduce_one_figure_prints_its_tables_and_wrapped_reading(fake_engine, tmp_path, capsys):
    assert main(["reproduce", "fig2", "--out", str(tmp_path / "out"), "--quick", "--workers", "1",
                 "--no-progress", "--cache-dir", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert any(line.startswith("== fig2 ") for line in lines)
    reading = next(i for i, line in enumerate(lines) if line.startswith("reading: "))
    assert lines[reading + 1].startswith("  ")  # the reading goes on, wrapped under itself
    assert [line.split()[0] for line in lines if line.startswith("fig2 ")] == ["fig2"]  # its closing line


def test_misses_leaves_out_the_rows_a_table_marks_as_not_compared():
    """Fig. 13's rows at the cost model's own speed (compared False: the test of its reading's
    cause) count neither as compared rows nor as misses: 2 rows compared, 1 miss."""
    fig13 = pd.DataFrame({"workload": ["sharegpt", "alpaca", "alpaca"], "rate": [2, 30, 30],
                          "system": ["vllm", "vllm", "vllm"], "cost_scale": [1.61, 1.61, 1.0],
                          "note": ["-7% vs paper (> 10%)", "", "-57% vs paper (> 10%)"],
                          "compared": [True, True, False]})
    assert misses("fig13", {"fig13": fig13}) == (2, ["sharegpt vllm GPU time x1.61: -7% vs paper (> 10%)"])


def test_a_printed_table_shows_a_missing_value_as_a_dash(capsys):
    """A row with no paper value (NaN in the CSV) prints "-" there, not "NaN"."""
    from pagesim.experiments.reproduce_cli import print_tables

    print_tables({"fig14_ratios": pd.DataFrame({"width": [2, 6], "paper_ratio": [math.nan, 2.3]})})
    out = capsys.readouterr().out
    assert "NaN" not in out and out.splitlines()[3].split() == ["2", "-"]


def test_an_empty_workload_error_crosses_a_process_whole():
    """Raised in a worker process, the error comes back with its rate and duration (what reproduce
    names its --scale by) and its one message, not the message nested in another."""
    import pickle

    from pagesim.sim.errors import EmptyWorkload

    e = pickle.loads(pickle.dumps(EmptyWorkload("rate 0.1 req/s for 3.6 s")))
    assert e.what == "rate 0.1 req/s for 3.6 s"
    assert str(e) == "the workload has no requests (rate 0.1 req/s for 3.6 s); raise --rate or --duration"
