"""Fig. 12: normalized latency against request rate, and the sustainable-rate ratios."""

from __future__ import annotations

import math

import pandas as pd

from pagesim.experiments import paper
from pagesim.experiments.figures.common import (KNEE_BRACKET, KNEE_ROUNDS, SweepOptions, rate_curves_section,
                                                refine_knees, run_figure)
from pagesim.experiments.run_spec import results_frame

#: what the figure shows, in ``reproduce all``'s closing table
TITLE = "sustainable rate"
#: the tables that hold its rows compared with the paper's (``note``: where we miss); default its own
COMPARED = ("fig12_ratios",)

#: the experiment configs (experiments/configs/<name>.toml) whose runs it reads
EXPERIMENTS = ("fig12",)
#: a rate is sustainable while normalized latency stays at or under this (s/token)
LATENCY_THRESHOLD_S = 0.25
#: the columns of fig12.csv after workload, system, rate and duration_s
FIG12_COLS = ("normalized_latency_s_per_token", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms",
              "request_throughput", "avg_batch_size", "num_preemptions", "completed", "rejected")


def run(opts: SweepOptions | None = None, *, quick: bool = False, scale: float = 1.0) -> pd.DataFrame:
    """Fig. 12: normalized latency (mean end-to-end latency / output tokens, s/token) vs request
    rate for the four systems on ShareGPT and Alpaca. Columns: ``workload, system, rate,
    normalized_latency_s_per_token, mean_ttft_ms, ...`` (see :data:`FIG12_COLS`)."""
    opts, specs, summaries = run_figure("fig12", opts, quick, scale)
    specs, summaries = refine_knees(opts, specs, summaries, lambda spec: (spec.workload, spec.system),
                                    LATENCY_THRESHOLD_S, rounds=0 if quick else KNEE_ROUNDS)  # (--quick: a smoke test)
    df = results_frame(specs, summaries)  # duration_s: the run's own, from its summary
    df["trace_s"] = [spec.duration_s for spec in specs]  # the arrivals' window it replayed
    cols = ["workload", "system", "rate", "duration_s", "trace_s"] + [c for c in FIG12_COLS if c in df]
    return df[cols].sort_values(["workload", "system", "rate"], kind="stable").reset_index(drop=True)


def sustainable_rate(rates, latencies, threshold: float = LATENCY_THRESHOLD_S) -> tuple[float, str]:
    """The highest rate whose normalized latency stays <= ``threshold``: linear interpolation
    between the last probe under it and the first over it. Returns (rate, how)."""
    pts = sorted(zip(rates, latencies))
    prev = None
    for r, lat in pts:
        if lat is None or math.isnan(lat) or lat > threshold:
            if prev is None:
                return math.nan, f"over threshold already at the lowest probed rate {r:g}"
            pr, pl = prev
            if lat is None or math.isnan(lat):
                return pr, "last probe before a failed run"
            return pr + (r - pr) * (threshold - pl) / (lat - pl), "interpolated"
        prev = (r, lat)
    if prev is None:
        return math.nan, "no probes"
    return prev[0], "censored: under threshold at every probed rate"


#: a rate read this far above what a system served at the highest probe exceeds its capacity (a
#: probe's throughput differs from its rate by its drain and its arrivals' noise: 2.06 req/s at 2)
OVER = 1.05
#: why a rate read above a system's capacity is not read (:func:`capacity_reading`), as the
#: figures' readings say it
ABOVE_CAPACITY = ("a rate above a system's capacity cannot be sustained, and a probe of a fixed count of "
                  "requests keeps the queue an overload builds, and the latency with it, short of the threshold "
                  "past that capacity")


def capacity_reading(rates, latencies, served, threshold: float = LATENCY_THRESHOLD_S) -> tuple[float, str, float]:
    """:func:`sustainable_rate`, checked against the system's capacity: what it served at the
    highest probed rate (``served``: each probe's throughput, in the rates' units), where that
    probe overloaded it (NaN where none did). A rate read above it is not the system's but its
    trace length's (:data:`ABOVE_CAPACITY`); ``how`` then says so. Returns (rate, how, capacity)."""
    rate, how = sustainable_rate(rates, latencies, threshold)
    top_rate, capacity = max(zip(rates, served))
    if not capacity * OVER < top_rate:
        return rate, how, math.nan
    if how in ("interpolated", "censored: under threshold at every probed rate") and rate > OVER * capacity:
        how = f"above its capacity, {capacity:.1f} req/s"
    return rate, how, capacity


def rate_ratio(vllm: tuple[float, str, float], other: tuple[float, str, float]) -> tuple[float, str]:
    """vLLM's ratio over another system from their :func:`capacity_reading`: by sustainable rate
    where both read one under their capacity ("sustainable rate"); where either read one above
    it, by capacity, the throughput when each is overloaded ("capacity"; NaN unless both were)."""
    if "above its capacity" in vllm[1] + other[1]:
        return vllm[2] / other[2], "capacity"
    return (vllm[0] / other[0] if other[0] and not math.isnan(other[0]) else math.nan), "sustainable rate"


def ratios(curves: pd.DataFrame, threshold: float = LATENCY_THRESHOLD_S) -> pd.DataFrame:
    """Sustainable rate per (workload, system), checked against its capacity, and vLLM's ratio
    over each Orca variant (by capacity where a rate reads above it: :func:`rate_ratio`), against
    the paper's ranges (ShareGPT only). Columns: ``workload, system, sustainable_rate, how,
    capacity, threshold_s_per_token, vllm_ratio, measure, paper_ratio_low, paper_ratio_high,
    in_paper_range, note``."""
    rows = []
    for wl, g in curves.groupby("workload", sort=False):
        readings = {}
        for sysname, h in g.groupby("system", sort=False):
            readings[sysname] = capacity_reading(h["rate"], h["normalized_latency_s_per_token"],
                                                 h["request_throughput"], threshold)
        vllm = readings.get("vllm", (math.nan, "", math.nan))
        for sysname, (rate, how, capacity) in readings.items():
            ratio, measure = rate_ratio(vllm, (rate, how, capacity)) if sysname != "vllm" else (math.nan, "")
            low, high = paper.fig12_paper_ratio(sysname, wl) if sysname != "vllm" else (math.nan, math.nan)
            inside = (low <= ratio <= high) if not (math.isnan(low) or math.isnan(ratio)) else None
            note = ""
            if inside is False:
                note = f"ratio {ratio:.2f}x outside the paper's {low:g}-{high:g}x"
            if "censored" in how or "lowest" in how:
                note = (note + "; " if note else "") + how
            rows.append({"workload": wl, "system": sysname, "sustainable_rate": rate, "how": how, "capacity": capacity,
                         "threshold_s_per_token": threshold, "vllm_ratio": ratio, "measure": measure,
                         "paper_ratio_low": low,
                         "paper_ratio_high": high, "in_paper_range": inside, "note": note})
    return pd.DataFrame(rows)


def explain(curves: pd.DataFrame, ratio_table: pd.DataFrame | None = None) -> str:
    if curves is None or curves.empty:
        return "No Fig. 12 results."
    table = ratios(curves) if ratio_table is None else ratio_table
    lines = [f"Sustainable rate = highest rate with normalized latency <= {table['threshold_s_per_token'].iloc[0]:g} "
             "s/token, interpolated between probes, each knee probed again until the probes around it are at most "
             f"{KNEE_BRACKET:g}x apart (common.refine_knees): the paper reads it off curves that blow up."]
    for wl, g in table.groupby("workload", sort=False):
        parts = []
        for r in g.itertuples():
            if r.system == "vllm":
                continue
            s = f"{r.vllm_ratio:.2f}x over {r.system}"
            if not math.isnan(r.paper_ratio_low):
                s += f" (paper {r.paper_ratio_low:g}-{r.paper_ratio_high:g}x)"
            parts.append(s)
        lines.append(f"{wl}: vLLM sustains " + ", ".join(parts) + ".")
    if table["note"].fillna("").str.contains("censored|lowest").any():
        lines.append("Some systems never (or always) crossed the threshold within the probed rates: widen the rate "
                     "grid in fig12.toml for exact ratios.")
    # the trace each probe replayed, as run: fig12.toml's hour, times --scale (--quick: short ones)
    traces = sorted(set(curves["trace_s"].dropna())) if "trace_s" in curves else []
    if traces == [3600.0]:
        length = "a 1-hour trace, as the paper's (fig12.toml)"
    elif traces:
        length = ("a " + " or ".join(f"{t:,.0f}-s" for t in traces) + " trace (the paper's, and fig12.toml's at "
                  "--scale 1, are 1 hour)")
    else:  # --quick's traces are request counts, no duration
        length = "a fixed number of requests (--quick), where the paper's traces are 1 hour"
    lines.append(f"Each probe replays {length}; with 2-10-minute traces the knees came later, since a queue past a "
                 "system's capacity grows with the trace's length (ShareGPT: vLLM over Orca-Oracle 2.5x then, "
                 "against the paper's 1.7-2.7x). The paper's ranges span OPT-13B/66B/175B; we simulate OPT-13B "
                 "only.")
    return " ".join(lines)


def tables(opts: SweepOptions, *, quick: bool = False, scale: float = 1.0) -> dict[str, pd.DataFrame]:
    """What ``reproduce fig12`` writes: the latency curves and the sustainable-rate ratios."""
    curves = run(opts, quick=quick, scale=scale)
    return {"fig12": curves, "fig12_ratios": ratios(curves)}


def section(rep, curves: pd.DataFrame, read) -> None:
    """Fig. 12's part of the reproduce report (:func:`figures.common.rate_curves_section`)."""
    from pagesim.experiments import paper_plots as P  # plotly: only the report draws (see figures/__init__.py)

    rate_curves_section(rep, "fig12", curves, read, ratios, explain, "Fig. 12: normalized latency vs request rate",
                        ratio_figure=P.sustainable_rate_ratios)
