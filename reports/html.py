"""Self-contained HTML reports: one file, plotly.js embedded once, opens offline (no CDN).

* :func:`single_run_report` - one simulation (``pagesim simulate ... --report``, ``pagesim report RUN_DIR``)
* :func:`reproduce_report` - the outputs of ``pagesim reproduce`` (``fig*.csv``)

Each report has our numbers against the paper's and a short written reading of the differences.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from pagesim.reports import figures as F
from pagesim.sim.errors import PagesimError


class ReportError(PagesimError):
    """A report cannot be built (the directory holds no results)."""


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.meta{color:#666;font-size:.9em} .reading{background:#f6f8fa;border-left:4px solid #d62728;padding:.6em 1em}
table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0} table.data td,table.data th{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.data th{background:#f0f0f0} table.data td:first-child{text-align:left}
.note{color:#b00} .scroll{overflow-x:auto}
"""


def fmt(x: Any) -> str:
    """Numbers for tables: thousands separators for big ones, 3 significant digits for small."""
    if x is None:
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):
            return ""
        if x == int(x) and abs(x) < 1e15:
            return f"{int(x):,}"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        if abs(x) >= 1:
            return f"{x:.2f}"
        return f"{x:.3g}"
    return str(x)


class HtmlReport:
    """Collects headings, text, tables and figures; :meth:`render` embeds plotly.js once."""

    def __init__(self, title: str, subtitle: str = ""):
        self.title, self.subtitle = title, subtitle
        self.parts: list[str] = []
        self._figs = 0

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def text(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{c}>{html.escape(text)}</p>")

    def reading(self, text: str) -> None:
        self.parts.append(f'<div class="reading"><b>Reading.</b> {html.escape(text)}</div>')

    def table(self, df: pd.DataFrame, max_rows: int = 200) -> None:
        if df is None or df.empty:
            return
        d = df.head(max_rows)
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
        rows = []
        for r in d.itertuples(index=False):
            cells = []
            for c, v in zip(d.columns, r):
                s = html.escape(fmt(v.item() if hasattr(v, "item") else v))
                cells.append(f'<td class="note">{s}</td>' if c == "note" and s else f"<td>{s}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        more = f"<p class='meta'>({len(df) - max_rows} more rows in the CSV)</p>" if len(df) > max_rows else ""
        self.parts.append(f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>'
                          f'<tbody>{"".join(rows)}</tbody></table></div>{more}')

    def figure(self, fig) -> None:
        self._figs += 1
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=self._figs == 1,
                                      div_id=f"fig{self._figs}",
                                      config={"displaylogo": False, "responsive": True}))

    def render(self) -> str:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        from pagesim.sim import __version__
        sub = f"<p class='meta'>{html.escape(self.subtitle)}</p>" if self.subtitle else ""
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>"
                f"<h1>{html.escape(self.title)}</h1>{sub}"
                f"<p class='meta'>pagesim {__version__}, generated {when}. Self-contained: opens offline.</p>"
                + "\n".join(self.parts) + "</body></html>\n")

    def write(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.render(), encoding="utf-8")
        return p


# --------------------------------------------------------------------------------------------
# single run


def _read_table(d: Path, name: str) -> pd.DataFrame | None:
    for suffix, reader in ((".csv", pd.read_csv), (".csv.gz", pd.read_csv), (".parquet", pd.read_parquet)):
        p = d / f"{name}{suffix}"
        if p.exists():
            return reader(p)
    return None


def is_run_dir(d: str | Path) -> bool:
    d = Path(d)
    return (d / "summary.json").exists() or (d / "steps.csv").exists()


def is_reproduce_dir(d: str | Path) -> bool:
    return any(Path(d).glob("fig*.csv"))


def load_run(result) -> tuple[dict, pd.DataFrame | None, pd.DataFrame | None, dict]:
    """(summary, steps, requests, config dict) from a SimResult-like object or a saved run dir."""
    if isinstance(result, (str, Path)):
        d = Path(result)
        if not is_run_dir(d):
            raise ReportError(f"{d}: no simulation results here (expected summary.json / steps.csv)")
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        return summary, _read_table(d, "steps"), _read_table(d, "requests"), config
    cfg = getattr(result, "config", None)
    if cfg is not None and not isinstance(cfg, dict):
        cfg = cfg.to_dict() if hasattr(cfg, "to_dict") else vars(cfg)
    return dict(result.summary), getattr(result, "steps", None), getattr(result, "requests", None), cfg or {}


KEY_METRICS = ("completed", "rejected", "duration_s", "request_throughput", "output_throughput",
               "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_e2el_ms", "p99_e2el_ms",
               "normalized_latency_s_per_token", "avg_batch_size", "num_preemptions", "kv_capacity_tokens",
               "wall_time_s")


def single_run_report(result, path: str | Path) -> Path:
    """Write the report of one run (a SimResult, or a directory written by ``SimResult.save``)."""
    from pagesim.experiments import paper
    from pagesim.experiments.figures import FIG2_TOLERANCE_PP, MEM_COLS, memory_breakdown_pct

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
        rep.figure(F.memory_breakdown_bar(df, title=f"KV memory breakdown: {system} (whole run) vs paper"))
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
    off = [f"{F.CATEGORY_LABELS[c].lower()} {d:+.1f} pp" for c, d in diffs if abs(d) > tol]
    s = (f"Token states take {cats['token_states']:.1f}% of the KV cache (paper: {pt.loc[system, 'token_states']:.1f}%). ")
    s += ("Every category is within %g pp of Fig. 2. " % tol) if not off else "Off by more than %g pp: %s. " % (tol, ", ".join(off))
    s += ("These are whole-run averages, including the ramp-up and the drain when arrivals stop (free memory counts "
          "as 'others'); Fig. 2 is measured on a loaded server (pagesim reproduce fig2 uses the steady window).")
    return s


# --------------------------------------------------------------------------------------------
# reproduce outputs


def _fig2_section(rep: "HtmlReport", fig2: pd.DataFrame, read, X) -> None:
    rep.heading("Fig. 2: memory waste per system")
    rep.figure(F.memory_breakdown_bar(fig2))
    rep.table(fig2)
    rep.reading(X.explain_fig2(fig2))
    sens = read("fig2_sensitivity")
    if sens is not None and not sens.empty:
        rep.heading("Fig. 2 sensitivity to the request rate", level=3)
        rep.figure(F.rate_sensitivity(sens))
        rep.table(sens)
    tl = read("fig2_timeline")
    if tl is not None and not tl.empty:
        rep.heading("Fig. 2 runs over time", level=3)
        rep.figure(F.memory_timelines(tl))


def _fig12_section(rep: "HtmlReport", fig12: pd.DataFrame, read, X) -> None:
    ratios = read("fig12_ratios")
    if ratios is None:
        ratios = X.fig12_ratios(fig12)
    rep.heading("Fig. 12: normalized latency vs request rate")
    rep.figure(F.latency_vs_rate(fig12, threshold=float(ratios["threshold_s_per_token"].iloc[0])
                                 if len(ratios) else None))
    rep.figure(F.sustainable_rate_ratios(ratios))
    rep.table(ratios)
    rep.reading(X.explain_fig12(fig12, ratios))
    rep.heading("All probes", level=3)
    rep.table(fig12)


def reproduce_report(out_dir: str | Path, path: str | Path | None = None) -> Path:
    """Write the report of a ``pagesim reproduce`` output directory (default ``out_dir/report.html``)."""
    from pagesim.experiments import figures as X

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
        "fig13": ("Fig. 13: average batch size", F.batch_size_bars, X.explain_fig13),
        "fig15": ("Fig. 15: memory saved by sharing", F.sharing_bars, X.explain_fig15),
    }
    for name in ("fig2", "fig13", "fig15", "fig12", "fig18b"):
        df = read(name)
        if df is None:
            continue
        found = True
        if name == "fig2":
            _fig2_section(rep, df, read, X)
        elif name == "fig12":
            _fig12_section(rep, df, read, X)
        elif name == "fig18b":
            rep.heading("Fig. 18b: block size")
            rep.figure(F.block_size_sweep(df))
            rep.table(df)
            rep.reading(X.explain_fig18b(df))
        else:
            title, build, explain = simple[name]
            rep.heading(title)
            rep.figure(build(df))
            rep.table(df)
            rep.reading(explain(df))
    if not found:
        raise ReportError(f"{d}: no known figure CSVs (fig2, fig13, fig15, fig12, fig18b)")
    return rep.write(path)
