"""A request whose sequences (``n`` samples or ``beam_width`` beams, which run together) exceed
``max_num_seqs`` can never be admitted: it is rejected when it arrives, with the reason, and
the requests around it are served as if it had not come."""

from __future__ import annotations

import math

from pagesim.sim.run import run_simulation


def test_request_wider_than_max_num_seqs_is_rejected_at_arrival(opt13b_config, tiny_trace):
    # r0 and r2 have one sequence each, r1 asks for n = 3 with max_num_seqs = 2
    trace = tiny_trace((0.0, 4, 2), (0.0, 4, 2), (1.0, 4, 2))
    trace["n"] = [1, 3, 1]
    cfg = opt13b_config(1024, max_seq_len=64, max_num_seqs=2, check=True)
    result = run_simulation(cfg, trace)
    requests = result.requests
    assert requests["status"].tolist() == ["finished", "rejected", "finished"]
    assert requests["reject_reason"][1] == "its 3 sequences (n / beam_width) exceed max_num_seqs=2"
    assert result.summary["unfinished"] == 0
    # r0 runs alone (prefill, one decode step); r2 arrives at 1 s to an idle engine and does the same
    assert len(result.steps) == 4
    assert result.steps["batch_size"].tolist() == [1, 1, 1, 1]
    assert math.isfinite(result.summary["request_throughput"])
    assert requests["finish_s"][2] > 1.0
