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
#: the fake system's request throughput with every request at once (its offline saturation)
SATURATION = {"rps": 1000.0}


def fake_probe(spec) -> RunOutput:
    """100 requests over the run; each has TTFT 0.1 s when the rate is within the capacity of this
    length, else 10 s; all finish 1 s after their first token (well within the keep-up rule).
    With every request at once (``offline``) they finish at the rate :data:`SATURATION`."""
    n, span = 100, spec.duration_s
    if decode_workload(spec.workload).get("offline"):
        finish = np.arange(1, n + 1) / SATURATION["rps"]
        req = pd.DataFrame({"arrival_s": 0.0, "finish_s": finish, "status": "finished", "output_tokens": 11,
                            "ttft_s": finish, "tpot_s": 0.0, "e2el_s": finish, "normalized_latency_s": finish / 11})
        return RunOutput(summary={"system": spec.system, "request_throughput": n / finish[-1],
                                  "saturated_request_throughput": SATURATION["rps"],
                                  "output_throughput": 11 * n / finish[-1], "duration_s": float(finish[-1])},
                         requests=req)
    span = span if span is not None else n / spec.rate
    arrival = np.linspace(0.0, span, n)
    ttft = np.full(n, 0.1 if spec.rate <= CAPACITY.get(spec.duration_s, CAPACITY.get(None)) else 10.0)
    finish = arrival + ttft + 1.0
    req = pd.DataFrame({"arrival_s": arrival, "finish_s": finish, "status": "finished", "output_tokens": 11,
                        "ttft_s": ttft, "tpot_s": 0.09, "e2el_s": finish - arrival,
                        "normalized_latency_s": (finish - arrival) / 11})
    summary = {"system": spec.system, "request_throughput": n / span, "output_throughput": 11 * n / span,
               "duration_s": float(finish[-1])}
    return RunOutput(summary=summary, requests=req)


def plan_with(capacity_60: float, capacity_120: float, tmp_path, saturation: float = 1000.0) -> dict:
    CAPACITY.clear()
    CAPACITY.update({60.0: capacity_60, 120.0: capacity_120})
    SATURATION["rps"] = saturation
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



def test_a_trace_replayed_whole_is_checked_on_itself_twice(tmp_path):
    """A trace without --duration or --num-requests has no longer window to read: the check
    replays it twice in a row (it was skipped without a word)."""
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n2,10,5\n")
    whole_trace = P.PlanSetup(sim={}, workload=encode_workload({"trace": str(trace)}))
    longer = whole_trace.longer(2.0)
    assert decode_workload(longer.workload)["repeat"] == 2 and "duration" not in decode_workload(longer.workload)
    CAPACITY.clear()
    CAPACITY[None] = 2.0  # a trace's probes have no duration_s: one capacity at every length
    SATURATION["rps"] = 1000.0
    runner = Runner(slo=SLO(ttft_p99_s=2.0), workers=1, cache_dir=tmp_path, run_fn=fake_probe)
    result = P.max_rate(P.PlanSetup(sim={}, workload=whole_trace.workload, max_rate=64.0), ["vllm"], runner)
    assert result["steady_check"]["done"] and result["steady_check"]["workload"].endswith("(repeat=2)")
    assert result["answers"][0]["steady"] is True


def test_an_answer_above_the_offline_saturation_is_lowered_to_it(tmp_path):
    """The 60 s search passes up to 2 req/s (answer 2.0), but the system serves its requests all at
    once at 1.5 req/s: 2.0 is no answer. The search goes on below 1.5 from the probes it has (1
    passes; 1.5 passes, the cap itself) and the answer is 1.5, with one line saying why."""
    result = plan_with(2.0, 2.0, tmp_path, saturation=1.5)
    answer = result["answers"][0]
    assert answer["max_rate_rps"] == 1.5 and answer["saturation_rps"] == pytest.approx(1.5)
    assert answer["capped"] is False
    notes = [w for w in result["warnings"] if "saturation" in w]
    assert notes == ["vllm: 2 req/s met the SLO but is above the offline saturation, 1.5 req/s (its requests all at "
                     "once): the workload ends before the queue it builds hurts; the answer is the highest rate up "
                     "to the saturation"]
    unchanged = plan_with(2.0, 2.0, tmp_path / "b", saturation=2.5)
    assert unchanged["answers"][0]["max_rate_rps"] == 2.0 and not [w for w in unchanged["warnings"]
                                                                   if "saturation" in w]


def test_floor_sig_never_exceeds_its_input():
    assert P._floor_sig(26.13) == 26.13 and P._floor_sig(26.1349) == 26.13 and P._floor_sig(1.5) == 1.5
    assert all(P._floor_sig(x) <= x for x in (0.07, 1 / 3, 2 / 3, 123456.7, 9.99999))


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
