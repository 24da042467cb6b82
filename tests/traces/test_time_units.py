"""Timestamps in the right unit: --time-unit for every loader, UTC offsets, and the plausibility warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pagesim.sim.cli import main
from pagesim.sim.errors import TraceError
from pagesim.traces.loaders import load_trace
from pagesim.traces.schema import TraceWarning

# StartTimeOffset in ns since 1970: 0.5 s and 3 s after the first request
NS = "StartTimeOffset,p,o\n1700000000000000000,10,5\n1700000000500000000,20,5\n1700000003000000000,30,5\n"
NS_COLUMNS = "prompt=p,output=o,arrival=StartTimeOffset"


@pytest.mark.parametrize("unit,expected", [("ns", [0.0, 0.5, 3.0]), ("us", [0.0, 500.0, 3000.0])])
def test_time_unit_scales_numeric_arrivals_exactly(write, unit, expected):
    # differences are taken on the integers, then scaled: 500,000,000 ns = 0.5 s; read as us: 500 s
    df = load_trace(write("ns.csv", NS), columns=NS_COLUMNS, time_unit=unit)
    assert df["arrival_s"].tolist() == expected
    assert df.attrs["load_report"]["time_unit"] == unit
    assert df.attrs["load_report"]["arrival_origin"] == f"{1700000000000000000:g} {unit}"


def test_each_format_takes_its_default_unit_and_an_override(write):
    moon = ('{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n'
            '{"timestamp": 1500, "input_length": 5, "output_length": 5, "hash_ids": [2]}\n')
    path = write("m.jsonl", moon)
    assert load_trace(path)["arrival_s"].tolist() == [0.0, 1.5]  # Mooncake: ms
    with pytest.warns(TraceWarning, match="mooncake traces state their times in ms"):  # overridden, and said
        assert load_trace(path, time_unit="s")["arrival_s"].tolist() == [0.0, 1500.0]
    burst = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
             "10,ChatGPT,4,5,9,x\n2010,ChatGPT,4,5,9,x\n")
    path = write("b.csv", burst)
    assert load_trace(path)["arrival_s"].tolist() == [0.0, 2000.0]  # BurstGPT: s
    with pytest.warns(TraceWarning, match="burstgpt traces state their times in s"):
        assert load_trace(path, time_unit="ms")["arrival_s"].tolist() == [0.0, 2.0]
    generic = write("g.csv", "t,p,o\n4,1,1\n6,1,1\n")
    assert load_trace(generic, columns="prompt=p,output=o,arrival=t")["arrival_s"].tolist() == [0.0, 2.0]
    assert load_trace(generic, columns="prompt=p,output=o,arrival=t",
                      time_unit="ms")["arrival_s"].tolist() == [0.0, 0.002]
    # timestamp= with a unit: numbers in that unit
    assert load_trace(generic, columns="prompt=p,output=o,timestamp=t",
                      time_unit="s")["arrival_s"].tolist() == [0.0, 2.0]


@pytest.mark.parametrize("name,text,kwargs,fragment", [
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,1,1\n", dict(time_unit="s"),
     "date-times"),
    ("ms.csv", NS, dict(columns="prompt=p,output=o,arrival_ms=StartTimeOffset", time_unit="ns"), "arrival_ms="),
    ("c.csv", "request_id,arrival_s,prompt_tokens,output_tokens\na,0.5,1,1\n", dict(time_unit="ms"), "arrival_s"),
    ("l.csv", "num_prefill_tokens,num_decode_tokens\n1,2\n", dict(time_unit="s"), "no time column"),
    ("ts.csv", NS, dict(columns="prompt=p,output=o,timestamp=StartTimeOffset"), "--time-unit"),
])
def test_time_unit_refused_where_the_file_says_otherwise(write, name, text, kwargs, fragment):
    path = write(name, text)
    with pytest.raises(TraceError, match=fragment) as ei:
        load_trace(path, **kwargs)
    assert ei.value.path == str(path)


def test_cli_nanoseconds(write, capsys):
    import json
    path = write("ns.csv", NS)
    assert main(["trace", "stats", str(path), "--columns", NS_COLUMNS, "--time-unit", "ns", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["duration_s"] == 3.0 and st["rate_rps"] == pytest.approx(2 / 3)
    # arrival_ms= on nanoseconds used to be read silently 10^6 off; with --time-unit it is refused
    assert main(["trace", "stats", str(path), "--columns", "prompt=p,output=o,arrival_ms=StartTimeOffset",
                 "--time-unit", "ns"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_nanoseconds_read_as_seconds_warn_implausible(write):
    # 3e9 s is 95 years: a span over one year says the unit is wrong
    with pytest.warns(TraceWarning, match=r"3 requests over 3e\+09 s .*implausible.*read as s.*--time-unit"):
        df = load_trace(write("ns.csv", NS), columns=NS_COLUMNS)
    assert df["arrival_s"].tolist() == [0.0, 5e8, 3e9]


def _rows(n: int, gap_s: float) -> str:
    return "t,p,o\n" + "".join(f"{i * gap_s},1,1\n" for i in range(n))


@pytest.mark.parametrize("n,gap_s,warns", [
    (1001, 1001.0, True),   # 1,000 gaps of 1,001 s: 1 / 1001 req/s < 1e-3 with more than 1,000 rows
    (1001, 999.0, False),   # 1 / 999 req/s > 1e-3
    (1000, 1001.0, False),  # exactly 1,000 rows is not more than 1,000
    (3, 2e7, True),         # 4e7 s > one year (3.16e7 s), whatever the row count
    (3, 1.5e7, False),      # 3e7 s < one year
])
def test_plausibility_bounds(write, n, gap_s, warns):
    path = write("p.csv", _rows(n, gap_s))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        load_trace(path, columns="prompt=p,output=o,arrival=t")
    assert any(issubclass(w.category, TraceWarning) and "implausible" in str(w.message) for w in got) == warns


def test_utc_offsets_compare_as_instants(write):
    # 00:00:00 UTC and 05:00:01 at +05:00 (= 00:00:01 UTC) are one second apart
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,1,1\n"
            "2024-05-10 05:00:01+05:00,2,2\n2024-05-12 00:00:00.001163+00:00,3,3\n")
    df = load_trace(write("tz.csv", text))
    assert df["arrival_s"].tolist() == [0.0, 1.0, 2 * 86400 + 0.001163]


def test_azure_2024_format(write):
    # the week-long 2024 files: six fractional digits and +00:00, sometimes no fraction at all
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 00:00:00.001163+00:00,1452,3\n"
            "2024-05-12 00:00:00.041683+00:00,584,3\n2024-05-12 00:00:01+00:00,862,38\n")
    df = load_trace(write("az24.csv", text))
    np.testing.assert_array_equal(df["arrival_s"], [0.0, 0.04052, 0.998837])
    assert df.attrs["load_report"]["format"] == "azure"
    assert df.attrs["load_report"]["arrival_origin"] == "2024-05-12 00:00:00.001163+00:00"


@pytest.mark.parametrize("rows", [
    ["2024-05-10 00:00:00", "2024-05-10 00:00:01+05:00"],
    ["2024-05-10 00:00:00Z", "2024-05-10 00:00:01"],
])
def test_mixing_naive_and_offset_times_is_refused(write, capsys, rows):
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{r},1,1\n" for r in rows)
    path = write("mix.csv", text)
    with pytest.raises(TraceError, match="with and without a UTC offset") as ei:
        load_trace(path)
    assert ei.value.row == 2 and ei.value.field == "TIMESTAMP"
    assert main(["trace", "stats", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "row 2" in err and "Traceback" not in err
