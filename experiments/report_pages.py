"""The HTML pages of results: one run (``pagesim simulate ... --report``, ``pagesim report
RUN_DIR``) against the paper's Fig. 2, and the outputs of ``pagesim reproduce`` (``fig*.csv``),
each with our numbers beside the paper's and a written reading of the differences; rendered by
``reports/html.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pagesim.experiments import figures as X
from pagesim.experiments import paper
from pagesim.experiments import paper_plots as P
from pagesim.experiments.figures.common import MEM_COLS, memory_breakdown_pct
from pagesim.experiments.figures.fig2 import FIG2_TOLERANCE_PP
from pagesim.reports import figures as F
from pagesim.reports.html import HtmlReport, ReportError, is_reproduce_dir, load_run


KEY_METRICS = ("completed", "rejected", "duration_s", "request_throughput", "output_throughput",
               "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "p99_e2el_ms",
               "normalized_latency_s_per_token", "avg_batch_size", "num_preemptions", "kv_capacity_tokens",
               "wall_time_s")


def single_run_report(result, path: str | Path) -> Path:
    """Write the report of one run (a SimResult, or a directory written by ``SimResult.save``)."""

    summary, steps, requests, config = load_run(result)
    system = summary.get("system") or config.get("system", "?")
    sub = ", ".join(f"{k}={config[k]}" for k in ("model", "gpu", "kv_gib", "block_size", "max_seq_len", "seed")
                    if config.get(k) is not None)
    rep = HtmlReport(f"pagesim run: {system}", sub)

    rep.heading("Summary")
    rep.table(pd.DataFrame([{"metric": k, "value": summary[k]} for k in KEY_METRICS if k in summary]))

    # the whole run's breakdown is summary.json's (sim/metrics.py: time-weighted over the run, idle
    # time counted free); the step table stands in only for a summary without the categories
    from_steps = steps is not None and all(c in steps for c in MEM_COLS) and not all(c in summary for c in MEM_COLS)
    cats, where = memory_breakdown_pct(steps if from_steps else None, summary)
    have_mem = not all(math.isnan(v) for v in cats.values())
    if have_mem:
        rep.heading("Where the KV cache goes (vs the paper's Fig. 2)")
        pt = paper.fig2_paper()
        row = {"system": system, **cats}
        for c in cats:
            row[f"paper_{c}"] = pt.loc[system, c] if system in pt.index else math.nan
            row[f"delta_{c}"] = cats[c] - row[f"paper_{c}"]
        df = pd.DataFrame([row])
        rep.figure(P.memory_breakdown_bar(df, title=f"KV memory breakdown: {system} (whole run) vs paper"))
        rep.table(df)
        rep.reading(_single_run_reading(system, cats, pt, FIG2_TOLERANCE_PP))
    if steps is not None and len(steps):
        if all(c in steps for c in MEM_COLS):
            rep.heading("Memory over time")
            rep.figure(F.memory_timeline(steps, title=f"KV-cache slots over time ({system})"))
        rep.heading("Batch and queue")
        rep.figure(F.batch_queue_timeline(steps))
    if requests is not None and len(requests):
        rep.heading("Latency")
        rep.figure(F.latency_cdfs(requests))
    if rep._figs == 0:
        rep.text("No step or request tables: only the summary is shown.", cls="meta")
    return rep.write(path)


def _single_run_reading(system: str, cats: dict, pt: pd.DataFrame, tol: float) -> str:
    if system not in pt.index:
        return (f"The paper's Fig. 2 has no entry for '{system}'; the breakdown is shown for reference. Token states "
                f"take {cats['token_states']:.1f}% of the KV cache.")
    diffs = [(c, cats[c] - pt.loc[system, c]) for c in cats if pd.notna(pt.loc[system, c])]
    off = [f"{P.CATEGORY_LABELS[c].lower()} {d:+.1f} pp" for c, d in diffs if abs(d) > tol]
    s = (f"Token states take {cats['token_states']:.1f}% of the KV cache (paper: {pt.loc[system, 'token_states']:.1f}%). ")
    s += ("Every category is within %g pp of Fig. 2. " % tol) if not off else "Off by more than %g pp: %s. " % (tol, ", ".join(off))
    s += ("These are whole-run averages, including the ramp-up and the drain when arrivals stop (free memory counts "
          "as 'others'); Fig. 2 is measured on a loaded server (pagesim reproduce fig2 uses the steady window).")
    return s


# --------------------------------------------------------------------------------------------
# reproduce outputs


def _fig2_section(rep: HtmlReport, fig2: pd.DataFrame, read) -> None:
    rep.heading("Fig. 2: memory waste per system")
    rep.figure(P.memory_breakdown_bar(fig2))
    rep.table(fig2)
    rep.reading(X.fig2.explain(fig2))
    sens = read("fig2_sensitivity")
    if sens is not None and not sens.empty:
        rep.heading("Fig. 2 sensitivity to the request rate", level=3)
        rep.figure(P.rate_sensitivity(sens))
        rep.table(sens)
    tl = read("fig2_timeline")
    if tl is not None and not tl.empty:
        rep.heading("Fig. 2 runs over time", level=3)
        rep.figure(P.memory_timelines(tl))


def _rate_curves_section(rep: HtmlReport, name: str, curves: pd.DataFrame, read, heading: str,
                         panels: pd.DataFrame | None = None, plot_title: str | None = None,
                         ratio_bars: bool = False) -> None:
    """A figure of normalized latency against rate (fig12, fig14, fig17): its curves (one panel
    per ``workload`` of ``panels``), its sustainable-rate ratios (read back, or computed by the
    figure's module), the reading, and every probe."""
    module = getattr(X, name)
    ratios = read(f"{name}_ratios")
    if ratios is None:
        ratios = module.ratios(curves)
    threshold = float(ratios["threshold_s_per_token"].iloc[0]) if len(ratios) else None
    rep.heading(heading)
    kw = {"title": plot_title} if plot_title else {}
    rep.figure(P.latency_vs_rate(curves if panels is None else panels, threshold=threshold, **kw))
    if ratio_bars:
        rep.figure(P.sustainable_rate_ratios(ratios))
    rep.table(ratios)
    rep.reading(module.explain(curves, ratios))
    rep.heading("All probes", level=3)
    rep.table(curves)


def reproduce_report(out_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write the report of a ``pagesim reproduce`` output directory (default ``out_dir/report.html``)."""

    d = Path(out_dir)
    if not is_reproduce_dir(d):
        raise ReportError(f"{d}: no reproduce outputs here (expected fig*.csv)")
    path = Path(path) if path is not None else d / "report.html"

    def read(name):
        p = d / f"{name}.csv"
        return pd.read_csv(p) if p.exists() else None

    rep = HtmlReport("pagesim: reproducing the vLLM paper (Kwon et al., SOSP'23)",
                     "OPT-13B on one A100-40GB, 12 GiB KV cache (15,728 slots), max 2,048 tokens; "
                     "synthetic ShareGPT / Alpaca traces, Poisson arrivals.")
    found = False
    # figure name -> (heading, plotly figure builder, written reading)
    simple = {
        "fig13": ("Fig. 13: average batch size", P.batch_size_bars, X.fig13.explain),
        "fig15": ("Fig. 15: memory saved by sharing", P.sharing_bars, X.fig15.explain),
    }
    for name in ("fig2", "fig13", "fig15", "fig12", "fig18b", "fig14", "fig17"):
        df = read(name)
        if df is None:
            continue
        found = True
        if name == "fig2":
            _fig2_section(rep, df, read)
        elif name == "fig12":
            _rate_curves_section(rep, "fig12", df, read, "Fig. 12: normalized latency vs request rate",
                                 ratio_bars=True)
        elif name == "fig14":
            _rate_curves_section(
                rep, "fig14", df, read,
                "Fig. 14: parallel sampling and beam search, normalized latency vs request rate (Alpaca)",
                panels=df.assign(workload=df["mode"] + " " + df["width"].astype(str)),  # one panel per width
                plot_title="Fig. 14: normalized latency vs request rate, per mode and width")
        elif name == "fig17":
            _rate_curves_section(rep, "fig17", df, read, "Fig. 17: chatbot, normalized latency vs request rate",
                                 panels=df.assign(workload="chatbot (ShareGPT, last 1,024 prompt tokens)"),
                                 plot_title="Fig. 17: chatbot, normalized latency vs request rate")
        elif name == "fig18b":
            rep.heading("Fig. 18b: block size")
            rep.figure(P.block_size_sweep(df))
            rep.table(df)
            rep.reading(X.fig18b.explain(df))
        else:
            title, build, explain = simple[name]
            rep.heading(title)
            rep.figure(build(df))
            rep.table(df)
            rep.reading(explain(df))
    fig16 = read("fig16")
    if fig16 is not None:
        found = True
        ratios16 = read("fig16_ratios")
        rep.heading("Fig. 16: shared prefix")
        rep.figure(P.latency_vs_rate(fig16, title="Fig. 16: normalized latency vs request rate, shared prefix"))
        if ratios16 is not None:
            rep.table(ratios16)
        rep.table(fig16)
        rep.reading(X.fig16.explain(fig16, ratios16))
    fig19 = read("fig19")
    if fig19 is not None:
        found = True
        micro = read("fig19_micro")
        rep.heading("Fig. 19: recompute vs swap")
        rep.figure(P.recompute_vs_swap(fig19, micro))
        if micro is not None:
            rep.table(micro)
        rep.table(fig19)
        rep.reading(X.fig19.explain(fig19, micro))
    if not found:
        raise ReportError(f"{d}: no known figure CSVs (fig2, fig13, fig15, fig12, fig18b, fig16, fig19)")
    return rep.write(path)
