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
    for name in X.REPORT_ORDER:  # each figure writes its own section
        table = read(name)
        if table is not None:
            found = True
            X.FIGURES[name].section(rep, table, read)
    if not found:
        raise ReportError(f"{d}: no known figure CSVs ({', '.join(X.REPORT_ORDER)})")
    return rep.write(path)
