"""Capacity planning: the highest request rate a system sustains under an SLO, the resources a
target rate needs, and what that costs (``pagesim plan``; the CLI is :mod:`experiments.plan_cli`).

Every answer comes from full simulations ("probes") of one workload at different settings, found
by a boundary search. The package, bottom up:

* :mod:`experiments.slo`: does one probe meet the SLO (p99 / SLO attainment, keeping up, Little's law);
* :mod:`experiments.search`: :class:`BoundarySearch`, the largest passing setting in few probes;
* :mod:`experiments.probe`: the workload at each rate, :func:`run_point` (the run function sent
  to :func:`experiments.sweep.run_sweep`), early stop, :class:`Runner` and :func:`run_searches`;
* this module: the questions (:func:`max_rate`, :func:`compare_gpus`, :func:`resources`), cost,
  and the shaping of their answers into JSON-ready dicts.

Each name is imported from the module that defines it; this one re-exports none of theirs.

Minimum KV memory is found with the same search over ``1 / kv_gib`` (:func:`resources`).

**Steadiness.** An answer found on a short workload can move with its length (near capacity the
queue grows through the run, so a short run ends before it hurts latency). :func:`check_steady`
replays each answer's neighbours, one tolerance either side, on a workload twice as long and
flags the answers that move by more than the tolerance.

**Cost.** ``$ per 1M output tokens = gpu_hourly * tp * replicas / (output_throughput * 3600) * 1e6``
with ``output_throughput`` in tokens/s of the whole deployment at the sustainable rate.
:data:`GPU_HOURLY_USD` are *illustrative* on-demand cloud prices (late 2024 list prices rounded),
not quotes; pass ``dollars_per_gpu_hour`` for your own.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from pagesim.experiments.probe import Runner, SearchTask, decode_workload, describe_workload, encode_workload, run_searches
from pagesim.experiments.run_spec import RunSpec
from pagesim.experiments.search import (DEFAULT_MAX_RATE, DEFAULT_MIN_RATE, DEFAULT_RTOL, DEFAULT_START_RATE,
                                        BoundarySearch, _round_sig)
from pagesim.experiments.slo import LITTLE_TOL, SLO
from pagesim.sim import systems
from pagesim.sim.config import SimConfig
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import resolve_budget
from pagesim.sim.specs import GiB, get_gpu, get_model

#: illustrative on-demand $/GPU-hour (not quotes; override with --dollars-per-gpu-hour)
GPU_HOURLY_USD = {"a100-40gb": 1.50, "a100-80gb": 2.00, "h100-80gb": 3.00, "h200-141gb": 4.00, "l40s": 1.00}


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
    steady_check: bool = True  # probe each answer's neighbours on a longer workload (check_steady)

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

    def offline(self) -> "PlanSetup":
        """The same plan with every request arriving at once, never stopped early: a probe's
        request throughput is then the engine's offline saturation on its requests."""
        opts = decode_workload(self.workload)
        opts.pop("trace_sha", None)
        return dataclasses.replace(self, workload=encode_workload({**opts, "offline": True}), early_stop=None)

    def longer(self, factor: float) -> "PlanSetup":
        """The same plan on a workload ``factor`` times as long: a built-in workload's
        ``duration`` (or, without one, ``num_requests``) times ``factor``; a trace replayed
        ``ceil(factor)`` times in a row (:func:`traces.transform.repeat`), since the file may hold
        no more than its ``--duration`` / ``--num-requests`` window already keeps."""
        opts = decode_workload(self.workload)
        opts.pop("trace_sha", None)
        if "trace" in opts:
            opts["repeat"] = math.ceil(factor) * (opts.get("repeat") or 1)
            return dataclasses.replace(self, workload=encode_workload(opts))
        if opts.get("duration") is not None:
            opts["duration"] = opts["duration"] * factor
        else:
            opts["num_requests"] = math.ceil(opts["num_requests"] * factor)
        duration = None if self.duration_s is None else self.duration_s * factor
        return dataclasses.replace(self, workload=encode_workload(opts), duration_s=duration)


def check_fits(system: str, sim: dict[str, Any], seed: int = 0):
    """resolve_budget for this configuration (raises ConfigError if the model does not fit)."""
    cfg = SimConfig.for_system(system, seed=seed, **{k: v for k, v in sim.items() if v is not None})
    return resolve_budget(cfg)


def gpu_hourly(gpu: str, override: float | None = None) -> float:
    if override is not None:
        if not override > 0:
            raise ConfigError(f"--dollars-per-gpu-hour must be > 0, got {override}")
        return float(override)
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
    if slo.slo_attainment is not None and lowest.get("slo_attainment", 0) < slo.slo_attainment:
        needs.append(f"SLO attainment at {r:g} req/s is {lowest['slo_attainment']:.3f}: your --slo-attainment "
                     "must be <= that")
    if lowest.get("rejected"):
        needs.append(f"{lowest['rejected']} requests were rejected (too long for the KV pool or max_seq_len): "
                     "use more KV memory (--kv-gib, larger GPU, --tp) or --max-len-policy drop")
    if lowest.get("unfinished"):
        needs.append(f"{lowest['unfinished']} requests never finished")
    if not needs and lowest.get("fail_reason"):
        needs.append(lowest["fail_reason"])
    return msg + ": " + "; ".join(needs)


#: the steadiness check replays the answer's neighbours on a workload this many times as long
STEADY_FACTOR = 2.0


def check_steady(checks: Sequence[tuple[SearchTask, Callable[[float], RunSpec]]],
                 runner: Runner) -> dict[str, dict[str, Any]]:
    """Is each search's answer ``a`` steady, i.e. would a longer workload give the same answer
    within the search's tolerance? Probes ``a / (1 + rtol)`` and ``a (1 + rtol)`` on a workload
    :data:`STEADY_FACTOR` times as long (``checks``: each task with ``x -> RunSpec`` on it). The
    longer run's answer lies within ``rtol`` of ``a`` when the lower probe passes and the upper
    one fails; otherwise the answer moves with the workload's length (a short trace ends before
    the queue it builds has hurt latency, or its few requests make a noisy p99). Returns, per
    task name, ``{"steady": bool, "note": str}`` (points outside the search's range are not
    probed; a task without an answer is left out)."""
    batch = []
    for task, make_spec in checks:
        s, a = task.search, task.search.answer
        if a is None:
            continue
        for side, x in (("low", _round_sig(a / (1 + s.rtol))), ("high", _round_sig(a * (1 + s.rtol)))):
            if s.x_min <= x <= s.x_max:
                batch.append((task, side, x, make_spec(x)))
    verdicts = {t.name: {"steady": True, "note": ""} for t, _m in checks if t.search.answer is not None}
    points = runner.evaluate([spec for *_x, spec in batch])
    for (task, side, x, _spec), p in zip(batch, points):
        answer, probe = _setting(task, task.search.answer), _setting(task, x)
        outcome = None
        if side == "low" and not p["passed"]:
            outcome = f"{probe} already fails ({p.get('fail_reason') or 'SLO missed'})"
        elif side == "high" and p["passed"] and verdicts[task.name]["steady"]:
            outcome = f"{probe} passes too"
        if outcome:
            verdicts[task.name] = {"steady": False, "note": (
                f"{task.name}: the answer {answer} is not steady: on a {STEADY_FACTOR:g}x longer workload {outcome}; "
                "it moves by more than --rtol with the workload's length: use a longer --duration")}
    return verdicts


#: rounds of :func:`cap_at_saturation`: a lower answer's own workload (fewer requests of a built-in
#: workload) may saturate lower still; after these the highest passing probe below is taken as is
SATURATION_ROUNDS = 4


def _floor_sig(x: float, sig: int = 4) -> float:
    """The largest ``sig``-digit number <= ``x`` (a search bound that never exceeds ``x``)."""
    if x <= 0 or not math.isfinite(x):
        return x
    step = 10.0 ** (math.floor(math.log10(x)) - sig + 1)
    y = float(f"{math.floor(x / step) * step:.{sig}g}")
    return y if y <= x else float(f"{(math.floor(x / step) - 1) * step:.{sig}g}")


def cap_at_saturation(tasks: Sequence[SearchTask], offline: Callable[[SearchTask, float], RunSpec],
                      runner: Runner) -> dict[str, dict[str, Any]]:
    """No rate above the engine's offline saturation is an answer. A finite workload can pass
    the SLO above it (it ends before the queue it builds reaches its p99), but past saturation
    the queue grows for as long as requests come. For each rate search with an answer ``a``:
    run ``a``'s requests all at once (``offline(task, a)``, :meth:`PlanSetup.offline`), whose
    request throughput while the engine is full (``saturated_request_throughput``,
    ``sim.metrics.saturated_throughput``: not its drain) is the saturation ``s``; when ``a > s``
    the search goes on below ``s``
    (the probes already run are kept) and the new answer is checked the same way, up to
    :data:`SATURATION_ROUNDS` rounds. Returns, per task name, ``{"saturation_rps": s or None,
    "note": str}`` (a note where an answer was lowered, or the saturation is unknown)."""
    out: dict[str, dict[str, Any]] = {}
    pending = [t for t in tasks if t.search.answer is not None]
    for round_ in range(SATURATION_ROUNDS + 1):
        if not pending:
            break
        points = runner.evaluate([offline(t, t.search.answer) for t in pending])
        lowered = []
        for t, p in zip(pending, points):
            a, sat = t.search.answer, p.get("saturated_request_throughput")
            note = out.get(t.name, {}).get("note", "")
            if p.get("error") or not sat or sat != sat:
                out[t.name] = {"saturation_rps": None, "note": note or (
                    f"{t.name}: the answer {a:g} req/s is not checked against the offline saturation: running "
                    f"its requests at once gave {p.get('error') or 'too few of them to keep the engine full'}")}
                continue
            if a <= sat:
                out[t.name] = {"saturation_rps": sat, "note": note}
                continue
            cap = _floor_sig(sat)
            out[t.name] = {"saturation_rps": sat, "note": (
                f"{t.name}: {a:g} req/s met the SLO but is above the offline saturation, {sat:.4g} req/s (its "
                "requests all at once): the workload ends before the queue it builds hurts; the answer is the "
                "highest rate up to the saturation")}
            old = t.search
            t.search = BoundarySearch(min(cap, old.start), rtol=old.rtol, x_min=min(old.x_min, cap), x_max=cap)
            t.search.tried = {x: ok for x, ok in old.tried.items() if x <= cap}
            lowered.append(t)
        if lowered and round_ < SATURATION_ROUNDS:
            run_searches(lowered, runner)
        pending = [t for t in lowered if t.search.answer is not None]
    return out


def _saturation_notes(saturation: dict[str, dict[str, Any]]) -> list[str]:
    return [v["note"] for v in saturation.values() if v["note"]]


def _setting(task: SearchTask, x: float) -> str:
    """A searched value in the user's words: a rate, or the KV size ``x = 1 / kv_gib`` stands for."""
    return f"{_round_sig(1.0 / x):g} GiB of KV" if task.x_name == "1/kv_gib" else f"{x:g} req/s"


def _lightweight(points: list[dict]) -> list[dict]:
    keep = ("search", "system", "x", "rate", "passed", "fail_reason", "p99_ttft_s", "p99_tpot_s", "p99_e2el_s",
            "mean_normalized_latency_s", "slo_attainment", "request_goodput", "request_throughput",
            "output_throughput", "completed",
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


def _steady_warnings(steady: dict[str, dict[str, Any]]) -> list[str]:
    return [v["note"] for v in steady.values() if not v["steady"]]


def _steady_summary(longer: PlanSetup | None) -> dict[str, Any]:
    """What the steadiness check did, for plan.json."""
    if longer is None:
        return {"done": False, "why": "--no-steady-check"}
    return {"done": True, "factor": STEADY_FACTOR, "workload": describe_workload(longer.workload)}


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
    offline = setup.offline()
    saturation = cap_at_saturation(tasks, lambda t, x: offline.spec(t.name, x), runner)
    longer = setup.longer(STEADY_FACTOR) if setup.steady_check else None
    steady = check_steady([(t, lambda x, s=t.name: longer.spec(s, x)) for t in tasks], runner) if longer else {}
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
               "capped": t.search.capped and t.search.x_max >= setup.max_rate,
               "saturation_rps": saturation.get(t.name, {}).get("saturation_rps"),
               "steady": steady.get(t.name, {}).get("steady")}
        if best is not None:
            row.update({k: best.get(k) for k in ("p99_ttft_s", "p99_tpot_s", "p99_e2el_s", "slo_attainment",
                                                   "request_goodput", "request_throughput", "output_throughput")})
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
            "steady_check": _steady_summary(longer),
            "warnings": _saturation_notes(saturation) + _steady_warnings(steady) + _little_warnings(points),
            "num_simulated": runner.num_simulated}


def compare_gpus(setup: PlanSetup, gpus: Sequence[str], systems: Sequence[str], runner: Runner, *,
                 dollars_per_gpu_hour: float | None = None) -> dict[str, Any]:
    """Per GPU (and system): KV capacity, max rate under the SLO, $ per 1M output tokens."""
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
    offline = setup.offline()
    saturation = cap_at_saturation(tasks, lambda t, x: offline.spec(
        t.name.split("/", 1)[1], x, **{**setup.sim, "gpu": t.name.split("/", 1)[0]}), runner)
    longer = setup.longer(STEADY_FACTOR) if setup.steady_check else None
    steady = check_steady([(t, lambda x, t=t: longer.spec(t.name.split("/", 1)[1], x,
                                                           **{**setup.sim, "gpu": t.name.split("/", 1)[0]}))
                           for t in tasks], runner) if longer else {}
    rows, points, infeasible = [], [], {}
    for t in tasks:
        gname, system = t.name.split("/", 1)
        points += t.points
        budget = fits[gname][2]
        price = gpu_hourly(gname, dollars_per_gpu_hour)
        best = _answer_point(t)
        row = {"gpu": gname, "system": system, "kv_capacity_tokens": budget.capacity_tokens,
               "kv_gib": budget.kv_bytes / (1 << 30), "max_rate_rps": t.search.answer,
               "dollars_per_gpu_hour": price, "tensor_parallel": tp,
               "saturation_rps": saturation.get(t.name, {}).get("saturation_rps"),
               "steady": steady.get(t.name, {}).get("steady")}
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
            "steady_check": _steady_summary(longer),
            "warnings": _saturation_notes(saturation) + _steady_warnings(steady) + _little_warnings(points),
            "num_simulated": runner.num_simulated, "illustrative_prices": dollars_per_gpu_hour is None}


#: what-if variants of ``plan resources``: (label, SimConfig overrides); each is tried on the
#: systems whose configuration takes it (sim/systems.py: where a setting applies, what a scheduler
#: refuses)
WHAT_IFS: list[tuple[str, dict[str, Any]]] = [
    ("block_size=8", {"block_size": 8}),
    ("block_size=32", {"block_size": 32}),
    ("max_num_seqs=64", {"max_num_seqs": 64}),
    ("max_num_seqs=128", {"max_num_seqs": 128}),
    ("reservation=max", {"reservation": "max"}),
    ("reservation=pow2", {"reservation": "pow2"}),
    ("reservation=oracle", {"reservation": "oracle"}),
    ("chunked_prefill", {"chunked_prefill": True}),
    ("preemption=swap", {"preemption": "swap"}),
    # vllm-v1's speculative decoding at its defaults (n-gram, acceptance 0.7: sim/core/sched/speculative.py)
    ("num_speculative_tokens=3", {"num_speculative_tokens": 3}),
]


def routed_replicas(runner: Runner, spec_of: Callable[[int], RunSpec], estimate: int,
                    max_replicas: int, refused: dict[int, str] | None = None) -> tuple[int | None, dict | None]:
    """The fewest replicas ``k`` whose cluster (``spec_of(k)``, the whole rate behind the router)
    meets the SLO, and its point (:func:`fewest`). A cluster the run refuses (its settings, not
    the SLO) ends the search upward: more replicas would be refused too, or for a reason of
    their own; ``refused`` collects each refused ``k`` and why."""
    refused = {} if refused is None else refused

    def passing(k: int) -> dict | None:
        if refused and k > min(refused):
            return None
        p = runner.evaluate([spec_of(k)])[0]
        if p.get("error"):
            refused[k] = str(p["error"])
        return p if p["passed"] else None

    return fewest(passing, estimate, max_replicas)


def fewest(passing: Callable[[int], dict | None], estimate: int, most: int,
           least: int = 1) -> tuple[int | None, dict | None]:
    """The fewest ``k`` in ``[least, most]`` for which ``passing(k)`` gives a point (None: it
    fails), and that point: from the ``estimate`` down while the next fewer passes, or up while
    it fails ((None, None) when none up to ``most`` passes). Assumes more never fail where fewer
    pass; each ``k`` is asked once."""
    points: dict[int, dict | None] = {}

    def passes(k: int) -> bool:
        if k not in points:
            points[k] = passing(k)
        return points[k] is not None

    k = max(least, min(estimate, most))
    if passes(k):
        while k > least and passes(k - 1):
            k -= 1
        return k, points[k]
    while k < most:
        k += 1
        if passes(k):
            return k, points[k]
    return None, None


def check_what_if_names(names: Sequence[str]) -> None:
    """ConfigError naming ``--what-if`` if a name is none of :data:`WHAT_IFS`'."""
    known = [n for n, _o in WHAT_IFS]
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"--what-if: unknown variant(s) {', '.join(bad)}; valid: all, none, or of {', '.join(known)}")


def what_if_variants(system: str, base: dict[str, Any], names: Sequence[str] | None = None) -> list[tuple[str, dict]]:
    """The applicable what-if variants for ``system`` (skipping ones equal to the base setting)."""
    cfg = SimConfig.for_system(system, **{k: v for k, v in base.items() if v is not None})
    if names is not None:
        check_what_if_names(names)
    out = [("baseline", {})]
    for label, over in WHAT_IFS:
        if names is not None and label not in names:
            continue
        if all(getattr(cfg, k) == v for k, v in over.items()) or not all(systems.applies(cfg, k) for k in over):
            continue
        try:
            cfg.replace(**over)
        except ConfigError:  # the system cannot run it (vllm-v1 and sglang: no swap preemption)
            continue
        out.append((label, over))
    return out


#: the smallest KV pool 'plan resources' searches (GiB)
SMALLEST_KV_GIB = 0.25
#: the tensor-parallel degrees 'plan resources' tries unless told (--tp-options)
DEFAULT_TP_OPTIONS = (1, 2, 4, 8)


def resources(setup: PlanSetup, rate: float, systems: Sequence[str], runner: Runner, *,
              tp_options: Sequence[int] = DEFAULT_TP_OPTIONS, what_if: Sequence[str] | None = None,
              kv_max_gib: float = 512.0, dollars_per_gpu_hour: float | None = None,
              router: str | None = None, max_replicas: int = 256) -> dict[str, Any]:
    """For a target ``rate``: the minimum KV memory; replicas x TP and cost; the what-if table.
    Replicas are ``ceil(rate / max rate of one replica)`` (rate/k: a router that splits the load
    perfectly), verified on one replica at rate / k; with ``router``, the fewest replicas behind
    that router (a cluster run at the whole rate, ``sim/cluster.py``) that meet the SLO, searched
    from the rate/k estimate (:func:`routed_replicas`), the estimate kept beside it."""
    if not rate > 0:
        raise ConfigError(f"--rate must be > 0, got {rate}")
    if not kv_max_gib >= SMALLEST_KV_GIB:
        raise ConfigError(f"--kv-max-gib must be at least {SMALLEST_KV_GIB:g} GiB, the smallest KV pool plan resources "
                          f"searches; got {kv_max_gib:g}")
    gpu = setup.sim.get("gpu") or "a100-40gb"
    price = gpu_hourly(gpu, dollars_per_gpu_hour)
    base_tp = int(setup.sim.get("tensor_parallel") or 1)

    # 1) minimum KV memory at the target rate: search over y = 1 / kv_gib (pass for small y)
    kv_tasks, base_errors, kv_caps, kv_notes = [], {}, {}, {}
    spec_on: dict[str, Callable[[PlanSetup, float], RunSpec]] = {}  # task -> (setup, x) -> its probe
    for s in systems:
        try:
            model, gpu_spec, budget = check_fits(s, setup.sim, setup.seed)
        except ConfigError as e:  # the model does not fit at the base TP: only replicas x TP can answer
            base_errors[s] = str(e)
            continue
        start = budget.kv_bytes / GiB
        # no more than the GPU holds beside the weights (a larger --kv-gib is refused: sim.specs.capacity)
        room = (gpu_spec.mem_bytes - model.weight_bytes / base_tp) / GiB
        if room < SMALLEST_KV_GIB:  # the KV search alone is not run: replicas x TP and the what-ifs are
            kv_notes[s] = (f"{gpu_spec.name} holds {room:.3g} GiB beside the weights, below the smallest KV pool "
                           f"searched ({SMALLEST_KV_GIB:g} GiB)")
            continue
        kv_caps[s] = (room, f"all {gpu_spec.name} holds beside the weights") if room < kv_max_gib else \
            (kv_max_gib, "--kv-max-gib")
        spec_on[f"kv/{s}"] = lambda stp, y, s=s: stp.spec(s, rate, kv_gib=_round_sig(1.0 / y))
        kv_tasks.append(SearchTask(
            f"kv/{s}", BoundarySearch(1.0 / start, rtol=setup.rtol, x_min=1.0 / kv_caps[s][0],
                                      x_max=1.0 / SMALLEST_KV_GIB),
            functools.partial(spec_on[f"kv/{s}"], setup), x_name="1/kv_gib"))

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
            spec_on[f"tp{tp}/{s}"] = lambda stp, x, s=s, sim=sim: stp.spec(s, x, **sim)
            tp_tasks.append(SearchTask(f"tp{tp}/{s}", setup.rate_search(),
                                       functools.partial(spec_on[f"tp{tp}/{s}"], setup)))

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
            spec_on[f"{label}/{s}"] = lambda stp, x, s=s, over=over: stp.spec(s, x, **over)
            wi_tasks.append(SearchTask(f"{label}/{s}", setup.rate_search(),
                                       functools.partial(spec_on[f"{label}/{s}"], setup)))
    run_searches(kv_tasks + tp_tasks + wi_tasks, runner, desc="resources")
    offline = setup.offline()
    saturation = cap_at_saturation(tp_tasks + wi_tasks, lambda t, x: spec_on[t.name](offline, x), runner)
    longer = setup.longer(STEADY_FACTOR) if setup.steady_check else None
    steady = check_steady([(t, functools.partial(spec_on[t.name], longer)) for t in kv_tasks + tp_tasks + wi_tasks],
                          runner) if longer else {}

    kv_rows = [{"system": s, "rate": rate, "note": msg} for s, msg in {**base_errors, **kv_notes}.items()]
    for t in kv_tasks:
        y = t.search.answer
        s = t.name.split("/", 1)[1]
        row = {"system": s, "rate": rate, "min_kv_gib": None if y is None else _round_sig(1.0 / y),
               "probes": len(t.points), "steady": steady.get(t.name, {}).get("steady")}
        if y is None:
            cap, why = kv_caps[s]
            row["note"] = f"no KV size up to {cap:.4g} GiB ({why}) meets the SLO at {rate:g} req/s"
        else:
            # the configuration's own KV bytes per token (its model, cache dtype and TP: resolve_budget)
            per_token = check_fits(s, setup.sim, setup.seed)[2].kv_bytes_per_token
            row["min_kv_tokens"] = int(row["min_kv_gib"] * GiB // per_token)
        kv_rows.append(row)

    # verification probes: one replica at rate / replicas, for throughput and cost
    rep_rows, verify = [], []
    for t in tp_tasks:
        tp = int(t.name.split("/", 1)[0][2:])
        s = t.name.split("/", 1)[1]
        r_star = t.search.answer
        row = {"system": s, "tensor_parallel": tp, "max_rate_per_replica_rps": r_star,
               "saturation_rps": saturation.get(t.name, {}).get("saturation_rps"),
               "steady": steady.get(t.name, {}).get("steady")}
        if r_star is None:
            row["note"] = infeasible_hint(t, runner.slo)
        else:
            k = max(1, math.ceil(rate / r_star * (1 - 1e-9)))
            row.update(replicas=k, gpus=k * tp, rate_per_replica_rps=rate / k)
            verify.append((row, t.make_spec(_round_sig(rate / k))))
        rep_rows.append(row)
    if verify and router is None:
        pts = runner.evaluate([spec for _r, spec in verify])
        for (row, _spec), p in zip(verify, pts):
            row["verified"] = p["passed"]
            row["output_throughput_total"] = (p.get("output_throughput") or 0) * row["replicas"]
            row["dollars_per_hour"] = price * row["gpus"]
            row["dollars_per_1m_output_tokens"] = cost_per_million_tokens(
                price, row["tensor_parallel"], row["replicas"], row["output_throughput_total"])
    for row, spec in verify if router is not None else ():
        estimate = row["replicas"]
        most, group = max_replicas, spec.sim_config()
        if group.expert_parallel:  # no GPU of the group without an expert (sim.run.resolve_budget)
            most = min(most, max(1, get_model(group.model).moe.num_experts // row["tensor_parallel"]))
        refused: dict[int, str] = {}
        k, p = routed_replicas(runner, lambda k, spec=spec: dataclasses.replace(spec, rate=float(rate), replicas=k,
                                                                                 router=router),
                               estimate, most, refused)
        row.update(router=router, replicas_rate_over_k=estimate, replicas=k, verified=p is not None)
        if k is None:
            why = (f"a cluster of {min(refused)} replicas was refused: {refused[min(refused)]}" if refused else
                   f"no cluster of up to {most} replicas behind {router} meets the SLO"
                   + (f" ({most}: as many as the group's GPUs have experts)" if most < max_replicas else ""))
            row.update(gpus=None, rate_per_replica_rps=None, note=why)
            continue
        row.update(gpus=k * row["tensor_parallel"], rate_per_replica_rps=rate / k,
                   rate_over_k_off_by=estimate - k)  # > 0: rate/k asked too many replicas; < 0: too few
        row["output_throughput_total"] = p.get("output_throughput") or 0
        row["dollars_per_hour"] = price * row["gpus"]
        row["dollars_per_1m_output_tokens"] = cost_per_million_tokens(
            price, row["tensor_parallel"], k, row["output_throughput_total"])
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
                            "meets_target": base_rate is not None and base_rate >= rate,
                            "steady": steady.get(base_task.name, {}).get("steady")})
        for t in wi_tasks:
            label, sys_ = t.name.rsplit("/", 1)
            if sys_ != s or label == "baseline":
                continue
            a = t.search.answer
            wi_rows.append({"system": s, "variant": label, "max_rate_rps": a,
                            "meets_target": a is not None and a >= rate,
                            "vs_baseline": (a / base_rate) if a is not None and base_rate else None,
                            "steady": steady.get(t.name, {}).get("steady")})
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
            "points": _lightweight(points), "steady_check": _steady_summary(longer),
            "warnings": _saturation_notes(saturation) + _steady_warnings(steady) + _little_warnings(points),
            "num_simulated": runner.num_simulated}
