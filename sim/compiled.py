"""The compiled replay: the vLLM default configuration (and chunked prefill, swap) run in C,
with the same results as Python.

The Python engine (SimPy processes, :class:`~sim.sched.continuous.ContinuousScheduler`,
:class:`~sim.memory.paged.PagedManager`, the roofline cost model) is the specification and
runs everything. One configuration, the one most runs use, also has a compiled replay,
``sim/_replay.c``, built at install when a C compiler is there::

    scheduler  continuous, prefill-first or chunked prefill (no waiting_served_ratio),
               preemption by recompute or swap
    manager    paged (vllm, token: any block size), no prefix caching
    requests   one sequence each (n = beam_width = 1), prompt and output >= 1
    executor   simulated, roofline cost model; no --check

It replays the Python engine step by step: the same admissions, preemptions and finishes,
the same integer records, the same step times and time stamps bit for bit (SimPy's event
order and the cost model's floating-point operations are re-stated in order). Only running
sums differ, by float summation order (the mean inter-token latency and, with
``record_steps=False``, the time-weighted sums), as the Python engine's own macro steps do.
``tests/sim/test_compiled.py`` holds the two together.

``run_simulation(..., engine=...)`` and ``pagesim simulate --engine``: ``auto`` (the default)
takes the replay when the configuration is covered and the extension is built, else Python;
``compiled`` insists (and says why not); ``python`` never takes it. ``summary['engine']`` says
which ran.
"""

from __future__ import annotations

import time

import numpy as np

from sim.errors import ConfigError

try:
    from sim import _replay
except ImportError:  # built without a C compiler: every run takes the Python engine
    _replay = None

ENGINES = ("auto", "compiled", "python")
PROGRESS_EVERY = 4096  # finished requests between progress-bar updates
_MAX_BATCHED = 1 << 26  # keeps the prefill attention sum exact in any order (see _replay.c)

_EMPTY_POOL = 3
_DT = 2
_STALL = 5


def unsupported(engine) -> str | None:
    """Why ``engine`` (an :class:`~sim.engine.Engine`, not run yet) cannot take the compiled
    replay; None when it can."""
    from sim.cost import RooflineCostModel
    from sim.engine import SimulatedExecutor
    from sim.memory.paged import PagedManager, TokenManager
    from sim.sched.continuous import ContinuousScheduler

    sched, mgr, ex = engine.sched, engine.mgr, engine.executor
    if _replay is None:
        return "the compiled extension sim._replay is not built (no C compiler at install?)"
    if type(sched) is not ContinuousScheduler:
        return "only the continuous (vllm/orca) scheduler is compiled"
    if type(mgr) not in (PagedManager, TokenManager):
        return "only the paged manager (vllm, token) is compiled"
    if mgr.prefix_caching:
        return "prefix caching runs in Python"
    if sched.cfg.waiting_served_ratio is not None:
        return "waiting_served_ratio runs in Python"
    if type(ex) is not SimulatedExecutor or type(ex.cost_model) is not RooflineCostModel:
        return "only the simulated executor with the roofline cost model is compiled"
    if engine.check:
        return "--check runs in Python"
    if max(sched.max_batched, sched.budget, mgr.max_seq_len) >= _MAX_BATCHED:
        return f"a token budget or max_seq_len >= {_MAX_BATCHED} runs in Python"
    t = sched.t
    if t.size and (int(t.width.max()) > 1):
        return "parallel sampling and beam search run in Python"
    if t.size and (int(t.prompt.min()) < 1 or int(t.output.min()) < 1):
        return "zero-token prompts or outputs run in Python"
    if t.size and (t.status != 0).any():
        return "the request table has been run already"
    return None


def choose(engine, which: str, step_by_step: bool = False) -> bool:
    """Whether ``engine`` runs compiled, for ``which`` in :data:`ENGINES` (``step_by_step``:
    the Python reference path was asked for)."""
    if which not in ENGINES:
        raise ConfigError(f"unknown engine '{which}'; valid: {', '.join(ENGINES)}")
    if which == "compiled" and step_by_step:
        raise ConfigError("the compiled replay has no step-by-step mode (macro_steps=False is the Python reference)")
    if which == "python" or step_by_step:
        return False
    why = unsupported(engine)
    if which == "compiled" and why is not None:
        raise ConfigError(f"--engine compiled: {why}; use --engine auto or python")
    return why is None


def run(engine) -> None:
    """Run ``engine``'s whole simulation compiled, leaving the request table, scheduler,
    manager counters and step recorder as the Python engine leaves them."""
    from sim.engine import InvariantError

    sched, mgr, rec, cm = engine.sched, engine.mgr, engine.rec, engine.executor.cost_model
    t = sched.t
    # limits beyond any count a run reaches compare the same clamped to int64 (swap_gib=1e16)
    big = 1 << 62
    params = np.array([t.size, mgr.block_size, mgr.num_blocks, mgr.leftover, mgr.watermark_blocks,
                       mgr.max_seq_len, min(sched.max_num_seqs, big), sched.max_batched, int(rec.keep_rows),
                       PROGRESS_EVERY, int(sched.chunked), sched.budget, int(sched.swap),
                       min(sched.swap_capacity, big)], np.int64)
    cost = np.array(cm.constants(), np.float64)
    reject = np.zeros(t.size, np.int8)
    progress = engine.progress.update if engine.progress is not None else None
    t0 = time.perf_counter()
    r = _replay.replay(params, cost, np.ascontiguousarray(t.arrival_s), t.prompt, t.output,
                       sched.itl_edges, t.status, reject, t.generated, t.prefilled, t.target,
                       t.preemptions, t.first_token_s, t.finish_s, t.last_token_s, sched.itl_hist, progress)
    engine.wall_time_s = time.perf_counter() - t0
    if r["error"] == _EMPTY_POOL:
        raise InvariantError(f"request {r['waiting_head']} waits for memory in an empty pool "
                             "(the manager should have answered NEVER)")
    if r["error"] == _STALL:
        raise InvariantError("scheduler stalled with swapped requests and nothing running")
    if r["error"] == _DT:
        raise InvariantError("executor returned a non-positive step time")
    engine.end_s = r["end_s"]
    # the scheduler: counts, reasons, inter-token latencies (the histogram was filled in place)
    sched.num_preemptions = r["num_preemptions"]
    sched.num_swap_fallbacks = r["num_swap_fallbacks"]
    sched.num_rejected = r["num_rejected"]
    for i in np.flatnonzero(reject == 1).tolist():
        t.reject_reason[i] = sched.batched_reason(i)
    for i in np.flatnonzero(reject == 2).tolist():
        t.reject_reason[i] = sched.never_reason(i)
    sched.itl_sum += r["itl_sum"]
    sched.itl_count += r["itl_count"]
    # the manager ends empty (the run ends with nothing running); its counters
    assert r["used_blocks"] == 0 and r["num_running"] == 0, "compiled replay ended with memory in use"
    mgr.add_counts(allocations=r["allocations"], frees=r["frees"])
    # the recorder
    n = r["num_steps"]
    rec.idle_s += r["idle_s"]
    if rec.keep_rows:
        ri = np.frombuffer(r["rows_i"], np.int64).reshape(n, 13)  # bytearrays: no copy
        rec.take_rows(np.frombuffer(r["rows_f"], np.float64).reshape(n, 2), ri[:, :11], ri[:, 11:])
    else:
        rec.take_sums(n, r["busy_s"], r["mem_sum"], r["blk_sum"], r["running_weighted"],
                      r["prefill_tokens"], r["decode_tokens"])
