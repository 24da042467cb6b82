"""Every run ends with each request finished or rejected with a reason (sim/core/events/replay.py
``require_every_request_ended``): a loop that runs out of events with requests still queued is
an error naming them, not a quiet end with requests lost."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.sim.config import SimConfig
from pagesim.sim.core import state
from pagesim.sim.core.events import replay
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import initial_state, run_simulation
from tests.sim.helpers import cfg_for, rand_trace


def ended(s, finished, rejected, waiting=0, running=0, swapped=0):
    c = s.count
    c[state.NUM_FINISHED], c[state.NUM_REJECTED] = finished, rejected
    c[state.WAITING_LEN], c[state.NUM_RUNNING], c[state.SWAPPED_LEN] = waiting, running, swapped
    return s


def test_a_run_whose_requests_all_ended_passes():
    s = initial_state(cfg_for("vllm"), rand_trace(0, n=5))
    replay.require_every_request_ended([ended(s, 3, 2)])


def test_a_request_left_queued_is_named():
    s = initial_state(cfg_for("vllm"), rand_trace(0, n=5))
    with pytest.raises(InvariantError, match=r"^the run ended with 2 of 5 requests neither finished nor rejected "
                                             r"\(1 waiting, 1 running, 0 swapped\)"):
        replay.require_every_request_ended([ended(s, 2, 1, waiting=1, running=1)])


def test_a_clusters_replicas_are_counted_together():
    """The replicas share the request columns (5 requests) and each counts its own ends."""
    a = initial_state(cfg_for("vllm"), rand_trace(0, n=5))
    b = a._replace(count=a.count.copy())
    replay.require_every_request_ended([ended(a, 2, 0), ended(b, 2, 1)])
    with pytest.raises(InvariantError, match=r"1 of 5 requests .* \(0 waiting, 0 running, 1 swapped\)"):
        replay.require_every_request_ended([ended(a, 2, 0), ended(b, 2, 0, swapped=1)])


def test_a_scheduler_that_never_schedules_ends_in_that_error():
    """SGLang with a chunk below a page (refused by the registry, as SGLang refuses it) never
    schedules a prefill: forced past the check, the run says so instead of ending quietly."""
    cfg = SimConfig.for_system("sglang", block_size=16, chunk_budget=16)
    forced = dataclasses.replace(cfg)
    object.__setattr__(forced, "chunk_budget", 8)
    with pytest.raises(InvariantError, match=r"ended with 4 of 4 requests neither finished nor rejected "
                                             r"\(4 waiting, 0 running, 0 swapped\)"):
        run_simulation(forced, rand_trace(0, n=4))
