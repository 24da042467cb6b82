"""Plotly figures of the vLLM paper's figures from ``pagesim reproduce``'s tables (``fig2.csv``,
``fig12.csv``, ...): ours beside the paper's, systems in the paper's order.

Every function takes a DataFrame in the layout its CSV has and returns a
``plotly.graph_objects.Figure`` with a title; one run's own plots are ``reports/figures.py``'s.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pagesim.experiments.paper import FIG2_CATEGORIES, PAPER_SYSTEMS
from pagesim.reports.figures import LAYOUT, SYSTEM_COLORS
from pagesim.sim.metrics import downsample_steps as downsample

#: Fig. 2's colours (token states green, reservation yellow, fragmentation red/grey)
CATEGORY_COLORS = {
    "token_states": "#2ca02c",
    "reservation": "#f2c12e",
    "internal_frag": "#d62728",
    "external_frag_and_others": "#9e9e9e",
}


CATEGORY_LABELS = {
    "token_states": "Token states",
    "reservation": "Reservation",
    "internal_frag": "Internal fragmentation",
    "external_frag_and_others": "External fragmentation & others",
}


#: the paper's bars and bands
PAPER_COLOR = "#bdbdbd"


def _ordered_systems(systems) -> list[str]:
    systems = list(dict.fromkeys(systems))
    return [s for s in PAPER_SYSTEMS if s in systems] + [s for s in systems if s not in PAPER_SYSTEMS]


def memory_breakdown_bar(fig2_df: pd.DataFrame, title: str = "Fig. 2: where KV-cache memory goes") -> go.Figure:
    """Stacked bars of the four categories (percent), ours beside the paper's for each system.

    ``fig2_df``: one row per system with the four category columns and ``paper_<col>`` (as
    ``fig2.csv``); rows without paper numbers show ours only."""
    systems = _ordered_systems(fig2_df["system"])
    d = fig2_df.set_index("system")
    xs_sys, xs_src = [], []
    for s in systems:
        has_paper = any(pd.notna(d.loc[s].get(f"paper_{c}")) for c in FIG2_CATEGORIES)
        for src in (("paper", "pagesim") if has_paper else ("pagesim",)):
            xs_sys.append(s)
            xs_src.append(src)
    fig = go.Figure()
    for c in FIG2_CATEGORIES:
        ys = []
        for s, src in zip(xs_sys, xs_src):
            v = d.loc[s].get(c if src == "pagesim" else f"paper_{c}")
            ys.append(None if v is None or pd.isna(v) else float(v))
        fig.add_trace(go.Bar(name=CATEGORY_LABELS[c], x=[xs_sys, xs_src], y=ys, marker_color=CATEGORY_COLORS[c],
                             hovertemplate="%{x}<br>" + CATEGORY_LABELS[c] + ": %{y:.1f}%<extra></extra>"))
    fig.update_layout(barmode="stack", title=title, yaxis_title="% of KV cache (time-weighted)", **LAYOUT)
    fig.update_yaxes(range=[0, 100])
    return fig


def memory_timelines(timeline: pd.DataFrame, title: str = "Fig. 2 runs: memory categories over time",
                     max_points: int = 5000) -> go.Figure:
    """One panel per system from ``fig2_timeline.csv`` (percent columns of the four categories)."""
    systems = _ordered_systems(timeline["system"])
    fig = make_subplots(rows=len(systems), cols=1, shared_xaxes=True, subplot_titles=systems,
                        vertical_spacing=0.06)
    for i, s in enumerate(systems, start=1):
        g = downsample(timeline[timeline["system"] == s].drop(columns="system"), max_points)
        for c in FIG2_CATEGORIES:
            fig.add_trace(go.Scatter(x=g["start_s"], y=g[c], name=CATEGORY_LABELS[c], mode="lines",
                                     stackgroup=f"m{i}", line=dict(width=0.5, color=CATEGORY_COLORS[c]),
                                     legendgroup=c, showlegend=i == 1), row=i, col=1)
        fig.update_yaxes(range=[0, 100], title_text="%", row=i, col=1)
    fig.update_xaxes(title_text="simulated time (s)", row=len(systems), col=1)
    fig.update_layout(title=title, **{**LAYOUT, "height": 220 * len(systems) + 80})
    return fig


def latency_vs_rate(curves: pd.DataFrame, title: str = "Fig. 12: normalized latency vs request rate",
                    threshold: float | None = None) -> go.Figure:
    """One panel per workload; one line per system (``fig12.csv``)."""
    wls = list(dict.fromkeys(curves["workload"]))
    fig = make_subplots(rows=1, cols=len(wls), subplot_titles=wls)
    for i, wl in enumerate(wls, start=1):
        g = curves[curves["workload"] == wl]
        for s in _ordered_systems(g["system"]):
            h = g[g["system"] == s].sort_values("rate")
            fig.add_trace(go.Scatter(x=h["rate"], y=h["normalized_latency_s_per_token"], mode="lines+markers", name=s,
                                     legendgroup=s, showlegend=i == 1, line=dict(color=SYSTEM_COLORS.get(s))),
                          row=1, col=i)
        if threshold is not None:
            fig.add_hline(y=threshold, line_dash="dot", line_color="grey", row=1, col=i)
        top = g["normalized_latency_s_per_token"].max()
        if pd.notna(top) and top > 1:
            fig.update_yaxes(range=[0, 1.05], row=1, col=i)  # like the paper: the curves leave the plot
        fig.update_xaxes(title_text="request rate (req/s)", row=1, col=i)
    fig.update_yaxes(title_text="normalized latency (s/token)", row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig


def log_band(fig: go.Figure, low: float, high: float, text: str, col: int) -> None:
    """The paper's range ``low``..``high`` shaded on panel ``col``'s log x axis, widened to the
    neighbouring half-octave, with ``text`` at its top left. The label is an annotation of its
    own: plotly places a shape on a log axis by value but an annotation by log10 of it, so the
    label ``add_vrect`` attaches (at x = 11) sat at 10^11 and squeezed the panel's points into its
    left edge."""
    x0, x1 = low / 2 ** 0.5, high * 2 ** 0.5
    fig.add_vrect(x0=x0, x1=x1, fillcolor=PAPER_COLOR, opacity=0.35, line_width=0, row=1, col=col)
    fig.add_annotation(x=math.log10(x0), y=1, yref="y domain", text=text, showarrow=False, xanchor="left",
                       yanchor="top", row=1, col=col)  # inside the panel, below its title


def block_size_sweep(df: pd.DataFrame, title: str = "Fig. 18b: normalized latency vs block size (vLLM)") -> go.Figure:
    """One panel per workload (``fig18b.csv``): our latency per block size, and the paper's best
    block sizes (``paper_best_low``..``paper_best_high``) as a shaded band."""
    wls = list(dict.fromkeys(df["workload"]))
    fig = make_subplots(rows=1, cols=len(wls), subplot_titles=wls)
    for i, wl in enumerate(wls, start=1):
        g = df[df["workload"] == wl].sort_values("block_size")
        fig.add_trace(go.Scatter(x=g["block_size"], y=g["normalized_latency_s_per_token"], mode="lines+markers",
                                 name="pagesim", legendgroup="pagesim", showlegend=i == 1,
                                 line=dict(color=SYSTEM_COLORS["vllm"])), row=1, col=i)
        low, high = (g[c].iloc[0] if c in g else np.nan for c in ("paper_best_low", "paper_best_high"))
        if pd.notna(low) and pd.notna(high):
            log_band(fig, low, high, f"paper: best {low:g}-{high:g}", col=i)
        fig.update_xaxes(type="log", tickvals=sorted(g["block_size"].unique()), title_text="block size (tokens)",
                         row=1, col=i)
    fig.update_yaxes(title_text="normalized latency (s/token)", row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig


def recompute_vs_swap(df: pd.DataFrame, micro: pd.DataFrame | None = None,
                      title: str = "Fig. 19: recompute vs swap against block size") -> go.Figure:
    """Left (``fig19_micro.csv``): the cost model's ms to recompute, swap out, swap in and swap
    both ways, bars per block size. Right (``fig19.csv``): normalized latency per block size with
    each recovery, the paper's comparable block sizes shaded."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["(a) microbenchmark", "(b) end to end"])
    if micro is not None:
        x = micro["block_size"].astype(str)
        for col, name in (("recompute_ms", "recompute"), ("swap_in_ms", "swap in"), ("swap_out_ms", "swap out"),
                          ("swap_in_out_ms", "swap in + out")):
            fig.add_trace(go.Bar(x=x, y=micro[col], name=name), row=1, col=1)
        fig.update_xaxes(title_text="block size (tokens)", row=1, col=1)
        fig.update_yaxes(title_text="time (ms)", row=1, col=1)
    for col, name in (("recompute_latency_s_per_token", "recompute (end to end)"),
                      ("swap_latency_s_per_token", "swap (end to end)")):
        fig.add_trace(go.Scatter(x=df["block_size"], y=df[col], mode="lines+markers", name=name), row=1, col=2)
    low, high = (df[c].iloc[0] if c in df else np.nan for c in ("paper_comparable_low", "paper_comparable_high"))
    if pd.notna(low) and pd.notna(high):
        log_band(fig, low, high, f"paper: comparable {low:g}-{high:g}", col=2)
    fig.update_xaxes(type="log", tickvals=sorted(df["block_size"].unique()), title_text="block size (tokens)",
                     row=1, col=2)
    fig.update_yaxes(title_text="normalized latency (s/token)", row=1, col=2)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def sustainable_rate_ratios(ratios: pd.DataFrame,
                            title: str = "Fig. 12: vLLM's sustainable rate over each Orca variant") -> go.Figure:
    """From ``fig12_ratios.csv``: our ratio per baseline system and workload as bars, the paper's
    range (``paper_ratio_low``..``paper_ratio_high``, ShareGPT) as a grey bar from low to high."""
    r = ratios[ratios["system"] != "vllm"]
    wls = list(dict.fromkeys(r["workload"]))
    fig = make_subplots(rows=1, cols=max(len(wls), 1), subplot_titles=wls)
    for i, wl in enumerate(wls, start=1):
        g = r[r["workload"] == wl].set_index("system")
        systems = _ordered_systems(g.index)
        low, high = g["paper_ratio_low"].reindex(systems), g["paper_ratio_high"].reindex(systems)
        if low.notna().any():
            first = not any(t.name == "paper range" for t in fig.data)
            fig.add_trace(go.Bar(x=systems, y=(high - low).tolist(), base=low.tolist(), name="paper range",
                                 marker_color=PAPER_COLOR, legendgroup="paper", showlegend=first,
                                 hovertemplate="paper %{base:.1f}-%{y:.1f}x<extra></extra>"), row=1, col=i)
        ours = g["vllm_ratio"].reindex(systems)
        fig.add_trace(go.Bar(x=systems, y=ours.tolist(), name="pagesim", marker_color=SYSTEM_COLORS["vllm"],
                             legendgroup="pagesim", showlegend=i == 1, text=[_label(v, "x") for v in ours],
                             textposition="outside"), row=1, col=i)
    fig.update_yaxes(title_text="vLLM rate / system's rate", row=1, col=1)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def batch_size_bars(df: pd.DataFrame, title: str = "Fig. 13: average batched requests") -> go.Figure:
    """One panel per workload (``fig13.csv``): the paper's batch size per system, then ours for
    each CPU-cost setting (``per_seq_overhead_ms``; ``fig13.csv`` has a row per system and
    setting), labelled with one decimal."""
    wls = list(dict.fromkeys(df["workload"]))
    rates = {wl: df.loc[df["workload"] == wl, "rate"].iloc[0] for wl in wls}
    fig = make_subplots(rows=1, cols=len(wls), subplot_titles=[f"{wl} @ {rates[wl]:g} req/s" for wl in wls])
    setting = df["per_seq_overhead_ms"] if "per_seq_overhead_ms" in df else pd.Series(np.nan, index=df.index)
    shades = ["#d62728", "#ff9896", "#8c564b", "#e377c2"]
    for i, wl in enumerate(wls, start=1):
        g = df[df["workload"] == wl]
        systems = _ordered_systems(g["system"])
        paper = g.groupby("system", sort=False)["paper_avg_batch_size"].first().reindex(systems)
        fig.add_trace(go.Bar(x=systems, y=paper.tolist(), name="paper", marker_color=PAPER_COLOR, legendgroup="paper",
                             showlegend=i == 1, text=[_label(v) for v in paper], textposition="outside"),
                      row=1, col=i)
        for j, (ms, h) in enumerate(g.groupby(setting[g.index], sort=False, dropna=False)):
            ours = h.groupby("system", sort=False)["avg_batch_size"].first().reindex(systems)
            name = "pagesim, the cost model's CPU time" if pd.isna(ms) else f"pagesim, {ms:g} ms CPU/sequence"
            fig.add_trace(go.Bar(x=systems, y=ours.tolist(), name=name, marker_color=shades[j % len(shades)],
                                 legendgroup=name, showlegend=i == 1, text=[_label(v) for v in ours],
                                 textposition="outside"), row=1, col=i)
    fig.update_yaxes(title_text="batched requests", row=1, col=1)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def _label(v, unit: str = "") -> str:
    """A bar's text: one decimal, nothing for a missing value (never 'nan')."""
    return "" if v is None or pd.isna(v) else f"{float(v):.1f}{unit}"


def sharing_bars(df: pd.DataFrame, title: str = "Fig. 15: memory saved by sharing KV blocks") -> go.Figure:
    """Ours per width; the paper's point (Alpaca) or its low-high range over widths (ShareGPT)."""
    panels = list(dict.fromkeys(zip(df["workload"], df["mode"])))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[f"{w} {m}" for w, m in panels])
    for i, (wl, mode) in enumerate(panels, start=1):
        g = df[(df["workload"] == wl) & (df["mode"] == mode)].sort_values("width")
        x = [f"{'n' if mode == 'parallel' else 'beam'}={int(w)}" for w in g["width"]]
        point = g["paper_saving_pct"]
        if point.notna().any():
            fig.add_trace(go.Bar(x=x, y=point, name="paper", marker_color="#bdbdbd", legendgroup="paper",
                                 showlegend=i == 1), row=1, col=i)
        else:
            low, high = g["paper_saving_pct_low"], g["paper_saving_pct_high"]
            fig.add_trace(go.Bar(x=x, y=high - low, base=low, name="paper range", marker_color="#e0e0e0",
                                 legendgroup="range", showlegend=True, opacity=0.8), row=1, col=i)
        fig.add_trace(go.Bar(x=x, y=g["saving_pct"], name="pagesim", marker_color="#d62728", legendgroup="ours",
                             showlegend=i == 1), row=1, col=i)
    fig.update_yaxes(title_text="block saving (%)", row=1, col=1)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def rate_sensitivity(df: pd.DataFrame, title: str = "Fig. 2 sensitivity: token-state share vs request rate") -> go.Figure:
    fig = go.Figure()
    for s in _ordered_systems(df["system"]):
        g = df[df["system"] == s].sort_values("rate")
        fig.add_trace(go.Scatter(x=g["rate"], y=g["token_states"], mode="lines+markers", name=s,
                                 line=dict(color=SYSTEM_COLORS.get(s))))
    fig.update_layout(title=title, xaxis_title="request rate (req/s)", yaxis_title="token states (% of KV)", **LAYOUT)
    return fig


#: the DistServe figure's two designs (DistServe's blue, vLLM's orange, as its Fig. 8)
DESIGN_COLORS = {"disaggregated": "#1f77b4", "colocated": "#ff7f0e"}


#: the measured curves' names (the artifact's systems)
MEASURED_NAMES = {"disaggregated": "DistServe, measured", "colocated": "vLLM 0.1.7, measured"}


def attainment_vs_rate(curves: pd.DataFrame, goodputs: pd.DataFrame, measured: pd.DataFrame | None = None,
                       title: str = "DistServe Fig. 8 (OPT-13B chatbot): SLO attainment vs "
                                    "per-GPU rate") -> go.Figure:
    """From ``distserve.csv``: attainment (percent) per design against per-GPU rate, the target
    as a grey line and each design's goodput (``distserve_goodput.csv``) as a dashed drop line,
    as the paper draws them; the paper's ratio range in the legend's title. ``measured``
    (:func:`paper.distserve_paper_curve`): the artifact's curves, dotted, hollow markers."""
    fig = go.Figure()
    for design, colour in DESIGN_COLORS.items():
        m = pd.DataFrame() if measured is None else measured[measured["design"] == design]
        if len(m):
            m = m.sort_values("per_gpu_rate")
            fig.add_trace(go.Scatter(x=m["per_gpu_rate"], y=100 * m["slo_attainment"],
                                     name=MEASURED_NAMES[design], mode="lines+markers",
                                     line=dict(color=colour, dash="dot"),
                                     marker=dict(symbol="circle-open", size=9)))
        h = curves[curves["design"] == design].sort_values("per_gpu_rate")
        if h.empty:
            continue
        fig.add_trace(go.Scatter(x=h["per_gpu_rate"], y=100 * h["slo_attainment"], name=design,
                                 mode="lines+markers", line=dict(color=colour)))
        g = goodputs[goodputs["design"] == design]
        if len(g) and pd.notna(g["goodput_per_gpu"].iloc[0]):
            x, target = float(g["goodput_per_gpu"].iloc[0]), 100 * float(g["target"].iloc[0])
            hover = f"{design} goodput {x:.2f} req/s/GPU<extra></extra>"
            fig.add_trace(go.Scatter(x=[x, x], y=[0, target], mode="lines", showlegend=False,
                                     line=dict(color=colour, dash="dash"), hovertemplate=hover))
    if len(goodputs):
        fig.add_hline(y=100 * float(goodputs["target"].iloc[0]), line_dash="dot", line_color="grey")
    d = goodputs[goodputs["design"] == "disaggregated"]
    legend = ""
    if len(d) and pd.notna(d["paper_ratio_low"].iloc[0]):
        legend = (f"paper: {d['paper_ratio_low'].iloc[0]:g}-{d['paper_ratio_high'].iloc[0]:g}x; "
                  f"ours {d['ratio_vs_colocated'].iloc[0]:.2f}x")
    fig.update_xaxes(title_text="per-GPU rate (req/s)")
    fig.update_yaxes(title_text="SLO attainment (%)", range=[0, 105])
    fig.update_layout(title=title, legend_title_text=legend, **LAYOUT)
    return fig


def hybrid_memory_bars(memory: pd.DataFrame,
                       title: str = "Hybrid models: where the KV memory goes (GiB per GPU)") -> go.Figure:
    """From ``hybrid_memory.csv``: one stacked bar per run (grouped by model and workload,
    ``vllm`` beside ``vllm-v1``), one segment per category in its order of appearance (the slots
    in use by kind of group green shades, the rest of the pool as Fig. 2's colours, the state
    outside the pool blue)."""
    runs = memory[["model", "workload", "system"]].drop_duplicates()
    x = [[f"{m} {w}" for m, w in zip(runs["model"], runs["workload"])], list(runs["system"])]
    rest = {"reservation": CATEGORY_COLORS["reservation"], "internal fragmentation": CATEGORY_COLORS["internal_frag"],
            "free and other": CATEGORY_COLORS["external_frag_and_others"]}
    greens = iter(("#2ca02c", "#98df8a", "#1b5e20", "#66bb6a"))
    fig = go.Figure()
    for category in dict.fromkeys(memory["category"]):
        c = memory[memory["category"] == category].set_index(["model", "workload", "system"])["gib"]
        ys = [float(c.get((m, w, s), float("nan"))) for m, w, s in runs.itertuples(index=False)]
        colour = rest.get(category) or ("#1f77b4" if not category.startswith("in use") else next(greens, None))
        fig.add_trace(go.Bar(name=category, x=x, y=ys, marker_color=colour,
                             hovertemplate="%{x}<br>" + category + ": %{y:.2f} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", title=title, yaxis_title="GiB per GPU (time-weighted)", **LAYOUT)
    return fig
