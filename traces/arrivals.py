"""Synthetic arrival processes (used by :mod:`traces.synth` and by loaders of traces without times).

``poisson``: exponential gaps with mean ``1/rate``. The first request arrives after one gap
(not at 0). With ``duration_s`` the requests are those arriving before ``duration_s`` (their
count is Poisson-distributed); with ``num_requests`` exactly that many; with both, whichever ends
first.

``gamma``: gamma-distributed gaps with coefficient of variation ``cv`` (shape ``k = 1/cv**2``;
``cv > 1`` is burstier than Poisson, ``cv = 1`` has Poisson statistics; vLLM's ``--burstiness``
is ``k``). A gamma process with a large ``cv`` puts almost all of its time into a few huge gaps,
so a plain run of gaps would hold wildly more or fewer requests than ``rate x duration``. The
process therefore keeps the requested mean rate over its window: it has exactly
``N = round(rate x duration_s)`` requests (``num_requests`` over ``num_requests / rate`` without
a duration), and its ``N + 1`` gaps (the last one runs to the window's end) are gamma draws of
shape ``k`` scaled together to fill the window, i.e. Dirichlet(k, ..., k) shares of it. Each gap
keeps the gamma shape; only the total is fixed. With both a duration and ``num_requests``, the
first ``num_requests`` of the duration's requests.
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.sim.errors import ConfigError
from pagesim.traces.names import ARRIVALS


def check_rate(rate, cv=1.0) -> None:
    """ConfigError unless ``rate`` and ``cv`` are finite numbers > 0."""
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ConfigError(f"rate must be a positive number of requests/s, got {rate}")
    if not (isinstance(cv, (int, float)) and math.isfinite(cv) and cv > 0):
        raise ConfigError(f"cv must be > 0 (1 = Poisson-like, >1 burstier), got {cv}")


def _poisson(rate: float, duration_s: float | None, num_requests: int | None,
             rng: np.random.Generator) -> np.ndarray:
    if duration_s is None:
        return np.cumsum(rng.exponential(1.0 / rate, int(num_requests)))
    mean = rate * duration_s
    want = mean + 8.0 * math.sqrt(mean) + 16
    if num_requests is not None:
        want = min(want, num_requests)
    t = np.cumsum(rng.exponential(1.0 / rate, int(want)))
    while t.size and t[-1] < duration_s and (num_requests is None or t.size < num_requests):
        more = np.cumsum(rng.exponential(1.0 / rate, max(int(want) // 4, 16))) + t[-1]
        t = np.concatenate([t, more])
    if num_requests is not None:
        t = t[:num_requests]
    return t[: int(np.searchsorted(t, duration_s, side="left"))]


def _gamma(rate: float, cv: float, duration_s: float | None, num_requests: int | None,
           rng: np.random.Generator) -> np.ndarray:
    window = duration_s if duration_s is not None else num_requests / rate
    count = int(round(rate * duration_s)) if duration_s is not None else int(num_requests)
    shape = 1.0 / (cv * cv)
    # log of Gamma(shape) draws as log Gamma(shape + 1) + log(U) / shape: exact, and finite even
    # for a tiny shape, whose plain draws underflow to 0 (cv = 1e6 gives shape 1e-12)
    log_gaps = np.log(rng.gamma(shape + 1.0, 1.0, count + 1)) + np.log(rng.random(count + 1)) / shape
    gaps = np.exp(log_gaps - log_gaps.max())
    t = np.cumsum(gaps[:count]) * (window / gaps.sum())
    t = np.minimum(t, np.nextafter(window, 0.0))  # rounding must not push an arrival to the window's end
    return t if num_requests is None else t[:num_requests]


def arrivals(kind: str = "poisson", rate: float = 2.0, *, duration_s: float | None = None,
             num_requests: int | None = None, cv: float = 1.0,
             rng: np.random.Generator | int | None = None) -> np.ndarray:
    """Arrival times (s, float64, non-decreasing) of a ``poisson`` or ``gamma`` process at ``rate``
    (see the module docstring for how ``duration_s`` and ``num_requests`` bound them)."""
    check_rate(rate, cv)
    rng = np.random.default_rng(rng) if not isinstance(rng, np.random.Generator) else rng
    if duration_s is None and num_requests is None:
        raise ConfigError("give a duration or a number of requests")
    if num_requests is not None and num_requests < 0:
        raise ConfigError(f"num_requests must be >= 0, got {num_requests}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError(f"duration must be a finite number > 0 s, got {duration_s}")
    if kind == "poisson":
        return _poisson(rate, duration_s, num_requests, rng)
    if kind == "gamma":
        return _gamma(rate, cv, duration_s, num_requests, rng)
    raise ConfigError(f"unknown arrival process '{kind}'; valid: {', '.join(ARRIVALS)}")


def describe(kind: str, rate: float, cv: float, seed: int) -> str:
    """How a loader's synthetic arrivals were made, for its load report."""
    return f"{kind} rate {rate:g} req/s" + (f" cv {cv:g}" if kind == "gamma" else "") + f" seed {seed}"
