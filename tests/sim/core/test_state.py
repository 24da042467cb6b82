"""The run (sim/run.py, the core's request arrays) starts the run's clock at the first arrival: the
duration and the time-weighted averages are measured from it (docs/guide/simulate.md: "from the first
arrival to the last finish"), and absolute trace times (epoch seconds, or a slice late in a
trace) cost no precision. The summary keeps the offset (``arrival_offset_s``)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("offset", [0.0, 100.0, 1.7e9, 1e15])
def test_the_run_is_measured_from_the_first_arrival(simulate, opt13b_config, tiny_trace, opt13b_a100, offset):
    # A (prompt 8, output 2) arrives at the offset, B (prompt 8, output 1) 0.5 s later, each to
    # an idle engine: A prefills and decodes (context 9); B prefills. 1e15 + 0.5 is a float.
    result = simulate(opt13b_config(1024, max_seq_len=64), tiny_trace((offset, 8, 2), (offset + 0.5, 8, 1)))
    prefill, decode = opt13b_a100.step(prefills=[(8, 0)]), opt13b_a100.step(decode_contexts=[9], kernel_block=16)
    summary, requests = result.summary, result.requests
    assert summary["arrival_offset_s"] == offset
    assert requests["arrival_s"].tolist() == [0.0, 0.5]  # the run's clock
    assert requests["ttft_s"].tolist() == pytest.approx([prefill, prefill], rel=1e-12)
    assert requests["e2el_s"][0] == pytest.approx(prefill + decode, rel=1e-12)
    assert summary["duration_s"] == pytest.approx(0.5 + prefill, rel=1e-12)
    assert summary["request_throughput"] == pytest.approx(2 / (0.5 + prefill), rel=1e-12)
    # idle: between A's finish and B's arrival only
    assert summary["idle_s"] == pytest.approx(0.5 - prefill - decode, rel=1e-9)
    assert summary["mem_free_idle"] + summary["mem_token_states"] + summary["mem_reservation"] \
        + summary["mem_internal_frag"] == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("column,row", [("prompt_tokens", 2), ("output_tokens", 3), ("n", 1), ("beam_width", 3)])
def test_requests_of_no_tokens_or_no_sequences_are_refused(column, row):
    """The trace loaders refuse a token count (or n, beam_width) below 1; a DataFrame handed to
    run_simulation unvalidated meets the same rule where requests are built: one line naming the
    row (1-based) and the field, before anything runs."""
    from pagesim.sim.errors import TraceError
    from pagesim.sim.run import run_simulation
    from tests.sim.helpers import cfg_for, trace

    df = trace([(0.0, 5, 3), (0.1, 6, 2), (0.2, 7, 4)], n=[1, 1, 1], beam_width=[1, 1, 1])
    df.loc[row - 1, column] = 0
    df.attrs["source"] = "frame"
    with pytest.raises(TraceError, match=rf"^frame, row {row}, field '{column}': must be >= 1, got 0 "
                                         rf"\(request 'r{row - 1}'\)$"):
        run_simulation(cfg_for(slots=1000), df)
