"""Running probes: the workload at each rate, the run function, early stop, and search rounds.

A probe is one full simulation of the plan's workload at one setting. This module turns a setting
into a :class:`~experiments.run_spec.RunSpec`, runs batches of them through
:func:`experiments.sweep.run_sweep` (local process pool or Ray, on-disk cache) with
:func:`run_point` as the run function, and turns each result into a point dict
(:class:`Runner`, verdict by :func:`experiments.slo.evaluate_point`).

**Workload at each rate.** The workload travels inside ``RunSpec.workload`` as a string
(:func:`encode_workload`), so it is part of the cache key and reaches worker processes without
pickling a trace. Built-in workloads are regenerated at every probed rate with the same seed and
duration (default :data:`DEFAULT_DURATION_S` = 600 s of arrivals, which keeps a 4-system plan to a
few dozen short simulations); a ``--trace`` is rate-scaled with :func:`traces.transform.scale_rate`
(its mean rate ``(rows - 1) / span`` becomes the probed rate; ``--duration`` then keeps requests
arriving in the first DURATION seconds). Two options serve the plan's checks
(:mod:`experiments.plan`): ``repeat=K`` replays a trace K times in a row
(:func:`traces.transform.repeat`), ``offline`` sets every arrival to 0.

**Early stop.** Most probes of a search fail, and a failing probe is often certain to fail long
before its last request finishes; :class:`ProbeWatcher` ends such runs early (see its docstring).
The options ride in the encoded workload (``stop=...``), so stopped and full runs are cached apart.

:func:`run_point` must stay a module-level function: it is pickled to the worker processes, and
its ``module:qualname`` is part of every probe's cache key (:func:`experiments.run_cache.runner_name`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (pandas is imported where a frame is built)
    import pandas as pd

from pagesim.experiments.run_cache import RunOutput, load_cached, runner_name
from pagesim.experiments.run_spec import RunSpec, file_digest, simulate_disaggregated
from pagesim.experiments.search import BoundarySearch
from pagesim.experiments.slo import KEEPUP_FRAC, KEEPUP_MIN_S, LITTLE_TOL, SLO, evaluate_point
from pagesim.experiments.sweep import run_sweep
from pagesim.sim.cluster import run_cluster
from pagesim.sim.metrics import SummaryOptions
from pagesim.sim.core.events import replay
from pagesim.sim.core.events.replay import StopRun
from pagesim.sim.errors import ConfigError, PagesimError
from pagesim.sim.run_memory import check_synthetic_workload
from pagesim.sim.run import prepare, resolve_budget, result, run_simulation
from pagesim.sim.terminal import bar_columns
from pagesim.traces import args as workload_args
from pagesim.traces import transform
from pagesim.traces.args import workload_from_args

#: seconds of arrivals per probe of a built-in workload given neither --duration nor --num-requests
DEFAULT_DURATION_S = 600.0

#: request columns a probe keeps (in the cache) for SLO evaluation
REQUEST_COLS = ["arrival_s", "finish_s", "status", "output_tokens", "ttft_s", "tpot_s", "e2el_s",
                "normalized_latency_s"]


# --------------------------------------------------------------------------------------------
# workloads and the run function

#: workload options of ``traces.args.add_workload_args`` that a probe's workload depends on
WORKLOAD_OPTS = ("workload", "trace", "format", "columns", "time_unit", "hash_block_tokens", "duration",
                 "num_requests", "arrival", "cv", "spread_timestamps", "time_slice", "sample", "n", "beam_width",
                 "max_len_policy", "stop", "repeat", "offline")


def encode_workload(options: dict[str, Any]) -> str:
    """A workload description as a string for :attr:`RunSpec.workload` (part of the cache key):
    ``NAME`` or ``NAME?key=json&...`` with the non-default options; a trace adds its content hash."""
    opts = {k: v for k, v in options.items() if k in WORKLOAD_OPTS and v not in (None, False)}
    if opts.get("trace"):
        p = Path(opts["trace"])
        if not p.exists():
            raise ConfigError(f"{p}: trace file not found")
        opts["trace"] = str(p.resolve())
        opts["trace_sha"] = file_digest(p)
        opts.pop("workload", None)
        name = "trace"
    else:
        name = opts.pop("workload", "sharegpt")
    defaults = {"arrival": "poisson", "cv": 1.0, "max_len_policy": "error"}
    opts = {k: v for k, v in sorted(opts.items()) if defaults.get(k, object()) != v}
    if not opts:
        return name
    return name + "?" + urllib.parse.urlencode({k: json.dumps(v, sort_keys=True) for k, v in opts.items()})


def decode_workload(s: str) -> dict[str, Any]:
    name, _, q = s.partition("?")
    opts = {k: json.loads(v) for k, v in urllib.parse.parse_qsl(q, keep_blank_values=True)}
    if name != "trace":
        opts["workload"] = name
    if isinstance(opts.get("time_slice"), list):
        opts["time_slice"] = tuple(opts["time_slice"])
    return opts


def describe_workload(s: str) -> str:
    """Human-readable form of an encoded workload: ``sharegpt (duration=600)``."""
    opts = decode_workload(s)
    opts.pop("trace_sha", None)
    opts.pop("stop", None)
    head = f"trace {opts.pop('trace')}" if "trace" in opts else opts.pop("workload", "sharegpt")
    rest = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in opts.items())
    return f"{head} ({rest})" if rest else head


def build_workload(workload: str, rate: float, seed: int, max_seq_len: int) -> "tuple[pd.DataFrame, dict]":
    """The trace of one probe: the encoded workload at ``rate`` req/s (see module doc). A
    synthetic workload too large for this machine's memory is a ConfigError (for a probe: a
    failed point whose reason says so)."""
    opts = decode_workload(workload)
    if "trace" not in opts:
        duration, count = opts.get("duration"), opts.get("num_requests")
        if duration is None and count is None:
            duration = workload_args.DEFAULT_DURATION_S
        check_synthetic_workload(rate, duration, count, what=f"a probe at {rate:g} req/s",
                                 advice="use a shorter --duration, fewer --num-requests or a lower --max-rate")
    opts.pop("trace_sha", None)
    opts.pop("stop", None)
    ns = argparse.Namespace(**{k: None for k in WORKLOAD_OPTS})
    ns.arrival, ns.cv, ns.max_len_policy, ns.spread_timestamps = "poisson", 1.0, "error", False
    ns.workload = "sharegpt"
    for k, v in opts.items():
        setattr(ns, k, v)
    ns.rate, ns.seed, ns.rate_scale = float(rate), int(seed), None
    df, info = workload_from_args(ns, max_seq_len, ns.max_len_policy)
    if opts.get("repeat"):  # the steadiness check's longer replay of a trace (PlanSetup.longer)
        df = transform.repeat(df, opts["repeat"])
    if opts.get("offline"):  # every request at once: the engine's offline saturation (plan.saturation)
        df = df.copy()
        df["arrival_s"] = 0.0
    return df, info


class _StopProbe(StopRun):
    pass


class ProbeWatcher:
    """Early stop of a probe that can no longer pass (plugged in as the engine's progress hook).

    Every ``every`` finished requests it looks at the request table at the current simulated time
    ``now`` (the latest finish) and stops the run when the verdict is already certain:

    * a request was rejected (a rejection always fails the probe);
    * p99 mode: at least ``m = N - floor(0.99 (N - 1))`` of the N requests already exceed the TTFT
      (resp. E2EL, TPOT) threshold, so the final p99 (numpy's linear interpolation) must exceed it.
      A request still without its first token at ``now`` counts once ``now - arrival`` exceeds the
      TTFT threshold (its TTFT can only be larger), likewise for unfinished requests and E2EL;
    * SLO-attainment mode: more than ``(1 - slo_attainment) N`` requests already miss a threshold.

    ``stop`` = ``{"ttft": s, "tpot": s, "e2el": s, "slo_attainment": f}`` (missing/None: not checked).
    """

    def __init__(self, table, stop: dict[str, Any]):
        self.t = table
        self.stop = stop
        self.n = int(table.size)
        self.every = max(5, self.n // 200)
        self.since = 0
        self.reason: str | None = None
        self.now = 0.0

    @property
    def due(self) -> int:
        """Finished requests until it next looks (the core reports to it exactly then)."""
        return self.every - self.since

    def update(self, k: int) -> None:
        self.since += k
        if self.since < self.every:
            return
        self.since = 0
        reason = self.verdict()
        if reason:
            self.reason = reason
            raise _StopProbe(reason)

    def violations(self) -> dict[str, np.ndarray]:
        t = self.t
        now = self.now = float(np.nanmax(t.finish_s)) if np.isfinite(t.finish_s).any() else 0.0
        arrived = t.arrival_s <= now
        a = t.arrival_s
        out: dict[str, np.ndarray] = {}
        with np.errstate(invalid="ignore", divide="ignore"):
            if self.stop.get("ttft"):
                ttft = np.where(np.isnan(t.first_token_s), now - a, t.first_token_s - a)
                out["TTFT"] = arrived & (ttft > self.stop["ttft"])
            if self.stop.get("e2el"):
                e2el = np.where(np.isnan(t.finish_s), now - a, t.finish_s - a)
                out["E2EL"] = arrived & (e2el > self.stop["e2el"])
            if self.stop.get("tpot"):
                tpot = np.where(t.output > 1, (t.finish_s - t.first_token_s) / (t.output - 1), np.nan)
                out["TPOT"] = ~np.isnan(t.finish_s) & (tpot > self.stop["tpot"])
        return out

    def verdict(self) -> str | None:
        t = self.t
        rejected = int((t.status == 5).sum())
        if rejected:
            return f"{rejected} request(s) rejected"
        v = self.violations()
        if not v:
            return None
        g = self.stop.get("slo_attainment")
        if g is not None:
            miss = int(np.logical_or.reduce(list(v.values())).sum())
            if miss > (1 - g) * self.n:
                return (f"{miss} of {self.n} requests already miss a threshold: SLO attainment <= "
                        f"{1 - miss / self.n:.3f} < {g:g}")
            return None
        m = self.n - math.floor(0.99 * (self.n - 1))
        for name, bad in v.items():
            c = int(bad.sum())
            if c >= m:
                return f"{c} of {self.n} requests already over the {name} threshold {self.stop[name.lower()]:g} s (p99 certainly above)"
        return None


def early_stop_options(slo: SLO) -> dict[str, Any] | None:
    """What :class:`ProbeWatcher` may check for ``slo`` (None if nothing)."""
    if slo.slo_attainment is None:
        d = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s, "e2el": slo.e2el_p99_s}
    else:
        d = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s, "e2el": slo.e2el_p99_s,
             "slo_attainment": slo.slo_attainment}
        if slo.normalized_latency_s is not None:  # a per-request criterion the watcher does not track
            d["slo_attainment"] = None
    d = {k: v for k, v in d.items() if v is not None}
    if "slo_attainment" not in d and slo.slo_attainment is not None:
        return {"reject_only": True}
    return d or {"reject_only": True}


def _empty_requests() -> "pd.DataFrame":
    import pandas as pd  # here: plan's parser imports this file

    return pd.DataFrame({c: pd.Series(dtype=float) for c in REQUEST_COLS})


def run_point(spec: RunSpec) -> RunOutput:
    """The plan's run function: build the probe's workload, simulate (no per-step rows), keep the
    summary and the request columns the SLO needs. A configuration that cannot run (e.g. a KV pool
    smaller than one request for a contiguous manager) gives a summary with ``error``. When the
    encoded workload carries ``stop`` options, a :class:`ProbeWatcher` ends hopeless runs early
    (summary ``stopped_early`` = the reason)."""
    cfg = spec.sim_config().replace(record_steps=False)
    try:
        model, _gpu, _budget = resolve_budget(cfg)
    except ConfigError as e:
        return RunOutput(summary={"error": str(e), "system": spec.system}, requests=_empty_requests())
    opts = decode_workload(spec.workload)
    stop = opts.get("stop")
    try:
        trace, _info = build_workload(spec.workload, spec.rate, spec.seed, model.max_seq_len)
    except ConfigError as e:  # e.g. no request arrives at a very low rate in a short duration
        return RunOutput(summary={"error": str(e), "system": spec.system}, requests=_empty_requests())
    if spec.disaggregated or spec.replicas != 1 or spec.router is not None:
        try:  # a cluster, aggregated or not, runs to its end (no early stop)
            if spec.disaggregated:
                res = simulate_disaggregated(spec, trace, SummaryOptions())
            else:
                res = run_cluster(cfg, trace, spec.replicas, spec.router or "round-robin")
        except ConfigError as e:
            return RunOutput(summary={"error": str(e), "system": spec.system}, requests=_empty_requests())
        summary, requests = res.summary, res.requests
    elif stop:
        summary, requests = _run_watched(cfg, trace, stop)
    else:
        res = run_simulation(cfg, trace, progress=False)
        summary, requests = res.summary, res.requests
    req = requests[REQUEST_COLS].copy()
    req["status"] = req["status"].astype(str)
    return RunOutput(summary=summary, requests=req)


def _run_watched(cfg, trace: "pd.DataFrame", stop: dict[str, Any]) -> "tuple[dict, pd.DataFrame]":
    """Run ``cfg`` over ``trace`` with a :class:`ProbeWatcher` as its progress hook: the core
    reports to it as the steps that finish its due requests end, and it stops the run once the
    verdict is certain (the summary then says where: ``stopped_early``)."""
    run = prepare(cfg, trace)
    watcher = ProbeWatcher(run.table, {k: v for k, v in stop.items() if k != "reject_only"})
    stopped = None
    try:
        s, wall_time_s = replay.run(run.state, progress=watcher)
        run = run._replace(state=s)
        end = None
    except _StopProbe as e:
        stopped, wall_time_s, end = str(e), e.wall_time_s, watcher.now
    outcome = result(cfg, run, wall_time_s, duration_s=end)
    if stopped:
        outcome.summary["stopped_early"] = f"stopped at t={end:.0f} s: {stopped}"
    return outcome.summary, outcome.requests


# --------------------------------------------------------------------------------------------
# running probes


@dataclass
class Runner:
    """How probes run: :func:`run_sweep` options, the SLO, and a memo of evaluated points."""

    slo: SLO
    executor: str = "local"
    workers: int | None = None
    cache_dir: str | Path | None = None
    address: str | None = None
    use_cache: bool = True
    progress: bool = False
    keepup_frac: float = KEEPUP_FRAC
    keepup_min_s: float = KEEPUP_MIN_S
    run_fn: Callable[[RunSpec], Any] = run_point
    memo: dict[str, dict] = field(default_factory=dict)
    num_simulated: int = 0

    @property
    def slots(self) -> int:
        return self.workers or os.cpu_count() or 1

    def evaluate(self, specs: Sequence[RunSpec]) -> list[dict[str, Any]]:
        """One point dict per spec (summary numbers + SLO evaluation), running what is not memoized."""
        keys = [s.key(runner=runner_name(self.run_fn)) for s in specs]
        todo = {k: s for k, s in zip(keys, specs) if k not in self.memo}
        if todo:
            todo_specs = list(todo.values())
            summaries = run_sweep(todo_specs, executor=self.executor, workers=self.workers,
                                  cache_dir=self.cache_dir, progress=False, address=self.address,
                                  run_fn=self.run_fn, use_cache=self.use_cache)
            self.use_cache = True  # a --no-cache plan reruns each probe once, then reuses it
            self.num_simulated += len(todo_specs)
            for k, spec, summ in zip(todo, todo_specs, summaries):
                cached = load_cached(spec, self.cache_dir, run_fn=self.run_fn, what=("requests",))
                req = cached.requests if cached is not None and cached.requests is not None else None
                self.memo[k] = self._point(spec, summ, req)
        return [dict(self.memo[k]) for k in keys]

    def requests(self, spec: RunSpec) -> "pd.DataFrame":
        """The request table of a probe already evaluated (:data:`REQUEST_COLS`, from the cache
        its run wrote)."""
        cached = load_cached(spec, self.cache_dir, run_fn=self.run_fn, what=("requests",))
        if cached is None or cached.requests is None:
            raise PagesimError(f"probe {spec.label()}: the cache holds no request table")
        return cached.requests

    def _point(self, spec: RunSpec, summ: dict, req: "pd.DataFrame | None") -> dict[str, Any]:
        p: dict[str, Any] = {"system": spec.system, "rate": spec.rate}
        p.update({k: v for k, v in spec.sim.items() if k not in ("record_steps",)})
        if summ.get("error"):
            p.update(passed=False, fail_reason=summ["error"], error=summ["error"])
            return p
        if req is None:
            raise PagesimError(f"probe {spec.label()}: the cache holds no request table")
        p.update(evaluate_point(req, self.slo, duration_s=summ.get("duration_s"), keepup_frac=self.keepup_frac,
                                keepup_min_s=self.keepup_min_s))
        if summ.get("stopped_early"):
            # metrics are those of the requests simulated so far; the verdict (fail) is certain
            p.update(passed=False, stopped_early=True, fail_reason=summ["stopped_early"],
                     littles_law_error=float("nan"))
        for k in ("request_throughput", "saturated_request_throughput", "output_throughput", "total_token_throughput",
                  "kv_capacity_tokens",
                  "avg_batch_size", "num_preemptions", "duration_s", "mem_token_states"):
            p[k] = summ.get(k)
        p["littles_law_ok"] = bool(p["littles_law_error"] <= LITTLE_TOL) if p["littles_law_error"] == p["littles_law_error"] else None
        return p


@dataclass
class SearchTask:
    """One search: its name (e.g. the system), the search, and ``x -> RunSpec``."""

    name: str
    search: BoundarySearch
    make_spec: Callable[[float], RunSpec]
    x_name: str = "rate"
    points: list[dict] = field(default_factory=list)


def run_searches(tasks: Sequence[SearchTask], runner: Runner, *, desc: str = "plan") -> None:
    """Advance every search in rounds; each round's probes (all tasks) run as one batch."""
    bar = None
    if runner.progress:
        from tqdm.auto import tqdm
        bar = tqdm(desc=desc, unit="probe", ncols=bar_columns(), leave=False)
    try:
        while True:
            active = [t for t in tasks if not t.search.done]
            if not active:
                break
            k = max(1, runner.slots // len(active))
            batch: list[tuple[SearchTask, float, RunSpec]] = []
            for t in active:
                for x in t.search.propose(k):
                    batch.append((t, x, t.make_spec(x)))
            if not batch:
                break
            points = runner.evaluate([spec for _t, _x, spec in batch])
            for (t, x, _spec), p in zip(batch, points):
                p["search"] = t.name
                p["x"] = x
                t.search.record(x, p["passed"])
                t.points.append(p)
            if bar is not None:
                bar.update(len(batch))
                bar.set_postfix_str(", ".join(f"{t.name}: {_bracket(t.search)}" for t in tasks), refresh=False)
    finally:
        if bar is not None:
            bar.close()


def _bracket(s: BoundarySearch) -> str:
    lo, hi = s.lo, s.hi
    return f"[{'-' if lo is None else f'{lo:.3g}'}, {'-' if hi is None else f'{hi:.3g}'})"
