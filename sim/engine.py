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

Macro steps (``Engine(..., macro_steps=True)``, the default; ``run_simulation(...,
macro_steps=False)`` and ``--check`` run step by step): between changes of the decode set,
pure decode iterations are predictable, so the engine takes a stretch of them at once, up to
and including the iteration in which the next request finishes (see ``_macro``). A stretch
may start right after a finish when the scheduler's probe shows the queue head still cannot
be admitted. Only with the :class:`SimulatedExecutor` over a cost model that prices pure
decode steps (``decode_step_times``: all four) and a manager with a decode lane; every other
executor sees every iteration. Results are the same as step by step: identical records, times
bit for bit; only running sums (mean inter-token latency, the time-weighted sums of unrecorded
steps) differ by float summation order (``tests/sim/test_macro_steps.py``).

The core (``sim/core/``) replaces both processes for the configurations it covers:
``Engine(..., engine="auto"|"core"|"python")`` (``run_simulation`` passes ``auto``), the same
records again (``tests/sim/core/``).
"""

from __future__ import annotations

import math
import time

import numpy as np

from pagesim.sim.errors import InvariantError, PagesimError
from pagesim.sim.executor import SimulatedExecutor
from pagesim.sim.metrics import StepRecorder


def _delay_to(now: float, end: float) -> float | None:
    """The delay ``d`` with ``now + d == end`` in floats (SimPy's timeout arithmetic), or None
    when there is none."""
    d = end - now
    while now + d < end:
        d = math.nextafter(d, math.inf)
    while now + d > end:
        d = math.nextafter(d, -math.inf)
    return d if now + d == end else None


class Engine:
    # a macro step is tried only when it could cover this many iterations; with the scalar
    # planner even one predictable decode step is cheaper as a macro step than through the
    # scheduler's full path. The results do not depend on it (tests run 1, 2 and 8)
    MACRO_MIN_STEPS = 1

    def __init__(self, scheduler, manager, executor, arrival_s: np.ndarray, *, check: bool = False,
                 record_steps: bool = True, progress=None, macro_steps: bool = True, engine: str = "python"):
        self.sched = scheduler
        self.mgr = manager
        self.executor = executor
        self.arrival_s = arrival_s
        self.check = check
        self.rec = StepRecorder(manager.capacity, keep_rows=record_steps,
                                block_usage=getattr(manager, "block_usage", None))
        self.progress = progress
        self.arrivals_done = False
        self._idle = False
        self._wake: simpy.Event | None = None
        self.wall_time_s = 0.0
        self.end_s = 0.0
        self._arr_i = 0  # index of the next arrival the arrivals process has not handed over yet
        self._arr_t = 0.0  # the simulated time it is handed over at (once its timeout is set)
        self.num_macro_steps = 0  # iterations taken inside macro steps (see _macro)
        self._price = self._macro_pricer() if (macro_steps and not check) else None
        self._price1 = self._scalar_pricer() if self._price is not None else None
        self._arr_list = arrival_s.tolist()
        # the core (sim/core/) where it covers the configuration, when chosen
        from pagesim.sim.core import replay

        self.on_core = replay.choose(self, engine, step_by_step=not macro_steps)
        if self._price is not None and not (
                getattr(scheduler, "macro_steps_ok", False) and getattr(manager, "macro_steps_ok", False)
                and hasattr(manager, "lane_advance")
                and (len(arrival_s) < 2 or bool(np.all(np.diff(arrival_s) >= 0)))):
            self._price = None

    # -- the two processes -------------------------------------------------------------
    def arrivals(self, env: simpy.Environment):
        for i, at in enumerate(self.arrival_s.tolist()):
            self._arr_i = i
            if at > env.now:
                self._arr_t = env.now + (at - env.now)  # when SimPy fires it (may differ from at by an ulp)
                yield env.timeout(at - env.now)
            self.sched.add_arrival(i)
            if self._idle and not self._wake.triggered:
                self._wake.succeed()
        self._arr_i = len(self.arrival_s)
        self.arrivals_done = True
        if self._idle and not self._wake.triggered:
            self._wake.succeed()

    def engine(self, env: simpy.Environment):
        sched, mgr, rec = self.sched, self.mgr, self.rec
        last_t = last_dt = 0.0
        from pagesim.sim.core.scheduler import steps_without_token_limit

        no_token_limit = steps_without_token_limit(sched.max_seq_len)  # every run ends
        macro = self._price is not None
        while True:
            if macro:
                plan = sched.macro_plan()
                if plan is not None and (plan[0] >= self.MACRO_MIN_STEPS) and (
                        plan[2] or self._arr_i >= len(self.arrival_s)
                        or self._arr_t - env.now > self.MACRO_MIN_STEPS * last_dt):
                    end = self._macro(env.now, plan)
                    if end is not None:
                        yield env.timeout(end)
                        finished = sched.macro_complete(env.now)
                        if self.progress is not None:
                            self.progress.update(len(finished))
                        continue
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
                if batch.num_seqs == 0:  # (swaps alone go with the next iteration's sequences)
                    raise InvariantError(f"t={env.now:.6f}: an iteration with no sequence")
            dt = self.executor.run_step(batch, mgr)
            if not dt > 0:
                raise InvariantError(f"executor returned a non-positive step time {dt}")
            rec.add(env.now, dt, batch, sched.num_waiting, sched.num_running, usage.as_tuple())
            last_t = env.now
            last_dt = dt
            yield env.timeout(dt)
            finished = sched.complete_step(batch, env.now)
            if sched.steps_without_token > no_token_limit:
                from pagesim.sim.core.replay import live_lock_message

                raise InvariantError(live_lock_message(env.now, sched.steps_without_token, len(sched.waiting),
                                                       len(sched.swapped), sched.num_running,
                                                       sched.num_preemptions))
            if self.progress is not None and finished:
                self.progress.update(len(finished))
        self.end_s = env.now

    # -- macro steps ---------------------------------------------------------------------
    # Between changes of the decode set, pure decode iterations are predictable: the next
    # finish is known (the scheduler's heap), the manager's lane says how many appends fit,
    # and arrivals either end the stretch (empty queue: the next boundary admits them) or only
    # join a queue whose head stays blocked. Such a stretch runs as one macro step: the manager
    # advances m lane steps, the cost model prices the m steps, the recorder takes m rows, and
    # SimPy waits once; then the scheduler finishes the requests the last step completed
    # (``macro_complete``), as ``complete_step`` would. Short stretches (the common case under
    # load) are planned with scalar Python, long ones with numpy. Step boundaries are the same
    # float sums as step by step (start + dt, in order), so decisions and times are identical.
    def _macro_pricer(self):
        ex = self.executor
        if type(ex) is not SimulatedExecutor:
            return None  # GPU or custom executors see every iteration
        return getattr(ex.cost_model, "decode_step_times", None)

    # stretches up to this many steps are planned with scalar Python (a few numpy calls on
    # tiny arrays cost more than the arithmetic); longer ones vectorized. Same results.
    SCALAR_MACRO_MAX = 48

    def _scalar_pricer(self):
        """One pure decode step's duration from (width, context sum), as ``step_time`` gives it."""
        cm = self.executor.cost_model
        fn = getattr(cm, "decode_step_time", None)
        if fn is not None:
            return fn
        return lambda W, c: float(self._price(W, np.array([c], np.int64))[0])

    def _macro(self, now: float, plan) -> float | None:
        """Take up to ``plan``'s limit of decode iterations at once; returns the SimPy delay
        to the last one's end, or None when fewer than ``MACRO_MIN_STEPS`` are predictable."""
        sched = self.sched
        lim, W, blocked, dw = plan
        if self._arr_i < len(self.arrival_s):  # an arrival due now is not handed over yet
            if not (self._arr_list[self._arr_i] > now and self._arr_t > now):
                return None
        cut = self._cut_small if lim <= self.SCALAR_MACRO_MAX else self._cut_vector
        planned = cut(now, lim, W, blocked, sched.num_waiting)
        if planned is None:
            return None
        m, bounds, dts, waiting = planned
        # SimPy lands at now + delay: the stretch must end where step by step would. Rarely no
        # delay gets there (now + d rounds to even and skips it); the stretch then ends a step
        # earlier, and the full path takes that step
        d = None
        while m >= self.MACRO_MIN_STEPS and d is None:
            d = _delay_to(now, float(bounds[m]))
            if d is None:
                m -= 1
        if d is None:
            return None  # (rare after the engine's estimate: priced for nothing)
        if not isinstance(waiting, int):
            waiting = waiting[:m]
        mem, blk = self.mgr.lane_advance(m, dw)
        sched.macro_apply(m, bounds)
        sched.demand_waiting = dw
        self.rec.add_many(bounds[:m], dts[:m], W, waiting, sched.num_running, mem, blk)
        self.num_macro_steps += m
        return d

    def _cut_small(self, now: float, lim: int, W: int, blocked: bool, waiting0: int):
        """:meth:`_cut_vector` in scalar Python, for short stretches: the same floats."""
        price = self._price1
        c0 = self.sched.macro_context_sum0()
        dts = [price(W, c0 + j * W) for j in range(lim)]
        if not min(dts) > 0:
            return None
        bounds = [now]
        t = now
        for d in dts:
            t = t + d
            bounds.append(t)
        arr, i0, n = self._arr_list, self._arr_i, len(self._arr_list)
        m = lim
        waiting = waiting0
        if i0 < n:
            t_a = self._arr_t
            if not blocked:  # the first step starting at or after the arrival admits it
                m = 0
                while m < lim and bounds[m] < t_a:
                    m += 1
                if m and bounds[m] == t_a:  # a tie at the stretch's end: see _cut_vector
                    m -= 1
            else:  # arrivals only join the queue: count them per step (see _cut_vector)
                waiting = []
                p = i0
                for j in range(lim + 1):
                    st = bounds[j]
                    lo, hi = st * (1 - 1e-12), st * (1 + 1e-12)
                    while p < n and (t_a if p == i0 else arr[p]) < lo:
                        p += 1
                    if p < n and (t_a if p == i0 else arr[p]) <= hi:
                        m = max(j - 1, 0)
                        break
                    waiting.append(waiting0 + p - i0)
                del waiting[m:]
        return m, bounds, dts, waiting

    def _cut_vector(self, now: float, lim: int, W: int, blocked: bool, waiting0: int):
        """Price ``lim`` decode steps and cut them at the arrivals: ``(m, bounds, dts,
        waiting)`` with ``bounds[j]`` step j's start (sums in order, as step by step)."""
        ctx = self.sched.macro_context_sums(lim)
        dts = np.asarray(self._price(W, ctx), dtype=np.float64)
        if not (dts > 0).all():
            return None
        bounds = np.cumsum(np.concatenate(([now], dts)))  # bounds[j]: step j's start, in order
        arr, i0 = self.arrival_s, self._arr_i
        m = lim
        waiting = waiting0
        if i0 < len(arr):
            t_a = self._arr_t
            starts = bounds[:lim]
            # An arrival at the very time a stretch ends is a tie between two timeouts, which
            # SimPy breaks by creation: step by step, the engine's was created at the last
            # step's start; the stretch's is older (its first step's start), so it could go
            # first where step by step the arrival does. A stretch therefore ends one step
            # before such a tie, and that step takes the full path.
            if not blocked:  # the first step starting at or after the arrival admits it
                m = int(np.searchsorted(starts, t_a, side="left"))
                if m and bounds[m] == t_a:
                    m -= 1
            else:  # arrivals only join the queue: count them per step
                hi = i0 + int(np.searchsorted(arr[i0:], bounds[lim] * (1 + 1e-12), side="right"))
                a = arr[i0:hi].copy()
                if len(a):
                    a[0] = t_a
                left = np.searchsorted(a, starts, side="left")
                # later arrivals fire at their time up to an ulp (SimPy adds the delay to the
                # previous arrival's time): a step boundary that close to one is a tie
                near = (np.searchsorted(a, bounds * (1 - 1e-12), side="left")
                        != np.searchsorted(a, bounds * (1 + 1e-12), side="right"))
                if near.any():
                    m = max(int(np.argmax(near)) - 1, 0)
                waiting = waiting + left[:m]
        return m, bounds.tolist(), dts, waiting

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
        try:
            getattr(self.sched, "check", lambda: None)()
        except AssertionError as e:
            raise InvariantError(f"t={now:.6f}: scheduler inconsistent: {e}") from None

    def run(self) -> None:
        if self.on_core:
            from pagesim.sim.core import replay

            replay.run(self)
            return
        try:  # imported here: the core path, and modules that only import this one, need no simpy
            import simpy
        except ImportError:
            raise PagesimError("the Python engine (this configuration's path, and pagesim validate) needs "
                               "simpy: pip install simpy") from None
        env = simpy.Environment()
        env.process(self.arrivals(env))
        env.process(self.engine(env))
        t0 = time.perf_counter()
        env.run()
        self.wall_time_s = time.perf_counter() - t0
