"""`pagesim trace stats|synth|convert` through sim.cli.main."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from pagesim.sim.cli import main
from pagesim.traces.loaders import load_trace
from pagesim.traces.stats import trace_stats

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


def test_stats_memory_follows_rows_not_span():
    """Busiest minute over a 1e9 s span: counted per run of equal minutes, not with a bincount of
    1.7e7 minutes (133 MB; a 1e12 s span wanted 251 GiB)."""
    import tracemalloc
    df = pd.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0, 5.0, 1e9], "prompt_tokens": [1, 1, 1],
                       "output_tokens": [1, 1, 1]})
    tracemalloc.start()
    try:
        st = trace_stats(df)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert st["peak_1min_rps"] == pytest.approx(2 / 60)  # 0 s and 5 s share the first minute
    assert peak < 10e6


def test_stats_busiest_minute_by_hand():
    # minutes from the first arrival (10 s): [10, 70) holds 10, 20, 69.9; [70, 130) holds 70, 100; [190, 250) 200
    df = pd.DataFrame({"request_id": list("abcdef"), "arrival_s": [10.0, 20.0, 69.9, 70.0, 100.0, 200.0],
                       "prompt_tokens": [1] * 6, "output_tokens": [1] * 6})
    assert trace_stats(df)["peak_1min_rps"] == pytest.approx(3 / 60)
    # the busiest minute last: [60, 120) holds 100, 101, 102
    last = df.iloc[:4].assign(arrival_s=[0.0, 100.0, 101.0, 102.0])
    assert trace_stats(last)["peak_1min_rps"] == pytest.approx(3 / 60)


def test_synth_gamma_huge_cv_keeps_rate(tmp_path, capsys):
    out = tmp_path / "g.csv"
    # cv 1e6 used to run past 90 s growing to 9 GB; cv 1000 gave 201,222 requests for "2 req/s for 60 s"
    for cv in ("1e6", "1000"):
        assert main(["trace", "synth", "--arrival", "gamma", "--cv", cv, "--rate", "2", "--duration", "60",
                     "-o", str(out)]) == 0
        df = load_trace(out)
        assert len(df) == 120 and df["arrival_s"].max() < 60.0


def test_synth_burstiness_is_vllm_gamma_shape(tmp_path, capsys):
    out = tmp_path / "b.csv"
    assert main(["trace", "synth", "--burstiness", "0.25", "--rate", "4", "--num-requests", "40000",
                 "--seed", "3", "-o", str(out)]) == 0
    gaps = load_trace(out)["arrival_s"].diff().dropna().to_numpy()
    # shape 0.25 -> CV 1/sqrt(0.25) = 2; mean gap 1/4 s
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.05)
    assert gaps.mean() == pytest.approx(0.25, rel=0.01)


@pytest.mark.parametrize("argv", [["--burstiness", "2", "--cv", "3"], ["--cv", "3", "--burstiness", "2"],
                                  ["--arrival", "poisson", "--burstiness", "2"],
                                  ["--burstiness", "2", "--arrival", "poisson"]])
def test_synth_burstiness_conflicts(tmp_path, capsys, argv):
    with pytest.raises(SystemExit) as ei:
        main(["trace", "synth", *argv, "--num-requests", "5", "-o", str(tmp_path / "x.csv")])
    assert ei.value.code == 2
    assert "--burstiness" in capsys.readouterr().err


def test_burstiness_sets_gamma_and_cv():
    import argparse
    from pagesim.traces.args import add_workload_args
    p = argparse.ArgumentParser()
    add_workload_args(p)
    args = p.parse_args(["--burstiness", "4", "--arrival", "gamma"])
    assert (args.arrival, args.cv, args.burstiness) == ("gamma", 0.5, 4.0)  # CV = 1/sqrt(4)


@pytest.mark.parametrize("spec,fragment", [("lognormal:mean=-5,sigma=1", "mean must be > 0"),
                                           ("lognormal:mean=300,sigma=-1", "sigma must be a finite number >= 0"),
                                           ("exponential:mean=nan", "mean must be > 0"),
                                           ("uniform:low=1,high=1e30", "high must be below"),
                                           ("lognormal:mu=30,sigma=1", "draws"),  # e^30 = 1e13 tokens
                                           ("lognormal:mu=inf,sigma=1", "mu must be finite")])
def test_synth_bad_length_distribution_one_line(tmp_path, capsys, spec, fragment):
    rc = main(["trace", "synth", "--workload", "custom", "--prompt-dist", spec, "--output-dist", "constant:5",
               "--num-requests", "5", "-o", str(tmp_path / "x.csv")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("pagesim: error: ") and err.count("\n") == 1 and fragment in err
