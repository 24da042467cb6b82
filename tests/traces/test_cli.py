"""`pagesim trace stats|synth|convert` through sim.cli.main."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from sim.cli import main
from traces.loaders import load_trace
from traces.stats import trace_stats

TRACE = "t,p,o\n0,10,1\n1,20,2\n3,30,3\n7,40,4\n"


def test_stats_json_keys_and_values(write, capsys):
    path = write("g.csv", TRACE)
    assert main(["trace", "stats", str(path), "--columns", "prompt=p,output=o,arrival=t", "--json"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    st = json.loads(out)
    for key in ("rows", "duration_s", "rate_rps", "prompt_tokens", "output_tokens", "interarrival_cv"):
        assert key in st
    for key in ("prompt_tokens", "output_tokens"):
        assert set(st[key]) >= {"mean", "p50", "p90", "p99", "max"}
    assert st["rows"] == 4 and st["duration_s"] == 7.0
    assert st["rate_rps"] == pytest.approx(3 / 7)
    # gaps 1, 2, 4: mean 7/3, population std sqrt(14/9)
    assert st["interarrival_cv"] == pytest.approx((14 / 9) ** 0.5 / (7 / 3))
    assert st["prompt_tokens"] == pytest.approx({"mean": 25.0, "p50": 25.0, "p90": 37.0, "p99": 39.7, "max": 40, "min": 10})
    assert st["output_tokens"]["max"] == 4


def test_stats_single_row_has_null_rate():
    df = pd.DataFrame({"request_id": ["a"], "arrival_s": [0.0], "prompt_tokens": [5], "output_tokens": [6]})
    st = trace_stats(df)
    assert st["rows"] == 1 and st["rate_rps"] is None and st["interarrival_cv"] is None
    json.dumps(st)


def test_stats_table(write, capsys):
    path = write("g.csv", TRACE)
    assert main(["trace", "stats", str(path), "--columns", "prompt=p,output=o,arrival=t"]) == 0
    out = capsys.readouterr().out
    assert "rows             4" in out and "0.429 req/s" in out and "prompt" in out


def test_stats_builtin(capsys):
    assert main(["trace", "stats", "builtin:alpaca", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["rows"] == 10_000 and st["prompt_tokens"]["mean"] == pytest.approx(19.31, rel=0.02)


def test_synth_deterministic_bytes(tmp_path, capsys):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for out in (a, b):
        assert main(["trace", "synth", "--workload", "sharegpt", "--rate", "2", "--duration", "300",
                     "--seed", "5", "-o", str(out)]) == 0
    assert a.read_bytes() == b.read_bytes()
    df = load_trace(a)
    assert df["arrival_s"].max() < 300 and df.attrs["load_report"]["format"] == "canonical"
    assert "wrote" in capsys.readouterr().out


def test_synth_custom_parquet(tmp_path):
    out = tmp_path / "c.parquet"
    assert main(["trace", "synth", "--workload", "custom", "--prompt-dist", "constant:7",
                 "--output-dist", "uniform:low=1,high=3", "--arrival", "gamma", "--cv", "3",
                 "--num-requests", "50", "--n", "2", "-o", str(out)]) == 0
    df = load_trace(out)
    assert len(df) == 50 and (df["prompt_tokens"] == 7).all() and df["output_tokens"].between(1, 3).all()
    assert (df["n"] == 2).all()


def test_synth_bad_dist_is_one_line(tmp_path, capsys):
    rc = main(["trace", "synth", "--prompt-dist", "zipf:1", "--num-requests", "5", "-o", str(tmp_path / "x.csv")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim: error: unknown length distribution 'zipf'") and err.count("\n") == 1


def test_convert_mooncake_like_to_csv_and_back(write, tmp_path, capsys):
    src = write("m.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}\n'
                           '{"timestamp": 3000, "input_length": 3, "output_length": 6, "hash_ids": [9]}\n')
    out = tmp_path / "m.csv"
    assert main(["trace", "convert", str(src), "-o", str(out)]) == 0
    text = out.read_text().splitlines()
    assert text[0] == "request_id,arrival_s,prompt_tokens,output_tokens,prefix_hashes"
    assert text[1] == "0,0.0,600,5,7 8" and text[2] == "1,3.0,3,6,9"
    back = load_trace(out)
    assert back["prefix_hashes"].tolist() == [(7, 8), (9,)]
    assert "wrote 2 requests" in capsys.readouterr().out


def test_help_has_examples(capsys):
    for sub in ("stats", "synth", "convert"):
        with pytest.raises(SystemExit):
            main(["trace", sub, "--help"])
        assert "example:\n  pagesim trace " + sub in capsys.readouterr().out
