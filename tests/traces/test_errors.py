"""Bad input: TraceError naming file, 1-based data row and field; from the CLI one line and exit 2."""

from __future__ import annotations

import pytest

from pagesim.sim.cli import main
from pagesim.sim.errors import TraceError
from pagesim.traces.loaders import load_trace

H = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
OK = "2023-11-16 18:17:03.9799600,10,10\n"

# (file name, content, format, expected row, expected field, message fragment)
CASES = [
    ("missing.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9,5\n", "azure", None, "GeneratedTokens",
     "missing column"),
    ("nonnum.csv", H + OK + OK + "2023-11-16 18:17:05.0,abc,3\n", None, 3, "ContextTokens", "'abc'"),
    ("negative.csv", H + OK + "2023-11-16 18:17:05.0,4,-3\n", None, 2, "GeneratedTokens", "-3"),
    ("zero.csv", H + "2023-11-16 18:17:05.0,0,3\n" + OK, None, 1, "ContextTokens", "0"),
    ("nan.csv", H + OK + OK + OK + "2023-11-16 18:17:05.0,,3\n", None, 4, "ContextTokens", "missing"),
    ("fraction.csv", H + OK + "2023-11-16 18:17:05.0,2.5,3\n", None, 2, "ContextTokens", "2.5"),
    ("badtime.csv", H + OK + "yesterday-ish,4,3\n" + OK, None, 2, "TIMESTAMP", "unparseable timestamp"),
    ("badjson.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5}\n{"timestamp": 1, oops\n',
     "mooncake", 2, None, "invalid JSON"),
    ("moon_neg.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n'
                       '{"timestamp": -4, "input_length": 5, "output_length": 5, "hash_ids": [2]}\n', None, 2,
     "timestamp", "-4"),
    ("generic_missing.csv", "p,o\n1,2\n", None, None, "t", "missing column"),
    # token counts that would overflow the counts made from them (int64's largest; beyond uint64,
    # read as a float; one past 2^40), each refused with its own value, not a wrapped one
    ("int64_max.csv", H + OK + "2023-11-16 18:17:05.0,9223372036854775807,3\n", None, 2, "ContextTokens",
     "from 1 to 1,099,511,627,776 (2^40), got 9223372036854775807"),
    ("beyond_uint64.csv", H + "2023-11-16 18:17:05.0,3,99999999999999999999\n" + OK, None, 1, "GeneratedTokens",
     "got 1e+20"),
    ("past_2_40.csv", H + OK + OK + "2023-11-16 18:17:05.0,1099511627777,3\n", None, 3, "ContextTokens",
     "got 1099511627777"),
]


def _load(path, fmt, name):
    cols = "prompt=p,output=o,arrival=t" if name.startswith("generic") else None
    return load_trace(path, format=fmt, columns=cols)


@pytest.mark.parametrize("name,text,fmt,row,field,fragment", CASES, ids=[c[0] for c in CASES])
def test_bad_input_names_file_row_field(write, name, text, fmt, row, field, fragment):
    path = write(name, text)
    with pytest.raises(TraceError) as ei:
        _load(path, fmt, name)
    e = ei.value
    assert e.path == str(path)
    assert e.row == row
    assert e.field == field
    msg = str(e)
    assert str(path) in msg and fragment in msg
    if row is not None:
        assert f"row {row}" in msg
    if field is not None:
        assert f"field '{field}'" in msg


@pytest.mark.parametrize("name,text,fmt,row,field,fragment", CASES, ids=[c[0] for c in CASES])
def test_cli_one_line_exit_2(write, capsys, name, text, fmt, row, field, fragment):
    path = write(name, text)
    argv = ["trace", "stats", str(path)]
    if fmt:
        argv += ["--format", fmt]
    if name.startswith("generic"):
        argv += ["--columns", "prompt=p,output=o,arrival=t"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pagesim: error: ") and str(path) in lines[0] and fragment in lines[0]
    assert "Traceback" not in err


def test_empty_file(write, capsys):
    path = write("empty.csv", "")
    with pytest.raises(TraceError, match="empty file") as ei:
        load_trace(path)
    assert ei.value.path == str(path)
    assert main(["trace", "stats", str(path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_header_only_file(write):
    with pytest.raises(TraceError, match="no data rows"):
        load_trace(write("h.csv", H))


def test_unknown_format(write, capsys):
    path = write("a.csv", H + OK)
    with pytest.raises(TraceError, match="unknown trace format 'splitwise'"):
        load_trace(path, format="splitwise")
    with pytest.raises(TraceError, match=r"cannot tell the trace format.*--format"):
        load_trace(write("x.csv", "foo,bar\n1,2\n"))
    assert main(["trace", "stats", str(write("y.csv", "foo,bar\n1,2\n"))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim: error: ") and err.count("\n") == 1


def test_missing_file(tmp_path, capsys):
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "nope.csv")
    assert main(["trace", "stats", str(tmp_path / "nope.csv")]) == 2
    assert "nope.csv" in capsys.readouterr().err


def test_bad_columns_map(write):
    path = write("g.csv", "p,o\n1,2\n")
    with pytest.raises(TraceError, match="unknown key"):
        load_trace(path, columns="prompt=p,output=o,bogus=x")
    with pytest.raises(TraceError, match="KEY=COLUMN"):
        load_trace(path, columns="prompt")
    with pytest.raises(TraceError, match="needs output=COL"):
        load_trace(path, columns="prompt=p")


def test_row_numbers_after_dropping_failed_burstgpt_rows(write):
    text = ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            "1,ChatGPT,4,0,4,x\n2,ChatGPT,-1,3,2,x\n")
    with pytest.raises(TraceError) as ei:
        load_trace(write("b.csv", text))
    assert ei.value.row == 2 and ei.value.field == "Request tokens"


def test_token_counts_up_to_2_40_pass_and_uint64_ones_are_refused_with_their_value():
    import numpy as np
    import pandas as pd

    from pagesim.traces.schema import MAX_TOKENS, to_tokens

    assert MAX_TOKENS == 1_099_511_627_776
    assert to_tokens(pd.Series([1, 2**40]), path="p", field="f").tolist() == [1, 2**40]
    assert to_tokens(pd.Series([1.0, 2.0**40]), path="p", field="f").tolist() == [1, 2**40]
    with pytest.raises(TraceError, match=r"row 2, field 'f': .* got 18446744073709551615$"):
        to_tokens(pd.Series([7, 2**64 - 1], dtype=np.uint64), path="p", field="f")
