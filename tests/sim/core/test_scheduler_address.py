"""A family's loop calls its scheduler by address (``loop.call_scheduler``): what the address does,
and what a loop run without one does."""

from __future__ import annotations

import pytest

from pagesim.sim.core import jit, loop, replay, state
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, rand_trace

compiled_only = pytest.mark.skipif(not jit.COMPILED, reason="interpreted, the loop calls the scheduler's source")


@compiled_only
def test_a_loop_run_without_its_schedulers_address_stops_with_a_named_error():
    s = initial_state(cfg_for("static", slots=2048), rand_trace(1, n=20))
    s.config[state.SCHEDULER_ADDRESS] = 0  # as built: replay.compiled_entry sets it
    code = jit.compiled(loop.run_for(state.STATIC))(s)  # numba's dispatcher, called from Python
    assert code == loop.NO_SCHEDULER and s.count[state.NUM_ROWS] == 0  # nothing scheduled
    with pytest.raises(InvariantError, match=r"without its scheduler's address \(config\[SCHEDULER_ADDRESS\]"):
        replay.raise_for(code, s)


@compiled_only
def test_the_address_set_is_that_familys_scheduler_for_that_state(monkeypatch):
    monkeypatch.setenv("PAGESIM_JIT", "numba")  # numba's machine code (a module links a scheduler of its own)
    monkeypatch.setattr(replay, "_ENTRIES", {})
    s = initial_state(cfg_for("static", slots=2048), rand_trace(1, n=20))
    run = replay.compiled_entry(loop.run_for(state.STATIC), s)
    assert run(s) == loop.DONE
    assert s.config[state.SCHEDULER_ADDRESS] == replay.scheduler_address(state.STATIC, s) != 0


def test_the_step_table_is_the_interpreted_ones_through_the_schedulers_call():
    """The stores the loop makes after its scheduler's call (a step's start and duration in the
    step table) are kept: numba's dead-code elimination deleted them once (``numba_patches._stores_kept``)."""
    cfg, trace = cfg_for("static", slots=2048), rand_trace(2, n=40)
    result = run_simulation(cfg, trace)
    steps = result.steps
    assert len(steps) > 10 and (steps["dt_s"] > 0).all()
    assert (steps["start_s"].diff().iloc[1:] >= steps["dt_s"].iloc[:-1].to_numpy() - 1e-12).all()
