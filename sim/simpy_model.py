"""The core's event loop told as two SimPy processes: the readable model of ``sim/core/events/loop.py``.

Time is owned by the core's loop, which is compiled with the rest of the core (one event source
per process, the next arrival and the end of the running step, merged by hand in a few lines).
This module tells the same story with SimPy owning time, calling the very same scheduling,
memory and pricing functions of the core (interpreted by CPython: no second statement of any
policy), and ``tests/sim/test_simpy_model.py`` checks that it leaves the same records::

    arrivals:  for each request: wait until it arrives, hand it to the scheduler, wake the
               engine if it sleeps
    engine:    loop: schedule an iteration (the scheduler performs its memory operations); if
               there is none, sleep until an arrival (or end the run when nothing is left);
               price it, record it, let that much time pass, hand out what it produced

Two SimPy rules make the records the loop's: a timeout is a delay (an arrival fires at
``now + (at - now)``), and events at one instant fire in the order they were made. The model
is for reading and for tests: ``run_simulation`` runs the compiled loop.
"""

from __future__ import annotations

import numpy as np
import simpy

from pagesim.sim.core import state
from pagesim.sim.core.events import loop
from pagesim.sim.core.sched import lifecycle, static
from pagesim.sim.core.compile.families import WHOLE_BATCHES
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.core.events.replay import live_lock_message
from pagesim.sim.errors import InvariantError


def run(s: state.Core) -> state.Core:
    """Run the simulation ``s`` describes (``sim.run.initial_state``) to its end; returns the
    final state, its records as the compiled loop leaves them (``sim.core.replay.run``)."""
    c, clock = s.count, s.clock
    family = int(s.config[state.SCHEDULER_KIND])  # the loop's constant: its scheduler
    traits = int(s.config[state.FAMILY_TRAITS])  # and what it does (sim/core/compile/families.py)
    add_arrival = interpreted(lifecycle.add_arrival)
    scheduler = interpreted(loop.scheduler_of(family))  # the family's scheduler, as the loop calls it

    def schedule(s):
        return scheduler(s, None, loop.SCHEDULE)

    if traits & WHOLE_BATCHES:  # request-level (static) batching: sim/core/sched/static.py
        complete_step = interpreted(static.complete_step)
    else:
        complete_running = interpreted(lifecycle.complete_step)

        def complete_step(s, now):
            complete_running(s, now, traits)
    step_time, record = interpreted(loop.step_time), interpreted(loop.record)
    steps_without_token_limit = interpreted(lifecycle.steps_without_token_limit)
    env = simpy.Environment()
    sleeping: list[simpy.Event] = []  # the engine's wake-up call while it sleeps

    def grow_step_table() -> None:
        nonlocal s
        s = s._replace(row_floats=np.concatenate([s.row_floats, np.zeros_like(s.row_floats)]),
                       row_ints=np.concatenate([s.row_ints, np.zeros_like(s.row_ints)]))

    def wake() -> None:
        if sleeping and not sleeping[0].triggered:
            sleeping[0].succeed()

    def arrivals(env):
        for i in range(len(s.arrival_s)):
            if s.arrival_s[i] > env.now:
                yield env.timeout(s.arrival_s[i] - env.now)
            clock[state.NOW] = env.now
            add_arrival(s, i)
            wake()
        c[state.ARRIVALS_DONE] = 1
        wake()

    def engine(env):
        while True:
            clock[state.NOW] = env.now
            decode_context_sum = schedule(s)
            if not (c[state.STEP_PREFILL_SEQS] or c[state.STEP_DECODE_SEQS] or c[state.STEP_SWAP_IN]
                    or c[state.STEP_SWAP_OUT]):
                if c[state.ARRIVALS_DONE] and not (c[state.WAITING_LEN] or c[state.NUM_RUNNING] or c[state.SWAPPED_LEN]):
                    clock[state.END_S] = env.now
                    return
                if not c[state.NUM_RUNNING] and c[state.SWAPPED_LEN] and c[state.ARRIVALS_DONE] and not c[state.WAITING_LEN]:
                    raise InvariantError("scheduler stalled with swapped requests and nothing running")
                if not c[state.NUM_RUNNING] and c[state.WAITING_LEN] and c[state.DEMAND_WAITING]:
                    raise InvariantError("a request waits for memory in an empty pool")
                sleeping.append(env.event())
                idle_from = env.now
                yield sleeping[0]
                sleeping.clear()
                clock[state.IDLE_S] += env.now - idle_from
                continue
            dt = step_time(s, decode_context_sum, traits)
            if s.config[state.KEEP_ROWS] and c[state.NUM_ROWS] == len(s.row_floats):
                grow_step_table()
            record(s, env.now, dt, traits)
            yield env.timeout(dt)
            clock[state.NOW] = env.now
            complete_step(s, env.now)
            if c[state.STEPS_WITHOUT_TOKEN] > steps_without_token_limit(s.config[state.MAX_SEQ_LEN]):
                raise InvariantError(live_lock_message(env.now, int(c[state.STEPS_WITHOUT_TOKEN]),
                                                       int(c[state.WAITING_LEN]), int(c[state.SWAPPED_LEN]),
                                                       int(c[state.NUM_RUNNING]), int(c[state.NUM_PREEMPTIONS])))

    env.process(arrivals(env))
    env.process(engine(env))
    env.run()
    return s
