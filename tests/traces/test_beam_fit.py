"""traces/beam_fit.py: the beam model's saving on the core at a churn p set by hand."""

from __future__ import annotations

from pagesim.traces import beam_fit


def test_lengths_trace_spaces_requests_apart():
    t = beam_fit.lengths_trace([(5, 7), (9, 3)], 4)
    assert t["prompt_tokens"].tolist() == [5, 9] and t["output_tokens"].tolist() == [7, 3]
    assert t["beam_width"].tolist() == [4, 4] and t["n"].tolist() == [1, 1]
    assert t["arrival_s"].tolist() == [0.0, beam_fit.SPACING_S]


def test_the_core_reads_the_churn_set_in_its_state():
    # 4 beams after a 40-token prompt, 60 tokens each: without churn they share only the
    # prompt's 2 full blocks; with every beam dying each step (one lives) all share their past,
    # so the saving is larger, and it is the run's own p that sets it
    lengths = [(40, 60)]
    none, every = (beam_fit.core_saving(lengths, 4, p) for p in (0.0, 1.0))
    assert 0 < none < every < 0.75
