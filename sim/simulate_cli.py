"""`pagesim simulate`: Run one simulation. (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("simulate", help="Run one simulation", formatter_class=HelpFormatter,
                       epilog=example("pagesim simulate --help"))
    p.set_defaults(func=lambda args: print("pagesim simulate: not built yet") or 2)
