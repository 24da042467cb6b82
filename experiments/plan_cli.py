"""`pagesim plan`: Capacity-planning what-ifs. (Placeholder: being built.)"""

from __future__ import annotations

from sim.cli import HelpFormatter, example


def register(sub) -> None:
    p = sub.add_parser("plan", help="Capacity-planning what-ifs", formatter_class=HelpFormatter,
                       epilog=example("pagesim plan --help"))
    p.set_defaults(func=lambda args: print("pagesim plan: not built yet") or 2)
