"""Per-iteration records, per-request records, and the run summary.

Memory averages are time-weighted over the whole run, from the first arrival to the last
finish: each iteration's memory categories weigh by its duration, and idle time (nothing to
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
from typing import Mapping, NamedTuple, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (pandas is imported where a frame is built)
    import pandas as pd

from pagesim.sim.core import state
from pagesim.sim.errors import ConfigError
from pagesim.sim.requests import Status

#: where every KV slot is at every instant (they sum to the pool's capacity): the vLLM paper's
#: Fig. 2 (token states, reservation, internal fragmentation) with external fragmentation split
#: into the allocator's rounding slack (a buddy block's unused part) and holes between extents
#: and, last, speculative decoding's slack (slots of drafts being verified or rejected, lookahead
#: slots: sim/core/sched/speculative.py)
MEMORY_CATEGORIES = ("token_states", "reservation", "internal_frag", "allocator_slack", "external_frag", "free_idle",
                     "speculative_slack")
#: Okabe & Ito's colour-blind-safe palette, and each slot category's colour in every chart (the
#: reports', the paper figures', the GPU validation's)
OKABE_ITO = {"orange": "#E69F00", "sky blue": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
             "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "black": "#000000"}
MEMORY_COLORS = {"token_states": OKABE_ITO["green"], "reservation": OKABE_ITO["yellow"],
                 "internal_frag": OKABE_ITO["vermillion"], "allocator_slack": OKABE_ITO["orange"],
                 "external_frag": "#999999", "free_idle": "#e5e5e5", "speculative_slack": OKABE_ITO["blue"]}
#: a disaggregated replica's (sim/disagg.py): then the slots of blocks held by in-flight KV
#: transfers (sim/core/kv/remote_kv.py), in its records alone
DISAGG_MEMORY_CATEGORIES = MEMORY_CATEGORIES + ("in_transfer",)
STEP_COLUMNS = ["step", "start_s", "dt_s", "batch_size", "num_prefill_tokens", "num_decode_tokens",
                "num_waiting", "num_running"] + [f"mem_{c}" for c in MEMORY_CATEGORIES]


class StepRecords:
    """The run's iterations as the core recorded them (``sim/core/events/loop.py`` ``record``): their
    time-weighted sums, which the summary reads, and with ``cfg.record_steps`` one row each. ``blocks``: the pool has blocks (paged managers), whose used and logical
    counts are recorded too (the sharing saving of the paper's Fig. 15)."""

    def __init__(self, s: state.Core, capacity: int, blocks: bool, in_transfer: bool = False):
        c, clock = s.count, s.clock
        self.in_transfer = in_transfer  # a disaggregated replica: its in-transfer category too
        n = int(c[state.NUM_ROWS])
        self.capacity = capacity
        self.num_steps = n
        self.idle_s = float(clock[state.IDLE_S])
        self.blocks = blocks
        self.keep_rows = bool(s.config[state.KEEP_ROWS])
        # the loop's time-weighted sums (sim/core/events/loop.py record), with or without rows
        self.busy_s = float(clock[state.BUSY_S])
        self.mem_weighted = np.array(clock[state.MEM_SUM:state.MEM_SUM + state.MEMORY_CATEGORIES].tolist(), np.float64)
        self.running_weighted = float(clock[state.RUNNING_WEIGHTED])
        self.block_sums = [float(clock[state.BLOCKS_SUM]), float(clock[state.LOGICAL_SUM])]
        self.rows = (s.row_floats[:n], s.row_ints[:n]) if self.keep_rows else None
        self.mem_weighted[5] += self.capacity * self.idle_s  # idle time: every slot is free

    def frame(self) -> "pd.DataFrame":
        import pandas as pd  # here: the command line's options (sim/args.py) import this file

        n = self.num_steps if self.keep_rows else 0
        none = (np.zeros((0, state.ROW_FLOATS)), np.zeros((0, state.ROW_INTS), np.int64))
        f, i = self.rows if self.keep_rows else none
        last = state.ROW_MEMORY + len(MEMORY_CATEGORIES)
        df = pd.DataFrame(i[:n, :last], columns=STEP_COLUMNS[3:])
        df.insert(0, "step", np.arange(n, dtype=np.int64))
        df.insert(1, "start_s", f[:n, state.ROW_START])
        df.insert(2, "dt_s", f[:n, state.ROW_DT])
        if self.in_transfer:
            df[f"mem_{DISAGG_MEMORY_CATEGORIES[-1]}"] = i[:n, last]
        if self.blocks:
            df["used_blocks"] = i[:n, state.ROW_USED_BLOCKS]
            df["logical_blocks"] = i[:n, state.ROW_LOGICAL_BLOCKS]
        return df

    def sharing(self) -> dict[str, float]:
        """Time-weighted physical and logical blocks, and the saving from sharing (Fig. 15)."""
        if not self.blocks:
            return {}
        busy = self.busy_s
        used, logical = self.block_sums
        return {"avg_allocated_blocks": used / busy if busy > 0 else 0.0,
                "avg_logical_blocks": logical / busy if busy > 0 else 0.0,
                "blocks_shared_saving": 1.0 - used / logical if logical > 0 else 0.0}

    def memory_fractions(self) -> dict[str, float]:
        total = (self.busy_s + self.idle_s) * self.capacity
        names = DISAGG_MEMORY_CATEGORIES if self.in_transfer else MEMORY_CATEGORIES
        if total <= 0:
            return {f"mem_{c}": 0.0 for c in names}
        return {f"mem_{c}": float(v / total) for c, v in zip(names, self.mem_weighted)}


class InterTokenLatencies(NamedTuple):
    """The run's inter-token latencies: their exact sum and count, and their histogram over
    ``edges`` (``np.searchsorted(edges, v)`` indexes its bins)."""

    total_s: float
    count: int
    hist: np.ndarray
    edges: np.ndarray

    @classmethod
    def of(cls, s: state.Core) -> "InterTokenLatencies":
        return cls(float(s.clock[state.ITL_SUM]), int(s.count[state.ITL_COUNT]), s.itl_hist, s.itl_edges)


def request_latencies(t) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each request's TTFT, TPOT, E2EL and normalized latency in seconds (NaN where it did not
    finish), as its client sees them: TTFT and E2EL include ``t.frontend_s``, the time it spends
    outside the engine (the cost model's: ``sim/cost/serving.py``; 0 for the others). TPOT is
    vLLM's: the time after the first token over the ``output - 1`` tokens that follow it (NaN
    for one-token outputs); normalized latency is E2EL per output token."""
    return tuple(request_latency(t, name) for name in LATENCY_COLUMNS)


#: :func:`request_latency`'s names, in :func:`request_latencies`' order
LATENCY_COLUMNS = ("ttft", "tpot", "e2el", "normalized")


def request_latency(t, name: str, rows=slice(None)) -> np.ndarray:
    """One of :func:`request_latencies` (``name`` of :data:`LATENCY_COLUMNS`), of ``rows`` alone
    (a mask or a slice): the summary reads one at a time, each over the finished requests, so
    that ten million requests hold one latency array at a time, not eight."""
    # each a new array worked on in place, one column of ``rows`` beside it at a time
    if name in ("ttft", "e2el"):
        latency = own_rows(t.first_token_s if name == "ttft" else t.finish_s, rows)
        latency -= t.arrival_s[rows]
        latency += t.frontend_s
        return latency
    with np.errstate(invalid="ignore", divide="ignore"):
        if name == "tpot":
            latency = own_rows(t.finish_s, rows)
            latency -= t.first_token_s[rows]
            after_first = own_rows(t.output, rows)
            after_first -= 1
            latency /= after_first
            latency[after_first < 1] = np.nan
            return latency
        latency = request_latency(t, "e2el", rows)
        latency /= t.output[rows]
        return latency


def own_rows(column: np.ndarray, rows) -> np.ndarray:
    """``column[rows]`` in an array of its own (a mask's selection is; a slice's view is copied)."""
    part = column[rows]
    return part.copy() if np.may_share_memory(part, column) else part


#: ``status`` in words, by the core's status (any other: ``unfinished``)
STATUS_WORDS = {Status.FINISHED: "finished", Status.REJECTED: "rejected"}


def request_columns(table, reject_reason: np.ndarray) -> dict:
    """One row per request, by column: the table's columns as the run left them, its latencies,
    and why it was rejected (``reject_reason``, in words: ``sim.core.outcome.reject_reasons``).
    Numbers as numpy arrays; the words as Arrow string arrays, the status by code into its three
    words (a numpy array of strings would take 40 bytes a request)."""
    import pyarrow as pa

    t = table
    words = ["unfinished", *STATUS_WORDS.values()]
    code = np.zeros(len(t.status), np.int8)
    for k, status in enumerate(STATUS_WORDS, start=1):
        code[t.status == status] = k
    ttft, tpot, e2el, norm = (RowsOf(lambda rows, name=name: request_latency(t, name, rows), len(t.status))
                              for name in LATENCY_COLUMNS)
    return {
        "request_id": pa.array(t.request_id), "arrival_s": t.arrival_s, "prompt_tokens": t.prompt,
        "output_tokens": t.output, "n": t.n, "beam_width": t.beam,
        "status": pa.DictionaryArray.from_arrays(code, words),
        "reject_reason": pa.array(reject_reason, pa.string()), "first_token_s": t.first_token_s,
        "finish_s": t.finish_s, "ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el,
        "normalized_latency_s": norm, "preemptions": t.preemptions,
        **({"priority": t.priority} if getattr(t, "has_priority", False) else {}),
    }


class RowsOf:
    """A column computed for the rows it is asked for (``column[first:last]``, ``column[:]``): the
    request table's latencies, which a writer going a block at a time (``sim.csv_writer``) then
    holds a block of, not four whole columns (ten million requests: 0.3 GB)."""

    def __init__(self, compute, length: int):
        self.compute, self.length = compute, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self.compute(rows)


def request_frame(table, reject_reason: np.ndarray) -> "pd.DataFrame":
    """:func:`request_columns` as a DataFrame."""
    return frame_of(request_columns(table, reject_reason))


def frame_of(columns: "dict | pd.DataFrame") -> "pd.DataFrame":
    """Columns by name (numpy, or Arrow as :func:`request_columns` gives the words) as a
    DataFrame: the words as pandas' strings."""
    import pandas as pd
    import pyarrow as pa

    if isinstance(columns, pd.DataFrame):
        return columns

    def frame_column(column):
        if isinstance(column, RowsOf):
            column = column[:]
        if isinstance(column, pa.DictionaryArray):
            column = column.dictionary_decode()
        return column.to_pandas() if isinstance(column, (pa.Array, pa.ChunkedArray)) else column

    return pd.DataFrame({name: frame_column(column) for name, column in columns.items()})


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


def peak_concurrency(start_s: np.ndarray, end_s: np.ndarray, rows=slice(None)) -> int:
    """vLLM's ``max_concurrent_requests``: the most requests in flight at one instant, each in
    flight over [start, end), so one ending when another starts is not counted with it (the
    sweep of serve.py lines 713-734: at equal times departures first). ``rows``: those requests
    alone (a mask or a slice)."""
    # the count only rises at a start: after the k-th start (in time), k starts less the ends at
    # or before it (two sorts and a merge, not a sort of both together: ten million requests
    # 1.5 s, not 3.5), merged a chunk of starts at a time (no request-long temporaries)
    starts, ends = (own_rows(np.asarray(times, float), rows) for times in (start_s, end_s))
    starts.sort(kind="stable")  # timsort: arrivals come in order, and it finds them so in one pass
    ends.sort()
    n = len(starts)
    if not n:
        return 0
    chunk = 1 << 20
    return int(max((np.arange(k + 1, k + 1 + len(part)) - np.searchsorted(ends, part, side="right")).max()
                   for k, part in ((k, starts[k:k + chunk]) for k in range(0, n, chunk))))


def prefix_cache_hit_rate(hit_tokens: int, queried_tokens: int) -> float:
    """Prompt tokens found in the prefix cache / prompt tokens looked up (NaN before any lookup):
    vLLM's prefix-cache hit rate, ``hits / queries`` in tokens (``vllm/v1/metrics/stats.py`` at
    commit 28ed1fb87ed5, ``CachingMetrics.hit_rate``, line 110; ``PrefixCacheStats.record``, lines
    130-140). vLLM counts the lookups of requests resumed after a preemption apart; here every
    admission counts, so the two agree on runs without preemptions."""
    return hit_tokens / queried_tokens if queried_tokens else float("nan")


def host_tier_summary(gpu_hits: int, host_hits: int, lookups: int, loaded: int, stored: int, evicted: int,
                      used: int, capacity: int, block_bytes: float) -> dict[str, float]:
    """vllm-v1's CPU offload tier (sim/core/kv/host_tier.py), or sglang's (sim/core/kv/radix_cache.py, its
    pages for blocks): the share of prompt tokens looked up
    that each tier supplied (the GPU prefix cache first, the host tier past it; vLLM counts the
    connector's hits apart, ``connector_prefix_cache_stats``, v1/core/sched/scheduler.py:1486-1505),
    the bytes loaded and stored over the host link, its evictions, and its blocks in use at the end."""
    nan = float("nan")
    return {"gpu_prefix_hit_rate": gpu_hits / lookups if lookups else nan,
            "host_prefix_hit_rate": host_hits / lookups if lookups else nan,
            "host_loaded_gib": loaded * block_bytes / (1 << 30), "host_stored_gib": stored * block_bytes / (1 << 30),
            "host_evicted_blocks": evicted, "host_blocks_used": used, "host_blocks": capacity,
            "host_occupancy": used / capacity if capacity else nan}


def speculative_summary(drafted: int, accepted: int, verified: int) -> dict[str, float]:
    """Speculative decoding's counts as vLLM's spec-decode metrics put them
    (``vllm/v1/spec_decode/metrics.py``): the acceptance rate (accepted / drafted tokens), the
    mean accepted drafts per verification (a decoding request's step with drafts) and the tokens
    such a step emits, its accepted drafts and one more (the mean acceptance length); NaN before
    any verification."""
    nan = float("nan")
    return {"spec_acceptance_rate": accepted / drafted if drafted else nan,
            "spec_accepted_per_step": accepted / verified if verified else nan,
            "spec_tokens_per_step": 1 + accepted / verified if verified else nan,
            "spec_draft_tokens": drafted, "spec_accepted_tokens": accepted}


#: the overload rule's thresholds (:func:`overload_summary`)
OVERLOAD_MIN_QUEUE = 10
OVERLOAD_QUEUE_SHARE = 0.1


def overload_summary(arrival_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
                     status: np.ndarray, reject_code: np.ndarray | None = None,
                     client_timeout_s: float | None = None) -> dict:
    """Whether the run's arrivals outran its service, over the arrival window (the first arrival
    to the last): ``arrival_rate`` (every request, over the window, req/s),
    ``completion_rate_while_arriving`` (the requests finished within it, over it),
    ``queue_at_last_arrival`` (the requests arrived, not rejected, without a first token at the
    last arrival) and ``overloaded``: that queue holds at least :data:`OVERLOAD_MIN_QUEUE` (10)
    requests and :data:`OVERLOAD_QUEUE_SHARE` (10 %) of the arrivals. In rates: requests arrived
    at 1/0.9 = 1.11 x or more the rate they got a first token while arriving, and so at 1.11 x or
    more the rate they finished (a waiting request has not finished). A stable engine's queue is
    the arrival rate times the wait for a first token (Little's law), a small share of a long
    window that does not grow with it; an engine past its saturation leaves the difference of
    the rates waiting every second, so its latency percentiles depend on how long the run lasted,
    not on the engine. A lag of finishes alone is no overload (in a short stable run requests
    finish after the window), nor is a burst early in a trace whose queue drained by the last
    arrival. Arrivals all at one instant (an offline burst: no window) measure throughput and are
    never overloaded; their rates are NaN. A request its client gave up on (``reject_code``
    ``state.REJECT_CLIENT_TIMEOUT``, after ``client_timeout_s``) was still there at the last
    arrival where it arrived less than the timeout before it: it counts in that queue as the
    others do (an overload past the client's patience rejects the queue it built)."""
    arrival_s = np.asarray(arrival_s, dtype=float)
    arrived = len(arrival_s)
    first, last = (float(arrival_s.min()), float(arrival_s.max())) if arrived else (0.0, 0.0)
    window = last - first
    finished = int(((status == Status.FINISHED) & (finish_s <= last)).sum())
    there = status != Status.REJECTED
    if client_timeout_s is not None and reject_code is not None:
        there = there | ((reject_code == state.REJECT_CLIENT_TIMEOUT) & (arrival_s + client_timeout_s > last))
    with np.errstate(invalid="ignore"):  # (a NaN first token: none yet, so waiting)
        queue = int((there & ~(first_token_s <= last)).sum())
    overloaded = window > 0 and queue >= max(OVERLOAD_MIN_QUEUE, OVERLOAD_QUEUE_SHARE * arrived)
    nan = float("nan")
    return {"arrival_window_s": window, "arrival_rate": arrived / window if window > 0 else nan,
            "completion_rate_while_arriving": finished / window if window > 0 else nan,
            "queue_at_last_arrival": queue, "overloaded": bool(overloaded)}


#: completions the second half of a saturated phase must hold for its rate to be taken (:func:`saturated_throughput`)
SATURATED_MIN_FINISHED = 20


def saturated_throughput(arrival_s: np.ndarray, first_token_s: np.ndarray, finish_s: np.ndarray,
                         status: np.ndarray) -> float:
    """The engine's request throughput while it is saturated: from the first arrival to the last
    request's first token some request waits, so the engine runs as full as it can; over the
    second half of that phase (past the first requests' own latency, which no finish precedes),
    the requests finished per second. An offline burst's ``completed / duration`` is lower: its
    drain, the last requests running with nobody behind them, is no saturation. NaN where that
    half holds fewer than :data:`SATURATED_MIN_FINISHED` finishes (the requests never kept the
    engine full long enough to measure)."""
    started = np.isfinite(first_token_s)
    if not started.any():
        return float("nan")
    begin, full_until = float(np.min(arrival_s)), float(np.max(first_token_s[started]))
    half = begin + (full_until - begin) / 2
    finished = int(((status == Status.FINISHED) & (finish_s > half) & (finish_s <= full_until)).sum())
    if finished < SATURATED_MIN_FINISHED:
        return float("nan")
    return finished / (full_until - half)


def overload_words(s: dict) -> str | None:
    """The summary's overload in a sentence (None if :func:`overload_summary` found none)."""
    if not s.get("overloaded"):
        return None
    return (f"requests arrived at {s['arrival_rate']:.3g} req/s and finished at "
            f"{s['completion_rate_while_arriving']:.3g} req/s while arriving; {s['queue_at_last_arrival']:,} waited "
            "for a first token at the last arrival; latency percentiles describe a queue that grows with the run's "
            "length")


def summarize(table, rec: StepRecords, itl: InterTokenLatencies, num_preemptions: int, *, duration_s: float,
              wall_time_s: float, extra: dict | None = None, options: SummaryOptions = SummaryOptions(),
              client_timeout_s: float | None = None) -> dict:
    t = table
    fin = t.status == Status.FINISHED
    completed = int(fin.sum())
    out_tokens = int(np.dot(t.output, np.where(fin, t.width, 0)))  # (exact in int64; one temporary)
    in_tokens = int(t.prompt[fin].sum())
    dur = duration_s if duration_s > 0 else float("nan")
    nan = float("nan")

    def stats(name: str) -> dict:
        """The finished requests' latency ``name`` (its NaNs left out): mean, median, std and
        percentiles in ms, from one array (ten million requests: 80 MB) and a temporary of np.std."""
        v = request_latency(t, name, fin)
        if np.isnan(v).any():
            v = v[~np.isnan(v)]
        v *= 1e3
        pct = options.percentiles if name in options.percentile_metrics else ()
        if not len(v):
            return {f"mean_{name}_ms": nan, f"median_{name}_ms": nan, f"std_{name}_ms": nan,
                    **{f"p{percentile_word(p)}_{name}_ms": nan for p in pct}}
        mean, std = float(v.mean()), float(np.std(v))
        # the order statistics partition v in place, after the sums have read it in its order
        median = float(np.median(v, overwrite_input=True))
        return {f"mean_{name}_ms": mean, f"median_{name}_ms": median, f"std_{name}_ms": std,
                **{f"p{percentile_word(p)}_{name}_ms": float(np.percentile(v, p, overwrite_input=True))
                   for p in pct}}

    s = {
        "completed": completed,
        "rejected": int((t.status == Status.REJECTED).sum()),
        "unfinished": int(((t.status != Status.FINISHED) & (t.status != Status.REJECTED)).sum()),
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
        good = meets_slos(np.ones(completed, bool), {f"{m}_s": request_latency(t, m, fin) for m in GOODPUT_METRICS},
                          {f"{m}_s": v for m, v in options.goodput_slo_s})
        s["request_goodput"] = int(good.sum()) / dur
    s.update(stats("ttft"))
    s.update(stats("tpot"))
    itl_sum, itl_count, itl_hist, itl_edges = itl
    itl_mean = itl_sum / itl_count * 1e3 if itl_count else nan
    s.update({"mean_itl_ms": itl_mean,
              "median_itl_ms": _hist_quantile(itl_edges, itl_hist, 0.5) * 1e3,
              "std_itl_ms": _hist_std(itl_edges, itl_hist) * 1e3})
    if "itl" in options.percentile_metrics:
        s.update({f"p{percentile_word(p)}_itl_ms": _hist_quantile(itl_edges, itl_hist, p / 100) * 1e3
                  for p in options.percentiles})
    s.update(stats("e2el"))
    s["max_concurrent_requests"] = peak_concurrency(t.arrival_s, t.finish_s, fin)
    s["normalized_latency_s_per_token"] = float(np.mean(request_latency(t, "normalized", fin))) if completed else nan
    s["avg_batch_size"] = rec.running_weighted / rec.busy_s if rec.busy_s > 0 else 0.0
    s["num_preemptions"] = int(num_preemptions)
    s.update(overload_summary(t.arrival_s, t.first_token_s, t.finish_s, t.status, t.reject_code,
                              client_timeout_s))
    s["saturated_request_throughput"] = saturated_throughput(t.arrival_s, t.first_token_s, t.finish_s, t.status)
    if getattr(t, "has_priority", False):
        s["by_priority"] = priority_classes(t)
    s.update(rec.memory_fractions())
    s["kv_capacity_tokens"] = int(rec.capacity)
    s["num_steps"] = int(rec.num_steps)
    s["busy_s"] = float(rec.busy_s)
    s["idle_s"] = float(rec.idle_s)
    s["wall_time_s"] = float(wall_time_s)
    if extra:
        s.update(extra)
    return s


def priority_classes(t) -> list[dict]:
    """Per priority level of the trace (lower first): its requests, how many finished, their mean
    and p99 TTFT and E2EL in ms, and their preemptions: whom ``--scheduling-policy priority``
    served first, and at whose cost (the same table under FCFS is the comparison)."""
    ttft, _tpot, e2el, _norm = request_latencies(t)
    out = []
    for level in np.unique(t.priority):
        mine = t.priority == level
        fin = mine & (t.status == Status.FINISHED)
        row = {"priority": int(level), "requests": int(mine.sum()), "completed": int(fin.sum()),
               "preemptions": int(t.preemptions[mine].sum())}
        for name, v in (("ttft", ttft[fin] * 1e3), ("e2el", e2el[fin] * 1e3)):
            row[f"mean_{name}_ms"] = float(v.mean()) if len(v) else float("nan")
            row[f"p99_{name}_ms"] = float(np.percentile(v, 99)) if len(v) else float("nan")
        out.append(row)
    return out


def downsample_steps(steps: "pd.DataFrame | None", max_points: int = 5000) -> "pd.DataFrame | None":
    """At most ``max_points`` rows: numeric columns averaged over equal-count bins of consecutive
    steps (timelines for plots and reports stay small; the full table stays in steps.csv)."""
    if steps is None or len(steps) <= max_points:
        return steps
    k = -(-len(steps) // max_points)
    num = steps.select_dtypes("number")
    return num.groupby(np.arange(len(num)) // k).mean().reset_index(drop=True)
