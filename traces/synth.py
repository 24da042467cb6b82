"""Synthetic workloads: length distributions and the vLLM paper's datasets, with the arrival
processes of :mod:`traces.arrivals`.

Everything is vectorized numpy driven by ``np.random.default_rng(seed)``; the same arguments
give the identical DataFrame. ``make_workload`` spawns independent child streams for arrivals,
prompt lengths and output lengths (``SeedSequence(seed).spawn(3)``).

Length distributions (``--prompt-dist`` / ``--output-dist`` spec strings)
--------------------------------------------------------------------------
``constant:V``, ``uniform:low=A,high=B`` (integers, inclusive), ``lognormal:mean=M,sigma=S``
(``M`` is the mean of the un-rounded lognormal; ``mu=`` may be given instead of ``mean=``),
``exponential:mean=M``, ``empirical:PATH`` (resampled with replacement from the prompt or
output column of a trace file that :func:`traces.loaders.load_trace` reads). Values are rounded
to integers and clipped to >= 1. Parameters must be finite, means and ``value`` > 0, ``sigma``
>= 0, and every draw must stay below :data:`MAX_DRAWN_TOKENS`; anything else is refused in one line.

Built-in workloads ``sharegpt`` and ``alpaca`` (no external file needed)
------------------------------------------------------------------------
The vLLM paper (Kwon et al., SOSP'23, Fig. 11) reports mean lengths after the filtering done
by vLLM's ``benchmark_serving.py`` (drop requests with prompt or output < 4 tokens, prompt >
1024, or prompt + output > 2048): ShareGPT 161.31 prompt / 337.99 output, Alpaca 19.31 / 58.45.
Without the datasets we model each length as a rounded lognormal (LLM request lengths are
right-skewed, roughly log-normal):

* the *shape* (log-space sigma) is fixed: ShareGPT output sigma 1.0 is the log-std measured on
  real ShareGPT outputs (the etalon ShareGPT stats file in ``shared/traces``: 1.00); ShareGPT
  prompt sigma 1.2 is a bit narrower than that file's 1.6 because its prompts carry multi-turn
  history while the paper's are single prompts. Alpaca (short instructions, short answers) gets
  prompt sigma 0.6 and output sigma 0.9 -- assumptions, the paper gives only the means;
* the *location* mu is solved (bisection on the exact discrete mean, :func:`fit_paper_workload`)
  so the means *after* the filter equal the paper's. The filter is enforced exactly, not by
  rejection loops: prompts are drawn from the lognormal restricted to [4, 1024], then each
  output from the lognormal restricted to [4, 2048 - prompt] (inverse CDF on the discretized
  pmf). Prompt and output are otherwise independent.
* draws use stratified uniforms (one uniform per 1/N quantile stratum, randomly permuted), so
  each request's length has exactly the distribution above while the run's sample means sit
  very close to the target: at 10,000 requests ShareGPT's means are within ~0.1% of the paper's
  (tested to be within 2%).

Fitted parameters (``fit_paper_workload(name)``): ShareGPT prompt mu ~4.592, output mu ~5.456;
Alpaca prompt mu ~2.776, output mu ~3.660 (exact values are recomputed and cached at first use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError, EmptyWorkload
from pagesim.traces.arrivals import arrivals
from pagesim.traces.loaders import load_trace
from pagesim.traces.names import ARRIVALS, DISTS, WORKLOADS
from pagesim.traces.schema import ids_for

#: a drawn length above this is a mistaken spec (e.g. a lognormal sigma of 50), not a request
MAX_DRAWN_TOKENS = 10**9


# ----------------------------------------------------------------------------------------- lengths

def parse_dist(spec: str) -> tuple[str, dict]:
    """``"lognormal:mean=300,sigma=1"`` -> ``("lognormal", {"mean": 300.0, "sigma": 1.0})``."""
    name, _, rest = str(spec).partition(":")
    name = name.strip()
    if name not in DISTS:
        raise ConfigError(f"unknown length distribution '{name}'; valid: {', '.join(DISTS)} "
                          f"(e.g. lognormal:mean=300,sigma=1)")
    if name == "empirical":
        if not rest:
            raise ConfigError("empirical needs a trace file: empirical:PATH")
        return name, {"path": rest}
    params: dict = {}
    for part in filter(None, (x.strip() for x in rest.split(","))):
        k, sep, v = part.partition("=")
        if not sep:
            k, v = {"constant": "value", "exponential": "mean"}.get(name, k), k
        try:
            params[k.strip()] = float(v)
        except ValueError:
            raise ConfigError(f"length distribution {spec!r}: {k}={v!r} is not a number") from None
    need = {"constant": [("value",)], "uniform": [("low",), ("high",)], "exponential": [("mean",)],
            "lognormal": [("mean", "mu"), ("sigma",)]}[name]
    unknown = sorted(set(params) - {a for alts in need for a in alts})
    if unknown:  # a parameter the distribution does not take would be dropped without a word
        raise ConfigError(f"length distribution {spec!r}: {name} takes "
                          f"{', '.join('/'.join(alts) for alts in need)}, not {', '.join(unknown)}")
    for alts in need:
        if not any(a in params for a in alts):
            raise ConfigError(f"length distribution {spec!r} needs {' or '.join(a + '=' for a in alts)}; "
                              f"e.g. constant:128, uniform:low=4,high=1024, lognormal:mean=300,sigma=1, "
                              f"exponential:mean=300")
    for k, v in params.items():
        if k in ("mean", "value"):
            ok, want = 0 < v < MAX_DRAWN_TOKENS, f"> 0 and < {MAX_DRAWN_TOKENS:.0e}"
        elif k in ("low", "high"):
            ok, want = abs(v) < MAX_DRAWN_TOKENS, f"below {MAX_DRAWN_TOKENS:.0e}"
        elif k == "sigma":
            ok, want = 0 <= v < math.inf, "a finite number >= 0"
        else:
            ok, want = math.isfinite(v), "finite"
        if not ok:
            raise ConfigError(f"length distribution {spec!r}: {k} must be {want}, got {v:g} "
                              f"(e.g. lognormal:mean=300,sigma=1)")
    return name, params


def sample_lengths(spec: str | tuple, size: int, rng: np.random.Generator, *, which: str = "prompt") -> np.ndarray:
    """``size`` integer lengths >= 1 from a spec string (see module docstring). ``which``
    (``prompt``/``output``) picks the column that ``empirical:PATH`` resamples."""
    name, p = parse_dist(spec) if isinstance(spec, str) else spec
    if name == "constant":
        x = np.full(size, p["value"])
    elif name == "uniform":
        lo, hi = int(round(p["low"])), int(round(p["high"]))
        if hi < lo:
            raise ConfigError(f"uniform: high ({hi}) < low ({lo})")
        x = rng.integers(lo, hi + 1, size)
    elif name == "exponential":
        x = rng.exponential(p["mean"], size)
    elif name == "lognormal":
        s = p["sigma"]
        mu = p["mu"] if "mu" in p else math.log(p["mean"]) - s * s / 2
        x = rng.lognormal(mu, s, size)
    else:  # empirical
        col = "prompt_tokens" if which == "prompt" else "output_tokens"
        values = load_trace(p["path"])[col].to_numpy()
        x = values[rng.integers(0, values.size, size)]
    x = np.rint(x)
    if x.size and not x.max() < MAX_DRAWN_TOKENS:
        raise ConfigError(f"length distribution {spec if isinstance(spec, str) else name!r} draws "
                          f"{x.max():.3g} tokens, beyond the {MAX_DRAWN_TOKENS:.0e} a request can hold")
    return np.maximum(x, 1).astype(np.int64)


# ----------------------------------------------------------------------------------------- paper workloads

@dataclass(frozen=True)
class PaperWorkload:
    name: str
    prompt_mean: float
    output_mean: float
    prompt_sigma: float
    output_sigma: float
    min_len: int = 4
    max_prompt: int = 1024
    max_total: int = 2048


PAPER_WORKLOADS = {
    "sharegpt": PaperWorkload("sharegpt", 161.31, 337.99, prompt_sigma=1.2, output_sigma=1.0),
    "alpaca": PaperWorkload("alpaca", 19.31, 58.45, prompt_sigma=0.6, output_sigma=0.9),
}
assert WORKLOADS == (*PAPER_WORKLOADS, "custom")

_erf = np.frompyfunc(math.erf, 1, 1)


def _pmf(mu: float, sigma: float, kmax: int) -> np.ndarray:
    """P(round(X) = k) for k = 0..kmax, X ~ lognormal(mu, sigma)."""
    edges = np.arange(kmax + 2) - 0.5
    edges[0] = 1e-300
    z = (np.log(edges) - mu) / (sigma * math.sqrt(2))
    cdf = 0.5 * (1 + _erf(z).astype(np.float64))
    cdf[0] = 0.0
    return np.diff(cdf)


def _prompt_table(w: PaperWorkload, mu: float) -> np.ndarray:
    """Normalized cumulative pmf of prompts over k = min_len..max_prompt."""
    pmf = _pmf(mu, w.prompt_sigma, w.max_prompt)[w.min_len:]
    return pmf / pmf.sum()


def _prompt_mean(w: PaperWorkload, mu: float) -> float:
    p = _prompt_table(w, mu)
    return float(np.dot(p, np.arange(w.min_len, w.max_prompt + 1)))


def _output_cums(w: PaperWorkload, mu: float) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative output mass and mass*k over k = min_len..max_total-min_len (unnormalized)."""
    pmf = _pmf(mu, w.output_sigma, w.max_total - w.min_len)[w.min_len:]
    k = np.arange(w.min_len, w.max_total - w.min_len + 1)
    return np.cumsum(pmf), np.cumsum(pmf * k)


def _output_mean(w: PaperWorkload, mu_p: float, mu_o: float) -> float:
    pp = _prompt_table(w, mu_p)
    prompts = np.arange(w.min_len, w.max_prompt + 1)
    cum, cmk = _output_cums(w, mu_o)
    j = w.max_total - prompts - w.min_len  # index of the largest allowed output
    return float(np.dot(pp, cmk[j] / cum[j]))


def _bisect(f, target: float, lo: float = -5.0, hi: float = 12.0) -> float:
    for _ in range(100):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_paper_workload(name: str) -> dict:
    """The lognormal locations (mu) that give the paper's post-filter means, and those means."""
    return fit_lengths(PAPER_WORKLOADS[name])


@lru_cache(maxsize=None)
def fit_lengths(w: PaperWorkload) -> dict:
    """The lognormal locations (mu) that give ``w``'s post-filter means, and those means."""
    mu_p = _bisect(lambda m: _prompt_mean(w, m), w.prompt_mean)
    mu_o = _bisect(lambda m: _output_mean(w, mu_p, m), w.output_mean)
    return dict(prompt_mu=mu_p, prompt_sigma=w.prompt_sigma, output_mu=mu_o, output_sigma=w.output_sigma,
                prompt_mean=_prompt_mean(w, mu_p), output_mean=_output_mean(w, mu_p, mu_o),
                min_len=w.min_len, max_prompt=w.max_prompt, max_total=w.max_total)


def _stratified(size: int, rng: np.random.Generator) -> np.ndarray:
    """One uniform in each of ``size`` equal strata of [0, 1), in random order: (a permutation of
    the strata + a uniform) / size, the permutation drawn first, the sum made in place."""
    strata = rng.permutation(size)
    u = rng.random(size)
    u += strata
    u /= max(size, 1)
    return u


def inverse_cdf(cumulative: np.ndarray, keys: np.ndarray, bucket_bits: int = 16) -> np.ndarray:
    """``np.searchsorted(cumulative, keys, side="right")``, the same integers, for many keys in
    ``[0, cumulative[-1]]`` over a short nondecreasing table (a pmf's running sum): each key's
    answer is bracketed by the answers at the edges of the grid bucket it falls in (``2**bucket_bits``
    buckets over the table's range, the edges searched once) and taken from there where the
    bracket holds at most one table value; the keys in the few buckets holding more (a
    distribution's dense tail) are searched as before. A binary search over a table of a
    thousand values takes a branch it cannot predict at each of its ten levels: ten million
    draws took 0.7 s that way. The keys go a million at a time, so that the temporaries are
    reused rather than each faulted in afresh."""
    n = 1 << bucket_bits
    top = float(cumulative[-1])
    if top <= 0 or len(keys) < n:
        return np.searchsorted(cumulative, keys, side="right")
    # the answers at the bucket edges, two buckets of slack past the last: a key's bucket from
    # its own rounding is off by at most one from the edges' (the two roundings are of the order
    # of 1e-16 of the range, a bucket 1.5e-5 of it), so its answer lies within [first[g], first[g + 3]]
    first = np.searchsorted(cumulative, np.arange(n + 3) * (top / n), side="right")
    answer = np.empty(len(keys), np.int64)
    chunk = 1 << 20
    for start in range(0, len(keys), chunk):
        part = keys[start:start + chunk]
        g = np.clip((part * (n / top)).astype(np.int64) - 1, 0, n - 1)
        low, high = first[g], first[g + 3]
        # one table value in the bracket: the answer is past it where the key reaches it
        found = low + ((high - low == 1) & (cumulative[np.minimum(low, len(cumulative) - 1)] <= part))
        wide = np.flatnonzero(high - low > 1)
        found[wide] = np.searchsorted(cumulative, part[wide], side="right")
        answer[start:start + chunk] = found
    return answer


def paper_lengths(name: str | PaperWorkload, size: int, rng: np.random.Generator,
                  rng_output: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) int64 arrays for the built-in workload ``name`` (see module docstring),
    or for a :class:`PaperWorkload` of other means drawn the same way."""
    if not isinstance(name, PaperWorkload) and name not in PAPER_WORKLOADS:
        raise ConfigError(f"unknown workload '{name}'; valid: {', '.join(PAPER_WORKLOADS)}")
    w = name if isinstance(name, PaperWorkload) else PAPER_WORKLOADS[name]
    fit = fit_lengths(w)
    rng_output = rng if rng_output is None else rng_output
    cp = np.cumsum(_prompt_table(w, fit["prompt_mu"]))
    ip = np.minimum(inverse_cdf(cp, _stratified(size, rng) * cp[-1]), cp.size - 1)
    prompt = (ip + w.min_len).astype(np.int64)
    cum, _ = _output_cums(w, fit["output_mu"])
    jmax = w.max_total - prompt - w.min_len
    io = inverse_cdf(cum, _stratified(size, rng_output) * cum[jmax])
    output = (np.minimum(io, jmax) + w.min_len).astype(np.int64)
    return prompt, output


# ----------------------------------------------------------------------------------------- workloads

def make_workload(name: str, rate: float, duration_s: float | None = None, num_requests: int | None = None,
                  seed: int = 0, arrival: str = "poisson", cv: float = 1.0, n: int = 1, beam_width: int = 1, *,
                  prompt_dist: str | None = None, output_dist: str | None = None) -> pd.DataFrame:
    """A synthetic workload in canonical form.

    ``name``: ``sharegpt`` or ``alpaca`` (the paper's length statistics) or ``custom`` (needs both
    ``prompt_dist`` and ``output_dist``). ``prompt_dist``/``output_dist`` replace that side of a
    built-in workload (then drawn independently, without the paper filter). Give ``duration_s``,
    ``num_requests`` or both (see :func:`arrivals`). ``n``/``beam_width`` fill those columns.
    """
    if name not in WORKLOADS:
        raise ConfigError(f"unknown workload '{name}'; valid: {', '.join(WORKLOADS)} (or use --trace FILE)")
    if name == "custom" and (prompt_dist is None or output_dist is None):
        raise ConfigError("workload 'custom' needs both a prompt and an output length distribution "
                          "(e.g. --prompt-dist lognormal:mean=200,sigma=1 --output-dist exponential:300)")
    if arrival not in ARRIVALS:
        raise ConfigError(f"unknown arrival process '{arrival}'; valid: {', '.join(ARRIVALS)}")
    for k, v in (("n", n), ("beam_width", beam_width)):
        if int(v) != v or v < 1:
            raise ConfigError(f"{k} must be an integer >= 1, got {v}")
    r_arr, r_p, r_o = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    t = arrivals(arrival, rate, duration_s=duration_s, num_requests=num_requests, cv=cv, rng=r_arr)
    size = t.size
    if name in PAPER_WORKLOADS:
        prompt, output = paper_lengths(name, size, r_p, r_o)
    else:
        prompt = output = None
    if prompt_dist is not None:
        prompt = sample_lengths(prompt_dist, size, r_p, which="prompt")
    if output_dist is not None:
        output = sample_lengths(output_dist, size, r_o, which="output")
    df = pd.DataFrame({"request_id": ids_for(size), "arrival_s": t, "prompt_tokens": prompt,
                       "output_tokens": output, "n": np.full(size, int(n), dtype=np.int64),
                       "beam_width": np.full(size, int(beam_width), dtype=np.int64)},
                      copy=False)  # (its columns fresh: pandas would copy them all into one block)
    desc = dict(kind="synthetic", workload=name, rate=rate, duration_s=duration_s, num_requests=num_requests,
                seed=seed, arrival=arrival, cv=cv if arrival == "gamma" else None, n=n, beam_width=beam_width,
                prompt_dist=prompt_dist, output_dist=output_dist)
    df.attrs = {"source": f"builtin:{name}", "workload": desc}
    if size == 0:
        raise EmptyWorkload(f"rate {rate} req/s for {duration_s} s")
    return df
