"""Per-iteration records, per-request records, and the run summary.

Memory averages are time-weighted over the whole run, from the first arrival to the last
finish: each iteration's six categories weigh by its duration, and idle time (nothing to
run) counts as ``free_idle``. ``avg_batch_size`` is the time-weighted number of requests
holding KV memory (admitted and not finished) while the engine is busy: the quantity of the
vLLM paper's Fig. 13.

Inter-token latencies are summed exactly (mean) and binned on a log grid (2000 bins from 1 us
to 10^4 s, each 1.16 % wide) for the median, the percentiles and the standard deviation, so a
million-request run needs no per-token storage: a binned ITL is its bin's geometric centre,
within 0.58 % of the true value, so the standard deviation of the binned values is within
0.58 % of the RMS ITL of the exact one.

Latency statistics follow ``vllm bench serve`` (vLLM's ``vllm/benchmarks/serve.py`` at commit
009e6d4a1cd6, ``calculate_metrics``, lines 565-794; "serve.py" below): mean, median, population
standard deviation (``np.std``, lines 765-777) and numpy's linearly interpolated percentiles, in
ms, over finished requests; TPOT over those with more than one output token. The percentiles
reported are :class:`SummaryOptions`' (``--percentile-metrics``, ``--metric-percentiles``), keyed
``p{P}_{metric}_ms`` as vLLM keys them (``p99_ttft_ms``, ``p99.9_ttft_ms``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Mapping

import numpy as np
import pandas as pd

from pagesim.sim.errors import ConfigError
from pagesim.sim.memory.base import MemoryUsage

STEP_COLUMNS = ["step", "start_s", "dt_s", "batch_size", "num_prefill_tokens", "num_decode_tokens",
                "num_waiting", "num_running"] + [f"mem_{c}" for c in MemoryUsage.CATEGORIES]



class StepRecorder:
    """Appends one row per iteration into growable numpy columns; keeps running sums.

    Rows arrive one (or a few) at a time as Python tuples and are buffered in lists, written
    into the numpy columns in chunks (a tuple append costs far less than a numpy row store);
    long macro steps arrive as arrays and are written directly."""

    FLUSH_ROWS = 4096

    def __init__(self, capacity: int, keep_rows: bool = True, block_usage=None):
        self.capacity = capacity
        self.keep_rows = keep_rows
        self.n = 0  # rows recorded (written + buffered)
        self._written = 0
        self._cap = 1024 if keep_rows else 0
        self._f = np.zeros((self._cap, 2), np.float64)  # start_s, dt_s
        self._i = np.zeros((self._cap, 11), np.int64)  # batch, prefill, decode, waiting, running, 6 mem
        self._pf: list[tuple] = []  # buffered rows: _f, _i[:, :5], _i[:, 5:] and _blk
        self._pi: list[tuple] = []
        self._pm: list[tuple] = []
        self._pb: list[tuple] = []
        self.busy_s = 0.0
        self.idle_s = 0.0
        self.mem_weighted = np.zeros(6, np.float64)  # sum of slots x seconds per category
        self._mem_sum = [0.0] * 6
        self.running_weighted = 0.0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        # paged managers: physical vs logical (unshared) blocks, for the sharing saving (Fig. 15)
        self.block_usage = block_usage
        self._blk = np.zeros((self._cap, 2), np.int64) if block_usage else None
        self._blk_sum = [0.0, 0.0]

    def _grow(self, rows: int) -> None:
        if rows > self._cap:
            while rows > self._cap:
                self._cap *= 2
            self._f = np.resize(self._f, (self._cap, 2))
            self._i = np.resize(self._i, (self._cap, 11))
            if self._blk is not None:
                self._blk = np.resize(self._blk, (self._cap, 2))

    def _flush(self) -> None:
        """Write the buffered rows into the columns."""
        k = len(self._pf)
        if not k:
            return
        n0 = self._written
        self._grow(n0 + k)

        def rows(buf, dtype, width):  # tuples -> a (k, width) array, flattened in C
            return np.fromiter(chain.from_iterable(buf), dtype, k * width).reshape(k, width)
        self._f[n0:n0 + k] = rows(self._pf, np.float64, 2)
        self._i[n0:n0 + k, :5] = rows(self._pi, np.int64, 5)
        self._i[n0:n0 + k, 5:] = rows(self._pm, np.int64, 6)
        if self._blk is not None:
            self._blk[n0:n0 + k] = rows(self._pb, np.int64, 2)
        self._written = n0 + k
        self._pf, self._pi, self._pm, self._pb = [], [], [], []

    def add(self, start: float, dt: float, batch, waiting: int, running: int, mem: tuple) -> None:
        pre = batch.num_prefill_tokens
        dec = batch.num_decode_tokens
        if self.keep_rows:  # sums are taken from the rows at the end
            self._pf.append((start, dt))
            self._pi.append((len(batch.prefill_seq_ids) + dec, pre, dec, waiting, running))
            self._pm.append(mem)
            if self.block_usage is not None:
                self._pb.append(self.block_usage())
            if len(self._pf) >= self.FLUSH_ROWS:
                self._flush()
        else:
            self._sum_row(dt, running, mem, self.block_usage() if self.block_usage is not None else None)
            self.prefill_tokens += pre
            self.decode_tokens += dec
        self.n += 1

    def _sum_row(self, dt: float, running: int, mem, blk) -> None:
        """One unrecorded iteration into the running sums (``blk``: (used, logical) or None)."""
        if blk is not None:
            self._blk_sum[0] += blk[0] * dt
            self._blk_sum[1] += blk[1] * dt
        self.busy_s += dt
        self._mem_sum = [a + b * dt for a, b in zip(self._mem_sum, mem)]
        self.running_weighted += running * dt

    def add_many(self, starts, dts, width: int, waiting, running: int, mem, blk) -> None:
        """``len(dts)`` pure decode iterations of ``width`` sequences at once (macro steps):
        ``waiting`` a scalar or one count per step, ``mem`` the usage rows (m x 6), ``blk`` the
        block-usage rows (m x 2) of a manager that reports them. Lists of rows (short
        stretches) are buffered; arrays are written directly."""
        m = len(dts)
        if self.keep_rows and isinstance(mem, list):
            self._pf.extend(zip(starts, dts))
            if isinstance(waiting, (list, np.ndarray)):
                self._pi.extend([(width, 0, width, w, running) for w in waiting])
            else:
                self._pi.extend([(width, 0, width, waiting, running)] * m)
            self._pm.extend(mem)
            if self._blk is not None:
                self._pb.extend(blk)
            if len(self._pf) >= self.FLUSH_ROWS:
                self._flush()
        elif self.keep_rows:
            self._flush()
            n = self._written
            self._grow(n + m)
            self._f[n:n + m, 0] = starts
            self._f[n:n + m, 1] = dts
            i = self._i[n:n + m]
            i[:, 0] = width
            i[:, 1] = 0
            i[:, 2] = width
            i[:, 3] = waiting
            i[:, 4] = running
            i[:, 5:11] = mem
            if self._blk is not None:
                self._blk[n:n + m] = blk
            self._written = n + m
        elif isinstance(mem, list):  # short stretches: the per-step sums of ``add``, in order
            has_blk = blk is not None and self.block_usage is not None
            for j, dt in enumerate(dts):
                self._sum_row(dt, running, mem[j], blk[j] if has_blk else None)
            self.decode_tokens += width * m
        else:
            dts = np.asarray(dts, np.float64)
            mem = np.asarray(mem, np.int64)
            busy = float(dts.sum())
            if self.block_usage is not None:
                w = np.asarray(blk, np.int64).T.astype(np.float64) @ dts
                self._blk_sum[0] += float(w[0])
                self._blk_sum[1] += float(w[1])
            self.busy_s += busy
            w = mem.T.astype(np.float64) @ dts
            self._mem_sum = [a + float(b) for a, b in zip(self._mem_sum, w)]
            self.running_weighted += running * busy
            self.decode_tokens += width * m
        self.n += m

    def take_rows(self, f: np.ndarray, i: np.ndarray, blk: np.ndarray | None) -> None:
        """Rows recorded elsewhere (the core, sim/core/), in place of any held: ``f`` (n x 2:
        start, dt), ``i`` (n x 11: the integer columns of :data:`STEP_COLUMNS`), ``blk`` (n x 2:
        used and logical blocks, for a manager that reports them)."""
        self._pf, self._pi, self._pm, self._pb = [], [], [], []
        self._f, self._i = f, i
        if self._blk is not None:
            self._blk = blk
        self._cap = self._written = self.n = len(f)

    def take_sums(self, n: int, busy_s: float, mem_sum, blk_sum, running_weighted: float,
                  prefill_tokens: int, decode_tokens: int) -> None:
        """The running sums of ``n`` unrecorded iterations summed elsewhere (the core, sim/core/)."""
        self.n = n
        self.busy_s = busy_s
        self._mem_sum = list(mem_sum)
        self._blk_sum = list(blk_sum)
        self.running_weighted = running_weighted
        self.prefill_tokens = prefill_tokens
        self.decode_tokens = decode_tokens

    def finalize(self) -> None:
        """Turn the rows (or the running sums) into the totals the summary reads."""
        self._flush()
        if self.keep_rows:
            n = self.n
            dt = self._f[:n, 1]
            self.busy_s = float(dt.sum())
            self.mem_weighted = self._i[:n, 5:11].T.astype(np.float64) @ dt
            self.mem_weighted[5] += self.capacity * self.idle_s
            self.running_weighted = float(self._i[:n, 4] @ dt)
            self.prefill_tokens = int(self._i[:n, 1].sum())
            self.decode_tokens = int(self._i[:n, 2].sum())
            if self.block_usage is not None:
                self._blk_sum = (self._blk[:n].T.astype(np.float64) @ dt).tolist()
        else:
            self.mem_weighted = np.array(self._mem_sum, np.float64)
            self.mem_weighted[5] += self.capacity * self.idle_s

    def add_idle(self, dt: float) -> None:
        self.idle_s += dt

    def frame(self) -> pd.DataFrame:
        self._flush()
        n = self.n if self.keep_rows else 0
        df = pd.DataFrame(self._i[:n], columns=STEP_COLUMNS[3:])
        df.insert(0, "step", np.arange(n, dtype=np.int64))
        df.insert(1, "start_s", self._f[:n, 0])
        df.insert(2, "dt_s", self._f[:n, 1])
        if self.block_usage is not None:
            df["used_blocks"] = self._blk[:n, 0]
            df["logical_blocks"] = self._blk[:n, 1]
        return df

    def sharing(self) -> dict[str, float]:
        """Time-weighted physical and logical blocks, and the saving from sharing (Fig. 15)."""
        if self.block_usage is None:
            return {}
        busy = self.busy_s
        used, logical = self._blk_sum
        return {"avg_allocated_blocks": used / busy if busy > 0 else 0.0,
                "avg_logical_blocks": logical / busy if busy > 0 else 0.0,
                "blocks_shared_saving": 1.0 - used / logical if logical > 0 else 0.0}

    def memory_fractions(self) -> dict[str, float]:
        total = (self.busy_s + self.idle_s) * self.capacity
        if total <= 0:
            return {f"mem_{c}": 0.0 for c in MemoryUsage.CATEGORIES}
        return {f"mem_{c}": float(v / total) for c, v in zip(MemoryUsage.CATEGORIES, self.mem_weighted)}


def request_latencies(t) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each request's TTFT, TPOT, E2EL and normalized latency in seconds (NaN where it did not
    finish). TPOT is vLLM's: the time after the first token over the ``output - 1`` tokens
    that follow it (NaN for one-token outputs); normalized latency is E2EL per output token."""
    ttft = t.first_token_s - t.arrival_s
    e2el = t.finish_s - t.arrival_s
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(t.output > 1, (t.finish_s - t.first_token_s) / (t.output - 1), np.nan)
        norm = e2el / t.output
    return ttft, tpot, e2el, norm


def request_frame(table) -> pd.DataFrame:
    t = table
    status = np.where(t.status == 4, "finished", np.where(t.status == 5, "rejected", "unfinished"))
    ttft, tpot, e2el, norm = request_latencies(t)
    return pd.DataFrame({
        "request_id": t.request_id.astype(str), "arrival_s": t.arrival_s, "prompt_tokens": t.prompt,
        "output_tokens": t.output, "n": t.n, "beam_width": t.beam, "status": status,
        "reject_reason": t.reject_reason.astype(str), "first_token_s": t.first_token_s,
        "finish_s": t.finish_s, "ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el,
        "normalized_latency_s": norm, "preemptions": t.preemptions,
    })


def _bin_centres(edges: np.ndarray) -> np.ndarray:
    """The value standing for each histogram bin (``np.searchsorted(edges, v)`` indexes the bins):
    the geometric centre of bins 1 .. len(edges) - 1; the under- and overflow bins take their
    neighbour's centre."""
    inner = np.sqrt(edges[:-1] * edges[1:])
    return np.concatenate([inner[:1], inner, inner[-1:]])


def _hist_quantile(edges: np.ndarray, hist: np.ndarray, q: float) -> float:
    total = hist.sum()
    if total == 0:
        return float("nan")
    # the first bin whose cumulative count reaches q * total (at least 1: q = 0 is the lowest value)
    k = int(np.searchsorted(np.cumsum(hist), max(q * total, 1), side="left"))
    return float(_bin_centres(edges)[k])


def _hist_std(edges: np.ndarray, hist: np.ndarray) -> float:
    """Population standard deviation of the binned values (from the counts alone, so the same
    whatever order the values were summed in)."""
    total = hist.sum()
    if total == 0:
        return float("nan")
    centres = _bin_centres(edges)
    mean = hist @ centres / total
    return float(np.sqrt(hist @ (centres - mean) ** 2 / total))


#: latency metrics of the summary, in vLLM's names (``--percentile-metrics``)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
#: per-request metrics an SLO of vLLM's ``--goodput`` may bound (ITL is per token, not per request)
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def percentile_word(p: float) -> str:
    """``99.0`` -> ``"99"``, ``99.9`` -> ``"99.9"``: vLLM's ``p_word`` (serve.py, ``process_one_metric``)."""
    return str(int(p)) if int(p) == p else str(p)


@dataclass(frozen=True)
class SummaryOptions:
    """What the summary reports beyond its fixed keys, as ``vllm bench serve`` chooses it:
    percentiles (``percentiles``, in [0, 100]) of ``percentile_metrics``, and vLLM's goodput SLOs
    (``goodput_slo_s``: (metric, threshold in seconds) pairs; none: no ``request_goodput``).
    The defaults give the summary's historical ``p99_*`` keys for all four metrics."""

    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    percentiles: tuple[float, ...] = (99.0,)
    goodput_slo_s: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        bad = [m for m in self.percentile_metrics if m not in LATENCY_METRICS]
        if bad or not self.percentile_metrics:
            raise ConfigError(f"--percentile-metrics: unknown metric {', '.join(map(repr, bad)) or '(none given)'}; "
                              f"valid: {','.join(LATENCY_METRICS)}")
        for p in self.percentiles:
            if not 0 <= p <= 100:
                raise ConfigError(f"--metric-percentiles: {p:g} is not a percentile in [0, 100]")
        if not self.percentiles:
            raise ConfigError("--metric-percentiles: no percentile given (e.g. 50,90,99)")
        names = [m for m, _v in self.goodput_slo_s]
        for m, v in self.goodput_slo_s:
            if m not in GOODPUT_METRICS:
                raise ConfigError(f"--goodput: unknown metric '{m}'; valid: {', '.join(GOODPUT_METRICS)}")
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"--goodput: the {m} threshold must be a positive number of ms, got {v * 1e3:g}")
            if names.count(m) > 1:
                raise ConfigError(f"--goodput: {m} is given twice")


def meets_slos(finished: np.ndarray, values_s: Mapping[str, np.ndarray], thresholds_s: Mapping[str, float]) -> np.ndarray:
    """Per request: finished and within every threshold (``values_s`` and ``thresholds_s`` keyed
    by request column: ``ttft_s``, ``tpot_s``, ...). Within means ``value <= threshold`` (vLLM's
    ``s >= r``, serve.py line 653); a NaN TPOT (a single output token has none) meets any
    threshold, as vLLM counts that TPOT as 0 (serve.py line 622)."""
    ok = np.asarray(finished, dtype=bool).copy()
    for col, thr in thresholds_s.items():
        v = np.asarray(values_s[col], dtype=float)
        with np.errstate(invalid="ignore"):
            ok &= np.where(np.isnan(v), col == "tpot_s", v <= thr)
    return ok


def peak_concurrency(start_s: np.ndarray, end_s: np.ndarray) -> int:
    """vLLM's ``max_concurrent_requests``: the most requests in flight at one instant, each in
    flight over [start, end), so one ending when another starts is not counted with it (the
    sweep of serve.py lines 713-734: at equal times departures first)."""
    n = len(start_s)
    if not n:
        return 0
    times = np.concatenate([np.asarray(start_s, float), np.asarray(end_s, float)])
    delta = np.concatenate([np.ones(n, np.int64), -np.ones(n, np.int64)])
    order = np.lexsort((delta, times))
    return int(np.cumsum(delta[order]).max())


def prefix_cache_hit_rate(hit_tokens: int, queried_tokens: int) -> float:
    """Prompt tokens found in the prefix cache / prompt tokens looked up (NaN before any lookup):
    vLLM's prefix-cache hit rate, ``hits / queries`` in tokens (``vllm/v1/metrics/stats.py`` at
    commit 28ed1fb87ed5, ``CachingMetrics.hit_rate``, line 110; ``PrefixCacheStats.record``, lines
    130-140). vLLM counts the lookups of requests resumed after a preemption apart; here every
    admission counts, so the two agree on runs without preemptions."""
    return hit_tokens / queried_tokens if queried_tokens else float("nan")


def summarize(table, rec: StepRecorder, sched, *, duration_s: float, wall_time_s: float,
              extra: dict | None = None, options: SummaryOptions = SummaryOptions()) -> dict:
    t = table
    rec.finalize()
    fin = t.status == 4
    completed = int(fin.sum())
    out_tokens = int((t.output[fin] * t.width[fin]).sum())
    in_tokens = int(t.prompt[fin].sum())
    dur = duration_s if duration_s > 0 else float("nan")
    nan = float("nan")

    def stats(name: str, values_s: np.ndarray) -> dict:
        v = values_s[~np.isnan(values_s)] * 1e3
        pct = options.percentiles if name in options.percentile_metrics else ()
        if not len(v):
            return {f"mean_{name}_ms": nan, f"median_{name}_ms": nan, f"std_{name}_ms": nan,
                    **{f"p{percentile_word(p)}_{name}_ms": nan for p in pct}}
        return {f"mean_{name}_ms": float(v.mean()), f"median_{name}_ms": float(np.median(v)),
                f"std_{name}_ms": float(np.std(v)),
                **{f"p{percentile_word(p)}_{name}_ms": float(np.percentile(v, p)) for p in pct}}

    ttft, tpot, e2el, norm = (v[fin] for v in request_latencies(t))
    s = {
        "completed": completed,
        "rejected": int((t.status == 5).sum()),
        "unfinished": int(((t.status != 4) & (t.status != 5)).sum()),
        "duration_s": float(duration_s),
        # the trace time of the first arrival, where the run's clock (every time recorded) starts
        "arrival_offset_s": float(getattr(t, "arrival_offset_s", 0.0)),
        "total_input_tokens": in_tokens,  # prompt tokens of finished requests (vLLM's total_input)
        "total_output_tokens": out_tokens,  # tokens generated for them, all samples (output_throughput's)
        "request_throughput": completed / dur,
        "output_throughput": out_tokens / dur,
        "total_token_throughput": (out_tokens + in_tokens) / dur,
    }
    if options.goodput_slo_s:  # vLLM's request_goodput: good requests per second (serve.py line 760)
        good = meets_slos(np.ones(completed, bool), {"ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el},
                          {f"{m}_s": v for m, v in options.goodput_slo_s})
        s["request_goodput"] = int(good.sum()) / dur
    s.update(stats("ttft", ttft))
    s.update(stats("tpot", tpot))
    itl_sum, itl_count, itl_hist, itl_edges = sched.itl_stats()
    itl_mean = itl_sum / itl_count * 1e3 if itl_count else nan
    s.update({"mean_itl_ms": itl_mean,
              "median_itl_ms": _hist_quantile(itl_edges, itl_hist, 0.5) * 1e3,
              "std_itl_ms": _hist_std(itl_edges, itl_hist) * 1e3})
    if "itl" in options.percentile_metrics:
        s.update({f"p{percentile_word(p)}_itl_ms": _hist_quantile(itl_edges, itl_hist, p / 100) * 1e3
                  for p in options.percentiles})
    s.update(stats("e2el", e2el))
    s["max_concurrent_requests"] = peak_concurrency(t.arrival_s[fin], t.finish_s[fin])
    s["normalized_latency_s_per_token"] = float(np.mean(norm)) if completed else nan
    s["avg_batch_size"] = rec.running_weighted / rec.busy_s if rec.busy_s > 0 else 0.0
    s["num_preemptions"] = int(sched.num_preemptions)
    s.update(rec.memory_fractions())
    s["kv_capacity_tokens"] = int(rec.capacity)
    s["num_steps"] = int(rec.n)
    s["busy_s"] = float(rec.busy_s)
    s["idle_s"] = float(rec.idle_s)
    s["wall_time_s"] = float(wall_time_s)
    if extra:
        s.update(extra)
    return s


def downsample_steps(steps: pd.DataFrame | None, max_points: int = 5000) -> pd.DataFrame | None:
    """At most ``max_points`` rows: numeric columns averaged over equal-count bins of consecutive
    steps (timelines for plots and reports stay small; the full table stays in steps.csv)."""
    if steps is None or len(steps) <= max_points:
        return steps
    k = -(-len(steps) // max_points)
    num = steps.select_dtypes("number")
    return num.groupby(np.arange(len(num)) // k).mean().reset_index(drop=True)
