"""add_workload_args / workload_from_args: defaults, trace rescaling and the pipeline's report."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from pagesim.sim.errors import TraceError
from pagesim.traces.args import add_workload_args, workload_from_args


def parse(*argv):
    p = argparse.ArgumentParser()
    add_workload_args(p)
    return p.parse_args(list(argv))


def test_defaults_synthetic_600s_at_2rps():
    args = parse()
    assert args.workload == "sharegpt" and args.rate is None and args.duration is None
    df, info = workload_from_args(args, 2048, "error")
    assert info["kind"] == "synthetic" and info["workload"]["rate"] == 2.0
    assert info["workload"]["duration_s"] == 600.0
    assert df["arrival_s"].max() < 600 and 1000 < len(df) < 1400
    assert info["max_len"]["affected"] == 0 and info["rows"] == len(df)


def test_synthetic_num_requests_and_parallel():
    df, info = workload_from_args(parse("--workload", "alpaca", "--rate", "5", "--num-requests", "100",
                                        "--n", "2", "--beam-width", "3"), 2048, "error")
    assert len(df) == 100 and (df["n"] == 2).all() and (df["beam_width"] == 3).all()
    assert [s["step"] for s in info["steps"]] == ["parallel"]


TRACE = "t,p,o\n" + "".join(f"{t},{p},{o}\n" for t, p, o in
                            [(0, 10, 10), (1, 90, 20), (2, 50, 50), (3, 100, 1), (4, 120, 5), (5, 30, 70)])


def test_trace_rate_only_when_given(write):
    path = str(write("g.csv", TRACE))
    df, info = workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t"), 4096, "error")
    assert df["arrival_s"].tolist() == [0, 1, 2, 3, 4, 5] and info["steps"] == []
    df, info = workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t",
                                        "--rate", "4"), 4096, "error")
    np.testing.assert_allclose(df["arrival_s"], [0, 0.25, 0.5, 0.75, 1.0, 1.25])
    assert info["steps"][0]["step"] == "rate" and info["steps"][0]["from_rps"] == pytest.approx(1.0)


def test_trace_pipeline_order_and_counts(write):
    path = str(write("g.csv", TRACE))
    df, info = workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t",
                                        "--time-slice", "1:5", "--rate-scale", "2", "--duration", "1.6"),
                                  100, "drop")
    # slice [1,5) -> rows 1..4 at 0,1,2,3; x2 rate -> 0,.5,1,1.5; duration 1.6 keeps all 4;
    # lengths 110,100,101,125 > 100 except 100 -> 3 dropped
    assert [(s["step"], s["rows_in"], s["rows_out"]) for s in info["steps"]] == [
        ("time_slice", 6, 4), ("rate_scale", 4, 4), ("duration", 4, 4)]
    assert info["max_len"] == {"policy": "drop", "max_seq_len": 100, "affected": 3, "dropped": 3, "truncated": 0}
    assert df["request_id"].tolist() == ["2"] and df["arrival_s"].tolist() == [0.5]


def test_trace_max_len_error_default(write):
    path = str(write("g.csv", TRACE))
    with pytest.raises(TraceError, match=r"g.csv, row 2, field 'prompt_tokens\+output_tokens'"):
        workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t"), 100, "error")


def test_sample_count_and_fraction(write):
    path = str(write("g.csv", TRACE))
    df, _ = workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t",
                                     "--sample", "0.5"), 4096, "error")
    assert len(df) == 3
    df, _ = workload_from_args(parse("--trace", path, "--columns", "prompt=p,output=o,arrival=t",
                                     "--sample", "2", "--num-requests", "4"), 4096, "error")
    assert len(df) == 2 and set(df["request_id"]) <= {"0", "1", "2", "3"}


@pytest.mark.parametrize("bad", ["5", "a:b", "5:2", "-1:3"])
def test_bad_time_slice_rejected(bad, capsys):
    with pytest.raises(SystemExit):
        parse("--time-slice", bad)
