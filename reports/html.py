"""Self-contained HTML reports: one file, plotly.js embedded once, opens offline (no CDN).

The renderer (:class:`HtmlReport`: headings, figures, tables, readings) and the reading of a
saved run; the pages themselves (one run against the paper's Fig. 2, the reproduced figures)
are ``experiments/report_pages.py``'s.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from pagesim.sim import __version__
from pagesim.sim.errors import PagesimError


class ReportError(PagesimError):
    """A report cannot be built (the directory holds no results)."""


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.6em;margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
.meta{color:#666;font-size:.9em} .reading{background:#f6f8fa;border-left:4px solid #d62728;padding:.6em 1em}
table.data{border-collapse:collapse;font-size:.85em;margin:.6em 0} table.data td,table.data th{border:1px solid #ddd;padding:3px 7px;text-align:right}
table.data th{background:#f0f0f0} table.data td:first-child{text-align:left}
table.data td{white-space:nowrap} table.data td.text{text-align:left;min-width:24em;white-space:normal}
.note{color:#b00} .warn{color:#b00} .scroll{overflow-x:auto}
"""

#: a column of text whose longest cell is longer than this is given room to wrap in (CSS
#: ``td.text``), a few lines instead of a narrow column's ten; every other cell stays on one line
#: (``orca-max`` never breaks at its hyphen) and a wide table scrolls
TEXT_CELL_CHARS = 40


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


def table_html(df: pd.DataFrame, max_rows: int = 200) -> str:
    """``df`` as a scrollable HTML table: numbers through :func:`fmt`, a ``note`` in red, a text
    column with long cells (:data:`TEXT_CELL_CHARS`) wide enough to read."""
    d = df.head(max_rows)
    cells = [[html.escape(fmt(v.item() if hasattr(v, "item") else v)) for v in r] for r in d.itertuples(index=False)]
    wide = {i for i in range(len(d.columns)) if max((len(row[i]) for row in cells), default=0) > TEXT_CELL_CHARS}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    rows = []
    for row in cells:
        tds = []
        for i, (c, s) in enumerate(zip(d.columns, row)):
            classes = " ".join(k for k, on in (("note", c == "note" and s), ("text", i in wide)) if on)
            tds.append(f'<td class="{classes}">{s}</td>' if classes else f"<td>{s}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    more = f"<p class='meta'>({len(df) - max_rows} more rows in the CSV)</p>" if len(df) > max_rows else ""
    return (f'<div class="scroll"><table class="data"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>{more}')


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
        if df is not None and not df.empty:
            self.parts.append(table_html(df, max_rows))

    def figure(self, fig) -> None:
        self._figs += 1
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=self._figs == 1,
                                      div_id=f"fig{self._figs}",
                                      config={"displaylogo": False, "responsive": True}))

    def render(self) -> str:
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
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
    """A folder ``pagesim reproduce`` wrote: the vLLM paper's ``fig*.csv``, DistServe's or the
    hybrid models' figure's."""
    return any(Path(d).glob("fig*.csv")) or any((Path(d) / f"{name}.csv").exists() for name in ("distserve", "hybrid"))


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
