"""Every loader on small hand-written files, with exact expected values."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from pagesim.traces.loaders import detect_format, load_trace, parse_columns, spread_ties, write_trace
from pagesim.traces.schema import TraceWarning, validate_canonical

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:17:03.9799600,4808,10
2023-11-16 18:17:04.0319600,3180,8
2023-11-16 18:17:06.4799600,100,1
"""


def test_azure_exact(write):
    df = load_trace(write("az.csv", AZURE))
    assert list(df.columns) == ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    np.testing.assert_allclose(df["arrival_s"], [0.0, 0.052, 2.5], atol=1e-9)
    assert df["prompt_tokens"].tolist() == [4808, 3180, 100]
    assert df["output_tokens"].tolist() == [10, 8, 1]
    assert df["request_id"].tolist() == ["0", "1", "2"]
    assert df["arrival_s"].dtype == np.float64 and df["prompt_tokens"].dtype == np.int64
    rep = df.attrs["load_report"]
    assert rep["format"] == "azure" and rep["rows_read"] == 3 and rep["rows_dropped"] == {}
    assert rep["rows_resorted"] == 0 and rep["arrival_origin"].startswith("2023-11-16 18:17:03.97996")


def test_azure_timestamps_without_fraction(write):
    df = load_trace(write("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2024-05-10 00:00:00,5,5\n2024-05-10 00:00:01.5,6,6\n"), format="azure")
    np.testing.assert_allclose(df["arrival_s"], [0.0, 1.5])


def test_azure_unsorted_is_sorted_with_warning(write):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n"
            "2023-11-16 18:00:02.0,2,2\n2023-11-16 18:00:00.0,1,1\n2023-11-16 18:00:03.0,3,3\n"
            "2023-11-16 18:00:01.0,4,4\n")
    # times 2, 0, 3, 1: the longest sorted run keeps 2 rows (0, 1 or 2, 3), so 2 rows are out of order
    with pytest.warns(TraceWarning, match=r"2 of 4 rows out of order"):
        df = load_trace(write("u.csv", text))
    assert df["prompt_tokens"].tolist() == [1, 4, 2, 3]
    assert df["request_id"].tolist() == ["1", "3", "0", "2"]  # ids follow the source rows
    np.testing.assert_allclose(df["arrival_s"], [0, 1, 2, 3])
    assert df.attrs["load_report"]["rows_resorted"] == 2


def test_sorted_input_does_not_warn(write):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_trace(write("az.csv", AZURE))


MOONCAKE = """{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]}
{"timestamp": 0, "input_length": 513, "output_length": 6, "hash_ids": [0, 2]}
{"timestamp": 3000, "input_length": 10, "output_length": 7, "hash_ids": [3]}
{"timestamp": 6000, "input_length": 512, "output_length": 8, "hash_ids": [4]}
"""


def test_mooncake_exact(write):
    df = load_trace(write("m.jsonl", MOONCAKE))
    np.testing.assert_allclose(df["arrival_s"], [0, 0, 3, 6])
    assert df["prompt_tokens"].tolist() == [1000, 513, 10, 512]
    assert df["output_tokens"].tolist() == [5, 6, 7, 8]
    assert df["prefix_hashes"].tolist() == [(0, 1), (0, 2), (3,), (4,)]
    assert df.attrs["hash_block_tokens"] == 512
    assert df.attrs["load_report"]["format"] == "mooncake"


def test_mooncake_spread_timestamps(write):
    path = write("m.jsonl", MOONCAKE)
    a = load_trace(path, spread_timestamps=True, seed=1)
    b = load_trace(path, spread_timestamps=True, seed=1)
    c = load_trace(path, spread_timestamps=True, seed=2)
    pd.testing.assert_frame_equal(a, b)
    assert not np.array_equal(a["arrival_s"], c["arrival_s"])
    t = a["arrival_s"].to_numpy()
    assert 0 <= t[0] <= t[1] < 3.0  # the two rows at 0 spread within the 3 s step, file order kept
    assert t[0] != t[1]
    assert t[2] == 3.0 and t[3] == 6.0  # singletons untouched
    assert a["prompt_tokens"].tolist() == [1000, 513, 10, 512]
    assert a.attrs["load_report"]["spread_timestamps"] is True


def test_spread_ties_caps_at_quantization_step():
    rng = np.random.default_rng(0)
    a = np.array([0.0] * 50 + [3.0] * 50 + [100.0] * 50)  # gaps 3, 97: median 50
    out = spread_ties(a, rng)
    assert np.all(np.diff(out) >= 0)
    assert out[:50].min() >= 0 and out[:50].max() < 3.0
    assert out[50:100].min() >= 3.0 and out[50:100].max() < 53.0 and out[50:100].max() > 40
    assert out[100:].min() >= 100.0 and out[100:].max() < 150.0 and out[100:].max() > 140


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
46,GPT-4,417,30,447,Conversation log
47.5,ChatGPT,9,0,9,API log
50,GPT-4,20,2,22,API log
"""


def test_burstgpt_drops_failed(write):
    df = load_trace(write("b.csv", BURST))
    rep = df.attrs["load_report"]
    assert rep["format"] == "burstgpt"
    assert rep["rows_read"] == 5
    assert rep["rows_dropped"] == {"failed request (0 response tokens)": 2}
    assert df["prompt_tokens"].tolist() == [472, 417, 20]
    assert df["output_tokens"].tolist() == [18, 30, 2]
    np.testing.assert_allclose(df["arrival_s"], [0, 41, 45])
    assert df["request_id"].tolist() == ["0", "2", "4"]


def test_lengths_with_synthetic_arrivals(write):
    text = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n10,20,30,0.5\n7,3,10,2.3\n1,1,2,1\n"
    path = write("l.csv", text)
    df = load_trace(path, rate=4.0, seed=3)
    assert df.attrs["load_report"]["format"] == "lengths"
    assert df["prompt_tokens"].tolist() == [10, 7, 1] and df["output_tokens"].tolist() == [20, 3, 1]
    from pagesim.traces.arrivals import arrivals
    np.testing.assert_array_equal(df["arrival_s"], arrivals("poisson", 4.0, num_requests=3,
                                                            rng=np.random.default_rng(3)))
    g = load_trace(path, arrival="gamma", cv=2.0, rate=1.0, seed=3)
    assert "gamma rate 1 req/s cv 2" in g.attrs["load_report"]["synthetic_arrivals"]


def test_generic_csv_with_column_map_seconds_and_ms(write):
    path = write("g.csv", "t,p,o,who\n10.0,5,6,a\n10.5,7,8,b\n")
    df = load_trace(path, columns="prompt=p,output=o,arrival=t,id=who")
    np.testing.assert_allclose(df["arrival_s"], [0, 0.5])
    assert df["request_id"].tolist() == ["a", "b"]
    assert df.attrs["load_report"]["format"] == "generic"
    ms = load_trace(write("g2.csv", "t,p,o\n1000,5,6\n3500,7,8\n"), columns={"prompt": "p", "output": "o",
                                                                          "arrival_ms": "t"})
    np.testing.assert_allclose(ms["arrival_s"], [0, 2.5])


def test_generic_jsonl_and_parquet(write, tmp_path):
    j = load_trace(write("g.jsonl", '{"a": 0.0, "in": 3, "out": 4}\n{"a": 2.0, "in": 5, "out": 6}\n'),
                   columns="prompt=in,output=out,arrival=a")
    assert j["prompt_tokens"].tolist() == [3, 5]
    pq = tmp_path / "g.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "in": [3, 5], "out": [4, 6]}).to_parquet(pq)
    p = load_trace(pq, columns="prompt=in,output=out,arrival=a")
    pd.testing.assert_frame_equal(p[["prompt_tokens", "output_tokens"]], j[["prompt_tokens", "output_tokens"]])
    np.testing.assert_allclose(p["arrival_s"], [0.0, 1.0])


def test_generic_without_time_gets_synthetic_arrivals(write):
    df = load_trace(write("g.csv", "p,o\n5,6\n7,8\n"), columns="prompt=p,output=o", rate=1.0)
    assert df.attrs["load_report"]["synthetic_arrivals"].startswith("poisson rate 1")
    assert np.all(np.diff(df["arrival_s"]) >= 0) and df["arrival_s"].iloc[0] > 0


def test_vidur_style_header_detected(write):
    df = load_trace(write("v.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.5,3,4\n1.0,5,6\n"))
    assert df.attrs["load_report"]["format"] == "generic"
    np.testing.assert_allclose(df["arrival_s"], [0, 0.5])


@pytest.mark.parametrize("ext", ["csv", "parquet", "jsonl"])
def test_canonical_round_trip_with_prefix_hashes(write, tmp_path, ext):
    src = load_trace(write("m.jsonl", MOONCAKE))
    out = write_trace(src, tmp_path / f"c.{ext}")
    back = load_trace(out)
    assert back.attrs["load_report"]["format"] == "canonical"
    pd.testing.assert_frame_equal(back, src, check_like=False)
    assert back.attrs["hash_block_tokens"] == 512


def test_canonical_keeps_synthetic_offsets_and_parallel_columns(tmp_path):
    from pagesim.traces.synth import make_workload
    df = make_workload("alpaca", 5.0, num_requests=50, seed=4, n=2, beam_width=3)
    back = load_trace(write_trace(df, tmp_path / "w.csv"))
    pd.testing.assert_frame_equal(back, df)  # arrival_s not re-zeroed; floats round-trip exactly


def test_detect_format(write):
    assert detect_format(write("a.csv", AZURE)) == "azure"
    assert detect_format(write("m.jsonl", MOONCAKE)) == "mooncake"
    assert detect_format(write("b.csv", BURST)) == "burstgpt"
    assert detect_format(write("l.csv", "num_prefill_tokens,num_decode_tokens\n1,2\n")) == "lengths"
    assert detect_format(write("x.csv", "a,b\n1,2\n"), {"prompt": "a", "output": "b"}) == "generic"


def test_parse_columns():
    assert parse_columns("prompt=a, output=b ,arrival_ms=c") == {"prompt": "a", "output": "b", "arrival_ms": "c"}
    assert parse_columns(None) == {}


def test_validate_canonical_accepts_loaded_and_names_problems():
    from pagesim.sim.errors import TraceError
    good = pd.DataFrame({"request_id": ["a", "b"], "arrival_s": [0.0, 1.0], "prompt_tokens": [1, 2],
                         "output_tokens": [3, 4]})
    assert validate_canonical(good) is good
    bad = good.assign(arrival_s=[1.0, 0.5])
    with pytest.raises(TraceError, match=r"mine, row 2, field 'arrival_s'"):
        validate_canonical(bad, source="mine")
    with pytest.raises(TraceError, match=r"row 2, field 'output_tokens'"):
        validate_canonical(good.assign(output_tokens=[3, 0]), source="mine")
    with pytest.raises(TraceError, match=r"field 'prompt_tokens'"):
        validate_canonical(good.drop(columns="prompt_tokens"), source="mine")
    with pytest.raises(TraceError, match=r"row 2, field 'request_id'"):
        validate_canonical(good.assign(request_id=["a", "a"]), source="mine")


def test_burstgpt_drops_zero_request_tokens_as_failed(write):
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "5,ChatGPT,0,18,18,x\n6,ChatGPT,10,0,10,x\n7,GPT-4,0,0,0,x\n9,GPT-4,5,5,10,x\n")
    df = load_trace(write("b.csv", text))
    # row 3 has both zero: counted once, under the first reason checked (0 response tokens)
    assert df.attrs["load_report"]["rows_dropped"] == {"failed request (0 response tokens)": 2,
                                                       "failed request (0 request tokens)": 1}
    assert df["request_id"].tolist() == ["3"] and df["prompt_tokens"].tolist() == [5]
    assert df.attrs["load_report"]["rows_read"] == 4


@pytest.mark.parametrize("times,late", [
    ([0, 1, 2, 100, 3, 4, 5], 1),        # one late row; a sort shifts 4 positions
    ([1, 2, 3, 4, 5, 6, 0], 1),          # one early row at the end; a sort shifts all 7
    ([5, 4, 3, 2, 1], 4),                # reversed: only one row can stay
    ([2, 0, 3, 1], 2),                   # the longest sorted run is 2 long (0, 1 or 2, 3)
    ([1, 1, 0, 1, 1], 1),                # ties are in order
])
def test_rows_out_of_order_by_hand(times, late):
    from pagesim.traces.schema import rows_out_of_order
    assert rows_out_of_order(np.array(times, dtype=float)) == late


def test_resort_warning_counts_rows_out_of_order(write):
    # 7,106 rows (RAGPulse's count) with one row 3 s late: 1 row out of order, not 7,104 moved
    t = np.arange(7106, dtype=float)
    t[[100, 101, 102, 103]] = [101, 102, 103, 100]  # the row at 100 s arrives after the next three
    text = "t,p,o\n" + "".join(f"{x},1,1\n" for x in t)
    with pytest.warns(TraceWarning, match=r": timestamps not sorted: 1 of 7106 rows out of order"):
        df = load_trace(write("u.csv", text), columns="prompt=p,output=o,arrival=t")
    assert df.attrs["load_report"]["rows_resorted"] == 1


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 6), max_size=14))
def test_rows_out_of_order_is_len_minus_longest_sorted_subsequence(values):
    from pagesim.traces.schema import rows_out_of_order
    a = np.array(values, dtype=float)
    best = [1] * len(values)  # O(n^2) longest non-decreasing subsequence ending at each row
    for i in range(len(values)):
        for j in range(i):
            if values[j] <= values[i]:
                best[i] = max(best[i], best[j] + 1)
    assert rows_out_of_order(a) == len(values) - max(best, default=0)


def test_loader_warning_prints_one_warning_within_100_columns(tmp_path):
    """From the command line a loader warning is one warning on stderr, without Python's source
    line, wrapped within 100 columns under its first line."""
    import subprocess
    import sys
    path = tmp_path / "u.csv"
    path.write_text("t,p,o\n1,1,1\n0,1,1\n2,1,1\n")
    out = subprocess.run([sys.executable, "-m", "pagesim.sim.cli", "trace", "stats", str(path), "--columns",
                          "prompt=p,output=o,arrival=t"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    lines = out.stderr.splitlines()
    assert len(lines) > 1 and all(len(line) <= 100 for line in lines) and lines[1].startswith("  ")
    assert " ".join(line.strip() for line in lines) == (f"pagesim: warning: {path}: timestamps not sorted: 1 of 3 "
                                                        f"rows out of order; sorted by arrival")


def test_importing_the_library_leaves_pythons_warning_format():
    """Only the command line prints warnings its way: a library import changes no global state."""
    import subprocess
    import sys
    code = ("import warnings; before = warnings.formatwarning; import pagesim.traces.schema, pagesim.traces.loaders; "
            "assert warnings.formatwarning is before")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_a_time_unit_against_the_one_the_format_states_is_warned_about(tmp_path):
    """Mooncake's release states milliseconds: --time-unit s stretches its 6 s into 6,000 s, which
    no plausibility bound catches on a short file, so the contradiction itself is said."""
    p = tmp_path / "m.jsonl"
    p.write_text(MOONCAKE)
    with pytest.warns(TraceWarning, match="mooncake traces state their times in ms; --time-unit s reads timestamp"):
        df = load_trace(p, time_unit="s")
    assert df["arrival_s"].max() == 6000.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the stated unit, given or not: silent
        assert load_trace(p, time_unit="ms")["arrival_s"].max() == 6.0
        assert load_trace(p)["arrival_s"].max() == 6.0
