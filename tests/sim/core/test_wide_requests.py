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


def test_group_swapped_out_wider_than_the_token_budget_is_rejected(opt13b_config, tiny_trace, swap_gib_for):
    # issue 80: r0's 2 beams decode together, a token each, with chunk_budget = 1 (a budget vLLM
    # 0.4.2 refuses below max_num_seqs = 2). 4 blocks of 16: its prompt of 8 and the beams' own
    # blocks outgrow them before its 48 tokens, so it preempts itself, swapped out (a group is never
    # recomputed); a swap-in needs its 2 tokens of a 1-token budget, never granted: it was left
    # swapped out with nothing running ("scheduler stalled"), now it is rejected with the reason.
    # r1, one sequence, arrives later to an idle engine and is served.
    trace = tiny_trace((0.0, 8, 40), (100.0, 8, 8))
    trace["beam_width"] = [2, 1]
    cfg = opt13b_config(64, max_seq_len=64, max_num_seqs=2, chunked_prefill=True, chunk_budget=1,
                        preemption="swap", swap_gib=swap_gib_for(256), check=True)
    requests = run_simulation(cfg, trace).requests
    assert requests["status"].tolist() == ["rejected", "finished"]
    assert requests["preemptions"].tolist() == [1, 0]
    assert requests["reject_reason"][0] == ("its 2 sequences decode together, beyond chunk_budget=1: swapped out, "
                                            "never back in")
