"""HTML report of ``pagesim plan`` (one self-contained file: plotly.js embedded once).

:func:`plan_report` takes the result dict of :mod:`experiments.plan` (what ``plan.json`` holds)
and writes the probed curves (p99 TTFT, p99 TPOT, SLO attainment and throughput against rate, passing
probes as dots and failing ones as crosses, probes stopped early apart, SLO lines, the answer
marked), the answer bars, and the tables of the mode.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pagesim.reports.chart_checks import squeezed
from pagesim.reports.figures import OKABE_ITO
from pagesim.reports.html import CSS, fmt, table_html


def _table(rows: list[dict]) -> str:
    return table_html(pd.DataFrame(rows), max_rows=len(rows)) if rows else "<p class='meta'>(none)</p>"


#: legend of probes stopped early: their figures cover only the requests simulated before the stop
EARLY_STOP_LABEL = "stopped early (partial figures)"


def curves_figure(points: list[dict], slo: dict, answers: dict[str, float | None] | None = None,
                  title: str = "Probed points: latency, SLO attainment and throughput against request rate",
                  x: str = "rate", x_title: str = "request rate (req/s)", log_x: bool = False) -> go.Figure:
    """2x2 panels per search (one colour each): pass = dot, fail = cross, stopped early = a faint open
    cross off the line (its p99s and throughput are those of the requests simulated before the stop,
    so they would draw a curve falling as the rate rises); SLO lines dashed. ``x``: the points'
    column the search moved (a KV search's is ``kv_gib``: against the rate, all its probes sit on
    one vertical line)."""
    df = pd.DataFrame(points)
    fig = make_subplots(rows=2, cols=2, subplot_titles=("p99 TTFT (s)", "p99 TPOT (s)", "SLO attainment (fraction of requests)",
                                                        "output throughput (tokens/s)"))
    if df.empty:
        return fig
    palette = list(OKABE_ITO.values())
    panels = [("p99_ttft_s", 1, 1), ("p99_tpot_s", 1, 2), ("slo_attainment", 2, 1), ("output_throughput", 2, 2)]
    stopped = df["stopped_early"].fillna(False).astype(bool) if "stopped_early" in df else pd.Series(False, df.index)
    for i, (name, g) in enumerate(df.sort_values(x).groupby("search", sort=False)):
        color = palette[i % len(palette)]
        complete = g[~stopped[g.index]]
        for j, (col, r, c) in enumerate(panels):
            if col not in g:
                continue
            # the line joins completed probes only: an early-stopped probe's figures cover the requests
            # simulated before it stopped, below what the full run would show
            fig.add_trace(go.Scatter(x=complete[x], y=complete[col], mode="lines", line=dict(color=color, width=1),
                                     name=name, legendgroup=name, showlegend=False, hoverinfo="skip"), row=r, col=c)
            legend_done = False
            for label, h, symbol in (("pass", complete[complete["passed"] == True], "circle"),  # noqa: E712
                                     ("fail", complete[complete["passed"] == False], "x"),  # noqa: E712
                                     (EARLY_STOP_LABEL, g[stopped[g.index]], "x-open")):
                if h.empty:
                    continue
                show = j == 0 and not legend_done and label != EARLY_STOP_LABEL
                legend_done = legend_done or show
                fig.add_trace(go.Scatter(
                    x=h[x], y=h[col], mode="markers",
                    marker=dict(color=color, symbol=symbol, size=8, opacity=0.5 if label == EARLY_STOP_LABEL else 1),
                    name=name if label != EARLY_STOP_LABEL else f"{name}: {EARLY_STOP_LABEL}",
                    legendgroup=name, showlegend=show or (j == 0 and label == EARLY_STOP_LABEL),
                    text=h.get("fail_reason"), hovertemplate=f"{name}<br>{x_title} %{{x:.3g}}<br>{col} %{{y:.3g}}"
                                                            f"<br>{label} %{{text}}<extra></extra>"),
                    row=r, col=c)
        if answers and answers.get(name) is not None:
            for _col, r, c in panels:
                fig.add_vline(x=answers[name], line=dict(color=color, dash="dot", width=1), row=r, col=c)
    lines = {"p99_ttft_s": slo.get("ttft_p99_s"), "p99_tpot_s": slo.get("tpot_p99_s"),
             "slo_attainment": slo.get("slo_attainment")}
    for col, r, c in panels:
        if lines.get(col):
            fig.add_hline(y=lines[col], line=dict(color="#444", dash="dash"), row=r, col=c)
    log_x = log_x or squeezed(df[x])  # the search doubles the rate: its probes span decades
    for r, c in ((1, 1), (1, 2), (2, 1), (2, 2)):
        fig.update_xaxes(title_text=x_title + (", log" if log_x else ""), type="log" if log_x else None,
                         row=r, col=c)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)  # a 1.5 % spread is not the chart's whole height
    fig.update_yaxes(rangemode="tozero", row=2, col=2)
    fig.update_layout(title=title, height=700, template="plotly_white")
    return fig


def answers_figure(rows: list[dict], x: str, y: str, title: str, ytitle: str, color: str | None = None,
                   low: str | None = None, high: str | None = None) -> go.Figure:
    """Each answer ``y`` as a dot against ``x`` (one colour per ``color``), with its band from
    ``low`` to ``high`` (the cost model's measured error: ``max_rate_low_rps``..``max_rate_high_rps``)
    as an interval on each answer whose row carries both sides (a side missing, e.g. a slower GPU
    time that meets no rate, leaves that answer without one, not its whole colour); the axis
    from zero."""
    df = pd.DataFrame(rows)
    fig = go.Figure()
    if df.empty or y not in df:
        return fig
    df = df[df[y].notna()]
    groups = df.groupby(color, sort=False) if color and color in df else [(None, df)]
    for i, (name, g) in enumerate(groups):
        error = None
        if low in g and high in g and (g[low].notna() & g[high].notna()).any():
            sides = g[low].notna() & g[high].notna()  # (an answer lacking a side: no interval, None in plotly)
            error = dict(type="data", array=[v if ok else None for v, ok in zip(g[high] - g[y], sides)],
                         arrayminus=[v if ok else None for v, ok in zip(g[y] - g[low], sides)],
                         visible=True, width=10)
        label = "band: the cost model's measured error" if error else ""
        fig.add_trace(go.Scatter(x=g[x].astype(str), y=g[y], mode="markers+text", error_y=error,
                                 name=str(name) if name is not None else ytitle, showlegend=name is not None,
                                 marker=dict(size=11, color=list(OKABE_ITO.values())[i % len(OKABE_ITO)]),
                                 text=[fmt(v) for v in g[y]], textposition="middle right",
                                 hovertemplate=f"%{{x}}: %{{y:.3g}} {ytitle}<extra>{label}</extra>"))
    fig.update_xaxes(type="category")
    fig.update_yaxes(title_text=ytitle, rangemode="tozero")
    fig.update_layout(title=title, template="plotly_white", height=380)
    return fig


def scale_figure(rows: list[dict], title: str) -> go.Figure:
    """Goodput per GPU against the SLO's scale, a line per design (aggregated solid, the
    disaggregated splits dashed)."""
    fig = go.Figure()
    for design in dict.fromkeys(r["design"] for r in rows):
        mine = [r for r in rows if r["design"] == design]
        fig.add_trace(go.Scatter(x=[r["slo_scale"] for r in mine], y=[r["goodput_per_gpu"] for r in mine],
                                 name=design, mode="lines+markers",
                                 line=dict(dash="solid" if design == "aggregated" else "dash")))
    fig.update_layout(title=title, xaxis_title="SLO scale s (every threshold x s)",
                      yaxis_title="requests meeting the SLO / s / GPU", template="plotly_white", height=420)
    fig.update_yaxes(rangemode="tozero")
    return fig


def in_words(settings: dict) -> str:
    """A settings dict as ``max num seqs 256, block size 16, ...`` (keys with spaces, lists
    joined), not Python's ``{'max_num_seqs': 256, ...}``."""
    if not isinstance(settings, dict):
        return str(settings)
    parts = []
    for key, value in settings.items():
        if value is None or value == {} or value == []:
            continue
        if isinstance(value, dict):
            value = f"({in_words(value)})"
        elif isinstance(value, (list, tuple)):
            value = ", ".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        parts.append(f"{str(key).replace('_', ' ')} {value}")
    return "; ".join(parts)


def probes_html(result: dict) -> str:
    """Every probe the plan ran: the searches' points, or where a mode keeps its runs as rows of
    its own tables (disaggregation: each design at each size), those rows."""
    points = sorted(result.get("points", []), key=lambda p: (p.get("search", ""), p.get("x", 0)))
    if points:
        return _table(points)
    runs = [(key, title) for key, title in (("designs", "each design"), ("fewest", "the fewest GPUs each way"),
                                             ("slo_scales", "each SLO scale")) if result.get(key)]
    if not runs:
        return "<p class='meta'>(none)</p>"
    return "".join(f"<h3>{html.escape(title)}</h3>" + _table(result[key]) for key, title in runs)


def plan_report(result: dict, path: str | Path) -> Path:
    """Write the report of one plan result to ``path``; returns the path."""
    path = Path(path)
    figs: list[tuple[str, go.Figure]] = []
    sections: list[str] = []
    mode = result.get("mode", "max-rate")
    slo = result.get("slo", {})
    if mode == "max-rate":
        band = " with the band the cost model's measured error implies" if result.get("error_band") else ""
        figs.append(("Max sustainable rate", answers_figure(
            result["answers"], "system", "max_rate_rps", f"Highest request rate meeting the SLO{band}", "req/s",
            low="max_rate_low_rps", high="max_rate_high_rps")))
        sections.append("<h2>Answers (the cost: $ per 1M output tokens at that rate)</h2>"
                        + _table(result["answers"]))
        answers = result.get("max_rate_rps", {})
    elif mode == "compare-gpus":
        band = " with the band each GPU's measured error implies" if result.get("error_band") else ""
        figs.append(("Max rate per GPU", answers_figure(result["gpus"], "gpu", "max_rate_rps",
                                                        f"Highest request rate meeting the SLO{band}", "req/s",
                                                        color="system", low="max_rate_low_rps",
                                                        high="max_rate_high_rps")))
        figs.append(("Cost per GPU", answers_figure(result["gpus"], "gpu", "dollars_per_1m_output_tokens",
                                                    "$ per 1M output tokens", "$ / 1M tokens", color="system")))
        sections.append("<h2>GPUs</h2>" + _table(result["gpus"]))
        answers = {f"{r['gpu']}/{r['system']}": r.get("max_rate_rps") for r in result["gpus"]}
    elif mode == "disaggregation":
        n = result["gpu_count"]
        figs.append(("Goodput per GPU", answers_figure(result["designs"], "design", "goodput_per_gpu",
                                                       f"Goodput per GPU at {n} GPUs, {result['rate']:g} req/s",
                                                       "requests meeting the SLO / s / GPU")))
        if result.get("slo_scales"):
            figs.append(("Goodput per GPU against the SLO's scale", scale_figure(
                result["slo_scales"], f"Goodput per GPU at {n} GPUs, {result['rate']:g} req/s, every "
                "SLO threshold x s")))
        sections.append(f"<h2>Designs at {n} GPUs (choice: {html.escape(str(result['choice']))})</h2>"
                        + _table(result["designs"]))
        sections.append("<h2>Fewest GPUs meeting the SLO</h2>" + _table(result["fewest"]))
        answers = {}
    else:
        sections.append(f"<h2>Minimum KV memory at {result['rate']:g} req/s</h2>" + _table(result["kv"]))
        sections.append(f"<h2>Replicas x TP for {result['rate']:g} req/s</h2>" + _table(result["replicas"]))
        if result.get("what_if"):
            sections.append("<h2>What-if variants</h2>" + _table(result["what_if"]))
            figs.append(("What-if", answers_figure(result["what_if"], "variant", "max_rate_rps",
                                                   f"Max rate per variant (target {result['rate']:g} req/s)", "req/s",
                                                   color="system")))
        answers = {}
    points = result.get("points", [])
    kv = [p for p in points if str(p.get("search", "")).startswith("kv/")]  # the resources mode's KV searches
    by_rate = [p for p in points if not str(p.get("search", "")).startswith("kv/")]
    if (by_rate or not kv) and mode != "disaggregation":  # its probes are all at one rate
        figs.append(("Probed curves", curves_figure(by_rate, slo, answers)))
    if kv:
        figs.append(("KV memory search", curves_figure(
            kv, slo, {f"kv/{r['system']}": r.get("min_kv_gib") for r in result.get("kv", [])},
            title=f"Probed points of the KV memory search at {result.get('rate', 0):g} req/s: latency, SLO "
                  "attainment and throughput against KV memory", x="kv_gib", x_title="KV memory (GiB)",
            log_x=True)))  # the search halves and doubles the KV memory
    parts = []
    for i, (name, fig) in enumerate(figs):
        parts.append(f"<h2>{html.escape(name)}</h2>" + fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    warnings = "".join(f"<li class='warn'>{html.escape(w)}</li>" for w in result.get("warnings", []))
    infeasible = "".join(f"<li class='warn'>{html.escape(m)}</li>" for m in result.get("infeasible", {}).values())
    meta = (f"<p class='meta'>SLO: {html.escape(str(slo.get('description', '')))}<br>"
            f"workload: {html.escape(str(result.get('workload', {}).get('description', '')))}<br>"
            f"setting: {html.escape(in_words(result.get('config', {})))}<br>"
            f"search: {html.escape(in_words(result.get('search', {})))}; {result.get('num_simulated', 0)} simulations "
            "run (others from the cache)</p>")
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>pagesim plan: {html.escape(mode)}</title>"
           f"<style>{CSS}</style></head><body><h1>pagesim plan: {html.escape(mode)}</h1>{meta}"
           + (f"<ul>{infeasible}{warnings}</ul>" if infeasible or warnings else "")
           + "".join(sections) + "".join(parts)
           + "<h2>All probes</h2>" + probes_html(result)
           + "</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return path
