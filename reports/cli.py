"""`pagesim report`: Rebuild an HTML report from saved results. (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("report", help="Rebuild an HTML report from saved results", formatter_class=HelpFormatter,
                       epilog=example("pagesim report --help"))
    p.set_defaults(func=lambda args: print("pagesim report: not built yet") or 2)
