"""experiments/figures/fig2_pow2.py: each reading's reservation, set through the core's predicted
reservation, worked by hand on the core's own request_size."""

from __future__ import annotations

import numpy as np
import pytest

from pagesim.experiments.figures import fig2_pow2
from pagesim.sim.core.kv import extent
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for, trace

# (arrival, prompt, output): P 10, O 25 (the paper's example: 25 -> 32); P 3, O 1; P 40, O 20
ROWS = [(0, 10, 25), (0, 3, 1), (0, 40, 20)]
# by hand, before the cap at max_seq_len 128:
WANT = {"pow2-output": [10 + 32, 3 + 1, 40 + 32],
        "pow2-total": [64, 4, 64],
        "double-output": [10 + 50, 3 + 2, 40 + 40],
        "double-total": [70, 8, 120]}


def test_next_pow2():
    assert fig2_pow2.next_pow2(np.array([1, 2, 3, 25, 32, 33])).tolist() == [1, 2, 4, 32, 32, 64]


def test_each_reading_reserves_what_it_says():
    p, o = np.array([r[1] for r in ROWS]), np.array([r[2] for r in ROWS])
    for reading, want in WANT.items():
        assert fig2_pow2.READINGS[reading](p, o).tolist() == want, reading
        s = initial_state(cfg_for("orca-max", slots=512, max_seq_len=128, reservation="predicted",
                                  predictor_error=1.0), trace(ROWS))
        s.predictor_draw[:] = fig2_pow2.predictor_draws_for(np.array(want), p, o)
        assert [extent.request_size(s, i, int(p[i])) for i in range(3)] == want, reading


def test_a_reading_is_capped_at_max_seq_len():
    s = initial_state(cfg_for("orca-max", slots=512, max_seq_len=64, reservation="predicted", predictor_error=1.0),
                      trace(ROWS))
    p, o = np.array([r[1] for r in ROWS]), np.array([r[2] for r in ROWS])
    s.predictor_draw[:] = fig2_pow2.predictor_draws_for(fig2_pow2.READINGS["double-total"](p, o), p, o)
    assert [extent.request_size(s, i, int(p[i])) for i in range(3)] == [64, 8, 64]


def test_buddy_arenas_count_the_pools_remainder_as_others():
    # 40 slots, max_seq_len 16: two arenas of 16 (32 slots) hold every extent, the other 8 slots
    # (20 %) are never used; one request of 4 + 4 tokens
    from tests.sim.helpers import OPT13B_SLOT
    base = dict(model="opt-13b", gpu="a100-80gb", kv_gib=40 * OPT13B_SLOT / 2 ** 30, max_seq_len=16, seed=0,
                max_len_policy="drop")
    row = fig2_pow2.run_reading("pow2-output", "buddy-arenas", trace([(0, 4, 4)]), base, 0.0, 1e9)
    cats = [row[c] for c in ("token_states", "reservation", "internal_frag", "external_frag_and_others")]
    assert row["placement"] == "buddy-arenas"
    assert sum(cats) == pytest.approx(100.0)
    assert row["external_frag_and_others"] >= 20.0 and row["token_states"] > 0
    whole = fig2_pow2.run_reading("pow2-output", "buddy", trace([(0, 4, 4)]), base, 0.0, 1e9)
    # the same extent over 32 slots instead of 40: its slots are the same share of 40
    assert row["token_states"] == pytest.approx(whole["token_states"])
