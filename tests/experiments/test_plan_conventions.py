"""pagesim plan in vllm bench serve's terms: slo_attainment (the fraction of requests meeting every
SLO, formerly 'goodput'), request_goodput (those requests per second), --slo-attainment F, and
vLLM's --goodput ttft:MS tpot:MS e2el:MS thresholds."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from pagesim.experiments.probe import early_stop_options
from pagesim.experiments.slo import DEFAULT_SLO_ATTAINMENT, SLO, evaluate_point
from pagesim.experiments.plan_cli import slo_from_args
from pagesim.sim.cli import build_parser, main


def table(ttft, status):
    """Requests arriving 0, 1, 2, ... with these TTFTs (s), TPOT 0.01 s, E2EL = TTFT + 1 s."""
    n = len(ttft)
    ttft = np.asarray(ttft, float)
    fin = np.array([s == "finished" for s in status])
    e2el = np.where(fin, ttft + 1.0, np.nan)
    arrival = np.arange(n, dtype=float)
    return pd.DataFrame({"arrival_s": arrival, "finish_s": arrival + e2el, "status": status,
                         "output_tokens": np.full(n, 101), "ttft_s": np.where(fin, ttft, np.nan),
                         "tpot_s": np.where(fin, 0.01, np.nan), "e2el_s": e2el,
                         "normalized_latency_s": e2el / 101})


def test_slo_attainment_and_request_goodput_by_hand():
    # TTFTs 0.5, 1.0, 1.5 (finished) and one rejected; TTFT <= 1 s: the first two meet it (1.0 <= 1.0)
    req = table([0.5, 1.0, 1.5, 0.1], ["finished", "finished", "finished", "rejected"])
    p = evaluate_point(req, SLO(ttft_p99_s=1.0, slo_attainment=0.5), duration_s=8.0)
    assert p["slo_attainment"] == pytest.approx(2 / 4)  # of all requests: the rejected one misses
    assert p["request_goodput"] == pytest.approx(2 / 8.0)  # good requests per second of the run
    assert "goodput" not in p
    assert "rejected" in p["fail_reason"] and "SLO attainment" not in p["fail_reason"]  # 0.5 >= 0.5
    p = evaluate_point(req.iloc[:3], SLO(ttft_p99_s=1.0, slo_attainment=0.7), duration_s=4.0)
    assert p["slo_attainment"] == pytest.approx(2 / 3) and p["request_goodput"] == pytest.approx(2 / 4.0)
    assert not p["passed"] and p["fail_reason"] == "SLO attainment 0.667 < 0.7"
    # p99 mode: the same per-request thresholds make request_goodput; no duration, no request_goodput
    p = evaluate_point(req.iloc[:3], SLO(ttft_p99_s=1.0))
    assert p["slo_attainment"] == pytest.approx(2 / 3) and math.isnan(p["request_goodput"])


def plan_args(*argv):
    return build_parser().parse_args(["plan", *argv])


def test_goodput_thresholds_are_milliseconds_met_by_the_default_attainment():
    slo = slo_from_args(plan_args("--goodput", "ttft:2000", "tpot:100"))
    assert (slo.ttft_p99_s, slo.tpot_p99_s, slo.e2el_p99_s) == (2.0, 0.1, None)
    assert slo.slo_attainment == DEFAULT_SLO_ATTAINMENT == 0.9  # DistServe's 90 %
    assert slo.describe() == ">= 90 % of requests with TTFT <= 2 s and TPOT <= 0.1 s"
    slo = slo_from_args(plan_args("--goodput", "e2el:20000", "--slo-attainment", "0.5", "--slo-ttft-p99", "3"))
    assert (slo.ttft_p99_s, slo.e2el_p99_s, slo.slo_attainment) == (3.0, 20.0, 0.5)
    slo = slo_from_args(plan_args("--slo-ttft-p99", "2"))  # p99 mode as before
    assert slo.slo_attainment is None and slo.describe() == "p99 TTFT <= 2 s"
    assert early_stop_options(SLO(ttft_p99_s=2.0, slo_attainment=0.8)) == {"ttft": 2.0, "slo_attainment": 0.8}


@pytest.mark.parametrize("argv, needle", [
    (["--goodput", "0.9"], "--slo-attainment 0.9"),
    (["--goodput", "ttft:2000", "--slo-ttft-p99", "2"], "give one"),
    (["--goodput", "ttft"], "KEY:MS"),
    (["--goodput", "itl:20"], "unknown metric 'itl'"),
    (["--goodput", "tpot:-5"], "positive"),
    (["--slo-attainment", "0.9"], "needs at least one per-request threshold"),
    (["--slo-attainment", "1.5", "--slo-ttft-p99", "2"], "(0, 1]"),
])
def test_bad_slo_options_exit_2_with_one_line(capsys, argv, needle):
    rc = main(["plan", "--duration", "10", "--no-progress", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err, err
    assert err.startswith("pagesim: error:") and err.count("\n") == 1 and "Traceback" not in err


def test_cli_reports_slo_attainment_and_request_goodput(tmp_path, capsys):
    argv = ["plan", "--workload", "sharegpt", "--duration", "40", "--max-seq-len", "1024", "--max-len-policy",
            "truncate", "--kv-gib", "2", "--rtol", "0.25", "--workers", "1", "--goodput", "ttft:2000", "tpot:100",
            "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--report", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "SLO attain." in out and "good req/s" in out and "goodput  " not in out
    plan = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert plan["slo"]["slo_attainment"] == 0.9 and "goodput" not in plan["slo"]
    for row in plan["points"] + plan["answers"]:
        assert "goodput" not in row and {"slo_attainment", "request_goodput"} <= set(row)
        # good requests are a subset of the finished ones, over the same run duration
        assert row["request_goodput"] <= row["request_throughput"] + 1e-12
    html = (tmp_path / "o" / "report.html").read_text()
    assert "SLO attainment (fraction of requests)" in html and "goodput (fraction" not in html
