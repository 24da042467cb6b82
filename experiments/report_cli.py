"""`pagesim report`: rebuild a self-contained HTML report from saved results.

DIR is either one run (``summary.json`` / ``steps.csv``, as ``pagesim simulate --out`` writes) or
the outputs of ``pagesim reproduce`` (``fig*.csv``); anything else is an error (exit 2).
"""

from __future__ import annotations

from pathlib import Path

from pagesim.sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("report", help="Rebuild an HTML report from saved results", formatter_class=HelpFormatter,
                       description=__doc__,
                       epilog=example("pagesim report out/run            # writes out/run/report.html",
                                      "pagesim report out/fig2 -o fig2.html"))
    p.add_argument("dir", metavar="DIR", help="a run directory or a reproduce output directory")
    p.add_argument("-o", "--output", metavar="FILE", default=None, help="HTML file (default: DIR/report.html)")
    p.set_defaults(func=run)


def run(args) -> int:
    # here: plotly and pandas, which `pagesim --help` need not load
    from pagesim.experiments.report_pages import reproduce_report, single_run_report
    from pagesim.reports.html import ReportError, is_reproduce_dir, is_run_dir

    d = Path(args.dir)
    if not d.is_dir():
        raise ReportError(f"{d}: not a directory")
    out = Path(args.output) if args.output else d / "report.html"
    try:
        if is_run_dir(d):
            path = single_run_report(d, out)
        elif is_reproduce_dir(d):
            path = reproduce_report(d, out)
        else:
            raise ReportError(f"{d}: holds neither a run (summary.json, steps.csv) nor reproduce outputs (fig*.csv)")
    except (ValueError, KeyError) as e:  # (json's errors are ValueErrors): files not as pagesim wrote them
        what = f"no column or key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        raise ReportError(f"{d}: saved results not as pagesim writes them ({what})") from None
    print(f"wrote {path}")
    return 0
