"""sim/beam_lineage.py's trigram model and beam search, and what a lineage says (traces/beam_search.py),
worked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.sim.cli import main
from pagesim.traces import beam_search as bs


def test_kneser_ney_on_a_six_token_corpus():
    # "a b c a b d": bigram types ab bc ca bd, each token seen after exactly one other, so
    # P1 = (1 - .75 + .75 * 4/4) / 4 = 1/4 each. Trigrams abc bca cab abd: after b the
    # continuation counts are c: 1, d: 1 (both after "a b"), so P2(c|b) = .25/2 + .75*2/2 * 1/4
    # = .3125 = P2(d|b), P2(a|b) = P2(b|b) = .75 * 1/4 = .1875; after "a b" the raw counts are
    # c: 1, d: 1, so P3(c|a b) = .25/2 + .75 * .3125 = .359375, P3(a|a b) = .75 * .1875.
    m = bs.TrigramModel("a b c a b d".split())
    assert m.vocab == ["a", "b", "c", "d"]
    a, b, c, d = m.ids("a b c d".split())
    np.testing.assert_allclose(m.unigram, [0.25] * 4)
    np.testing.assert_allclose(m.probs(a, b), [0.140625, 0.140625, 0.359375, 0.359375])
    # "d b" was never seen: P2(. | b) alone
    np.testing.assert_allclose(m.probs(d, b), [0.1875, 0.1875, 0.3125, 0.3125])
    # after "d" nothing was seen: the unigram continuation
    np.testing.assert_allclose(m.probs(b, d), [0.25] * 4)


def test_tokenize_keeps_words_numbers_and_prose_punctuation():
    assert bs.tokenize("Hello, world 42 (x_y) * = 'q'.") == ["Hello", ",", "world", "42", "(", "x_y", ")",
                                                             "'", "q", "'", "."]


class Table:
    """A model whose next-token distribution depends on the last token only."""

    vocab = ["0", "1", "2"]
    rows = {0: [0.5, 0.3, 0.2], 1: [0.1, 0.1, 0.8], 2: [0.9, 0.05, 0.05]}

    def probs(self, u, v):
        return np.array(self.rows[v])


def test_beam_search_lineage_worked_by_hand():
    # width 2 from prompt [0, 0]. Step 0: after 0, tokens 0 (.5) and 1 (.3).
    # Step 1: beam 0 ([0], .5) -> 0: .25; beam 1 ([1], .3) -> 2: .24: parents [0, 1].
    # Step 2: beam 0 ([0 0], .25) -> 0: .125; beam 1 ([1 2], .24) -> 0: .216: best first, parents [1, 0].
    # Step 3: beam 0 ([1 2 0], .216) -> 0: .108, 1: .0648 beat beam 1 ([0 0 0], .125) -> 0: .0625:
    # parents [0, 0], beam 1 dies.
    r = bs.beam_search(Table(), [0, 0], 2, 4)
    assert r.parents.tolist() == [[0, 1], [1, 0], [0, 0]]
    assert r.tokens.tolist() == [[1, 2, 0, 0], [1, 2, 0, 1]]
    assert bs.deaths(r.parents).tolist() == [0, 0, 1]
    # all beams share nothing generated until step 3, then "1 2 0"
    assert bs.shared_prefix(r.parents).tolist() == [0, 0, 0, 3]


def test_ties_go_to_the_lower_beam_then_token():
    assert bs.top(np.array([1.0, 3.0, 3.0, 0.0, 3.0]), 2).tolist() == [1, 2]


def test_physical_blocks_under_copy_on_write_by_hand():
    # the lineage above, a 2-token prompt, 2-token blocks; step t holds 3 + t tokens per beam.
    # t=0: prompt block shared (1) + block of generated 0: 2 beams apart -> 3 of 4.
    # t=1: block of generated 0-1, both beams apart -> 3 of 4.
    # t=2: generated 0-1 (the beams descend from 2 beams after step 1) 2, generated 2: 2 -> 5 of 6.
    # t=3: both descend from one beam after step 2: generated 0-1 shared (1), generated 2-3 copied (2) -> 4 of 6.
    physical, logical = bs.physical_blocks(np.array([[0, 1], [1, 0], [0, 0]]), 2, 2)
    assert physical.tolist() == [3, 3, 5, 4]
    assert logical.tolist() == [4, 4, 6, 6]


def test_lineages_by_lag_by_hand():
    # distinct ancestors per step: t=1 [2 2], t=2 [2 2 2], t=3 [1 1 1 2]; lag 1: 2 + 2 + 1 over 3 steps,
    # lag 3: t=3 only, 1
    total, count = bs.lineages_by_lag(np.array([[0, 1], [1, 0], [0, 0]]), (1, 3, 5))
    assert total.tolist() == [5, 1, 0] and count.tolist() == [3, 1, 0]


def test_study_counts_deaths_per_beam_step():
    st = bs.study(Table(), [([0, 0], 4)], 2, block_size=2)
    assert st.death_rate == pytest.approx(1 / 6)  # 1 death over 3 steps x 2 beams
    assert st.block_saving == pytest.approx(1 - 15 / 20)
    # steps 1-3 in the first bin [1, 4)
    assert st.death_rate_by_step[0] == pytest.approx(1 / 6) and np.isnan(st.death_rate_by_step[1])


def test_cli_refuses_a_corpus_too_small(write, capsys):
    path = write("tiny.txt", "a b c a b d")
    assert main(["trace", "beam-search", "--corpus", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--corpus" in err[0] and "1000" in err[0]


def test_cli_prints_each_widths_statistics(capsys):
    assert main(["trace", "beam-search", "--width", "2", "3", "--num-requests", "2", "--max-output", "12"]) == 0
    out = capsys.readouterr().out
    assert "width 2: death rate" in out and "width 3: death rate" in out and "block saving" in out
