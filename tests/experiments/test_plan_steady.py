"""`pagesim plan`: an answer that moves with the workload's length is called unsteady, and probes
stopped early are not drawn as if their partial figures were complete."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.experiments import plan as P
from pagesim.experiments.probe import Runner, SearchTask, decode_workload, encode_workload
from pagesim.experiments.search import BoundarySearch
from pagesim.experiments.slo import SLO
from pagesim.experiments.run_cache import RunOutput
from pagesim.reports.plan_report import EARLY_STOP_LABEL, curves_figure

#: the fake system's capacity (req/s) at each workload length (s): it passes a TTFT SLO at rates up
#: to the capacity of its run's length
CAPACITY: dict[float, float] = {}


def fake_probe(spec) -> RunOutput:
    """100 requests over the run; each has TTFT 0.1 s when the rate is within the capacity of this
    length, else 10 s; all finish 1 s after their first token (well within the keep-up rule)."""
    n, span = 100, spec.duration_s
    arrival = np.linspace(0.0, span, n)
    ttft = np.full(n, 0.1 if spec.rate <= CAPACITY[span] else 10.0)
    finish = arrival + ttft + 1.0
    req = pd.DataFrame({"arrival_s": arrival, "finish_s": finish, "status": "finished", "output_tokens": 11,
                        "ttft_s": ttft, "tpot_s": 0.09, "e2el_s": finish - arrival,
                        "normalized_latency_s": (finish - arrival) / 11})
    summary = {"system": spec.system, "request_throughput": n / span, "output_throughput": 11 * n / span,
               "duration_s": float(finish[-1])}
    return RunOutput(summary=summary, requests=req)


def plan_with(capacity_60: float, capacity_120: float, tmp_path) -> dict:
    CAPACITY.clear()
    CAPACITY.update({60.0: capacity_60, 120.0: capacity_120})
    setup = P.PlanSetup(sim={}, workload=encode_workload({"workload": "sharegpt", "duration": 60.0}),
                        start_rate=1.0, min_rate=0.05, max_rate=64.0, rtol=0.05, duration_s=60.0)
    runner = Runner(slo=SLO(ttft_p99_s=2.0), workers=1, cache_dir=tmp_path, run_fn=fake_probe)
    return P.max_rate(setup, ["vllm"], runner)


@pytest.mark.parametrize("capacity_120, steady, moves", [
    # The 60 s search doubles from 1 req/s (1, 2 pass; 4 fails) and bisects (2.062 fails): its
    # answer is a = 2.0. The check probes a / 1.05 = 1.905 and a * 1.05 = 2.1 on 120 s:
    (2.0, True, None),  # same capacity: 1.905 passes, 2.1 fails
    (1.95, True, None),  # the answer moves down, by less than rtol: 1.905 passes, 2.1 fails
    (1.0, False, "1.905 req/s already fails"),  # 1.905 > 1.0
    (4.0, False, "2.1 req/s passes too"),  # 2.1 < 4.0
])
def test_an_answer_that_moves_with_the_length_is_unsteady(tmp_path, capacity_120, steady, moves):
    result = plan_with(2.0, capacity_120, tmp_path)
    answer = result["answers"][0]
    assert answer["max_rate_rps"] == 2.0
    assert answer["steady"] is steady
    notes = [w for w in result["warnings"] if "not steady" in w]
    if steady:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith("vllm: the answer 2 req/s is not steady: on a 2x longer "
                                                       f"workload {moves}")
        assert notes[0].endswith("it moves by more than --rtol with the workload's length: use a longer --duration")
    assert result["steady_check"] == {"done": True, "factor": 2.0, "workload": "sharegpt (duration=120)"}


def test_longer_doubles_duration_or_request_count():
    setup = P.PlanSetup(sim={}, workload=encode_workload({"workload": "alpaca", "duration": 30.0}), duration_s=30.0)
    longer = setup.longer(2.0)
    assert decode_workload(longer.workload)["duration"] == 60.0 and longer.duration_s == 60.0
    by_count = P.PlanSetup(sim={}, workload=encode_workload({"workload": "alpaca", "num_requests": 101}))
    assert decode_workload(by_count.longer(2.0).workload)["num_requests"] == 202
    whole_trace = P.PlanSetup(sim={}, workload="trace?trace=%22x.csv%22")
    assert whole_trace.longer(2.0) is None


def test_early_stopped_probes_are_drawn_apart():
    """Three probes: 1 and 2 req/s completed, 4 req/s stopped early with a partial p99 below the
    completed one at 2 req/s. The line joins 1 and 2 only; 4 is a faint open cross in its own
    legend entry."""
    points = [
        {"search": "vllm", "rate": 1.0, "passed": True, "p99_ttft_s": 0.2, "p99_tpot_s": 0.03, "slo_attainment": 1.0,
         "output_throughput": 100.0},
        {"search": "vllm", "rate": 2.0, "passed": False, "p99_ttft_s": 3.0, "p99_tpot_s": 0.05, "slo_attainment": 0.5,
         "output_throughput": 180.0},
        {"search": "vllm", "rate": 4.0, "passed": False, "p99_ttft_s": 0.5, "p99_tpot_s": 0.04, "slo_attainment": 0.3,
         "output_throughput": 50.0, "stopped_early": True, "fail_reason": "stopped at t=30 s"},
    ]
    fig = curves_figure(points, {"ttft_p99_s": 2.0})
    lines = [t for t in fig.data if t.mode == "lines"]
    assert lines and all(list(t.x) == [1.0, 2.0] for t in lines)
    early = [t for t in fig.data if t.mode == "markers" and t.marker.symbol == "x-open"]
    assert len(early) == 4 and all(list(t.x) == [4.0] for t in early)  # one per panel
    assert sum(bool(t.showlegend) for t in early) == 1 and early[0].name == f"vllm: {EARLY_STOP_LABEL}"
    solid = [t for t in fig.data if t.mode == "markers" and t.marker.symbol in ("circle", "x")]
    assert sorted(x for t in solid for x in t.x) == [1.0] * 4 + [2.0] * 4


def test_kv_answers_are_told_in_gib():
    """The KV search runs over x = 1 / kv_gib: x = 0.25 is a 4 GiB pool."""
    kv = SearchTask("kv/vllm", BoundarySearch(0.5), lambda y: None, x_name="1/kv_gib")
    rate = SearchTask("vllm", BoundarySearch(1.0), lambda x: None)
    assert P._setting(kv, 0.25) == "4 GiB of KV" and P._setting(rate, 1.5) == "1.5 req/s"
