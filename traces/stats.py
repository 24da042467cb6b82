"""Summary statistics of a canonical trace (``pagesim trace stats``)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def _dist(x: np.ndarray) -> dict:
    q = np.quantile(x, [v for _, v in QUANTILES]) if x.size else [math.nan] * len(QUANTILES)
    out = {"mean": float(x.mean()) if x.size else math.nan}
    out.update({k: float(v) for (k, _), v in zip(QUANTILES, q)})
    out["max"] = int(x.max()) if x.size else None
    out["min"] = int(x.min()) if x.size else None
    return out


def _busiest_minute(a: np.ndarray) -> int:
    """Most arrivals in one of the minutes [a[0] + 60 k, a[0] + 60 (k + 1)) of sorted ``a``:
    runs of equal minute numbers, so the memory is the rows', not the span's (a bincount over
    a span of 1e12 s would want 251 GiB)."""
    minute = np.floor((a - a[0]) / 60.0)
    starts = np.flatnonzero(np.r_[True, minute[1:] != minute[:-1], True])
    return int(np.diff(starts).max())


def _num(x: float):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def trace_stats(df: pd.DataFrame) -> dict:
    """``rows``, ``duration_s`` (last - first arrival), ``rate_rps`` ((rows - 1) / duration),
    ``prompt_tokens``/``output_tokens``/``total_tokens`` (``mean``, ``p50``, ``p90``, ``p99``
    (linear interpolation), ``max``, ``min``), ``interarrival_cv`` (population std / mean of the
    gaps), ``peak_1min_rps``, ``n``/``beam_width`` means when present, and prefix-block reuse
    when ``prefix_hashes`` is present. Undefined values (e.g. the rate of one request) are None.
    """
    a = df["arrival_s"].to_numpy(dtype=np.float64)
    p = df["prompt_tokens"].to_numpy()
    o = df["output_tokens"].to_numpy()
    rows = int(len(df))
    duration = float(a[-1] - a[0]) if rows else 0.0
    rate = (rows - 1) / duration if rows > 1 and duration > 0 else None
    gaps = np.diff(a)
    cv = float(gaps.std() / gaps.mean()) if gaps.size and gaps.mean() > 0 else None
    peak = float(_busiest_minute(a) / 60.0) if rows and duration >= 60 else None
    out = dict(rows=rows, first_arrival_s=float(a[0]) if rows else None, duration_s=duration, rate_rps=rate,
               interarrival_cv=_num(cv), peak_1min_rps=peak,
               prompt_tokens=_dist(p), output_tokens=_dist(o), total_tokens=_dist(p + o))
    for col in ("n", "beam_width"):
        if col in df.columns:
            out[f"mean_{col}"] = float(df[col].mean())
    if "prefix_hashes" in df.columns and rows:
        lens = df["prefix_hashes"].map(len).to_numpy()
        flat = np.fromiter((h for t in df["prefix_hashes"] for h in t), dtype=np.int64, count=int(lens.sum()))
        unique = int(np.unique(flat).size)
        out["prefix_blocks"] = dict(total=int(flat.size), unique=unique,
                                    reuse_fraction=_num(1 - unique / flat.size) if flat.size else None,
                                    block_tokens=df.attrs.get("hash_block_tokens"))
    if "load_report" in df.attrs:
        rep = df.attrs["load_report"]
        out["load_report"] = {k: rep[k] for k in ("format", "rows_read", "rows_dropped", "rows_resorted", "time_unit",
                                                  "spread_timestamps", "synthetic_arrivals") if k in rep}
    return {k: (_num(v) if isinstance(v, float) else v) for k, v in out.items()}


def format_stats(stats: dict, title: str = "") -> str:
    """A readable table of :func:`trace_stats` output."""
    def f(v, fmt="{:,.2f}"):
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)

    lines = [title] if title else []
    lines += [f"rows             {stats['rows']:,}",
              f"duration         {f(stats['duration_s'], '{:,.1f}')} s",
              f"mean rate        {f(stats['rate_rps'], '{:,.3f}')} req/s",
              f"peak 1-min rate  {f(stats.get('peak_1min_rps'), '{:,.2f}')} req/s",
              f"inter-arrival CV {f(stats['interarrival_cv'], '{:.3f}')}",
              "",
              f"{'tokens':<8} {'mean':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'max':>10}"]
    for key, label in (("prompt_tokens", "prompt"), ("output_tokens", "output"), ("total_tokens", "total")):
        d = stats[key]
        lines.append(f"{label:<8} {f(d['mean']):>10} {f(d['p50'], '{:,.1f}'):>10} {f(d['p90'], '{:,.1f}'):>10} "
                     f"{f(d['p99'], '{:,.1f}'):>10} {f(d['max'], '{:,}'):>10}")
    for col in ("n", "beam_width"):
        if f"mean_{col}" in stats:
            lines.append(f"mean {col:<11} {stats[f'mean_{col}']:g}")
    if "prefix_blocks" in stats:
        pb = stats["prefix_blocks"]
        lines.append(f"prefix blocks    {pb['total']:,} total, {pb['unique']:,} unique, "
                     f"{f(pb['reuse_fraction'] and pb['reuse_fraction'] * 100, '{:.1f}')}% reused "
                     f"({pb['block_tokens']} tokens/block)")
    rep = stats.get("load_report")
    if rep:
        dropped = ", ".join(f"{v} {k}" for k, v in rep.get("rows_dropped", {}).items()) or "none"
        unit = f" (times in {rep['time_unit']})" if rep.get("time_unit") else ""
        lines.append(f"loaded           {rep.get('rows_read', 0):,} rows as {rep.get('format')}{unit}; dropped: {dropped}; "
                     f"out of order: {rep.get('rows_resorted', 0)}")
        if rep.get("synthetic_arrivals"):
            lines.append(f"arrivals         synthetic ({rep['synthetic_arrivals']})")
    return "\n".join(lines)
