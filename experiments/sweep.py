"""The executors: :func:`run_sweep` runs a list of :class:`~experiments.run_spec.RunSpec`, the
runs missing from the run cache (``experiments/run_cache.py``), locally (a shared
``ProcessPoolExecutor``) or on Ray, and returns their summaries in spec order; apart from
``wall_time_s`` (kept in the cache's ``meta.json``) they are byte-identical whatever the worker
count.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import os
import threading
import time
from pathlib import Path
from typing import Any

from pagesim.experiments.run_cache import (RunOutput, cache_path, command_tally, default_cache_dir, entry_lacks,
                                           normalize_output, read_cached_summary, runner_name, write_cache)
from pagesim.experiments.run_spec import RunFn, RunSpec, simulate_spec
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from pagesim.sim.terminal import bar_columns
from pagesim.traces.synth import make_workload


#: the tables a run's cache entry keeps by default (``run_sweep``'s ``tables``)
ALL_TABLES = ("steps", "requests")


def _execute(spec: RunSpec, run_fn: RunFn, tables: tuple[str, ...] = ALL_TABLES) -> RunOutput:
    t0 = time.perf_counter()
    out = normalize_output(run_fn(spec), tables)
    dropped = [name for name in ALL_TABLES if name not in tables]  # nobody downstream reads them
    for name in dropped:  # not stored (and a SimResult's request table is never built)
        setattr(out, name, None)
    if dropped:
        out.meta["dropped_tables"] = dropped  # run_cache.entry_lacks
    out.meta.setdefault("wall_time_s", time.perf_counter() - t0)
    out.meta["label"] = spec.label()
    return out


def _execute_and_store(spec: RunSpec, run_fn: RunFn, cache_dir: Path, key: str, replace: bool,
                       tables: tuple[str, ...]) -> RunOutput:
    """A pool worker's job: run ``spec`` and store its cache entry there, so that the workers
    write their entries side by side and the step tables (up to ~100 MB for a 1-hour run) never
    travel back through the pool's pipe; returns the summary and meta only."""
    out = _execute(spec, run_fn, tables)
    write_cache(cache_dir, key, spec, out, replace=replace)
    return RunOutput(summary=out.summary, meta=out.meta)


def run_sweep(specs: list[RunSpec], executor: str = "local", workers: int | None = None,
              cache_dir: str | Path | None = None, progress: bool = True, address: str | None = None,
              *, run_fn: RunFn | None = None, use_cache: bool = True,
              tables: tuple[str, ...] = ALL_TABLES) -> list[dict[str, Any]]:
    """Run ``specs`` and return their summaries in spec order.

    executor: ``"local"`` (a ``ProcessPoolExecutor``; ``workers=1`` runs in this process) or
        ``"ray"`` (joins ``address`` when given, else starts or reuses a local Ray).
    workers: parallel runs (default ``min(os.cpu_count(), runs to do)``).
    cache_dir: where finished runs are stored (default :func:`default_cache_dir`); runs found there
        are not rerun. ``use_cache=False`` reruns everything and overwrites the entries.
    run_fn: ``spec -> SimResult-like | RunOutput | summary dict`` (default :func:`simulate_spec`);
        it must be picklable (a module-level function) unless ``workers=1``.
    tables: the run's tables its cache entry keeps (``steps``, ``requests``); a figure that reads
        only steps stores no request table (hundreds of MB for ``reproduce all``). A sweep that
        needs a table an entry lacks reruns that run and replaces the entry.
    """
    if executor not in ("local", "ray"):
        raise ConfigError(f"unknown executor '{executor}'; valid: local, ray")
    if address is not None and executor != "ray":  # a Ray cluster's address, which the local executor ignores
        raise ConfigError(f"--address {address} is a Ray cluster's: give --executor ray with it")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    runner = runner_name(run_fn)  # None for the default run function
    run_fn = run_fn or simulate_spec
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache_dir.exists() and not cache_dir.is_dir():  # (else each run's entry names a path below a file)
        raise ConfigError(f"--cache-dir {cache_dir}: exists and is not a folder")
    keys = [s.key(runner=runner) for s in specs]
    results: list[dict[str, Any] | None] = [None] * len(specs)
    todo: dict[str, list[int]] = {}  # key -> indices (identical specs run once)
    replace: set[str] = set()  # entries to overwrite: all with use_cache=False, else those short of tables
    tally = command_tally()  # a command's --no-cache reruns each run once, whatever its later sweeps say
    for i, k in enumerate(keys):
        reuse = k in tally.computed if tally is not None and tally.recompute else use_cache
        cached = read_cached_summary(cache_dir, k, tables) if reuse else None
        if cached is not None:
            results[i] = cached
            if tally is not None:
                tally.answered.setdefault(cache_dir, set()).add(k)
        else:
            todo.setdefault(k, []).append(i)
            if not reuse or entry_lacks(cache_path(cache_dir, k), tables):
                replace.add(k)

    bar = _progress_bar(len(specs), len(specs) - sum(len(v) for v in todo.values()), progress and bool(todo))

    def finish(key: str, out: RunOutput, stored: bool = False) -> None:
        if not stored:
            write_cache(cache_dir, key, specs[todo[key][0]], out, replace=key in replace)
        for i in todo[key]:
            results[i] = out.summary
        if tally is not None:
            tally.computed.add(key)
        bar.update(len(todo[key]))
        bar.set_postfix_str(out.meta.get("label", ""), refresh=False)

    try:
        if todo:
            n = 1 if _IN_WORKER else workers or min(os.cpu_count() or 1, len(todo))
            if executor == "ray":
                _run_ray(todo, specs, run_fn, n, address, finish, tables)
            elif n == 1 or len(todo) == 1:
                for key, idx in todo.items():
                    finish(key, _execute(specs[idx[0]], run_fn, tables))
            else:
                _run_pool(todo, specs, run_fn, n, finish, cache_dir, replace, tables)
    finally:
        bar.close()
    return results  # type: ignore[return-value]


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, disable=not enabled, unit="run", desc="sweep",
                ncols=bar_columns(), leave=True)


_POOL: list = []  # (workers, ProcessPoolExecutor): one pool serves every sweep of a process
#: this process is a pool's worker (:func:`end_with_parent`): a sweep it makes (a figure's tables built
#: on a worker, ``map_local``, probing a knee again) runs its runs itself, for the pool it inherited
#: by its fork is its parent's, whose manager thread is not in it: a run submitted there never ends
_IN_WORKER = False


def _shared_pool(n: int, specs: list[RunSpec] = ()) -> cf.ProcessPoolExecutor:
    """A pool of ``n`` worker processes, kept for the next sweep: ``reproduce all`` runs five
    figures' sweeps, and each new pool's workers would import pagesim and load the compiled
    core again (about a second each). The core's loops ``specs`` run (the default system's
    without) are compiled first, once each (:func:`warm_up_core`), and loaded from numba's cache by
    every worker."""
    wanted = [family for family in _families(specs) if family not in _WARMED]
    if not (_POOL and _POOL[0][0] == n):
        _drop_pool(wait=True)
        if n > 1 and len(wanted) == 1:  # in this process: the workers forked after it have it loaded
            warm_up_core(wanted)
            wanted = []
        _POOL.append((n, cf.ProcessPoolExecutor(max_workers=n, initializer=end_with_parent,
                                                initargs=(os.getpid(),))))
    if n > 1 and wanted:
        warm_up_core(wanted, _POOL[0][1])
    return _POOL[0][1]


_WARMED: set = set()  # the scheduler families compiled (or found compiled) for this process's pool


def _families(specs: list[RunSpec]) -> list[int]:
    """The scheduler families (``sim/core/compile/families.py``: each a compiled loop) ``specs`` run, in
    order of first appearance; the default system's without specs (a spec that is not a valid
    configuration is left to its run to report)."""
    families: dict[int, None] = {}
    for spec in specs:
        try:
            families.setdefault(spec.sim_config().family, None)
        except ConfigError:
            continue
    return list(families) or [SimConfig().family]


#: how often a worker looks whether its parent still runs (seconds)
PARENT_WATCH_S = 1.0


def end_with_parent(parent: int) -> None:
    """A pool worker's start: it ends when the process that made the pool does. Killed outright
    (SIGKILL), the parent runs no exit handler, and its workers would wait for work forever; an
    orphan is handed to another parent, which a thread of each worker notices within
    :data:`PARENT_WATCH_S`. It runs its own sweeps' runs itself (:data:`_IN_WORKER`)."""
    global _IN_WORKER
    _IN_WORKER = True
    _POOL.clear()  # (its parent's pool, copied by the fork: not one this process can submit to)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_WATCH_S)
        os._exit(1)

    threading.Thread(target=watch, name="pagesim-parent-watch", daemon=True).start()


def map_local(fn, items: list, workers: int | None) -> list:
    """``[fn(x) for x in items]``, side by side on the shared pool of local workers (in this
    process with one worker): ``reproduce all`` builds its figures' tables from the run cache
    at once (``fn`` and ``items`` must pickle)."""
    n = workers or min(os.cpu_count() or 1, len(items))
    if n <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    pool = _shared_pool(n)
    return [f.result() for f in [pool.submit(fn, x) for x in items]]


def _drop_pool(wait: bool) -> None:
    while _POOL:
        _POOL.pop()[1].shutdown(wait=wait, cancel_futures=not wait)


atexit.register(_drop_pool, True)


def warm_up_core(families: list[int] | None = None, pool: cf.ProcessPoolExecutor | None = None) -> float:
    """Compile the loops of scheduler ``families`` (default: the default system's) where numba's
    cache lacks them (once per install, about a minute each; the log says so, sim/core/events/replay.py),
    before the runs, so that the workers load them rather than each compiling the same: in this
    process, or with ``pool``, on its workers side by side (``pagesim reproduce fig2`` runs vLLM v0's
    and Orca's scheduler over paged memory and over contiguous extents, two families: on 2 cores
    their compiles take the time of one). Returns the seconds."""
    from pagesim.sim.precompile import families as system_of

    t0 = time.perf_counter()
    families = families if families is not None else _families([])
    of_family = system_of()
    systems = [of_family[family] for family in families]
    if pool is None:
        for system in systems:
            _warm_up(system)
    else:
        for done in [pool.submit(_warm_up, system) for system in systems]:
            done.result()
    _WARMED.update(families)
    return time.perf_counter() - t0


def _warm_up(system: str) -> None:
    """A small run of ``system``: its family's loop compiled, or loaded."""
    run_simulation(SimConfig.for_system(system), make_workload("sharegpt", rate=2, num_requests=4, seed=0))


def _run_pool(todo, specs, run_fn, n, finish, cache_dir, replace, tables) -> None:
    pool = _shared_pool(n, [specs[idx[0]] for idx in todo.values()])
    try:
        futures = {pool.submit(_execute_and_store, specs[idx[0]], run_fn, cache_dir, key, key in replace, tables): key
                   for key, idx in todo.items()}
        for fut in cf.as_completed(futures):
            finish(futures[fut], fut.result(), stored=True)
    except BaseException:
        # Ctrl-C or a failed run: drop queued runs now (finished ones are already cached)
        _drop_pool(wait=False)
        raise


def _run_ray(todo, specs, run_fn, n, address, finish, tables) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("executor 'ray' needs Ray: pip install 'pagesim[dist]' (or ray>=2.9), "
                          "or use --executor local") from None
    if not ray.is_initialized():
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=n, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    remote = ray.remote(_execute)
    pending = {remote.remote(specs[idx[0]], run_fn, tables): key for key, idx in todo.items()}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            finish(pending.pop(ref), ray.get(ref))

