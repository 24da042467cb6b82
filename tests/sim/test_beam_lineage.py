"""sim/beam_lineage.py: the records the core's beams follow. The search scores each beam's own best
``width`` continuations only; here against a search over every continuation (the plain rule, written
out below), on the built-in model: the same lineage and tokens."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim import beam_lineage as bl


def search_over_every_continuation(model, prompt, width, output_tokens):
    """Beam search as its definition: every beam's every continuation scored, the best ``width``
    kept (ties to the lower beam, then token)."""
    size = len(model.vocab)
    start = np.log(model.probs(prompt[-2], prompt[-1]))
    first = bl.top(start, width)
    scores, seqs = start[first], [[prompt[-1], int(w)] for w in first]
    parents = []
    for _ in range(1, output_tokens):
        cand = np.concatenate([scores[j] + np.log(model.probs(*seqs[j][-2:])) for j in range(len(seqs))])
        best = bl.top(cand, width)
        parent, word = best // size, best % size
        parents.append(parent.tolist())
        seqs = [[seqs[p][-1], int(w)] for p, w in zip(parent.tolist(), word.tolist())]
        scores = cand[best]
    return parents


@pytest.mark.parametrize("width, at", [(2, 100), (3, 5_000), (5, 40_000), (8, 77_000)])
def test_the_search_keeps_what_scoring_every_continuation_keeps(width, at):
    model, ids = bl.builtin_model()
    prompt = ids[at:at + 16]
    record = bl.beam_search(model, prompt, width, 120)
    assert record.parents.tolist() == search_over_every_continuation(model, prompt, width, 120)


def test_a_library_is_the_same_each_time_and_names_beams_of_its_width():
    first = bl.lineage_library(3, records=2, tokens=50)
    assert first.shape == (2, 49, 3) and first.dtype == np.int16
    assert 0 <= first.min() and first.max() < 3
    bl.lineage_library.cache_clear()
    assert (bl.lineage_library(3, records=2, tokens=50) == first).all()
    with pytest.raises(ValueError, match="2 to 32767 beams"):
        bl.lineage_library(1)
