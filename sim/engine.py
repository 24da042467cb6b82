"""The SimPy engine: time is SimPy's; scheduling and memory are plain objects.

Two processes tell the story::

    arrivals:  for each request in the trace: wait until its arrival time, hand it to the
               scheduler, wake the engine if it sleeps
    engine:    loop: ask the scheduler for an iteration (it performs the memory operations),
               record memory, run the iteration on the executor (simulated: a cost model's
               duration; GPU: real kernels), let that much time pass, then tell the scheduler
               what the iteration produced. With nothing to run, sleep until an arrival.

The executor is the only thing the GPU mode swaps: ``gpu/executor.py`` implements the same
``run_step(batch, manager) -> seconds``.
"""

from __future__ import annotations

import time

import numpy as np
import simpy

from sim.batch import StepBatch
from sim.errors import PagesimError
from sim.metrics import StepRecorder


class SimulatedExecutor:
    """Prices an iteration with a cost model (roofline or a calibrated table)."""

    def __init__(self, cost_model):
        self.cost_model = cost_model

    def run_step(self, batch: StepBatch, manager) -> float:
        return self.cost_model.step_time(batch)


class InvariantError(PagesimError):
    """``--check`` found a broken invariant (a bug; please report it with the command line)."""


class Engine:
    def __init__(self, scheduler, manager, executor, arrival_s: np.ndarray, *, check: bool = False,
                 record_steps: bool = True, progress=None, clock=None):
        self.sched = scheduler
        self.mgr = manager
        self.executor = executor
        self.arrival_s = arrival_s
        self.check = check
        self.rec = StepRecorder(manager.capacity, keep_rows=record_steps,
                                block_usage=getattr(manager, "block_usage", None))
        self.progress = progress
        self.clock = clock  # optional callable(now, dt) for the GPU mode's real-time replay
        self.arrivals_done = False
        self._idle = False
        self._wake: simpy.Event | None = None
        self.wall_time_s = 0.0
        self.end_s = 0.0

    # -- the two processes -------------------------------------------------------------
    def arrivals(self, env: simpy.Environment):
        for i, at in enumerate(self.arrival_s.tolist()):
            if at > env.now:
                yield env.timeout(at - env.now)
            self.sched.add_arrival(i)
            if self._idle and not self._wake.triggered:
                self._wake.succeed()
        self.arrivals_done = True
        if self._idle and not self._wake.triggered:
            self._wake.succeed()

    def engine(self, env: simpy.Environment):
        sched, mgr, rec = self.sched, self.mgr, self.rec
        last_t = 0.0
        while True:
            batch = sched.schedule(env.now)
            if batch.is_empty:
                if self.arrivals_done and not sched.has_work:
                    break
                if sched.num_running == 0 and sched.has_work and self.arrivals_done and not sched.waiting:
                    raise InvariantError("scheduler stalled with swapped requests and nothing running")
                if sched.num_running == 0 and sched.waiting and sched.demand_waiting:
                    raise InvariantError(
                        f"request {sched.waiting[0]} waits for memory in an empty pool "
                        "(the manager should have answered NEVER)")
                self._idle = True
                self._wake = env.event()
                idle_from = env.now
                yield self._wake
                self._idle = False
                rec.add_idle(env.now - idle_from)
                continue
            usage = mgr.usage(sched.demand_waiting)
            if self.check:
                self._check(usage, env.now, last_t)
            dt = self.executor.run_step(batch, mgr)
            if not dt > 0:
                raise InvariantError(f"executor returned a non-positive step time {dt}")
            rec.add(env.now, dt, batch, sched.num_waiting, sched.num_running, usage.as_tuple())
            last_t = env.now
            yield env.timeout(dt)
            finished = sched.complete_step(batch, env.now)
            if self.progress is not None and finished:
                self.progress.update(len(finished))
        self.end_s = env.now

    def _check(self, usage, now: float, last_t: float) -> None:
        if usage.total != self.mgr.capacity:
            raise InvariantError(f"t={now:.6f}: memory categories sum to {usage.total}, capacity {self.mgr.capacity}")
        if min(usage.as_tuple()) < 0:
            raise InvariantError(f"t={now:.6f}: negative memory category {usage}")
        if now < last_t:
            raise InvariantError(f"simulated time went backwards: {now} < {last_t}")
        try:
            self.mgr.check()
        except AssertionError as e:
            raise InvariantError(f"t={now:.6f}: memory manager inconsistent: {e}") from None

    def run(self) -> None:
        env = simpy.Environment()
        env.process(self.arrivals(env))
        env.process(self.engine(env))
        t0 = time.perf_counter()
        env.run()
        self.wall_time_s = time.perf_counter() - t0
