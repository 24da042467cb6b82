"""The blocked-queue-head shortcut (sim/core/sched/scheduler_vllm.py, ``head_still_blocked``): a head that
did not fit is not retried until memory is freed (``FREE_EPOCH``). Orca with predicted
reservations frees memory without a finish or preemption too: an extent that outgrows its
reservation and moves leaves a hole (tests/sim/core/test_contiguous.py). The shortcut used to
outlive such a move: the head was skipped while it fit, which changed the results. ``--check``
(sim/core/check.py, ``check_blocked_head``) fails such a run after the iteration with "skipped
as blocked but would be admitted"."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, rand_trace

# configurations fuzzing found (seed 26: a move frees the hole the head fits in)
CASES = [("first-fit", 26, 1024), ("best-fit", 19, 600), ("best-fit", 46, 800)]


@pytest.mark.parametrize("placement,seed,slots", CASES)
def test_the_shortcut_never_skips_a_head_that_fits_after_a_move(placement, seed, slots):
    cfg = cfg_for("orca-max", slots=slots, reservation="predicted", placement=placement, predictor_error=0.5,
                  seed=seed, check=True)
    trace = rand_trace(seed, n=40, rate=100.0)
    checked = run_simulation(cfg, trace)  # every iteration checked: no InvariantError
    assert checked.summary["mgr_moves"] > 0  # the case reaches what it tests
    cfg.check = False
    plain = run_simulation(cfg, trace)
    pd.testing.assert_frame_equal(checked.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(checked.steps, plain.steps, check_exact=True)
