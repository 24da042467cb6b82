"""Running the core's loop (``loop.run``) to the end of a run, with what needs Python between
its calls: a progress hook, ``--check``'s invariants after every iteration, an executor outside
the core that runs each scheduled iteration (the GPU mode), the step table's growth, and the
run's errors in words. Everything the run measured stays in the state's arrays, where the
records and the summary read it (``sim/run.py``, ``sim/metrics.py``).

``summary['engine']`` says which ran: ``core`` (compiled by numba) or ``core-cpython`` (numba
missing: the same functions, interpreted).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import threading
import time

import numpy as np

from pagesim.sim.core import state
from pagesim.sim.core.compile import aot, jit
from pagesim.sim.core.events import loop
from pagesim.sim.core.compile.families import SCHEDULER_BY_ADDRESS
from pagesim.sim.core.compile.jit import COMPILED, compiled
from pagesim.sim.errors import InvariantError
from pagesim.sim.terminal import NOTICE_KEY

PROGRESS_EVERY = 4096  # finished requests between progress-bar updates
#: numba loads the compiled core from its cache in under a second; past this it is compiling, which
#: the log says while it happens
COMPILE_NOTICE_S = 2.0
#: CPU seconds a scheduler family's loop takes to compile cold on 2 cores (``benchmarks/compile_speed.py``),
#: a cluster's or disaggregated pools' loop a few more: what the notice tells the user to expect
FAMILY_COMPILE_S = 25
_NOTICE: list = []  # this process has had its turn at the notice
LOG = logging.getLogger(__name__)


class StopRun(Exception):
    """Raised by a run's progress hook to end the run where it stands (a plan's probe whose
    verdict is already certain: ``experiments/probe.py``), after the step that finished the
    reported requests, before the next is scheduled. The state keeps what was measured so far
    (the caller built it and reads it); ``wall_time_s`` is set on the way out."""

    wall_time_s = 0.0


def progress_every(progress) -> int:
    """Finished requests before the next report to ``progress``: its own ``due`` where it has
    one (a probe's watcher looks every so many), else :data:`PROGRESS_EVERY` (a progress bar)."""
    due = getattr(progress, "due", None)
    return PROGRESS_EVERY if due is None else max(1, int(due))


def engine_name() -> str:
    return "core" if COMPILED else "core-cpython"


def run(s: state.Core, executor=None, progress=None) -> tuple[state.Core, float]:
    """Run the simulation ``s`` describes to its end; returns the final state (the step table
    may have been grown into new arrays) and the wall time. ``executor``: one outside the core
    (``sim.executor.is_external``) runs and times every iteration; ``progress``: told how many
    requests finished (``update(k)``), may raise :class:`StopRun`."""
    c = s.count
    if progress is not None:
        s.config[state.PROGRESS_EVERY] = progress_every(progress)
    if executor is not None:
        executor.start(s)
    run_loop = compiled_entry(loop.run_for(s.config[state.SCHEDULER_KIND]), s)  # before the clock: the loop's time
    t0 = time.perf_counter()
    last_now = 0.0
    while True:
        code = run_loop(s)
        if code == loop.SCHEDULED:  # an executor outside the core runs the iteration and times it
            s.clock[state.STEP_S] = executor.step(s)
        elif code == loop.STEPPED:  # --check
            last_now = checked(s, last_now)
        elif code == loop.ROWS_FULL:  # grow the step table and go on
            s = grow_rows(s)
        elif code == loop.PROGRESS:
            report(progress, s, t0)
        else:
            break
    wall_time_s = time.perf_counter() - t0
    raise_for(code, s)
    require_every_request_ended([s])
    if progress is not None and c[state.NUM_FINISHED] > c[state.NUM_FINISHED_REPORTED]:
        report(progress, s, t0)
    if executor is not None:
        executor.finish(s)
    return s, wall_time_s


def raise_for(code: int, s: state.Core, where: str = "") -> None:
    """The run's error in words (InvariantError) for the loop's error codes; nothing for the others.
    ``where``: words put first (a cluster's replica)."""
    c = s.count
    if code == loop.EMPTY_POOL:
        head = int(s.waiting[c[state.WAITING_HEAD]])
        raise InvariantError(f"{where}request {head} waits for memory in an empty pool "
                             "(the manager should have answered NEVER)")
    if code == loop.NO_SCHEDULER:
        raise InvariantError(f"{where}the loop was run without its scheduler's address "
                             "(config[SCHEDULER_ADDRESS] is 0)")
    if code == loop.NOT_ADMITTED:
        head = int(s.waiting[c[state.WAITING_HEAD]])
        raise InvariantError(f"{where}request {head}'s KV has arrived and its admission was due, but the "
                             "scheduler admitted nothing")
    if code == loop.STALLED:
        raise InvariantError(f"{where}scheduler stalled with swapped requests and nothing running")
    if code == loop.NO_TOKEN:
        raise InvariantError(where + live_lock_message(float(s.clock[state.NOW]), int(c[state.STEPS_WITHOUT_TOKEN]),
                                                       int(c[state.WAITING_LEN]), int(c[state.SWAPPED_LEN]),
                                                       int(c[state.NUM_RUNNING]), int(c[state.NUM_PREEMPTIONS])))
    if code == loop.STEP_NOT_POSITIVE:
        raise InvariantError(f"{where}executor returned a non-positive step time")


def require_every_request_ended(states: list) -> None:
    """Every run ends with each request finished or rejected with a reason: a loop that ran out
    of events with requests still waiting, running or swapped (its scheduler found nothing it
    could schedule, and nothing was left to wake it) is an error naming them, not a quiet end.
    ``states``: the run's, or a cluster's replicas (sharing the request columns)."""
    total = len(states[0].arrival_s)
    ended = sum(int(s.count[state.NUM_FINISHED]) + int(s.count[state.NUM_REJECTED]) for s in states)
    if ended != total:
        waiting, running, swapped = (sum(int(s.count[k]) for s in states)
                                     for k in (state.WAITING_LEN, state.NUM_RUNNING, state.SWAPPED_LEN))
        raise InvariantError(f"the run ended with {total - ended} of {total} requests neither finished nor "
                             f"rejected ({waiting} waiting, {running} running, {swapped} swapped): the scheduler "
                             "found nothing it could schedule")


def grow_rows(s: state.Core) -> state.Core:
    """``s`` with its step table twice as long (the loop returned ROWS_FULL). The new tables are
    ``np.zeros`` (memory the OS hands over zeroed, touched only where rows are written) with the
    old rows copied in: the copy alone, not a concatenation of written zeros."""
    return s._replace(row_floats=doubled(s.row_floats), row_ints=doubled(s.row_ints))


def doubled(rows: np.ndarray) -> np.ndarray:
    """``rows`` followed by as many rows of zeros."""
    out = np.zeros((2 * len(rows), *rows.shape[1:]), rows.dtype)
    out[:len(rows)] = rows
    return out


def report(progress, s: state.Core, t0: float) -> None:
    """Tell the progress hook how many requests finished since it last heard; a hook that
    raises :class:`StopRun` ends the run here."""
    c = s.count
    try:
        progress.update(int(c[state.NUM_FINISHED] - c[state.NUM_FINISHED_REPORTED]))
    except StopRun as stop:
        stop.wall_time_s = time.perf_counter() - t0
        raise
    c[state.NUM_FINISHED_REPORTED] = c[state.NUM_FINISHED]
    s.config[state.PROGRESS_EVERY] = progress_every(progress)


_ENTRIES: dict = {}
_SAID_CPYTHON: list = []  # the notice that the core runs in CPython, said once a process


def compiled_entry(fn, *args):
    """``fn``'s machine code for the types of ``args`` (a state; or the cluster loop's replicas
    and arrays), to call directly: the extension module built ahead of time where it holds
    ``fn`` (``aot.py``: no numba compiler in the process), else numba's. numba's dispatcher
    works out the types of the state's ~60 arrays at every call (1-3 ms), and the loop returns
    at every progress report (a plan probe's watcher hears up to a few hundred times a run),
    so the entry is kept per array kinds (what numba's types of arrays depend on), and a
    sweep's hundreds of runs type a state once. The step table grown on ROWS_FULL keeps its
    types. ``fn`` itself without numba."""
    if not COMPILED:
        if not _SAID_CPYTHON and importlib.util.find_spec("numba") is None:
            _SAID_CPYTHON.append(True)
            LOG.info("numba is not installed: the simulator's core runs in CPython, tens of times slower "
                     "(pip install numba)")
        return fn
    kinds = tuple(array_kind(a) for a in args)
    key = (getattr(fn, "py_func", fn), *kinds)
    entry = _ENTRIES.get(key)
    which = aot.entry_of(fn)
    if entry is None:
        entry = aot.load(kinds, which) if which is not None else None
    if entry is None:  # loaded from numba's cache (or compiled) once
        dispatcher = compiled(fn)
        family = getattr(getattr(fn, "py_func", fn), "engine_family", None)  # a cluster's loop
        types = tuple(dispatcher.typeof_pyval(a) for a in args)
        misses = sum(dispatcher.stats.cache_misses.values())  # numba compiles where its cache misses
        with compile_notice():
            if family is None and (which is None or not SCHEDULER_BY_ADDRESS[which[1]]):
                entry = functools.partial(_with_scheduler, dispatcher.compile(types), None, types[0])
            elif family is None:  # a family's loop: its scheduler's address set (loop.call_scheduler)
                scheduler = scheduler_address(which[1], args[0])
                entry = functools.partial(_with_scheduler, dispatcher.compile(types), scheduler, types[0])
            else:  # its replicas' loop passed by address, last (loop.call_engine), and their scheduler's set
                engine = engine_address(family, args[0][0])
                run_cluster = dispatcher.compile(types + (jit.numba.int64,))
                scheduler = scheduler_address(family, args[0][0]) if SCHEDULER_BY_ADDRESS[family] else 0
                entry = functools.partial(_with_engine, run_cluster, engine, scheduler, types[0].dtype)
        if which is not None:
            aot.build_in_background(args, kinds, which, compiled=sum(dispatcher.stats.cache_misses.values()) > misses)
    _ENTRIES[key] = entry
    return entry


def _with_scheduler(run, scheduler, state_type, s):
    """``run(s)``, its scheduler's address set (None: inlined) and the lazy functions' it may call
    (``jit.njit``'s ``lazy``), of numba's ``state_type``."""
    if scheduler is not None:
        s.config[state.SCHEDULER_ADDRESS] = scheduler
    jit.set_lazy_addresses(s, state_type)
    return run(s)


def _with_engine(run_cluster, engine, scheduler, state_type, *args):
    for s in args[0]:  # the replicas
        s.config[state.SCHEDULER_ADDRESS] = scheduler
        jit.set_lazy_addresses(s, state_type)
    return run_cluster(*args, engine)


def scheduler_address(family, s) -> int:
    """The address of the machine code of family ``family``'s scheduler entry
    (``loop.scheduler_entry_for``) for the types of state ``s`` (numba's, loaded from its cache or
    compiled), for its loop to call (``loop.call_scheduler``): alive as long as the entry's
    dispatcher, this process's."""
    dispatcher = compiled(loop.scheduler_of(family))
    types = loop.scheduler_signature(dispatcher.typeof_pyval(s))
    dispatcher.compile(types)
    return jit.address_of(dispatcher.overloads[types])


def engine_address(family, s) -> int:
    """The address of the machine code of family ``family``'s loop for the types of replica
    ``s`` (numba's, loaded from its cache or compiled), for a cluster's loop to call
    (``loop.call_engine``): alive as long as the loop's dispatcher, this process's."""
    dispatcher = compiled(loop.run_for(family))
    types = (dispatcher.typeof_pyval(s),)
    dispatcher.compile(types)
    return jit.address_of(dispatcher.overloads[types])


@contextlib.contextmanager
def compile_notice():
    """Around a load of compiled code from numba's cache: past ``COMPILE_NOTICE_S`` numba is
    compiling (once per machine and version), which the log says while it happens, then how long
    it took: once a command, however many families, loops and worker processes it compiles in
    (:func:`claims_notice`)."""
    t0 = time.perf_counter()
    said = []

    def say():
        if claims_notice():
            said.append(True)
            LOG.info("compiling the simulator's core with numba, once per machine and version: about %d s of CPU "
                     "for each scheduler family this command runs (later runs load it in under a second, and "
                     "the next one writes it into an extension module in the background)", FAMILY_COMPILE_S)

    notice = threading.Timer(COMPILE_NOTICE_S, say)
    notice.daemon = True
    notice.start()
    try:
        yield
    finally:
        notice.cancel()
    if said:
        LOG.info("compiled the simulator's core in %.0f s (numba's cache keeps it for later runs)",
                 time.perf_counter() - t0)


def claims_notice() -> bool:
    """Whether this process says the compile notice: the first time it asks, and where its command
    names a marker file (``NOTICE_KEY``, shared by the command's processes), only if it is the
    first of them to create it."""
    if _NOTICE:
        return False
    _NOTICE.append(True)
    marker = os.environ.get(NOTICE_KEY)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except OSError:  # an unwritable folder: said, perhaps twice
        return True
    return True


def array_kind(a):
    """What numba's type of ``a`` depends on: an array's dtype, dimensions, layout, and whether
    it is writeable and aligned; a state's, its fields'; a list's, its first item's (numba
    checks the others against it); any other field's type."""
    if isinstance(a, tuple):
        return tuple(array_kind(field) for field in a)
    if isinstance(a, list):
        return "list", array_kind(a[0]) if a else None
    if not isinstance(a, np.ndarray):
        return type(a)
    flags = a.flags  # numba's layout: C before F (an (n, 1) table is both), else any
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    return a.dtype.str, a.ndim, layout, flags.writeable, flags.aligned


def checked(s: state.Core, last_now: float) -> float:
    """``--check`` after an iteration: every invariant (sim/core/check.py) and time's order;
    returns the time checked."""
    from pagesim.sim.core import check  # only runs with --check load it (7 ms of every run's start)

    now = float(s.clock[state.NOW])
    if now < last_now:
        raise InvariantError(f"simulated time went backwards: {now} < {last_now}")
    try:
        check.check(s)
    except AssertionError as e:
        raise InvariantError(f"t={now:.6f}: core state inconsistent: {e}") from None
    return now


def live_lock_message(now: float, steps: int, waiting: int, swapped: int, running: int, preemptions: int) -> str:
    """The words for a run that stopped producing tokens (``lifecycle.steps_without_token_limit``)."""
    return (f"t={now:.6g} s: no request produced a token in {steps} iterations in a row ({waiting} waiting, "
            f"{swapped} swapped, {running} running, {preemptions} preemptions so far): the scheduler is "
            "live-locked; please report it with the command line")
