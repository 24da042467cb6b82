"""The validation report: one self-contained HTML page (plotly.js embedded once).

Figures: predicted vs measured step time (scatter, log axes, y = x), relative step error
histogram, cumulative finished requests vs time (real and simulated), and the KV pool's
occupied bytes (real, from the block tables) over the simulator's memory categories.

plotly is optional: without it (the GPU machine's image has none) the page holds the tables
and says in one line that the figures need plotly; validation.json and steps.csv are the same.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from pagesim.sim.metrics import MEMORY_COLORS

_MEM = ("token_states", "reservation", "internal_frag", "allocator_slack")


def measured_word(metrics: dict) -> str:
    """What the measured side is called: "real" on a GPU, "fake" under the CPU's stand-in
    (``--backend fake``, a dry run), which is never called real."""
    return "fake" if metrics.get("backend") == "fake" else "real"


def _fmt(v) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.4g}"
    return html.escape(str(v))


def figures(res) -> list:
    """(name, plotly Figure) pairs; needs plotly."""
    import plotly.graph_objects as go
    s = res.steps
    figs = []
    f = go.Figure()
    meas_ms = s["measured_s"] * 1e3
    f.add_trace(go.Scattergl(x=meas_ms, y=s["predicted_roofline_s"] * 1e3, mode="markers", name="roofline",
                             marker=dict(size=4, opacity=0.5)))
    if s["predicted_table_s"].notna().any():
        f.add_trace(go.Scattergl(x=meas_ms, y=s["predicted_table_s"] * 1e3, mode="markers", name="table (calibrated)",
                                 marker=dict(size=4, opacity=0.5)))
    if len(s):
        lo = float(np.nanmin([meas_ms.min(), (s["predicted_roofline_s"] * 1e3).min()]))
        hi = float(np.nanmax([meas_ms.max(), (s["predicted_roofline_s"] * 1e3).max()]))
        f.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                               line=dict(dash="dash", color="gray")))
    f.update_layout(title="Predicted vs measured step time", xaxis_title="measured (ms)",
                    yaxis_title="predicted (ms)", xaxis_type="log", yaxis_type="log")
    figs.append(("scatter", f))

    f = go.Figure()
    with np.errstate(divide="ignore", invalid="ignore"):
        f.add_trace(go.Histogram(x=(s["predicted_roofline_s"] - s["measured_s"]) / s["measured_s"], name="roofline",
                                 opacity=0.6, nbinsx=60))
        if s["predicted_table_s"].notna().any():
            f.add_trace(go.Histogram(x=(s["predicted_table_s"] - s["measured_s"]) / s["measured_s"],
                                     name="table (calibrated)", opacity=0.6, nbinsx=60))
    f.update_layout(title="Step error (predicted - measured) / measured", barmode="overlay",
                    xaxis_title="relative error", yaxis_title="iterations")
    figs.append(("hist", f))

    f = go.Figure()
    word = measured_word(res.metrics)
    runs = [(word, res.real), ("sim (roofline)", res.sim_roofline)]
    if res.sim_table is not None:
        runs.append(("sim (table)", res.sim_table))
    for name, r in runs:
        fin = np.sort(r.requests["finish_s"].dropna().to_numpy(float))
        f.add_trace(go.Scatter(x=fin, y=np.arange(1, len(fin) + 1), mode="lines", name=name, line_shape="hv"))
    f.update_layout(title="Finished requests over time", xaxis_title="time (s)", yaxis_title="finished requests")
    figs.append(("timeline", f))

    f = go.Figure()
    kvb = float(res.real.summary.get("kv_bytes_per_token", 1.0))
    x = s["start_s"]
    for c in _MEM:
        f.add_trace(go.Scatter(x=x, y=s[f"mem_{c}"] * kvb / 2**30, mode="lines", stackgroup="sim", name=c,
                               line=dict(color=MEMORY_COLORS[c])))
    f.add_trace(go.Scatter(x=x, y=s["pool_occupied_bytes"] / 2**30, mode="lines", name=f"{word} pool occupied",
                           line=dict(color="black", dash="dot", width=2)))
    f.update_layout(title=f"KV memory: {word} pool (block tables) vs simulator categories",
                    xaxis_title="time (s)", yaxis_title="GiB")
    figs.append(("memory", f))
    return figs


def _table(title: str, header: list[str], body: list[list]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in r) + "</tr>" for r in body)
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{rows}</table>"


def _end_to_end(m: dict) -> str:
    """Output throughput, mean TTFT and TPOT: measured, the main simulation, the roofline simulation."""
    word, body = measured_word(m), []
    for label, key, err in (("output throughput (tok/s)", "output_throughput", "throughput_error"),
                            ("mean TTFT (ms)", "mean_ttft_ms", "ttft_error"),
                            ("mean TPOT (ms)", "mean_tpot_ms", "tpot_error")):
        body.append([label, m.get(f"real_{key}"), m.get(f"sim_{key}"), m.get(err), m.get(f"roofline_sim_{key}"),
                     m.get(f"roofline_{err}")])
    return _table(f"End to end: {word} vs simulated", ["", word, f"sim ({m.get('sim_model')})", "error",
                                                    "sim (roofline)", "error"], body)


def _breakdown(m: dict) -> str:
    rows = m.get("errors_by_step") or []
    if not rows:
        return ""
    header = list(rows[0])
    return _table(f"Errors by step type and batch size ({m.get('step_error_model')}; GPU-only = device share "
                  "vs the price less its host term)", header, [[r[h] for h in header] for r in rows])


def write_report(res, path: str | Path) -> Path:
    path = Path(path)
    m = res.metrics
    keys = ["model", "gpu", "gpu_name", "backend", "system", "date", "num_steps", "step_error_model",
            "median_step_error", "p90_step_error", "roofline_median_step_error", "roofline_p90_step_error",
            "real_output_throughput", "sim_output_throughput", "throughput_error", "real_mean_ttft_ms",
            "sim_mean_ttft_ms", "ttft_error", "real_mean_tpot_ms", "sim_mean_tpot_ms", "tpot_error",
            "median_gpu_step_error", "p90_gpu_step_error", "measured_host_share",
            "median_step_error_host_fitted_in_sample", "memory_check", "kv_check", "kv_checked_blocks"]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(m.get(k))}</td></tr>" for k in keys if k in m)
    parts = [_end_to_end(m), _breakdown(m)]
    try:
        figs = figures(res)
    except ImportError:
        figs = []
        parts.append("<p>Figures left out: plotly is not installed (pip install plotly); the numbers are in "
                     "validation.json and steps.csv.</p>")
    for i, (_name, fig) in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>pagesim validate</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}</style></head><body>"
            f"<h1>pagesim validate: {html.escape(str(m.get('model')))} on {html.escape(str(m.get('gpu_name')))}</h1>"
            f"<table>{rows}</table>" + "".join(f"<div>{p}</div>" for p in parts) + "</body></html>")
    path.write_text(page, encoding="utf-8")
    return path
