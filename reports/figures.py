"""Plotly figures of one run's tables (its steps and requests; the paper's figures are drawn
by ``experiments/paper_plots.py``).

Every function takes DataFrames in the layouts ``SimResult.save`` writes and returns a
``plotly.graph_objects.Figure`` with a title. Timelines are downsampled to at most
``max_points`` points per trace (equal-count bin means) so reports stay small.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pagesim.sim.metrics import MEMORY_COLORS, OKABE_ITO
from pagesim.sim.metrics import downsample_steps as downsample

#: Okabe & Ito's colour-blind-safe palette (any two of its colours stay apart to a deuteranope,
#: ``reports/chart_checks.py``); every chart's categories and systems take their colours from it
#: the engine's seven slot categories (steps.csv; a run's plot shows those its steps have)
MEM_COLS = ("mem_token_states", "mem_reservation", "mem_internal_frag", "mem_allocator_slack",
            "mem_speculative_slack", "mem_external_frag", "mem_free_idle")
MEM_COLORS = {f"mem_{category}": color for category, color in MEMORY_COLORS.items()}
SYSTEM_COLORS = {"orca-max": OKABE_ITO["blue"], "orca-pow2": OKABE_ITO["orange"], "orca-oracle": OKABE_ITO["purple"],
                 "vllm": OKABE_ITO["vermillion"], "static": OKABE_ITO["black"], "token": OKABE_ITO["sky blue"],
                 "vattention": OKABE_ITO["green"]}
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50), height=420)


# --------------------------------------------------------------------------------------------
# memory


def memory_timeline(steps: pd.DataFrame, title: str = "KV-cache slots over time", max_points: int = 5000) -> go.Figure:
    """Stacked areas of the slot categories (percent of capacity) over simulated time."""
    s = downsample(steps, max_points)
    cols = [c for c in MEM_COLS if c in s]
    cap = s[cols].sum(axis=1).replace(0, np.nan)
    fig = go.Figure()
    for c in cols:
        fig.add_trace(go.Scatter(x=s["start_s"], y=100 * s[c] / cap, name=c[4:].replace("_", " "), mode="lines",
                                 stackgroup="mem", line=dict(width=0.5, color=MEM_COLORS[c])))
    fig.update_layout(title=title, xaxis_title="simulated time (s)", yaxis_title="% of KV slots", **LAYOUT)
    fig.update_yaxes(range=[0, 100])
    return fig


def batch_queue_timeline(steps: pd.DataFrame, title: str = "Batch size and queue length over time",
                         max_points: int = 5000) -> go.Figure:
    s = downsample(steps, max_points)
    fig = go.Figure()
    for col, name in (("batch_size", "batch size"), ("num_running", "running"), ("num_waiting", "waiting")):
        if col in s:
            fig.add_trace(go.Scatter(x=s["start_s"], y=s[col], name=name, mode="lines"))
    fig.update_layout(title=title, xaxis_title="simulated time (s)", yaxis_title="requests", **LAYOUT)
    return fig


def latency_cdfs(requests: pd.DataFrame, title: str = "Latency CDFs", max_points: int = 2000) -> go.Figure:
    """Empirical CDFs of TTFT, TPOT and end-to-end latency over finished requests."""
    cols = [("ttft_s", "TTFT (s)"), ("tpot_s", "TPOT (s)"), ("e2el_s", "End-to-end latency (s)")]
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in cols])
    done = requests
    if "status" in requests:
        done = requests[requests["status"].astype(str) == "finished"]
    for i, (c, label) in enumerate(cols, start=1):
        if c not in done:
            continue
        v = np.sort(done[c].dropna().to_numpy(float))
        if len(v) == 0:
            continue
        q = np.linspace(0, 1, min(len(v), max_points))
        x = np.quantile(v, q)
        fig.add_trace(go.Scatter(x=x, y=q, mode="lines", name=label, showlegend=False), row=1, col=i)
        fig.update_xaxes(title_text=label, row=1, col=i)
    fig.update_yaxes(title_text="fraction of requests", row=1, col=1)
    fig.update_layout(title=title, **LAYOUT)
    return fig
