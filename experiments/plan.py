"""Capacity planning: the highest request rate a system sustains under an SLO, the resources a
target rate needs, and what that costs (``pagesim plan``).

Every answer comes from full simulations ("probes") of one workload at different settings, run
through :func:`experiments.sweep.run_sweep` (local process pool or Ray, on-disk cache).

**Search.** :class:`BoundarySearch` finds the largest ``x`` that passes when passing is
monotone (passes below a threshold, fails above): bracket by multiplying the start value by 2
until a probe fails (or dividing by 2 until one passes, down to ``x_min``), then bisect until
``hi - lo <= rtol * lo``. The answer is ``lo``, the highest rate that *was simulated and passed*
(never an interpolation). With ``k`` free workers a round proposes ``k`` points at once
(speculative doublings while bracketing, a k-section while bisecting); searches of several
systems run in the same rounds. Probe count: about ``log2(answer / start) + log2(1 / rtol) + 2``
per search with one worker. Minimum KV memory is found with the same search over ``1 / kv_gib``.

**Workload at each rate.** Built-in workloads are regenerated at every probed rate with the same
seed and duration (default :data:`DEFAULT_DURATION_S` = 600 s of arrivals, which keeps a 4-system
plan to a few dozen short simulations); a ``--trace`` is rate-scaled with
:func:`traces.transform.scale_rate` (its mean rate ``(rows - 1) / span`` becomes the probed rate;
``--duration`` then keeps requests arriving in the first DURATION seconds).

**Passing ("meets the SLO").** A probe passes only if all of these hold:

* every request finished (none rejected, none unfinished);
* the system kept up: the drain time ``last finish - last arrival`` is at most
  ``max(keepup_frac * span, keepup_min_s)`` (defaults 5 % of the arrival span, at least 60 s):
  a queue that grows without bound leaves a backlog proportional to the trace length;
* the SLO: in p99 mode each given threshold bounds the p99 over finished requests (TTFT, TPOT,
  E2EL; ``normalized_latency`` bounds the *mean* end-to-end latency per output token, the vLLM
  paper's metric). In goodput mode (``goodput`` set) the same thresholds apply per request and
  the fraction of *all* requests meeting every one of them must be at least ``goodput``
  (rejected and unfinished requests count as misses). Requests with one output token have no
  TPOT and meet any TPOT threshold.

**Little's law check.** For every probe, over the window [first arrival, max(last finish, last
arrival)] of the admitted requests (rejected ones never enter the system): L = time-weighted
number of requests in the system (an event sweep over arrivals and finishes; unfinished requests
stay until the window's end), lambda = requests / window, W = mean end-to-end latency of finished
requests. ``littles_law_error = |L - lambda W| / L``; above :data:`LITTLE_TOL` (5 %) the point
gets a warning (it does when requests are left unfinished, or the records are inconsistent).

**Cost.** ``$ per 1M output tokens = gpu_hourly * tp * replicas / (output_throughput * 3600) * 1e6``
with ``output_throughput`` in tokens/s of the whole deployment at the sustainable rate.
:data:`GPU_HOURLY_USD` are *illustrative* on-demand cloud prices (late 2024 list prices rounded),
not quotes; pass ``dollars_per_gpu_hour`` for your own.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from experiments.sweep import RunOutput, RunSpec, load_cached, run_sweep
from sim.errors import ConfigError, PagesimError

DEFAULT_DURATION_S = 600.0
DEFAULT_START_RATE = 1.0
DEFAULT_MIN_RATE = 0.05
DEFAULT_MAX_RATE = 1000.0
DEFAULT_RTOL = 0.05
LITTLE_TOL = 0.05
KEEPUP_FRAC = 0.05
KEEPUP_MIN_S = 60.0

#: illustrative on-demand $/GPU-hour (not quotes; override with --dollars-per-gpu-hour)
GPU_HOURLY_USD = {"a100-40gb": 1.50, "a100-80gb": 2.00, "h100-80gb": 3.00, "h200-141gb": 4.00, "l40s": 1.00}

#: request columns a probe keeps (in the cache) for SLO evaluation
REQUEST_COLS = ["arrival_s", "finish_s", "status", "output_tokens", "ttft_s", "tpot_s", "e2el_s",
                "normalized_latency_s"]


class PlanInfeasible(PagesimError):
    """No probed setting meets the SLO; the message says what would."""


# --------------------------------------------------------------------------------------------
# SLO evaluation


@dataclass
class SLO:
    """Latency objectives in seconds; ``None`` means not constrained."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2el_p99_s: float | None = None
    normalized_latency_s: float | None = None  # mean s per output token (p99 mode)
    goodput: float | None = None  # fraction of requests meeting all thresholds (goodput mode)

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"SLO {k} must be a positive number, got {v}")
        if self.goodput is not None and self.goodput > 1:
            raise ConfigError(f"goodput is a fraction of requests in (0, 1], got {self.goodput}")
        if self.goodput is not None and not self.thresholds():
            raise ConfigError("--goodput needs at least one per-request threshold "
                              "(--slo-ttft-p99, --slo-tpot-p99, --slo-e2el-p99, --slo-normalized-latency)")

    def thresholds(self) -> dict[str, float]:
        """Per-request column -> threshold (s)."""
        m = {"ttft_s": self.ttft_p99_s, "tpot_s": self.tpot_p99_s, "e2el_s": self.e2el_p99_s,
             "normalized_latency_s": self.normalized_latency_s}
        return {k: v for k, v in m.items() if v is not None}

    def describe(self) -> str:
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2el_s": "E2EL", "normalized_latency_s": "normalized latency"}
        parts = []
        for col, v in self.thresholds().items():
            if self.goodput is None:
                what = "mean" if col == "normalized_latency_s" else "p99"
                unit = " s/token" if col == "normalized_latency_s" else " s"
                parts.append(f"{what} {names[col]} <= {v:g}{unit}")
            else:
                parts.append(f"{names[col]} <= {v:g} s")
        if self.goodput is not None:
            return f">= {100 * self.goodput:g} % of requests with " + " and ".join(parts)
        return " and ".join(parts) if parts else "no latency SLO (only: all requests finish and the system keeps up)"


def p99(values: Iterable[float]) -> float:
    """99th percentile (numpy's linear interpolation, as in summary.json) ignoring NaN; NaN if empty."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, 99)) if len(v) else float("nan")


def request_ok(requests: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: finished and within every per-request threshold (NaN TPOT counts as within)."""
    ok = np.array(requests["status"].astype(str) == "finished", dtype=bool)
    for col, thr in slo.thresholds().items():
        v = requests[col].to_numpy(dtype=float)
        ok = ok & np.where(np.isnan(v), col == "tpot_s", v <= thr)
    return ok


def littles_law(requests: pd.DataFrame) -> dict[str, float]:
    """Mean concurrency L (event sweep), lambda, W and the relative error |L - lambda W| / L."""
    r = requests[requests["status"].astype(str) != "rejected"]
    nan = float("nan")
    if len(r) == 0:
        return dict(L=nan, lam=nan, W=nan, littles_law_error=nan)
    a = r["arrival_s"].to_numpy(dtype=float)
    f = r["finish_s"].to_numpy(dtype=float)
    finished = (r["status"].astype(str) == "finished").to_numpy() & ~np.isnan(f)
    t0 = float(a.min())
    t1 = float(max(np.nanmax(f) if finished.any() else t0, a.max()))
    if t1 <= t0:
        return dict(L=nan, lam=nan, W=nan, littles_law_error=nan)
    leave = np.where(finished, f, t1)
    # event sweep: +1 at each arrival, -1 at each departure; integrate the count over time
    times = np.concatenate([a, leave])
    delta = np.concatenate([np.ones(len(a)), -np.ones(len(a))])
    order = np.lexsort((delta, times))  # departures first at equal times (no effect on the integral)
    times, delta = times[order], delta[order]
    count = np.cumsum(delta)
    L = float(np.sum(count[:-1] * np.diff(times)) / (t1 - t0))
    lam = len(r) / (t1 - t0)
    W = float(np.mean(f[finished] - a[finished])) if finished.any() else nan
    err = abs(L - lam * W) / L if L > 0 else (0.0 if lam * W == 0 else float("inf"))
    return dict(L=L, lam=lam, W=W, littles_law_error=float(err))


def evaluate_point(requests: pd.DataFrame, slo: SLO, *, keepup_frac: float = KEEPUP_FRAC,
                   keepup_min_s: float = KEEPUP_MIN_S) -> dict[str, Any]:
    """SLO metrics of one probe from its request table, and whether it passes (see module doc)."""
    status = requests["status"].astype(str)
    fin = (status == "finished").to_numpy()
    n = len(requests)
    out: dict[str, Any] = {
        "num_requests": n, "completed": int(fin.sum()), "rejected": int((status == "rejected").sum()),
        "unfinished": int(((status != "finished") & (status != "rejected")).sum()),
        "p99_ttft_s": p99(requests["ttft_s"][fin]), "p99_tpot_s": p99(requests["tpot_s"][fin]),
        "p99_e2el_s": p99(requests["e2el_s"][fin]),
        "mean_normalized_latency_s": float(np.nanmean(requests["normalized_latency_s"][fin])) if fin.any() else float("nan"),
    }
    out["goodput"] = float(request_ok(requests, slo).mean()) if n else float("nan")
    a = requests["arrival_s"].to_numpy(dtype=float)
    f = requests["finish_s"].to_numpy(dtype=float)
    span = float(a.max() - a.min()) if n else 0.0
    last_finish = float(np.nanmax(f)) if fin.any() else float("nan")
    out["drain_s"] = last_finish - float(a.max()) if fin.any() else float("nan")
    allowance = max(keepup_frac * span, keepup_min_s)
    out["kept_up"] = bool(fin.any() and out["drain_s"] <= allowance)
    out.update(littles_law(requests) if n else dict(L=float("nan"), lam=float("nan"), W=float("nan"),
                                                  littles_law_error=float("nan")))
    reasons = []
    if n == 0:
        reasons.append("no requests")
    if out["rejected"]:
        reasons.append(f"{out['rejected']} rejected")
    if out["unfinished"]:
        reasons.append(f"{out['unfinished']} unfinished")
    if fin.any() and not out["kept_up"]:
        reasons.append(f"fell behind (drain {out['drain_s']:.0f} s > {allowance:.0f} s)")
    if slo.goodput is not None:
        if not out["goodput"] >= slo.goodput:
            reasons.append(f"goodput {out['goodput']:.3f} < {slo.goodput:g}")
    else:
        checks = [("p99_ttft_s", slo.ttft_p99_s, "p99 TTFT"), ("p99_tpot_s", slo.tpot_p99_s, "p99 TPOT"),
                  ("p99_e2el_s", slo.e2el_p99_s, "p99 E2EL"),
                  ("mean_normalized_latency_s", slo.normalized_latency_s, "normalized latency")]
        for key, thr, name in checks:
            if thr is not None and not out[key] <= thr:
                reasons.append(f"{name} {out[key]:.3g} s > {thr:g} s")
    out["passed"] = not reasons
    out["fail_reason"] = "; ".join(reasons)
    return out


# --------------------------------------------------------------------------------------------
# the search


def _round_sig(x: float, sig: int = 4) -> float:
    if x <= 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{sig}g}")


class BoundarySearch:
    """The largest ``x`` in ``[x_min, x_max]`` that passes, for a pass/fail that is monotone
    (pass below a threshold). Propose points with :meth:`propose`, report with :meth:`record`."""

    def __init__(self, start: float, *, rtol: float = DEFAULT_RTOL, x_min: float = DEFAULT_MIN_RATE,
                 x_max: float = DEFAULT_MAX_RATE, grow: float = 2.0, max_probes: int = 60):
        if not 0 < x_min <= x_max:
            raise ConfigError(f"search range needs 0 < min <= max, got {x_min}..{x_max}")
        if not 0 < rtol < 1:
            raise ConfigError(f"relative tolerance must be in (0, 1), got {rtol}")
        if grow <= 1:
            raise ConfigError(f"grow factor must be > 1, got {grow}")
        self.start = min(max(float(start), x_min), x_max)
        self.rtol, self.x_min, self.x_max, self.grow, self.max_probes = rtol, x_min, x_max, grow, max_probes
        self.tried: dict[float, bool] = {}

    @property
    def hi(self) -> float | None:
        """Lowest failing x."""
        fails = [x for x, ok in self.tried.items() if not ok]
        return min(fails) if fails else None

    @property
    def lo(self) -> float | None:
        """Highest passing x below :attr:`hi`."""
        hi = self.hi
        ok = [x for x, p in self.tried.items() if p and (hi is None or x < hi)]
        return max(ok) if ok else None

    @property
    def infeasible(self) -> bool:
        return self.lo is None and self.hi is not None and self.hi <= self.x_min * (1 + 1e-9)

    @property
    def capped(self) -> bool:
        return self.hi is None and self.lo is not None and self.lo >= self.x_max * (1 - 1e-9)

    @property
    def done(self) -> bool:
        if len(self.tried) >= self.max_probes or self.infeasible or self.capped:
            return True
        lo, hi = self.lo, self.hi
        return lo is not None and hi is not None and hi - lo <= self.rtol * lo

    @property
    def answer(self) -> float | None:
        """The highest passing x (None when even ``x_min`` fails)."""
        return self.lo

    def propose(self, k: int = 1) -> list[float]:
        if self.done:
            return []
        k = max(1, int(k))
        lo, hi = self.lo, self.hi
        if lo is None and hi is None:
            xs = [self.start * self.grow ** i for i in range(k)]
        elif hi is None:
            xs = [lo * self.grow ** (i + 1) for i in range(k)]
        elif lo is None:
            xs = [hi / self.grow ** (i + 1) for i in range(k)]
        else:
            xs = [lo + (hi - lo) * (i + 1) / (k + 1) for i in range(k)]
        out = []
        for x in xs:
            x = _round_sig(min(max(x, self.x_min), self.x_max))
            if lo is not None and hi is not None and not lo < x < hi:
                continue
            if x not in self.tried and x not in out:
                out.append(x)
        if not out and lo is not None and hi is not None:
            out = [(lo + hi) / 2]  # rounding collapsed the k-section: use the exact midpoint
        return sorted(out)

    def record(self, x: float, passed: bool) -> None:
        self.tried[float(x)] = bool(passed)


def search_max(passes: Callable[[list[float]], list[bool]], start: float = DEFAULT_START_RATE, *,
               k: int = 1, **kw) -> BoundarySearch:
    """Run a :class:`BoundarySearch` to the end with ``passes(xs) -> [bool]`` (batches of ``k``)."""
    s = BoundarySearch(start, **kw)
    while True:
        xs = s.propose(k)
        if not xs:
            return s
        for x, ok in zip(xs, passes(xs)):
            s.record(x, ok)


# --------------------------------------------------------------------------------------------
# workloads and the run function

#: workload options of ``traces.args.add_workload_args`` that a probe's workload depends on
WORKLOAD_OPTS = ("workload", "trace", "format", "columns", "duration", "num_requests", "arrival", "cv",
                 "spread_timestamps", "time_slice", "sample", "n", "beam_width", "max_len_policy", "stop")


def _file_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def encode_workload(options: dict[str, Any]) -> str:
    """A workload description as a string for :attr:`RunSpec.workload` (part of the cache key):
    ``NAME`` or ``NAME?key=json&...`` with the non-default options; a trace adds its content hash."""
    opts = {k: v for k, v in options.items() if k in WORKLOAD_OPTS and v not in (None, False)}
    if opts.get("trace"):
        p = Path(opts["trace"])
        if not p.exists():
            raise ConfigError(f"{p}: trace file not found")
        opts["trace"] = str(p.resolve())
        opts["trace_sha"] = _file_digest(p)
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


def build_workload(workload: str, rate: float, seed: int, max_seq_len: int) -> tuple[pd.DataFrame, dict]:
    """The trace of one probe: the encoded workload at ``rate`` req/s (see module doc)."""
    from traces.args import workload_from_args
    opts = decode_workload(workload)
    opts.pop("trace_sha", None)
    opts.pop("stop", None)
    ns = argparse.Namespace(**{k: None for k in WORKLOAD_OPTS})
    ns.arrival, ns.cv, ns.max_len_policy, ns.spread_timestamps = "poisson", 1.0, "error", False
    ns.workload = "sharegpt"
    for k, v in opts.items():
        setattr(ns, k, v)
    ns.rate, ns.seed, ns.rate_scale = float(rate), int(seed), None
    return workload_from_args(ns, max_seq_len)


class _StopProbe(Exception):
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
    * goodput mode: more than ``(1 - goodput) N`` requests already miss a threshold.

    ``stop`` = ``{"ttft": s, "tpot": s, "e2el": s, "goodput": f}`` (missing/None: not checked).
    """

    def __init__(self, table, stop: dict[str, Any]):
        self.t = table
        self.stop = stop
        self.n = int(table.size)
        self.every = max(5, self.n // 200)
        self.since = 0
        self.reason: str | None = None
        self.now = 0.0

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
        g = self.stop.get("goodput")
        if g is not None:
            miss = int(np.logical_or.reduce(list(v.values())).sum())
            if miss > (1 - g) * self.n:
                return (f"{miss} of {self.n} requests already miss a threshold: goodput <= "
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
    if slo.goodput is None:
        d = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s, "e2el": slo.e2el_p99_s}
    else:
        d = {"ttft": slo.ttft_p99_s, "tpot": slo.tpot_p99_s, "e2el": slo.e2el_p99_s, "goodput": slo.goodput}
        if slo.normalized_latency_s is not None:  # a per-request criterion the watcher does not track
            d["goodput"] = None
    d = {k: v for k, v in d.items() if v is not None}
    if "goodput" not in d and slo.goodput is not None:
        return {"reject_only": True}
    return d or {"reject_only": True}


def _empty_requests() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=float) for c in REQUEST_COLS})


def run_point(spec: RunSpec) -> RunOutput:
    """The plan's run function: build the probe's workload, simulate (no per-step rows), keep the
    summary and the request columns the SLO needs. A configuration that cannot run (e.g. a KV pool
    smaller than one request for a contiguous manager) gives a summary with ``error``. When the
    encoded workload carries ``stop`` options, a :class:`ProbeWatcher` ends hopeless runs early
    (summary ``stopped_early`` = the reason)."""
    from sim.run import resolve_budget, run_simulation
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
    if stop:
        summary, requests = _run_watched(cfg, trace, stop)
    else:
        res = run_simulation(cfg, trace, progress=False)
        summary, requests = res.summary, res.requests
    req = requests[REQUEST_COLS].copy()
    req["status"] = req["status"].astype(str)
    return RunOutput(summary=summary, requests=req)


def _run_watched(cfg, trace: pd.DataFrame, stop: dict[str, Any]) -> tuple[dict, pd.DataFrame]:
    import time

    from sim.engine import Engine
    from sim.metrics import request_frame, summarize
    from sim.run import build
    model, gpu, budget, table, manager, sched, executor = build(cfg, trace)
    watcher = ProbeWatcher(table, {k: v for k, v in stop.items() if k != "reject_only"})
    engine = Engine(sched, manager, executor, table.arrival_s, record_steps=False, progress=watcher)
    t0 = time.perf_counter()
    stopped = None
    try:
        engine.run()
        end = engine.end_s
    except _StopProbe as e:
        stopped = str(e)
        end = watcher.now
    extra = {"system": cfg.system, "model": model.name, "gpu": gpu.name, "tensor_parallel": cfg.tensor_parallel,
             "kv_bytes_per_token": budget.kv_bytes_per_token, "seed": cfg.seed}
    summary = summarize(table, engine.rec, sched, duration_s=end, wall_time_s=time.perf_counter() - t0, extra=extra)
    if stopped:
        summary["stopped_early"] = f"stopped at t={end:.0f} s: {stopped}"
    return summary, request_frame(table)


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
        keys = [s.key(runner=_runner_key(self.run_fn)) for s in specs]
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

    def _point(self, spec: RunSpec, summ: dict, req: pd.DataFrame | None) -> dict[str, Any]:
        p: dict[str, Any] = {"system": spec.system, "rate": spec.rate}
        p.update({k: v for k, v in spec.sim.items() if k not in ("record_steps",)})
        if summ.get("error"):
            p.update(passed=False, fail_reason=summ["error"], error=summ["error"])
            return p
        if req is None:
            raise PagesimError(f"probe {spec.label()}: the cache holds no request table")
        p.update(evaluate_point(req, self.slo, keepup_frac=self.keepup_frac, keepup_min_s=self.keepup_min_s))
        if summ.get("stopped_early"):
            # metrics are those of the requests simulated so far; the verdict (fail) is certain
            p.update(passed=False, stopped_early=True, fail_reason=summ["stopped_early"],
                     littles_law_error=float("nan"))
        for k in ("request_throughput", "output_throughput", "total_token_throughput", "kv_capacity_tokens",
                  "avg_batch_size", "num_preemptions", "duration_s", "mem_token_states"):
            p[k] = summ.get(k)
        p["littles_law_ok"] = bool(p["littles_law_error"] <= LITTLE_TOL) if p["littles_law_error"] == p["littles_law_error"] else None
        return p


def _runner_key(run_fn) -> str | None:
    from experiments.sweep import _runner_name
    return _runner_name(run_fn)


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
        bar = tqdm(desc=desc, unit="probe", dynamic_ncols=True, leave=False)
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


# --------------------------------------------------------------------------------------------
# questions


@dataclass
class PlanSetup:
    """Everything the questions share: base SimConfig settings, workload, SLO, search options."""

    sim: dict[str, Any]  # SimConfig overrides shared by all systems (model, gpu, tensor_parallel, ...)
    workload: str  # encoded (see encode_workload)
    seed: int = 0
    start_rate: float = DEFAULT_START_RATE
    min_rate: float = DEFAULT_MIN_RATE
    max_rate: float = DEFAULT_MAX_RATE
    rtol: float = DEFAULT_RTOL
    duration_s: float | None = None
    early_stop: dict[str, Any] | None = None  # ProbeWatcher options (see early_stop_options)

    def spec(self, system: str, rate: float, *, full: bool = False, **sim: Any) -> RunSpec:
        """The probe of ``system`` at ``rate``; ``full=True``: never stopped early."""
        settings = {**self.sim, **sim, "record_steps": False}
        settings = {k: v for k, v in settings.items() if v is not None}
        workload = self.workload
        if self.early_stop and not full:
            workload += ("&" if "?" in workload else "?") + urllib.parse.urlencode(
                {"stop": json.dumps(self.early_stop, sort_keys=True)})
        return RunSpec(system=system, sim=settings, workload=workload, rate=float(rate),
                       duration_s=self.duration_s, seed=self.seed)

    def rate_search(self) -> BoundarySearch:
        return BoundarySearch(self.start_rate, rtol=self.rtol, x_min=self.min_rate, x_max=self.max_rate)


def check_fits(system: str, sim: dict[str, Any], seed: int = 0):
    """resolve_budget for this configuration (raises ConfigError if the model does not fit)."""
    from sim.config import SimConfig
    from sim.run import resolve_budget
    cfg = SimConfig.for_system(system, seed=seed, **{k: v for k, v in sim.items() if v is not None})
    return resolve_budget(cfg)


def gpu_hourly(gpu: str, override: float | None = None) -> float:
    if override is not None:
        if not override > 0:
            raise ConfigError(f"--dollars-per-gpu-hour must be > 0, got {override}")
        return float(override)
    from sim.specs import get_gpu
    name = get_gpu(gpu).name
    if name not in GPU_HOURLY_USD:
        raise ConfigError(f"no price preset for GPU '{name}'; give --dollars-per-gpu-hour")
    return GPU_HOURLY_USD[name]


def cost_per_million_tokens(gpu_hourly_usd: float, tp: int, replicas: int, output_throughput: float) -> float:
    """$ per 1M output tokens: ``gpu_hourly * tp * replicas / (output_throughput * 3600) * 1e6``
    (``output_throughput`` = tokens/s of the whole deployment); NaN without throughput."""
    if not output_throughput or output_throughput <= 0 or output_throughput != output_throughput:
        return float("nan")
    return gpu_hourly_usd * tp * replicas / (output_throughput * 3600.0) * 1e6


def _nan_last(v) -> float:
    return math.inf if v is None or v != v else float(v)


def _answer_point(task: SearchTask) -> dict | None:
    a = task.search.answer
    for p in task.points:
        if p["x"] == a:
            return p
    return None


def rerun_lowest_in_full(task: SearchTask, runner: Runner, make_full: Callable[[float], RunSpec]) -> None:
    """Replace the lowest probe of an infeasible search by a run that was not stopped early, so
    the hint can quote its real p99s."""
    if not task.points:
        return
    low = min(task.points, key=lambda p: p["x"])
    if not low.get("stopped_early"):
        return
    p = runner.evaluate([make_full(low["x"])])[0]
    p.update(search=task.name, x=low["x"])
    task.points[task.points.index(low)] = p


def infeasible_hint(task: SearchTask, slo: SLO) -> str:
    """Plain words: no rate meets the SLO, and what the lowest probed rate achieved."""
    if not task.points:
        return f"{task.name}: nothing was probed"
    lowest = min(task.points, key=lambda p: p["x"])
    msg = f"{task.name}: no rate down to {lowest['rate']:g} req/s meets the SLO ({slo.describe()})"
    ran = [p for p in task.points if not p.get("error")]
    if not ran:
        return f"{msg}: {lowest['error']}"
    needs = [f"at {lowest['rate']:g} req/s: {lowest['error']}"] if lowest.get("error") else []
    lowest = min(ran, key=lambda p: p["x"])
    r = lowest["rate"]
    names = [("p99_ttft_s", slo.ttft_p99_s, "TTFT"), ("p99_tpot_s", slo.tpot_p99_s, "TPOT"),
             ("p99_e2el_s", slo.e2el_p99_s, "E2EL"),
             ("mean_normalized_latency_s", slo.normalized_latency_s, "normalized-latency")]
    for key, thr, name in names:
        v = lowest.get(key)
        if thr is not None and v is not None and v == v and v > thr:
            needs.append(f"your {name} SLO must be >= {v:.3g} s (the {'mean' if 'normalized' in key else 'p99'} "
                         f"at {r:g} req/s)")
    if slo.goodput is not None and lowest.get("goodput", 0) < slo.goodput:
        needs.append(f"goodput at {r:g} req/s is {lowest['goodput']:.3f}: your goodput target must be <= that")
    if lowest.get("rejected"):
        needs.append(f"{lowest['rejected']} requests were rejected (too long for the KV pool or max_seq_len): "
                     "use more KV memory (--kv-gib, larger GPU, --tp) or --max-len-policy drop")
    if lowest.get("unfinished"):
        needs.append(f"{lowest['unfinished']} requests never finished")
    if not needs and lowest.get("fail_reason"):
        needs.append(lowest["fail_reason"])
    return msg + ": " + "; ".join(needs)


def _lightweight(points: list[dict]) -> list[dict]:
    keep = ("search", "system", "x", "rate", "passed", "fail_reason", "p99_ttft_s", "p99_tpot_s", "p99_e2el_s",
            "mean_normalized_latency_s", "goodput", "request_throughput", "output_throughput", "completed",
            "rejected", "unfinished", "drain_s", "kept_up", "littles_law_error", "littles_law_ok",
            "kv_capacity_tokens", "avg_batch_size", "num_preemptions", "kv_gib", "tensor_parallel", "gpu",
            "block_size", "max_num_seqs", "reservation", "chunked_prefill", "preemption", "error",
            "stopped_early")
    return [{k: _clean(p.get(k)) for k in keep if k in p} for p in points]


def _clean(v):
    if isinstance(v, (np.floating, float)):
        v = float(v)
        return None if math.isnan(v) or math.isinf(v) else v
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/inf as None, numpy scalars as Python ones, tuples as lists (for strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return _clean(obj)


def _little_warnings(points: list[dict]) -> list[str]:
    out = []
    for p in points:
        e = p.get("littles_law_error")
        if e is not None and e == e and e > LITTLE_TOL:
            out.append(f"Little's law off by {100 * e:.1f} % (> {100 * LITTLE_TOL:g} %) for {p['search']} at "
                       f"rate {p['rate']:g}" + (f": {p['fail_reason']}" if p.get("fail_reason") else ""))
    return out


def max_rate(setup: PlanSetup, systems: Sequence[str], runner: Runner, *,
             dollars_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """The highest rate meeting the SLO for each system; the whole curve of probes."""
    fits = {s: check_fits(s, setup.sim, setup.seed) for s in systems}  # ConfigError if it does not fit
    tasks = [SearchTask(s, setup.rate_search(), lambda x, s=s: setup.spec(s, x)) for s in systems]
    run_searches(tasks, runner)
    gpu = setup.sim.get("gpu") or "a100-40gb"
    tp = int(setup.sim.get("tensor_parallel") or 1)
    price = gpu_hourly(gpu, dollars_per_gpu_hour)
    answers, infeasible, points = [], {}, []
    for t in tasks:
        points += t.points
        best = _answer_point(t)
        _model, _gpu, budget = fits[t.name]
        row = {"system": t.name, "max_rate_rps": t.search.answer, "probes": len(t.points),
               "kv_capacity_tokens": budget.capacity_tokens, "kv_gib": budget.kv_bytes / (1 << 30),
               "capped": t.search.capped}
        if best is not None:
            row.update({k: best.get(k) for k in ("p99_ttft_s", "p99_tpot_s", "p99_e2el_s", "goodput",
                                                   "request_throughput", "output_throughput")})
            row["gpu_hourly_usd"] = price * tp
            row["dollars_per_1m_output_tokens"] = cost_per_million_tokens(price, tp, 1, best["output_throughput"])
        else:
            rerun_lowest_in_full(t, runner, lambda x, s=t.name: setup.spec(s, x, full=True))
            infeasible[t.name] = infeasible_hint(t, runner.slo)
            row["note"] = infeasible[t.name]
        answers.append(row)
    return {"mode": "max-rate", "max_rate_rps": {t.name: _clean(t.search.answer) for t in tasks},
            "answers": [{k: _clean(v) for k, v in r.items()} for r in answers],
            "infeasible": infeasible, "points": _lightweight(points),
            "cost": {"gpu": gpu, "dollars_per_gpu_hour": price, "tensor_parallel": tp, "replicas": 1,
                     "illustrative_prices": dollars_per_gpu_hour is None},
            "warnings": _little_warnings(points), "num_simulated": runner.num_simulated}


def compare_gpus(setup: PlanSetup, gpus: Sequence[str], systems: Sequence[str], runner: Runner, *,
                 dollars_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """Per GPU (and system): KV capacity, max rate under the SLO, $ per 1M output tokens."""
    from sim.specs import get_gpu
    tp = int(setup.sim.get("tensor_parallel") or 1)
    tasks, fits, errors = [], {}, {}
    for g in gpus:
        gname = get_gpu(g).name
        sim = {**setup.sim, "gpu": gname}
        try:
            fits[gname] = check_fits(systems[0], {k: v for k, v in sim.items()}, setup.seed)
        except ConfigError as e:
            errors[gname] = str(e)
            continue
        for s in systems:
            tasks.append(SearchTask(f"{gname}/{s}", setup.rate_search(),
                                    lambda x, s=s, sim=sim: setup.spec(s, x, **sim)))
    if not tasks:
        raise ConfigError("the model fits none of the GPUs: " + "; ".join(f"{g}: {m}" for g, m in errors.items()))
    run_searches(tasks, runner, desc="compare-gpus")
    rows, points, infeasible = [], [], {}
    for t in tasks:
        gname, system = t.name.split("/", 1)
        points += t.points
        budget = fits[gname][2]
        price = gpu_hourly(gname, dollars_per_gpu_hour)
        best = _answer_point(t)
        row = {"gpu": gname, "system": system, "kv_capacity_tokens": budget.capacity_tokens,
               "kv_gib": budget.kv_bytes / (1 << 30), "max_rate_rps": t.search.answer,
               "dollars_per_gpu_hour": price, "tensor_parallel": tp}
        if best is not None:
            row.update(output_throughput=best.get("output_throughput"), p99_ttft_s=best.get("p99_ttft_s"),
                       p99_tpot_s=best.get("p99_tpot_s"),
                       dollars_per_1m_output_tokens=cost_per_million_tokens(price, tp, 1, best["output_throughput"]))
        else:
            rerun_lowest_in_full(t, runner, lambda x, s=system, g=gname: setup.spec(s, x, full=True,
                                                                                      **{**setup.sim, "gpu": g}))
            infeasible[t.name] = infeasible_hint(t, runner.slo)
            row["note"] = infeasible[t.name]
        rows.append(row)
    for g, m in errors.items():
        rows.append({"gpu": g, "system": ",".join(systems), "note": m})
    mr: dict[str, dict] = {}
    for r in rows:
        if r.get("max_rate_rps") is not None or "kv_capacity_tokens" in r:
            mr.setdefault(r["gpu"], {})[r["system"]] = _clean(r.get("max_rate_rps"))
    return {"mode": "compare-gpus", "max_rate_rps": mr, "gpus": [{k: _clean(v) for k, v in r.items()} for r in rows],
            "infeasible": infeasible, "does_not_fit": errors, "points": _lightweight(points),
            "warnings": _little_warnings(points), "num_simulated": runner.num_simulated,
            "illustrative_prices": dollars_per_gpu_hour is None}


#: what-if variants of ``plan resources``: (label, SimConfig overrides, applies to managers)
WHAT_IFS: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("block_size=8", {"block_size": 8}, ("paged",)),
    ("block_size=32", {"block_size": 32}, ("paged",)),
    ("max_num_seqs=64", {"max_num_seqs": 64}, ("contiguous", "paged", "vattention")),
    ("max_num_seqs=128", {"max_num_seqs": 128}, ("contiguous", "paged", "vattention")),
    ("reservation=max", {"reservation": "max"}, ("contiguous",)),
    ("reservation=pow2", {"reservation": "pow2"}, ("contiguous",)),
    ("reservation=oracle", {"reservation": "oracle"}, ("contiguous",)),
    ("chunked_prefill", {"chunked_prefill": True}, ("contiguous", "paged", "vattention")),
    ("preemption=swap", {"preemption": "swap"}, ("paged",)),
]


def what_if_variants(system: str, base: dict[str, Any], names: Sequence[str] | None = None) -> list[tuple[str, dict]]:
    """The applicable what-if variants for ``system`` (skipping ones equal to the base setting)."""
    from sim.config import SYSTEMS, SimConfig
    cfg = SimConfig.for_system(system, **{k: v for k, v in base.items() if v is not None})
    known = {n for n, _o, _m in WHAT_IFS}
    if names is not None:
        bad = [n for n in names if n not in known]
        if bad:
            raise ConfigError(f"unknown what-if variant(s) {', '.join(bad)}; valid: {', '.join(known)}")
    out = [("baseline", {})]
    for label, over, managers in WHAT_IFS:
        if names is not None and label not in names:
            continue
        if cfg.manager not in managers:
            continue
        if all(getattr(cfg, k) == v for k, v in over.items()):
            continue
        out.append((label, over))
    return out


def resources(setup: PlanSetup, rate: float, systems: Sequence[str], runner: Runner, *,
              tp_options: Sequence[int] = (1, 2, 4, 8), what_if: Sequence[str] | None = None,
              kv_max_gib: float = 512.0, dollars_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """For a target ``rate``: the minimum KV memory; replicas x TP and cost; the what-if table."""
    from sim.specs import GiB
    if not rate > 0:
        raise ConfigError(f"--rate must be > 0, got {rate}")
    gpu = setup.sim.get("gpu") or "a100-40gb"
    price = gpu_hourly(gpu, dollars_per_gpu_hour)
    base_tp = int(setup.sim.get("tensor_parallel") or 1)

    # 1) minimum KV memory at the target rate: search over y = 1 / kv_gib (pass for small y)
    kv_tasks, base_errors = [], {}
    for s in systems:
        try:
            _m, _g, budget = check_fits(s, setup.sim, setup.seed)
        except ConfigError as e:  # the model does not fit at the base TP: only replicas x TP can answer
            base_errors[s] = str(e)
            continue
        start = budget.kv_bytes / GiB
        kv_tasks.append(SearchTask(
            f"kv/{s}", BoundarySearch(1.0 / start, rtol=setup.rtol, x_min=1.0 / kv_max_gib, x_max=1.0 / 0.25),
            lambda y, s=s: setup.spec(s, rate, kv_gib=_round_sig(1.0 / y)), x_name="1/kv_gib"))

    # 2) replicas x TP: each TP degree's max rate per replica
    tp_tasks, tp_errors = [], {}
    for tp in tp_options:
        for s in systems:
            sim = {**setup.sim, "tensor_parallel": tp}
            sim.pop("kv_gib", None)
            try:
                check_fits(s, sim, setup.seed)
            except ConfigError as e:
                tp_errors[f"tp{tp}/{s}"] = str(e)
                continue
            tp_tasks.append(SearchTask(f"tp{tp}/{s}", setup.rate_search(),
                                       lambda x, s=s, sim=sim: setup.spec(s, x, **sim)))

    # 3) what-if variants: each one's max rate
    if not kv_tasks and not tp_tasks:
        raise ConfigError("the model fits none of the tried configurations: "
                          + "; ".join(f"{k}: {v}" for k, v in {**base_errors, **tp_errors}.items()))
    wi_tasks = []
    for s in systems:
        if s in base_errors:
            continue
        for label, over in what_if_variants(s, setup.sim, what_if):
            if label == "baseline" and base_tp in tp_options and "kv_gib" not in setup.sim:
                continue  # same as the tp task of this TP
            wi_tasks.append(SearchTask(f"{label}/{s}", setup.rate_search(),
                                       lambda x, s=s, over=over: setup.spec(s, x, **over)))
    run_searches(kv_tasks + tp_tasks + wi_tasks, runner, desc="resources")

    kv_rows = [{"system": s, "rate": rate, "note": msg} for s, msg in base_errors.items()]
    for t in kv_tasks:
        y = t.search.answer
        s = t.name.split("/", 1)[1]
        row = {"system": s, "rate": rate, "min_kv_gib": None if y is None else _round_sig(1.0 / y), "probes": len(t.points)}
        if y is None:
            row["note"] = f"no KV size up to {kv_max_gib:g} GiB meets the SLO at {rate:g} req/s"
        else:
            from sim.specs import get_model
            model = get_model(setup.sim.get("model") or "opt-13b")
            row["min_kv_tokens"] = int(row["min_kv_gib"] * GiB // model.kv_bytes_per_token(base_tp))
        kv_rows.append(row)

    # verification probes: one replica at rate / replicas, for throughput and cost
    rep_rows, verify = [], []
    for t in tp_tasks:
        tp = int(t.name.split("/", 1)[0][2:])
        s = t.name.split("/", 1)[1]
        r_star = t.search.answer
        row = {"system": s, "tensor_parallel": tp, "max_rate_per_replica_rps": r_star}
        if r_star is None:
            row["note"] = infeasible_hint(t, runner.slo)
        else:
            k = max(1, math.ceil(rate / r_star * (1 - 1e-9)))
            row.update(replicas=k, gpus=k * tp, rate_per_replica_rps=rate / k)
            verify.append((row, t.make_spec(_round_sig(rate / k))))
        rep_rows.append(row)
    if verify:
        pts = runner.evaluate([spec for _r, spec in verify])
        for (row, _spec), p in zip(verify, pts):
            row["verified"] = p["passed"]
            row["output_throughput_total"] = (p.get("output_throughput") or 0) * row["replicas"]
            row["dollars_per_hour"] = price * row["gpus"]
            row["dollars_per_1m_output_tokens"] = cost_per_million_tokens(
                price, row["tensor_parallel"], row["replicas"], row["output_throughput_total"])
    for name, msg in tp_errors.items():
        tp, s = name.split("/", 1)
        rep_rows.append({"system": s, "tensor_parallel": int(tp[2:]), "note": msg})
    feasible = [r for r in rep_rows if r.get("dollars_per_hour") is not None]
    cheapest = min(feasible, key=lambda r: (r["dollars_per_hour"], _nan_last(r.get("dollars_per_1m_output_tokens")),
                                                r["tensor_parallel"])) if feasible else None

    wi_rows = []
    by_name = {t.name: t for t in tp_tasks}
    for s in systems:
        base_task = by_name.get(f"tp{base_tp}/{s}")
        for t in [x for x in wi_tasks if x.name.endswith("/" + s)]:
            if t.name.startswith("baseline/"):
                base_task = t
        base_rate = base_task.search.answer if base_task else None
        if base_task is not None:
            wi_rows.append({"system": s, "variant": "baseline", "max_rate_rps": base_rate,
                            "meets_target": base_rate is not None and base_rate >= rate})
        for t in wi_tasks:
            label, sys_ = t.name.rsplit("/", 1)
            if sys_ != s or label == "baseline":
                continue
            a = t.search.answer
            wi_rows.append({"system": s, "variant": label, "max_rate_rps": a,
                            "meets_target": a is not None and a >= rate,
                            "vs_baseline": (a / base_rate) if a is not None and base_rate else None})
    all_tasks = kv_tasks + tp_tasks + wi_tasks
    points = [p for t in all_tasks for p in t.points]
    return {"mode": "resources", "rate": rate,
            "max_rate_rps": {t.name.split("/", 1)[1]: _clean(t.search.answer) for t in tp_tasks
                             if t.name.startswith(f"tp{base_tp}/")},
            "kv": [{k: _clean(v) for k, v in r.items()} for r in kv_rows],
            "replicas": [{k: _clean(v) for k, v in r.items()} for r in rep_rows],
            "cheapest": None if cheapest is None else {k: _clean(v) for k, v in cheapest.items()},
            "what_if": [{k: _clean(v) for k, v in r.items()} for r in wi_rows],
            "cost": {"gpu": gpu, "dollars_per_gpu_hour": price, "illustrative_prices": dollars_per_gpu_hour is None},
            "points": _lightweight(points), "warnings": _little_warnings(points),
            "num_simulated": runner.num_simulated}
