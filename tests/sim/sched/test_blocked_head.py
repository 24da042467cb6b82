"""The blocked-queue-head shortcut (sim/sched/continuous.py, ``_still_blocked``): a head that
did not fit is not retried until memory is freed. Orca with predicted reservations frees
memory without a finish or preemption too: an extent that outgrows its reservation and
moves leaves a hole (tests/sim/memory/test_contiguous_moves.py). The shortcut used to outlive
such a move: the head was skipped while it fit, which changed the results (``--check`` said
"skipped as blocked but would be admitted")."""

from __future__ import annotations

import pandas as pd
import pytest

from pagesim.sim.run import run_simulation
from pagesim.sim.sched.continuous import ContinuousScheduler
from tests.sim.helpers import cfg_for, rand_trace

# a configuration fuzzing found (seed 26: a move frees the hole the head fits in)
CASES = [("first-fit", 26, 1024), ("best-fit", 19, 600), ("best-fit", 46, 800)]


@pytest.mark.parametrize("placement,seed,slots", CASES)
def test_the_shortcut_never_changes_orca_predicted_results(placement, seed, slots, monkeypatch):
    cfg = cfg_for("orca-max", slots=slots, reservation="predicted", placement=placement, predictor_error=0.5,
                  seed=seed, check=True)
    trace = rand_trace(seed, n=40, rate=100.0)
    checked = run_simulation(cfg, trace, engine="python", macro_steps=False)  # --check: no InvariantError
    assert checked.summary["mgr_moves"] > 0
    # without the shortcut (the head retried at every iteration) the run is the same
    cfg.check = False
    shortcut = run_simulation(cfg, trace, engine="python")
    monkeypatch.setattr(ContinuousScheduler, "_still_blocked", lambda self: False)
    monkeypatch.setattr(ContinuousScheduler, "macro_plan", lambda self: None)
    retried = run_simulation(cfg, trace, engine="python")
    pd.testing.assert_frame_equal(shortcut.requests, retried.requests, check_exact=True)
    pd.testing.assert_frame_equal(shortcut.steps, retried.steps, check_exact=True)
    pd.testing.assert_frame_equal(checked.requests, retried.requests, check_exact=True)
