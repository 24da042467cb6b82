"""Does one probe meet the SLO? Per-request checks, p99s, keeping up, and Little's law.

A probe is one full simulation of a workload at one setting; :func:`evaluate_point` turns its
request table into the numbers a plan reports and a pass/fail verdict. The search
(:mod:`experiments.search`) only ever sees that verdict, so everything "meeting the SLO" means
lives here.

**Passing ("meets the SLO").** A probe passes only if all of these hold:

* every request finished (none rejected, none unfinished);
* the system kept up: the drain time ``last finish - last arrival`` is at most
  ``max(keepup_frac * span, keepup_min_s)`` (defaults 5 % of the arrival span, at least 60 s):
  a queue that grows without bound leaves a backlog proportional to the trace length;
* the SLO: in p99 mode each given threshold bounds the p99 over finished requests (TTFT, TPOT,
  E2EL; ``normalized_latency`` bounds the *mean* end-to-end latency per output token, the vLLM
  paper's metric). In SLO-attainment mode (``slo_attainment`` set) the same thresholds apply per
  request and the fraction of *all* requests meeting every one of them (``slo_attainment``:
  rejected and unfinished requests count as misses) must be at least the target. A request meets
  the thresholds as :func:`sim.metrics.meets_slos` says (one output token: no TPOT, meets any).

**Request goodput.** ``request_goodput`` is vLLM's (``vllm bench serve --goodput``): the requests
meeting every per-request threshold, per second of the run (the denominator of
``request_throughput``). vLLM's ``--goodput ttft:MS tpot:MS e2el:MS`` sets those thresholds in
milliseconds; a plan given them and no target asks for :data:`DEFAULT_SLO_ATTAINMENT`.

**Little's law check.** For every probe, over the window [first arrival, max(last finish, last
arrival)] of the admitted requests (rejected ones never enter the system): L = time-weighted
number of requests in the system (an event sweep over arrivals and finishes; unfinished requests
stay until the window's end), lambda = requests / window, W = mean end-to-end latency of finished
requests. ``littles_law_error = |L - lambda W| / L``; above :data:`LITTLE_TOL` (5 %) the point
gets a warning (it does when requests are left unfinished, or the records are inconsistent).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.sim.metrics import meets_slos

#: relative Little's-law error above which a probe gets a warning
LITTLE_TOL = 0.05
#: a probe keeps up if it drains within max(KEEPUP_FRAC * arrival span, KEEPUP_MIN_S) of the last arrival
KEEPUP_FRAC = 0.05
KEEPUP_MIN_S = 60.0
#: the SLO-attainment target of a plan given vLLM's --goodput thresholds alone: DistServe's 90 %
#: (the goodput of the DistServe paper, https://arxiv.org/abs/2401.09670, that vLLM's --goodput cites)
DEFAULT_SLO_ATTAINMENT = 0.9


@dataclass
class SLO:
    """Latency objectives in seconds; ``None`` means not constrained."""

    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    e2el_p99_s: float | None = None
    normalized_latency_s: float | None = None  # mean s per output token (p99 mode)
    slo_attainment: float | None = None  # target fraction of requests meeting all thresholds

    def __post_init__(self) -> None:
        for k, v in asdict(self).items():
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"SLO {k} must be a positive number, got {v}")
        if self.slo_attainment is not None and self.slo_attainment > 1:
            raise ConfigError(f"--slo-attainment is a fraction of requests in (0, 1], got {self.slo_attainment}")
        if self.slo_attainment is not None and not self.thresholds():
            raise ConfigError("--slo-attainment needs at least one per-request threshold (--goodput KEY:MS, "
                              "--slo-ttft-p99, --slo-tpot-p99, --slo-e2el-p99, --slo-normalized-latency)")

    def thresholds(self) -> dict[str, float]:
        """Per-request column -> threshold (s)."""
        m = {"ttft_s": self.ttft_p99_s, "tpot_s": self.tpot_p99_s, "e2el_s": self.e2el_p99_s,
             "normalized_latency_s": self.normalized_latency_s}
        return {k: v for k, v in m.items() if v is not None}

    def scaled(self, factor: float) -> "SLO":
        """This SLO with every latency threshold x ``factor`` (its attainment target kept): the
        SLO's scale of DistServe's Fig. 8, bottom row."""
        if not (factor > 0 and math.isfinite(factor)):
            raise ConfigError(f"an SLO's scale must be a positive number, got {factor}")
        return SLO(**{k: (v * factor if v is not None and k != "slo_attainment" else v)
                      for k, v in asdict(self).items()})

    def describe(self) -> str:
        names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2el_s": "E2EL", "normalized_latency_s": "normalized latency"}
        parts = []
        for col, v in self.thresholds().items():
            if self.slo_attainment is None:
                what = "mean" if col == "normalized_latency_s" else "p99"
                unit = " s/token" if col == "normalized_latency_s" else " s"
                parts.append(f"{what} {names[col]} <= {v:g}{unit}")
            else:
                parts.append(f"{names[col]} <= {v:g} s")
        if self.slo_attainment is not None:
            return f">= {100 * self.slo_attainment:g} % of requests with " + " and ".join(parts)
        return " and ".join(parts) if parts else "no latency SLO (only: all requests finish and the system keeps up)"


def p99(values: Iterable[float]) -> float:
    """99th percentile (numpy's linear interpolation, as in summary.json) ignoring NaN; NaN if empty."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(np.percentile(v, 99)) if len(v) else float("nan")


def request_ok(requests: pd.DataFrame, slo: SLO) -> np.ndarray:
    """Per request: finished and within every per-request threshold (:func:`sim.metrics.meets_slos`)."""
    thresholds = slo.thresholds()
    return meets_slos(np.asarray(requests["status"].astype(str) == "finished", dtype=bool),
                      {col: requests[col].to_numpy(dtype=float) for col in thresholds}, thresholds)


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


def evaluate_point(requests: pd.DataFrame, slo: SLO, *, duration_s: float | None = None,
                   keepup_frac: float = KEEPUP_FRAC, keepup_min_s: float = KEEPUP_MIN_S) -> dict[str, Any]:
    """SLO metrics of one probe from its request table, and whether it passes (see module doc).
    ``duration_s``: the run's (summary.json's), for ``request_goodput`` (NaN without it)."""
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
    good = request_ok(requests, slo)
    out["slo_attainment"] = float(good.mean()) if n else float("nan")
    out["request_goodput"] = int(good.sum()) / duration_s if duration_s and duration_s > 0 else float("nan")
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
    if slo.slo_attainment is not None:
        if not out["slo_attainment"] >= slo.slo_attainment:
            reasons.append(f"SLO attainment {out['slo_attainment']:.3f} < {slo.slo_attainment:g}")
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
