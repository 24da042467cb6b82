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

from pagesim.experiments import paper
from pagesim.experiments.paper import FIG2_CATEGORIES, PAPER_SYSTEMS, fig2_paper
from pagesim.reports.chart_checks import squeezed
from pagesim.reports.figures import LAYOUT, OKABE_ITO, SYSTEM_COLORS
from pagesim.sim.metrics import MEMORY_COLORS
from pagesim.sim.metrics import downsample_steps as downsample

#: Fig. 2's colours (token states green, reservation yellow, internal fragmentation vermillion,
#: the rest light grey: Okabe & Ito's, told apart with any colour vision)
CATEGORY_COLORS = {**{name: MEMORY_COLORS[name] for name in ("token_states", "reservation", "internal_frag")},
                   "external_frag_and_others": "#d9d9d9"}


CATEGORY_LABELS = {
    "token_states": "Token states",
    "reservation": "Reservation",
    "internal_frag": "Internal fragmentation",
    "external_frag_and_others": "External fragmentation & others",
}


#: the paper's bars and bands
PAPER_COLOR = "#bdbdbd"
#: the paper's dots (darker than its bands: a dot is small)
PAPER_DOT = "#636363"


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


#: the paper's x axis (request rate, req/s) of a latency-against-rate panel, by workload: Fig. 12's
#: Alpaca panel (OPT-13B) runs to 30 req/s, Fig. 16's panels to 40 (the paper's whole range)
PAPER_RATE_AXES = {"alpaca": 30.0, "wmt16-1shot": 40.0, "wmt16-5shot": 40.0}


def latency_vs_rate(curves: pd.DataFrame, title: str = "Fig. 12: normalized latency vs request rate",
                    threshold: float | None = None, grid: list[list[str]] | None = None,
                    paper_axes: dict[str, float] | None = None) -> go.Figure:
    """One panel per workload (``fig12.csv``), one line per system. The latency axis is log and
    spans every probe: the curves leave the paper's 0-1 s/token axis at their knee, where a
    linear axis that spans them makes vertical lines of them. A rate axis that spans decades is
    log too (:func:`reports.chart_checks.squeezed`). ``grid``: the panels' workloads row by row
    (the paper's layout; default one row); ``paper_axes``: the paper's rate axis by workload
    (default :data:`PAPER_RATE_AXES`), written in its panel."""
    wls = list(dict.fromkeys(curves["workload"]))
    grid = grid or [wls]
    cols = max(len(row) for row in grid)
    paper_axes = PAPER_RATE_AXES if paper_axes is None else paper_axes
    fig = make_subplots(rows=len(grid), cols=cols, vertical_spacing=0.16,
                        subplot_titles=[wl for row in grid for wl in row + [""] * (cols - len(row))])
    first = True
    for r, row in enumerate(grid, start=1):
        for c, wl in enumerate(row, start=1):
            g = curves[curves["workload"] == wl]
            for s in _ordered_systems(g["system"]):
                h = g[g["system"] == s].sort_values("rate")
                fig.add_trace(go.Scatter(x=h["rate"], y=h["normalized_latency_s_per_token"], mode="lines+markers",
                                         name=s, legendgroup=s, showlegend=first,
                                         line=dict(color=SYSTEM_COLORS.get(s))), row=r, col=c)
            first = first and g.empty
            if threshold is not None:
                fig.add_hline(y=threshold, line_dash="dot", line_color="grey", row=r, col=c)
            rates = g["rate"].dropna().tolist()
            log_x = squeezed(rates)
            fig.update_xaxes(title_text="request rate (req/s)" + (", log" if log_x else ""),
                             type="log" if log_x else None, row=r, col=c)
            fig.update_yaxes(type="log", row=r, col=c)
            if wl in paper_axes:
                fig.add_annotation(x=0.02, y=0.98, xref="x domain", yref="y domain", xanchor="left", yanchor="top",
                                   text=f"paper's axis: 0-{paper_axes[wl]:g} req/s", showarrow=False,
                                   font=dict(color="#555"), row=r, col=c)
                if rates and min(rates) < paper_axes[wl]:
                    fig.add_vrect(x0=min(rates), x1=min(paper_axes[wl], max(rates)), fillcolor=PAPER_COLOR,
                                  opacity=0.25, line_width=0, name="paper's axis", row=r, col=c)
        fig.update_yaxes(title_text="normalized latency (s/token, log)", row=r, col=1)
    height = max(LAYOUT["height"], 330 * len(grid) + 90)
    fig.update_layout(title=title, **{**LAYOUT, "height": height})
    return fig


def ratio_dots(ratios: pd.DataFrame, x: str, title: str, y_title: str = "vLLM's rate / the system's") -> go.Figure:
    """vLLM's ratio over each baseline as dots (a colour per ``system``) against ``x`` (a column
    of labels: width, workload, system), the paper's value beside as a grey diamond, its range
    as a grey interval (``paper_ratio``, or ``paper_ratio_low``..``paper_ratio_high``), on a
    log axis."""
    r = ratios[ratios["system"] != "vllm"]
    labels = [str(v) for v in r[x]]
    order = list(dict.fromkeys(labels))
    fig = go.Figure()
    low = r["paper_ratio_low"] if "paper_ratio_low" in r else r.get("paper_ratio")
    high = r["paper_ratio_high"] if "paper_ratio_high" in r else r.get("paper_ratio")
    if low is not None and low.notna().any():
        paper = pd.DataFrame({"x": labels, "low": low.to_numpy(float), "high": high.to_numpy(float)})
        paper = paper.dropna().drop_duplicates("x")
        mid = (paper["low"] + paper["high"]) / 2
        fig.add_trace(go.Scatter(x=paper["x"], y=mid, mode="markers", name="paper",
                                 marker=dict(symbol="diamond", size=12, color=PAPER_DOT),
                                 error_y=dict(type="data", array=(paper["high"] - mid).tolist(),
                                              arrayminus=(mid - paper["low"]).tolist(), visible=True,
                                              color=PAPER_DOT, width=8),
                                 hovertemplate="paper %{y:.2f}x<extra></extra>"))
    for s in _ordered_systems(r["system"]):
        h = r[r["system"] == s]
        fig.add_trace(go.Scatter(x=[str(v) for v in h[x]], y=h["vllm_ratio"], mode="markers", name=f"over {s}",
                                 marker=dict(size=10, color=SYSTEM_COLORS.get(s)),
                                 hovertemplate=f"over {s}: " + "%{y:.2f}x<extra></extra>"))
    fig.update_xaxes(categoryorder="array", categoryarray=order, type="category")
    fig.update_yaxes(title_text=y_title + " (log)", type="log")  # 1.3x beside Orca-Max's 20x
    fig.add_hline(y=1, line_color="#999", line_width=1)
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
        fig.update_yaxes(rangemode="tozero", row=1, col=i)
    fig.update_yaxes(title_text="normalized latency (s/token)", row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig


#: the paper's Fig. 19a latency axis (ms): its whole range is 0-140 ms
PAPER_MICRO_AXIS_MS = 140.0
#: the operations of the Fig. 19a microbenchmark (``fig19_micro.csv``'s columns) and their colours
#: (Okabe & Ito's palette, told apart with any colour vision)
MICRO_OPS = (("recompute_ms", "recompute", "#D55E00"), ("swap_in_ms", "swap in", "#56B4E9"),
             ("swap_out_ms", "swap out", "#0072B2"), ("swap_in_out_ms", "swap in + out", "#009E73"))


def recompute_vs_swap(df: pd.DataFrame, micro: pd.DataFrame | None = None,
                      title: str = "Fig. 19: recompute vs swap against block size") -> go.Figure:
    """(a) From ``fig19_micro.csv``: the cost model's ms to recompute, swap out, swap in and swap
    both ways per block size, on a log axis (they span decades), the paper's 0-140 ms axis
    shaded; beside it recompute / swap in + out against the paper's bound (at most 1.2x).
    (b) From ``fig19.csv``: normalized latency per block size with each recovery, the paper's
    comparable block sizes shaded."""
    fig = make_subplots(rows=1, cols=3, subplot_titles=["(a) microbenchmark (ms, log)",
                                                        "(a) recompute / swap in + out", "(b) end to end"])
    if micro is not None and len(micro):
        x = micro["block_size"]
        for col, name, colour in MICRO_OPS:
            fig.add_trace(go.Scatter(x=x, y=micro[col], name=name, mode="lines+markers",
                                     line=dict(color=colour)), row=1, col=1)
        lowest = float(micro[[c for c, _n, _c in MICRO_OPS]].min().min())
        if 0 < lowest < PAPER_MICRO_AXIS_MS:
            fig.add_hrect(y0=lowest, y1=PAPER_MICRO_AXIS_MS, fillcolor=PAPER_COLOR, opacity=0.3, line_width=0,
                          name="paper's axis", row=1, col=1)
            fig.add_annotation(x=0.02, y=0.02, xref="x domain", yref="y domain", xanchor="left", yanchor="bottom",
                               text=f"paper's axis: 0-{PAPER_MICRO_AXIS_MS:g} ms", showarrow=False,
                               font=dict(color="#555"), row=1, col=1)
        ratio = micro["recompute_ms"] / micro["swap_in_out_ms"]
        fig.add_trace(go.Scatter(x=x, y=ratio, name="recompute / swap in + out", mode="lines+markers",
                                 line=dict(color="#000000")), row=1, col=2)
        bound = paper.paper_value("fig19", "recompute_over_swap_max")
        if pd.notna(bound):
            fig.add_trace(go.Scatter(x=[x.min(), x.max()], y=[bound, bound], mode="lines",
                                     name=f"paper: recompute at most {bound:g}x swap",
                                     line=dict(color=PAPER_DOT, dash="dash")), row=1, col=2)
        for c in (1, 2):
            fig.update_xaxes(type="log", tickvals=sorted(x.unique()), title_text="block size (tokens)", row=1, col=c)
        fig.update_yaxes(type="log", title_text="time (ms, log)", row=1, col=1)
        fig.update_yaxes(title_text="recompute / swap", rangemode="tozero", row=1, col=2)
    for col, name, colour in (("recompute_latency_s_per_token", "recompute (end to end)", "#D55E00"),
                              ("swap_latency_s_per_token", "swap (end to end)", "#009E73")):
        fig.add_trace(go.Scatter(x=df["block_size"], y=df[col], mode="lines+markers", name=name,
                                 line=dict(color=colour, dash="dot")), row=1, col=3)
    low, high = (df[c].iloc[0] if c in df else np.nan for c in ("paper_comparable_low", "paper_comparable_high"))
    if pd.notna(low) and pd.notna(high):
        log_band(fig, low, high, f"paper: comparable {low:g}-{high:g}", col=3)
    fig.update_xaxes(type="log", tickvals=sorted(df["block_size"].unique()), title_text="block size (tokens)",
                     row=1, col=3)
    fig.update_yaxes(title_text="normalized latency (s/token)", rangemode="tozero", row=1, col=3)
    fig.update_layout(title=title, **LAYOUT)
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
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="vLLM rate / system's rate", row=1, col=1)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def batch_size_bars(df: pd.DataFrame, title: str = "Fig. 13: average batched requests") -> go.Figure:
    """One panel per workload (``fig13.csv``): the paper's batch size per system, then ours for
    each speed (``cost_scale``, the factor on the GPU time; ``fig13.csv`` has a row per system and
    factor), labelled with one decimal."""
    wls = list(dict.fromkeys(df["workload"]))
    rates = {wl: df.loc[df["workload"] == wl, "rate"].iloc[0] for wl in wls}
    fig = make_subplots(rows=1, cols=len(wls), subplot_titles=[f"{wl} @ {rates[wl]:g} req/s" for wl in wls])
    setting = df["cost_scale"] if "cost_scale" in df else pd.Series(1.0, index=df.index)
    shades = [OKABE_ITO[c] for c in ("vermillion", "orange", "black", "sky blue")]
    for i, wl in enumerate(wls, start=1):
        g = df[df["workload"] == wl]
        systems = _ordered_systems(g["system"])
        paper = g.groupby("system", sort=False)["paper_avg_batch_size"].first().reindex(systems)
        fig.add_trace(go.Bar(x=systems, y=paper.tolist(), name="paper", marker_color=PAPER_COLOR, legendgroup="paper",
                             showlegend=i == 1, text=[_label(v) for v in paper], textposition="outside"),
                      row=1, col=i)
        for j, (scale, h) in enumerate(g.groupby(setting[g.index], sort=False, dropna=False)):
            ours = h.groupby("system", sort=False)["avg_batch_size"].first().reindex(systems)
            name = (f"pagesim, the 2023 engines' speed (GPU time x{scale:g})" if scale != 1
                    else "pagesim, the cost model's own speed")
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
            first = not any(t.name == "paper" for t in fig.data)
            fig.add_trace(go.Bar(x=x, y=point, name="paper", marker_color="#8c8c8c", legendgroup="paper",
                                 showlegend=first), row=1, col=i)
        else:
            low, high = g["paper_saving_pct_low"], g["paper_saving_pct_high"]
            first = not any(t.name == "paper range" for t in fig.data)
            fig.add_trace(go.Bar(x=x, y=high - low, base=low, name="paper range", marker_color="#d9d9d9",
                                 legendgroup="range", showlegend=first), row=1, col=i)
        fig.add_trace(go.Bar(x=x, y=g["saving_pct"], name="pagesim", marker_color=SYSTEM_COLORS["vllm"],
                             legendgroup="ours", showlegend=i == 1), row=1, col=i)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="block saving (%)", row=1, col=1)
    fig.update_layout(title=title, barmode="group", **LAYOUT)
    return fig


def rate_sensitivity(df: pd.DataFrame, title: str = "Fig. 2 sensitivity: token-state share vs request rate") -> go.Figure:
    """Our token-state share per system against the rate (``fig2_sensitivity.csv``), the paper's
    share (Fig. 2, at a rate it does not state) as a dashed line in the system's colour."""
    fig = go.Figure()
    paper_shares = fig2_paper()["token_states"]
    rates = df["rate"].dropna()
    first = True
    for s in _ordered_systems(df["system"]):
        g = df[df["system"] == s].sort_values("rate")
        fig.add_trace(go.Scatter(x=g["rate"], y=g["token_states"], mode="lines+markers", name=s, legendgroup=s,
                                 line=dict(color=SYSTEM_COLORS.get(s))))
        share = paper_shares.get(s)
        if share is not None and pd.notna(share) and len(rates):
            fig.add_trace(go.Scatter(x=[rates.min(), rates.max()], y=[share, share], mode="lines",
                                     name="paper (Fig. 2, its rate unstated)", legendgroup="paper", showlegend=first,
                                     line=dict(color=SYSTEM_COLORS.get(s), dash="dash", width=1),
                                     hovertemplate=f"paper, {s}: {share:g}%<extra></extra>"))
            first = False
    fig.update_layout(title=title, xaxis_title="request rate (req/s)", yaxis_title="token states (% of KV)", **LAYOUT)
    fig.update_yaxes(range=[0, 100])
    return fig


#: the DistServe figure's two designs (DistServe's blue, vLLM's orange, as its Fig. 8)
DESIGN_COLORS = {"disaggregated": OKABE_ITO["blue"], "colocated": OKABE_ITO["orange"]}


#: the measured curves' names (the artifact's systems: the paper's own curves)
MEASURED_NAMES = {"disaggregated": "paper: DistServe, measured", "colocated": "paper: vLLM 0.1.7, measured"}


def attainment_vs_rate(curves: pd.DataFrame, goodputs: pd.DataFrame, measured: pd.DataFrame | None = None,
                       era: dict | None = None,
                       title: str = "DistServe Fig. 8 (OPT-13B chatbot): SLO attainment vs "
                                    "per-GPU rate") -> go.Figure:
    """From ``distserve.csv``: attainment (percent) per design against per-GPU rate, the target
    as a grey line and each design's goodput (``distserve_goodput.csv``) as a dashed drop line,
    as the paper draws them; the paper's ratio range in the legend's title. ``measured``
    (:func:`paper.distserve_paper_curve`): the artifact's curves, dotted, hollow markers. ``era``
    (``experiments.engine_era.fit``): the colocated curve at the 2023 engines' factor fitted on the
    measured one, dash-dotted, named so."""
    fig = go.Figure()
    if era:
        fig.add_trace(go.Scatter(x=era["per_gpu_rate"], y=[100 * a for a in era["slo_attainment"]],
                                 name=f"colocated at vLLM 0.1.7's speed (x{era['scale']:g}, fitted on it)",
                                 mode="lines+markers", marker=dict(symbol="diamond-open", size=8),
                                 line=dict(color=DESIGN_COLORS["colocated"], dash="dashdot")))
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


#: the hybrid chart's categories (``hybrid_memory.csv``): the slots in use by kind of group in
#: distinct hues (two shades of green read as one), the rest of the pool as Fig. 2's colours
HYBRID_COLORS = {"in use: all layers": OKABE_ITO["green"], "in use: full groups": OKABE_ITO["sky blue"],
                 "in use: sliding groups": OKABE_ITO["purple"], "in use: state groups": OKABE_ITO["orange"],
                 "reservation": CATEGORY_COLORS["reservation"], "internal fragmentation": CATEGORY_COLORS["internal_frag"],
                 "free and other": CATEGORY_COLORS["external_frag_and_others"],
                 "state reserved outside the pool": OKABE_ITO["blue"]}


def hybrid_memory_bars(memory: pd.DataFrame,
                       title: str = "Hybrid models: where the KV memory goes (GiB per GPU)") -> go.Figure:
    """From ``hybrid_memory.csv``: one stacked bar per run (grouped by model and workload,
    ``vllm`` beside ``vllm-v1``), one segment per category in its order of appearance, coloured
    by :data:`HYBRID_COLORS`."""
    runs = memory[["model", "workload", "system"]].drop_duplicates()
    x = [[f"{m} {w}" for m, w in zip(runs["model"], runs["workload"])], list(runs["system"])]
    fig = go.Figure()
    for category in dict.fromkeys(memory["category"]):
        c = memory[memory["category"] == category].set_index(["model", "workload", "system"])["gib"]
        ys = [float(c.get((m, w, s), float("nan"))) for m, w, s in runs.itertuples(index=False)]
        colour = HYBRID_COLORS.get(category)
        fig.add_trace(go.Bar(name=category, x=x, y=ys, marker_color=colour,
                             hovertemplate="%{x}<br>" + category + ": %{y:.2f} GiB<extra></extra>"))
    fig.update_layout(barmode="stack", title=title, yaxis_title="GiB per GPU (time-weighted)", **LAYOUT)
    return fig
